//! What a socket handle and the engine share: bounded SPSC rings of bytes (`rtrb`), the
//! wakers of the tokio tasks waiting on them, and flags that say who must wake whom.
//!
//! The rule for waking the engine without a system call per read or write: the engine sets
//! a flag when it is about to wait for the application (its ring to the application is full:
//! `rx_blocked`; its ring from the application is empty: `tx_idle`), then looks at the ring
//! once more; the application, after moving bytes, takes the flag and wakes the engine only
//! if it was set. A fence on each side between the ring update and the flag makes one of
//! the two see the other's change.

use atomic_waker::AtomicWaker;
use rtrb::{Consumer, Producer};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{fence, AtomicBool, AtomicU8, Ordering};

/// Bytes of each TCP stream's ring, each way. The stack's own buffers (the TCP windows) are
/// larger; these only pass bytes between the engine and the task.
pub(crate) const STREAM_RING: usize = 256 << 10;
/// Bytes of each UDP socket's ring, each way (framed datagrams).
pub(crate) const DATAGRAM_RING: usize = 256 << 10;

/// The stream failed; stored in [`StreamShared::error`].
pub(crate) const ERR_RESET: u8 = 1;

/// The state one TCP stream's handle and the engine share (besides the two rings).
#[derive(Debug)]
pub(crate) struct StreamShared {
    /// The task waiting for bytes to read.
    pub(crate) read_waker: AtomicWaker,
    /// The task waiting for room to write.
    pub(crate) write_waker: AtomicWaker,
    /// Engine: the peer sent FIN; once the ring is empty, reads return 0.
    pub(crate) eof: AtomicBool,
    /// Engine: the connection failed (`ERR_*`).
    pub(crate) error: AtomicU8,
    /// Application: no more writes (shut down, or the write half dropped); the engine
    /// sends FIN once the ring is drained.
    pub(crate) write_shut: AtomicBool,
    /// Application: the read half was dropped; what arrives is discarded.
    pub(crate) read_closed: AtomicBool,
    /// Engine: it waits for room in the ring to the application.
    pub(crate) rx_blocked: AtomicBool,
    /// Engine: it found the ring from the application empty.
    pub(crate) tx_idle: AtomicBool,
}

impl StreamShared {
    pub(crate) fn new() -> StreamShared {
        StreamShared {
            read_waker: AtomicWaker::new(),
            write_waker: AtomicWaker::new(),
            eof: AtomicBool::new(false),
            error: AtomicU8::new(0),
            write_shut: AtomicBool::new(false),
            read_closed: AtomicBool::new(false),
            rx_blocked: AtomicBool::new(false),
            // The engine has not looked at the ring yet: the first write wakes it.
            tx_idle: AtomicBool::new(true),
        }
    }

    /// Application side, after taking bytes: whether the engine asked to be woken for room.
    pub(crate) fn engine_wants_room(&self) -> bool {
        fence(Ordering::SeqCst);
        self.rx_blocked.swap(false, Ordering::AcqRel)
    }

    /// Application side, after adding bytes: whether the engine asked to be woken for data.
    pub(crate) fn engine_wants_data(&self) -> bool {
        fence(Ordering::SeqCst);
        self.tx_idle.swap(false, Ordering::AcqRel)
    }

    /// Engine side: marks that it waits on the application. The caller then looks at the
    /// ring again before relying on a wake-up.
    pub(crate) fn engine_waits(flag: &AtomicBool) {
        flag.store(true, Ordering::Release);
        fence(Ordering::SeqCst);
    }
}

/// The state one UDP socket's handle and the engine share.
#[derive(Debug, Default)]
pub(crate) struct DatagramShared {
    /// Tasks waiting for a datagram.
    pub(crate) recv_waker: AtomicWaker,
    /// Tasks waiting for room to send.
    pub(crate) send_waker: AtomicWaker,
    /// Engine: it waits for room in the ring to the application.
    pub(crate) rx_blocked: AtomicBool,
    /// Engine: it found the ring from the application empty.
    pub(crate) tx_idle: AtomicBool,
    /// Application: the socket was dropped.
    pub(crate) closed: AtomicBool,
}

