//! The UAPI text protocol against what `wg set` sends and `wg show` reads, every refusal with
//! its errno and a line naming the key, and no panic on any input.

use std::net::SocketAddr;
use std::time::Duration;
use tunneld_crypto::{hex, PresharedKey, PrivateKey, PublicKey};
use tunneld_wireguard::uapi::{
    self, DeviceSnapshot, PeerSnapshot, PeerUpdate, Request, SetRequest,
};

const EINVAL: i32 = 22;
const EPROTO: i32 = 71;

fn peer_key(byte: u8) -> PublicKey {
    PublicKey::from_bytes([byte; 32])
}

fn set(message: &str) -> SetRequest {
    match uapi::parse_request(message) {
        Ok(Request::Set(set)) => set,
        other => panic!("{message:?}: {other:?}"),
    }
}

fn update(public_key: PublicKey) -> PeerUpdate {
    PeerUpdate::new(public_key)
}

#[test]
fn what_wg_set_sends_parses_to_the_request() {
    // The order `wg setconf` writes: device keys, then each peer's keys.
    let private = PrivateKey::from_bytes([0x11; 32]);
    let psk = PresharedKey::from_bytes([0x22; 32]);
    let message = format!(
        "set=1\nprivate_key={}\nlisten_port=51820\nfwmark=4294967295\nreplace_peers=true\n\
         public_key={}\npreshared_key={}\nendpoint=192.0.2.2:51820\npersistent_keepalive_interval=25\n\
         replace_allowed_ips=true\nallowed_ip=10.77.0.2/32\nallowed_ip=10.20.1.1/16\nallowed_ip=fd77::9/64\n\
         public_key={}\nupdate_only=true\nendpoint=[fe80::1%2]:51820\nprotocol_version=1\n\
         public_key={}\nremove=true\n\n",
        hex(private.as_bytes()),
        peer_key(0xaa).to_hex(),
        hex(psk.as_bytes()),
        peer_key(0xbb).to_hex(),
        peer_key(0xcc).to_hex(),
    );
    let expected = SetRequest {
        private_key: Some(Some(private)),
        listen_port: Some(51820),
        fwmark: Some(u32::MAX),
        replace_peers: true,
        peers: vec![
            PeerUpdate {
                preshared_key: Some(Some(psk)),
                endpoint: Some("192.0.2.2:51820".parse().unwrap()),
                persistent_keepalive: Some(25),
                replace_allowed_ips: true,
                // Truncated to their networks, as the kernel does.
                allowed_ips: vec![
                    "10.77.0.2/32".parse().unwrap(),
                    "10.20.0.0/16".parse().unwrap(),
                    "fd77::/64".parse().unwrap(),
                ],
                ..update(peer_key(0xaa))
            },
            PeerUpdate {
                update_only: true,
                endpoint: Some("[fe80::1%2]:51820".parse().unwrap()),
                ..update(peer_key(0xbb))
            },
            PeerUpdate {
                remove: true,
                ..update(peer_key(0xcc))
            },
        ],
    };
    assert_eq!(set(&message), expected);
    // Upper-case hex is accepted too.
    let upper = format!(
        "set=1\npublic_key={}\n\n",
        peer_key(0xab).to_hex().to_uppercase()
    );
    assert_eq!(set(&upper).peers[0].public_key, peer_key(0xab));
}

#[test]
fn an_empty_set_and_zero_keys() {
    assert_eq!(set("set=1\n\n"), SetRequest::default());
    let zero = "0".repeat(64);
    let s = set(&format!(
        "set=1\nprivate_key={zero}\nlisten_port=0\nfwmark=0\npublic_key={}\npreshared_key={zero}\n\n",
        peer_key(1).to_hex()
    ));
    assert_eq!(s.private_key, Some(None));
    assert_eq!(s.listen_port, Some(0));
    assert_eq!(s.fwmark, Some(0));
    assert_eq!(s.peers[0].preshared_key, Some(None));
    assert!(matches!(uapi::parse_request("get=1\n\n"), Ok(Request::Get)));
}

