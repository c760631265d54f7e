//! From a config file to what the daemon runs: parsed, validated, key files read, endpoints
//! resolved. Every problem found is reported, one line each.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use tunneld_config::{self as config, Config, Endpoint, InterfaceConfig, KeySource};
use tunneld_crypto::{read_key_file, PresharedKey, PrivateKey};
use tunneld_tunnel::{DeviceSettings, PeerSettings};

/// A config ready to run.
#[derive(Debug)]
pub struct Loaded {
    pub config: Config,
    /// The WireGuard interface's settings; `None` for a TLS-forwarding-only config.
    pub wireguard: Option<WireGuard>,
    /// Where relative file names in the config are taken from (the config's directory).
    pub base: PathBuf,
}

#[derive(Debug)]
pub struct WireGuard {
    pub interface: InterfaceConfig,
    pub device: DeviceSettings,
    pub peers: Vec<PeerSettings>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolve {
    /// `check`: read key files, but do not look hostnames up (no network use).
    CheckOnly,
    /// `up`: everything, including DNS for hostname endpoints.
    Everything,
}

pub fn load(path: &Path, resolve: Resolve) -> Result<Loaded, Vec<String>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| vec![format!("cannot read the config file: {e}")])?;
    let base = path.parent().unwrap_or(Path::new("."));
    load_text(&text, base, resolve)
}

/// A config's text, with relative file names taken from `base`.
pub fn load_text(text: &str, base: &Path, resolve: Resolve) -> Result<Loaded, Vec<String>> {
    let config = config::parse(text).map_err(|errors| {
        let mut lines: Vec<String> = errors.0.iter().map(ToString::to_string).collect();
        // Key files are read only for a valid config; check them anyway so every problem is
        // reported in one go.
        lines.extend(key_file_problems(text, base));
        lines
    })?;
    let mut errors = Vec::new();

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
        peers.push(PeerSettings {
            public_key: peer.public_key,
            preshared_key,
            endpoint,
            allowed_ips: peer.allowed_ips.clone(),
            persistent_keepalive: peer.persistent_keepalive,
            // `auto` depends on the worker count, which `up` sets once it knows it.
            parallel: peer.parallel.sub_tunnels(1),
        });
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
    if !errors.is_empty() {
        return Err(errors);
    }
    let wireguard = match (&config.interface, private_key) {
        (Some(interface), Some(private_key)) => Some(WireGuard {
            device: DeviceSettings {
                private_key,
                listen_port: interface.listen_port,
                mtu: interface.mtu,
                fwmark: interface.fwmark,
            },
            interface: interface.clone(),
            peers,
        }),
        (None, _) => None,
        // A key that could not be read was reported above.
        (Some(_), None) => return Err(vec!["interface.private_key: missing".into()]),
    };
    Ok(Loaded {
        config,
        wireguard,
        base: base.to_path_buf(),
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
            errors.push(format!("{field}: {e}"));
            None
        }
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
            problems.push(format!("{field}: {e}"));
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
