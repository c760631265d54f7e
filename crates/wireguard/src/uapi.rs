//! The WireGuard cross-platform userspace API (UAPI): the text protocol `wg` speaks over
//! `/var/run/wireguard/<name>.sock`. Sans-IO: the daemon reads the bytes, this parses them and
//! formats the replies.
//!
//! A request is `get=1` or `set=1` followed by `key=value` lines and ends with an empty line.
//! In a `set`, device keys come first; each `public_key` line starts a peer, and the keys after
//! it apply to that peer. Errors carry the errno the reply reports, as wireguard-go's do:
//! EINVAL for a bad value, EPROTO for an unknown key or a malformed request.

use ipnet::IpNet;
use std::fmt::{self, Write as _};
use std::net::SocketAddr;
use std::time::Duration;
use tunneld_crypto::{hex, parse_hex_key, PresharedKey, PrivateKey, PublicKey, KEY_LEN};

const EINVAL: i32 = 22;
const EPROTO: i32 = 71;

const DEVICE_KEYS: &[&str] = &["private_key", "listen_port", "fwmark", "replace_peers"];
const PEER_KEYS: &[&str] = &[
    "remove",
    "update_only",
    "preshared_key",
    "endpoint",
    "persistent_keepalive_interval",
    "replace_allowed_ips",
    "allowed_ip",
    "protocol_version",
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Get,
    Set(SetRequest),
    /// `stats=1`: tunneld's own extension (used by `tunneld show`), never sent by `wg`.
    Stats,
    /// `fleet=1`: tunneld's own extension, the state of the fleet the interface is a member
    /// of (`tunneld show`); `errno=2` (ENOENT) when it is in none.
    Fleet,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetRequest {
    /// `Some(None)`: the all-zero key, which removes the private key.
    pub private_key: Option<Option<PrivateKey>>,
    pub listen_port: Option<u16>,
    pub fwmark: Option<u32>,
    pub replace_peers: bool,
    pub peers: Vec<PeerUpdate>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerUpdate {
    pub public_key: PublicKey,
    pub remove: bool,
    pub update_only: bool,
    /// `Some(None)`: the all-zero key, which removes the preshared key.
    pub preshared_key: Option<Option<PresharedKey>>,
    pub endpoint: Option<SocketAddr>,
    pub persistent_keepalive: Option<u16>,
    pub replace_allowed_ips: bool,
    /// Truncated to their networks.
    pub allowed_ips: Vec<IpNet>,
    /// `Some`: replaces the prefixes the peer shares with other peers (`PeerSettings::
    /// shared_ips`). Never set by the UAPI text, which has no such key: only the control
    /// handle's peer operations share a prefix.
    pub shared_ips: Option<Vec<IpNet>>,
}

impl PeerUpdate {
    /// An update that names the peer and changes nothing yet.
    pub fn new(public_key: PublicKey) -> Self {
        Self {
            public_key,
            remove: false,
            update_only: false,
            preshared_key: None,
            endpoint: None,
            persistent_keepalive: None,
            replace_allowed_ips: false,
            allowed_ips: Vec::new(),
            shared_ips: None,
        }
    }
}

/// A refused request: `errno` goes back to the client, `message` to the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UapiError {
    pub errno: i32,
    pub message: String,
}

impl fmt::Display for UapiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for UapiError {}

fn invalid(key: &str, why: impl fmt::Display) -> UapiError {
    UapiError {
        errno: EINVAL,
        message: format!("{key}: {why}"),
    }
}

fn protocol(why: impl fmt::Display) -> UapiError {
    UapiError {
        errno: EPROTO,
        message: why.to_string(),
    }
}

/// Text from the client as a log line shows it: quoted, escaped, cut short.
fn shown(text: &str) -> String {
    const MAX_CHARS: usize = 64;
    match text.char_indices().nth(MAX_CHARS) {
        Some((cut, _)) => format!("{:?}…", &text[..cut]),
        None => format!("{text:?}"),
    }
}

/// Whether `buf` (the bytes read so far) holds a whole request: one that ends with an empty
/// line. A lone empty line counts, so that it is refused at once rather than waited on.
pub fn is_complete(buf: &[u8]) -> bool {
    buf == b"\n" || buf.ends_with(b"\n\n")
}

/// Parses one whole request, up to and including its terminating empty line.
pub fn parse_request(message: &str) -> Result<Request, UapiError> {
    if message == "\n" {
        return Err(protocol("empty request (expected get=1 or set=1)"));
    }
    let Some(body) = message.strip_suffix("\n\n") else {
        return Err(protocol(
            "request does not end with an empty line (it is incomplete)",
        ));
    };
    let mut lines = body.split('\n');
    let operation = lines.next().unwrap_or_default();
    let no_more_lines = |mut lines: std::str::Split<'_, char>, op: &str| match lines.next() {
        None => Ok(()),
        Some("") => Err(after_end()),
        Some(line) => Err(protocol(format!(
            "{op} takes no keys, got the line {}",
            shown(line)
        ))),
    };
    match operation {
        "get=1" => no_more_lines(lines, "get=1").map(|()| Request::Get),
        "stats=1" => no_more_lines(lines, "stats=1").map(|()| Request::Stats),
        "fleet=1" => no_more_lines(lines, "fleet=1").map(|()| Request::Fleet),
        "set=1" => parse_set(lines).map(Request::Set),
        "" => Err(protocol("empty line before the operation")),
        other => Err(protocol(format!(
            "unknown operation {} (expected get=1 or set=1)",
            shown(other)
        ))),
    }
}

