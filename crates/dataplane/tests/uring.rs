//! The io_uring backends against the real kernel. `UringUdp` talks over loopback only
//! (127.0.0.1 and ::1) with plain sockets; `UringTun` runs in network namespaces the tests
//! create (privileged). Where io_uring is not usable (seccomp, kernel.io_uring_disabled) the
//! tests say so and skip; `TUNNELD_REQUIRE_ALL=1` makes every such skip a failure
//! (`tunneld_testnet::skip`). Every wait is bounded.

mod common;

use common::{bind, content, recv_n, refuse_gso, size, wait_readable};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};
use tunneld_dataplane::tun::Tun;
use tunneld_dataplane::udp::UdpSocket;
use tunneld_dataplane::uring::{self, UringTun, UringUdp};
use tunneld_dataplane::{Batch, DatagramIo, PacketIo, BATCH_SIZE};
use tunneld_testnet::{
    require_netns, skip_unless, unique_name, with_ipv6_loopback, Missing, NetNs,
};

const LOCAL4: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const LOCAL6: IpAddr = IpAddr::V6(Ipv6Addr::LOCALHOST);

/// io_uring disabled (seccomp, kernel.io_uring_disabled) is set-up: a skip, or a failure
/// under `TUNNELD_REQUIRE_ALL=1`.
fn uring_usable(test: &str) -> bool {
    let probe = uring::probe();
    let why = match &probe {
        Ok(()) => String::new(),
        Err(e) => format!("io_uring is not usable here: {e}"),
    };
    skip_unless(
        test,
        probe.is_ok(),
        "the io_uring test",
        Missing::Setup(&why),
    )
}

fn push(batch: &mut Batch, data: &[u8], to: SocketAddr) {
    batch.next_free().expect("free frame")[..data.len()].copy_from_slice(data);
    batch.commit(data.len(), to);
}

fn uring_on(ip: IpAddr) -> UringUdp {
    UringUdp::new(bind(ip)).expect("UringUdp::new")
}

/// A full batch of mixed sizes (empty to the largest) `from` → `to`, checked frame by frame:
/// length, content, source.
fn full_batch(
    from: &mut impl DatagramIo,
    from_addr: SocketAddr,
    to: &mut impl DatagramIo,
    to_addr: SocketAddr,
    tag: u8,
) {
    let max = if from_addr.is_ipv4() { 65507 } else { 65527 };
    let mut out = Batch::new();
    for i in 0..BATCH_SIZE {
        push(&mut out, &content(i, size(i, max), tag), to_addr);
    }
    assert_eq!(from.send_batch(&mut out).unwrap(), BATCH_SIZE, "sent");
    let mut got = Batch::new();
    recv_n(to, &mut got, BATCH_SIZE);
    for i in 0..BATCH_SIZE {
        assert_eq!(got.payload(i).len(), size(i, max), "length of datagram {i}");
        assert!(
            got.payload(i) == content(i, size(i, max), tag),
            "content of {i}"
        );
        assert_eq!(got.addr(i), from_addr, "source of datagram {i}");
        assert_eq!(got.datagrams(i).count(), 1, "one datagram per frame");
    }
    assert_eq!(
        to.recv_batch(&mut got).unwrap(),
        0,
        "a full batch takes nothing"
    );
    got.clear();
    assert_eq!(to.recv_batch(&mut got).unwrap(), 0, "nothing more was sent");
}

fn mixed_sizes_both_ways(ip: IpAddr) {
    let (mut plain, mut ring) = (bind(ip), uring_on(ip));
    ring.set_gro(false);
    let plain_addr = SocketAddr::new(ip, plain.local_port());
    let ring_addr = SocketAddr::new(ip, ring.local_port());
    assert_eq!(ring.local_addr(), ring_addr);
    full_batch(&mut plain, plain_addr, &mut ring, ring_addr, 0x11);
    full_batch(&mut ring, ring_addr, &mut plain, plain_addr, 0x22);
    // And a second round each way, through re-used buffers.
    full_batch(&mut plain, plain_addr, &mut ring, ring_addr, 0x33);
    full_batch(&mut ring, ring_addr, &mut plain, plain_addr, 0x44);
}

