//! The TOML config model and its validation, and the import of wg-quick `.conf` files.
//!
//! The text is first read into a plain TOML tree, then walked by hand rather than through serde
//! derive: that way a wrong type, a value out of range or a misspelt field each becomes its own
//! line naming the field (`peer[1].allowed_ips[0]: ...`), and every problem is reported at once.
//! Secret values (private and preshared keys) are never echoed in errors.
//!
//! This is the file format, kept out of the protocol core (`tunneld-wireguard`), which takes
//! typed settings; the gateway (`tunneld`) turns a [`Config`] into those.

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use ipnet::IpNet;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use toml::{Table, Value};
use tunneld_crypto::{KeyError, PresharedKey, PrivateKey, PublicKey};

pub const DEFAULT_MTU: u16 = 1420;
const MIN_MTU: i64 = 576;
const MIN_MTU_IPV6: i64 = 1280;
const MAX_MTU: i64 = 65535;
/// The most workers an interface can have: each reads its own queue of the TUN device, and
/// the kernel gives a TUN device at most 256 queues (`MAX_TAP_QUEUES`).
pub const MAX_WORKERS: usize = 256;
const MAX_CPU: i64 = 65535;

const INTERFACE_FIELDS: &[&str] = &[
    "name",
    "private_key",
    "private_key_file",
    "listen_port",
    "address",
    "mtu",
    "fwmark",
];
const DATAPLANE_FIELDS: &[&str] = &[
    "backend",
    "workers",
    "cpus",
    "udp_gso",
    "udp_gro",
    "tun_offload",
    "busy_poll_us",
    "aead",
    "xdp_interface",
    "xdp_checksum_offload",
    "clamp_mss",
];
/// The most sub-tunnels one peer can be split into (`parallel`).
pub const MAX_PARALLEL: u8 = 64;
const PEER_FIELDS: &[&str] = &[
    "public_key",
    "preshared_key",
    "preshared_key_file",
    "endpoint",
    "allowed_ips",
    "persistent_keepalive",
    "parallel",
    "transport",
    "tls_server_name",
    "tls_ca_file",
    "tls_cert_file",
    "tls_key_file",
    "tls_endpoint",
];

