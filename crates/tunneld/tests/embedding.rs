//! A gateway's events and readiness (`Gateway::events`, `Gateway::wait_ready`), against
//! another tunneld gateway and against wireguard-go, each in a network namespace of its
//! own joined by a veth pair (192.0.2.1 here, 192.0.2.2 there).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;
use tunneld::{
    Error, Event, Gateway, GatewayEvents, PeerChange, PeerSettings, PrivateKey, Settings,
};
use tunneld_testnet::{require_netns, require_tool, unique_name, veth, write_private, NetNs};

/// Both tests bring up two sites; one at a time keeps them off each other's CPU.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A gateway in `ns`: `address` on its interface, one peer.
fn gateway(ns: &NetNs, key: &PrivateKey, address: &str, peer: &str) -> Gateway {
    let text = format!(
        "[interface]\nname = \"{}\"\nprivate_key = \"{}\"\nlisten_port = 51820\n\
         address = [\"{address}\"]\n\n[[peer]]\n{peer}\n",
        unique_name("wg"),
        *key.to_base64()
    );
    ns.in_ns(move || Gateway::builder(Settings::from_toml(&text, ".")?).start())
        .unwrap_or_else(|e| panic!("the gateway did not start: {e}"))
}

/// Takes events until one matches (returned); all taken are appended to `seen`.
fn wait_event(
    events: &GatewayEvents,
    seen: &mut Vec<Event>,
    what: &str,
    wanted: impl Fn(&Event) -> bool,
) -> Event {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match events.recv_timeout(left) {
            Ok(Some(event)) => {
                seen.push(event.clone());
                if wanted(&event) {
                    return event;
                }
            }
            Ok(None) => panic!("the events ended before {what}: {seen:?}"),
            Err(()) => panic!("no event for {what} in 30 s: {seen:?}"),
        }
    }
}

/// `seen` has events matching `steps` in that order (others may come between).
fn assert_order(seen: &[Event], steps: &[&dyn Fn(&Event) -> bool]) {
    let mut at = 0;
    for (n, step) in steps.iter().enumerate() {
        match seen[at..].iter().position(step) {
            Some(k) => at += k + 1,
            None => panic!("step {n} of the expected order not found after event {at}: {seen:?}"),
        }
    }
}

/// A TCP exchange from `from` to `to` through the tunnel (a listener in `server_ns`).
fn tcp_through(from: &NetNs, server_ns: &NetNs, to: SocketAddr) {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let server = server_ns.spawn_in_ns(move || {
        let listener = std::net::TcpListener::bind(to).unwrap();
        ready_tx.send(()).unwrap();
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).unwrap();
        s.write_all(&buf).unwrap();
    });
    ready_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    from.in_ns(move || {
        let mut s = std::net::TcpStream::connect_timeout(&to, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("connect {to}: {e}"));
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"hello").unwrap();
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hello");
    });
    server.join().unwrap();
}