#[test]
fn refusals_carry_the_errno_and_name_the_key() {
    let peer = format!("public_key={}\n", peer_key(1).to_hex());
    for (message, errno, why) in [
        // Structure.
        ("get=1\n".to_string(), EPROTO, "request does not end with an empty line (it is incomplete)"),
        ("get=1".into(), EPROTO, "request does not end with an empty line (it is incomplete)"),
        ("\n".into(), EPROTO, "empty request (expected get=1 or set=1)"),
        ("\nget=1\n\n".into(), EPROTO, "empty line before the operation"),
        ("get=2\n\n".into(), EPROTO, "unknown operation \"get=2\" (expected get=1 or set=1)"),
        ("get=1\nlisten_port=1\n\n".into(), EPROTO, "get=1 takes no keys, got the line \"listen_port=1\""),
        ("get=1\n\nget=1\n\n".into(), EPROTO, "data after the empty line that ends the request"),
        ("set=1\nlisten_port=1\n\nfwmark=1\n\n".into(), EPROTO, "data after the empty line that ends the request"),
        ("set=1\nlisten_port\n\n".into(), EPROTO, "line without '=': \"listen_port\""),
        ("set=1\nwat=1\n\n".into(), EPROTO, "unknown device key \"wat\""),
        (format!("set=1\n{peer}wat=\n\n"), EPROTO, "unknown peer key \"wat\""),
        (format!("set=1\n{peer}listen_port=1\n\n"), EPROTO, "listen_port is a device key: it must come before the first public_key line"),
        ("set=1\nendpoint=192.0.2.1:1\n\n".into(), EPROTO, "endpoint is a peer key: it must follow a public_key line"),
        ("set=1\nListen_port=1\n\n".into(), EPROTO, "unknown device key \"Listen_port\""),
        // Values.
        ("set=1\nfwmark=\n\n".into(), EINVAL, "fwmark: empty value"),
        ("set=1\npublic_key=\n\n".into(), EINVAL, "public_key: empty value"),
        ("set=1\nlisten_port=65536\n\n".into(), EINVAL, "listen_port: \"65536\" is not a port 0-65535"),
        ("set=1\nlisten_port=+1\n\n".into(), EINVAL, "listen_port: \"+1\" is not a port 0-65535"),
        ("set=1\nlisten_port= 1\n\n".into(), EINVAL, "listen_port: \" 1\" is not a port 0-65535"),
        ("set=1\nfwmark=4294967296\n\n".into(), EINVAL, "fwmark: \"4294967296\" is not a number 0-4294967295"),
        ("set=1\nreplace_peers=false\n\n".into(), EINVAL, "replace_peers: \"false\" is not \"true\" (the only value it takes)"),
        ("set=1\nprivate_key=abc\n\n".into(), EINVAL, "private_key: not a key: expected 64 hex digits, got 3 characters"),
        ("set=1\npublic_key=zz\n\n".into(), EINVAL, "public_key: not a key: expected 64 hex digits, got 2 characters"),
        (format!("set=1\n{peer}remove=1\n\n"), EINVAL, "remove: \"1\" is not \"true\" (the only value it takes)"),
        (format!("set=1\n{peer}update_only=yes\n\n"), EINVAL, "update_only: \"yes\" is not \"true\" (the only value it takes)"),
        (format!("set=1\n{peer}replace_allowed_ips=TRUE\n\n"), EINVAL, "replace_allowed_ips: \"TRUE\" is not \"true\" (the only value it takes)"),
        (format!("set=1\n{peer}protocol_version=2\n\n"), EINVAL, "protocol_version: version \"2\" is not supported (only 1)"),
        (format!("set=1\n{peer}persistent_keepalive_interval=65536\n\n"), EINVAL, "persistent_keepalive_interval: \"65536\" is not 0-65535 seconds"),
        (format!("set=1\n{peer}allowed_ip=10.0.0.1\n\n"), EINVAL, "allowed_ip: \"10.0.0.1\" is not a CIDR (address/prefix)"),
        (format!("set=1\n{peer}allowed_ip=10.0.0.0/33\n\n"), EINVAL, "allowed_ip: \"10.0.0.0/33\" is not a CIDR (address/prefix)"),
        (format!("set=1\n{peer}endpoint=192.0.2.1\n\n"), EINVAL, "endpoint: \"192.0.2.1\": expected ADDRESS:PORT or [ADDRESS]:PORT"),
        (format!("set=1\n{peer}endpoint=[2001:db8::1]\n\n"), EINVAL, "endpoint: \"[2001:db8::1]\": expected ADDRESS:PORT or [ADDRESS]:PORT"),
        (format!("set=1\n{peer}endpoint=[2001:db8::1:51820\n\n"), EINVAL, "endpoint: \"[2001:db8::1:51820\": expected ADDRESS:PORT or [ADDRESS]:PORT"),
        (format!("set=1\n{peer}endpoint=2001:db8::1:51820\n\n"), EINVAL, "endpoint: \"2001:db8::1:51820\": IPv6 endpoints are written [address]:port"),
        (format!("set=1\n{peer}endpoint=[fe80::1%eth0]:51820\n\n"), EINVAL, "endpoint: \"[fe80::1%eth0]:51820\": the zone after `%` must be an interface index (a number)"),
        (format!("set=1\n{peer}endpoint=example.org:51820\n\n"), EINVAL, "endpoint: \"example.org:51820\": expected ADDRESS:PORT or [ADDRESS]:PORT"),
    ] {
        match uapi::parse_request(&message) {
            Ok(r) => panic!("{message:?} accepted: {r:?}"),
            Err(e) => {
                assert_eq!((e.errno, e.to_string().as_str()), (errno, why), "{message:?}");
            }
        }
    }
}