mod fleet;
mod proxy;
mod tls;
pub use fleet::{
    name_problem as fleet_name_problem, FleetConfig, LanSide, SiteMode, DEFAULT_FLEET_KEEPALIVE,
    DEFAULT_LEASE_TTL, MAX_LEASE_TTL, MIN_LEASE_TTL,
};
pub use proxy::{
    Forward as ProxyForward, Protocol as ProxyProtocol, ProxyConfig, ResolveWith,
    Reverse as ProxyReverse,
};
pub use tls::{
    CertKey, PeerTls, TlsConfig, TlsForward, TlsListen, TlsTarget, DEFAULT_LISTEN_GROUPS,
    LISTEN_GROUPS,
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The WireGuard interface; `None` in a config with only TLS forwarding.
    pub interface: Option<InterfaceConfig>,
    pub dataplane: DataplaneConfig,
    pub peers: Vec<PeerConfig>,
    pub tls: TlsConfig,
    /// `[metrics]`: where Prometheus scrapes the interface's and the TLS sections' counters.
    pub metrics: Option<MetricsConfig>,
    /// `[fleet]`: peers found through etcd, beside the file's own.
    pub fleet: Option<FleetConfig>,
    /// `[proxy]`: a config for `tunneld proxy` (user space, no TUN), not for `tunneld up`.
    pub proxy: Option<ProxyConfig>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsConfig {
    /// The address:port serving `GET /metrics`.
    pub listen: SocketAddr,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceConfig {
    pub name: String,
    pub private_key: KeySource<PrivateKey>,
    /// 0 = any free port.
    pub listen_port: u16,
    /// Interface addresses, host bits kept (`10.77.0.1/24`).
    pub addresses: Vec<IpNet>,
    pub mtu: u16,
    pub fwmark: u32,
}

/// A key given inline or as a file path (as written; the daemon resolves it relative to the
/// config file's directory and reads it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource<K> {
    Inline(K),
    File(PathBuf),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataplaneConfig {
    pub backend: Backend,
    pub workers: Workers,
    pub cpus: Option<Vec<usize>>,
    /// UDP generic segmentation offload on sends (default on where the kernel has it).
    pub udp_gso: bool,
    /// UDP generic receive offload: the kernel may merge received datagrams (default on).
    pub udp_gro: bool,
    /// TUN offloads: TCP/UDP super-packets from and to the kernel, segmented and coalesced
    /// in user space (default on where the kernel has them).
    pub tun_offload: bool,
    /// How long a worker keeps polling after sparse traffic before it sleeps, in
    /// microseconds (0: never; see `Worker::set_busy_poll`).
    pub busy_poll_us: u32,
    /// Whose ChaCha20-Poly1305 seals and opens data messages; `None` ("auto"): the fastest
    /// measured on this CPU at start-up.
    pub aead: Option<tunneld_crypto::aead::Implementation>,
    /// `backend = "xdp"`: the underlay interface whose queues the AF_XDP sockets bind to;
    /// `None`: the interface the route to the first peer's endpoint leaves by (else the
    /// default route's).
    pub xdp_interface: Option<String>,
    /// `backend = "xdp"`: leave UDP checksums to the device where it computes them (TX
    /// checksum offload); `false`: always compute them in software.
    pub xdp_checksum_offload: bool,
    /// TCP MSS clamping of SYNs crossing the tunnel, both ways (`clamp_mss`).
    pub clamp_mss: ClampMss,
}

/// `[dataplane] clamp_mss`: whether TCP SYNs crossing the tunnel get their MSS lowered, so
/// that hosts behind a gateway never send segments the tunnel would fragment or drop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClampMss {
    /// Left as the hosts set it (the default, as in the other WireGuard implementations).
    #[default]
    Off,
    /// `"auto"`: from the tunnel's MTU (MTU − 40 over IPv4, MTU − 60 over IPv6).
    Auto,
    /// At most this over IPv4 (20 less over IPv6).
    Mss(u16),
}

/// The smallest MSS `clamp_mss` may give (IPv4's minimum datagram less its headers).
const MIN_CLAMP_MSS: i64 = 536;

impl Default for DataplaneConfig {
    fn default() -> Self {
        Self {
            backend: Backend::Auto,
            workers: Workers::Auto,
            cpus: None,
            udp_gso: true,
            udp_gro: true,
            tun_offload: true,
            busy_poll_us: DEFAULT_BUSY_POLL_US,
            aead: None,
            xdp_interface: None,
            xdp_checksum_offload: true,
            clamp_mss: ClampMss::Off,
        }
    }
}

/// The default busy-poll window: long enough to catch a reply crossing a LAN-scale round
/// trip, short enough that sparse traffic costs little CPU.
pub const DEFAULT_BUSY_POLL_US: u32 = 50;
/// The longest busy-poll window accepted.
pub const MAX_BUSY_POLL_US: u32 = 10_000;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Backend {
    #[default]
    Auto,
    Xdp,
    Uring,
    Mmsg,
}

impl Backend {
    pub const ALL: [Backend; 4] = [Backend::Auto, Backend::Xdp, Backend::Uring, Backend::Mmsg];

    /// The name written in the config file.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Auto => "auto",
            Backend::Xdp => "xdp",
            Backend::Uring => "uring",
            Backend::Mmsg => "mmsg",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Workers {
    #[default]
    Auto,
    Count(usize),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerConfig {
    pub public_key: PublicKey,
    pub preshared_key: Option<KeySource<PresharedKey>>,
    pub endpoint: Option<Endpoint>,
    /// Truncated to their networks.
    pub allowed_ips: Vec<IpNet>,
    /// Seconds, 0 = off.
    pub persistent_keepalive: u16,
    /// `parallel = K` or `"auto"`: the peer (another tunneld) is carried by K standard
    /// WireGuard sessions, one per worker, with flows hashed onto them. 1 (the default) for
    /// any peer.
    pub parallel: Parallel,
    /// `transport = "tls"`: datagrams go over TLS to `endpoint`, the other tunneld's
    /// `[[tls.listen]]` with `forward_to = "wireguard"`.
    pub tls: Option<PeerTls>,
}

/// How many sub-tunnels carry a peer: a number, or one per worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parallel {
    Count(u8),
    /// One sub-tunnel per worker (at most [`MAX_PARALLEL`]), so that both sides, run with
    /// the same number of workers, need no number written in their configs.
    Auto,
}

impl Default for Parallel {
    fn default() -> Self {
        Parallel::Count(1)
    }
}

impl Parallel {
    /// The number of sub-tunnels on an interface with `workers` workers.
    pub fn sub_tunnels(self, workers: usize) -> u8 {
        match self {
            Parallel::Count(k) => k,
            Parallel::Auto => {
                u8::try_from(workers.clamp(1, usize::from(MAX_PARALLEL))).unwrap_or(MAX_PARALLEL)
            }
        }
    }

    /// Whether the peer is plain WireGuard whatever the worker count.
    pub fn is_plain(self) -> bool {
        self == Parallel::Count(1)
    }
}

/// Where to send a peer's first handshake: an address, or a host name the daemon resolves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Addr(SocketAddr),
    Host { host: String, port: u16 },
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Addr(a) => write!(f, "{a}"),
            Endpoint::Host { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

impl std::str::FromStr for Endpoint {
    type Err = String;

    /// `a.b.c.d:port`, `[ipv6]:port` (a numeric zone such as `%2` is kept) or `host:port`.
    /// The error is a one-line reason that quotes the text.
    fn from_str(text: &str) -> Result<Self, String> {
        let shown = quote(text);
        if text.is_empty() {
            return Err("is empty (write host:port)".into());
        }
        if let Some(rest) = text.strip_prefix('[') {
            let Some((inside, after)) = rest.split_once(']') else {
                return Err(format!("{shown} has no `]` after the IPv6 address"));
            };
            let Some(port) = after.strip_prefix(':') else {
                return Err(if after.is_empty() {
                    format!("{shown} has no port (write [address]:port)")
                } else {
                    format!("{shown}: expected `:port` after `]`")
                });
            };
            let port = endpoint_port(&shown, port)?;
            if let Some((_, zone)) = inside.split_once('%') {
                if zone.is_empty() || !zone.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(format!(
                        "{shown}: the zone {} must be an interface index (a number)",
                        quote(zone)
                    ));
                }
            }
            // The standard parser takes the numeric zone as the scope id.
            return match format!("[{inside}]:{port}").parse::<SocketAddr>() {
                Ok(addr @ SocketAddr::V6(_)) => Ok(Endpoint::Addr(addr)),
                _ => Err(format!("{shown}: {} is not an IPv6 address", quote(inside))),
            };
        }
        let Some((host, port)) = text.rsplit_once(':') else {
            return Err(format!("{shown} has no port (write host:port)"));
        };
        if host.contains(':') {
            return Err(format!(
                "{shown}: write IPv6 endpoints in brackets, as [address]:port"
            ));
        }
        let port = endpoint_port(&shown, port)?;
        if host.is_empty() {
            return Err(format!("{shown} has no host before the port"));
        }
        if let Ok(ip) = host.parse::<Ipv4Addr>() {
            return Ok(Endpoint::Addr(SocketAddr::new(IpAddr::V4(ip), port)));
        }
        check_host_name(host).map_err(|why| format!("{shown}: {why}"))?;
        Ok(Endpoint::Host {
            host: host.to_string(),
            port,
        })
    }
}

fn endpoint_port(shown: &str, port: &str) -> Result<u16, String> {
    if port.is_empty() {
        return Err(format!("{shown} has no port after `:`"));
    }
    if !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{shown}: port {} is not a number", quote(port)));
    }
    match port.parse::<u16>() {
        Ok(0) => Err(format!(
            "{shown} has port 0; give the port the peer listens on (1-65535)"
        )),
        Ok(port) => Ok(port),
        Err(_) => Err(format!(
            "{shown}: port {} is out of range 1-65535",
            quote(port)
        )),
    }
}

/// A DNS name as resolvers take it: dot-separated labels of letters, digits, `-` and `_`.
fn check_host_name(host: &str) -> Result<(), String> {
    let name = host.strip_suffix('.').unwrap_or(host);
    if name.len() > 253 {
        return Err("the host name is longer than 253 characters".into());
    }
    // All-numeric names are mistyped IPv4 addresses, not host names.
    if name
        .split('.')
        .all(|l| l.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(format!("{} is not a valid IPv4 address", quote(host)));
    }
    for label in name.split('.') {
        let valid = !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !valid {
            return Err(format!("{} is not an IP address or host name", quote(host)));
        }
    }
    Ok(())
}

/// One problem, naming the field it is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub message: String,
}

