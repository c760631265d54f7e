//! The TOML config model and its validation.
//!
//! Parsing walks the TOML tree by hand rather than through serde derive, so that every
//! problem becomes its own clear line naming the field (`peer[1].allowed_ips[0]: ...`), and all
//! of them are reported at once. Secret values are never echoed in errors.

use ipnet::IpNet;
use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use toml::{Table, Value};
use tunneld_crypto::{PresharedKey, PrivateKey, PublicKey};

pub const DEFAULT_MTU: u16 = 1420;
const MIN_MTU: i64 = 576;
const MIN_MTU_IPV6: i64 = 1280;
const MAX_MTU: i64 = 65535;

#[derive(Debug, Clone)]
pub struct Config {
    pub interface: InterfaceConfig,
    pub dataplane: DataplaneConfig,
    pub peers: Vec<PeerConfig>,
}

#[derive(Debug, Clone)]
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
}

impl Default for DataplaneConfig {
    fn default() -> Self {
        Self {
            backend: Backend::Auto,
            workers: Workers::Auto,
            cpus: None,
            udp_gso: true,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Backend {
    #[default]
    Auto,
    Xdp,
    Uring,
    Mmsg,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Workers {
    #[default]
    Auto,
    Count(usize),
}

#[derive(Debug, Clone)]
pub struct PeerConfig {
    pub public_key: PublicKey,
    pub preshared_key: Option<KeySource<PresharedKey>>,
    pub endpoint: Option<Endpoint>,
    /// Truncated to their networks.
    pub allowed_ips: Vec<IpNet>,
    /// Seconds, 0 = off.
    pub persistent_keepalive: u16,
}

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
    fn from_str(text: &str) -> Result<Self, String> {
        if let Ok(addr) = text.parse::<SocketAddr>() {
            if addr.port() == 0 {
                return Err(format!("`{text}` has port 0"));
            }
            return Ok(Endpoint::Addr(addr));
        }
        if text.starts_with('[') {
            return Err(format!("`{text}` is not [IPv6]:port"));
        }
        let Some((host, port)) = text.rsplit_once(':') else {
            return Err(format!("`{text}` has no port (write host:port)"));
        };
        if host.contains(':') {
            return Err(format!("`{text}`: write IPv6 endpoints as [address]:port"));
        }
        let port: u16 = port
            .parse()
            .map_err(|_| format!("`{text}`: port `{port}` is not 1-65535"))?;
        if port == 0 {
            return Err(format!("`{text}` has port 0"));
        }
        let valid_host = !host.is_empty()
            && host.len() <= 253
            && host
                .split('.')
                .all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        if !valid_host {
            return Err(format!(
                "`{text}`: `{host}` is not an IP address or host name"
            ));
        }
        Ok(Endpoint::Host {
            host: host.to_string(),
            port,
        })
    }
}

/// One problem, naming the field it is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub message: String,
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

/// Collects errors while walking the tree.
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

    /// Reports keys of `table` not in `known`.
    fn unknown_keys(&mut self, table: &Table, path: &str, known: &[&str]) {
        for key in table.keys() {
            if !known.contains(&key.as_str()) {
                self.error(
                    path,
                    format!(
                        "unknown field `{key}` (expected one of: {})",
                        known.join(", ")
                    ),
                );
            }
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
                    format!("must be an integer, not {}", other.type_str()),
                );
                None
            }
        }
    }

