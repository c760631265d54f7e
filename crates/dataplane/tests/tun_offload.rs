//! TUN offloads against the kernel itself: two namespaces, each with a TUN opened with
//! offloads, joined by a relay that does what the worker does without the encryption —
//! super-packets read from one TUN are cut into segments, and segments are written to the other
//! TUN coalesced. Real TCP (IPv4, IPv6) and UDP GSO traffic crosses it; the bytes must arrive
//! intact, and the relay must have seen super-packets both ways (so the offload paths ran).
//! Privileged: skipped without root unless TUNNELD_REQUIRE_ALL=1.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tunneld_dataplane::offload::{self, GSO_NONE, GSO_UDP_L4};
use tunneld_dataplane::tun::Tun;
use tunneld_dataplane::{Batch, PacketIo, FRAME_PAYLOAD};
use tunneld_testnet::{require_netns, unique_name, NetNs};

/// What the relay saw, per direction.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    /// Packets read from the TUN that were super-packets (GSO type set).
    super_packets: u64,
    /// Of those, UDP ones.
    udp_super_packets: u64,
    /// Segments cut from them.
    segments: u64,
    /// Packets written as part of a super-packet.
    coalesced: u64,
}

struct Relay {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<[Seen; 2]>>,
}

impl Relay {
    fn start(tuns: [Tun; 2]) -> Relay {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || relay(tuns, &flag));
        Relay {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the relay and returns what it saw (once; later calls return nothing).
    fn finish_now(&mut self) -> [Seen; 2] {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .map(|t| t.join().expect("relay thread"))
            .unwrap_or_default()
    }

    fn finish(mut self) -> [Seen; 2] {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .map(|t| t.join().expect("relay thread"))
            .unwrap_or_default()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Moves packets between the two TUNs until told to stop (or 60 s, a bound for a broken test).
fn relay(mut tuns: [Tun; 2], stop: &AtomicBool) -> [Seen; 2] {
    let mut seen = [Seen::default(); 2];
    let mut rx = Batch::new();
    let mut tx = Batch::new();
    let mut scratch = vec![0u8; FRAME_PAYLOAD];
    let deadline = Instant::now() + Duration::from_secs(60);
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        let mut fds = tuns.each_ref().map(|t| libc::pollfd {
            fd: t.fd().expect("TUN descriptor"),
            events: libc::POLLIN,
            revents: 0,
        });
        // SAFETY: two valid pollfds for the duration of the call.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, 50) };
        for (from, s) in seen.iter_mut().enumerate() {
            let [a, b] = &mut tuns;
            let (src, dst) = if from == 0 { (a, b) } else { (b, a) };
            rx.clear();
            let n = src.recv_batch(&mut rx).expect("read TUN");
            for i in 0..n {
                let hdr = rx.offload(i);
                if hdr.gso_type != GSO_NONE {
                    s.super_packets += 1;
                    s.udp_super_packets += u64::from(hdr.gso_type == GSO_UDP_L4);
                }
                let (frame, len) = rx.frame_mut(i);
                let result = offload::segment(frame, len, &hdr, &mut scratch, |seg, len| {
                    if tx.is_full() {
                        s.coalesced += write(dst, &mut tx);
                    }
                    tx.next_free().expect("room after a flush")[..len].copy_from_slice(&seg[..len]);
                    tx.commit(len, SocketAddr::from(([0, 0, 0, 0], 0)));
                });
                let count = result.unwrap_or_else(|e| panic!("the kernel's own packet: {e}"));
                if hdr.gso_type != GSO_NONE {
                    s.segments += count as u64;
                }
            }
            s.coalesced += write(dst, &mut tx);
        }
    }
    seen
}

/// Writes the batch; returns how many packets went out inside a super-packet.
fn write(tun: &mut Tun, batch: &mut Batch) -> u64 {
    let before = tun.coalesced();
    tun.send_batch(batch).expect("write TUN");
    batch.clear();
    tun.coalesced() - before
}

struct Pair {
    a: NetNs,
    b: NetNs,
    relay: Relay,
    /// Whether the kernel took USO on the TUNs (Linux 6.2 and later).
    uso: bool,
}

/// Namespaces A (10.98.0.1, fd98::1) and B (.2, ::2), each with an offloading TUN, relayed.
fn pair() -> Pair {
    let a = NetNs::new();
    let b = NetNs::new();
    let mut tuns = Vec::new();
    for (ns, host) in [(&a, 1), (&b, 2)] {
        let name = unique_name("to");
        let tun = {
            let name = name.clone();
            ns.in_ns(move || Tun::open_with_offloads(&name))
                .unwrap_or_else(|e| panic!("open TUN with offloads: {e}"))
        };
        assert!(tun.offloads().tcp, "the kernel refused TSO on the TUN");
        ns.run(&[
            "ip",
            "addr",
            "add",
            &format!("10.98.0.{host}/24"),
            "dev",
            &name,
        ]);
        ns.run(&[
            "ip",
            "-6",
            "addr",
            "add",
            &format!("fd98::{host}/64"),
            "dev",
            &name,
            "nodad",
        ]);
        ns.run(&["ip", "link", "set", &name, "up"]);
        tuns.push(tun);
    }
    let uso = tuns.iter().all(|t| t.offloads().udp);
    let tuns: [Tun; 2] = tuns.try_into().expect("two TUNs");
    let relay = Relay::start(tuns);
    Pair { a, b, relay, uso }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i / 7) as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

/// B listens; A connects and sends `up`; B checks it and answers with `down`; A checks that.
fn tcp_both_ways(pair: &Pair, server: IpAddr, bytes: usize) {
    let listener = pair
        .b
        .in_ns(move || TcpListener::bind((server, 0)).expect("listen in B"));
    let port = listener.local_addr().unwrap().port();
    let up = pattern(bytes, 1);
    let down = pattern(bytes, 2);
    let (up_check, down_send) = (up.clone(), down.clone());
    let server_thread = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().expect("accept");
        conn.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut got = vec![0u8; up_check.len()];
        conn.read_exact(&mut got).expect("read in B");
        assert!(got == up_check, "bytes A→B differ");
        conn.write_all(&down_send).expect("write in B");
    });
    let got = pair.a.in_ns(move || {
        let mut conn =
            TcpStream::connect_timeout(&SocketAddr::new(server, port), Duration::from_secs(5))
                .expect("connect from A");
        conn.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        conn.write_all(&up).expect("write in A");
        let mut got = vec![0u8; down.len()];
        conn.read_exact(&mut got).expect("read in A");
        got == down
    });
    server_thread.join().expect("server in B");
    assert!(got, "bytes B→A differ");
}

