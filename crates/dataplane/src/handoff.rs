//! The one way work crosses between cores: bounded single-producer, single-consumer rings
//! from each worker to each other worker. A worker that reads a packet (or a handshake
//! initiation) belonging to a session another worker carries copies it into a parcel and
//! pushes it on that worker's ring; the owner takes it at its next turn. Parcels are made
//! once and travel back on a second ring when empty, so nothing is allocated after start-up
//! and no lock is taken: each ring has exactly one writer and one reader.

use crate::waker::Waker;
use rtrb::{Consumer, Producer, RingBuffer};
use std::net::SocketAddr;
use std::sync::Arc;

/// What a parcel carries.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Cargo {
    /// An IP packet read from the TUN, to encrypt.
    Packet,
    /// An IP packet to encrypt over its peer's sub-tunnel 0 (its own has no session).
    PacketOnFirst,
    /// A datagram received from `from`, to decrypt or answer.
    Datagram(SocketAddr),
}

#[derive(Debug)]
pub(crate) struct Parcel {
    pub cargo: Cargo,
    pub len: usize,
    /// Room for the longest packet (the MTU) and the padding encryption adds in place.
    pub buf: Box<[u8]>,
}

/// The sending end of the rings to one other worker.
#[derive(Debug)]
pub(crate) struct Outbox {
    full: Producer<Parcel>,
    empty: Consumer<Parcel>,
    waker: Arc<Waker>,
    parcel_size: usize,
    sent: bool,
}

/// The receiving end of the rings from one other worker.
#[derive(Debug)]
pub(crate) struct Inbox {
    full: Consumer<Parcel>,
    empty: Producer<Parcel>,
}

impl Outbox {
    /// Copies `data` into a parcel for the other worker. False (the caller counts a drop)
    /// when the ring is full or `data` is longer than a parcel.
    pub fn send(&mut self, cargo: Cargo, data: &[u8]) -> bool {
        // Room is left for the padding encryption adds in place.
        if data.len() + 16 > self.parcel_size {
            return false;
        }
        let Ok(mut parcel) = self.empty.pop() else {
            return false;
        };
        parcel.buf[..data.len()].copy_from_slice(data);
        parcel.len = data.len();
        parcel.cargo = cargo;
        // As many parcels as ring places: a parcel taken from `empty` always fits.
        let sent = self.full.push(parcel).is_ok();
        self.sent |= sent;
        sent
    }

    /// Wakes the other worker if parcels went out since the last call: once per batch.
    pub fn wake_if_sent(&mut self) {
        if std::mem::take(&mut self.sent) {
            self.waker.wake();
        }
    }
}

impl Inbox {
    /// The next parcel, if any.
    pub fn take(&mut self) -> Option<Parcel> {
        self.full.pop().ok()
    }

    /// Hands a parcel back to its sender once its contents are used.
    pub fn give_back(&mut self, parcel: Parcel) {
        // The return ring has room for every parcel there is.
        let _ = self.empty.push(parcel);
    }
}

/// Parcels per direction: enough for a few batches in flight, fewer with many workers (the
/// rings are N × (N - 1)).
pub(crate) fn ring_capacity(workers: usize) -> usize {
    (2048 / workers.saturating_sub(1).max(1)).clamp(32, 512)
}

/// The rings among `wakers.len()` workers: for each worker, its outboxes (indexed by the
/// receiving worker, `None` for itself) and its inboxes.
pub(crate) fn mesh(
    wakers: &[Arc<Waker>],
    parcel_size: usize,
) -> Vec<(Vec<Option<Outbox>>, Vec<Inbox>)> {
    let n = wakers.len();
    let capacity = ring_capacity(n);
    let mut ends: Vec<(Vec<Option<Outbox>>, Vec<Inbox>)> = (0..n)
        .map(|_| ((0..n).map(|_| None).collect(), Vec::new()))
        .collect();
    for from in 0..n {
        for to in (0..n).filter(|&to| to != from) {
            let (full_tx, full_rx) = RingBuffer::new(capacity);
            let (mut empty_tx, empty_rx) = RingBuffer::new(capacity);
            for _ in 0..capacity {
                let _ = empty_tx.push(Parcel {
                    cargo: Cargo::Packet,
                    len: 0,
                    buf: vec![0; parcel_size].into_boxed_slice(),
                });
            }
            ends[from].0[to] = Some(Outbox {
                full: full_tx,
                empty: empty_rx,
                waker: wakers[to].clone(),
                parcel_size,
                sent: false,
            });
            ends[to].1.push(Inbox {
                full: full_rx,
                empty: empty_tx,
            });
        }
    }
    ends
}
