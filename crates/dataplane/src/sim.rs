//! In-memory backends for tests and benchmarks: no syscalls, no descriptors.
//!
//! [`link`] makes the two ends of a bounded datagram link; [`SimTun`] stands in for the TUN
//! device. Both keep their queues behind an `Arc<Mutex<..>>` so either end (or a clone of the
//! TUN handle) can live on another thread than the code under test. That lock makes them
//! unsuitable for the data path itself: they exist to drive the real code deterministically.
//! Buffers are recycled, so a steady stream allocates nothing after warm-up.

use crate::offload::VnetHdr;
use crate::{Batch, DatagramIo, PacketIo, FRAME_PAYLOAD};
use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, MutexGuard};

/// How many datagrams (or packets) a queue holds before it drops.
pub const SIM_QUEUE: usize = 4096;

/// A bounded FIFO of byte buffers, with a pool of spent buffers to reuse.
#[derive(Debug)]
struct Queue {
    items: VecDeque<Vec<u8>>,
    pool: Vec<Vec<u8>>,
    capacity: usize,
}

impl Queue {
    fn new(capacity: usize) -> Queue {
        Queue {
            items: VecDeque::new(),
            pool: Vec::new(),
            capacity,
        }
    }

    /// Queues a copy of `data`; `false` (nothing queued) when full.
    fn push(&mut self, data: &[u8]) -> bool {
        if self.items.len() >= self.capacity {
            return false;
        }
        let mut buf = self.pool.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(data);
        self.items.push_back(buf);
        true
    }

    /// Moves queued items into `batch` (with address `from`) until it is full or the queue is
    /// empty. Returns how many moved.
    fn drain_into(&mut self, batch: &mut Batch, from: SocketAddr) -> usize {
        let mut moved = 0;
        while let Some(slot) = batch.next_free() {
            let Some(buf) = self.items.pop_front() else {
                break;
            };
            // push() never queues more than FRAME_PAYLOAD bytes, so this copies it all.
            let len = buf.len().min(slot.len());
            slot[..len].copy_from_slice(&buf[..len]);
            batch.commit(len, from);
            self.recycle(buf);
            moved += 1;
        }
        moved
    }

    fn recycle(&mut self, buf: Vec<u8>) {
        if self.pool.len() < self.capacity {
            self.pool.push(buf);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A test that panicked while holding the lock leaves consistent queues; keep going.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// IPv4-mapped IPv6 addresses compare equal to their IPv4 form, as on a dual-stack socket.
fn canonical(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(a) => match a.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), a.port()),
            None => addr,
        },
        SocketAddr::V4(_) => addr,
    }
}

#[derive(Debug)]
struct Link {
    /// `queues[k]`: datagrams on their way to end `k`.
    queues: [Queue; 2],
    /// `dropped[k]`: datagrams end `k` sent that were lost.
    dropped: [u64; 2],
}

/// One end of a simulated datagram link made by [`link`]. Implements [`DatagramIo`]; its
/// [`fd`](DatagramIo::fd) is `None`.
#[derive(Debug)]
pub struct SimSocket {
    end: usize,
    local: SocketAddr,
    peer: SocketAddr,
    link: Arc<Mutex<Link>>,
}

/// The two ends of a link between `a` and `b`, each queue bounded at [`SIM_QUEUE`] datagrams.
/// What one end sends to the other's address, the other receives from the sender's address.
pub fn link(a: SocketAddr, b: SocketAddr) -> (SimSocket, SimSocket) {
    link_with_capacity(a, b, SIM_QUEUE)
}

/// [`link`] with queues of `capacity` datagrams in each direction.
pub fn link_with_capacity(a: SocketAddr, b: SocketAddr, capacity: usize) -> (SimSocket, SimSocket) {
    let link = Arc::new(Mutex::new(Link {
        queues: [Queue::new(capacity), Queue::new(capacity)],
        dropped: [0, 0],
    }));
    let a = canonical(a);
    let b = canonical(b);
    let end = |end, local, peer| SimSocket {
        end,
        local,
        peer,
        link: Arc::clone(&link),
    };
    (end(0, a, b), end(1, b, a))
}

