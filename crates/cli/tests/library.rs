//! The gateway as a library, in network namespaces this test creates: a gateway embedded in
//! this test process (site B) and a `tunneld up` (site A), peers added and changed through
//! the handle at run time, `wg show` against the embedded one, typed errors, and a shutdown
//! that leaves nothing behind.

mod common;

use common::*;
use tunneld::{Error, Gateway, PeerChange, PeerSettings, PrivateKey, Settings};
// `common::Gateway` is a `tunneld up` process; `Gateway` here is the library's.
type Daemon = common::Gateway;
use tunneld_testnet::{unique_name, NetNs};

/// Starts a gateway from `text` inside `ns` (its TUN device, sockets and threads live there).
fn start_in(ns: &NetNs, text: String, dir: &std::path::Path) -> Result<Gateway, Error> {
    let dir = dir.to_path_buf();
    ns.in_ns(move || Gateway::builder(Settings::from_toml(&text, &dir)?).start())
}

#[test]
fn an_embedded_gateway_takes_peers_at_run_time_and_answers_wg() {
    if !require_netns_and_wg("an_embedded_gateway_takes_peers_at_run_time_and_answers_wg") {
        return;
    }
    let (a, b) = two_sites();
    let (ka, kb) = (PrivateKey::generate(), PrivateKey::generate());
    let (ia, ib) = (unique_name("wg"), unique_name("wg"));
    let ga = Daemon::start(
        &a,
        &ia,
        &ka.to_base64(),
        &site_body(1, &kb.public_key().to_string(), "192.0.2.2:51820"),
    );

    step("start an embedded gateway in B with no peer");
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[interface]\nname = \"{ib}\"\nprivate_key = \"{}\"\nlisten_port = 51820\n\
         address = [\"10.77.0.2/24\", \"fd77::2/64\"]\n",
        *kb.to_base64()
    );
    let gb = start_in(&b, text, dir.path()).expect("the embedded gateway starts");
    assert_eq!(gb.interface_name(), Some(ib.as_str()));
    assert_eq!(gb.listen_port(), Some(51820));
    assert_eq!(gb.public_key(), Some(kb.public_key()));
    assert!(gb.peers().unwrap().is_empty());

    step("add site A as a peer through the handle");
    let a_peer = PeerSettings::new(ka.public_key())
        .endpoint("192.0.2.1:51820".parse().unwrap())
        .allowed_ip("10.77.0.1/32".parse().unwrap())
        .allowed_ip("fd77::1/128".parse().unwrap());
    gb.add_peer(a_peer.clone()).unwrap();
    match gb.add_peer(a_peer) {
        Err(Error::PeerExists(key)) => assert_eq!(key, ka.public_key()),
        other => panic!("adding the peer twice: {other:?}"),
    }
    ping(&b, "10.77.0.1");
    ping(&a, "10.77.0.2");
    ping(&a, "fd77::2");
    tcp_transfer(&a, &b, "10.77.0.2:5201".parse().unwrap(), 4 << 20);
    tcp_transfer(&b, &a, "[fd77::1]:5202".parse().unwrap(), 1 << 20);

    step("wg show against the embedded gateway");
    let dump = wg_dump(&b, &ib);
    assert_eq!(dump[0][2], "51820", "{dump:?}");
    assert_eq!(dump[1][0], ka.public_key().to_string(), "{dump:?}");
    assert!(latest_handshake(&b, &ib, &ka.public_key().to_string()) > 0);
    let peers = gb.peers().unwrap();
    assert_eq!(peers.len(), 1);
    assert!(peers[0].rx_bytes > 4 << 20 && peers[0].last_handshake.is_some());
    assert!(peers[0].preshared_key.is_none(), "no secrets handed out");
    let carried: usize = gb
        .worker_stats()
        .unwrap()
        .iter()
        .map(|w| w.carries.len())
        .sum();
    assert_eq!(carried, 1, "one worker carries the peer");

    step("widen the peer's allowed IPs: its route follows and its session stays");
    let before = latest_handshake(&b, &ib, &ka.public_key().to_string());
    let mut change = PeerChange::new(ka.public_key());
    change.allowed_ips = Some(vec![
        "10.77.0.1/32".parse().unwrap(),
        "fd77::1/128".parse().unwrap(),
        "10.99.0.0/16".parse().unwrap(),
    ]);
    gb.update_peer(change).unwrap();
    assert!(b
        .run(&["ip", "route", "show", "dev", &ib])
        .contains("10.99.0.0/16"));
    ping(&b, "10.77.0.1");
    assert_eq!(
        latest_handshake(&b, &ib, &ka.public_key().to_string()),
        before
    );

    step("errors name what is wrong");
    let stranger = PrivateKey::generate().public_key();
    assert!(matches!(gb.remove_peer(&stranger), Err(Error::UnknownPeer(k)) if k == stranger));
    assert!(matches!(
        gb.update_peer(PeerChange::new(stranger)),
        Err(Error::UnknownPeer(_))
    ));

    step("remove the peer: its routes go");
    gb.remove_peer(&ka.public_key()).unwrap();
    assert!(gb.peers().unwrap().is_empty());
    assert!(!b
        .run(&["ip", "route", "show", "dev", &ib])
        .contains("10.99.0.0/16"));

    step("shut down: the interface and the UAPI socket are gone, the handle says stopped");
    let other_handle = gb.clone();
    gb.shutdown().unwrap();
    assert!(
        other_handle.shutdown().is_ok(),
        "a second shutdown does nothing"
    );
    assert!(!socket_path(&ib).exists());
    assert!(!b.output(&["ip", "link", "show", &ib]).status.success());
    assert!(matches!(other_handle.peers(), Err(Error::Stopped)));
    drop(ga);
}