/// An empty line ends a request, so lines after one are not part of it.
fn after_end() -> UapiError {
    protocol("data after the empty line that ends the request")
}

fn parse_set<'a>(lines: impl Iterator<Item = &'a str>) -> Result<SetRequest, UapiError> {
    let mut set = SetRequest::default();
    for line in lines {
        if line.is_empty() {
            return Err(after_end());
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err(protocol(format!("line without '=': {}", shown(line))));
        };
        if key == "public_key" {
            let bytes = hex_key(key, value)?;
            set.peers
                .push(PeerUpdate::new(PublicKey::from_bytes(bytes)));
            continue;
        }
        // The key's place is checked before its value, so that a key in the wrong place or
        // unknown is a protocol error whatever its value.
        let in_peer = !set.peers.is_empty();
        let (here, elsewhere) = if in_peer {
            (PEER_KEYS, DEVICE_KEYS)
        } else {
            (DEVICE_KEYS, PEER_KEYS)
        };
        if !here.contains(&key) {
            return Err(protocol(match (elsewhere.contains(&key), in_peer) {
                (true, true) => {
                    format!("{key} is a device key: it must come before the first public_key line")
                }
                (true, false) => format!("{key} is a peer key: it must follow a public_key line"),
                (false, true) => format!("unknown peer key {}", shown(key)),
                (false, false) => format!("unknown device key {}", shown(key)),
            }));
        }
        if value.is_empty() {
            return Err(invalid(key, "empty value"));
        }
        match set.peers.last_mut() {
            None => parse_device_key(&mut set, key, value)?,
            Some(peer) => parse_peer_key(peer, key, value)?,
        }
    }
    Ok(set)
}

fn parse_device_key(set: &mut SetRequest, key: &str, value: &str) -> Result<(), UapiError> {
    match key {
        "private_key" => {
            let bytes = hex_key(key, value)?;
            set.private_key = Some((bytes != [0; KEY_LEN]).then(|| PrivateKey::from_bytes(bytes)));
        }
        "listen_port" => {
            set.listen_port =
                Some(decimal(value).ok_or_else(|| {
                    invalid(key, format!("{} is not a port 0-65535", shown(value)))
                })?);
        }
        "fwmark" => {
            set.fwmark = Some(decimal(value).ok_or_else(|| {
                invalid(
                    key,
                    format!("{} is not a number 0-4294967295", shown(value)),
                )
            })?);
        }
        // `replace_peers`, the one device key left.
        _ => set.replace_peers = parse_true(key, value)?,
    }
    Ok(())
}