impl DatagramShared {
    /// Application side, after moving a datagram: whether the engine asked (with `flag`)
    /// to be woken.
    pub(crate) fn engine_wants(&self, flag: &AtomicBool) -> bool {
        fence(Ordering::SeqCst);
        flag.swap(false, Ordering::AcqRel)
    }
}

/// A framed datagram's header in a ring: family (4 or 6), port, address (16 bytes), length.
pub(crate) const HEADER: usize = 1 + 2 + 16 + 2;

fn encode_header(addr: SocketAddr, len: u16) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    match addr.ip() {
        IpAddr::V4(ip) => {
            h[0] = 4;
            h[3..7].copy_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            h[0] = 6;
            h[3..19].copy_from_slice(&ip.octets());
        }
    }
    h[1..3].copy_from_slice(&addr.port().to_be_bytes());
    h[19..21].copy_from_slice(&len.to_be_bytes());
    h
}

fn decode_header(h: &[u8; HEADER]) -> (SocketAddr, usize) {
    let port = u16::from_be_bytes([h[1], h[2]]);
    let ip = if h[0] == 4 {
        IpAddr::V4(Ipv4Addr::new(h[3], h[4], h[5], h[6]))
    } else {
        let mut o = [0u8; 16];
        o.copy_from_slice(&h[3..19]);
        IpAddr::V6(Ipv6Addr::from(o))
    };
    (
        SocketAddr::new(ip, port),
        usize::from(u16::from_be_bytes([h[19], h[20]])),
    )
}

/// Appends one datagram (header and payload) if the ring has room for all of it.
pub(crate) fn push_datagram(ring: &mut Producer<u8>, to: SocketAddr, payload: &[u8]) -> bool {
    let Ok(len) = u16::try_from(payload.len()) else {
        return false;
    };
    let Ok(chunk) = ring.write_chunk_uninit(HEADER + payload.len()) else {
        return false;
    };
    let header = encode_header(to, len);
    // The chunk is exactly as long as header and payload: all of it is written and committed.
    chunk.fill_from_iter(header.iter().chain(payload).copied());
    true
}

/// The address and payload length of the datagram at the head of the ring, without
/// taking it.
pub(crate) fn peek_datagram(ring: &mut Consumer<u8>) -> Option<(SocketAddr, usize)> {
    let chunk = ring.read_chunk(HEADER).ok()?;
    let (a, b) = chunk.as_slices();
    let mut h = [0u8; HEADER];
    h[..a.len()].copy_from_slice(a);
    h[a.len()..].copy_from_slice(b);
    // Dropped without commit: nothing is taken.
    Some(decode_header(&h))
}

/// Takes the datagram at the head of the ring (whose payload is `len` bytes, as
/// [`peek_datagram`] said), copying as much of its payload as fits into `out`.
pub(crate) fn take_datagram(ring: &mut Consumer<u8>, len: usize, out: &mut [u8]) -> usize {
    let Ok(chunk) = ring.read_chunk(HEADER + len) else {
        return 0;
    };
    let (a, b) = chunk.as_slices();
    let n = len.min(out.len());
    let payload = a.iter().chain(b.iter()).skip(HEADER).take(n);
    for (dst, src) in out.iter_mut().zip(payload) {
        *dst = *src;
    }
    chunk.commit_all();
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagrams_round_trip_through_a_ring_across_its_end() {
        let (mut p, mut c) = rtrb::RingBuffer::<u8>::new(100);
        let a: SocketAddr = "10.1.2.3:4567".parse().unwrap();
        let b: SocketAddr = "[fd00::1]:9".parse().unwrap();
        for round in 0..20u8 {
            let payload = vec![round; usize::from(round) * 3];
            let to = if round % 2 == 0 { a } else { b };
            assert!(push_datagram(&mut p, to, &payload));
            let (from, len) = peek_datagram(&mut c).unwrap();
            assert_eq!((from, len), (to, payload.len()));
            let mut out = vec![0u8; len];
            assert_eq!(take_datagram(&mut c, len, &mut out), len);
            assert_eq!(out, payload);
        }
        assert!(
            !push_datagram(&mut p, a, &[0u8; 90]),
            "too big for the room"
        );
        assert!(peek_datagram(&mut c).is_none());
    }
}
