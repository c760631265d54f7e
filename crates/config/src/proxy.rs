//! The `[proxy]` section: `tunneld proxy` runs the interface in user space (no TUN, no root)
//! and serves SOCKS5, an HTTP proxy and port forwards into and out of the tunnel. Only the
//! model and its validation live here, with the rules a proxy config follows (no
//! `[dataplane]`, `[[tls.*]]` or `[fleet]`, no fwmark, plain peers): `check` and `proxy` both
//! apply them through [`parse`](crate::parse).

use super::{quote, Checker, Endpoint};
use ipnet::IpNet;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use toml::{Table, Value};

const PROXY_FIELDS: &[&str] = &[
    "socks5",
    "http",
    "dns",
    "resolve",
    "users_file",
    "forward",
    "reverse",
];
const FORWARD_FIELDS: &[&str] = &["protocol", "listen", "to"];

/// `[proxy]`: what `tunneld proxy` serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyConfig {
    /// SOCKS5 (RFC 1928): CONNECT and UDP ASSOCIATE.
    pub socks5: Option<SocketAddr>,
    /// The HTTP proxy: CONNECT and absolute-URI requests.
    pub http: Option<SocketAddr>,
    /// DNS servers inside the tunnel.
    pub dns: Vec<IpAddr>,
    /// Who resolves the names clients give.
    pub resolve: ResolveWith,
    /// `user:password` lines; when set, clients must authenticate.
    pub users_file: Option<PathBuf>,
    /// `[[proxy.forward]]`: a local port to an address in the tunnel.
    pub forwards: Vec<Forward>,
    /// `[[proxy.reverse]]`: a port inside the tunnel to a local address.
    pub reverses: Vec<Reverse>,
}

/// Who resolves the host names clients ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResolveWith {
    /// The `dns` servers, asked through the tunnel.
    Tunnel,
    /// The host's resolver.
    Local,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

/// A local listener whose connections (or datagrams) go to `to` through the tunnel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    pub protocol: Protocol,
    pub listen: SocketAddr,
    /// An address, or `name:port` resolved as [`ProxyConfig::resolve`] says.
    pub to: Endpoint,
}

/// A listener inside the tunnel (on one of the interface's addresses) whose connections
/// (or datagrams) go to the local address `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reverse {
    pub protocol: Protocol,
    pub listen: SocketAddr,
    pub to: SocketAddr,
}

/// The `[proxy]` section itself. `addresses` are the interface's (a reverse listens on one);
/// `None` when the interface has errors of its own.
pub(super) fn check_proxy(
    c: &mut Checker,
    value: &Value,
    addresses: Option<&[IpNet]>,
) -> Option<ProxyConfig> {
    let Value::Table(t) = value else {
        c.error(
            "proxy",
            format!("must be a table ([proxy]), not {}", value.type_str()),
        );
        return None;
    };
    let path = "proxy";
    c.unknown_fields(t, path, PROXY_FIELDS);
    let socks5 = optional_listen(c, t, path, "socks5");
    let http = optional_listen(c, t, path, "http");
    let mut dns = Vec::new();
    for (field, _, text) in c.string_list(t, path, "dns") {
        match text.parse::<IpAddr>() {
            Ok(ip) if !ip.is_unspecified() => dns.push(ip),
            _ => c.error(
                field,
                format!(
                    "{} is not the IP address of a DNS server (port 53 is used)",
                    quote(text)
                ),
            ),
        }
    }
    let resolve = match c.string(t, path, "resolve") {
        None if dns.is_empty() => ResolveWith::Local,
        None => ResolveWith::Tunnel,
        Some("tunnel") => {
            if dns.is_empty() && !t.contains_key("dns") {
                c.error(
                    "proxy.resolve",
                    "\"tunnel\" needs DNS servers inside the tunnel: set proxy.dns",
                );
            }
            ResolveWith::Tunnel
        }
        Some("local") => ResolveWith::Local,
        Some(other) => {
            c.error(
                "proxy.resolve",
                format!(
                    "{} is not a resolver (expected \"tunnel\" or \"local\")",
                    quote(other)
                ),
            );
            ResolveWith::Local
        }
    };
    let users_file = match c.string(t, path, "users_file") {
        Some("") => {
            c.error("proxy.users_file", "is empty (give a file path)");
            None
        }
        Some(file) => Some(PathBuf::from(file)),
        None => None,
    };
    let forwards: Vec<Forward> = tables(c, t, "forward")
        .into_iter()
        .filter_map(|(field, t)| check_forward(c, t, &field))
        .collect();
    let reverses: Vec<Reverse> = tables(c, t, "reverse")
        .into_iter()
        .filter_map(|(field, t)| check_reverse(c, t, &field, addresses))
        .collect();
    let nothing = ["socks5", "http", "forward", "reverse"]
        .iter()
        .all(|k| !t.contains_key(*k));
    if nothing {
        c.error(
            "proxy",
            "serves nothing: set socks5, http, or a [[proxy.forward]] or [[proxy.reverse]]",
        );
    }
    check_local_listeners(c, socks5, http, &forwards);
    Some(ProxyConfig {
        socks5,
        http,
        dns,
        resolve,
        users_file,
        forwards,
        reverses,
    })
}