impl ConfigError {
    /// A problem in `field` (as the config file spells it: `peer[1].allowed_ips[0]`; empty
    /// for the file as a whole).
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            field: field.into(),
            message: message.into(),
        }
    }

    /// A problem from its one-line form, `field: message` (a line whose start is not a
    /// field name is all message).
    pub fn from_line(line: &str) -> Self {
        match line.split_once(": ") {
            Some((field, message))
                if !field.is_empty()
                    && field.bytes().all(|b| {
                        b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'[' | b']')
                    }) =>
            {
                ConfigError::new(field, message)
            }
            _ => ConfigError::new("", line),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

/// Every problem found, one per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// A value as an error shows it: in backticks, control characters escaped and long values cut,
/// so that every error stays one readable line. Never used on secrets.
fn quote(text: &str) -> String {
    const MAX_CHARS: usize = 64;
    let mut out = String::from("`");
    for (i, ch) in text.chars().enumerate() {
        if i == MAX_CHARS {
            out.push('…');
            break;
        }
        if ch.is_control() {
            out.extend(ch.escape_default());
        } else {
            out.push(ch);
        }
    }
    out.push('`');
    out
}

/// A non-secret value as an error shows it: short values themselves, others by type.
fn describe(v: &Value) -> String {
    match v {
        Value::String(s) => {
            let cut: String = s.chars().take(64).collect();
            format!("{cut:?}")
        }
        Value::Integer(n) => n.to_string(),
        Value::Boolean(b) => b.to_string(),
        other => other.type_str().to_string(),
    }
}

/// The known name closest to a misspelt one, if any is close enough to be the intended one.
fn closest<'a>(word: &str, known: &[&'a str]) -> Option<&'a str> {
    // Far longer than any known name, so not within two edits of one: skip the work.
    if word.len() > 64 {
        return None;
    }
    let word = word.to_ascii_lowercase();
    known
        .iter()
        .map(|k| (edit_distance(&word, k), *k))
        .filter(|(d, k)| *d <= 2 && *d < k.len())
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = Vec::with_capacity(b.len() + 1);
        current.push(i + 1);
        for (j, cb) in b.iter().enumerate() {
            let substitute = previous[j] + usize::from(ca != *cb);
            current.push(substitute.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

/// Parses `address/prefix`, or a bare address as a single host (as `wg` accepts it).
fn parse_cidr(text: &str) -> Result<IpNet, String> {
    if let Ok(net) = text.parse::<IpNet>() {
        return Ok(net);
    }
    if let Ok(addr) = text.parse::<IpAddr>() {
        return Ok(IpNet::from(addr));
    }
    let shown = quote(text);
    let Some((addr, len)) = text.split_once('/') else {
        return Err(format!(
            "{shown} is not a CIDR (write address/prefix, e.g. 10.0.0.0/24)"
        ));
    };
    let Ok(addr) = addr.parse::<IpAddr>() else {
        return Err(format!(
            "{shown} is not a CIDR ({} is not an IP address)",
            quote(addr)
        ));
    };
    let max = if addr.is_ipv4() { 32 } else { 128 };
    Err(match len.parse::<u32>() {
        Ok(n) if n > max => format!("{shown} is not a CIDR (prefix length {n} > {max})"),
        _ => format!(
            "{shown} is not a CIDR (prefix length {} is not a number 0-{max})",
            quote(len)
        ),
    })
}

/// Collects errors while walking the tree.
#[derive(Default)]
struct Checker {
    errors: Vec<ConfigError>,
}

impl Checker {
    fn error(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.errors.push(ConfigError {
            field: field.into(),
            message: message.into(),
        });
    }

    /// Reports keys of `table` not in `known`, suggesting the likely intended one.
    fn unknown_fields(&mut self, table: &Table, path: &str, known: &[&str]) {
        for key in table.keys() {
            if known.contains(&key.as_str()) {
                continue;
            }
            let hint = match closest(key, known) {
                Some(k) => format!("did you mean `{k}`?"),
                None => format!("expected one of: {}", known.join(", ")),
            };
            self.error(path, format!("unknown field {} ({hint})", quote(key)));
        }
    }

    fn string<'a>(&mut self, table: &'a Table, path: &str, key: &str) -> Option<&'a str> {
        match table.get(key)? {
            Value::String(s) => Some(s),
            other => {
                self.error(
                    format!("{path}.{key}"),
                    format!("must be a string, not {}", other.type_str()),
                );
                None
            }
        }
    }

    fn integer(&mut self, table: &Table, path: &str, key: &str, min: i64, max: i64) -> Option<i64> {
        match table.get(key)? {
            Value::Integer(n) if (min..=max).contains(n) => Some(*n),
            Value::Integer(n) => {
                self.error(
                    format!("{path}.{key}"),
                    format!("{n} is out of range {min}-{max}"),
                );
                None
            }
            other => {
                self.error(
                    format!("{path}.{key}"),
                    format!("must be an integer, not {}", describe(other)),
                );
                None
            }
        }
    }

    /// A list of strings, each with its field path (`peer[0].allowed_ips[2]`) and index.
    fn string_list<'a>(
        &mut self,
        table: &'a Table,
        path: &str,
        key: &str,
    ) -> Vec<(String, usize, &'a str)> {
        match table.get(key) {
            None => Vec::new(),
            Some(Value::Array(items)) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    let field = format!("{path}.{key}[{i}]");
                    match item {
                        Value::String(s) => out.push((field, i, s.as_str())),
                        other => {
                            self.error(field, format!("must be a string, not {}", other.type_str()))
                        }
                    }
                }
                out
            }
            Some(other) => {
                self.error(
                    format!("{path}.{key}"),
                    format!("must be a list of strings, not {}", other.type_str()),
                );
                Vec::new()
            }
        }
    }

    /// `key` or `key_file`: exactly one, or neither when optional. The inline value is a
    /// secret, so its errors say what is wrong without showing it.
    fn key_source<K>(
        &mut self,
        table: &Table,
        path: &str,
        key: &str,
        required: bool,
        parse: impl Fn(&str) -> Result<K, KeyError>,
    ) -> Option<KeySource<K>> {
        let file_key = format!("{key}_file");
        let inline = self.string(table, path, key);
        let file = self.string(table, path, &file_key);
        match (inline, file) {
            (Some(_), Some(_)) => {
                self.error(path, format!("give `{key}` or `{file_key}`, not both"));
                None
            }
            (Some(text), None) => match parse(text) {
                Ok(k) => Some(KeySource::Inline(k)),
                Err(e) => {
                    self.error(format!("{path}.{key}"), format!("the key {e}"));
                    None
                }
            },
            (None, Some("")) => {
                self.error(format!("{path}.{file_key}"), "is empty (give a file path)");
                None
            }
            (None, Some(file)) => Some(KeySource::File(PathBuf::from(file))),
            (None, None) => {
                // A wrong type was already reported by `string`.
                if required && !table.contains_key(key) && !table.contains_key(&file_key) {
                    self.error(path, format!("missing `{key}` or `{file_key}`"));
                }
                None
            }
        }
    }
}

/// Parses and validates the settings of a `[dataplane]` section on their own (`key = value`
/// lines, without the header), as the bare mode takes them from its options. Errors name
/// the field as `dataplane.<key>`.
pub fn parse_dataplane(body: &str) -> Result<DataplaneConfig, ConfigErrors> {
    let root = parse_toml(&format!("[dataplane]\n{body}"))?;
    let mut c = Checker::default();
    let dataplane = match root.get("dataplane") {
        Some(Value::Table(t)) => check_dataplane(&mut c, t),
        _ => DataplaneConfig::default(),
    };
    for key in root.keys().filter(|k| *k != "dataplane") {
        c.error(key.as_str(), "is not a dataplane setting");
    }
    if c.errors.is_empty() {
        Ok(dataplane)
    } else {
        Err(ConfigErrors(c.errors))
    }
}

