//! The `[[tls.forward]]` and `[[tls.listen]]` sections: TCP forwarded over TLS between two
//! tunnelds. Only the model and its validation live here; certificates are read by the daemon.

use super::{quote, Checker, Endpoint};
use std::net::SocketAddr;
use std::path::PathBuf;
use toml::{Table, Value};

const TLS_FIELDS: &[&str] = &["forward", "listen"];
const FORWARD_FIELDS: &[&str] = &[
    "listen",
    "connect",
    "server_name",
    "ca_file",
    "cert_file",
    "key_file",
];
const LISTEN_FIELDS: &[&str] = &[
    "listen",
    "cert_file",
    "key_file",
    "forward_to",
    "client_ca_file",
    "groups",
];

/// The key exchange groups a `[[tls.listen]]` offers when it sets no `groups`: exactly those
/// of rustls's default provider (aws-lc-rs), in its order. The others of [`LISTEN_GROUPS`]
/// are opt-in: X448 rests on a pre-release, unaudited crate, and a finite-field group costs
/// the server up to 20-30 ms of CPU per ClientHello (README, "TLS key exchange").
pub const DEFAULT_LISTEN_GROUPS: &[&str] = &["X25519MLKEM768", "X25519", "secp256r1", "secp384r1"];

/// The key exchange groups a `[[tls.listen]]` can offer (IANA's names, as OpenSSL's
/// `-groups` takes them, compared without case): [`DEFAULT_LISTEN_GROUPS`], then the opt-in
/// ones, cheapest first.
pub const LISTEN_GROUPS: &[&str] = &[
    "X25519MLKEM768",
    "X25519",
    "secp256r1",
    "secp384r1",
    "secp521r1",
    "X448",
    "ffdhe2048",
    "ffdhe3072",
    "ffdhe4096",
    "ffdhe6144",
    "ffdhe8192",
];

/// Every TLS forwarding this tunneld runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsConfig {
    pub forwards: Vec<TlsForward>,
    pub listens: Vec<TlsListen>,
}

impl TlsConfig {
    pub fn is_empty(&self) -> bool {
        self.forwards.is_empty() && self.listens.is_empty()
    }
}

/// Client side: plaintext TCP accepted on `listen` goes out over TLS to `connect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsForward {
    pub listen: SocketAddr,
    pub connect: Endpoint,
    /// The name the server's certificate must carry (a DNS name or an IP address).
    pub server_name: String,
    /// PEM CA certificates the server's chain must lead to.
    pub ca_file: PathBuf,
    /// A client certificate, for servers that require mTLS.
    pub client_cert: Option<CertKey>,
}

/// Server side: TLS accepted on `listen`, its plaintext forwarded to `forward_to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsListen {
    pub listen: SocketAddr,
    pub cert: CertKey,
    pub forward_to: TlsTarget,
    /// When set, clients must present a certificate that leads to one of these CAs.
    pub client_ca_file: Option<PathBuf>,
    /// `groups`: the key exchange groups offered, in the listener's order of preference,
    /// each spelled as in [`LISTEN_GROUPS`]; `None` offers [`DEFAULT_LISTEN_GROUPS`].
    pub groups: Option<Vec<&'static str>>,
}

/// Where a `[[tls.listen]]` sends what it receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsTarget {
    /// A TCP service: the stream's plaintext is forwarded to it.
    Tcp(Endpoint),
    /// `forward_to = "wireguard"`: the stream carries length-prefixed WireGuard datagrams for
    /// this tunneld's own interface (peers with `transport = "tls"` on the other side).
    WireGuard,
}

impl std::fmt::Display for TlsTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TlsTarget::Tcp(e) => write!(f, "{e}"),
            TlsTarget::WireGuard => f.write_str("the WireGuard interface"),
        }
    }
}