#[test]
fn errors_never_show_a_secret_key() {
    let secret = format!("{}x", "7".repeat(63));
    for message in [
        format!("set=1\nprivate_key={secret}\n\n"),
        format!("set=1\nprivate_key={secret}7\n\n"),
        format!(
            "set=1\npublic_key={}\npreshared_key={secret}\n\n",
            peer_key(1).to_hex()
        ),
    ] {
        let e = uapi::parse_request(&message).unwrap_err();
        assert_eq!(e.errno, EINVAL);
        assert!(!e.message.contains(&secret[..32]), "{e}");
    }
}

#[test]
fn wg_show_reads_back_what_get_writes() {
    let snapshot = DeviceSnapshot {
        private_key: Some(PrivateKey::from_bytes([3; 32])),
        listen_port: 0,
        fwmark: 0,
        peers: vec![PeerSnapshot {
            public_key: peer_key(4),
            preshared_key: None,
            endpoint: Some("[fe80::1%7]:51820".parse().unwrap()),
            last_handshake: Some(Duration::from_millis(1_700_000_000_250)),
            tx_bytes: u64::MAX,
            rx_bytes: 1,
            persistent_keepalive: 0,
            allowed_ips: vec!["0.0.0.0/0".parse().unwrap(), "::/0".parse().unwrap()],
        }],
    };
    let text = uapi::format_get(&snapshot);
    assert!(text.ends_with("\nerrno=0\n\n"), "{text}");
    assert!(uapi::is_complete(text.as_bytes()));
    // Every line is key=value, in the order wg reads them; unset port and fwmark are left out.
    let keys: Vec<&str> = text
        .lines()
        .take_while(|l| !l.is_empty())
        .map(|l| l.split_once('=').map_or(l, |(k, _)| k))
        .collect();
    assert_eq!(
        keys,
        [
            "private_key",
            "public_key",
            "preshared_key",
            "protocol_version",
            "endpoint",
            "last_handshake_time_sec",
            "last_handshake_time_nsec",
            "tx_bytes",
            "rx_bytes",
            "persistent_keepalive_interval",
            "allowed_ip",
            "allowed_ip",
            "errno",
        ]
    );
    assert!(text.contains("\nendpoint=[fe80::1%7]:51820\n"), "{text}");
    assert!(
        text.contains("\nlast_handshake_time_sec=1700000000\nlast_handshake_time_nsec=250000000\n")
    );
    assert!(text.contains(&format!("\ntx_bytes={}\n", u64::MAX)));
    assert!(text.contains("\nallowed_ip=0.0.0.0/0\nallowed_ip=::/0\n"));
    // The endpoint `get` writes is one `set` accepts.
    let endpoint: SocketAddr = "[fe80::1%7]:51820".parse().unwrap();
    let s = set(&format!(
        "set=1\npublic_key={}\nendpoint={endpoint}\n\n",
        peer_key(4).to_hex()
    ));
    assert_eq!(s.peers[0].endpoint, Some(endpoint));
    assert_eq!(uapi::format_errno(0), "errno=0\n\n");
    assert_eq!(uapi::format_errno(EPROTO), "errno=71\n\n");
}