/// Checks a WireGuard interface name as Linux would (at most 15 bytes; no `/`, `:`,
/// whitespace or control characters; not `.` or `..`).
pub fn check_interface_name(name: &str) -> Result<(), ConfigError> {
    match interface_name_problem(name) {
        Some(problem) => Err(ConfigError::new("interface.name", problem)),
        None => Ok(()),
    }
}

/// Parses and validates a config file's text. On failure, returns every problem found.
pub fn parse(text: &str) -> Result<Config, ConfigErrors> {
    let root = parse_toml(text)?;
    let mut c = Checker::default();
    check_sections(&mut c, &root);

    let tls = root
        .get("tls")
        .map(|t| tls::check_tls(&mut c, t))
        .unwrap_or_default();
    let (interface, own_key) = match root.get("interface") {
        Some(Value::Table(t)) => check_interface(&mut c, t),
        Some(other) => {
            c.error(
                "interface",
                format!("must be a table ([interface]), not {}", other.type_str()),
            );
            (None, None)
        }
        // A TLS-only config runs no WireGuard interface.
        None if root.contains_key("tls") && !root.contains_key("peer") => {
            if matches!(root.get("tls"), Some(Value::Table(t)) if t.is_empty()) {
                c.error(
                    "tls",
                    "has no [[tls.forward]] or [[tls.listen]] sections, and there is no [interface]: nothing to run",
                );
            }
            (None, None)
        }
        None if root.contains_key("peer") => {
            c.error(
                "interface",
                "missing [interface] section (the [[peer]] sections need one)",
            );
            (None, None)
        }
        None => {
            c.error(
                "interface",
                "missing [interface] section (or [[tls.forward]]/[[tls.listen]] for TLS forwarding only)",
            );
            (None, None)
        }
    };
    let dataplane = match root.get("dataplane") {
        Some(Value::Table(t)) => check_dataplane(&mut c, t),
        Some(other) => {
            c.error(
                "dataplane",
                format!("must be a table ([dataplane]), not {}", other.type_str()),
            );
            DataplaneConfig::default()
        }
        None => DataplaneConfig::default(),
    };
    let fleet = root
        .get("fleet")
        .and_then(|f| fleet::check_fleet(&mut c, f));
    if let Some((at, _)) = fleet.as_ref().and_then(|f| f.relay_tls.as_ref()) {
        // The address advertised is where sites reach it; the listener may listen on any
        // address of that port.
        let served = tls.listens.iter().any(|l| {
            l.forward_to == TlsTarget::WireGuard
                && l.listen.port() == at.port()
                && (l.listen.ip() == at.ip() || l.listen.ip().is_unspecified())
        });
        if !served {
            c.error(
                "fleet.relay_tls",
                format!("{at} is no [[tls.listen]] with forward_to = \"wireguard\" of this config"),
            );
        }
    }
    if root.contains_key("fleet") && !root.contains_key("interface") {
        c.error(
            "fleet",
            "needs an [interface]: the fleet's peers are WireGuard peers",
        );
    }
    let metrics = match root.get("metrics") {
        Some(Value::Table(t)) => {
            c.unknown_fields(t, "metrics", &["listen"]);
            let listen = tls::listen_addr(&mut c, t, "metrics");
            listen.map(|listen| MetricsConfig { listen })
        }
        Some(other) => {
            c.error(
                "metrics",
                format!("must be a table ([metrics]), not {}", other.type_str()),
            );
            None
        }
        None => None,
    };
    let proxy = root.get("proxy").and_then(|section| {
        proxy::check_proxy_rules(&mut c, &root);
        let addresses = interface.as_ref().map(|i| i.addresses.as_slice());
        if let Some(addresses) = addresses {
            proxy::check_proxy_addresses(&mut c, addresses);
        }
        proxy::check_proxy(&mut c, section, addresses)
    });
    // Indexed like the file, so that cross-peer errors name the right `peer[i]` even when
    // an earlier peer has errors of its own.
    let peers: Vec<Option<PeerParts>> = match root.get("peer") {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::Table(t) => Some(check_peer(&mut c, t, &format!("peer[{i}]"))),
                other => {
                    c.error(
                        format!("peer[{i}]"),
                        format!("must be a table ([[peer]]), not {}", other.type_str()),
                    );
                    None
                }
            })
            .collect(),
        Some(Value::Table(_)) => {
            c.error(
                "peer",
                "must be a list of tables: write each peer as [[peer]], not [peer]",
            );
            Vec::new()
        }
        Some(other) => {
            c.error(
                "peer",
                format!(
                    "must be a list of tables ([[peer]] sections), not {}",
                    other.type_str()
                ),
            );
            Vec::new()
        }
    };
    check_across_peers(&mut c, &peers, own_key);
    // Known here only when both are numbers; `up` checks `auto` once it counts its workers.
    if let Workers::Count(workers) = dataplane.workers {
        for (i, peer) in peers.iter().enumerate() {
            if let Some(PeerParts {
                parallel: Parallel::Count(k),
                ..
            }) = peer
            {
                if usize::from(*k) > workers {
                    c.error(
                        format!("peer[{i}].parallel"),
                        format!("{k} sub-tunnels need as many workers, and dataplane.workers is {workers}"),
                    );
                }
            }
        }
    }

    if !c.errors.is_empty() {
        return Err(ConfigErrors(c.errors));
    }
    // Every `None` above came with an error, so with no errors everything is present.
    let peers: Option<Vec<PeerConfig>> = peers
        .into_iter()
        .map(|p| p.and_then(PeerParts::finish))
        .collect();
    let wireguard_absent = !root.contains_key("interface");
    if wireguard_absent {
        for (i, l) in tls.listens.iter().enumerate() {
            if l.forward_to == TlsTarget::WireGuard {
                c.error(
                    format!("tls.listen[{i}].forward_to"),
                    "\"wireguard\" needs an [interface] in this config",
                );
            }
        }
    }
    if !c.errors.is_empty() {
        return Err(ConfigErrors(c.errors));
    }
    match (interface, peers) {
        (interface @ Some(_), Some(peers)) => Ok(Config {
            interface,
            dataplane,
            peers,
            tls,
            metrics,
            fleet,
            proxy,
        }),
        (None, Some(peers)) if wireguard_absent => Ok(Config {
            interface: None,
            dataplane,
            peers,
            tls,
            metrics,
            fleet,
            proxy,
        }),
        _ => Err(ConfigErrors(vec![ConfigError {
            field: "config".into(),
            message: "is incomplete".into(),
        }])),
    }
}

/// TOML syntax errors are one error with the line and column, as the rest cannot be checked.
fn parse_toml(text: &str) -> Result<Table, ConfigErrors> {
    toml::from_str::<Table>(text).map_err(|e| {
        let field = e
            .span()
            .map(|span| line_column(text, span.start))
            .unwrap_or_else(|| "TOML syntax".into());
        let message = e
            .message()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        ConfigErrors(vec![ConfigError { field, message }])
    })
}