#[test]
fn a_settings_error_is_typed_names_the_field_and_leaves_nothing_running() {
    if !require_netns_and_wg("a_settings_error_is_typed_names_the_field_and_leaves_nothing_running")
    {
        return;
    }
    let b = NetNs::new();
    let dir = tempfile::tempdir().unwrap();
    let ib = unique_name("wg");
    let key = PrivateKey::generate();

    step("a field out of range, found when the text is read");
    let text = format!(
        "[interface]\nname = \"{ib}\"\nprivate_key = \"{}\"\nmtu = 70000\n\n\
         [[peer]]\npublic_key = \"{}\"\nallowed_ips = [\"10.0.0.300/32\"]\n",
        *key.to_base64(),
        PrivateKey::generate().public_key()
    );
    let err = Settings::from_toml(&text, dir.path()).unwrap_err();
    let fields: Vec<&str> = err
        .problems()
        .unwrap()
        .iter()
        .map(|p| p.field.as_str())
        .collect();
    assert!(fields.contains(&"interface.mtu"), "{err}");
    assert!(fields.contains(&"peer[0].allowed_ips[0]"), "{err}");
    assert!(
        !err.to_string().contains(&*key.to_base64()),
        "no secret in errors"
    );

    step("a field only the start can judge: more sub-tunnels than workers");
    let text = format!(
        "[interface]\nname = \"{ib}\"\nprivate_key = \"{}\"\n\n[dataplane]\nworkers = 1\n\n\
         [[peer]]\npublic_key = \"{}\"\nallowed_ips = [\"10.0.0.2/32\"]\nparallel = 2\n",
        *key.to_base64(),
        PrivateKey::generate().public_key()
    );
    let err = start_in(&b, text, dir.path()).unwrap_err();
    assert!(
        err.problems().unwrap()[0].field == "peer[0].parallel",
        "{err}"
    );
    assert!(!b.output(&["ip", "link", "show", &ib]).status.success());
    assert!(!socket_path(&ib).exists());

    step("a system error: the port is taken; nothing is left of the half-made interface");
    let holder = b.in_ns(|| std::net::UdpSocket::bind("0.0.0.0:51999").unwrap());
    let text = format!(
        "[interface]\nname = \"{ib}\"\nprivate_key = \"{}\"\nlisten_port = 51999\n",
        *key.to_base64()
    );
    let err = start_in(&b, text, dir.path()).unwrap_err();
    assert_eq!(
        err.io_kind(),
        Some(std::io::ErrorKind::AddrInUse),
        "{err:?}"
    );
    assert!(err.to_string().contains("51999"), "{err}");
    drop(holder);
    // The TUN device goes with its last queue; give the kernel a moment.
    wait_until("the interface is removed", || {
        !b.output(&["ip", "link", "show", &ib]).status.success()
    });
    assert!(!socket_path(&ib).exists());
}