impl SimSocket {
    /// This end's address (the source of what it sends).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The far end's address: the only destination that reaches anything.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// Datagrams this end sent that were lost: the far end's queue was full, or they were
    /// addressed to somebody other than the far end.
    pub fn dropped(&self) -> u64 {
        lock(&self.link).dropped[self.end]
    }

    /// Datagrams waiting for this end to receive them.
    pub fn pending(&self) -> usize {
        lock(&self.link).queues[self.end].items.len()
    }
}

impl DatagramIo for SimSocket {
    fn recv_batch(&mut self, batch: &mut Batch) -> io::Result<usize> {
        let mut link = lock(&self.link);
        Ok(link.queues[self.end].drain_into(batch, self.peer))
    }

    /// Like UDP, a datagram counts as sent even when the link then loses it; losses show in
    /// [`SimSocket::dropped`]. Returns `batch.len()`.
    fn send_batch(&mut self, batch: &mut Batch) -> io::Result<usize> {
        let mut link = lock(&self.link);
        let far = 1 - self.end;
        for i in 0..batch.len() {
            let delivered =
                canonical(batch.addr(i)) == self.peer && link.queues[far].push(batch.payload(i));
            if !delivered {
                link.dropped[self.end] += 1;
            }
        }
        Ok(batch.len())
    }

    fn fd(&self) -> Option<RawFd> {
        None
    }

    fn local_port(&self) -> u16 {
        self.local.port()
    }
}

#[derive(Debug)]
struct TunQueues {
    /// Packets the "kernel" handed over, for the tunnel to receive.
    inbound: Queue,
    /// The offload header of each inbound packet, in the same order.
    inbound_offloads: VecDeque<VnetHdr>,
    /// Packets the tunnel wrote, for the test to take.
    outbound: Queue,
    /// How many packets each of the last [`WRITE_CALLS_KEPT`] writes carried, oldest first.
    write_calls: VecDeque<usize>,
    dropped: u64,
}

/// Writes whose size [`SimTun::take_write_calls`] can report; older ones are forgotten, so
/// the record never grows (and never allocates after start-up).
const WRITE_CALLS_KEPT: usize = 256;

/// A simulated TUN device. Clones share the device: keep one to [`inject`](SimTun::inject)
/// and [`take`](SimTun::take) while the code under test owns another as its [`PacketIo`].
/// Both directions hold at most [`SIM_QUEUE`] packets (or the capacity given to
/// [`SimTun::with_capacity`]); its [`fd`](PacketIo::fd) is `None`.
#[derive(Debug, Clone)]
pub struct SimTun {
    queues: Arc<Mutex<TunQueues>>,
}

impl Default for SimTun {
    fn default() -> Self {
        Self::new()
    }
}

impl SimTun {
    pub fn new() -> SimTun {
        SimTun::with_capacity(SIM_QUEUE)
    }

    /// A device whose queues hold `capacity` packets each way.
    pub fn with_capacity(capacity: usize) -> SimTun {
        SimTun {
            queues: Arc::new(Mutex::new(TunQueues {
                inbound: Queue::new(capacity),
                inbound_offloads: VecDeque::new(),
                outbound: Queue::new(capacity),
                write_calls: VecDeque::with_capacity(WRITE_CALLS_KEPT),
                dropped: 0,
            })),
        }
    }

    /// Hands `packet` to the tunnel, as the kernel does with what it routes to the device.
    /// Returns `false` (and counts a drop) when the queue is full or the packet is larger
    /// than a frame.
    pub fn inject(&self, packet: &[u8]) -> bool {
        self.inject_offload(VnetHdr::default(), packet)
    }

    /// Like [`SimTun::inject`], with the offload header a TUN with offloads would give it
    /// (a TSO/USO super-packet, or a packet whose checksum is left to finish).
    pub fn inject_offload(&self, hdr: VnetHdr, packet: &[u8]) -> bool {
        let mut q = lock(&self.queues);
        let queued = packet.len() <= FRAME_PAYLOAD && q.inbound.push(packet);
        if queued {
            q.inbound_offloads.push_back(hdr);
        } else {
            q.dropped += 1;
        }
        queued
    }

    /// The oldest packet the tunnel wrote to the device, if any.
    pub fn take(&self) -> Option<Vec<u8>> {
        lock(&self.queues).outbound.items.pop_front()
    }