    fn string_list<'a>(
        &mut self,
        table: &'a Table,
        path: &str,
        key: &str,
    ) -> Vec<(String, &'a str)> {
        match table.get(key) {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .filter_map(|(i, v)| match v {
                    Value::String(s) => Some((format!("{path}.{key}[{i}]"), s.as_str())),
                    other => {
                        self.error(
                            format!("{path}.{key}[{i}]"),
                            format!("must be a string, not {}", other.type_str()),
                        );
                        None
                    }
                })
                .collect(),
            Some(other) => {
                self.error(
                    format!("{path}.{key}"),
                    format!("must be a list of strings, not {}", other.type_str()),
                );
                Vec::new()
            }
        }
    }

    fn cidr(&mut self, field: &str, text: &str) -> Option<IpNet> {
        if let Ok(net) = text.parse::<IpNet>() {
            return Some(net);
        }
        // A bare address means a single host, as wg accepts.
        if let Ok(addr) = text.parse::<IpAddr>() {
            return Some(IpNet::from(addr));
        }
        let why = match text.split_once('/') {
            Some((addr, len)) if addr.parse::<IpAddr>().is_ok() => {
                let max = if addr.contains(':') { 128 } else { 32 };
                format!("`{text}` is not a CIDR (prefix length `{len}` is not 0-{max})")
            }
            Some((addr, _)) => format!("`{text}` is not a CIDR (`{addr}` is not an IP address)"),
            None => format!("`{text}` is not a CIDR (write address/prefix, e.g. 10.0.0.0/24)"),
        };
        self.error(field, why);
        None
    }

    /// `key` or `key_file`: exactly one (or neither, when optional).
    fn key_source<K>(
        &mut self,
        table: &Table,
        path: &str,
        key: &str,
        required: bool,
        parse: impl Fn(&str) -> Result<K, tunneld_crypto::KeyError>,
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
                // Never echo the value: it is a secret.
                Ok(k) => Some(KeySource::Inline(k)),
                Err(e) => {
                    self.error(format!("{path}.{key}"), format!("the key {e}"));
                    None
                }
            },
            (None, Some("")) => {
                self.error(format!("{path}.{file_key}"), "is empty");
                None
            }
            (None, Some(file)) => Some(KeySource::File(PathBuf::from(file))),
            (None, None) => {
                if required && !table.contains_key(key) && !table.contains_key(&file_key) {
                    self.error(path, format!("missing `{key}` or `{file_key}`"));
                }
                None
            }
        }
    }
}

