//! The NATs of `tunneld_testnet::nat` behave as their kinds say: what a public host sees of
//! a site's port, what comes back in, and what a flush does. The tests of sites behind NAT
//! rest on these behaviours, so they are checked here against the kernel's own.

use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use tunneld_testnet::etcd::Underlay;
use tunneld_testnet::nat::{Nat, NatKind};
use tunneld_testnet::{require_netns, require_tool, NetNs};

const SITE_PORT: u16 = 40_000;
const QUIET: Duration = Duration::from_millis(300);

/// A public host that answers each datagram with the source address it saw, until stopped.
struct Reflector {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Reflector {
    fn start(ns: &NetNs, addr: SocketAddr) -> Reflector {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let socket = ns.in_ns(move || UdpSocket::bind(addr).expect("reflector's socket"));
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while !flag.load(Ordering::Relaxed) {
                if let Ok((_, from)) = socket.recv_from(&mut buf) {
                    let _ = socket.send_to(from.to_string().as_bytes(), from);
                }
            }
        });
        Reflector {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Reflector {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What `reflector` saw of `socket`'s address, or None when nothing came back.
fn seen_by(socket: &UdpSocket, reflector: SocketAddr) -> Option<SocketAddr> {
    socket.send_to(b"who am I", reflector).unwrap();
    let mut buf = [0u8; 64];
    loop {
        match socket.recv_from(&mut buf) {
            Ok((n, from)) if from == reflector => {
                return std::str::from_utf8(&buf[..n]).ok()?.parse().ok();
            }
            Ok(_) => continue,
            Err(_) => return None,
        }
    }
}

fn site_socket(nat: &Nat) -> UdpSocket {
    let socket = nat
        .site
        .in_ns(|| UdpSocket::bind(("0.0.0.0", SITE_PORT)).unwrap());
    socket.set_read_timeout(Some(QUIET)).unwrap();
    socket
}

#[test]
fn each_nat_maps_and_filters_as_its_kind_says() {
    let test = "each_nat_maps_and_filters_as_its_kind_says";
    if !require_netns(test) || !require_tool(test, "nft") || !require_tool(test, "conntrack") {
        return;
    }
    let wan = Underlay::new("192.0.2.1/24");
    let one = wan.host("192.0.2.51/24");
    let two = wan.host("192.0.2.52/24");
    let to_one: SocketAddr = "192.0.2.51:3478".parse().unwrap();
    let to_two: SocketAddr = "192.0.2.52:3478".parse().unwrap();
    let _reflectors = [
        Reflector::start(&one, to_one),
        Reflector::start(&two, to_two),
    ];

    // Endpoint-independent: one public port for every destination, the site's own.
    let eim = Nat::new(&wan, "192.0.2.61/24", 0, NatKind::EndpointIndependent);
    let socket = site_socket(&eim);
    let mapped: SocketAddr = format!("{}:{SITE_PORT}", eim.public).parse().unwrap();
    assert_eq!(seen_by(&socket, to_one), Some(mapped), "{}", eim.mappings());
    assert_eq!(seen_by(&socket, to_two), Some(mapped), "{}", eim.mappings());
    // Filtered by address and port: a host the site has not sent to cannot come in, even
    // to the mapped port; one it has sent to can.
    let stranger = two.in_ns(|| UdpSocket::bind("192.0.2.52:9999").unwrap());
    stranger.send_to(b"let me in", mapped).unwrap();
    let mut buf = [0u8; 64];
    assert!(
        socket.recv_from(&mut buf).is_err(),
        "an unsolicited datagram came through the NAT"
    );
    // Flushed, the mapping comes back the same (the port is still free).
    eim.flush();
    assert_eq!(seen_by(&socket, to_one), Some(mapped));

    // Endpoint-dependent: each destination its own public port, none of them the site's.
    let edm = Nat::new(&wan, "192.0.2.62/24", 1, NatKind::EndpointDependent);
    let socket = site_socket(&edm);
    let first = seen_by(&socket, to_one).expect("an answer through the NAT");
    let second = seen_by(&socket, to_two).expect("an answer through the NAT");
    assert_eq!(first.ip().to_string(), edm.public);
    assert_eq!(second.ip().to_string(), edm.public);
    assert_ne!(
        first.port(),
        second.port(),
        "two destinations got one public port:\n{}",
        edm.mappings()
    );
    // Flushed, the same destination gets a new port.
    edm.flush();
    let again = seen_by(&socket, to_one).expect("an answer after the flush");
    assert_ne!(again.port(), first.port(), "{}", edm.mappings());

    // Only TCP 443 out: no UDP at all, TCP to 443 through, TCP elsewhere not.
    let tcp = Nat::new(&wan, "192.0.2.63/24", 2, NatKind::Tcp443Only);
    let socket = site_socket(&tcp);
    assert_eq!(
        seen_by(&socket, to_one),
        None,
        "UDP left a TCP-443-only NAT"
    );
    let listeners = one.in_ns(|| {
        [
            TcpListener::bind("192.0.2.51:443").unwrap(),
            TcpListener::bind("192.0.2.51:80").unwrap(),
        ]
    });
    let connect = |port: u16| {
        tcp.site.in_ns(move || {
            let to: SocketAddr = format!("192.0.2.51:{port}").parse().unwrap();
            TcpStream::connect_timeout(&to, QUIET).is_ok()
        })
    };
    assert!(connect(443), "TCP to 443 did not leave");
    assert!(!connect(80), "TCP to 80 left a TCP-443-only NAT");
    let (_, peer) = listeners[0].accept().unwrap();
    assert_eq!(peer.ip().to_string(), tcp.public);
}