#[test]
fn mixed_sizes_both_ways_v4() {
    if uring_usable("mixed_sizes_both_ways_v4") {
        mixed_sizes_both_ways(LOCAL4);
    }
}

#[test]
fn mixed_sizes_both_ways_v6() {
    if uring_usable("mixed_sizes_both_ways_v6") {
        with_ipv6_loopback("mixed_sizes_both_ways_v6", || mixed_sizes_both_ways(LOCAL6));
    }
}

#[test]
fn dual_stack_shows_ipv4_peers_as_ipv4() {
    if !uring_usable("dual_stack_shows_ipv4_peers_as_ipv4") {
        return;
    }
    with_ipv6_loopback("dual_stack_shows_ipv4_peers_as_ipv4", || {
        let mut sock = UdpSocket::bind(0).unwrap();
        sock.set_gro(false);
        let mut ring = UringUdp::new(sock).unwrap();
        assert!(ring.local_addr().is_ipv6(), "{}", ring.local_addr());
        let mut v4 = bind(LOCAL4);
        let mut v6 = bind(LOCAL6);
        let port = ring.local_port();

        let mut out = Batch::new();
        push(&mut out, b"from v4", SocketAddr::new(LOCAL4, port));
        assert_eq!(v4.send_batch(&mut out).unwrap(), 1);
        let mut out = Batch::new();
        push(&mut out, b"from v6", SocketAddr::new(LOCAL6, port));
        assert_eq!(v6.send_batch(&mut out).unwrap(), 1);

        let mut got = Batch::new();
        recv_n(&mut ring, &mut got, 2);
        let mut seen: Vec<(Vec<u8>, SocketAddr)> = (0..2)
            .map(|i| (got.payload(i).to_vec(), got.addr(i)))
            .collect();
        seen.sort();
        let v4_addr = SocketAddr::new(LOCAL4, v4.local_port());
        let v6_addr = SocketAddr::new(LOCAL6, v6.local_port());
        assert_eq!(
            seen,
            [
                (b"from v4".to_vec(), v4_addr),
                (b"from v6".to_vec(), v6_addr)
            ]
        );

        // Replies to both families in one batch.
        let mut out = Batch::new();
        push(&mut out, b"to v4", v4_addr);
        push(&mut out, b"to v6", v6_addr);
        assert_eq!(ring.send_batch(&mut out).unwrap(), 2);
        for (sock, want, from) in [
            (&mut v4, &b"to v4"[..], LOCAL4),
            (&mut v6, b"to v6", LOCAL6),
        ] {
            let mut got = Batch::new();
            recv_n(sock, &mut got, 1);
            assert_eq!(got.payload(0), want);
            assert_eq!(got.addr(0), SocketAddr::new(from, port));
        }
    });
}

/// Runs of equal-size datagrams to one address leave as GSO sends (and without, once GSO is
/// off); the receiver (no GRO) sees every datagram, in order, byte for byte.
#[test]
fn equal_size_runs_arrive_whole_with_and_without_gso() {
    if !uring_usable("equal_size_runs_arrive_whole_with_and_without_gso") {
        return;
    }
    for gso in [true, false] {
        let mut ring = uring_on(LOCAL4);
        let mut rx = bind(LOCAL4);
        ring.set_gso(gso);
        assert_eq!(ring.gso(), gso, "UDP GSO on this kernel");
        let to = SocketAddr::new(LOCAL4, rx.local_port());
        let lens: Vec<usize> = (0..BATCH_SIZE)
            .map(|i| match i {
                50 => 100,
                60.. => 700,
                _ => 1452,
            })
            .collect();
        let mut out = Batch::new();
        for (i, len) in lens.iter().enumerate() {
            push(&mut out, &content(i, *len, 7), to);
        }
        assert_eq!(ring.send_batch(&mut out).unwrap(), lens.len(), "gso={gso}");
        let mut got = Batch::new();
        recv_n(&mut rx, &mut got, lens.len());
        for (i, len) in lens.iter().enumerate() {
            assert!(
                got.payload(i) == content(i, *len, 7),
                "gso={gso} datagram {i}"
            );
            assert_eq!(got.addr(i), SocketAddr::new(LOCAL4, ring.local_port()));
        }
    }
}