fn line_column(text: &str, offset: usize) -> String {
    let before = text.as_bytes().get(..offset).unwrap_or(text.as_bytes());
    let line = before.iter().filter(|b| **b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |i| i + 1);
    let column = before
        .get(line_start..)
        .map_or(0, |s| String::from_utf8_lossy(s).chars().count())
        + 1;
    format!("line {line}, column {column}")
}

fn check_sections(c: &mut Checker, root: &Table) {
    const SECTIONS: &[&str] = &[
        "interface",
        "dataplane",
        "peer",
        "tls",
        "metrics",
        "fleet",
        "proxy",
    ];
    for (key, value) in root {
        if SECTIONS.contains(&key.as_str()) {
            continue;
        }
        let hint = closest(key, SECTIONS).map_or_else(
            || {
                "expected [interface], [dataplane], [[peer]], [[tls.…]], [metrics], [fleet] and [proxy]"
                    .to_string()
            },
            |k| match k {
                "peer" => "did you mean `[[peer]]`?".to_string(),
                other => format!("did you mean `[{other}]`?"),
            },
        );
        let what = match value {
            Value::Table(_) => format!("section {}", quote(&format!("[{key}]"))),
            Value::Array(items) if items.iter().all(Value::is_table) && !items.is_empty() => {
                format!("section {}", quote(&format!("[[{key}]]")))
            }
            _ => format!("field {}", quote(key)),
        };
        c.error("config", format!("unknown {what} ({hint})"));
    }
}

fn check_interface(c: &mut Checker, t: &Table) -> (Option<InterfaceConfig>, Option<PublicKey>) {
    let path = "interface";
    c.unknown_fields(t, path, INTERFACE_FIELDS);
    let name = match c.string(t, path, "name") {
        Some(name) => match interface_name_problem(name) {
            None => Some(name.to_string()),
            Some(why) => {
                c.error("interface.name", why);
                None
            }
        },
        None => {
            if !t.contains_key("name") {
                c.error(
                    "interface.name",
                    "missing (the interface to create, e.g. \"wg0\")",
                );
            }
            None
        }
    };
    let private_key = c.key_source(t, path, "private_key", true, PrivateKey::from_base64);
    let own_key = match &private_key {
        Some(KeySource::Inline(key)) => Some(key.public_key()),
        _ => None,
    };
    let listen_port = c
        .integer(t, path, "listen_port", 0, 65535)
        .and_then(|n| u16::try_from(n).ok())
        .unwrap_or(0);
    let mut addresses = Vec::new();
    for (field, _, text) in c.string_list(t, path, "address") {
        match parse_cidr(text) {
            Ok(net) if net.addr().is_unspecified() => c.error(
                field,
                format!("{} is not a usable interface address", quote(text)),
            ),
            Ok(net) => addresses.push(net),
            Err(why) => c.error(field, why),
        }
    }
    let has_ipv6 = addresses.iter().any(|a| matches!(a, IpNet::V6(_)));
    let mtu = match c.integer(t, path, "mtu", MIN_MTU, MAX_MTU) {
        Some(mtu) if mtu < MIN_MTU_IPV6 && has_ipv6 => {
            c.error(
                "interface.mtu",
                format!(
                    "{mtu} is below {MIN_MTU_IPV6}, the minimum for IPv6, and an IPv6 address is configured"
                ),
            );
            None
        }
        Some(mtu) => u16::try_from(mtu).ok(),
        None => Some(DEFAULT_MTU),
    };
    let fwmark = c
        .integer(t, path, "fwmark", 0, u32::MAX.into())
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(0);
    let interface = match (name, private_key, mtu) {
        (Some(name), Some(private_key), Some(mtu)) => Some(InterfaceConfig {
            name,
            private_key,
            listen_port,
            addresses,
            mtu,
            fwmark,
        }),
        _ => None,
    };
    (interface, own_key)
}

/// Why Linux would refuse `name` as an interface name (see `dev_valid_name`), if it would.
fn interface_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("is empty (e.g. \"wg0\")".into());
    }
    if name.len() > 15 {
        return Some(format!("{} is longer than 15 bytes", quote(name)));
    }
    if name == "." || name == ".." {
        return Some(format!("{} is not a valid interface name", quote(name)));
    }
    name.chars()
        .find(|ch| *ch == '/' || *ch == ':' || ch.is_whitespace() || ch.is_control())
        .map(|bad| {
            format!(
                "{} contains {bad:?}, which interface names cannot",
                quote(name)
            )
        })
}