/// A peer's `transport = "tls"` settings: its `endpoint` is then the other tunneld's
/// `[[tls.listen]]` with `forward_to = "wireguard"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerTls {
    pub server_name: String,
    pub ca_file: PathBuf,
    pub client_cert: Option<CertKey>,
    /// `transport = "auto"`: start on UDP at `endpoint` and fall back to TLS at this address
    /// when UDP handshakes go unanswered. `None` for `transport = "tls"`, whose `endpoint` is
    /// the TLS address itself.
    pub fallback: Option<Endpoint>,
}

/// A PEM certificate chain and its private key (the key file must be mode 0600 or stricter).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertKey {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

pub(super) fn check_tls(c: &mut Checker, value: &Value) -> TlsConfig {
    let mut tls = TlsConfig::default();
    let Value::Table(t) = value else {
        c.error(
            "tls",
            format!(
                "must be a table ([[tls.forward]] / [[tls.listen]] sections), not {}",
                value.type_str()
            ),
        );
        return tls;
    };
    c.unknown_fields(t, "tls", TLS_FIELDS);
    for (i, section) in sections(c, t, "forward").into_iter().enumerate() {
        if let Some(f) = check_forward(c, section, &format!("tls.forward[{i}]")) {
            tls.forwards.push(f);
        }
    }
    for (i, section) in sections(c, t, "listen").into_iter().enumerate() {
        if let Some(l) = check_listen(c, section, &format!("tls.listen[{i}]")) {
            tls.listens.push(l);
        }
    }
    let mut seen: Vec<(SocketAddr, String)> = Vec::new();
    let all = tls
        .forwards
        .iter()
        .enumerate()
        .map(|(i, f)| (f.listen, format!("tls.forward[{i}]")))
        .chain(
            tls.listens
                .iter()
                .enumerate()
                .map(|(i, l)| (l.listen, format!("tls.listen[{i}]"))),
        );
    for (addr, path) in all {
        if let Some((_, first)) = seen.iter().find(|(a, _)| *a == addr) {
            c.error(
                format!("{path}.listen"),
                format!("{addr} is already used by {first}.listen"),
            );
        } else {
            seen.push((addr, path));
        }
    }
    tls
}

/// The tables of `[[tls.<key>]]`, reporting anything else written under that key.
fn sections<'a>(c: &mut Checker, t: &'a Table, key: &str) -> Vec<&'a Table> {
    match t.get(key) {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .filter_map(|(i, item)| match item {
                Value::Table(t) => Some(t),
                other => {
                    c.error(
                        format!("tls.{key}[{i}]"),
                        format!("must be a table ([[tls.{key}]]), not {}", other.type_str()),
                    );
                    None
                }
            })
            .collect(),
        Some(Value::Table(_)) => {
            c.error(
                format!("tls.{key}"),
                format!("must be a list of tables: write [[tls.{key}]], not [tls.{key}]"),
            );
            Vec::new()
        }
        Some(other) => {
            c.error(
                format!("tls.{key}"),
                format!(
                    "must be a list of [[tls.{key}]] sections, not {}",
                    other.type_str()
                ),
            );
            Vec::new()
        }
    }
}

fn check_forward(c: &mut Checker, t: &Table, path: &str) -> Option<TlsForward> {
    c.unknown_fields(t, path, FORWARD_FIELDS);
    let listen = listen_addr(c, t, path);
    let connect = endpoint(c, t, path, "connect", "the remote tunneld's TLS address");
    let server_name = server_name(c, t, path, "server_name");
    let ca_file = file(
        c,
        t,
        path,
        "ca_file",
        Some("the CA certificates (PEM) to trust"),
    );
    let client_cert = cert_key(c, t, path, "", false);
    Some(TlsForward {
        listen: listen?,
        connect: connect?,
        server_name: server_name?,
        ca_file: ca_file?,
        client_cert: client_cert.ok()?,
    })
}

