//! From settings to a plan: the config parsed and validated, key files read, endpoints
//! resolved, and the dataplane decided (workers, sub-tunnels, backend), with everything a
//! start would refuse refused here. `tunneld up`, `tunneld check`, the library, reloads and
//! the bare mode all go through it, so `check` says what `up` will do; what needs the network
//! or privileges (and so only a start can find) is named in [`NOT_CHECKED`]. Every problem
//! found is reported, one line each naming its field.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use tunneld_config::{
    self as config, Backend, Config, DataplaneConfig, Endpoint, InterfaceConfig, KeySource,
    PeerConfig,
};
use tunneld_crypto::{read_key_file, PresharedKey, PrivateKey};
use tunneld_wireguard::{DeviceSettings, PeerSettings};

/// What `tunneld check` cannot find out without the network or privileges, as a sentence
/// (`tunneld check --help` prints it).
pub const NOT_CHECKED: &str = "Not checked, since it needs the network or privileges: host-name endpoints resolving, the UDP port and the interface name being free, TLS and metrics addresses being bindable, the privileges to create the interface (CAP_NET_ADMIN) and attach an XDP program (CAP_BPF), and the route to the first endpoint for backend = \"xdp\". A start may still refuse these.";

/// A config ready to run.
#[derive(Debug)]
pub struct Plan {
    pub config: Config,
    /// The WireGuard interface's settings; `None` for a TLS-forwarding-only config.
    pub wireguard: Option<WireGuard>,
    /// Where relative file names in the config are taken from (the config's directory).
    pub base: PathBuf,
    /// `[proxy] users_file`'s accounts, read (a proxy config's; empty otherwise). Read for
    /// `check` in every build; used by the `proxy` feature.
    #[cfg_attr(not(feature = "proxy"), allow(dead_code))]
    pub proxy_users: ProxyUsers,
}

/// The accounts of a proxy's `users_file` (`user:password` lines); never printed.
#[derive(Default)]
pub struct ProxyUsers(pub Vec<(String, zeroize::Zeroizing<String>)>);

impl std::fmt::Debug for ProxyUsers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProxyUsers({} accounts)", self.0.len())
    }
}

/// The most a users file may hold (a few thousand accounts).
const MAX_USERS_FILE: u64 = 1 << 20;

/// Reads a proxy's users file: one `user:password` a line (blank lines and `#` comments
/// skipped), each name and password 1-255 bytes (RFC 1929's limits), no name twice; the file
/// is a secret (mode 600, like key files). Problems name the line, never a password.
fn read_proxy_users(base: &Path, file: &Path, errors: &mut Vec<String>) -> ProxyUsers {
    let field = "proxy.users_file";
    let path = base.join(file);
    let bytes = match tunneld_crypto::read_secret_file(&path, MAX_USERS_FILE) {
        Ok(bytes) => bytes,
        Err(e) => {
            errors.push(format!("{field}: {e}{}", unreadable_hint(&e)));
            return ProxyUsers::default();
        }
    };
    let Ok(text) = std::str::from_utf8(&bytes) else {
        errors.push(format!("{field}: {} is not UTF-8 text", path.display()));
        return ProxyUsers::default();
    };
    let mut users: Vec<(String, zeroize::Zeroizing<String>)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let at = format!("{field}: {} line {}", path.display(), i + 1);
        let Some((user, password)) = line.split_once(':') else {
            errors.push(format!("{at}: expected user:password"));
            continue;
        };
        if user.is_empty() || user.len() > 255 || password.is_empty() || password.len() > 255 {
            errors.push(format!(
                "{at}: the user name and the password must each be 1-255 bytes"
            ));
        } else if users.iter().any(|(u, _)| u == user) {
            errors.push(format!("{at}: user {user:?} is listed twice"));
        } else {
            users.push((
                user.to_string(),
                zeroize::Zeroizing::new(password.to_string()),
            ));
        }
    }
    if users.is_empty() {
        errors.push(format!(
            "{field}: {} lists no user (lines user:password)",
            path.display()
        ));
    }
    ProxyUsers(users)
}