/// Two local listeners on one address and protocol would fail at start: refused here.
fn check_local_listeners(
    c: &mut Checker,
    socks5: Option<SocketAddr>,
    http: Option<SocketAddr>,
    forwards: &[Forward],
) {
    let mut taken: HashMap<(Protocol, SocketAddr), String> = HashMap::new();
    let mut listeners: Vec<(String, Protocol, SocketAddr)> = Vec::new();
    listeners.extend(socks5.map(|a| ("proxy.socks5".to_string(), Protocol::Tcp, a)));
    listeners.extend(http.map(|a| ("proxy.http".to_string(), Protocol::Tcp, a)));
    for (i, f) in forwards.iter().enumerate() {
        listeners.push((format!("proxy.forward[{i}].listen"), f.protocol, f.listen));
    }
    for (field, protocol, addr) in listeners {
        if let Some(first) = taken.get(&(protocol, addr)) {
            c.error(
                field,
                format!("{addr} ({}) is already {first}'s", protocol.name()),
            );
        } else {
            taken.insert((protocol, addr), field);
        }
    }
}

fn optional_listen(c: &mut Checker, t: &Table, path: &str, key: &str) -> Option<SocketAddr> {
    let text = c.string(t, path, key)?;
    match text.parse::<SocketAddr>() {
        Ok(addr) if addr.port() != 0 => Some(addr),
        Ok(_) => {
            c.error(
                format!("{path}.{key}"),
                format!("{}: the port must not be 0", quote(text)),
            );
            None
        }
        Err(_) => {
            c.error(
                format!("{path}.{key}"),
                format!(
                    "{} is not an address:port (write 127.0.0.1:1080 or [::1]:1080)",
                    quote(text)
                ),
            );
            None
        }
    }
}

/// `[[proxy.KEY]]` sections, each with its field path.
fn tables<'a>(c: &mut Checker, t: &'a Table, key: &str) -> Vec<(String, &'a Table)> {
    match t.get(key) {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .filter_map(|(i, item)| match item {
                Value::Table(t) => Some((format!("proxy.{key}[{i}]"), t)),
                other => {
                    c.error(
                        format!("proxy.{key}[{i}]"),
                        format!(
                            "must be a table ([[proxy.{key}]]), not {}",
                            other.type_str()
                        ),
                    );
                    None
                }
            })
            .collect(),
        Some(_) => {
            c.error(
                format!("proxy.{key}"),
                format!("must be a list of tables: write each as [[proxy.{key}]]"),
            );
            Vec::new()
        }
    }
}

fn protocol(c: &mut Checker, t: &Table, path: &str) -> Option<Protocol> {
    match c.string(t, path, "protocol") {
        None if t.contains_key("protocol") => None,
        None | Some("tcp") => Some(Protocol::Tcp),
        Some("udp") => Some(Protocol::Udp),
        Some(other) => {
            c.error(
                format!("{path}.protocol"),
                format!(
                    "{} is not a protocol (expected \"tcp\" or \"udp\")",
                    quote(other)
                ),
            );
            None
        }
    }
}

