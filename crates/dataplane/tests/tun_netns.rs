//! The TUN backend inside network namespaces the tests create (privileged; skipped without
//! root unless TUNNELD_REQUIRE_ALL=1). Each namespace, and with it every interface and
//! socket inside, is removed when the test ends, also when it fails.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};
use tunneld_dataplane::tun::Tun;
use tunneld_dataplane::{Batch, PacketIo};
use tunneld_testnet::{require_netns, unique_name, NetNs};

const HOST: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);

/// A namespace with a TUN interface holding 10.99.0.1/24, up.
fn tun_in_ns() -> (NetNs, Tun) {
    let ns = NetNs::new();
    let name = unique_name("tun");
    let tun = {
        let name = name.clone();
        ns.in_ns(move || Tun::open(&name))
            .unwrap_or_else(|e| panic!("open TUN: {e}"))
    };
    assert_eq!(tun.name(), name);
    ns.run(&["ip", "addr", "add", "10.99.0.1/24", "dev", &name]);
    ns.run(&["ip", "link", "set", &name, "up"]);
    (ns, tun)
}

fn wait_readable(fd: i32, until: Instant) {
    let left = until.saturating_duration_since(Instant::now());
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(10_000) as libc::c_int) };
}

/// The ones' complement sum of 16-bit words, folded (RFC 1071).
fn checksum(chunks: &[&[u8]]) -> u16 {
    let mut sum: u32 = 0;
    for chunk in chunks {
        for pair in chunk.chunks(2) {
            let word = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
            sum += u32::from(word);
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An IPv4/UDP packet with correct checksums.
fn ipv4_udp(src: SocketAddr, dst: SocketAddr, payload: &[u8]) -> Vec<u8> {
    let (SocketAddr::V4(src), SocketAddr::V4(dst)) = (src, dst) else {
        panic!("IPv4 only");
    };
    let udp_len = (8 + payload.len()) as u16;
    let total = 20 + udp_len;
    let mut p = Vec::with_capacity(total as usize);
    p.extend_from_slice(&[0x45, 0]);
    p.extend_from_slice(&total.to_be_bytes());
    p.extend_from_slice(&[0x12, 0x34, 0x40, 0]); // id, don't fragment
    p.extend_from_slice(&[64, 17, 0, 0]); // ttl, UDP, checksum below
    p.extend_from_slice(&src.ip().octets());
    p.extend_from_slice(&dst.ip().octets());
    let ip_sum = checksum(&[&p]);
    p[10..12].copy_from_slice(&ip_sum.to_be_bytes());

    let mut udp = Vec::new();
    udp.extend_from_slice(&src.port().to_be_bytes());
    udp.extend_from_slice(&dst.port().to_be_bytes());
    udp.extend_from_slice(&udp_len.to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(payload);
    let pseudo = [&src.ip().octets()[..], &dst.ip().octets(), &[0, 17]];
    let mut sum = checksum(&[
        pseudo[0],
        pseudo[1],
        pseudo[2],
        &udp_len.to_be_bytes(),
        &udp,
    ]);
    if sum == 0 {
        sum = 0xffff;
    }
    udp[6..8].copy_from_slice(&sum.to_be_bytes());
    p.extend_from_slice(&udp);
    p
}

#[test]
fn tun_receives_what_the_kernel_routes_to_it() {
    if !require_netns("tun_receives_what_the_kernel_routes_to_it") {
        return;
    }
    let (ns, mut tun) = tun_in_ns();
    let payload = b"tunneld: through the TUN device";
    let src_port = ns.in_ns(move || {
        let s = UdpSocket::bind((HOST, 0)).expect("bind in namespace");
        s.send_to(payload, (PEER, 9)).expect("send_to");
        s.local_addr().unwrap().port()
    });

    let until = Instant::now() + Duration::from_secs(5);
    let mut batch = Batch::new();
    let found = loop {
        batch.clear();
        let n = tun.recv_batch(&mut batch).expect("recv_batch");
        // The kernel may also send its own packets (IPv6 router solicitations, ...).
        let hit = (0..n)
            .map(|i| batch.payload(i))
            .find(|p| p.len() >= 28 && p[0] == 0x45 && p[9] == 17 && p[16..20] == PEER.octets());
        if let Some(p) = hit {
            break p.to_vec();
        }
        assert!(
            Instant::now() < until,
            "no IPv4/UDP packet for {PEER} from the TUN"
        );
        wait_readable(tun.fd().unwrap(), until);
    };
    assert_eq!(found.len(), 28 + payload.len());
    assert_eq!(
        u16::from_be_bytes([found[2], found[3]]) as usize,
        found.len()
    );
    assert_eq!(checksum(&[&found[..20]]), 0, "IPv4 header checksum");
    assert_eq!(found[12..16], HOST.octets());
    assert_eq!(u16::from_be_bytes([found[20], found[21]]), src_port);
    assert_eq!(u16::from_be_bytes([found[22], found[23]]), 9);
    assert_eq!(&found[28..], payload);
}

#[test]
fn tun_delivers_written_packets_and_skips_refused_ones() {
    if !require_netns("tun_delivers_written_packets_and_skips_refused_ones") {
        return;
    }
    let (ns, mut tun) = tun_in_ns();
    let sock = ns.in_ns(|| UdpSocket::bind((HOST, 0)).expect("bind in namespace"));
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let to = sock.local_addr().unwrap();
    let from = SocketAddr::from((PEER, 40000));
    let payload = b"tunneld: written to the TUN device";
    let packet = ipv4_udp(from, to, payload);
    assert_eq!(checksum(&[&packet[..20]]), 0);

    let mut batch = Batch::new();
    for p in [&[0xf0, 1, 2, 3][..], &[], &packet] {
        batch.next_free().unwrap()[..p.len()].copy_from_slice(p);
        batch.commit(p.len(), from);
    }
    assert_eq!(
        tun.send_batch(&mut batch).unwrap(),
        1,
        "garbage and empty are refused"
    );

    let mut buf = [0u8; 2048];
    let (n, src) = sock
        .recv_from(&mut buf)
        .expect("the written packet arrives");
    assert_eq!(&buf[..n], payload);
    assert_eq!(src, from);
}

#[test]
fn tun_goes_away_when_dropped_and_errors_name_it() {
    if !require_netns("tun_goes_away_when_dropped_and_errors_name_it") {
        return;
    }
    let (ns, tun) = tun_in_ns();
    let name = tun.name().to_string();
    let fd = tun.fd().unwrap();
    // SAFETY: fcntl with F_GETFL/F_GETFD only reads the descriptor's flags.
    let (fl, fd_flags) = unsafe {
        (
            libc::fcntl(fd, libc::F_GETFL),
            libc::fcntl(fd, libc::F_GETFD),
        )
    };
    assert!(fl & libc::O_NONBLOCK != 0, "non-blocking");
    assert!(fd_flags & libc::FD_CLOEXEC != 0, "close-on-exec");
    assert!(ns.output(&["ip", "link", "show", &name]).status.success());

    // A name in use by an attached TUN is refused, and the error says which device.
    let taken = name.clone();
    let e = ns.in_ns(move || Tun::open(&taken)).unwrap_err();
    assert!(
        e.to_string()
            .starts_with(&format!("cannot create TUN device {name}: ")),
        "{e}"
    );
    // So is the name of a device that is not a TUN.
    let e = ns.in_ns(|| Tun::open("lo")).unwrap_err();
    assert!(
        e.to_string().starts_with("cannot create TUN device lo: "),
        "{e}"
    );

    // The kernel picks a name when given none.
    let any = ns
        .in_ns(|| Tun::open(""))
        .expect("open with a kernel-chosen name");
    assert!(any.name().starts_with("tun"), "{}", any.name());

    drop(tun);
    let out = ns.output(&["ip", "link", "show", &name]);
    assert!(!out.status.success(), "{name} still exists after drop");
}

/// A multi-queue TUN: the kernel spreads what it routes into the interface over the queues
/// by flow, each flow staying on one queue, and a packet written on any queue goes up.
#[test]
fn a_multi_queue_tun_spreads_flows_and_keeps_each_on_one_queue() {
    if !require_netns("a_multi_queue_tun_spreads_flows_and_keeps_each_on_one_queue") {
        return;
    }
    let ns = NetNs::new();
    let name = unique_name("tun");
    let mut queues = {
        let name = name.clone();
        ns.in_ns(move || Tun::open_queues(&name, 4, false))
            .unwrap_or_else(|e| panic!("open 4 queues: {e}"))
    };
    assert_eq!(queues.len(), 4);
    assert!(queues.iter().all(|q| q.name() == name));
    ns.run(&["ip", "addr", "add", "10.98.0.1/24", "dev", &name]);
    ns.run(&["ip", "link", "set", &name, "up"]);

    const FLOWS: u16 = 32;
    const PER_FLOW: usize = 5;
    ns.in_ns(|| {
        let sockets: Vec<std::net::UdpSocket> = (0..FLOWS)
            .map(|_| std::net::UdpSocket::bind("10.98.0.1:0").unwrap())
            .collect();
        for round in 0..PER_FLOW {
            for s in &sockets {
                s.send_to(&[round as u8; 20], "10.98.0.2:9").unwrap();
            }
        }
    });
    // Source port → the queues it was read from.
    let mut seen: std::collections::HashMap<u16, Vec<usize>> = Default::default();
    let until = Instant::now() + Duration::from_secs(5);
    let mut batch = Batch::new();
    while seen.values().map(Vec::len).sum::<usize>() < usize::from(FLOWS) * PER_FLOW
        && Instant::now() < until
    {
        for (q, tun) in queues.iter_mut().enumerate() {
            batch.clear();
            tun.recv_batch(&mut batch).expect("recv_batch");
            for i in 0..batch.len() {
                let p = batch.payload(i);
                if p.len() >= 28 && p[0] == 0x45 && p[9] == 17 && p[16..20] == [10, 98, 0, 2] {
                    seen.entry(u16::from_be_bytes([p[20], p[21]]))
                        .or_default()
                        .push(q);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(seen.len(), usize::from(FLOWS), "every flow arrived");
    for (port, qs) in &seen {
        assert_eq!(qs.len(), PER_FLOW, "flow {port}: {qs:?}");
        assert!(
            qs.iter().all(|q| *q == qs[0]),
            "flow {port} crossed queues: {qs:?}"
        );
    }
    let used: std::collections::HashSet<usize> = seen.values().map(|qs| qs[0]).collect();
    assert!(used.len() > 1, "32 flows all on one queue: {used:?}");

    // Written on the last queue, delivered by the stack to a socket.
    let (tx, rx) = std::sync::mpsc::channel();
    let listener = ns.spawn_in_ns(move || {
        let s = std::net::UdpSocket::bind("10.98.0.1:7777").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        tx.send(()).unwrap();
        let mut buf = [0; 64];
        s.recv(&mut buf).map(|n| buf[..n].to_vec()).ok()
    });
    rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let packet = ipv4_udp(
        "10.98.0.2:5000".parse().unwrap(),
        "10.98.0.1:7777".parse().unwrap(),
        b"via queue 3",
    );
    let mut out = Batch::new();
    out.next_free().unwrap()[..packet.len()].copy_from_slice(&packet);
    out.commit(packet.len(), "0.0.0.0:0".parse().unwrap());
    assert_eq!(queues[3].send_batch(&mut out).unwrap(), 1);
    assert_eq!(
        listener.join().unwrap().as_deref(),
        Some(&b"via queue 3"[..])
    );
}