#[derive(Debug)]
pub struct WireGuard {
    pub interface: InterfaceConfig,
    pub device: DeviceSettings,
    /// One per `[[peer]]`, in the file's order, with `parallel` resolved for the workers.
    pub peers: Vec<PeerSettings>,
    pub dataplane: Dataplane,
}

/// The dataplane as it will run: decided once, from `[dataplane]`, the MTU and the peers.
#[derive(Debug, Clone)]
pub struct Dataplane {
    pub config: DataplaneConfig,
    /// How many workers (TUN queues, sockets, devices).
    pub workers: usize,
    /// Whether the workers use io_uring.
    pub use_uring: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolve {
    /// `check`: read key files, but do not look hostnames up (no network use).
    CheckOnly,
    /// `up`: everything, including DNS for hostname endpoints.
    Everything,
}

pub fn load(path: &Path, resolve: Resolve) -> Result<Plan, Vec<String>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| vec![format!("cannot read the config file: {e}")])?;
    let base = path.parent().unwrap_or(Path::new("."));
    load_text(&text, base, resolve)
}

/// A config's text, with relative file names taken from `base`.
pub fn load_text(text: &str, base: &Path, resolve: Resolve) -> Result<Plan, Vec<String>> {
    let config = config::parse(text).map_err(|errors| {
        let mut lines: Vec<String> = errors.0.iter().map(ToString::to_string).collect();
        // Key files are read only for a valid config; check them anyway so every problem is
        // reported in one go.
        lines.extend(key_file_problems(text, base));
        lines
    })?;
    let mut errors = Vec::new();
    let dataplane = match &config.interface {
        Some(interface) => match plan_dataplane(&config.dataplane, interface.mtu, &config.peers) {
            Ok(dataplane) => Some(dataplane),
            Err(problems) => {
                errors.extend(problems);
                None
            }
        },
        None => None,
    };
    let workers = dataplane.as_ref().map_or(1, |d| d.workers);

    let private_key = match config.interface.as_ref().map(|i| &i.private_key) {
        None => None,
        Some(KeySource::Inline(key)) => Some(key.clone()),
        Some(KeySource::File(file)) => {
            read_key(base, file, "interface.private_key_file", &mut errors).and_then(|text| {
                match PrivateKey::from_base64(&text) {
                    Ok(key) => Some(key),
                    Err(e) => {
                        errors.push(format!(
                            "interface.private_key_file: {}: the key {e}",
                            file.display()
                        ));
                        None
                    }
                }
            })
        }
    };

    let mut peers = Vec::new();
    for (i, peer) in config.peers.iter().enumerate() {
        let preshared_key = match &peer.preshared_key {
            None => None,
            Some(KeySource::Inline(key)) => Some(key.clone()),
            Some(KeySource::File(file)) => {
                let field = format!("peer[{i}].preshared_key_file");
                read_key(base, file, &field, &mut errors).and_then(|text| {
                    match PresharedKey::from_base64(&text) {
                        Ok(key) => Some(key),
                        Err(e) => {
                            errors.push(format!("{field}: {}: the key {e}", file.display()));
                            None
                        }
                    }
                })
            }
        };
        let endpoint = match (&peer.endpoint, resolve) {
            (None, _) => None,
            (Some(Endpoint::Addr(addr)), _) => Some(*addr),
            (Some(Endpoint::Host { .. }), Resolve::CheckOnly) => None,
            (Some(Endpoint::Host { host, port }), Resolve::Everything) => {
                match resolve_host(host, *port) {
                    Ok(addr) => Some(addr),
                    Err(e) => {
                        errors.push(format!("peer[{i}].endpoint: cannot resolve {host}: {e}"));
                        None
                    }
                }
            }
        };
        let mut settings = PeerSettings::new(peer.public_key)
            .allowed_ips(peer.allowed_ips.iter().copied())
            .persistent_keepalive(peer.persistent_keepalive)
            .parallel(peer.parallel.sub_tunnels(workers));
        settings.preshared_key = preshared_key;
        settings.endpoint = endpoint;
        peers.push(settings);
    }

    if let Some(key) = &private_key {
        let own = key.public_key();
        for (i, peer) in config.peers.iter().enumerate() {
            if peer.public_key == own {
                errors.push(format!(
                    "peer[{i}].public_key: is the interface's own public key"
                ));
            }
        }
    }

    errors.extend(tunneld_tls::check_files(&config, base));
    let proxy_users = match config.proxy.as_ref().and_then(|p| p.users_file.as_ref()) {
        Some(file) => read_proxy_users(base, file, &mut errors),
        None => ProxyUsers::default(),
    };
    if !errors.is_empty() {
        return Err(errors);
    }
    let wireguard = match (&config.interface, private_key, dataplane) {
        (Some(interface), Some(private_key), Some(dataplane)) => Some(WireGuard {
            device: DeviceSettings {
                private_key,
                listen_port: interface.listen_port,
                mtu: interface.mtu,
                fwmark: interface.fwmark,
            },
            interface: interface.clone(),
            peers,
            dataplane,
        }),
        (None, _, _) => None,
        // A key that could not be read, or a dataplane refused, was reported above.
        (Some(_), _, _) => return Err(vec!["interface.private_key: missing".into()]),
    };
    Ok(Plan {
        config,
        wireguard,
        base: base.to_path_buf(),
        proxy_users,
    })
}

