//! The WireGuard cross-platform userspace API (UAPI): the text protocol `wg` speaks over
//! `/var/run/wireguard/<name>.sock`. Sans-IO: the daemon reads the bytes, this parses them.

use ipnet::IpNet;
use std::fmt::{self, Write as _};
use std::net::SocketAddr;
use std::time::Duration;
use tunneld_crypto::{hex, parse_hex_key, PresharedKey, PrivateKey, PublicKey};

const EINVAL: i32 = 22;
const EPROTO: i32 = 71;

#[derive(Debug)]
pub enum Request {
    Get,
    Set(SetRequest),
    /// `stats=1`: tunneld's own extension (used by `tunneld show`), never sent by `wg`.
    Stats,
}

#[derive(Debug, Default)]
pub struct SetRequest {
    /// `Some(None)`: the all-zero key, which removes the private key.
    pub private_key: Option<Option<PrivateKey>>,
    pub listen_port: Option<u16>,
    pub fwmark: Option<u32>,
    pub replace_peers: bool,
    pub peers: Vec<PeerUpdate>,
}

#[derive(Debug)]
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
}

impl PeerUpdate {
    fn new(public_key: PublicKey) -> Self {
        Self {
            public_key,
            remove: false,
            update_only: false,
            preshared_key: None,
            endpoint: None,
            persistent_keepalive: None,
            replace_allowed_ips: false,
            allowed_ips: Vec::new(),
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

/// Whether `buf` holds a whole request: one that ends with an empty line.
pub fn is_complete(buf: &[u8]) -> bool {
    buf.ends_with(b"\n\n")
}

/// Parses one whole request, up to and including its terminating empty line.
pub fn parse_request(message: &str) -> Result<Request, UapiError> {
    let Some(body) = message.strip_suffix("\n\n") else {
        return Err(protocol("request does not end with an empty line"));
    };
    let mut lines = body.split('\n');
    match lines.next() {
        Some("get=1") => match lines.next() {
            None => Ok(Request::Get),
            Some(line) => Err(protocol(format!("unexpected line after get=1: {line:?}"))),
        },
        Some("set=1") => parse_set(lines).map(Request::Set),
        Some("stats=1") => match lines.next() {
            None => Ok(Request::Stats),
            Some(line) => Err(protocol(format!("unexpected line after stats=1: {line:?}"))),
        },
        Some(other) => Err(protocol(format!(
            "unknown operation {:?} (expected get=1 or set=1)",
            truncate(other)
        ))),
        None => Err(protocol("empty request")),
    }
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(64) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

fn parse_set<'a>(lines: impl Iterator<Item = &'a str>) -> Result<SetRequest, UapiError> {
    let mut set = SetRequest::default();
    for line in lines {
        let Some((key, value)) = line.split_once('=') else {
            return Err(protocol(format!("line without '=': {:?}", truncate(line))));
        };
        if value.is_empty() {
            return Err(invalid(key, "empty value"));
        }
        if key == "public_key" {
            let key =
                parse_hex_key(value).ok_or_else(|| invalid("public_key", "not 64 hex digits"))?;
            set.peers.push(PeerUpdate::new(PublicKey::from_bytes(key)));
            continue;
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
            let bytes = parse_hex_key(value).ok_or_else(|| invalid(key, "not 64 hex digits"))?;
            set.private_key = Some((bytes != [0u8; 32]).then(|| PrivateKey::from_bytes(bytes)));
        }
        "listen_port" => {
            set.listen_port = Some(value.parse().map_err(|_| {
                invalid(
                    key,
                    format!("{:?} is not a port (0-65535)", truncate(value)),
                )
            })?)
        }
        "fwmark" => {
            set.fwmark = Some(value.parse().map_err(|_| {
                invalid(key, format!("{:?} is not a 32-bit number", truncate(value)))
            })?)
        }
        "replace_peers" => set.replace_peers = parse_true(key, value)?,
        _ => return Err(protocol(format!("unknown device key {:?}", truncate(key)))),
    }
    Ok(())
}

fn parse_peer_key(peer: &mut PeerUpdate, key: &str, value: &str) -> Result<(), UapiError> {
    match key {
        "remove" => peer.remove = parse_true(key, value)?,
        "update_only" => peer.update_only = parse_true(key, value)?,
        "replace_allowed_ips" => peer.replace_allowed_ips = parse_true(key, value)?,
        "preshared_key" => {
            let bytes = parse_hex_key(value).ok_or_else(|| invalid(key, "not 64 hex digits"))?;
            peer.preshared_key =
                Some((bytes != [0u8; 32]).then(|| PresharedKey::from_bytes(bytes)));
        }
        "endpoint" => {
            peer.endpoint = Some(value.parse().map_err(|_| {
                invalid(
                    key,
                    format!(
                        "{:?} is not ADDRESS:PORT or [ADDRESS]:PORT",
                        truncate(value)
                    ),
                )
            })?)
        }
        "persistent_keepalive_interval" => {
            peer.persistent_keepalive = Some(value.parse().map_err(|_| {
                invalid(key, format!("{:?} is not 0-65535 seconds", truncate(value)))
            })?)
        }
        "allowed_ip" => {
            let net: IpNet = value
                .parse()
                .map_err(|_| invalid(key, format!("{:?} is not a CIDR", truncate(value))))?;
            peer.allowed_ips.push(net.trunc());
        }
        "protocol_version" => {
            if value != "1" {
                return Err(invalid(
                    key,
                    format!("version {:?} is not supported (only 1)", truncate(value)),
                ));
            }
        }
        _ => return Err(protocol(format!("unknown peer key {:?}", truncate(key)))),
    }
    Ok(())
}

fn parse_true(key: &str, value: &str) -> Result<bool, UapiError> {
    if value == "true" {
        Ok(true)
    } else {
        Err(invalid(
            key,
            format!("{:?} is not \"true\"", truncate(value)),
        ))
    }
}

/// What a `get` reports.
#[derive(Debug, Default)]
pub struct DeviceSnapshot {
    pub private_key: Option<PrivateKey>,
    pub listen_port: u16,
    pub fwmark: u32,
    pub peers: Vec<PeerSnapshot>,
}

#[derive(Debug)]
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

/// The reply to `get`, ending in `errno=0` and an empty line.
pub fn format_get(snapshot: &DeviceSnapshot) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    if let Some(key) = &snapshot.private_key {
        let _ = writeln!(out, "private_key={}", hex(key.as_bytes()));
    }
    let _ = writeln!(out, "listen_port={}", snapshot.listen_port);
    if snapshot.fwmark != 0 {
        let _ = writeln!(out, "fwmark={}", snapshot.fwmark);
    }
    for peer in &snapshot.peers {
        let _ = writeln!(out, "public_key={}", peer.public_key.to_hex());
        let psk = peer
            .preshared_key
            .as_ref()
            .map(|k| hex(k.as_bytes()))
            .unwrap_or_else(|| "0".repeat(64));
        let _ = writeln!(out, "preshared_key={psk}");
        let _ = writeln!(out, "protocol_version=1");
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

/// The reply to `stats=1`: one `key=value` line per counter, per worker, then `errno=0`.
/// Workers are numbered from 0; today there is one.
pub fn format_stats(workers: &[crate::Stats]) -> String {
    let mut out = String::new();
    for (i, s) in workers.iter().enumerate() {
        let _ = writeln!(out, "worker={i}");
        let _ = writeln!(out, "tx_packets={}", s.tx_packets);
        let _ = writeln!(out, "tx_bytes={}", s.tx_bytes);
        let _ = writeln!(out, "rx_packets={}", s.rx_packets);
        let _ = writeln!(out, "rx_bytes={}", s.rx_bytes);
        let _ = writeln!(out, "handshakes_sent={}", s.handshakes_sent);
        let _ = writeln!(out, "cookie_replies_sent={}", s.cookie_replies_sent);
        for reason in crate::DropReason::ALL {
            let _ = writeln!(out, "drop_{}={}", reason.name(), s.drops(*reason));
        }
    }
    out.push_str("errno=0\n\n");
    out
}

/// The reply to `set` (0 = success) or to a refused request.
pub fn format_errno(errno: i32) -> String {
    format!("errno={errno}\n\n")
}