/// Parses and validates a config file's text. On failure, returns every problem found.
pub fn parse(text: &str) -> Result<Config, ConfigErrors> {
    let root: Table = toml::from_str(text).map_err(|e| {
        let message = e.message().trim().to_string();
        let location = e
            .span()
            .map(|span| {
                let before = &text[..span.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                format!("line {line}, column {column}")
            })
            .unwrap_or_else(|| "TOML".into());
        ConfigErrors(vec![ConfigError {
            field: location,
            message,
        }])
    })?;
    let mut c = Checker { errors: Vec::new() };
    c.unknown_keys(&root, "config", &["interface", "dataplane", "peer"]);

    let interface = match root.get("interface") {
        Some(Value::Table(t)) => check_interface(&mut c, t),
        Some(_) => {
            c.error("interface", "must be a table ([interface])");
            None
        }
        None => {
            c.error("interface", "missing [interface] section");
            None
        }
    };
    let dataplane = match root.get("dataplane") {
        Some(Value::Table(t)) => check_dataplane(&mut c, t),
        Some(_) => {
            c.error("dataplane", "must be a table ([dataplane])");
            DataplaneConfig::default()
        }
        None => DataplaneConfig::default(),
    };
    let peers = match root.get("peer") {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .filter_map(|(i, v)| match v {
                Value::Table(t) => check_peer(&mut c, t, &format!("peer[{i}]")),
                _ => {
                    c.error(format!("peer[{i}]"), "must be a table ([[peer]])");
                    None
                }
            })
            .collect(),
        Some(_) => {
            c.error("peer", "must be a list of tables ([[peer]] sections)");
            Vec::new()
        }
    };
    check_across_peers(&mut c, root.get("peer"), &peers);
    if let Some(interface) = &interface {
        if let KeySource::Inline(key) = &interface.private_key {
            let own = key.public_key();
            for (i, p) in peers.iter().enumerate() {
                if p.public_key == own {
                    c.error(
                        format!("peer[{i}].public_key"),
                        "is the interface's own public key",
                    );
                }
            }
        }
    }

    match interface {
        Some(interface) if c.errors.is_empty() => Ok(Config {
            interface,
            dataplane,
            peers,
        }),
        _ => Err(ConfigErrors(c.errors)),
    }
}

fn check_interface(c: &mut Checker, t: &Table) -> Option<InterfaceConfig> {
    let path = "interface";
    c.unknown_keys(
        t,
        path,
        &[
            "name",
            "private_key",
            "private_key_file",
            "listen_port",
            "address",
            "mtu",
            "fwmark",
        ],
    );
    let name = match c.string(t, path, "name") {
        Some(name) => check_interface_name(c, name).then(|| name.to_string()),
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
    let listen_port = c.integer(t, path, "listen_port", 0, 65535).unwrap_or(0) as u16;
    let addresses: Vec<IpNet> = c
        .string_list(t, path, "address")
        .into_iter()
        .filter_map(|(field, text)| c.cidr(&field, text))
        .collect();
    let mtu = match c.integer(t, path, "mtu", MIN_MTU, MAX_MTU) {
        Some(mtu) => {
            if mtu < MIN_MTU_IPV6 && addresses.iter().any(|a| matches!(a, IpNet::V6(_))) {
                c.error(
                    "interface.mtu",
                    format!("{mtu} is below {MIN_MTU_IPV6}, the minimum for IPv6, and an IPv6 address is configured"),
                );
            }
            mtu as u16
        }
        None => DEFAULT_MTU,
    };
    let fwmark = c
        .integer(t, path, "fwmark", 0, u32::MAX.into())
        .unwrap_or(0) as u32;
    Some(InterfaceConfig {
        name: name?,
        private_key: private_key?,
        listen_port,
        addresses,
        mtu,
        fwmark,
    })
}

fn check_interface_name(c: &mut Checker, name: &str) -> bool {
    let why = if name.is_empty() {
        Some("is empty".to_string())
    } else if name.len() > 15 {
        Some(format!("`{name}` is longer than 15 bytes"))
    } else if name == "." || name == ".." {
        Some(format!("`{name}` is not a valid interface name"))
    } else {
        name.chars()
            .find(|ch| *ch == '/' || *ch == ':' || ch.is_whitespace() || ch.is_control())
            .map(|bad| {
                format!(
                    "`{}` contains {bad:?}, which interface names cannot",
                    name.escape_debug()
                )
            })
    };
    match why {
        Some(why) => {
            c.error("interface.name", why);
            false
        }
        None => true,
    }
}

fn check_dataplane(c: &mut Checker, t: &Table) -> DataplaneConfig {
    let path = "dataplane";
    c.unknown_keys(t, path, &["backend", "workers", "cpus", "udp_gso"]);
    let udp_gso = match t.get("udp_gso") {
        None => true,
        Some(Value::Boolean(b)) => *b,
        Some(other) => {
            c.error(
                "dataplane.udp_gso",
                format!("must be true or false, not {}", describe(other)),
            );
            true
        }
    };
    let backend = match c.string(t, path, "backend") {
        None => Backend::Auto,
        Some("auto") => Backend::Auto,
        Some("xdp") => Backend::Xdp,
        Some("uring") => Backend::Uring,
        Some("mmsg") => Backend::Mmsg,
        Some(other) => {
            c.error(
                "dataplane.backend",
                format!("`{other}` is not a backend (expected one of: auto, xdp, uring, mmsg)"),
            );
            Backend::Auto
        }
    };
    let workers = match t.get("workers") {
        None => Workers::Auto,
        Some(Value::String(s)) if s == "auto" => Workers::Auto,
        Some(Value::Integer(n)) if *n >= 1 && *n <= 4096 => Workers::Count(*n as usize),
        Some(Value::Integer(n)) => {
            c.error("dataplane.workers", format!("{n} is out of range 1-4096"));
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
        Some(Value::Array(items)) => {
            let mut cpus = Vec::new();
            for (i, v) in items.iter().enumerate() {
                match v {
                    Value::Integer(n) if *n >= 0 && *n < 65536 => cpus.push(*n as usize),
                    other => c.error(
                        format!("dataplane.cpus[{i}]"),
                        format!("must be a CPU number (0-65535), not {}", describe(other)),
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
    DataplaneConfig {
        backend,
        workers,
        cpus,
        udp_gso,
    }
}

fn describe(v: &Value) -> String {
    match v {
        Value::String(s) => format!("\"{s}\""),
        Value::Integer(n) => n.to_string(),
        other => other.type_str().to_string(),
    }
}

fn check_peer(c: &mut Checker, t: &Table, path: &str) -> Option<PeerConfig> {
    c.unknown_keys(
        t,
        path,
        &[
            "public_key",
            "preshared_key",
            "preshared_key_file",
            "endpoint",
            "allowed_ips",
            "persistent_keepalive",
        ],
    );
    let public_key = match c.string(t, path, "public_key") {
        Some(text) => match PublicKey::from_base64(text) {
            Ok(k) => Some(k),
            Err(e) => {
                c.error(format!("{path}.public_key"), format!("`{text}` {e}"));
                None
            }
        },
        None => {
            if !t.contains_key("public_key") {
                c.error(format!("{path}.public_key"), "missing");
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
    let allowed_ips: Vec<IpNet> = c
        .string_list(t, path, "allowed_ips")
        .into_iter()
        .filter_map(|(field, text)| c.cidr(&field, text).map(|n| n.trunc()))
        .collect();
    let persistent_keepalive = c
        .integer(t, path, "persistent_keepalive", 0, 65535)
        .unwrap_or(0) as u16;
    Some(PeerConfig {
        public_key: public_key?,
        preshared_key,
        endpoint,
        allowed_ips,
        persistent_keepalive,
    })
}

/// Duplicate peers and prefixes claimed twice. `peers` holds only the peers that parsed, so
/// indices come from the raw list to name the right `peer[i]`.
fn check_across_peers(c: &mut Checker, raw: Option<&Value>, _peers: &[PeerConfig]) {
    let Some(Value::Array(items)) = raw else {
        return;
    };
    let mut keys: HashMap<PublicKey, usize> = HashMap::new();
    let mut prefixes: HashMap<IpNet, usize> = HashMap::new();
    for (i, item) in items.iter().enumerate() {
        let Value::Table(t) = item else { continue };
        if let Some(key) = t
            .get("public_key")
            .and_then(Value::as_str)
            .and_then(|s| PublicKey::from_base64(s).ok())
        {
            if let Some(first) = keys.insert(key, i) {
                keys.insert(key, first);
                c.error(
                    format!("{}.public_key", peer_path(i)),
                    format!("duplicate of peer[{first}]"),
                );
            }
        }
        if let Some(Value::Array(nets)) = t.get("allowed_ips") {
            for (j, v) in nets.iter().enumerate() {
                let Some(net) = v.as_str().and_then(|s| s.parse::<IpNet>().ok()) else {
                    continue;
                };
                let net = net.trunc();
                match prefixes.get(&net) {
                    Some(&other) if other != i => c.error(
                        format!("{}.allowed_ips[{j}]", peer_path(i)),
                        format!("{net} is also claimed by peer[{other}]"),
                    ),
                    Some(_) => {}
                    None => {
                        prefixes.insert(net, i);
                    }
                }
            }
        }
    }
}

fn peer_path(i: usize) -> String {
    format!("peer[{i}]")
}

/// Turns a wg-quick `.conf` into a tunneld TOML config. Keys the format does not carry
/// (DNS, Table, PostUp, ...) become comments saying they were not imported.
pub fn import_wg_quick(text: &str, interface_name: &str) -> Result<String, ConfigErrors> {
    let mut errors = Vec::new();
    let mut interface = Table::new();
    interface.insert("name".into(), Value::String(interface_name.into()));
    let mut peers: Vec<Table> = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    #[derive(PartialEq)]
    enum Section {
        None,
        Interface,
        Peer,
    }
    let mut section = Section::None;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let here = format!("line {}", n + 1);
        if line.starts_with('[') {
            match line.to_ascii_lowercase().as_str() {
                "[interface]" => section = Section::Interface,
                "[peer]" => {
                    section = Section::Peer;
                    peers.push(Table::new());
                }
                other => errors.push(ConfigError {
                    field: here,
                    message: format!("unknown section `{other}`"),
                }),
            }
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            errors.push(ConfigError {
                field: here,
                message: "expected `Key = Value`".into(),
            });
            continue;
        };
        let (key, value) = (key.trim().to_ascii_lowercase(), value.trim());
        let list = || {
            Value::Array(
                value
                    .split(',')
                    .map(|s| s.trim())
                    .filter(|s| !s.is_empty())
                    .map(|s| Value::String(s.into()))
                    .collect(),
            )
        };
        let number = |errors: &mut Vec<ConfigError>| match value.parse::<i64>() {
            Ok(n) => Some(Value::Integer(n)),
            Err(_) => {
                errors.push(ConfigError {
                    field: here.clone(),
                    message: format!("`{key}` must be a number"),
                });
                None
            }
        };
        match (&section, key.as_str()) {
            (Section::Interface, "privatekey") => {
                interface.insert("private_key".into(), Value::String(value.into()));
            }
            (Section::Interface, "listenport") => {
                if let Some(v) = number(&mut errors) {
                    interface.insert("listen_port".into(), v);
                }
            }
            (Section::Interface, "address") => {
                let mut all = match interface.remove("address") {
                    Some(Value::Array(a)) => a,
                    _ => Vec::new(),
                };
                if let Value::Array(more) = list() {
                    all.extend(more);
                }
                interface.insert("address".into(), Value::Array(all));
            }
            (Section::Interface, "mtu") => {
                if let Some(v) = number(&mut errors) {
                    interface.insert("mtu".into(), v);
                }
            }
            (Section::Interface, "fwmark") => {
                let mark = if let Some(hex) = value.strip_prefix("0x") {
                    i64::from_str_radix(hex, 16).ok()
                } else if value == "off" {
                    Some(0)
                } else {
                    value.parse().ok()
                };
                match mark {
                    Some(m) => {
                        interface.insert("fwmark".into(), Value::Integer(m));
                    }
                    None => errors.push(ConfigError {
                        field: here,
                        message: "`FwMark` must be a number".into(),
                    }),
                }
            }
            (Section::Peer, k) => {
                let Some(peer) = peers.last_mut() else {
                    continue;
                };
                match k {
                    "publickey" => {
                        peer.insert("public_key".into(), Value::String(value.into()));
                    }
                    "presharedkey" => {
                        peer.insert("preshared_key".into(), Value::String(value.into()));
                    }
                    "endpoint" => {
                        peer.insert("endpoint".into(), Value::String(value.into()));
                    }
                    "allowedips" => {
                        let mut all = match peer.remove("allowed_ips") {
                            Some(Value::Array(a)) => a,
                            _ => Vec::new(),
                        };
                        if let Value::Array(more) = list() {
                            all.extend(more);
                        }
                        peer.insert("allowed_ips".into(), Value::Array(all));
                    }
                    "persistentkeepalive" => {
                        let v = if value == "off" {
                            Some(Value::Integer(0))
                        } else {
                            number(&mut errors)
                        };
                        if let Some(v) = v {
                            peer.insert("persistent_keepalive".into(), v);
                        }
                    }
                    _ => skipped.push(format!("[Peer] {}", raw.trim())),
                }
            }
            (Section::Interface, _) => skipped.push(format!("[Interface] {}", raw.trim())),
            (Section::None, _) => errors.push(ConfigError {
                field: here,
                message: "key outside of [Interface] or [Peer]".into(),
            }),
        }
    }
    if !errors.is_empty() {
        return Err(ConfigErrors(errors));
    }
    let mut root = Table::new();
    root.insert("interface".into(), Value::Table(interface));
    if !peers.is_empty() {
        root.insert(
            "peer".into(),
            Value::Array(peers.into_iter().map(Value::Table).collect()),
        );
    }
    let body = toml::to_string(&root).map_err(|e| {
        ConfigErrors(vec![ConfigError {
            field: String::new(),
            message: format!("cannot write TOML: {e}"),
        }])
    })?;
    // The result must be a config tunneld accepts; say so now rather than at `up`.
    parse(&body)?;
    let mut out = String::from("# Imported from a wg-quick configuration by `tunneld import`.\n");
    for line in skipped {
        out.push_str(&format!("# not imported (no tunneld equivalent): {line}\n"));
    }
    out.push_str(&body);
    Ok(out)
}