fn check_dataplane(c: &mut Checker, t: &Table) -> DataplaneConfig {
    let path = "dataplane";
    c.unknown_fields(t, path, DATAPLANE_FIELDS);
    let mut switch = |key: &str| match t.get(key) {
        None => true,
        Some(Value::Boolean(b)) => *b,
        Some(other) => {
            c.error(
                format!("dataplane.{key}"),
                format!("must be true or false, not {}", describe(other)),
            );
            true
        }
    };
    let udp_gso = switch("udp_gso");
    let udp_gro = switch("udp_gro");
    let tun_offload = switch("tun_offload");
    let xdp_checksum_offload = switch("xdp_checksum_offload");
    let busy_poll_us = match t.get("busy_poll_us") {
        None => DEFAULT_BUSY_POLL_US,
        Some(Value::Integer(n)) if (0..=i64::from(MAX_BUSY_POLL_US)).contains(n) => {
            u32::try_from(*n).unwrap_or(DEFAULT_BUSY_POLL_US)
        }
        Some(Value::Integer(n)) => {
            c.error(
                "dataplane.busy_poll_us",
                format!("{n} is out of range 0-{MAX_BUSY_POLL_US} (microseconds; 0 turns it off)"),
            );
            DEFAULT_BUSY_POLL_US
        }
        Some(other) => {
            c.error(
                "dataplane.busy_poll_us",
                format!("must be a number of microseconds, not {}", describe(other)),
            );
            DEFAULT_BUSY_POLL_US
        }
    };
    let backend = match c.string(t, path, "backend") {
        None => Backend::Auto,
        Some(name) => match Backend::ALL.into_iter().find(|b| b.name() == name) {
            Some(b) => b,
            None => {
                let valid: Vec<&str> = Backend::ALL.iter().map(|b| b.name()).collect();
                c.error(
                    "dataplane.backend",
                    format!(
                        "{} is not a backend (expected one of: {})",
                        quote(name),
                        valid.join(", ")
                    ),
                );
                Backend::Auto
            }
        },
    };
    let aead = match c.string(t, path, "aead") {
        None => None,
        Some(name) => {
            use tunneld_crypto::aead::Implementation;
            Implementation::parse(name).unwrap_or_else(|_| {
                let valid: Vec<&str> = Implementation::ALL.iter().map(|i| i.name()).collect();
                c.error(
                    "dataplane.aead",
                    format!(
                        "{} is not an AEAD implementation (expected one of: auto, {})",
                        quote(name),
                        valid.join(", ")
                    ),
                );
                None
            })
        }
    };
    let workers = match t.get("workers") {
        None => Workers::Auto,
        Some(Value::String(s)) if s == "auto" => Workers::Auto,
        Some(Value::Integer(n)) if (1..=MAX_WORKERS as i64).contains(n) => {
            Workers::Count(usize::try_from(*n).unwrap_or(1))
        }
        Some(Value::Integer(n)) => {
            c.error(
                "dataplane.workers",
                format!("{n} is out of range 1-{MAX_WORKERS}, the queues a TUN device has (or write \"auto\")"),
            );
            Workers::Auto
        }
        Some(other) => {
            c.error(
                "dataplane.workers",
                format!("must be \"auto\" or a number, not {}", describe(other)),
            );
            Workers::Auto
        }
    };
    let cpus = match t.get("cpus") {
        None => None,
        Some(Value::Array(items)) if items.is_empty() => {
            c.error("dataplane.cpus", "is empty (leave it out to use every CPU)");
            None
        }
        Some(Value::Array(items)) => {
            let mut cpus: Vec<usize> = Vec::new();
            let mut seen: HashMap<usize, usize> = HashMap::new();
            for (i, item) in items.iter().enumerate() {
                let field = format!("dataplane.cpus[{i}]");
                match item {
                    Value::Integer(n) if (0..=MAX_CPU).contains(n) => {
                        let cpu = usize::try_from(*n).unwrap_or(0);
                        match seen.entry(cpu) {
                            Entry::Occupied(first) => c.error(
                                field,
                                format!("CPU {cpu} is already listed at [{}]", first.get()),
                            ),
                            Entry::Vacant(slot) => {
                                slot.insert(i);
                                cpus.push(cpu);
                            }
                        }
                    }
                    other => c.error(
                        field,
                        format!(
                            "must be a CPU number (0-{MAX_CPU}), not {}",
                            describe(other)
                        ),
                    ),
                }
            }
            Some(cpus)
        }
        Some(other) => {
            c.error(
                "dataplane.cpus",
                format!("must be a list of CPU numbers, not {}", other.type_str()),
            );
            None
        }
    };
    let xdp_interface = c.string(t, path, "xdp_interface").and_then(|name| {
        if name.is_empty() || name.len() > 15 || name.contains(['/', ' ', '\0']) {
            c.error(
                "dataplane.xdp_interface",
                format!(
                    "{} is not an interface name (1-15 characters, no '/' or spaces)",
                    quote(name)
                ),
            );
            None
        } else {
            Some(name.to_string())
        }
    });
    if xdp_interface.is_some() && backend != Backend::Xdp {
        c.error(
            "dataplane.xdp_interface",
            format!(
                "is only used with backend = \"xdp\" (this config says {})",
                quote(backend.name())
            ),
        );
    }
    if t.contains_key("xdp_checksum_offload") && backend != Backend::Xdp {
        c.error(
            "dataplane.xdp_checksum_offload",
            format!(
                "is only used with backend = \"xdp\" (this config says {})",
                quote(backend.name())
            ),
        );
    }
    let clamp_mss = match t.get("clamp_mss") {
        None | Some(Value::Boolean(false)) => ClampMss::Off,
        Some(Value::String(s)) if s == "auto" => ClampMss::Auto,
        Some(Value::Integer(n)) if (MIN_CLAMP_MSS..=65_495).contains(n) => {
            ClampMss::Mss(u16::try_from(*n).unwrap_or(u16::MAX))
        }
        Some(other) => {
            c.error(
                "dataplane.clamp_mss",
                format!(
                    "must be \"auto\" (from the tunnel MTU), an MSS of {MIN_CLAMP_MSS}-65495 or false, not {}",
                    describe(other)
                ),
            );
            ClampMss::Off
        }
    };
    DataplaneConfig {
        backend,
        workers,
        cpus,
        udp_gso,
        udp_gro,
        tun_offload,
        busy_poll_us,
        aead,
        xdp_interface,
        xdp_checksum_offload,
        clamp_mss,
    }
}

/// A peer as far as it validated, kept even when incomplete so that duplicates can still be
/// found across peers.
struct PeerParts {
    public_key: Option<PublicKey>,
    preshared_key: Option<KeySource<PresharedKey>>,
    endpoint: Option<Endpoint>,
    /// With each prefix's index in the written list.
    allowed_ips: Vec<(usize, IpNet)>,
    persistent_keepalive: u16,
    parallel: Parallel,
    tls: Option<PeerTls>,
}

impl PeerParts {
    fn finish(self) -> Option<PeerConfig> {
        Some(PeerConfig {
            public_key: self.public_key?,
            preshared_key: self.preshared_key,
            endpoint: self.endpoint,
            allowed_ips: self.allowed_ips.into_iter().map(|(_, n)| n).collect(),
            persistent_keepalive: self.persistent_keepalive,
            parallel: self.parallel,
            tls: self.tls,
        })
    }
}

fn check_peer(c: &mut Checker, t: &Table, path: &str) -> PeerParts {
    c.unknown_fields(t, path, PEER_FIELDS);
    let public_key = match c.string(t, path, "public_key") {
        // A public key is not secret: showing it helps find the typo.
        Some(text) => match PublicKey::from_base64(text) {
            Ok(k) => Some(k),
            Err(e) => {
                c.error(format!("{path}.public_key"), format!("{} {e}", quote(text)));
                None
            }
        },
        None => {
            if !t.contains_key("public_key") {
                c.error(
                    format!("{path}.public_key"),
                    "missing (the peer's base64 key, as `wg pubkey` prints it)",
                );
            }
            None
        }
    };
    let preshared_key = c.key_source(t, path, "preshared_key", false, PresharedKey::from_base64);
    let endpoint = c
        .string(t, path, "endpoint")
        .and_then(|text| match text.parse::<Endpoint>() {
            Ok(e) => Some(e),
            Err(why) => {
                c.error(format!("{path}.endpoint"), why);
                None
            }
        });
    let mut allowed_ips = Vec::new();
    for (field, i, text) in c.string_list(t, path, "allowed_ips") {
        match parse_cidr(text) {
            Ok(net) => allowed_ips.push((i, net.trunc())),
            Err(why) => c.error(field, why),
        }
    }
    let persistent_keepalive = c
        .integer(t, path, "persistent_keepalive", 0, 65535)
        .and_then(|n| u16::try_from(n).ok())
        .unwrap_or(0);
    let parallel = match t.get("parallel") {
        None => Parallel::default(),
        Some(Value::String(s)) if s == "auto" => Parallel::Auto,
        Some(Value::Integer(_)) => c
            .integer(t, path, "parallel", 1, i64::from(MAX_PARALLEL))
            .and_then(|n| u8::try_from(n).ok())
            .map_or(Parallel::default(), Parallel::Count),
        Some(other) => {
            c.error(
                format!("{path}.parallel"),
                format!(
                    "must be a number of sub-tunnels (1-{MAX_PARALLEL}) or \"auto\", not {}",
                    describe(other)
                ),
            );
            Parallel::default()
        }
    };
    let tls = tls::check_peer_tls(c, t, path);
    PeerParts {
        parallel,
        public_key,
        preshared_key,
        endpoint,
        allowed_ips,
        persistent_keepalive,
        tls,
    }
}