/// A small deterministic generator, so that a failure can be replayed.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[test]
fn truncated_and_mutated_requests_never_panic() {
    let valid = format!(
        "set=1\nprivate_key={}\nlisten_port=51820\nfwmark=1\nreplace_peers=true\npublic_key={}\n\
         preshared_key={}\nendpoint=[2001:db8::1%3]:51820\npersistent_keepalive_interval=25\n\
         replace_allowed_ips=true\nallowed_ip=10.0.0.0/8\nallowed_ip=fd00::/64\nprotocol_version=1\n\
         public_key={}\nremove=true\n\n",
        hex(&[1; 32]),
        peer_key(2).to_hex(),
        hex(&[3; 32]),
        peer_key(4).to_hex(),
    );
    assert!(uapi::parse_request(&valid).is_ok());
    let check = |text: &str| {
        if let Err(e) = uapi::parse_request(text) {
            assert!(e.errno == EINVAL || e.errno == EPROTO, "{text:?}: {e:?}");
            assert!(!e.message.is_empty() && !e.message.contains('\n'), "{e:?}");
        }
        let _ = uapi::is_complete(text.as_bytes());
    };
    // Every truncation, and every single-character replacement with a character that matters.
    let specials = [
        "", "=", "\n", "\n\n", "[", "]", "%", ":", "/", "0", "f", "é", "\u{0}",
    ];
    for cut in (0..=valid.len()).filter(|i| valid.is_char_boundary(*i)) {
        check(&valid[..cut]);
        check(&format!("{}\n\n", &valid[..cut]));
        let next = valid[cut..]
            .chars()
            .next()
            .map_or(cut, |c| cut + c.len_utf8());
        for s in specials {
            check(&format!("{}{s}{}", &valid[..cut], &valid[next..]));
        }
    }
    // Random multi-point mutations: splices of other lines, duplicated and dropped ranges.
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let bytes = valid.as_bytes();
    for _ in 0..20_000 {
        let mut m = bytes.to_vec();
        for _ in 0..=rng.below(4) {
            let at = rng.below(m.len());
            match rng.below(4) {
                0 => m[at] = rng.below(256) as u8,
                1 => {
                    let end = (at + rng.below(16)).min(m.len());
                    m.drain(at..end);
                }
                2 => {
                    let from = rng.below(bytes.len());
                    let end = (from + rng.below(40)).min(bytes.len());
                    let piece = bytes[from..end].to_vec();
                    m.splice(at..at, piece);
                }
                _ => m.insert(at, b"=\n:[]%/"[rng.below(7)]),
            }
            if m.is_empty() {
                break;
            }
        }
        check(&String::from_utf8_lossy(&m));
    }
}

