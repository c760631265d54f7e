//! A TCP super-packet from the TUN crosses the tunnel as one: its datagrams leave in one
//! send, and the far side hands them to its TUN in one write, where a real TUN backend
//! coalesces them back into one super-packet. Cut in two, it becomes two writes on the far
//! side, and two TCP ACKs back through the tunnel.
//!
//! Real UDP sockets on loopback, where the kernel keeps a GSO send whole for a GRO socket, as
//! it does over veth; in-memory TUNs, which record how many packets each write carried.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::thread::sleep;
use std::time::{Duration, Instant};
use tunneld_benches::{device, host_prefix, ipv4_packet, tcp_super_packet, A_IP, B_IP};
use tunneld_crypto::PrivateKey;
use tunneld_dataplane::sim::SimTun;
use tunneld_dataplane::udp::UdpSocket;
use tunneld_dataplane::worker::Worker;
use tunneld_dataplane::DatagramIo;

/// A segment of 1420 bytes, as from a tunnel with MTU 1420.
const MSS: usize = 1380;
/// What TCP puts in one 64 KiB super-packet at that MSS: more than one UDP GSO send can
/// carry, and three of them more than one batch of the worker.
const SEGMENTS: usize = 47;
const SUPER_PACKETS: usize = 3;

fn loopback_socket() -> (UdpSocket, SocketAddr) {
    let socket = UdpSocket::bind_addr(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0))
        .expect("binding a UDP socket on 127.0.0.1");
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), socket.local_port());
    (socket, addr)
}

#[test]
fn each_super_packet_reaches_the_far_tun_in_one_write() {
    let (udp_a, addr_a) = loopback_socket();
    let (udp_b, addr_b) = loopback_socket();
    assert!(udp_a.gso() && udp_b.gro(), "UDP GSO and GRO on this kernel");
    let (ka, kb) = (PrivateKey::generate(), PrivateKey::generate());
    let (tun_a, tun_b) = (SimTun::new(), SimTun::new());
    let (mut a, _handle_a) = Worker::new(
        device(&ka, kb.public_key(), host_prefix(B_IP), addr_b),
        tun_a.clone(),
        udp_a,
    )
    .unwrap();
    let (mut b, _handle_b) = Worker::new(
        device(&kb, ka.public_key(), host_prefix(A_IP), addr_a),
        tun_b.clone(),
        udp_b,
    )
    .unwrap();

    // Turns both workers until `done`, for at most 5 s.
    let mut turn_until = |what: &str, done: &mut dyn FnMut() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            let now = Instant::now();
            a.turn(now);
            b.turn(now);
            sleep(Duration::from_millis(1));
        }
    };
    assert!(tun_a.inject(&ipv4_packet(64)));
    turn_until("the handshake", &mut || tun_b.take().is_some());
    tun_b.take_write_calls();

    let (hdr, packet) = tcp_super_packet(SEGMENTS, MSS);
    for _ in 0..SUPER_PACKETS {
        assert!(tun_a.inject_offload(hdr, &packet));
    }
    let total = SEGMENTS * SUPER_PACKETS;
    turn_until("the segments", &mut || tun_b.written() >= total);

    let mut lens = Vec::new();
    while let Some(p) = tun_b.take() {
        lens.push(p.len());
    }
    assert_eq!(
        lens,
        vec![40 + MSS; total],
        "every segment, whole, and nothing else"
    );
    // Where each write ended, counted in segments: only where a super-packet ended.
    let calls = tun_b.take_write_calls();
    let ends: Vec<usize> = calls
        .iter()
        .scan(0, |sum, n| {
            *sum += n;
            Some(*sum)
        })
        .collect();
    assert!(
        ends.iter().all(|end| end % SEGMENTS == 0),
        "a write cut a super-packet: {SUPER_PACKETS} super-packets of {SEGMENTS} segments \
         were written {calls:?} at a time"
    );
}