/// When the kernel refuses a GSO send (here: transmit checksums off on the socket, which
/// makes `UDP_SEGMENT` fail with EINVAL, as a route through IPsec makes it fail with EIO), the
/// backend turns GSO off and sends the same run datagram by datagram, losing none.
#[test]
fn gso_refused_by_the_kernel_falls_back_and_loses_nothing() {
    if !uring_usable("gso_refused_by_the_kernel_falls_back_and_loses_nothing") {
        return;
    }
    let sock = bind(LOCAL4);
    refuse_gso(sock.fd().unwrap());
    let mut ring = UringUdp::new(sock).expect("UringUdp::new");
    ring.set_gso(true);
    assert!(ring.gso(), "UDP GSO on this kernel");
    let mut rx = bind(LOCAL4);
    let to = SocketAddr::new(LOCAL4, rx.local_port());
    for round in 0..2u8 {
        let lens: Vec<usize> = (0..40).map(|i| if i == 30 { 100 } else { 1452 }).collect();
        let mut out = Batch::new();
        for (i, len) in lens.iter().enumerate() {
            push(&mut out, &content(i, *len, round), to);
        }
        assert_eq!(
            ring.send_batch(&mut out).unwrap(),
            lens.len(),
            "round {round}"
        );
        assert!(!ring.gso(), "GSO still on after the kernel refused it");
        let mut got = Batch::new();
        recv_n(&mut rx, &mut got, lens.len());
        for (i, len) in lens.iter().enumerate() {
            assert!(got.payload(i) == content(i, *len, round), "datagram {i}");
            assert_eq!(got.addr(i), SocketAddr::new(LOCAL4, ring.local_port()));
        }
    }
}

#[test]
fn refused_and_unreachable_datagrams_do_not_fail_the_batch() {
    if !uring_usable("refused_and_unreachable_datagrams_do_not_fail_the_batch") {
        return;
    }
    let mut ring = uring_on(LOCAL4);
    let mut rx = bind(LOCAL4);
    // A port nobody listens on: bind one, note it, close it.
    let closed = SocketAddr::new(LOCAL4, bind(LOCAL4).local_port());
    let rx_addr = SocketAddr::new(LOCAL4, rx.local_port());
    let mut out = Batch::new();
    push(&mut out, b"port 0: EINVAL", SocketAddr::new(LOCAL4, 0));
    push(&mut out, b"one", rx_addr);
    push(&mut out, b"to nobody", closed);
    push(
        &mut out,
        b"IPv6 from an IPv4 socket",
        SocketAddr::new(LOCAL6, 9),
    );
    push(&mut out, b"two", rx_addr);
    push(&mut out, b"three", rx_addr);
    assert_eq!(
        ring.send_batch(&mut out).unwrap(),
        4,
        "three to rx, one to nobody"
    );
    let mut got = Batch::new();
    recv_n(&mut rx, &mut got, 3);
    for (i, want) in [&b"one"[..], b"two", b"three"].iter().enumerate() {
        assert_eq!(got.payload(i), *want);
    }
    // The unreachable report leaves the ring receiving.
    std::thread::sleep(Duration::from_millis(50));
    let mut empty = Batch::new();
    assert_eq!(ring.recv_batch(&mut empty).unwrap(), 0);
    let mut out = Batch::new();
    push(
        &mut out,
        b"still here",
        SocketAddr::new(LOCAL4, ring.local_port()),
    );
    assert_eq!(rx.send_batch(&mut out).unwrap(), 1);
    recv_n(&mut ring, &mut empty, 1);
    assert_eq!(empty.payload(0), b"still here");
}