// What was tests/uapi_text.rs (the first suite of the parser), merged here: its requests
// and replies differ from the ones above, so every assertion of it stays.

#[test]
fn a_full_set_request_parses() {
    let peer = PrivateKey::generate().public_key();
    let psk = PresharedKey::generate();
    let msg = format!(
        "set=1\nprivate_key={}\nlisten_port=51820\nfwmark=7\nreplace_peers=true\n\
         public_key={}\npreshared_key={}\nendpoint=[2001:db8::1]:51820\n\
         persistent_keepalive_interval=25\nreplace_allowed_ips=true\n\
         allowed_ip=10.0.0.1/24\nallowed_ip=fd00::/64\nprotocol_version=1\n\
         public_key={}\nremove=true\n\n",
        hex(PrivateKey::generate().as_bytes()),
        peer.to_hex(),
        hex(psk.as_bytes()),
        PrivateKey::generate().public_key().to_hex(),
    );
    let Request::Set(set) = uapi::parse_request(&msg).unwrap() else {
        panic!("not a set");
    };
    assert!(matches!(set.private_key, Some(Some(_))));
    assert_eq!(set.listen_port, Some(51820));
    assert_eq!(set.fwmark, Some(7));
    assert!(set.replace_peers);
    assert_eq!(set.peers.len(), 2);
    let p = &set.peers[0];
    assert_eq!(p.public_key, peer);
    assert_eq!(p.preshared_key, Some(Some(psk)));
    assert_eq!(p.endpoint, Some("[2001:db8::1]:51820".parse().unwrap()));
    assert_eq!(p.persistent_keepalive, Some(25));
    assert!(p.replace_allowed_ips);
    // Truncated to the network.
    assert_eq!(p.allowed_ips[0].to_string(), "10.0.0.0/24");
    assert!(set.peers[1].remove);
}

#[test]
fn zero_keys_mean_remove() {
    let zero = "0".repeat(64);
    let msg = format!(
        "set=1\nprivate_key={zero}\npublic_key={}\npreshared_key={zero}\n\n",
        PrivateKey::generate().public_key().to_hex()
    );
    let Request::Set(set) = uapi::parse_request(&msg).unwrap() else {
        panic!()
    };
    assert!(matches!(set.private_key, Some(None)));
    assert!(matches!(set.peers[0].preshared_key, Some(None)));
}

#[test]
fn get_and_stats_parse() {
    assert!(matches!(uapi::parse_request("get=1\n\n"), Ok(Request::Get)));
    assert!(matches!(
        uapi::parse_request("stats=1\n\n"),
        Ok(Request::Stats)
    ));
    let mut stats = tunneld_wireguard::Stats::default();
    stats.drop(tunneld_wireguard::DropReason::NoRoute);
    stats.tx_packets = 3;
    let key = PrivateKey::generate().public_key();
    let text = uapi::format_stats(&[uapi::WorkerStats {
        stats,
        carries: vec![(key, Some(1)), (key, None)],
    }]);
    assert!(text.starts_with("worker=0\ntx_packets=3\n"), "{text}");
    assert!(
        text.contains(&format!("carries={}/1\n", key.to_hex())),
        "{text}"
    );
    assert!(
        text.contains(&format!("carries={}\n", key.to_hex())),
        "{text}"
    );
    assert!(text.contains("drop_no_route=1\n"), "{text}");
    assert!(text.ends_with("errno=0\n\n"));
}