fn parse_peer_key(peer: &mut PeerUpdate, key: &str, value: &str) -> Result<(), UapiError> {
    match key {
        "remove" => peer.remove = parse_true(key, value)?,
        "update_only" => peer.update_only = parse_true(key, value)?,
        "replace_allowed_ips" => peer.replace_allowed_ips = parse_true(key, value)?,
        "preshared_key" => {
            let bytes = hex_key(key, value)?;
            peer.preshared_key =
                Some((bytes != [0; KEY_LEN]).then(|| PresharedKey::from_bytes(bytes)));
        }
        "endpoint" => peer.endpoint = Some(parse_endpoint(value)?),
        "persistent_keepalive_interval" => {
            peer.persistent_keepalive =
                Some(decimal(value).ok_or_else(|| {
                    invalid(key, format!("{} is not 0-65535 seconds", shown(value)))
                })?);
        }
        "allowed_ip" => {
            let net: IpNet = value.parse().map_err(|_| {
                invalid(
                    key,
                    format!("{} is not a CIDR (address/prefix)", shown(value)),
                )
            })?;
            peer.allowed_ips.push(net.trunc());
        }
        // `protocol_version`, the one peer key left.
        _ => {
            if value != "1" {
                return Err(invalid(
                    key,
                    format!("version {} is not supported (only 1)", shown(value)),
                ));
            }
        }
    }
    Ok(())
}

/// A 32-byte key in hex. Keys may be secret, so the error says what is wrong without them.
fn hex_key(key: &str, value: &str) -> Result<[u8; KEY_LEN], UapiError> {
    if value.is_empty() {
        return Err(invalid(key, "empty value"));
    }
    parse_hex_key(value).ok_or_else(|| {
        invalid(
            key,
            format!(
                "not a key: expected {} hex digits, got {} characters",
                KEY_LEN * 2,
                value.chars().count()
            ),
        )
    })
}

/// Digits only: no sign, no spaces (Rust's integer parsing would take a leading `+`).
fn decimal<T: std::str::FromStr>(value: &str) -> Option<T> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

/// `a.b.c.d:port` or `[ipv6]:port`; a zone must be numeric (`[fe80::1%2]:51820`) since
/// naming an interface would need a lookup this sans-IO parser cannot do.
fn parse_endpoint(value: &str) -> Result<SocketAddr, UapiError> {
    const KEY: &str = "endpoint";
    if let Ok(addr) = value.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let why = if value.starts_with('[') && value.contains('%') {
        "the zone after `%` must be an interface index (a number)"
    } else if !value.starts_with('[') && value.matches(':').count() > 1 {
        "IPv6 endpoints are written [address]:port"
    } else {
        "expected ADDRESS:PORT or [ADDRESS]:PORT"
    };
    Err(invalid(KEY, format!("{}: {why}", shown(value))))
}

fn parse_true(key: &str, value: &str) -> Result<bool, UapiError> {
    if value == "true" {
        Ok(true)
    } else {
        Err(invalid(
            key,
            format!("{} is not \"true\" (the only value it takes)", shown(value)),
        ))
    }
}

/// What a `get` reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceSnapshot {
    pub private_key: Option<PrivateKey>,
    pub listen_port: u16,
    pub fwmark: u32,
    pub peers: Vec<PeerSnapshot>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSnapshot {
    pub public_key: PublicKey,
    pub preshared_key: Option<PresharedKey>,
    pub endpoint: Option<SocketAddr>,
    /// Since the UNIX epoch; `None` if never.
    pub last_handshake: Option<Duration>,
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    pub persistent_keepalive: u16,
    pub allowed_ips: Vec<IpNet>,
}

impl DeviceSnapshot {
    /// The interface as a whole from its workers' snapshots, each of which lists the peers
    /// (or sub-tunnels) that worker carries: each peer once, in order of first appearance,
    /// with its sub-tunnels' bytes added up, the latest of their handshakes, and the first
    /// endpoint known.
    pub fn merge(parts: Vec<DeviceSnapshot>) -> DeviceSnapshot {
        let mut parts = parts.into_iter();
        let mut merged = parts.next().unwrap_or_default();
        // By key, so that merging N peers from each worker is linear in N.
        let mut at: std::collections::HashMap<PublicKey, usize> = merged
            .peers
            .iter()
            .enumerate()
            .map(|(i, p)| (p.public_key, i))
            .collect();
        for part in parts {
            for peer in part.peers {
                match at
                    .get(&peer.public_key)
                    .and_then(|&i| merged.peers.get_mut(i))
                {
                    Some(seen) => {
                        seen.tx_bytes += peer.tx_bytes;
                        seen.rx_bytes += peer.rx_bytes;
                        seen.last_handshake = seen.last_handshake.max(peer.last_handshake);
                        seen.endpoint = seen.endpoint.or(peer.endpoint);
                    }
                    None => {
                        at.insert(peer.public_key, merged.peers.len());
                        merged.peers.push(peer);
                    }
                }
            }
        }
        merged
    }
}

