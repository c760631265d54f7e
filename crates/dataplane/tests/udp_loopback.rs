//! The UDP backend on loopback: full batches v4, v6 and across a dual-stack socket, datagrams
//! the kernel refuses, GSO sends (also where the kernel refuses GSO) and GRO receives. Most
//! tests turn GRO off on the receiver, as they check frame by frame;
//! `gro_merges_runs_and_datagrams_splits_them_back` turns it on.

mod common;

use common::{bind, content, recv_n, refuse_gso, size, wait_readable};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::RawFd;
use std::time::{Duration, Instant};
use tunneld_dataplane::udp::UdpSocket;
use tunneld_dataplane::{Batch, DatagramIo, BATCH_SIZE};
use tunneld_testnet::with_ipv6_loopback;

const LOCAL4: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const LOCAL6: IpAddr = IpAddr::V6(Ipv6Addr::LOCALHOST);

fn fill(batch: &mut Batch, n: usize, to: SocketAddr, tag: u8, max: usize) {
    for i in 0..n {
        let data = content(i, size(i, max), tag);
        let slot = batch.next_free().expect("free frame");
        slot[..data.len()].copy_from_slice(&data);
        batch.commit(data.len(), to);
    }
}

fn check(batch: &Batch, n: usize, from: SocketAddr, tag: u8, max: usize) {
    for i in 0..n {
        let want = content(i, size(i, max), tag);
        assert_eq!(batch.payload(i).len(), want.len(), "length of datagram {i}");
        assert!(batch.payload(i) == want, "content of datagram {i}");
        assert_eq!(batch.addr(i), from, "source of datagram {i}");
    }
}

fn addr_of(sock: &UdpSocket, ip: IpAddr) -> SocketAddr {
    SocketAddr::new(ip, sock.local_port())
}

/// Sends a full batch `from` → `to` (addressed to `to_ip`) and checks what arrives, from
/// `from_ip` and `from`'s port.
fn full_batch(from: &mut UdpSocket, from_ip: IpAddr, to: &mut UdpSocket, to_ip: IpAddr) {
    let from_addr = addr_of(from, from_ip);
    let max = if from_addr.is_ipv4() { 65507 } else { 65527 };
    let mut out = Batch::new();
    fill(&mut out, BATCH_SIZE, addr_of(to, to_ip), 0x5a, max);
    assert_eq!(from.send_batch(&mut out).unwrap(), BATCH_SIZE);
    let mut got = Batch::new();
    recv_n(to, &mut got, BATCH_SIZE);
    check(&got, BATCH_SIZE, from_addr, 0x5a, max);
    assert_eq!(
        to.recv_batch(&mut got).unwrap(),
        0,
        "a full batch takes nothing"
    );
    got.clear();
    assert_eq!(to.recv_batch(&mut got).unwrap(), 0, "nothing more was sent");
}

#[test]
fn full_batch_v4_to_v4() {
    let mut a = bind(LOCAL4);
    let mut b = bind(LOCAL4);
    assert_eq!(a.local_addr(), addr_of(&a, LOCAL4));
    full_batch(&mut a, LOCAL4, &mut b, LOCAL4);
    full_batch(&mut b, LOCAL4, &mut a, LOCAL4);
}

#[test]
fn full_batch_v6_to_v6() {
    with_ipv6_loopback("full_batch_v6_to_v6", || {
        let (mut a, mut b) = (bind(LOCAL6), bind(LOCAL6));
        full_batch(&mut a, LOCAL6, &mut b, LOCAL6);
        full_batch(&mut b, LOCAL6, &mut a, LOCAL6);
    });
}

#[test]
fn v4_and_v6_peers_share_a_dual_stack_socket() {
    with_ipv6_loopback("v4_and_v6_peers_share_a_dual_stack_socket", || {
        let mut ds = UdpSocket::bind(0).unwrap();
        ds.set_gro(false);
        assert_ne!(ds.local_port(), 0);
        assert!(ds.local_addr().is_ipv6(), "{}", ds.local_addr());

        // An IPv4 peer: the dual-stack socket sees a plain IPv4 source, and answers to it.
        let mut peer = bind(LOCAL4);
        let peer_addr = addr_of(&peer, LOCAL4);
        full_batch(&mut peer, LOCAL4, &mut ds, LOCAL4);
        let mut out = Batch::new();
        fill(&mut out, BATCH_SIZE, peer_addr, 0x17, 65507);
        assert_eq!(ds.send_batch(&mut out).unwrap(), BATCH_SIZE);
        let mut got = Batch::new();
        recv_n(&mut peer, &mut got, BATCH_SIZE);
        check(&got, BATCH_SIZE, addr_of(&ds, LOCAL4), 0x17, 65507);

        // An IPv6 peer on the same socket, both ways.
        let mut peer6 = bind(LOCAL6);
        full_batch(&mut peer6, LOCAL6, &mut ds, LOCAL6);
        full_batch(&mut ds, LOCAL6, &mut peer6, LOCAL6);
    });
}