fn read_key(
    base: &Path,
    file: &Path,
    field: &str,
    errors: &mut Vec<String>,
) -> Option<zeroize::Zeroizing<String>> {
    let path: PathBuf = base.join(file);
    match read_key_file(&path) {
        Ok(text) => Some(text),
        Err(e) => {
            errors.push(format!("{field}: {e}{}", unreadable_hint(&e)));
            None
        }
    }
}

/// For a key file this process may not read while it runs as a user other than root (as
/// tunneld@.service runs it): which user must own it.
fn unreadable_hint(e: &tunneld_crypto::KeyFileError) -> String {
    let denied = matches!(e, tunneld_crypto::KeyFileError::Read { source, .. }
        if source.kind() == std::io::ErrorKind::PermissionDenied);
    // SAFETY: geteuid has no arguments and cannot fail.
    let uid = unsafe { libc::geteuid() };
    if denied && uid != 0 {
        format!(" (tunneld runs as uid {uid}: the file must be that user's, mode 600)")
    } else {
        String::new()
    }
}

/// Problems with the key files a config names, found from the raw TOML (the config itself
/// may be invalid): unreadable, or readable by others.
fn key_file_problems(text: &str, base: &Path) -> Vec<String> {
    let Ok(root) = text.parse::<toml::Table>() else {
        return Vec::new();
    };
    let mut files = Vec::new();
    if let Some(file) = root
        .get("interface")
        .and_then(|i| i.get("private_key_file"))
        .and_then(|f| f.as_str())
    {
        files.push(("interface.private_key_file".to_string(), file));
    }
    if let Some(peers) = root.get("peer").and_then(|p| p.as_array()) {
        for (i, peer) in peers.iter().enumerate() {
            if let Some(file) = peer.get("preshared_key_file").and_then(|f| f.as_str()) {
                files.push((format!("peer[{i}].preshared_key_file"), file));
            }
        }
    }
    let mut problems = Vec::new();
    for (field, file) in files {
        if let Err(e) = read_key_file(&base.join(file)) {
            problems.push(format!("{field}: {e}{}", unreadable_hint(&e)));
        }
    }
    problems
}