/// The reply to `get`, ending in `errno=0` and an empty line. Device values that are unset
/// (no private key, port 0, fwmark 0) are left out, as wireguard-go leaves them out.
pub fn format_get(snapshot: &DeviceSnapshot) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    if let Some(key) = &snapshot.private_key {
        let _ = writeln!(out, "private_key={}", hex(key.as_bytes()));
    }
    if snapshot.listen_port != 0 {
        let _ = writeln!(out, "listen_port={}", snapshot.listen_port);
    }
    if snapshot.fwmark != 0 {
        let _ = writeln!(out, "fwmark={}", snapshot.fwmark);
    }
    for peer in &snapshot.peers {
        let _ = writeln!(out, "public_key={}", peer.public_key.to_hex());
        let psk = peer
            .preshared_key
            .as_ref()
            .map_or_else(|| hex(&[0; KEY_LEN]), |k| hex(k.as_bytes()));
        let _ = writeln!(out, "preshared_key={psk}");
        out.push_str("protocol_version=1\n");
        if let Some(endpoint) = peer.endpoint {
            let _ = writeln!(out, "endpoint={endpoint}");
        }
        let handshake = peer.last_handshake.unwrap_or_default();
        let _ = writeln!(out, "last_handshake_time_sec={}", handshake.as_secs());
        let _ = writeln!(out, "last_handshake_time_nsec={}", handshake.subsec_nanos());
        let _ = writeln!(out, "tx_bytes={}", peer.tx_bytes);
        let _ = writeln!(out, "rx_bytes={}", peer.rx_bytes);
        let _ = writeln!(
            out,
            "persistent_keepalive_interval={}",
            peer.persistent_keepalive
        );
        for net in &peer.allowed_ips {
            let _ = writeln!(out, "allowed_ip={net}");
        }
    }
    out.push_str("errno=0\n\n");
    out
}

/// One worker's part of a `stats=1` reply.
#[derive(Debug, Clone, Default)]
pub struct WorkerStats {
    pub stats: crate::Stats,
    /// The peers whose sessions it carries, with the number of the sub-tunnel of a split one.
    pub carries: Vec<(PublicKey, Option<u8>)>,
}

/// The reply to `stats=1`: one `key=value` line per counter, per worker, then a `carries=`
/// line per peer it carries (hex key, and `/` and the sub-tunnel for a split peer), then
/// `errno=0`. Workers are numbered from 0.
pub fn format_stats(workers: &[WorkerStats]) -> String {
    let mut out = String::new();
    for (i, worker) in workers.iter().enumerate() {
        let s = &worker.stats;
        let _ = writeln!(out, "worker={i}");
        let _ = writeln!(out, "tx_packets={}", s.tx_packets);
        let _ = writeln!(out, "tx_bytes={}", s.tx_bytes);
        let _ = writeln!(out, "rx_packets={}", s.rx_packets);
        let _ = writeln!(out, "rx_bytes={}", s.rx_bytes);
        let _ = writeln!(out, "handshakes_sent={}", s.handshakes_sent);
        let _ = writeln!(out, "cookie_replies_sent={}", s.cookie_replies_sent);
        let _ = writeln!(out, "handoffs_out={}", s.handoffs_out);
        let _ = writeln!(out, "handoffs_in={}", s.handoffs_in);
        for reason in crate::DropReason::ALL {
            let _ = writeln!(out, "drop_{}={}", reason.name(), s.drops(*reason));
        }
        for (key, sub) in &worker.carries {
            let _ = match sub {
                Some(sub) => writeln!(out, "carries={}/{sub}", hex(key.as_bytes())),
                None => writeln!(out, "carries={}", hex(key.as_bytes())),
            };
        }
    }
    out.push_str("errno=0\n\n");
    out
}