#[test]
fn refused_and_unreachable_datagrams_do_not_fail_the_batch() {
    let mut tx = bind(LOCAL4);
    let mut rx = bind(LOCAL4);
    // A port nobody listens on: bind one, note it, close it.
    let closed = addr_of(&bind(LOCAL4), LOCAL4);
    let rx_addr = addr_of(&rx, LOCAL4);

    let mut out = Batch::new();
    let mut push = |to: SocketAddr, data: &[u8]| {
        out.next_free().unwrap()[..data.len()].copy_from_slice(data);
        out.commit(data.len(), to);
    };
    push(SocketAddr::new(LOCAL4, 0), b"port 0: EINVAL"); // refused by the kernel
    push(rx_addr, b"one");
    push(closed, b"to nobody"); // sent; an ICMP port unreachable comes back
    push(SocketAddr::new(LOCAL6, 9), b"IPv6 from an IPv4 socket"); // cannot be sent
    push(rx_addr, b"two");
    push(SocketAddr::new(LOCAL4, 0), b"port 0 again");
    push(rx_addr, b"three");
    let sent = tx.send_batch(&mut out).unwrap();
    assert_eq!(sent, 4, "three to rx and one to the closed port");

    let mut got = Batch::new();
    recv_n(&mut rx, &mut got, 3);
    for (i, want) in [&b"one"[..], b"two", b"three"].iter().enumerate() {
        assert_eq!(got.payload(i), *want);
        assert_eq!(got.addr(i), addr_of(&tx, LOCAL4));
    }

    // The unreachable report leaves the socket usable both ways.
    std::thread::sleep(Duration::from_millis(50));
    let mut empty = Batch::new();
    assert_eq!(tx.recv_batch(&mut empty).unwrap(), 0);
    let mut out = Batch::new();
    fill(&mut out, 3, rx_addr, 1, 100);
    assert_eq!(tx.send_batch(&mut out).unwrap(), 3);
    let mut got = Batch::new();
    recv_n(&mut rx, &mut got, 3);

    // The same through a dual-stack socket, to IPv4 destinations.
    let mut ds = UdpSocket::bind(0).unwrap();
    ds.set_gro(false);
    let mut out = Batch::new();
    let mut push = |to: SocketAddr, data: &[u8]| {
        out.next_free().unwrap()[..data.len()].copy_from_slice(data);
        out.commit(data.len(), to);
    };
    push(SocketAddr::new(LOCAL4, 0), b"refused");
    push(closed, b"to nobody");
    push(rx_addr, b"four");
    assert_eq!(ds.send_batch(&mut out).unwrap(), 2);
    let mut got = Batch::new();
    recv_n(&mut rx, &mut got, 1);
    assert_eq!(got.payload(0), b"four");
    assert_eq!(got.addr(0), addr_of(&ds, LOCAL4));
}

#[test]
fn recv_appends_after_the_frames_already_in_the_batch() {
    let mut tx = bind(LOCAL4);
    let mut rx = bind(LOCAL4);
    let mut empty = Batch::new();
    assert_eq!(rx.recv_batch(&mut empty).unwrap(), 0, "nothing ready");

    let mut out = Batch::new();
    fill(&mut out, 5, addr_of(&rx, LOCAL4), 9, 1000);
    assert_eq!(tx.send_batch(&mut out).unwrap(), 5);

    let mut got = Batch::new();
    let mine = SocketAddr::new(LOCAL6, 1);
    for _ in 0..BATCH_SIZE - 2 {
        got.next_free().unwrap()[..4].copy_from_slice(b"kept");
        got.commit(4, mine);
    }
    recv_n(&mut rx, &mut got, BATCH_SIZE);
    for i in 0..BATCH_SIZE - 2 {
        assert_eq!((got.payload(i), got.addr(i)), (&b"kept"[..], mine));
    }
    assert_eq!(got.payload(BATCH_SIZE - 2), out.payload(0));
    assert_eq!(got.payload(BATCH_SIZE - 1), out.payload(1));

    let mut rest = Batch::new();
    recv_n(&mut rx, &mut rest, 3);
    assert_eq!(rest.payload(0), out.payload(2));
}