/// Duplicate peers, our own key as a peer, and a prefix claimed by two peers (routing by
/// allowed IPs needs each prefix to have one owner).
fn check_across_peers(c: &mut Checker, peers: &[Option<PeerParts>], own_key: Option<PublicKey>) {
    let mut keys: HashMap<PublicKey, usize> = HashMap::new();
    let mut prefixes: HashMap<IpNet, usize> = HashMap::new();
    for (i, peer) in peers.iter().enumerate() {
        let Some(peer) = peer else { continue };
        if let Some(key) = peer.public_key {
            if Some(key) == own_key {
                c.error(
                    format!("peer[{i}].public_key"),
                    "is the interface's own public key (a gateway cannot be its own peer)",
                );
            }
            match keys.entry(key) {
                Entry::Occupied(first) => c.error(
                    format!("peer[{i}].public_key"),
                    format!("duplicate of peer[{}]", first.get()),
                ),
                Entry::Vacant(slot) => {
                    slot.insert(i);
                }
            }
        }
        for (j, net) in &peer.allowed_ips {
            match prefixes.entry(*net) {
                Entry::Occupied(owner) if *owner.get() != i => c.error(
                    format!("peer[{i}].allowed_ips[{j}]"),
                    format!("{net} is also claimed by peer[{}]", owner.get()),
                ),
                Entry::Occupied(_) => {}
                Entry::Vacant(slot) => {
                    slot.insert(i);
                }
            }
        }
    }
}

/// wg-quick's own keys, which act on the host (DNS, routing table, hooks) rather than on the
/// tunnel; see wg-quick(8).
const WG_QUICK_ONLY_KEYS: &[&str] = &[
    "dns",
    "table",
    "preup",
    "postup",
    "predown",
    "postdown",
    "saveconfig",
];
/// The keys wg(8) knows in each section (lower-case, as it matches them).
const WG_INTERFACE_KEYS: &[&str] = &["privatekey", "listenport", "fwmark", "address", "mtu"];
const WG_PEER_KEYS: &[&str] = &[
    "publickey",
    "presharedkey",
    "endpoint",
    "allowedips",
    "persistentkeepalive",
];

