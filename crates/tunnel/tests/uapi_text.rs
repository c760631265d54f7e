//! The UAPI text protocol: what `wg` sends parses, what it reads is formatted exactly, and
//! no input makes the parser panic.

use std::time::Duration;
use tunneld_crypto::{PresharedKey, PrivateKey};
use tunneld_tunnel::uapi::{self, DeviceSnapshot, PeerSnapshot, Request};

fn hex_of(key: &tunneld_crypto::PublicKey) -> String {
    key.to_hex()
}

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
        tunneld_crypto::hex(PrivateKey::generate().as_bytes()),
        hex_of(&peer),
        tunneld_crypto::hex(psk.as_bytes()),
        hex_of(&PrivateKey::generate().public_key()),
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
        hex_of(&PrivateKey::generate().public_key())
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
    let mut stats = tunneld_tunnel::Stats::default();
    stats.drop(tunneld_tunnel::DropReason::NoRoute);
    stats.tx_packets = 3;
    let key = PrivateKey::generate().public_key();
    let text = uapi::format_stats(&[uapi::WorkerStats {
        stats,
        carries: vec![(key, Some(1)), (key, None)],
    }]);
    assert!(text.starts_with("worker=0\ntx_packets=3\n"), "{text}");
    assert!(
        text.contains(&format!("carries={}/1\n", hex_of(&key))),
        "{text}"
    );
    assert!(
        text.contains(&format!("carries={}\n", hex_of(&key))),
        "{text}"
    );
    assert!(text.contains("drop_no_route=1\n"), "{text}");
    assert!(text.ends_with("errno=0\n\n"));
}

#[test]
fn bad_requests_get_the_right_errno_and_name_the_key() {
    let peer = format!(
        "public_key={}\n",
        hex_of(&PrivateKey::generate().public_key())
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
        tunneld_crypto::hex(private.as_bytes()),
        peer.to_hex(),
        "0".repeat(64)
    );
    assert_eq!(uapi::format_get(&snapshot), expected);
    assert_eq!(uapi::format_errno(22), "errno=22\n\n");
    assert!(uapi::is_complete(b"get=1\n\n"));
    assert!(!uapi::is_complete(b"get=1\n"));
}

#[test]
fn truncated_and_mutated_requests_never_panic() {
    let valid = format!(
        "set=1\nprivate_key={}\npublic_key={}\nendpoint=[::1]:1\nallowed_ip=10.0.0.0/8\n\n",
        tunneld_crypto::hex(PrivateKey::generate().as_bytes()),
        hex_of(&PrivateKey::generate().public_key())
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
