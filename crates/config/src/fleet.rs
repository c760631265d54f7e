//! The `[fleet]` section: this gateway's place in a fleet whose members find each other
//! through etcd. Only the model and its validation live here (`tunneld check` runs it without
//! contacting etcd); the client is the `tunneld-fleet` crate.

use super::{parse_cidr, quote, Checker};
use ipnet::IpNet;
use std::net::SocketAddr;
use std::path::PathBuf;
use toml::Value;

const FLEET_FIELDS: &[&str] = &[
    "etcd",
    "insecure",
    "ca_file",
    "cert_file",
    "key_file",
    "prefix",
    "site",
    "gateway",
    "advertise",
    "subnets",
    "lease_ttl",
    "persistent_keepalive",
    "lan_interface",
    "lan_addresses",
    "mode",
    "relay",
    "relay_tls",
    "relay_tls_name",
    "transport",
    "relay_ca_file",
];

/// The lease TTL when none is given, in seconds: a dead gateway's record goes this long
/// after its last keep-alive (etcd then deletes it), so failover takes about this long.
pub const DEFAULT_LEASE_TTL: u16 = 3;
/// etcd refuses shorter leases with its default timing (1.5 election timeouts, rounded up).
pub const MIN_LEASE_TTL: u16 = 2;
pub const MAX_LEASE_TTL: u16 = 300;
/// Keepalive of the peers the fleet adds, in seconds, when none is given: sites are often
/// behind NAT, and a keepalive also starts the handshake at once when a peer is added.
pub const DEFAULT_FLEET_KEEPALIVE: u16 = 25;
/// The longest site, gateway and prefix names: they are parts of etcd keys and log lines.
pub const MAX_NAME_LEN: usize = 63;

/// `[fleet]`: where the fleet's store is and what this gateway advertises in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetConfig {
    /// etcd client URLs (`https://192.0.2.11:2379`; `http://` only with `insecure`).
    pub etcd: Vec<String>,
    /// TLS to etcd: the CA its members' certificates lead to (`None` only with `insecure`).
    pub ca_file: Option<PathBuf>,
    /// This gateway's client certificate and key, for members that require one.
    pub client_cert: Option<super::CertKey>,
    /// `insecure = true`: plain HTTP to etcd (anyone on the path reads and writes the fleet).
    pub insecure: bool,
    /// The key prefix naming the fleet (`/tunneld/corp`): its gateways write and watch only
    /// under it.
    pub prefix: String,
    /// The site this gateway serves; gateways of one site elect one active among them.
    pub site: String,
    /// This gateway's name within its site (default: the host name, read at start).
    pub gateway: Option<String>,
    /// Where the other sites reach this gateway (`192.0.2.1:51820`), first one first.
    pub advertise: Vec<SocketAddr>,
    /// The site's subnets: the other sites route them to the site's active gateway.
    pub subnets: Vec<IpNet>,
    pub lease_ttl: u16,
    /// Keepalive of the peers the fleet adds (seconds; 0: off).
    pub persistent_keepalive: u16,
    /// The site's LAN side: addresses this gateway holds only while it is the active one.
    pub lan: Option<LanSide>,
    /// How the site's gateways share its traffic (`mode`).
    pub mode: SiteMode,
    /// `relay = true`: this gateway, reachable at its advertised address, forwards the
    /// WireGuard datagrams of pairs of gateways that find no direct path (sites behind NATs
    /// that map each destination apart), without decrypting them.
    pub relay: bool,
    /// A relay's `[[tls.listen]]` (`forward_to = "wireguard"`) as sites that can send only
    /// TCP reach it (`relay_tls = "192.0.2.31:443"`), and the name its certificate carries
    /// (`relay_tls_name`; default: the address).
    pub relay_tls: Option<(SocketAddr, String)>,
    /// `transport = "tls"`: this gateway can send only TCP (a network that lets nothing out
    /// but TCP 443): every other site is reached through a relay's TLS listener, whose
    /// certificate leads to `relay_ca_file`.
    pub tls_only: Option<PathBuf>,
}