    /// Moves the oldest packet the tunnel wrote into `out` (replacing its contents) and
    /// recycles its buffer, so a steady stream allocates nothing. `false` if there is none.
    pub fn take_into(&self, out: &mut Vec<u8>) -> bool {
        let mut q = lock(&self.queues);
        let Some(buf) = q.outbound.items.pop_front() else {
            return false;
        };
        out.clear();
        out.extend_from_slice(&buf);
        q.outbound.recycle(buf);
        true
    }

    /// Packets the tunnel wrote that have not been taken.
    pub fn written(&self) -> usize {
        lock(&self.queues).outbound.items.len()
    }

    /// Packets injected that the tunnel has not received.
    pub fn pending(&self) -> usize {
        lock(&self.queues).inbound.items.len()
    }

    /// How many packets each write since the last call carried, oldest first (at most the
    /// last `WRITE_CALLS_KEPT`): which packets the tunnel handed over together, as a real
    /// TUN backend would coalesce them.
    pub fn take_write_calls(&self) -> Vec<usize> {
        lock(&self.queues).write_calls.drain(..).collect()
    }

    /// Packets lost in either direction because a queue was full (or too large to inject).
    pub fn dropped(&self) -> u64 {
        lock(&self.queues).dropped
    }
}

const NO_ADDR: SocketAddr = SocketAddr::V6(std::net::SocketAddrV6::new(
    std::net::Ipv6Addr::UNSPECIFIED,
    0,
    0,
    0,
));

impl PacketIo for SimTun {
    fn recv_batch(&mut self, batch: &mut Batch) -> io::Result<usize> {
        let mut q = lock(&self.queues);
        let start = batch.len();
        let moved = q.inbound.drain_into(batch, NO_ADDR);
        for i in start..start + moved {
            let hdr = q.inbound_offloads.pop_front().unwrap_or_default();
            batch.set_offload(i, hdr);
        }
        Ok(moved)
    }

    /// Returns the packets queued; those refused because the queue is full count in
    /// [`SimTun::dropped`].
    fn send_batch(&mut self, batch: &mut Batch) -> io::Result<usize> {
        let mut q = lock(&self.queues);
        let mut written = 0;
        for i in 0..batch.len() {
            if q.outbound.push(batch.payload(i)) {
                written += 1;
            } else {
                q.dropped += 1;
            }
        }
        if q.write_calls.len() == WRITE_CALLS_KEPT {
            q.write_calls.pop_front();
        }
        q.write_calls.push_back(batch.len());
        Ok(written)
    }

    fn fd(&self) -> Option<RawFd> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BATCH_SIZE;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn fill(batch: &mut Batch, n: usize, to: SocketAddr, tag: u8) {
        for i in 0..n {
            let slot = batch.next_free().unwrap();
            let len = 1 + i * 7;
            for (k, b) in slot[..len].iter_mut().enumerate() {
                *b = tag ^ (i as u8).wrapping_add(k as u8);
            }
            batch.commit(len, to);
        }
    }

    fn check(batch: &Batch, n: usize, from: SocketAddr, tag: u8) {
        assert_eq!(batch.len(), n);
        for i in 0..n {
            let want: Vec<u8> = (0..1 + i * 7)
                .map(|k| tag ^ (i as u8).wrapping_add(k as u8))
                .collect();
            assert_eq!(batch.payload(i), &want[..], "datagram {i}");
            assert_eq!(batch.addr(i), from);
        }
    }