#[test]
fn gateway_events_and_readiness_against_a_tunneld_gateway() {
    let _serial = one_at_a_time();
    if !require_netns("gateway_events_and_readiness_against_a_tunneld_gateway") {
        return;
    }
    let (near, far) = (NetNs::new(), NetNs::new());
    let (_, far_if) = veth(&near, "192.0.2.1/24", &far, "192.0.2.2/24");
    let (near_key, far_key) = (PrivateKey::generate(), PrivateKey::generate());
    let (near_pub, far_pub) = (near_key.public_key(), far_key.public_key());
    let a = gateway(
        &near,
        &near_key,
        "10.60.0.1/24",
        &format!("public_key = \"{far_pub}\"\nendpoint = \"192.0.2.2:51820\"\nallowed_ips = [\"10.60.0.2/32\"]"),
    );
    // The far side has no endpoint for us: it learns it from our handshake.
    let b = gateway(
        &far,
        &far_key,
        "10.60.0.2/24",
        &format!("public_key = \"{near_pub}\"\nallowed_ips = [\"10.60.0.1/32\"]"),
    );
    let (a_events, b_events) = (a.events().unwrap(), b.events().unwrap());
    let (mut seen, mut b_seen) = (Vec::new(), Vec::new());

    a.wait_ready(&far_pub, Duration::from_secs(15)).unwrap();
    a.wait_ready(&far_pub, Duration::ZERO)
        .expect("ready stays ready");
    wait_event(
        &a_events,
        &mut seen,
        "the handshake",
        |e| matches!(e, Event::HandshakeCompleted { peer, .. } if *peer == far_pub),
    );
    let learnt = wait_event(
        &b_events,
        &mut b_seen,
        "the far side learning our endpoint",
        |e| matches!(e, Event::EndpointChanged { peer, .. } if *peer == near_pub),
    );
    assert_eq!(
        learnt,
        Event::EndpointChanged {
            peer: near_pub,
            endpoint: "192.0.2.1:51820".parse().unwrap()
        }
    );
    tcp_through(&near, &far, "10.60.0.2:7000".parse().unwrap());

    // A peer nobody answers for: a failed handshake after 5 s.
    let nobody = PrivateKey::generate().public_key();
    a.add_peer(
        PeerSettings::new(nobody)
            .endpoint("192.0.2.2:51999".parse().unwrap())
            .allowed_ip("10.61.0.0/24".parse().unwrap())
            .persistent_keepalive(1),
    )
    .unwrap();
    let failed = wait_event(
        &a_events,
        &mut seen,
        "a failed handshake",
        |e| matches!(e, Event::HandshakeFailed { peer, .. } if *peer == nobody),
    );
    assert!(
        matches!(failed, Event::HandshakeFailed { waited, .. } if waited >= tunneld::HANDSHAKE_FAILED_AFTER)
    );
    assert!(matches!(
        a.wait_ready(&nobody, Duration::from_millis(300)),
        Err(Error::TimedOut(_))
    ));

    // The far peer's endpoint moves to another address of the far site.
    far.run(&["ip", "addr", "add", "192.0.2.3/24", "dev", &far_if]);
    let moved: SocketAddr = "192.0.2.3:51820".parse().unwrap();
    let mut change = PeerChange::new(far_pub);
    change.endpoint = Some(moved);
    a.update_peer(change).unwrap();
    wait_event(&a_events, &mut seen, "the endpoint moved", |e| {
        *e == Event::EndpointChanged {
            peer: far_pub,
            endpoint: moved,
        }
    });
    tcp_through(&near, &far, "10.60.0.2:7001".parse().unwrap());

    a.remove_peer(&nobody).unwrap();
    wait_event(&a_events, &mut seen, "the peer removed", |e| {
        *e == Event::PeerRemoved { peer: nobody }
    });
    assert!(matches!(
        a.wait_ready(&nobody, Duration::from_secs(1)),
        Err(Error::UnknownPeer(k)) if k == nobody
    ));

    a.shutdown().unwrap();
    while let Ok(Some(event)) = a_events.recv_timeout(Duration::from_secs(10)) {
        seen.push(event);
    }
    assert_eq!(seen.last(), Some(&Event::Stopped), "{seen:?}");
    assert_eq!(a_events.recv_timeout(Duration::from_secs(1)), Ok(None));
    assert_order(
        &seen,
        &[
            &|e| matches!(e, Event::HandshakeCompleted { peer, .. } if *peer == far_pub),
            &|e| *e == Event::PeerAdded { peer: nobody },
            &|e| matches!(e, Event::HandshakeFailed { peer, .. } if *peer == nobody),
            &|e| matches!(e, Event::EndpointChanged { endpoint, .. } if *endpoint == moved),
            &|e| *e == Event::PeerRemoved { peer: nobody },
            &|e| *e == Event::Stopped,
        ],
    );
    assert!(matches!(
        a.wait_ready(&far_pub, Duration::from_secs(1)),
        Err(Error::Stopped)
    ));
    assert_eq!(a.events().unwrap().recv(), Some(Event::Stopped));
    b.shutdown().unwrap();
}