/// `mode`: how a site's gateways carry its traffic. It is the site's: every gateway writes
/// its own in its record, and the site runs as its elected gateway's record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SiteMode {
    /// `"active-standby"` (the default): the elected gateway carries everything; the others
    /// stand by, each ready to take over.
    #[default]
    ActiveStandby,
    /// `"active-active"`: every live gateway carries traffic; the other sites spread flows
    /// over them by a hash of the flow. The LAN addresses stay with the elected one.
    ActiveActive,
}

impl SiteMode {
    /// The name `mode` takes in the config and in a gateway's record.
    pub fn as_str(self) -> &'static str {
        match self {
            SiteMode::ActiveStandby => "active-standby",
            SiteMode::ActiveActive => "active-active",
        }
    }

    /// The mode a name says, if it names one.
    pub fn parse(text: &str) -> Option<SiteMode> {
        match text {
            "active-standby" => Some(SiteMode::ActiveStandby),
            "active-active" => Some(SiteMode::ActiveActive),
            _ => None,
        }
    }
}

impl std::fmt::Display for SiteMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `lan_interface` and `lan_addresses`: the site's virtual addresses on its LAN, which the
/// LAN's hosts route the other sites through and which move to whichever gateway is active.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LanSide {
    /// The interface on the site's LAN (its existence is the host's business at run time).
    pub interface: String,
    /// Each address with its prefix (`192.168.10.1/24`, `fd10::1/64`): host bits kept.
    pub addresses: Vec<IpNet>,
}

/// A site, gateway or prefix component: letters, digits, `-`, `_` and `.`, so that it is one
/// etcd key segment and prints as itself.
pub fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("is empty".into());
    }
    if name.len() > MAX_NAME_LEN {
        return Some(format!(
            "{} is longer than {MAX_NAME_LEN} bytes",
            quote(name)
        ));
    }
    if name == "." || name == ".." {
        return Some(format!("{} is not a name", quote(name)));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Some(format!(
            "{} may hold only letters, digits, `-`, `_` and `.`",
            quote(name)
        ));
    }
    None
}