/// Whether `fd` is non-blocking and close-on-exec.
fn nonblocking_cloexec(fd: RawFd) -> (bool, bool) {
    // SAFETY: fcntl with F_GETFL/F_GETFD only reads the descriptor's flags.
    let (fl, fd_flags) = unsafe {
        (
            libc::fcntl(fd, libc::F_GETFL),
            libc::fcntl(fd, libc::F_GETFD),
        )
    };
    (fl & libc::O_NONBLOCK != 0, fd_flags & libc::FD_CLOEXEC != 0)
}

#[test]
fn sockets_are_nonblocking_close_on_exec_with_big_buffers() {
    let ds = UdpSocket::bind(0).unwrap();
    let fd = ds.fd().unwrap();
    assert_eq!(nonblocking_cloexec(fd), (true, true));
    let mut v6only: libc::c_int = -1;
    let mut rcvbuf: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into the c_int it is given.
    unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_V6ONLY,
            (&mut v6only as *mut libc::c_int).cast(),
            &mut len,
        );
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&mut rcvbuf as *mut libc::c_int).cast(),
            &mut len,
        );
    }
    assert_eq!(v6only, 0, "dual-stack");
    // The kernel doubles what was set; the plain option is capped by net.core.rmem_max.
    assert!(rcvbuf >= 256 * 1024, "SO_RCVBUF {rcvbuf}");
}

#[test]
fn bind_errors_name_the_address() {
    let a = bind(LOCAL4);
    let taken = addr_of(&a, LOCAL4);
    let e = UdpSocket::bind_addr(taken).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse);
    assert!(
        e.to_string()
            .starts_with(&format!("cannot bind UDP socket {taken}: ")),
        "{e}"
    );
    // The dual-stack socket holds the port for IPv4 too.
    let ds = UdpSocket::bind(0).unwrap();
    let e = UdpSocket::bind_addr(addr_of(&ds, LOCAL4)).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse);
}

/// Runs of equal-size datagrams to one address leave as GSO sends; the receiver (no GRO)
/// must see every datagram, in order, byte for byte, with GSO on and off.
#[test]
fn equal_size_runs_arrive_whole_with_and_without_gso() {
    for gso in [true, false] {
        let mut a = bind(LOCAL4);
        let mut b = bind(LOCAL4);
        a.set_gso(gso);
        let (a_addr, b_addr) = (addr_of(&a, LOCAL4), addr_of(&b, LOCAL4));
        let mut out = Batch::new();
        // 50 full-size datagrams (more than one GSO send holds at 1452 bytes), then a short
        // one that ends the run, then two more full ones.
        let lens: Vec<usize> = (0..53).map(|i| if i == 50 { 100 } else { 1452 }).collect();
        for (i, len) in lens.iter().enumerate() {
            let c = content(i, *len, 7);
            out.next_free().unwrap()[..*len].copy_from_slice(&c);
            out.commit(*len, b_addr);
        }
        assert_eq!(a.send_batch(&mut out).unwrap(), lens.len(), "gso={gso}");
        let mut got = Batch::new();
        recv_n(&mut b, &mut got, lens.len());
        for (i, len) in lens.iter().enumerate() {
            assert_eq!(
                got.payload(i),
                &content(i, *len, 7)[..],
                "gso={gso} datagram {i}"
            );
            assert_eq!(got.addr(i), a_addr);
        }
    }
}

/// When the kernel refuses a GSO send, the backend turns GSO off and sends the same run
/// datagram by datagram: every one arrives, in order, and later batches go without GSO.
#[test]
fn gso_refused_by_the_kernel_falls_back_and_loses_nothing() {
    let mut a = bind(LOCAL4);
    let mut b = bind(LOCAL4);
    a.set_gso(true);
    assert!(a.gso(), "UDP GSO on this kernel");
    refuse_gso(a.fd().unwrap());
    let (a_addr, b_addr) = (addr_of(&a, LOCAL4), addr_of(&b, LOCAL4));
    for round in 0..2u8 {
        let mut out = Batch::new();
        let lens: Vec<usize> = (0..40).map(|i| if i == 30 { 100 } else { 1452 }).collect();
        for (i, len) in lens.iter().enumerate() {
            out.next_free().unwrap()[..*len].copy_from_slice(&content(i, *len, round));
            out.commit(*len, b_addr);
        }
        assert_eq!(a.send_batch(&mut out).unwrap(), lens.len(), "round {round}");
        assert!(!a.gso(), "GSO still on after the kernel refused it");
        let mut got = Batch::new();
        recv_n(&mut b, &mut got, lens.len());
        for (i, len) in lens.iter().enumerate() {
            assert_eq!(got.payload(i), &content(i, *len, round)[..], "datagram {i}");
            assert_eq!(got.addr(i), a_addr);
        }
    }
}