/// With GRO on, a burst sent with GSO arrives merged in frames with their datagram size
/// recorded; `Batch::datagrams` gives back every datagram, in order, byte for byte.
#[test]
fn gro_merged_bursts_split_back_exactly() {
    if !uring_usable("gro_merged_bursts_split_back_exactly") {
        return;
    }
    let mut tx = bind(LOCAL4);
    assert!(tx.gso(), "UDP GSO on this kernel");
    let mut ring = uring_on(LOCAL4);
    ring.set_gro(true);
    assert!(ring.gro(), "UDP GRO on this kernel");
    let to = SocketAddr::new(LOCAL4, ring.local_port());
    let lens: Vec<usize> = (0..53).map(|i| if i == 50 { 100 } else { 1452 }).collect();
    let mut out = Batch::new();
    for (i, len) in lens.iter().enumerate() {
        push(&mut out, &content(i, *len, 3), to);
    }
    assert_eq!(tx.send_batch(&mut out).unwrap(), lens.len());

    let until = Instant::now() + Duration::from_secs(5);
    let mut got = Batch::new();
    let mut datagrams: Vec<Vec<u8>> = Vec::new();
    let mut merged_frames = 0;
    while datagrams.len() < lens.len() && Instant::now() < until {
        got.clear();
        ring.recv_batch(&mut got).expect("recv_batch");
        for i in 0..got.len() {
            assert_eq!(got.addr(i), SocketAddr::new(LOCAL4, tx.local_port()));
            let parts: Vec<&[u8]> = got.datagrams(i).collect();
            merged_frames += usize::from(parts.len() > 1);
            datagrams.extend(parts.into_iter().map(<[u8]>::to_vec));
        }
        if datagrams.len() < lens.len() {
            wait_readable(ring.fd().unwrap(), until);
        }
    }
    assert_eq!(datagrams.len(), lens.len(), "datagrams received");
    for (i, d) in datagrams.iter().enumerate() {
        assert!(d[..] == content(i, lens[i], 3)[..], "datagram {i}");
    }
    assert!(
        merged_frames > 0,
        "the kernel merged nothing: GRO did not take effect"
    );
}

#[test]
fn the_ring_descriptor_polls_readable_when_data_arrives() {
    if !uring_usable("the_ring_descriptor_polls_readable_when_data_arrives") {
        return;
    }
    let mut ring = uring_on(LOCAL4);
    let mut tx = bind(LOCAL4);
    let fd = ring.fd().unwrap();
    let soon = || Instant::now() + Duration::from_millis(20);
    assert!(!wait_readable(fd, soon()), "readable with nothing sent");

    let mut out = Batch::new();
    push(
        &mut out,
        b"wake up",
        SocketAddr::new(LOCAL4, ring.local_port()),
    );
    assert_eq!(tx.send_batch(&mut out).unwrap(), 1);
    assert!(
        wait_readable(fd, Instant::now() + Duration::from_secs(5)),
        "not readable after a datagram arrived"
    );
    let mut got = Batch::new();
    assert_eq!(
        ring.recv_batch(&mut got).unwrap(),
        1,
        "no syscall needed: it is there"
    );
    assert_eq!(got.payload(0), b"wake up");
    assert!(!wait_readable(fd, soon()), "still readable once drained");
}