pub(super) fn check_fleet(c: &mut Checker, value: &Value) -> Option<FleetConfig> {
    let path = "fleet";
    let Value::Table(t) = value else {
        c.error(
            path,
            format!("must be a table ([fleet]), not {}", value.type_str()),
        );
        return None;
    };
    c.unknown_fields(t, path, FLEET_FIELDS);
    let before = c.errors.len();
    let insecure = match t.get("insecure") {
        None => false,
        Some(Value::Boolean(b)) => *b,
        Some(other) => {
            c.error(
                "fleet.insecure",
                format!("must be true or false, not {}", other.type_str()),
            );
            false
        }
    };
    let etcd: Vec<String> = c
        .string_list(t, path, "etcd")
        .into_iter()
        .filter_map(|(field, _, url)| match etcd_url_problem(url, insecure) {
            None => Some(url.to_string()),
            Some(why) => {
                c.error(field, why);
                None
            }
        })
        .collect();
    if !t.contains_key("etcd") {
        c.error(
            path,
            "missing `etcd` (the etcd members' client URLs, e.g. [\"https://192.0.2.11:2379\"])",
        );
    } else if matches!(t.get("etcd"), Some(Value::Array(a)) if a.is_empty()) {
        c.error("fleet.etcd", "is empty (give at least one etcd client URL)");
    }
    let file = |c: &mut Checker, key: &str| -> Option<PathBuf> {
        match c.string(t, path, key) {
            Some("") => {
                c.error(format!("fleet.{key}"), "is empty (give a file path)");
                None
            }
            other => other.map(PathBuf::from),
        }
    };
    let ca_file = file(c, "ca_file");
    let cert_file = file(c, "cert_file");
    let key_file = file(c, "key_file");
    if ca_file.is_none() && !insecure && !t.contains_key("ca_file") {
        c.error(
            path,
            "missing `ca_file` (the CA of etcd's certificates; plain HTTP needs `insecure = true`)",
        );
    }
    let client_cert = match (cert_file, key_file) {
        (Some(cert_file), Some(key_file)) => Some(super::CertKey {
            cert_file,
            key_file,
        }),
        (Some(_), None) if !t.contains_key("key_file") => {
            c.error(path, "`cert_file` needs `key_file` (the certificate's key)");
            None
        }
        (None, Some(_)) if !t.contains_key("cert_file") => {
            c.error(path, "`key_file` needs `cert_file` (the key's certificate)");
            None
        }
        _ => None,
    };
    if insecure && (ca_file.is_some() || client_cert.is_some()) {
        c.error(
            "fleet.insecure",
            "plain HTTP uses no CA or certificate: drop `insecure` or the TLS files",
        );
    }
    let prefix = match c.string(t, path, "prefix") {
        None => {
            if !t.contains_key("prefix") {
                c.error(
                    path,
                    "missing `prefix` (the fleet's etcd key prefix, e.g. \"/tunneld/corp\")",
                );
            }
            None
        }
        Some(p) => match prefix_problem(p) {
            None => Some(p.trim_end_matches('/').to_string()),
            Some(why) => {
                c.error("fleet.prefix", why);
                None
            }
        },
    };
    let name = |c: &mut Checker, key: &str| -> Option<String> {
        let value = c.string(t, path, key)?;
        match name_problem(value) {
            None => Some(value.to_string()),
            Some(why) => {
                c.error(format!("fleet.{key}"), why);
                None
            }
        }
    };
    let site = name(c, "site");
    if !t.contains_key("site") {
        c.error(
            path,
            "missing `site` (the name of the site this gateway serves)",
        );
    }
    let gateway = name(c, "gateway");
    let advertise: Vec<SocketAddr> = c
        .string_list(t, path, "advertise")
        .into_iter()
        .filter_map(|(field, _, text)| match text.parse::<SocketAddr>() {
            Ok(addr) if addr.port() != 0 => Some(addr),
            Ok(_) => {
                c.error(field, format!("{} has port 0", quote(text)));
                None
            }
            Err(_) => {
                c.error(
                    field,
                    format!(
                        "{} is not an address:port (write 192.0.2.1:51820 or [2001:db8::1]:51820; names are not advertised)",
                        quote(text)
                    ),
                );
                None
            }
        })
        .collect();
    if !t.contains_key("advertise") {
        c.error(
            path,
            "missing `advertise` (where the other sites reach this gateway, e.g. [\"192.0.2.1:51820\"])",
        );
    } else if matches!(t.get("advertise"), Some(Value::Array(a)) if a.is_empty()) {
        c.error(
            "fleet.advertise",
            "is empty (give at least one address:port)",
        );
    }
    let mut subnets: Vec<IpNet> = Vec::new();
    for (field, _, text) in c.string_list(t, path, "subnets") {
        match parse_cidr(text) {
            Ok(net) => {
                let net = net.trunc();
                if let Some(other) = subnets
                    .iter()
                    .find(|n| n.contains(&net) || net.contains(*n))
                {
                    c.error(field, format!("{net} overlaps {other}, listed before it"));
                } else {
                    subnets.push(net);
                }
            }
            Err(why) => c.error(field, why),
        }
    }
    if !t.contains_key("subnets") {
        c.error(
            path,
            "missing `subnets` (the networks this site serves, e.g. [\"10.1.0.0/24\"])",
        );
    } else if matches!(t.get("subnets"), Some(Value::Array(a)) if a.is_empty()) {
        // The other sites would add this gateway with nothing routed to it.
        c.error(
            "fleet.subnets",
            "is empty (give the networks this site serves, e.g. [\"10.1.0.0/24\"])",
        );
    }
    let lease_ttl = c
        .integer(
            t,
            path,
            "lease_ttl",
            i64::from(MIN_LEASE_TTL),
            i64::from(MAX_LEASE_TTL),
        )
        .map_or(DEFAULT_LEASE_TTL, |n| n as u16);
    let persistent_keepalive = c
        .integer(t, path, "persistent_keepalive", 0, i64::from(u16::MAX))
        .map_or(DEFAULT_FLEET_KEEPALIVE, |n| n as u16);
    let lan = check_lan_side(c, t);
    let mode = match c.string(t, path, "mode") {
        Some(text) => SiteMode::parse(text).unwrap_or_else(|| {
            c.error(
                "fleet.mode",
                format!(
                    "{} is not a mode (write \"active-standby\" or \"active-active\")",
                    quote(text)
                ),
            );
            SiteMode::default()
        }),
        None => SiteMode::default(),
    };
    let relay_tls_name = c.string(t, path, "relay_tls_name").map(str::to_string);
    let relay_tls = match c.string(t, path, "relay_tls") {
        None => None,
        Some(text) => match text.parse::<SocketAddr>() {
            Ok(addr) if addr.port() != 0 => Some((
                addr,
                relay_tls_name.unwrap_or_else(|| addr.ip().to_string()),
            )),
            _ => {
                c.error(
                    "fleet.relay_tls",
                    format!(
                        "{} is not an address:port (its [[tls.listen]], e.g. 192.0.2.31:443)",
                        quote(text)
                    ),
                );
                None
            }
        },
    };
    let relay_ca_file = file(c, "relay_ca_file");
    let tls_only = match c.string(t, path, "transport") {
        None | Some("udp") => None,
        Some("tls") => {
            if relay_ca_file.is_none() && !t.contains_key("relay_ca_file") {
                c.error(
                    "fleet.transport",
                    "\"tls\" needs `relay_ca_file` (the CA of the relays' TLS certificates)",
                );
            }
            relay_ca_file.clone()
        }
        Some(other) => {
            c.error(
                "fleet.transport",
                format!(
                    "{} is not a transport (write \"udp\" or \"tls\")",
                    quote(other)
                ),
            );
            None
        }
    };
    let relay = match t.get("relay") {
        None => false,
        Some(Value::Boolean(b)) => *b,
        Some(other) => {
            c.error(
                "fleet.relay",
                format!("must be true or false, not {}", other.type_str()),
            );
            false
        }
    };
    if relay_tls.is_some() && !relay {
        c.error(
            "fleet.relay_tls",
            "needs `relay = true` (it is a relay's TLS listener)",
        );
    }
    if c.errors.len() > before {
        return None;
    }
    Some(FleetConfig {
        etcd,
        ca_file,
        client_cert,
        insecure,
        prefix: prefix?,
        site: site?,
        gateway,
        advertise,
        subnets,
        lease_ttl,
        persistent_keepalive,
        lan,
        mode,
        relay,
        relay_tls,
        tls_only,
    })
}