#[test]
fn gateway_events_and_readiness_against_wireguard_go() {
    let _serial = one_at_a_time();
    let test = "gateway_events_and_readiness_against_wireguard_go";
    if !require_netns(test) || !require_tool(test, "wg") || !require_tool(test, "wireguard-go") {
        return;
    }
    let (near, far) = (NetNs::new(), NetNs::new());
    veth(&near, "192.0.2.1/24", &far, "192.0.2.2/24");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let (near_key, far_key) = (PrivateKey::generate(), PrivateKey::generate());
    let far_pub = far_key.public_key();
    let ifname = unique_name("wg");
    let mut child = tunneld_testnet::start_wireguard_go(&far, &ifname, &dir.join("wg-go.log"));
    let _stop = StopOnDrop(&mut child, ifname.clone());
    let key_file = write_private(&dir, "far.key", &far_key.to_base64());
    far.run(&[
        "wg",
        "set",
        &ifname,
        "private-key",
        &key_file.to_string_lossy(),
        "listen-port",
        "51820",
        "peer",
        &near_key.public_key().to_base64(),
        "allowed-ips",
        "10.60.0.1/32",
    ]);
    far.run(&["ip", "addr", "add", "10.60.0.2/24", "dev", &ifname]);
    far.run(&["ip", "link", "set", &ifname, "up"]);
    let a = gateway(
        &near,
        &near_key,
        "10.60.0.1/24",
        &format!("public_key = \"{far_pub}\"\nendpoint = \"192.0.2.2:51820\"\nallowed_ips = [\"10.60.0.2/32\"]"),
    );
    let events = a.events().unwrap();
    let mut seen = Vec::new();
    a.wait_ready(&far_pub, Duration::from_secs(15)).unwrap();
    wait_event(
        &events,
        &mut seen,
        "the handshake",
        |e| matches!(e, Event::HandshakeCompleted { peer, .. } if *peer == far_pub),
    );
    tcp_through(&near, &far, "10.60.0.2:7000".parse().unwrap());

    // A preshared key on both sides: a new session, reported as a new handshake.
    let psk = tunneld::PresharedKey::generate();
    let psk_file = write_private(&dir, "psk", &psk.to_base64());
    far.run(&[
        "wg",
        "set",
        &ifname,
        "peer",
        &near_key.public_key().to_base64(),
        "preshared-key",
        &psk_file.to_string_lossy(),
    ]);
    let mut change = PeerChange::new(far_pub);
    change.preshared_key = Some(Some(psk));
    a.update_peer(change).unwrap();
    tcp_through(&near, &far, "10.60.0.2:7001".parse().unwrap());
    wait_event(
        &events,
        &mut seen,
        "the handshake with the new key",
        |e| matches!(e, Event::HandshakeCompleted { peer, .. } if *peer == far_pub),
    );
    a.shutdown().unwrap();
    while let Ok(Some(event)) = events.recv_timeout(Duration::from_secs(10)) {
        seen.push(event);
    }
    assert_order(
        &seen,
        &[
            &|e| matches!(e, Event::HandshakeCompleted { peer, .. } if *peer == far_pub),
            &|e| matches!(e, Event::HandshakeCompleted { peer, .. } if *peer == far_pub),
            &|e| *e == Event::Stopped,
        ],
    );
    assert_eq!(seen.last(), Some(&Event::Stopped));
}

/// Stops wireguard-go (and removes its UAPI socket) when the test ends, also on failure.
struct StopOnDrop<'a>(&'a mut std::process::Child, String);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        tunneld_testnet::stop_process(self.0);
        let _ = std::fs::remove_file(tunneld_testnet::uapi_socket_path(&self.1));
    }
}