/// The worker's case: the backend is made on one thread and polled and read on another, while
/// the first one blocks (in `join`, like the daemon's main thread waiting for signals).
#[test]
fn a_poll_on_another_thread_wakes_for_data() {
    if !uring_usable("a_poll_on_another_thread_wakes_for_data") {
        return;
    }
    let ring = uring_on(LOCAL4);
    let to = SocketAddr::new(LOCAL4, ring.local_port());
    let poller = std::thread::spawn(move || {
        let mut ring = ring;
        let until = Instant::now() + Duration::from_secs(5);
        let mut got = Vec::new();
        let mut wakes = 0;
        while got.len() < 3 && Instant::now() < until {
            if !wait_readable(ring.fd().unwrap(), until) {
                continue;
            }
            wakes += 1;
            let mut batch = Batch::new();
            ring.recv_batch(&mut batch).unwrap();
            got.extend((0..batch.len()).map(|i| batch.payload(i).to_vec()));
        }
        (got, wakes)
    });
    let sender = std::thread::spawn(move || {
        let mut tx = bind(LOCAL4);
        for word in [&b"one"[..], b"two", b"three"] {
            std::thread::sleep(Duration::from_millis(50));
            let mut out = Batch::new();
            push(&mut out, word, to);
            assert_eq!(tx.send_batch(&mut out).unwrap(), 1);
        }
    });
    sender.join().unwrap();
    let (got, wakes) = poller.join().unwrap();
    assert_eq!(
        got,
        [&b"one"[..], b"two", b"three"],
        "after {wakes} wake-ups"
    );
}

#[test]
fn keeps_receiving_after_the_thread_that_made_it_exits() {
    if !uring_usable("keeps_receiving_after_the_thread_that_made_it_exits") {
        return;
    }
    let mut ring = std::thread::spawn(|| uring_on(LOCAL4)).join().unwrap();
    let mut tx = bind(LOCAL4);
    let to = SocketAddr::new(LOCAL4, ring.local_port());
    for round in 0..3u8 {
        let mut out = Batch::new();
        push(&mut out, &[round; 10], to);
        assert_eq!(tx.send_batch(&mut out).unwrap(), 1);
        let mut got = Batch::new();
        recv_n(&mut ring, &mut got, 1);
        assert_eq!(got.payload(0), [round; 10]);
    }
}

#[test]
fn a_full_batch_when_more_than_64_wait() {
    if !uring_usable("a_full_batch_when_more_than_64_wait") {
        return;
    }
    let mut ring = uring_on(LOCAL4);
    let mut tx = bind(LOCAL4);
    let to = SocketAddr::new(LOCAL4, ring.local_port());
    let total = 100;
    for chunk in 0..2 {
        let mut out = Batch::new();
        for i in chunk * 64..(total).min(chunk * 64 + 64) {
            push(&mut out, &(i as u32).to_be_bytes(), to);
        }
        assert_eq!(tx.send_batch(&mut out).unwrap(), out.len());
    }
    assert!(wait_readable(
        ring.fd().unwrap(),
        Instant::now() + Duration::from_secs(5)
    ));
    // Let every completion land (loopback delivers at once; this only removes the race).
    std::thread::sleep(Duration::from_millis(50));
    let mut first = Batch::new();
    assert_eq!(ring.recv_batch(&mut first).unwrap(), BATCH_SIZE);
    assert!(first.is_full());
    let mut rest = Batch::new();
    assert_eq!(ring.recv_batch(&mut rest).unwrap(), total - BATCH_SIZE);
    let all: Vec<u32> = (0..first.len())
        .map(|i| first.payload(i))
        .chain((0..rest.len()).map(|i| rest.payload(i)))
        .map(|p| u32::from_be_bytes(p.try_into().unwrap()))
        .collect();
    assert_eq!(all, (0..total as u32).collect::<Vec<_>>(), "all, in order");
    rest.clear();
    assert_eq!(ring.recv_batch(&mut rest).unwrap(), 0);
}