    #[test]
    fn link_carries_both_ways_with_sender_address() {
        let (a_addr, b_addr) = (addr("192.0.2.1:51820"), addr("[2001:db8::2]:51821"));
        let (mut a, mut b) = link(a_addr, b_addr);
        assert_eq!(
            (a.fd(), a.local_port(), b.local_port()),
            (None, 51820, 51821)
        );
        assert_eq!((a.peer_addr(), b.peer_addr()), (b_addr, a_addr));

        let mut out = Batch::new();
        fill(&mut out, BATCH_SIZE, b_addr, 0xa5);
        assert_eq!(a.send_batch(&mut out).unwrap(), BATCH_SIZE);
        assert_eq!(b.pending(), BATCH_SIZE);
        let mut got = Batch::new();
        assert_eq!(b.recv_batch(&mut got).unwrap(), BATCH_SIZE);
        check(&got, BATCH_SIZE, a_addr, 0xa5);
        assert_eq!(b.recv_batch(&mut got).unwrap(), 0, "batch full");
        got.clear();
        assert_eq!(b.recv_batch(&mut got).unwrap(), 0, "queue empty");

        // Back, with a batch that is already partly filled on the receiving side.
        out.clear();
        fill(&mut out, 10, a_addr, 0x3c);
        assert_eq!(b.send_batch(&mut out).unwrap(), 10);
        let mut got = Batch::new();
        fill(&mut got, BATCH_SIZE - 4, b_addr, 0);
        assert_eq!(a.recv_batch(&mut got).unwrap(), 4);
        assert!(got.is_full());
        assert_eq!(got.payload(BATCH_SIZE - 4), out.payload(0));
        assert_eq!(got.addr(BATCH_SIZE - 1), b_addr);
        assert_eq!(a.pending(), 6);
        assert_eq!((a.dropped(), b.dropped()), (0, 0));
    }

    #[test]
    fn overflow_and_wrong_addresses_are_counted_drops() {
        let (a_addr, b_addr) = (addr("192.0.2.1:1"), addr("192.0.2.2:2"));
        let (mut a, mut b) = link_with_capacity(a_addr, b_addr, 100);
        let mut out = Batch::new();
        fill(&mut out, BATCH_SIZE, b_addr, 1);
        assert_eq!(a.send_batch(&mut out).unwrap(), BATCH_SIZE);
        assert_eq!(
            a.send_batch(&mut out).unwrap(),
            BATCH_SIZE,
            "sent, as UDP would"
        );
        assert_eq!(b.pending(), 100);
        assert_eq!(a.dropped(), 2 * BATCH_SIZE as u64 - 100);
        assert_eq!(b.dropped(), 0);

        // Nobody else is on the link; a mapped form of the peer's address is the peer.
        out.clear();
        fill(&mut out, 2, addr("192.0.2.3:2"), 1);
        fill(&mut out, 1, addr("[::ffff:192.0.2.1]:1"), 1);
        assert_eq!(b.send_batch(&mut out).unwrap(), 3);
        assert_eq!(b.dropped(), 2);
        assert_eq!(a.pending(), 1);

        // The default bound.
        let (mut a, b) = link(a_addr, b_addr);
        let mut out = Batch::new();
        fill(&mut out, BATCH_SIZE, b_addr, 1);
        for _ in 0..SIM_QUEUE / BATCH_SIZE + 1 {
            a.send_batch(&mut out).unwrap();
        }
        assert_eq!(b.pending(), SIM_QUEUE);
        assert_eq!(a.dropped(), BATCH_SIZE as u64);
    }

    #[test]
    fn sim_tun_both_directions_and_overflow() {
        let device = SimTun::with_capacity(3);
        let mut tun = device.clone();
        assert_eq!(tun.fd(), None);
        assert!(device.inject(&[0x45, 1, 2]));
        assert!(device.inject(&[0x60, 3]));
        assert!(device.inject(&[]));
        assert!(!device.inject(&[0x45]), "queue full");
        assert!(
            !SimTun::new().inject(&vec![0; FRAME_PAYLOAD + 1]),
            "larger than a frame"
        );
        assert_eq!((device.pending(), device.dropped()), (3, 1));

        let mut batch = Batch::new();
        assert_eq!(tun.recv_batch(&mut batch).unwrap(), 3);
        assert_eq!(batch.payload(0), &[0x45, 1, 2]);
        assert_eq!(batch.payload(1), &[0x60, 3]);
        assert_eq!(batch.payload(2), &[] as &[u8]);
        assert_eq!(tun.recv_batch(&mut batch).unwrap(), 0);

        batch.clear();
        fill(&mut batch, 5, NO_ADDR, 9);
        assert_eq!(
            tun.send_batch(&mut batch).unwrap(),
            3,
            "two refused: queue full"
        );
        assert_eq!((device.written(), device.dropped()), (3, 3));
        for i in 0..3 {
            assert_eq!(device.take().as_deref(), Some(batch.payload(i)));
        }
        assert_eq!(device.take(), None);
    }
}