/// With GRO on, runs sent with GSO may arrive merged in one frame with their size recorded;
/// `Batch::datagrams` gives back every datagram, in order, byte for byte.
#[test]
fn gro_merges_runs_and_datagrams_splits_them_back() {
    let mut a = bind(LOCAL4);
    let mut b = bind(LOCAL4);
    b.set_gro(true);
    assert!(b.gro(), "UDP GRO on this kernel");
    let b_addr = addr_of(&b, LOCAL4);
    let lens: Vec<usize> = (0..53).map(|i| if i == 50 { 100 } else { 1452 }).collect();
    let mut out = Batch::new();
    for (i, len) in lens.iter().enumerate() {
        out.next_free().unwrap()[..*len].copy_from_slice(&content(i, *len, 3));
        out.commit(*len, b_addr);
    }
    assert_eq!(a.send_batch(&mut out).unwrap(), lens.len());

    let until = Instant::now() + Duration::from_secs(5);
    let mut got = Batch::new();
    let mut datagrams: Vec<Vec<u8>> = Vec::new();
    let mut merged_frames = 0;
    while datagrams.len() < lens.len() && Instant::now() < until {
        got.clear();
        b.recv_batch(&mut got).expect("recv_batch");
        for i in 0..got.len() {
            assert_eq!(got.addr(i), addr_of(&a, LOCAL4));
            let parts: Vec<&[u8]> = got.datagrams(i).collect();
            merged_frames += usize::from(parts.len() > 1);
            datagrams.extend(parts.into_iter().map(<[u8]>::to_vec));
        }
        if datagrams.len() < lens.len() {
            wait_readable(b.fd().unwrap(), until);
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

/// A frame the kernel merged on receipt (UDP GRO), sent on as it is, leaves as the same
/// datagrams (one GSO send): how a relay forwards what it cannot read.
#[test]
fn a_merged_frame_sent_on_leaves_as_its_datagrams() {
    let mut a = bind(LOCAL4);
    let mut relay = bind(LOCAL4);
    let mut c = bind(LOCAL4);
    relay.set_gro(true);
    c.set_gro(false);
    assert!(relay.gro() && relay.gso(), "UDP GRO and GSO on this kernel");
    let relay_addr = addr_of(&relay, LOCAL4);
    let lens: Vec<usize> = (0..40).map(|i| if i == 39 { 300 } else { 1200 }).collect();
    let mut out = Batch::new();
    for (i, len) in lens.iter().enumerate() {
        out.next_free().unwrap()[..*len].copy_from_slice(&content(i, *len, 9));
        out.commit(*len, relay_addr);
    }
    assert_eq!(a.send_batch(&mut out).unwrap(), lens.len());

    let until = Instant::now() + Duration::from_secs(5);
    let (mut got, mut forwarded) = (Batch::new(), 0);
    let mut merged_frames = 0;
    while forwarded < lens.len() && Instant::now() < until {
        got.clear();
        relay.recv_batch(&mut got).expect("recv_batch");
        for i in 0..got.len() {
            forwarded += got.datagrams(i).count();
            merged_frames += usize::from(got.segment_size(i) > 0);
            // On to C: same bytes, same segment size.
            let (len, segment) = (got.payload(i).len(), got.segment_size(i));
            got.set(i, len, addr_of(&c, LOCAL4));
            got.set_segment_size(i, segment);
        }
        assert_eq!(
            relay.send_batch(&mut got).unwrap(),
            (0..got.len())
                .map(|i| got.datagrams(i).count())
                .sum::<usize>()
        );
        if forwarded < lens.len() {
            wait_readable(relay.fd().unwrap(), until);
        }
    }
    assert!(
        merged_frames > 0,
        "the kernel merged nothing: GRO did not take effect"
    );
    let mut at_c = Batch::new();
    recv_n(&mut c, &mut at_c, lens.len());
    for (i, len) in lens.iter().enumerate() {
        assert!(
            at_c.payload(i) == content(i, *len, 9),
            "datagram {i} as sent"
        );
        assert_eq!(at_c.addr(i), relay_addr);
    }
}