/// `lan_interface` with `lan_addresses`, both or neither.
fn check_lan_side(c: &mut Checker, t: &toml::Table) -> Option<LanSide> {
    let path = "fleet";
    let interface = match c.string(t, path, "lan_interface") {
        Some(name) => match super::interface_name_problem(name) {
            None => Some(name.to_string()),
            Some(why) => {
                c.error("fleet.lan_interface", why);
                None
            }
        },
        None => None,
    };
    let mut addresses: Vec<IpNet> = Vec::new();
    for (field, _, text) in c.string_list(t, path, "lan_addresses") {
        match lan_address(text) {
            Ok(net) => {
                if addresses.iter().any(|a| a.addr() == net.addr()) {
                    c.error(field, format!("{} is listed twice", net.addr()));
                } else {
                    addresses.push(net);
                }
            }
            Err(why) => c.error(field, why),
        }
    }
    match (t.contains_key("lan_interface"), t.contains_key("lan_addresses")) {
        (false, false) => return None,
        (true, false) => c.error(
            path,
            "`lan_interface` needs `lan_addresses` (the site's virtual addresses on it, e.g. [\"192.168.10.1/24\"])",
        ),
        (false, true) => c.error(
            path,
            "`lan_addresses` needs `lan_interface` (the interface on the site's LAN, e.g. \"eth1\")",
        ),
        (true, true) => {
            if matches!(t.get("lan_addresses"), Some(Value::Array(a)) if a.is_empty()) {
                c.error(
                    "fleet.lan_addresses",
                    "is empty (give the site's virtual addresses, e.g. [\"192.168.10.1/24\"])",
                );
            }
        }
    }
    Some(LanSide {
        interface: interface?,
        addresses,
    })
}