/// The reply to `set` (0 = success) or to a refused request.
pub fn format_errno(errno: i32) -> String {
    format!("errno={errno}\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> [u8; KEY_LEN] {
        [byte; KEY_LEN]
    }

    #[test]
    fn get_reply_has_the_lines_wg_show_reads() {
        let snapshot = DeviceSnapshot {
            private_key: Some(PrivateKey::from_bytes(key(0x11))),
            listen_port: 51820,
            fwmark: 0x42,
            peers: vec![
                PeerSnapshot {
                    public_key: PublicKey::from_bytes(key(0xab)),
                    preshared_key: Some(PresharedKey::from_bytes(key(0x01))),
                    endpoint: Some("[2001:db8::1]:51820".parse().unwrap()),
                    last_handshake: Some(Duration::new(1_700_000_000, 123_456_789)),
                    tx_bytes: 1000,
                    rx_bytes: 2000,
                    persistent_keepalive: 25,
                    allowed_ips: vec![
                        "10.77.0.2/32".parse().unwrap(),
                        "fd77::/64".parse().unwrap(),
                    ],
                },
                PeerSnapshot {
                    public_key: PublicKey::from_bytes(key(0xcd)),
                    preshared_key: None,
                    endpoint: None,
                    last_handshake: None,
                    tx_bytes: 0,
                    rx_bytes: 0,
                    persistent_keepalive: 0,
                    allowed_ips: Vec::new(),
                },
            ],
        };
        let text = format_get(&snapshot);
        let lines: Vec<&str> = text.split('\n').collect();
        let expected = [
            format!("private_key={}", "11".repeat(32)),
            "listen_port=51820".into(),
            "fwmark=66".into(),
            format!("public_key={}", "ab".repeat(32)),
            format!("preshared_key={}", "01".repeat(32)),
            "protocol_version=1".into(),
            "endpoint=[2001:db8::1]:51820".into(),
            "last_handshake_time_sec=1700000000".into(),
            "last_handshake_time_nsec=123456789".into(),
            "tx_bytes=1000".into(),
            "rx_bytes=2000".into(),
            "persistent_keepalive_interval=25".into(),
            "allowed_ip=10.77.0.2/32".into(),
            "allowed_ip=fd77::/64".into(),
            format!("public_key={}", "cd".repeat(32)),
            format!("preshared_key={}", "0".repeat(64)),
            "protocol_version=1".into(),
            "last_handshake_time_sec=0".into(),
            "last_handshake_time_nsec=0".into(),
            "tx_bytes=0".into(),
            "rx_bytes=0".into(),
            "persistent_keepalive_interval=0".into(),
            "errno=0".into(),
            String::new(),
            String::new(),
        ];
        assert_eq!(lines, expected);
    }

    #[test]
    fn unset_device_values_are_left_out() {
        assert_eq!(format_get(&DeviceSnapshot::default()), "errno=0\n\n");
    }

    #[test]
    fn completeness_is_an_empty_line() {
        assert!(is_complete(b"get=1\n\n"));
        assert!(is_complete(b"\n"));
        assert!(!is_complete(b"get=1\n"));
        assert!(!is_complete(b""));
        assert!(!is_complete(b"set=1\nlisten_port=1\n"));
    }

    #[test]
    fn numbers_are_digits_only() {
        assert_eq!(decimal::<u16>("51820"), Some(51820));
        assert_eq!(decimal::<u16>("+1"), None);
        assert_eq!(decimal::<u16>(" 1"), None);
        assert_eq!(decimal::<u16>("65536"), None);
        assert_eq!(decimal::<u32>(""), None);
    }

    #[test]
    fn secrets_are_not_echoed() {
        let secret = format!("{}zz", "ab".repeat(31));
        for msg in [
            format!("set=1\nprivate_key={secret}\n\n"),
            format!(
                "set=1\npublic_key={}\npreshared_key={secret}\n\n",
                "cd".repeat(32)
            ),
        ] {
            let err = parse_request(&msg).unwrap_err();
            assert_eq!(err.errno, EINVAL);
            assert!(!err.message.contains(&secret), "{err}");
            assert!(err.message.contains("got 64 characters"), "{err}");
        }
    }
}