/// More datagrams wait than the ring has buffers: the multishot receive ends (ENOBUFS) and is
/// re-armed, and nothing is lost or reordered (the socket buffer holds the rest meanwhile).
#[test]
fn more_datagrams_than_buffers_all_arrive_in_order() {
    if !uring_usable("more_datagrams_than_buffers_all_arrive_in_order") {
        return;
    }
    let mut ring = uring_on(LOCAL4);
    let mut tx = bind(LOCAL4);
    let to = SocketAddr::new(LOCAL4, ring.local_port());
    let total: u32 = 700;
    let mut next = 0;
    while next < total {
        let mut out = Batch::new();
        while next < total && !out.is_full() {
            push(&mut out, &next.to_be_bytes(), to);
            next += 1;
        }
        assert_eq!(tx.send_batch(&mut out).unwrap(), out.len());
    }
    let until = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    while seen.len() < total as usize && Instant::now() < until {
        let mut got = Batch::new();
        ring.recv_batch(&mut got).unwrap();
        seen.extend((0..got.len()).map(|i| u32::from_be_bytes(got.payload(i).try_into().unwrap())));
        if got.is_empty() {
            wait_readable(ring.fd().unwrap(), until);
        }
    }
    assert_eq!(seen, (0..total).collect::<Vec<_>>());
}

#[test]
fn recv_appends_after_the_frames_already_in_the_batch() {
    if !uring_usable("recv_appends_after_the_frames_already_in_the_batch") {
        return;
    }
    let mut ring = uring_on(LOCAL4);
    let mut tx = bind(LOCAL4);
    let mut out = Batch::new();
    for i in 0..5u8 {
        push(
            &mut out,
            &[i; 33],
            SocketAddr::new(LOCAL4, ring.local_port()),
        );
    }
    assert_eq!(tx.send_batch(&mut out).unwrap(), 5);
    let mut got = Batch::new();
    let mine = SocketAddr::new(LOCAL6, 1);
    for _ in 0..BATCH_SIZE - 2 {
        push(&mut got, b"kept", mine);
    }
    recv_n(&mut ring, &mut got, BATCH_SIZE);
    for i in 0..BATCH_SIZE - 2 {
        assert_eq!((got.payload(i), got.addr(i)), (&b"kept"[..], mine));
    }
    assert_eq!(got.payload(BATCH_SIZE - 2), [0; 33]);
    assert_eq!(got.payload(BATCH_SIZE - 1), [1; 33]);
    let mut rest = Batch::new();
    recv_n(&mut ring, &mut rest, 3);
    assert_eq!(rest.payload(0), [2; 33]);
}

/// Dropping a backend whose ring holds received data (and whose multishot may have run out
/// of buffers) cancels and drains it promptly.
#[test]
fn drops_promptly_with_data_in_flight() {
    if !uring_usable("drops_promptly_with_data_in_flight") {
        return;
    }
    let mut tx = bind(LOCAL4);
    for round in 0..10 {
        let mut ring = uring_on(LOCAL4);
        let to = SocketAddr::new(LOCAL4, ring.local_port());
        for _ in 0..(round % 6) {
            let mut out = Batch::new();
            while !out.is_full() {
                push(&mut out, &[round as u8; 200], to);
            }
            assert_eq!(tx.send_batch(&mut out).unwrap(), BATCH_SIZE);
        }
        if round % 2 == 0 {
            let mut got = Batch::new();
            ring.recv_batch(&mut got).unwrap();
        }
        let started = Instant::now();
        drop(ring);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "drop took {:?}",
            started.elapsed()
        );
    }
}

// --- The TUN side, in network namespaces ---

const HOST: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);

/// A namespace with a TUN interface holding 10.99.0.1/24, up; with offloads if asked.
fn tun_in_ns(offloads: bool) -> (NetNs, Tun) {
    let ns = NetNs::new();
    let name = unique_name("tun");
    let tun = {
        let name = name.clone();
        ns.in_ns(move || {
            if offloads {
                Tun::open_with_offloads(&name)
            } else {
                Tun::open(&name)
            }
        })
        .unwrap_or_else(|e| panic!("open TUN: {e}"))
    };
    ns.run(&["ip", "addr", "add", "10.99.0.1/24", "dev", &name]);
    ns.run(&["ip", "link", "set", &name, "up"]);
    (ns, tun)
}