fn check_listen(c: &mut Checker, t: &Table, path: &str) -> Option<TlsListen> {
    c.unknown_fields(t, path, LISTEN_FIELDS);
    let listen = listen_addr(c, t, path);
    let cert = cert_key(c, t, path, "", true);
    let forward_to = match t.get("forward_to") {
        Some(Value::String(s)) if s == "wireguard" => Some(TlsTarget::WireGuard),
        _ => endpoint(
            c,
            t,
            path,
            "forward_to",
            "where to forward the plaintext, or \"wireguard\"",
        )
        .map(TlsTarget::Tcp),
    };
    let client_ca_file = file(c, t, path, "client_ca_file", None);
    let groups = listen_groups(c, t, path);
    Some(TlsListen {
        listen: listen?,
        cert: cert.ok()??,
        forward_to: forward_to?,
        client_ca_file,
        groups: groups?,
    })
}

/// `groups = [...]`: known names, each once, at least one. `Some(None)` when absent.
fn listen_groups(c: &mut Checker, t: &Table, path: &str) -> Option<Option<Vec<&'static str>>> {
    if !t.contains_key("groups") {
        return Some(None);
    }
    let before = c.errors.len();
    let mut groups: Vec<&'static str> = Vec::new();
    for (field, _, name) in c.string_list(t, path, "groups") {
        match LISTEN_GROUPS.iter().find(|g| g.eq_ignore_ascii_case(name)) {
            None => c.error(
                field,
                format!(
                    "{} is not a key exchange group tunneld offers (known: {})",
                    quote(name),
                    LISTEN_GROUPS.join(", ")
                ),
            ),
            Some(known) if groups.contains(known) => {
                c.error(field, format!("{known} is listed twice"))
            }
            Some(known) => groups.push(known),
        }
    }
    if c.errors.len() > before {
        return None;
    }
    if groups.is_empty() {
        c.error(
            format!("{path}.groups"),
            "is empty: list at least one key exchange group, or leave it out to offer the defaults",
        );
        return None;
    }
    Some(Some(groups))
}

fn server_name(c: &mut Checker, t: &Table, path: &str, key: &str) -> Option<String> {
    match c.string(t, path, key) {
        Some(name) => match rustls_pki_types::ServerName::try_from(name) {
            Ok(_) => Some(name.to_string()),
            Err(_) => {
                c.error(
                    format!("{path}.{key}"),
                    format!("{} is not a DNS name or an IP address", quote(name)),
                );
                None
            }
        },
        None => {
            if !t.contains_key(key) {
                c.error(
                    format!("{path}.{key}"),
                    "missing (the name the server's certificate must carry)",
                );
            }
            None
        }
    }
}

/// The `tls_*` fields of a peer table: `Some` when `transport = "tls"` and they are complete.
pub(super) fn check_peer_tls(c: &mut Checker, t: &Table, path: &str) -> Option<PeerTls> {
    const FIELDS: [&str; 5] = [
        "tls_server_name",
        "tls_ca_file",
        "tls_cert_file",
        "tls_key_file",
        "tls_endpoint",
    ];
    let transport = match c.string(t, path, "transport") {
        None => "udp",
        Some(known @ ("udp" | "tls" | "auto")) => known,
        Some(other) => {
            c.error(
                format!("{path}.transport"),
                format!(
                    "{} is not a transport (expected \"udp\", \"tls\" or \"auto\")",
                    quote(other)
                ),
            );
            return None;
        }
    };
    if transport == "udp" {
        for key in FIELDS.iter().filter(|k| t.contains_key(**k)) {
            c.error(
                format!("{path}.{key}"),
                "is only used with transport = \"tls\" or \"auto\"",
            );
        }
        return None;
    }
    if !t.contains_key("endpoint") {
        c.error(
            format!("{path}.endpoint"),
            if transport == "tls" {
                "missing: with transport = \"tls\" it is the other tunneld's [[tls.listen]] address (host:port)"
            } else {
                "missing: with transport = \"auto\" it is the peer's UDP address (host:port)"
            },
        );
    }
    let fallback = match transport {
        "auto" => {
            let e = endpoint(
                c,
                t,
                path,
                "tls_endpoint",
                "the other tunneld's [[tls.listen]] address to fall back to",
            );
            Some(e)
        }
        _ => {
            if t.contains_key("tls_endpoint") {
                c.error(
                    format!("{path}.tls_endpoint"),
                    "is only used with transport = \"auto\" (with \"tls\", `endpoint` is the TLS address)",
                );
            }
            None
        }
    };
    let server_name = server_name(c, t, path, "tls_server_name");
    let ca_file = file(
        c,
        t,
        path,
        "tls_ca_file",
        Some("the CA certificates (PEM) to trust"),
    );
    let client_cert = cert_key(c, t, path, "tls_", false);
    let fallback = match fallback {
        Some(e) => Some(e?),
        None => None,
    };
    Some(PeerTls {
        server_name: server_name?,
        ca_file: ca_file?,
        client_cert: client_cert.ok()?,
        fallback,
    })
}

