//! The AF_XDP path's next hops and frames against the real kernel, in network namespaces the
//! tests create (privileged; skipped without root unless TUNNELD_REQUIRE_ALL=1). Each
//! namespace, with every interface in it, is removed when its test ends, also on failure.
//!
//! Layout of every test: namespace A (ours: the resolver runs there) and B (the peer),
//! joined by a veth pair with fixed MACs; A 192.0.2.1/24 fd00::1/64, B 192.0.2.2/24
//! 192.0.2.3/24 fd00::2/64.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tunneld_dataplane::xdp::frame::{self, Hop};
use tunneld_dataplane::xdp::nexthop::{interface_addresses, NextHops, Resolution, Resolver};
use tunneld_testnet::{require_netns, unique_name, veth, NetNs};

const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];
const MAC_B2: [u8; 6] = [0x02, 0, 0, 0, 0, 0xbb];

/// Counts this thread's allocations (a thread-local counter: other tests run in parallel).
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator unchanged; the counter is a const-initialised
// thread-local (no allocation, no lazy initialisation) and `try_with` tolerates teardown.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: the caller's layout goes to the system allocator as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: as the caller promises for `realloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn mac(bytes: [u8; 6]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("test address")
}

struct Net {
    a: Arc<NetNs>,
    b: Arc<NetNs>,
    a_if: String,
    b_if: String,
}

fn net() -> Net {
    let a = Arc::new(NetNs::new());
    let b = Arc::new(NetNs::new());
    let (a_if, b_if) = veth(&a, "192.0.2.1/24", &b, "192.0.2.2/24");
    a.run(&["ip", "link", "set", &a_if, "address", &mac(MAC_A)]);
    b.run(&["ip", "link", "set", &b_if, "address", &mac(MAC_B)]);
    a.run(&[
        "ip",
        "-6",
        "addr",
        "add",
        "fd00::1/64",
        "dev",
        &a_if,
        "nodad",
    ]);
    b.run(&[
        "ip",
        "-6",
        "addr",
        "add",
        "fd00::2/64",
        "dev",
        &b_if,
        "nodad",
    ]);
    b.run(&["ip", "addr", "add", "192.0.2.3/24", "dev", &b_if]);
    Net { a, b, a_if, b_if }
}

/// The interface's index, asked from a thread inside its namespace.
fn ifindex(name: &str) -> u32 {
    let c = std::ffi::CString::new(name).expect("name");
    // SAFETY: a valid NUL-terminated string for the duration of the call.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    assert_ne!(index, 0, "no interface {name}");
    index
}