#[test]
fn tcp_crosses_segmentation_and_coalescing_intact() {
    if !require_netns("tcp_crosses_segmentation_and_coalescing_intact") {
        return;
    }
    let pair = pair();
    tcp_both_ways(&pair, "10.98.0.2".parse().unwrap(), 8 << 20);
    tcp_both_ways(&pair, "fd98::2".parse().unwrap(), 8 << 20);
    let Pair {
        a: _a,
        b: _b,
        relay,
        ..
    } = pair;
    let seen = relay.finish();
    for (dir, s) in ["A→B", "B→A"].iter().zip(seen) {
        assert!(
            s.super_packets > 0,
            "{dir}: no TSO super-packet read: {s:?}"
        );
        assert!(
            s.segments > s.super_packets,
            "{dir}: nothing was cut: {s:?}"
        );
        assert!(
            s.coalesced > 0,
            "{dir}: nothing was written coalesced: {s:?}"
        );
    }
}

const UDP_SEGMENT: libc::c_int = 103;

fn set_int_option(s: &UdpSocket, level: libc::c_int, name: libc::c_int, value: libc::c_int) {
    // SAFETY: setsockopt reads one c_int that outlives the call.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(
        rc,
        0,
        "setsockopt {name}: {}",
        std::io::Error::last_os_error()
    );
}

#[test]
fn udp_gso_datagrams_cross_one_by_one() {
    if !require_netns("udp_gso_datagrams_cross_one_by_one") {
        return;
    }
    let mut pair = pair();
    let receiver = pair.b.in_ns(|| {
        let s = UdpSocket::bind("10.98.0.2:0").expect("bind in B");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // Everything is sent before anything is read: room for all of it.
        set_int_option(&s, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 8 << 20);
        s
    });
    let to = receiver.local_addr().unwrap();
    const SIZE: usize = 1200;
    const PER_SEND: usize = 20;
    const SENDS: usize = 10;
    pair.a.in_ns(move || {
        let s = UdpSocket::bind("10.98.0.1:0").expect("bind in A");
        set_int_option(&s, libc::SOL_UDP, UDP_SEGMENT, SIZE as libc::c_int);
        for k in 0..SENDS {
            // One send: PER_SEND datagrams of SIZE bytes, each numbered.
            let mut buf = Vec::with_capacity(SIZE * PER_SEND);
            for d in 0..PER_SEND {
                let mut datagram = pattern(SIZE, (k * PER_SEND + d) as u8);
                datagram[..4].copy_from_slice(&((k * PER_SEND + d) as u32).to_be_bytes());
                buf.extend_from_slice(&datagram);
            }
            s.send_to(&buf, to).expect("GSO send in A");
            // Paced, so a slow test machine does not overflow the receive buffer.
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    let mut got = [false; SENDS * PER_SEND];
    let mut buf = [0u8; 65536];
    for received in 0..SENDS * PER_SEND {
        let n = match receiver.recv(&mut buf) {
            Ok(n) => n,
            Err(e) => {
                let seen = pair.relay.finish_now();
                panic!("datagram {received} did not arrive in B ({e}); relay saw {seen:?}");
            }
        };
        assert_eq!(n, SIZE, "each datagram arrives with its own size");
        let index = u32::from_be_bytes(buf[..4].try_into().unwrap()) as usize;
        let mut expected = pattern(SIZE, index as u8);
        expected[..4].copy_from_slice(&(index as u32).to_be_bytes());
        assert!(buf[..n] == expected[..], "datagram {index} differs");
        assert!(
            !std::mem::replace(&mut got[index], true),
            "datagram {index} twice"
        );
    }
    let Pair {
        a: _a,
        b: _b,
        relay,
        uso,
    } = pair;
    let seen = relay.finish();
    // Kernels before 6.2 refuse USO on a TUN; then the kernel segments before the TUN.
    if uso {
        assert!(
            seen[0].udp_super_packets > 0,
            "no USO super-packet read: {:?}",
            seen[0]
        );
    }
}