/// One LAN address: an address with its prefix, usable as a host's own unicast address.
fn lan_address(text: &str) -> Result<IpNet, String> {
    let shown = quote(text);
    if !text.contains('/') {
        return Err(format!(
            "{shown} has no prefix (write the address with its LAN's prefix, e.g. 192.168.10.1/24)"
        ));
    }
    let net = parse_cidr(text)?;
    let ip = net.addr();
    if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() {
        return Err(format!("{shown} is not a unicast address a host can hold"));
    }
    let max = if ip.is_ipv4() { 32 } else { 128 };
    // On a /31, /32, /127 or /128 every address is a host's; below, the network's own
    // address (and IPv4's broadcast) is not.
    if net.prefix_len() + 1 < max {
        if ip == net.network() {
            return Err(format!(
                "{shown} is the network's own address, not a host's (e.g. {}/{})",
                first_host(&net),
                net.prefix_len()
            ));
        }
        if ip.is_ipv4() && ip == net.broadcast() {
            return Err(format!("{shown} is the network's broadcast address"));
        }
    }
    Ok(net)
}

/// The address after the network's own, the first a host may hold.
fn first_host(net: &IpNet) -> std::net::IpAddr {
    match net {
        IpNet::V4(n) => std::net::Ipv4Addr::from(u32::from(n.network()).wrapping_add(1)).into(),
        IpNet::V6(n) => std::net::Ipv6Addr::from(u128::from(n.network()).wrapping_add(1)).into(),
    }
}

/// `https://host:port` (or `http://` with `insecure`): the forms etcd's members announce.
fn etcd_url_problem(url: &str, insecure: bool) -> Option<String> {
    let shown = quote(url);
    let rest = if let Some(rest) = url.strip_prefix("https://") {
        if insecure {
            return Some(format!(
                "{shown} is https but `insecure = true` asks for plain HTTP"
            ));
        }
        rest
    } else if let Some(rest) = url.strip_prefix("http://") {
        if !insecure {
            return Some(format!(
                "{shown} is plain HTTP: use https:// with `ca_file`, or set `insecure = true`"
            ));
        }
        rest
    } else {
        return Some(format!(
            "{shown} is not an etcd URL (write https://host:port)"
        ));
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let Some((host, port)) = rest.rsplit_once(':') else {
        return Some(format!("{shown} has no port (etcd's is usually 2379)"));
    };
    if host.is_empty() || rest.contains('/') || rest.contains('@') {
        return Some(format!("{shown} is not host:port after the scheme"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => None,
        _ => Some(format!("{shown} has no valid port")),
    }
}

fn prefix_problem(prefix: &str) -> Option<String> {
    let Some(rest) = prefix.strip_prefix('/') else {
        return Some(format!(
            "{} must start with `/` (e.g. \"/tunneld/corp\")",
            quote(prefix)
        ));
    };
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() {
        return Some("must name the fleet below `/` (e.g. \"/tunneld/corp\")".into());
    }
    rest.split('/')
        .find_map(|part| name_problem(part).map(|why| format!("component {why}")))
}