/// Runs a command in the calling thread's namespace (children inherit it).
fn sh(argv: &[&str]) {
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {argv:?}: {e}"));
    assert!(
        out.status.success(),
        "{argv:?} failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Resolves until `want` says yes, for at most `limit`; returns the last answer and when.
fn resolve_until(
    resolver: &mut Resolver,
    dst: SocketAddr,
    limit: Duration,
    want: impl Fn(&Resolution) -> bool,
) -> (Resolution, Duration) {
    let start = Instant::now();
    loop {
        let got = resolver.resolve(dst);
        if want(&got) || start.elapsed() > limit {
            return (got, start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn ready_with(dst_mac: [u8; 6]) -> impl Fn(&Resolution) -> bool {
    move |r| matches!(r, Resolution::Ready(hop) if hop.dst_mac == dst_mac)
}

#[test]
fn resolves_on_link_unresolved_gateway_and_elsewhere_v4() {
    if !require_netns("resolves_on_link_unresolved_gateway_and_elsewhere_v4") {
        return;
    }
    let net = net();
    // Another interface in A (a veth pair of its own; the kernel may lack `dummy`).
    let (other_if, other_peer) = (unique_name("vo"), unique_name("vp"));
    net.a.run(&[
        "ip",
        "link",
        "add",
        &other_if,
        "type",
        "veth",
        "peer",
        "name",
        &other_peer,
    ]);
    net.a
        .run(&["ip", "addr", "add", "203.0.113.1/24", "dev", &other_if]);
    net.a.run(&["ip", "link", "set", &other_if, "up"]);
    net.a.run(&["ip", "link", "set", &other_peer, "up"]);
    net.a
        .run(&["ip", "route", "add", "198.51.100.0/24", "via", "192.0.2.2"]);
    let a_if = net.a_if.clone();
    net.a.in_ns(move || {
        let index = ifindex(&a_if);
        let nexthops = NextHops::start(index).expect("start");
        let mut resolver = Resolver::new(Arc::clone(&nexthops)).expect("resolver");
        let peer = addr("192.0.2.2:51820");

        // Nothing in the neighbour table yet: unresolved, and asked again only after a while.
        assert_eq!(resolver.resolve(peer), Resolution::Unresolved);
        sh(&["ping", "-c", "1", "-W", "2", "192.0.2.2"]);
        let want = Hop {
            src_mac: MAC_A,
            dst_mac: MAC_B,
            src_ip: "192.0.2.1".parse().unwrap(),
            ifindex: index,
        };
        let (got, took) = resolve_until(&mut resolver, peer, Duration::from_secs(1), |r| {
            *r == Resolution::Ready(want)
        });
        assert_eq!(got, Resolution::Ready(want), "after a ping ({took:?})");

        // Unresolved until the kernel sends there itself; then the neighbour event brings it.
        let other = addr("192.0.2.3:51820");
        assert_eq!(resolver.resolve(other), Resolution::Unresolved);
        let before = nexthops.generation();
        let socket = UdpSocket::bind("0.0.0.0:0").unwrap();
        socket.send_to(b"resolve me", other).unwrap();
        let (got, took) = resolve_until(
            &mut resolver,
            other,
            Duration::from_secs(1),
            ready_with(MAC_B),
        );
        assert_eq!(got, Resolution::Ready(want), "after a kernel send");
        assert_ne!(
            nexthops.generation(),
            before,
            "the neighbour event moved it"
        );
        eprintln!("unresolved -> ready after one kernel send: {took:?}");

        // Through a gateway: the gateway's MAC.
        let behind = addr("198.51.100.7:51820");
        assert_eq!(resolver.resolve(behind), Resolution::Ready(want));

        // Not out of the XDP interface: another interface, local, loopback, no route.
        for dst in [
            "203.0.113.5:1",
            "192.0.2.1:1",
            "127.0.0.1:1",
            "10.200.0.1:1",
            "192.0.2.255:1",
        ] {
            assert_eq!(resolver.resolve(addr(dst)), Resolution::Elsewhere, "{dst}");
        }
        assert_eq!(resolver.errors(), 0);

        // A cache hit allocates nothing.
        let dsts = [peer, other, behind, addr("203.0.113.5:1")];
        for dst in dsts {
            resolver.resolve(dst);
        }
        let generation = nexthops.generation();
        let before = ALLOCATIONS.with(Cell::get);
        let t = Instant::now();
        for i in 0..40_000 {
            std::hint::black_box(resolver.resolve(dsts[i % dsts.len()]));
        }
        let per_hit = t.elapsed() / 40_000;
        let allocations = ALLOCATIONS.with(Cell::get) - before;
        if nexthops.generation() == generation {
            assert_eq!(allocations, 0, "allocations on 40000 cache hits");
        }
        eprintln!("cache hit: {per_hit:?} (debug build), {allocations} allocations in 40000");

        // The interface's addresses, for the XDP program's map.
        let addresses = interface_addresses(index).expect("addresses");
        for want in ["192.0.2.1", "fd00::1"] {
            assert!(
                addresses.contains(&want.parse::<IpAddr>().unwrap()),
                "{want} in {addresses:?}"
            );
        }
        assert!(!addresses.contains(&"203.0.113.1".parse::<IpAddr>().unwrap()));

        // A STALE neighbour is confirmed through the kernel once a second, per neighbour.
        sh(&[
            "ip",
            "neigh",
            "change",
            "192.0.2.2",
            "dev",
            &a_if,
            "lladdr",
            &mac(MAC_B),
            "nud",
            "stale",
        ]);
        let now = Instant::now();
        assert!(!resolver.confirm_due(addr("203.0.113.5:1"), now));
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            // Until the event has emptied the cache and the new state is read.
            resolver.resolve(peer);
            resolver.resolve(behind);
            if resolver.confirm_due(behind, now) || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!resolver.confirm_due(peer, now), "the same neighbour");
        assert!(!resolver.confirm_due(peer, now + Duration::from_millis(900)));
        assert!(resolver.confirm_due(peer, now + Duration::from_millis(1001)));
        assert!(!resolver.confirm_due(behind, now + Duration::from_millis(1500)));

        // Dropping the last reference stops the event thread.
        let name = format!("nexthop-{index}");
        let threads = || {
            std::fs::read_dir("/proc/self/task")
                .unwrap()
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .filter(|comm| comm.trim() == name)
                .count()
        };
        assert_eq!(threads(), 1);
        drop(resolver);
        let t = Instant::now();
        drop(nexthops);
        assert_eq!(threads(), 0);
        eprintln!("event thread stopped in {:?}", t.elapsed());
    });
}

#[test]
fn resolves_ipv6_on_link() {
    if !require_netns("resolves_ipv6_on_link") {
        return;
    }
    let net = net();
    let a_if = net.a_if.clone();
    net.a.in_ns(move || {
        let index = ifindex(&a_if);
        let nexthops = NextHops::start(index).expect("start");
        let mut resolver = Resolver::new(nexthops).expect("resolver");
        let peer = addr("[fd00::2]:51820");
        assert_eq!(resolver.resolve(peer), Resolution::Unresolved);
        sh(&["ping", "-6", "-c", "1", "-W", "2", "fd00::2"]);
        let want = Hop {
            src_mac: MAC_A,
            dst_mac: MAC_B,
            src_ip: "fd00::1".parse().unwrap(),
            ifindex: index,
        };
        let (got, took) = resolve_until(&mut resolver, peer, Duration::from_secs(1), |r| {
            *r == Resolution::Ready(want)
        });
        assert_eq!(got, Resolution::Ready(want), "after a ping ({took:?})");
        assert_eq!(resolver.resolve(addr("[::1]:1")), Resolution::Elsewhere);
        assert_eq!(
            resolver.resolve(addr("[2001:db8::1]:1")),
            Resolution::Elsewhere
        );
    });
}

#[test]
fn a_peer_that_changes_its_mac_and_says_so_is_followed_within_a_second() {
    if !require_netns("a_peer_that_changes_its_mac_and_says_so_is_followed_within_a_second") {
        return;
    }
    let net = net();
    for key in [
        "net.ipv4.conf.all.arp_notify=1",
        "net.ipv6.conf.all.ndisc_notify=1",
    ] {
        net.b.run(&["sysctl", "-q", "-w", key]);
    }
    for key in ["arp_notify", "ndisc_notify"] {
        let family = if key == "arp_notify" { "ipv4" } else { "ipv6" };
        let setting = format!("net.{family}.conf.{}.{key}=1", net.b_if);
        net.b.run(&["sysctl", "-q", "-w", &setting]);
    }
    let a_if = net.a_if.clone();
    let b = Arc::clone(&net.b);
    let b_if = net.b_if.clone();
    net.a.in_ns(move || {
        let index = ifindex(&a_if);
        let nexthops = NextHops::start(index).expect("start");
        let mut resolver = Resolver::new(Arc::clone(&nexthops)).expect("resolver");
        let (v4, v6) = (addr("192.0.2.2:51820"), addr("[fd00::2]:51820"));
        sh(&["ping", "-c", "1", "-W", "2", "192.0.2.2"]);
        sh(&["ping", "-6", "-c", "1", "-W", "2", "fd00::2"]);
        for dst in [v4, v6] {
            let (got, _) = resolve_until(
                &mut resolver,
                dst,
                Duration::from_secs(1),
                ready_with(MAC_B),
            );
            assert!(ready_with(MAC_B)(&got), "{dst}: {got:?}");
        }
        let before = nexthops.generation();
        b.run(&["ip", "link", "set", &b_if, "address", &mac(MAC_B2)]);
        for dst in [v4, v6] {
            let (got, took) = resolve_until(
                &mut resolver,
                dst,
                Duration::from_secs(1),
                ready_with(MAC_B2),
            );
            assert!(ready_with(MAC_B2)(&got), "{dst} after the change: {got:?}");
            eprintln!("{dst}: new MAC after {took:?}");
        }
        assert_ne!(nexthops.generation(), before);
    });
}

/// An AF_PACKET socket on one interface, for sending and capturing whole frames.
fn packet_socket(ifindex: u32) -> OwnedFd {
    let all = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket creation; a negative return is an error.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(all)) };
    assert!(fd >= 0, "AF_PACKET: {}", std::io::Error::last_os_error());
    // SAFETY: a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_ll is plain data; all-zero is valid before the fields are set.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = all;
    sll.sll_ifindex = ifindex as i32;
    // SAFETY: binds to a valid sockaddr_ll of the given size.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    assert_eq!(rc, 0, "bind AF_PACKET: {}", std::io::Error::last_os_error());
    fd
}

fn send_frame(fd: &OwnedFd, frame: &[u8]) {
    // SAFETY: sends from a valid buffer of the given length.
    let n = unsafe { libc::send(fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
    assert_eq!(
        n,
        frame.len() as isize,
        "{}",
        std::io::Error::last_os_error()
    );
}

/// A frame with `payload` at offset 64, headers written in front by `write_headers`.
fn built(hop: &Hop, dst: SocketAddr, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; 64 + payload.len()];
    buf[64..].copy_from_slice(payload);
    let start = frame::write_headers(
        &mut buf,
        64,
        payload.len(),
        hop,
        40000,
        dst,
        frame::UdpChecksum::Full,
    )
    .expect("fits");
    buf.drain(..start);
    buf
}

#[test]
fn frames_built_here_reach_a_kernel_socket_and_kernel_frames_parse() {
    if !require_netns("frames_built_here_reach_a_kernel_socket_and_kernel_frames_parse") {
        return;
    }
    let net = net();
    // The peer's kernel sockets: one per family, on B.
    let receivers: Vec<UdpSocket> = net.b.in_ns(|| {
        ["192.0.2.2:5555", "[fd00::2]:5555"]
            .into_iter()
            .map(|a| {
                let s = UdpSocket::bind(a).expect("bind in B");
                s.set_read_timeout(Some(Duration::from_millis(300)))
                    .unwrap();
                s
            })
            .collect()
    });
    let a_if = net.a_if.clone();
    let frames = net.a.in_ns(move || {
        let index = ifindex(&a_if);
        sh(&["ping", "-c", "1", "-W", "2", "192.0.2.2"]);
        sh(&["ping", "-6", "-c", "1", "-W", "2", "fd00::2"]);
        let nexthops = NextHops::start(index).expect("start");
        let mut resolver = Resolver::new(nexthops).expect("resolver");
        let fd = packet_socket(index);
        let mut sent = Vec::new();
        for dst in [addr("192.0.2.2:5555"), addr("[fd00::2]:5555")] {
            let (Resolution::Ready(hop), _) =
                resolve_until(&mut resolver, dst, Duration::from_secs(1), |r| {
                    matches!(r, Resolution::Ready(_))
                })
            else {
                panic!("{dst} not resolved");
            };
            // An odd length, so the checksum's padding byte is exercised too.
            let good = built(&hop, dst, b"through AF_PACKET, odd length");
            let mut bad = built(&hop, dst, b"corrupted checksum");
            let at = bad.len() - b"corrupted checksum".len() - 2;
            bad[at] ^= 0x5a;
            send_frame(&fd, &bad);
            send_frame(&fd, &good);
            sent.push(good);
        }
        sent
    });
    for (socket, frame) in receivers.iter().zip(&frames) {
        let mut buf = [0u8; 200];
        let (n, from) = socket.recv_from(&mut buf).expect("the good frame arrives");
        assert_eq!(&buf[..n], b"through AF_PACKET, odd length");
        assert_eq!(from.port(), 40000);
        let parsed = frame::parse_udp(frame).unwrap();
        assert_eq!(parsed.from.ip(), from.ip());
        // The corrupted one was dropped by the kernel's checksum check: the frames are
        // checked for real, so the good one's checksum is right.
        assert!(
            socket.recv_from(&mut buf).is_err(),
            "a datagram with a bad checksum was accepted: the test proves nothing"
        );
    }

    // The other way: the peer's kernel sends, we capture the frame on A and parse it.
    let a_if = net.a_if.clone();
    let b = Arc::clone(&net.b);
    net.a.in_ns(move || {
        let fd = packet_socket(ifindex(&a_if));
        let timeout = libc::timeval {
            tv_sec: 0,
            tv_usec: 200_000,
        };
        // SAFETY: SO_RCVTIMEO reads a timeval of the given size from a valid pointer.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&timeout as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        for (from, to) in [
            ("192.0.2.2:6000", "192.0.2.1:7777"),
            ("[fd00::2]:6000", "[fd00::1]:7777"),
        ] {
            let sender = b.in_ns(move || {
                let s = UdpSocket::bind(from).unwrap();
                s.send_to(b"from the kernel", to).unwrap();
                s
            });
            let deadline = Instant::now() + Duration::from_secs(2);
            let mut buf = [0u8; 2048];
            let found = loop {
                assert!(Instant::now() < deadline, "no frame to {to} captured");
                // SAFETY: receives into a valid buffer of the given length.
                let n =
                    unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
                if n <= 0 {
                    continue;
                }
                match frame::parse_udp(&buf[..n as usize]) {
                    Some(got) if got.dst_port == 7777 => break (got, n as usize),
                    _ => {}
                }
            };
            let (got, n) = found;
            assert_eq!(got.from, addr(from));
            assert_eq!(got.to, addr(to).ip());
            assert_eq!(&buf[got.payload.clone()], b"from the kernel");
            let segment = &buf[got.payload.start - 8..got.payload.end];
            let on_wire = u16::from_be_bytes([segment[6], segment[7]]);
            let full = frame::udp_checksum(got.from.ip(), got.to, segment);
            eprintln!(
                "{from} -> {to}: {n}-byte frame, UDP checksum on the wire {on_wire:#06x}, \
                 computed {full:#06x} ({})",
                if on_wire == full {
                    "complete"
                } else {
                    "not complete: CHECKSUM_PARTIAL"
                }
            );
            drop(sender);
        }
    });
}