/// `examples/embedded_gateway.rs`, run as a user would, against a gateway in another
/// namespace: it adds the peer, is told the handshake is done, and stops on SIGTERM.
#[test]
fn the_embedded_gateway_example_reports_events_and_stops_on_sigterm() {
    let _serial = one_at_a_time();
    if !require_netns("the_embedded_gateway_example_reports_events_and_stops_on_sigterm") {
        return;
    }
    // `cargo test` builds the examples beside the tests' directory.
    let exe = std::env::current_exe().unwrap();
    let example = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples/embedded_gateway");
    assert!(example.is_file(), "{} is missing", example.display());
    let (near, far) = (NetNs::new(), NetNs::new());
    veth(&near, "192.0.2.1/24", &far, "192.0.2.2/24");
    let (near_key, far_key) = (PrivateKey::generate(), PrivateKey::generate());
    let b = gateway(
        &far,
        &far_key,
        "10.60.0.2/24",
        &format!(
            "public_key = \"{}\"\nallowed_ips = [\"10.60.0.1/32\"]",
            near_key.public_key()
        ),
    );
    let tmp = tempfile::tempdir().unwrap();
    write_private(tmp.path(), "near.key", &near_key.to_base64());
    let config = tmp.path().join("near.toml");
    std::fs::write(
        &config,
        format!(
            "[interface]\nname = \"{}\"\nprivate_key_file = \"near.key\"\nlisten_port = 51820\n\
             address = [\"10.60.0.1/24\"]\n",
            unique_name("wg")
        ),
    )
    .unwrap();
    let out_path = tmp.path().join("out.txt");
    let mut child = near
        .command(example.to_str().unwrap())
        .arg(&config)
        .arg(far_key.public_key().to_string())
        .arg("192.0.2.2:51820")
        .arg("10.60.0.2/32")
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let output = || std::fs::read_to_string(&out_path).unwrap_or_default();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !output().contains("handshake done") {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the example exited ({status}):\n{}", output());
        }
        if std::time::Instant::now() > deadline {
            tunneld_testnet::stop_process(&mut child);
            panic!("no handshake reported in 30 s:\n{}", output());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    tcp_through(&far, &near, "10.60.0.1:7000".parse().unwrap());
    // SIGTERM, as systemd stops a service.
    unsafe_free_kill(&child);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            tunneld_testnet::stop_process(&mut child);
            panic!("the example did not stop on SIGTERM:\n{}", output());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = output();
    assert!(status.success(), "{status}:\n{text}");
    assert!(text.contains("stopping: signal"), "{text}");
    assert!(
        text.contains("received"),
        "the peers' state once ready:\n{text}"
    );
    b.shutdown().unwrap();
}

/// Sends SIGTERM with the `kill` command (the test crate has no unsafe code).
fn unsafe_free_kill(child: &std::process::Child) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// A gateway built from typed settings (no TOML written by the program) carries traffic
/// with a gateway built from a file's text; typed settings are refused with the same
/// field names a file's are.
#[test]
fn a_gateway_from_typed_settings_works_and_is_checked_like_a_file() {
    let _serial = one_at_a_time();
    // Checks need no privileges.
    let key = PrivateKey::generate();
    let err = Settings::builder("wg-typed", key.clone())
        .mtu(1)
        .peer(PeerSettings::new(PrivateKey::generate().public_key()).persistent_keepalive(25))
        .build()
        .unwrap_err();
    let fields: Vec<&str> = err
        .problems()
        .unwrap()
        .iter()
        .map(|p| p.field.as_str())
        .collect();
    assert!(fields.contains(&"interface.mtu"), "{err}");
    let twice = PrivateKey::generate().public_key();
    let err = Settings::builder("wg-typed", key.clone())
        .peer(PeerSettings::new(twice))
        .peer(PeerSettings::new(twice))
        .build()
        .unwrap_err();
    assert!(
        err.problems().unwrap()[0].field.starts_with("peer[1]"),
        "{err}"
    );
    let err = Settings::builder("bad name with spaces", key.clone())
        .build()
        .unwrap_err();
    assert_eq!(err.problems().unwrap()[0].field, "interface.name", "{err}");
    assert!(
        !err.to_string().contains(key.to_base64().as_str()),
        "the key never shows"
    );

    if !require_netns("a_gateway_from_typed_settings_works_and_is_checked_like_a_file") {
        return;
    }
    let (near, far) = (NetNs::new(), NetNs::new());
    veth(&near, "192.0.2.1/24", &far, "192.0.2.2/24");
    let far_key = PrivateKey::generate();
    let psk = tunneld::PresharedKey::generate();
    let settings = Settings::builder(unique_name("wg"), key.clone())
        .listen_port(51820)
        .address("10.60.0.1/24".parse().unwrap())
        .mtu(1400)
        .workers(1)
        .peer(
            PeerSettings::new(far_key.public_key())
                .endpoint("192.0.2.2:51820".parse().unwrap())
                .allowed_ip("10.60.0.2/32".parse().unwrap())
                .preshared_key(psk.clone()),
        )
        .build()
        .unwrap();
    let a = near
        .in_ns(move || Gateway::builder(settings).start())
        .unwrap();
    let b = gateway(
        &far,
        &far_key,
        "10.60.0.2/24",
        &format!(
            "public_key = \"{}\"\npreshared_key = \"{}\"\nallowed_ips = [\"10.60.0.1/32\"]",
            key.public_key(),
            *psk.to_base64()
        ),
    );
    a.wait_ready(&far_key.public_key(), Duration::from_secs(15))
        .unwrap();
    tcp_through(&near, &far, "10.60.0.2:7000".parse().unwrap());
    let ifname = a.interface_name().unwrap().to_string();
    let mtu = near.run(&["cat", &format!("/sys/class/net/{ifname}/mtu")]);
    assert_eq!(mtu.trim(), "1400");
    a.shutdown().unwrap();
    b.shutdown().unwrap();
}

/// Where the system refuses, the error carries its kind: a port taken is `AddrInUse`,
/// no `CAP_NET_ADMIN` is `PermissionDenied`, and nothing is left behind.
#[test]
fn system_refusals_carry_their_io_error_kind() {
    let _serial = one_at_a_time();
    if !require_netns("system_refusals_carry_their_io_error_kind") {
        return;
    }
    let ns = NetNs::new();
    let name = unique_name("wg");
    let typed = |name: &str| {
        Settings::builder(name, PrivateKey::generate())
            .listen_port(51999)
            .build()
            .unwrap()
    };
    let holder = ns.in_ns(|| std::net::UdpSocket::bind("0.0.0.0:51999").unwrap());
    let settings = typed(&name);
    let err = ns
        .in_ns(move || Gateway::builder(settings).start())
        .unwrap_err();
    assert_eq!(
        err.io_kind(),
        Some(std::io::ErrorKind::AddrInUse),
        "{err:?}"
    );
    assert!(matches!(err, Error::Io { .. }));
    assert!(err.to_string().contains("51999"), "{err}");
    drop(holder);

    // Capabilities belong to threads: this one drops CAP_NET_ADMIN and tries.
    let settings = typed(&name);
    let err = ns
        .in_ns(move || {
            caps::clear(None, caps::CapSet::Effective).unwrap();
            Gateway::builder(settings).start()
        })
        .unwrap_err();
    assert_eq!(
        err.io_kind(),
        Some(std::io::ErrorKind::PermissionDenied),
        "{err:?}"
    );
    tunneld_testnet::wait_until("no interface is left", || {
        !ns.output(&["ip", "link", "show", &name]).status.success()
    });
}
