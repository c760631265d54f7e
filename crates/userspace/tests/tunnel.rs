//! The tunnel's own behaviour: settings errors (no privileges needed) and shutdown.

mod common;

use common::*;
use std::io;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tunneld_userspace::{Error, PeerSettings, PrivateKey, Tunnel, TunnelSettings};

fn valid() -> TunnelSettings {
    TunnelSettings::new(PrivateKey::generate())
        .listen("127.0.0.1:0".parse().unwrap())
        .address("10.77.0.1/24".parse().unwrap())
}

fn start_err(settings: TunnelSettings) -> Error {
    match Tunnel::start(settings) {
        Ok(_) => panic!("started with bad settings"),
        Err(e) => e,
    }
}

/// `valid()` changed by `change`.
fn with(change: impl FnOnce(&mut TunnelSettings)) -> TunnelSettings {
    let mut settings = valid();
    change(&mut settings);
    settings
}

#[test]
fn settings_have_documented_defaults() {
    let key = PrivateKey::generate();
    let settings = TunnelSettings::new(key.clone());
    assert_eq!(settings.listen, "0.0.0.0:0".parse().unwrap());
    assert_eq!(settings.mtu, tunneld_userspace::DEFAULT_MTU);
    assert_eq!(settings.mtu, 1420);
    assert!(settings.addresses.is_empty() && settings.peers.is_empty());
    let peer = PeerSettings::new(key.public_key());
    assert_eq!(
        (peer.endpoint, peer.persistent_keepalive, peer.parallel),
        (None, 0, 1)
    );
    assert!(peer.allowed_ips.is_empty() && peer.preshared_key.is_none());
}

#[test]
fn settings_errors_name_their_field() {
    let e = start_err(with(|s| s.addresses.clear()));
    assert_eq!(e.field(), "addresses");
    assert_eq!(e.to_string(), "addresses: no address given");
    assert_eq!(e.io_kind(), None);

    let e = start_err(with(|s| {
        s.addresses = vec![
            "10.0.0.1/24".parse().unwrap(),
            "10.0.0.2/24".parse().unwrap(),
        ]
    }));
    assert!(e.to_string().starts_with("addresses: "), "{e}");

    let e = start_err(with(|s| s.mtu = 100));
    assert_eq!(e.field(), "mtu");
    assert!(e.to_string().starts_with("mtu: 100 is outside"), "{e}");

    let e = start_err(with(|s| {
        s.addresses = vec!["fd00::1/64".parse().unwrap()];
        s.mtu = 1000;
    }));
    assert_eq!(e.field(), "mtu", "IPv6 needs 1280: {e}");

    let key = PrivateKey::generate();
    let peer = PeerSettings::new(key.public_key());
    let e = start_err(with(|s| s.peers = vec![peer.clone(), peer.clone()]));
    assert_eq!(e.field(), "peers");
    assert!(e.to_string().contains("given twice"), "{e}");
    let e = start_err(with(|s| {
        let mut split = peer.clone();
        split.parallel = 2;
        s.peers = vec![split];
    }));
    assert_eq!(e.field(), "peers");
    // One owner per prefix, as `tunneld check` rules for a gateway (10.9.0.1/24 is
    // 10.9.0.0/24, the same prefix written another way).
    let other = PeerSettings::new(PrivateKey::generate().public_key());
    let e = start_err(with(|s| {
        s.peers = vec![
            peer.clone().allowed_ip("10.9.0.0/24".parse().unwrap()),
            other.clone().allowed_ip("10.9.0.1/24".parse().unwrap()),
        ]
    }));
    assert_eq!(e.field(), "peers");
    assert_eq!(
        e.to_string(),
        "peers: peer 1: allowed IP 10.9.0.0/24 is also claimed by peer 0"
    );
    // A narrower prefix inside another's is a route of its own, allowed.
    Tunnel::start(with(|s| {
        s.peers = vec![
            peer.clone().allowed_ip("10.9.0.0/16".parse().unwrap()),
            other.clone().allowed_ip("10.9.1.0/24".parse().unwrap()),
        ]
    }))
    .expect("nested prefixes are two routes")
    .shutdown();

    // A port already taken: a bind error, named for `listen`, with the system's kind.
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let e = start_err(with(|s| s.listen = taken.local_addr().unwrap()));
    assert_eq!(e.field(), "listen");
    assert_eq!(e.io_kind(), Some(io::ErrorKind::AddrInUse));
    assert!(
        e.to_string().starts_with("listen: cannot bind 127.0.0.1:"),
        "{e}"
    );
}

#[test]
fn the_secret_key_never_shows() {
    let settings = valid();
    let secret = settings.private_key.to_base64();
    assert!(!format!("{settings:?}").contains(secret.as_str()));
}

#[test]
fn calls_without_a_route_fail_at_once() {
    let tunnel = Tunnel::start(valid()).unwrap();
    runtime().block_on(async {
        let e = tunnel.tcp_connect("10.77.0.2:80").await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::HostUnreachable);
        let e = tunnel.tcp_connect("[fd00::2]:80").await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrNotAvailable, "no IPv6 address");
        let e = tunnel
            .tcp_listen("10.9.9.9:80".parse().unwrap())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrNotAvailable);
        let l = tunnel
            .tcp_listen("0.0.0.0:80".parse().unwrap())
            .await
            .unwrap();
        let e = tunnel
            .tcp_listen("0.0.0.0:80".parse().unwrap())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
        drop(l);
    });
    tunnel.shutdown();
    runtime().block_on(async {
        let e = tunnel
            .udp_bind("0.0.0.0:0".parse().unwrap())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted);
    });
}

#[test]
fn shutdown_aborts_open_streams_promptly() {
    let test = "shutdown_aborts_open_streams_promptly";
    let Some(sites) = wireguard_go_sites(test) else {
        return;
    };
    let _echo = EchoServer::start(&sites.far, &["10.77.0.2:7".parse().unwrap()]);
    let tunnel = sites.start_tunnel(sites.settings(0));
    runtime().block_on(async {
        let stream = tunnel.tcp_connect("10.77.0.2:7").await.unwrap();
        let listener = tunnel
            .tcp_listen("0.0.0.0:9".parse().unwrap())
            .await
            .unwrap();
        let socket = tunnel.udp_bind("0.0.0.0:0".parse().unwrap()).await.unwrap();
        let (mut r, mut w) = stream.into_split();
        w.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        r.read_exact(&mut buf).await.unwrap();
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 64];
            r.read(&mut buf).await
        });
        let acceptor = tokio::spawn(async move { listener.accept().await.map(|_| ()) });
        let receiver = tokio::spawn(async move {
            let mut buf = [0u8; 64];
            socket.recv_from(&mut buf).await.map(|_| ())
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        step("shutdown with a read, an accept and a receive waiting");
        tunnel.shutdown();
        let limit = Duration::from_secs(2);
        let e = tokio::time::timeout(limit, reader)
            .await
            .expect("read ends")
            .unwrap()
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted);
        let e = tokio::time::timeout(limit, acceptor)
            .await
            .expect("accept ends")
            .unwrap()
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted);
        let e = tokio::time::timeout(limit, receiver)
            .await
            .expect("recv ends")
            .unwrap()
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted);
        let e = w.write_all(b"more").await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted);
        let e = tunnel.tcp_connect("10.77.0.2:7").await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted);
    });
}