pub(super) fn listen_addr(c: &mut Checker, t: &Table, path: &str) -> Option<SocketAddr> {
    let field = format!("{path}.listen");
    let Some(text) = c.string(t, path, "listen") else {
        if !t.contains_key("listen") {
            c.error(field, "missing (the address:port to accept connections on)");
        }
        return None;
    };
    match text.parse::<SocketAddr>() {
        Ok(addr) if addr.port() != 0 => Some(addr),
        Ok(_) => {
            c.error(field, format!("{}: the port must not be 0", quote(text)));
            None
        }
        Err(_) => {
            c.error(
                field,
                format!(
                    "{} is not an address:port (write 127.0.0.1:15201 or [::1]:15201)",
                    quote(text)
                ),
            );
            None
        }
    }
}

pub(super) fn endpoint(
    c: &mut Checker,
    t: &Table,
    path: &str,
    key: &str,
    what: &str,
) -> Option<Endpoint> {
    let field = format!("{path}.{key}");
    let Some(text) = c.string(t, path, key) else {
        if !t.contains_key(key) {
            c.error(field, format!("missing ({what}, host:port)"));
        }
        return None;
    };
    match text.parse::<Endpoint>() {
        Ok(e) => Some(e),
        Err(why) => {
            c.error(field, why);
            None
        }
    }
}

/// A file name; `required` is the description shown when it is missing, `None` if optional.
fn file(
    c: &mut Checker,
    t: &Table,
    path: &str,
    key: &str,
    required: Option<&str>,
) -> Option<PathBuf> {
    match c.string(t, path, key) {
        Some("") => {
            c.error(format!("{path}.{key}"), "is empty (a file name)");
            None
        }
        Some(name) => Some(PathBuf::from(name)),
        None => {
            if let (Some(what), false) = (required, t.contains_key(key)) {
                c.error(format!("{path}.{key}"), format!("missing ({what})"));
            }
            None
        }
    }
}

/// `<prefix>cert_file` and `<prefix>key_file`, which go together. `Err` when they are wrong;
/// `Ok(None)` when both are absent (an error if `required`).
fn cert_key(
    c: &mut Checker,
    t: &Table,
    path: &str,
    prefix: &str,
    required: bool,
) -> Result<Option<CertKey>, ()> {
    let (cert_key, key_key) = (format!("{prefix}cert_file"), format!("{prefix}key_file"));
    let (has_cert, has_key) = (t.contains_key(&cert_key), t.contains_key(&key_key));
    if !has_cert && !has_key {
        if required {
            c.error(
                format!("{path}.{cert_key}"),
                "missing (the certificate chain to present, PEM)",
            );
            c.error(
                format!("{path}.{key_key}"),
                "missing (its private key, PEM)",
            );
            return Err(());
        }
        return Ok(None);
    }
    if has_cert != has_key {
        let (missing, present) = if has_cert {
            (&key_key, &cert_key)
        } else {
            (&cert_key, &key_key)
        };
        c.error(
            format!("{path}.{missing}"),
            format!("missing: `{present}` needs `{missing}` too"),
        );
        return Err(());
    }
    let cert_file = file(c, t, path, &cert_key, None);
    let key_file = file(c, t, path, &key_key, None);
    match (cert_file, key_file) {
        (Some(cert_file), Some(key_file)) => Ok(Some(CertKey {
            cert_file,
            key_file,
        })),
        _ => Err(()),
    }
}