fn check_forward(c: &mut Checker, t: &Table, path: &str) -> Option<Forward> {
    c.unknown_fields(t, path, FORWARD_FIELDS);
    let protocol = protocol(c, t, path);
    let listen = super::tls::listen_addr(c, t, path);
    let to = super::tls::endpoint(c, t, path, "to", "the address in the tunnel");
    Some(Forward {
        protocol: protocol?,
        listen: listen?,
        to: to?,
    })
}

fn check_reverse(
    c: &mut Checker,
    t: &Table,
    path: &str,
    addresses: Option<&[IpNet]>,
) -> Option<Reverse> {
    c.unknown_fields(t, path, FORWARD_FIELDS);
    let protocol = protocol(c, t, path);
    let listen = super::tls::listen_addr(c, t, path).and_then(|listen| {
        let Some(addresses) = addresses else {
            return Some(listen);
        };
        if addresses.iter().any(|a| a.addr() == listen.ip()) {
            Some(listen)
        } else {
            c.error(
                format!("{path}.listen"),
                format!(
                    "{} is not one of interface.address's addresses (a reverse listens inside the tunnel)",
                    listen.ip()
                ),
            );
            None
        }
    });
    let field = format!("{path}.to");
    let to = match c.string(t, path, "to") {
        None => {
            if !t.contains_key("to") {
                c.error(field, "missing (the local address:port to connect to)");
            }
            None
        }
        Some(text) => match text.parse::<SocketAddr>() {
            Ok(addr) if addr.port() != 0 => Some(addr),
            _ => {
                c.error(
                    field,
                    format!(
                        "{} is not a local address:port (write 127.0.0.1:80 or [::1]:80)",
                        quote(text)
                    ),
                );
                None
            }
        },
    };
    Some(Reverse {
        protocol: protocol?,
        listen: listen?,
        to: to?,
    })
}

/// What a proxy config may not have, since the proxy runs no TUN, no workers and no TLS:
/// each refused with the field it is in.
pub(super) fn check_proxy_rules(c: &mut Checker, root: &Table) {
    const WHY: &str = "tunneld proxy runs the tunnel in user space";
    for (section, what) in [
        ("dataplane", "[dataplane]"),
        ("tls", "[[tls.*]] sections"),
        ("fleet", "[fleet]"),
    ] {
        if root.contains_key(section) {
            c.error(
                section,
                format!("a proxy config has no {what} ({WHY}; `tunneld up` runs those)"),
            );
        }
    }
    if !root.contains_key("interface") {
        c.error(
            "interface",
            "missing [interface] section (the proxy's WireGuard interface)",
        );
    }
    if let Some(Value::Table(interface)) = root.get("interface") {
        if interface.contains_key("fwmark") {
            c.error(
                "interface.fwmark",
                format!("a proxy has no fwmark ({WHY}, with no routing to mark for)"),
            );
        }
        if !interface.contains_key("address") {
            c.error(
                "interface.address",
                "missing: the proxy's tunnel needs its own address (e.g. [\"10.77.0.2/32\"])",
            );
        }
    }
    if let Some(Value::Array(peers)) = root.get("peer") {
        for (i, peer) in peers.iter().enumerate() {
            let Value::Table(peer) = peer else { continue };
            match peer.get("parallel") {
                None | Some(Value::Integer(1)) => {}
                Some(_) => c.error(
                    format!("peer[{i}].parallel"),
                    "a proxy's peers are plain WireGuard peers (parallel = 1): the user-space tunnel has one session per peer",
                ),
            }
            if let Some(key) = [
                "transport",
                "tls_server_name",
                "tls_ca_file",
                "tls_cert_file",
                "tls_key_file",
                "tls_endpoint",
            ]
            .into_iter()
            .find(|k| peer.contains_key(*k))
            {
                c.error(
                    format!("peer[{i}].{key}"),
                    "a proxy's peers are reached over UDP: WireGuard over TLS is `tunneld up`'s",
                );
            }
        }
    }
}