fn resolve_host(host: &str, port: u16) -> std::io::Result<SocketAddr> {
    (host, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no address found"))
}

/// Decides the dataplane, refusing before anything is created what this build or machine
/// cannot honour, so that a config never silently runs differently from what it says.
/// `peers` are the config's (the bare mode has none yet).
pub fn plan_dataplane(
    dataplane: &DataplaneConfig,
    mtu: u16,
    peers: &[PeerConfig],
) -> Result<Dataplane, Vec<String>> {
    let mut problems = Vec::new();
    if let Some(aead) = dataplane.aead {
        if !aead.is_available() {
            problems.push(format!(
                "dataplane.aead: \"{}\": this CPU does not run it (it needs AVX-512 F, BW and VL); use \"auto\", \"ring\" or \"aws-lc\"",
                aead.name()
            ));
        }
    }
    let workers = worker_count(dataplane, peers);
    if dataplane.backend == Backend::Xdp {
        let max = tunneld_dataplane::xdp::backend::MAX_DATAGRAM - 32 - 15;
        if usize::from(mtu) > max {
            problems.push(format!(
                "interface.mtu: {mtu} is more than an AF_XDP frame holds with dataplane.backend = \"xdp\" (at most {max})"
            ));
        }
        if dataplane.xdp_interface.is_none() && !peers.iter().any(|p| p.endpoint.is_some()) {
            problems.push(NO_XDP_INTERFACE.into());
        }
    }
    for (i, peer) in peers.iter().enumerate() {
        if let Err(e) = check_sub_tunnels(i, peer.parallel.sub_tunnels(workers), workers) {
            problems.push(e);
        }
    }
    let use_uring = match choose_uring(dataplane.backend) {
        Ok(use_uring) => use_uring,
        Err(e) => {
            problems.push(e);
            false
        }
    };
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(Dataplane {
        config: dataplane.clone(),
        workers,
        use_uring,
    })
}

/// The rule for sub-tunnels, wherever peers are set (a start, a reload): each of a peer's
/// `parallel` sub-tunnels is carried by its own worker.
pub fn check_sub_tunnels(peer: usize, sub_tunnels: u8, workers: usize) -> Result<(), String> {
    if usize::from(sub_tunnels) > workers {
        return Err(format!(
            "peer[{peer}].parallel: {sub_tunnels} sub-tunnels need as many workers, and this interface has {workers} (dataplane.workers)"
        ));
    }
    Ok(())
}

pub const NO_XDP_INTERFACE: &str =
    "dataplane.xdp_interface: no peer has an endpoint to find the underlay interface by; name it";

/// How many workers: as configured, or for `auto` one per CPU tunneld may run on (`cpus` if
/// given), except for a config whose only peer is a plain one: one worker carries all of a
/// plain peer's sessions, so more could only add hand-offs (and wake-ups) to its packets.
fn worker_count(dataplane: &DataplaneConfig, peers: &[PeerConfig]) -> usize {
    let one_plain_link = matches!(peers, [peer] if peer.parallel.is_plain());
    match (dataplane.workers, &dataplane.cpus) {
        (config::Workers::Count(n), _) => n,
        (config::Workers::Auto, _) if one_plain_link => 1,
        (config::Workers::Auto, Some(cpus)) => cpus.len(),
        (config::Workers::Auto, None) => {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        }
    }
    .clamp(1, config::MAX_WORKERS)
}

/// Whether the worker uses io_uring: for `uring` (an error when the kernel cannot), never
/// for `mmsg`. `auto` takes recvmmsg/sendmmsg: side by side (docs/benchmarks.md) it carries
/// bulk TCP at more Gbit per CPU-second and lower RTT than io_uring, which copies each
/// received datagram out of its provided buffer; io_uring wins only on small-packet rate.
fn choose_uring(backend: Backend) -> Result<bool, String> {
    match backend {
        Backend::Uring => tunneld_dataplane::uring::probe()
            .map(|()| true)
            .map_err(|e| {
                format!("dataplane.backend = \"uring\": io_uring is not usable here: {e}")
            }),
        Backend::Auto | Backend::Mmsg | Backend::Xdp => Ok(false),
    }
}