/// The ones' complement sum of 16-bit words, folded (RFC 1071).
fn checksum(chunks: &[&[u8]]) -> u16 {
    let mut sum: u32 = 0;
    for chunk in chunks {
        for pair in chunk.chunks(2) {
            sum += u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]));
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An IPv4/UDP packet from `src` to `dst` with correct checksums.
fn ipv4_udp(src: (Ipv4Addr, u16), dst: (Ipv4Addr, u16), payload: &[u8]) -> Vec<u8> {
    let udp_len = (8 + payload.len()) as u16;
    let mut p = vec![0x45, 0];
    p.extend_from_slice(&(20 + udp_len).to_be_bytes());
    p.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]); // id 0, DF, TTL 64, UDP
    p.extend_from_slice(&src.0.octets());
    p.extend_from_slice(&dst.0.octets());
    let ip_sum = checksum(&[&p]);
    p[10..12].copy_from_slice(&ip_sum.to_be_bytes());
    let mut udp = Vec::new();
    udp.extend_from_slice(&src.1.to_be_bytes());
    udp.extend_from_slice(&dst.1.to_be_bytes());
    udp.extend_from_slice(&udp_len.to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(payload);
    let pseudo = [
        &src.0.octets()[..],
        &dst.0.octets(),
        &[0, 17],
        &udp_len.to_be_bytes(),
    ];
    let sum = match checksum(&[pseudo[0], pseudo[1], pseudo[2], pseudo[3], &udp]) {
        0 => 0xffff,
        s => s,
    };
    udp[6..8].copy_from_slice(&sum.to_be_bytes());
    p.extend_from_slice(&udp);
    p
}

/// Sends `count` datagrams from a socket in the namespace to PEER:9 (routed via the TUN) and
/// reads them from `tun`; returns the UDP payloads in the order read.
fn routed_through(ns: &NetNs, tun: &mut UringTun, count: usize) -> Vec<Vec<u8>> {
    ns.in_ns(move || {
        let s = std::net::UdpSocket::bind((HOST, 0)).expect("bind in namespace");
        for i in 0..count {
            s.send_to(&content(i, 100 + i, 9), (PEER, 9))
                .expect("send_to");
        }
    });
    let until = Instant::now() + Duration::from_secs(5);
    let mut found = Vec::new();
    let mut batch = Batch::new();
    while found.len() < count && Instant::now() < until {
        batch.clear();
        tun.recv_batch(&mut batch).expect("recv_batch");
        for i in 0..batch.len() {
            let p = batch.payload(i);
            // The kernel sends packets of its own too (IPv6 router solicitations, ...).
            if p.len() >= 28 && p[0] == 0x45 && p[9] == 17 && p[16..20] == PEER.octets() {
                assert_eq!(usize::from(u16::from_be_bytes([p[2], p[3]])), p.len());
                found.push(p[28..].to_vec());
            }
        }
        if batch.is_empty() {
            wait_readable(tun.fd().unwrap(), until);
        }
    }
    found
}

fn tun_reads_what_the_kernel_routes(multishot: bool, offloads: bool) {
    let (ns, tun) = tun_in_ns(offloads);
    let mut tun = if multishot {
        UringTun::new(tun).unwrap()
    } else {
        UringTun::with_single_reads(tun).unwrap()
    };
    assert_eq!(
        tun.multishot(),
        multishot,
        "ReadMulti on this kernel (6.7+)"
    );
    for round in 0..2 {
        let count = 80; // more than a batch
        let found = routed_through(&ns, &mut tun, count);
        assert_eq!(found.len(), count, "round {round}");
        for (i, p) in found.iter().enumerate() {
            assert!(
                p[..] == content(i, 100 + i, 9)[..],
                "round {round} packet {i}"
            );
        }
    }
}

#[test]
fn uring_tun_reads_routed_packets_multishot() {
    let test = "uring_tun_reads_routed_packets_multishot";
    if require_netns(test) && uring_usable(test) {
        tun_reads_what_the_kernel_routes(true, false);
        tun_reads_what_the_kernel_routes(true, true);
    }
}

#[test]
fn uring_tun_reads_routed_packets_one_by_one() {
    let test = "uring_tun_reads_routed_packets_one_by_one";
    if require_netns(test) && uring_usable(test) {
        tun_reads_what_the_kernel_routes(false, false);
        tun_reads_what_the_kernel_routes(false, true);
    }
}