/// The user-space tunnel takes at most one IPv4 and one IPv6 address.
pub(super) fn check_proxy_addresses(c: &mut Checker, addresses: &[IpNet]) {
    let v4 = addresses.iter().filter(|a| a.addr().is_ipv4()).count();
    let v6 = addresses.len() - v4;
    if v4 > 1 || v6 > 1 {
        c.error(
            "interface.address",
            "a proxy's tunnel has at most one IPv4 and one IPv6 address",
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::{parse, Endpoint, ProxyProtocol, ResolveWith};

    const KEY: &str = "private_key = \"yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=\"";
    const PEER: &str = "[[peer]]\npublic_key = \"xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=\"\nendpoint = \"192.0.2.1:51820\"\nallowed_ips = [\"10.77.0.0/24\"]\n";

    fn config(interface_extra: &str, rest: &str) -> String {
        format!(
            "[interface]\nname = \"corp\"\n{KEY}\naddress = [\"10.77.0.2/32\", \"fd77::2/128\"]\n{interface_extra}\n{PEER}\n{rest}"
        )
    }

    /// The one error line of `text`, which must be refused with exactly one.
    fn refused(text: &str) -> String {
        let errors = parse(text).expect_err("refused").0;
        assert_eq!(errors.len(), 1, "{errors:?}");
        errors[0].to_string()
    }

    #[test]
    fn the_spec_example_is_read_whole() {
        let text = config(
            "",
            "[proxy]\nsocks5 = \"127.0.0.1:1080\"\nhttp = \"127.0.0.1:8080\"\ndns = [\"10.77.0.1\"]\nusers_file = \"users\"\n\
             [[proxy.forward]]\nlisten = \"127.0.0.1:2222\"\nto = \"10.77.0.1:22\"\n\
             [[proxy.forward]]\nprotocol = \"udp\"\nlisten = \"127.0.0.1:5353\"\nto = \"dns.corp:53\"\n\
             [[proxy.reverse]]\nlisten = \"10.77.0.2:8080\"\nto = \"127.0.0.1:80\"\n",
        );
        let proxy = parse(&text).unwrap().proxy.unwrap();
        assert_eq!(proxy.socks5, Some("127.0.0.1:1080".parse().unwrap()));
        assert_eq!(
            proxy.resolve,
            ResolveWith::Tunnel,
            "dns set: the tunnel resolves"
        );
        assert_eq!(proxy.forwards.len(), 2);
        assert_eq!(proxy.forwards[1].protocol, ProxyProtocol::Udp);
        assert_eq!(
            proxy.forwards[1].to,
            Endpoint::Host {
                host: "dns.corp".into(),
                port: 53
            }
        );
        assert_eq!(proxy.reverses[0].to, "127.0.0.1:80".parse().unwrap());
        let local = parse(&config("", "[proxy]\nsocks5 = \"127.0.0.1:1080\"\n")).unwrap();
        assert_eq!(local.proxy.unwrap().resolve, ResolveWith::Local);
        assert!(parse(&config("", "")).unwrap().proxy.is_none());
    }

    #[test]
    fn what_the_user_space_tunnel_cannot_do_is_refused_by_field() {
        let socks = "[proxy]\nsocks5 = \"127.0.0.1:1080\"\n";
        for (extra, rest, line) in [
            ("", "[dataplane]\nworkers = 2\n", "dataplane: a proxy config has no [dataplane]"),
            ("", "[[tls.forward]]\nlisten = \"127.0.0.1:1\"\nconnect = \"a.b:1\"\nserver_name = \"a.b\"\nca_file = \"ca\"\n", "tls: a proxy config has no [[tls.*]]"),
            ("fwmark = 7", "", "interface.fwmark: a proxy has no fwmark"),
        ] {
            let said = refused(&config(extra, &format!("{socks}{rest}")));
            assert!(said.starts_with(line), "{said}");
        }
        let text = config("", socks).replace("allowed_ips", "parallel = 2\nallowed_ips");
        assert!(refused(&text).starts_with("peer[0].parallel: a proxy's peers are plain"));
        let text = config("", socks).replace(
            "allowed_ips",
            "transport = \"tls\"\ntls_server_name = \"a.b\"\nallowed_ips",
        );
        let errors = parse(&text).unwrap_err().to_string();
        assert!(
            errors.contains("peer[0].transport: a proxy's peers are reached over UDP"),
            "{errors}"
        );
        let text = config("", socks).replace(", \"fd77::2/128\"", ", \"10.77.0.3/32\"");
        assert!(
            refused(&text).starts_with("interface.address: a proxy's tunnel has at most one IPv4")
        );
        let text = config("", socks).replace("address = [\"10.77.0.2/32\", \"fd77::2/128\"]\n", "");
        assert!(refused(&text).starts_with("interface.address: missing"));
    }

    #[test]
    fn each_bad_proxy_field_is_one_line_naming_it() {
        for (rest, line) in [
            ("[proxy]\n", "proxy: serves nothing"),
            ("[proxy]\nsocks5 = \"localhost:1080\"\n", "proxy.socks5: `localhost:1080` is not an address:port"),
            ("[proxy]\nhttp = \"127.0.0.1:0\"\n", "proxy.http: `127.0.0.1:0`: the port must not be 0"),
            ("[proxy]\nsocks5 = \"127.0.0.1:1080\"\ndns = [\"ns1\"]\n", "proxy.dns[0]: `ns1` is not the IP address"),
            ("[proxy]\nsocks5 = \"127.0.0.1:1080\"\nresolve = \"tunnel\"\n", "proxy.resolve: \"tunnel\" needs DNS servers"),
            ("[proxy]\nsocks5 = \"127.0.0.1:1080\"\nresolve = \"remote\"\n", "proxy.resolve: `remote` is not a resolver"),
            ("[proxy]\nsocks5 = \"127.0.0.1:1080\"\nusers_file = \"\"\n", "proxy.users_file: is empty"),
            ("[proxy]\nsocks = \"127.0.0.1:1080\"\nhttp = \"127.0.0.1:8080\"\n", "proxy: unknown field `socks` (did you mean `socks5`?)"),
            ("[proxy]\nsocks5 = \"127.0.0.1:1080\"\nhttp = \"127.0.0.1:1080\"\n", "proxy.http: 127.0.0.1:1080 (tcp) is already proxy.socks5's"),
            ("[[proxy.forward]]\nlisten = \"127.0.0.1:2222\"\n", "proxy.forward[0].to: missing"),
            ("[[proxy.forward]]\nlisten = \"127.0.0.1:2222\"\nto = \"10.77.0.1\"\n", "proxy.forward[0].to: `10.77.0.1` has no port"),
            ("[[proxy.forward]]\nprotocol = \"sctp\"\nlisten = \"127.0.0.1:2222\"\nto = \"10.77.0.1:22\"\n", "proxy.forward[0].protocol: `sctp` is not a protocol"),
            ("[[proxy.forward]]\nlisten = \"127.0.0.1:2222\"\nto = \"10.77.0.1:22\"\n[[proxy.forward]]\nlisten = \"127.0.0.1:2222\"\nto = \"1.2.3.4:22\"\n", "proxy.forward[1].listen: 127.0.0.1:2222 (tcp) is already proxy.forward[0].listen's"),
            ("[[proxy.reverse]]\nlisten = \"10.77.0.9:80\"\nto = \"127.0.0.1:80\"\n", "proxy.reverse[0].listen: 10.77.0.9 is not one of interface.address's addresses"),
            ("[[proxy.reverse]]\nlisten = \"10.77.0.2:80\"\nto = \"web:80\"\n", "proxy.reverse[0].to: `web:80` is not a local address:port"),
            ("[proxy.forward]\nlisten = \"127.0.0.1:2222\"\n", "proxy.forward: must be a list of tables"),
        ] {
            let said = refused(&config("", rest));
            assert!(said.starts_with(line), "{rest}: {said}");
        }
        // A forward of each protocol may share a port.
        let both = "[[proxy.forward]]\nlisten = \"127.0.0.1:53\"\nto = \"10.77.0.1:53\"\n[[proxy.forward]]\nprotocol = \"udp\"\nlisten = \"127.0.0.1:53\"\nto = \"10.77.0.1:53\"\n";
        assert!(parse(&config("", both)).is_ok());
    }
}