/// Turns a wg-quick `.conf` into a tunneld TOML config that [`parse`] accepts. Keys the format
/// does not carry (DNS, Table, PostUp, ...) become comments saying they were not imported.
/// Errors name the `.conf` line they come from.
pub fn import_wg_quick(text: &str, interface_name: &str) -> Result<String, ConfigErrors> {
    let mut errors = Vec::new();
    let mut interface = WgSection::default();
    let mut peers: Vec<WgSection> = Vec::new();
    #[derive(Clone, Copy, PartialEq)]
    enum In {
        Nothing,
        Interface,
        Peer,
    }
    let mut section = In::Nothing;
    let error = |errors: &mut Vec<ConfigError>, line: usize, message: String| {
        errors.push(ConfigError {
            field: format!("line {line}"),
            message,
        })
    };
    for (n, raw) in text.lines().enumerate() {
        let n = n + 1;
        // As in wg(8): everything from `#` on is a comment (base64 has no `#`).
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if line.starts_with('[') {
            match line.to_ascii_lowercase().as_str() {
                "[interface]" => {
                    section = In::Interface;
                    if interface.line == 0 {
                        interface.line = n;
                    }
                }
                "[peer]" => {
                    section = In::Peer;
                    peers.push(WgSection {
                        line: n,
                        ..WgSection::default()
                    });
                }
                _ => error(
                    &mut errors,
                    n,
                    format!(
                        "unknown section {} (expected [Interface] or [Peer])",
                        quote(line)
                    ),
                ),
            }
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            error(&mut errors, n, "expected `Key = Value`".into());
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        let target = match section {
            In::Interface => &mut interface,
            In::Peer => match peers.last_mut() {
                Some(peer) => peer,
                None => continue,
            },
            In::Nothing => {
                error(
                    &mut errors,
                    n,
                    format!("{} is outside an [Interface] or [Peer] section", quote(key)),
                );
                continue;
            }
        };
        let field = match (section, key.to_ascii_lowercase().as_str()) {
            (In::Interface, "privatekey") => Some(("private_key", "PrivateKey", Kind::Text)),
            (In::Interface, "listenport") => Some(("listen_port", "ListenPort", Kind::Number)),
            (In::Interface, "address") => Some(("address", "Address", Kind::List)),
            (In::Interface, "mtu") => Some(("mtu", "MTU", Kind::Number)),
            (In::Interface, "fwmark") => Some(("fwmark", "FwMark", Kind::Mark)),
            (In::Peer, "publickey") => Some(("public_key", "PublicKey", Kind::Text)),
            (In::Peer, "presharedkey") => Some(("preshared_key", "PresharedKey", Kind::Text)),
            (In::Peer, "endpoint") => Some(("endpoint", "Endpoint", Kind::Text)),
            (In::Peer, "allowedips") => Some(("allowed_ips", "AllowedIPs", Kind::List)),
            (In::Peer, "persistentkeepalive") => {
                Some(("persistent_keepalive", "PersistentKeepalive", Kind::Off))
            }
            _ => None,
        };
        let Some((toml_key, wg_key, kind)) = field else {
            let lower = key.to_ascii_lowercase();
            let (header, other_header, other_keys) = if section == In::Interface {
                ("[Interface]", "[Peer]", WG_PEER_KEYS)
            } else {
                ("[Peer]", "[Interface]", WG_INTERFACE_KEYS)
            };
            // wg refuses these too; and a key copied into a comment could be a secret.
            if other_keys.contains(&lower.as_str()) {
                let message = format!("{} belongs in {other_header}, not {header}", quote(key));
                error(&mut errors, n, message);
                continue;
            }
            let why = if WG_QUICK_ONLY_KEYS.contains(&lower.as_str()) {
                "no tunneld equivalent"
            } else {
                "unknown key"
            };
            target.skipped.push(format!(
                "# not imported ({why}): {header} {}",
                comment_safe(raw.trim())
            ));
            continue;
        };
        match kind.read(value, n) {
            Ok(value) => target.set(toml_key, wg_key, value, n),
            Err(why) => error(&mut errors, n, format!("{wg_key}: {why}")),
        }
    }
    if !errors.is_empty() {
        return Err(ConfigErrors(errors));
    }

    let mut lines: HashMap<String, (usize, &'static str)> = HashMap::new();
    let mut out = String::from("# Imported from a wg-quick configuration by `tunneld import`.\n");
    out.push_str("[interface]\n");
    let _ = writeln!(out, "name = {}", Value::String(interface_name.into()));
    if interface.line != 0 {
        lines.insert("interface".into(), (interface.line, "[Interface]"));
    }
    interface.write(&mut out, "interface", INTERFACE_FIELDS, &mut lines);
    for (i, peer) in peers.iter().enumerate() {
        out.push_str("\n[[peer]]\n");
        let path = format!("peer[{i}]");
        lines.insert(path.clone(), (peer.line, "[Peer]"));
        peer.write(&mut out, &path, PEER_FIELDS, &mut lines);
    }
    // The result must be a config tunneld accepts: say so now, against the .conf's lines,
    // rather than at `up`.
    match parse(&out) {
        Ok(_) => Ok(out),
        Err(ConfigErrors(errors)) => Err(ConfigErrors(
            errors
                .into_iter()
                .map(|e| ConfigError {
                    field: locate(&e.field, &lines),
                    message: e.message,
                })
                .collect(),
        )),
    }
}

/// Names a field of the generated TOML by the `.conf` line it came from.
fn locate(field: &str, lines: &HashMap<String, (usize, &'static str)>) -> String {
    if let Some((line, key)) = lines.get(field) {
        return format!("line {line} ({key})");
    }
    let mut prefix = field;
    while let Some(cut) = prefix.rfind(['.', '[']) {
        prefix = &prefix[..cut];
        if let Some((line, key)) = lines.get(prefix) {
            return format!("{field} ({key} at line {line})");
        }
    }
    field.to_string()
}

/// A TOML comment may not hold control characters.
fn comment_safe(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() && c != '\t' { '?' } else { c })
        .collect()
}

#[derive(Clone, Copy)]
enum Kind {
    Text,
    List,
    Number,
    /// A number, or `off` for 0.
    Off,
    /// A number (decimal or 0x hex), or `off` for 0.
    Mark,
}

enum WgValue {
    Text(String),
    Number(i64),
    /// Each item with its line.
    List(Vec<(String, usize)>),
}

impl Kind {
    fn read(self, value: &str, line: usize) -> Result<WgValue, String> {
        let number = |text: &str| {
            text.parse::<i64>()
                .map_err(|_| format!("{} is not a number", quote(text)))
        };
        match self {
            Kind::Text => Ok(WgValue::Text(value.to_string())),
            Kind::List => Ok(WgValue::List(
                value
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| (s.to_string(), line))
                    .collect(),
            )),
            Kind::Number => number(value).map(WgValue::Number),
            Kind::Off if value.eq_ignore_ascii_case("off") => Ok(WgValue::Number(0)),
            Kind::Off => number(value).map(WgValue::Number),
            Kind::Mark if value.eq_ignore_ascii_case("off") => Ok(WgValue::Number(0)),
            Kind::Mark => match value
                .strip_prefix("0x")
                .or_else(|| value.strip_prefix("0X"))
            {
                Some(hex) => i64::from_str_radix(hex, 16)
                    .map(WgValue::Number)
                    .map_err(|_| format!("{} is not a number", quote(value))),
                None => number(value).map(WgValue::Number),
            },
        }
    }
}

/// One `[Interface]` or `[Peer]` as read from a wg-quick file.
#[derive(Default)]
struct WgSection {
    /// The header's line (0: none seen).
    line: usize,
    /// (TOML key, wg-quick key, value, line); a repeated key replaces, a repeated list extends.
    values: Vec<(&'static str, &'static str, WgValue, usize)>,
    /// Comment lines for the keys not imported, written at the end of the section.
    skipped: Vec<String>,
}

impl WgSection {
    fn set(&mut self, toml_key: &'static str, wg_key: &'static str, value: WgValue, line: usize) {
        let existing = self.values.iter_mut().find(|(k, ..)| *k == toml_key);
        match (existing, value) {
            (Some((_, _, WgValue::List(items), _)), WgValue::List(more)) => items.extend(more),
            (Some(slot), value) => {
                slot.2 = value;
                slot.3 = line;
            }
            (None, value) => self.values.push((toml_key, wg_key, value, line)),
        }
    }

    fn write(
        &self,
        out: &mut String,
        path: &str,
        order: &[&str],
        lines: &mut HashMap<String, (usize, &'static str)>,
    ) {
        for key in order {
            let Some((toml_key, wg_key, value, line)) = self.values.iter().find(|(k, ..)| k == key)
            else {
                continue;
            };
            let field = format!("{path}.{toml_key}");
            match value {
                WgValue::Text(s) => {
                    let _ = writeln!(out, "{toml_key} = {}", Value::String(s.clone()));
                }
                WgValue::Number(n) => {
                    let _ = writeln!(out, "{toml_key} = {n}");
                }
                WgValue::List(items) => {
                    let list: Vec<Value> = items
                        .iter()
                        .map(|(s, _)| Value::String(s.clone()))
                        .collect();
                    let _ = writeln!(out, "{toml_key} = {}", Value::Array(list));
                    for (j, (_, line)) in items.iter().enumerate() {
                        lines.insert(format!("{field}[{j}]"), (*line, wg_key));
                    }
                }
            }
            lines.insert(field, (*line, wg_key));
        }
        for skipped in &self.skipped {
            let _ = writeln!(out, "{skipped}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_errors_say_what_is_wrong() {
        assert_eq!(
            parse_cidr("10.0.0.0/33").unwrap_err(),
            "`10.0.0.0/33` is not a CIDR (prefix length 33 > 32)"
        );
        assert_eq!(
            parse_cidr("fd00::/129").unwrap_err(),
            "`fd00::/129` is not a CIDR (prefix length 129 > 128)"
        );
        assert!(parse_cidr("10.0.0.0/x")
            .unwrap_err()
            .contains("is not a number"));
        assert!(parse_cidr("10.0.0/8")
            .unwrap_err()
            .contains("is not an IP address"));
        assert_eq!(parse_cidr("10.0.0.1").unwrap().to_string(), "10.0.0.1/32");
    }

    #[test]
    fn misspellings_get_a_suggestion() {
        assert_eq!(closest("alowed_ips", PEER_FIELDS), Some("allowed_ips"));
        assert_eq!(closest("PublicKey", PEER_FIELDS), Some("public_key"));
        assert_eq!(closest("colour", INTERFACE_FIELDS), None);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn quoting_keeps_errors_on_one_line() {
        assert_eq!(quote("a\nb"), "`a\\nb`");
        let long = quote(&"x".repeat(500));
        assert!(long.chars().count() < 70, "{long}");
    }

    #[test]
    fn line_and_column_never_panic() {
        assert_eq!(line_column("ab\ncd", 4), "line 2, column 2");
        assert_eq!(line_column("é\né", 3), "line 2, column 1");
        assert_eq!(line_column("ab", 99), "line 1, column 3");
        // Inside a multi-byte character: counted, not sliced.
        let _ = line_column("é", 1);
    }
}