fn tun_delivers_written_packets(multishot: bool, offloads: bool) {
    let (ns, tun) = tun_in_ns(offloads);
    let mut tun = if multishot {
        UringTun::new(tun).unwrap()
    } else {
        UringTun::with_single_reads(tun).unwrap()
    };
    let sock = ns.in_ns(|| std::net::UdpSocket::bind((HOST, 0)).expect("bind in namespace"));
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let port = sock.local_addr().unwrap().port();
    let from = SocketAddr::from((PEER, 40000));

    // Garbage and an empty packet are refused; the rest arrive.
    let mut batch = Batch::new();
    push(&mut batch, &[0xf0, 1, 2, 3], from);
    push(&mut batch, &[], from);
    let payloads: Vec<Vec<u8>> = (0..5).map(|i| content(i, 300 + 50 * i, 4)).collect();
    for p in &payloads {
        push(&mut batch, &ipv4_udp((PEER, 40000), (HOST, port), p), from);
    }
    assert_eq!(tun.send_batch(&mut batch).unwrap(), payloads.len());
    let mut buf = [0u8; 2048];
    for (i, want) in payloads.iter().enumerate() {
        let (n, src) = sock.recv_from(&mut buf).expect("a written packet arrives");
        assert_eq!(&buf[..n], &want[..], "packet {i}");
        assert_eq!(src, from);
    }

    if tun.offloads().udp {
        // A run of one flow's equal-size datagrams goes out as one USO super-packet, which
        // the kernel splits again for the socket.
        let before = tun.coalesced();
        let mut batch = Batch::new();
        let run: Vec<Vec<u8>> = (0..20).map(|i| content(i, 1000, 5)).collect();
        for p in &run {
            push(&mut batch, &ipv4_udp((PEER, 40001), (HOST, port), p), from);
        }
        assert_eq!(tun.send_batch(&mut batch).unwrap(), run.len());
        assert!(tun.coalesced() > before, "nothing was coalesced");
        for (i, want) in run.iter().enumerate() {
            let (n, src) = sock
                .recv_from(&mut buf)
                .expect("a coalesced datagram arrives");
            assert_eq!(&buf[..n], &want[..], "datagram {i} of the run");
            assert_eq!(src, SocketAddr::from((PEER, 40001)));
        }
    }
}

#[test]
fn uring_tun_writes_reach_a_socket() {
    let test = "uring_tun_writes_reach_a_socket";
    if require_netns(test) && uring_usable(test) {
        for offloads in [false, true] {
            tun_delivers_written_packets(true, offloads);
            tun_delivers_written_packets(false, offloads);
        }
    }
}

/// The kernel ends a multishot recvmsg after every empty datagram, so a run of them ends it
/// again as soon as it is re-armed. Receiving must always leave one armed: a run of empty
/// datagrams (an attacker can send them) must not silence the socket.
#[test]
fn a_run_of_empty_datagrams_does_not_stop_receiving() {
    if !uring_usable("a_run_of_empty_datagrams_does_not_stop_receiving") {
        return;
    }
    let mut rx = uring_on(LOCAL4);
    let to = rx.local_addr();
    let sender = std::net::UdpSocket::bind((LOCAL4, 0)).unwrap();
    const EMPTY: usize = 40;
    for _ in 0..EMPTY {
        sender.send_to(&[], to).unwrap();
    }
    sender.send_to(b"after", to).unwrap();
    let mut got = Batch::new();
    recv_n(&mut rx, &mut got, EMPTY + 1);
    assert!((0..EMPTY).all(|i| got.payload(i).is_empty()));
    assert_eq!(got.payload(EMPTY), b"after");
    // And later datagrams still wake the ring.
    got.clear();
    sender.send_to(b"later", to).unwrap();
    recv_n(&mut rx, &mut got, 1);
    assert_eq!(got.payload(0), b"later");
}
