//! Pieces shared by the UDP backend tests (`udp_loopback.rs`, `uring.rs`).

#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::time::{Duration, Instant};
use tunneld_dataplane::udp::UdpSocket;
use tunneld_dataplane::{Batch, DatagramIo};

/// Makes the kernel refuse UDP GSO sends on `fd`: with transmit checksums off
/// (`SO_NO_CHECK`) a `UDP_SEGMENT` send fails with EINVAL, as on a route through IPsec it
/// fails with EIO.
pub fn refuse_gso(fd: RawFd) {
    let on: libc::c_int = 1;
    // SAFETY: `on` is a valid int for the duration of the call.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_NO_CHECK,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_NO_CHECK");
}

/// Sizes from empty to the largest UDP payload, most of them typical tunnel sizes.
pub fn size(i: usize, max: usize) -> usize {
    match i {
        0 => 0,
        1 => 1,
        2 => max,
        3 => 9000,
        4 => 1420,
        5 => 1500,
        _ => (i * 97) % 1600 + 2,
    }
}

/// The bytes of datagram `i` of a batch, `len` long, marked by `tag`.
pub fn content(i: usize, len: usize, tag: u8) -> Vec<u8> {
    (0..len)
        .map(|k| (k as u8).wrapping_mul(31) ^ (i as u8) ^ tag)
        .collect()
}

/// Whether `fd` polls readable before `until`.
pub fn wait_readable(fd: RawFd, until: Instant) -> bool {
    let left = until.saturating_duration_since(Instant::now());
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let rc = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(10_000) as libc::c_int) };
    rc > 0 && pfd.revents & libc::POLLIN != 0
}

/// Receives into `batch` until it holds `n` frames or five seconds pass.
pub fn recv_n(io: &mut impl DatagramIo, batch: &mut Batch, n: usize) {
    let until = Instant::now() + Duration::from_secs(5);
    while batch.len() < n {
        io.recv_batch(batch).expect("recv_batch");
        if batch.len() >= n || Instant::now() >= until {
            break;
        }
        wait_readable(io.fd().unwrap(), until);
    }
    assert_eq!(batch.len(), n, "datagrams received");
}

/// A plain socket on `ip` with GRO off (one datagram per frame). IPv6 tests run inside
/// `with_ipv6_loopback`, so `::1` is there.
pub fn bind(ip: IpAddr) -> UdpSocket {
    let mut s =
        UdpSocket::bind_addr(SocketAddr::new(ip, 0)).unwrap_or_else(|e| panic!("bind {ip}: {e}"));
    s.set_gro(false);
    s
}