#[test]
fn bad_requests_get_the_right_errno_and_name_the_key() {
    let peer = format!(
        "public_key={}\n",
        PrivateKey::generate().public_key().to_hex()
    );
    for (msg, errno, needle) in [
        ("get=1\n".to_string(), 71, "empty line"),
        ("frob=1\n\n".into(), 71, "unknown operation"),
        ("set=1\nwat=1\n\n".into(), 71, "unknown device key"),
        (format!("set=1\n{peer}wat=1\n\n"), 71, "unknown peer key"),
        ("set=1\nlisten_port=70000\n\n".into(), 22, "listen_port"),
        ("set=1\nprivate_key=abc\n\n".into(), 22, "private_key"),
        ("set=1\npublic_key=zz\n\n".into(), 22, "public_key"),
        (format!("set=1\n{peer}endpoint=1.2.3.4\n\n"), 22, "endpoint"),
        (
            format!("set=1\n{peer}allowed_ip=1.2.3.4/40\n\n"),
            22,
            "allowed_ip",
        ),
        (format!("set=1\n{peer}remove=yes\n\n"), 22, "remove"),
        (
            format!("set=1\n{peer}protocol_version=2\n\n"),
            22,
            "protocol_version",
        ),
        (
            format!("set=1\n{peer}persistent_keepalive_interval=-1\n\n"),
            22,
            "persistent",
        ),
        ("set=1\nnoequals\n\n".into(), 71, "without '='"),
        ("set=1\nfwmark=\n\n".into(), 22, "empty value"),
    ] {
        let err = uapi::parse_request(&msg).expect_err(&msg);
        assert_eq!(err.errno, errno, "{msg:?}: {err}");
        assert!(err.message.contains(needle), "{msg:?}: {err}");
    }
}

#[test]
fn get_reply_has_exactly_the_lines_wg_reads() {
    let private = PrivateKey::generate();
    let peer = PrivateKey::generate().public_key();
    let snapshot = DeviceSnapshot {
        private_key: Some(private.clone()),
        listen_port: 51820,
        fwmark: 0,
        peers: vec![PeerSnapshot {
            public_key: peer,
            preshared_key: None,
            endpoint: Some("192.0.2.2:51820".parse().unwrap()),
            last_handshake: Some(Duration::new(1_700_000_000, 5)),
            tx_bytes: 10,
            rx_bytes: 20,
            persistent_keepalive: 25,
            allowed_ips: vec!["10.0.0.0/24".parse().unwrap(), "fd00::/64".parse().unwrap()],
        }],
    };
    let expected = format!(
        "private_key={}\nlisten_port=51820\npublic_key={}\npreshared_key={}\nprotocol_version=1\n\
         endpoint=192.0.2.2:51820\nlast_handshake_time_sec=1700000000\nlast_handshake_time_nsec=5\n\
         tx_bytes=10\nrx_bytes=20\npersistent_keepalive_interval=25\nallowed_ip=10.0.0.0/24\n\
         allowed_ip=fd00::/64\nerrno=0\n\n",
        hex(private.as_bytes()),
        peer.to_hex(),
        "0".repeat(64)
    );
    assert_eq!(uapi::format_get(&snapshot), expected);
    assert_eq!(uapi::format_errno(22), "errno=22\n\n");
    assert!(uapi::is_complete(b"get=1\n\n"));
    assert!(!uapi::is_complete(b"get=1\n"));
}

#[test]
fn requests_cut_at_every_byte_or_given_unicode_never_panic() {
    let valid = format!(
        "set=1\nprivate_key={}\npublic_key={}\nendpoint=[::1]:1\nallowed_ip=10.0.0.0/8\n\n",
        hex(PrivateKey::generate().as_bytes()),
        PrivateKey::generate().public_key().to_hex()
    );
    for cut in 0..valid.len() {
        let _ = uapi::parse_request(&valid[..cut]);
        let mut m = valid.clone().into_bytes();
        m[cut] = m[cut].wrapping_add(1);
        if let Ok(text) = String::from_utf8(m) {
            let _ = uapi::parse_request(&text);
        }
        let mut with_unicode = valid.clone();
        with_unicode.insert(cut, 'é');
        let _ = uapi::parse_request(&with_unicode);
    }
}
