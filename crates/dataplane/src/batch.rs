//! Fixed-size batches of fixed-size frames, allocated once at start-up.
//!
//! A frame is `HEADROOM` bytes of room in front of the payload (so a later backend can prepend
//! a virtio_net_hdr or encapsulate in place) followed by `FRAME_PAYLOAD` bytes for the payload.
//! The batch is the unit of I/O: backends fill or drain whole batches per call.

use crate::offload::VnetHdr;
use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use tunneld_tunnel::{DatagramSink, PacketSink};

/// Frames per batch: the most a backend moves in one call.
pub const BATCH_SIZE: usize = 64;
/// Room in front of every payload for headers a backend or encapsulation prepends.
pub const HEADROOM: usize = 64;
/// Payload bytes per frame: an IP packet of up to 65535 bytes plus the WireGuard overhead.
pub const FRAME_PAYLOAD: usize = tunneld_tunnel::packet::MAX_DATAGRAM;
const FRAME: usize = HEADROOM + FRAME_PAYLOAD;

const UNSPECIFIED: SocketAddr = SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, 0, 0, 0));

/// `BATCH_SIZE` frames with a length and a peer address each; `len()` of them are in use.
pub struct Batch {
    buf: Box<[u8]>,
    lens: [usize; BATCH_SIZE],
    addrs: [SocketAddr; BATCH_SIZE],
    /// TUN frames: the offload header the packet came with (all zero: a plain packet).
    offloads: [VnetHdr; BATCH_SIZE],
    /// UDP frames: the size of each datagram in a frame that holds several (UDP GRO), or 0
    /// for a frame holding one.
    segment_sizes: [u16; BATCH_SIZE],
    count: usize,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch").field("count", &self.count).finish()
    }
}

impl Default for Batch {
    fn default() -> Self {
        Self::new()
    }
}

impl Batch {
    pub fn new() -> Self {
        Self {
            buf: vec![0u8; FRAME * BATCH_SIZE].into_boxed_slice(),
            lens: [0; BATCH_SIZE],
            addrs: [UNSPECIFIED; BATCH_SIZE],
            offloads: [VnetHdr::default(); BATCH_SIZE],
            segment_sizes: [0; BATCH_SIZE],
            count: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.count
    }
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
    pub fn is_full(&self) -> bool {
        self.count == BATCH_SIZE
    }
    pub fn clear(&mut self) {
        self.count = 0;
    }

    /// The payload of frame `i` (headroom excluded), `len(i)` bytes.
    pub fn payload(&self, i: usize) -> &[u8] {
        let start = i * FRAME + HEADROOM;
        &self.buf[start..start + self.lens[i]]
    }

    /// The length of frame `i`'s payload.
    pub fn payload_len(&self, i: usize) -> usize {
        self.lens[i]
    }

    /// The whole payload area of frame `i` (all `FRAME_PAYLOAD` bytes) and its length.
    pub fn frame_mut(&mut self, i: usize) -> (&mut [u8], usize) {
        let start = i * FRAME + HEADROOM;
        (&mut self.buf[start..start + FRAME_PAYLOAD], self.lens[i])
    }

    /// Frame `i` including its headroom, for backends that prepend headers.
    pub fn raw_frame_mut(&mut self, i: usize) -> &mut [u8] {
        &mut self.buf[i * FRAME..(i + 1) * FRAME]
    }

    pub fn addr(&self, i: usize) -> SocketAddr {
        self.addrs[i]
    }

    /// The offload header of TUN frame `i` (see [`crate::offload`]).
    pub fn offload(&self, i: usize) -> VnetHdr {
        self.offloads[i]
    }

    pub fn set_offload(&mut self, i: usize, hdr: VnetHdr) {
        self.offloads[i] = hdr;
    }

    /// The datagrams in UDP frame `i`: the whole payload, or consecutive pieces of
    /// `segment_size` bytes (the last may be shorter) when the kernel merged them (UDP GRO).
    pub fn datagrams(&self, i: usize) -> Datagrams<'_> {
        Datagrams {
            rest: Some(self.payload(i)),
            size: usize::from(self.segment_sizes[i]),
        }
    }

    pub fn set_segment_size(&mut self, i: usize, size: u16) {
        self.segment_sizes[i] = size;
    }

    /// The payload area of the next unused frame, for a backend or the core to fill.
    pub fn next_free(&mut self) -> Option<&mut [u8]> {
        if self.is_full() {
            return None;
        }
        let start = self.count * FRAME + HEADROOM;
        Some(&mut self.buf[start..start + FRAME_PAYLOAD])
    }

    /// Marks the next unused frame as holding `len` payload bytes for/from `addr`.
    pub fn commit(&mut self, len: usize, addr: SocketAddr) {
        debug_assert!(self.count < BATCH_SIZE && len <= FRAME_PAYLOAD);
        self.lens[self.count] = len;
        self.addrs[self.count] = addr;
        self.offloads[self.count] = VnetHdr::default();
        self.segment_sizes[self.count] = 0;
        self.count += 1;
    }

    /// Sets the length and address of frame `i` directly (backends filling many frames at once).
    /// Offload header and segment size are reset; set them after.
    pub fn set(&mut self, i: usize, len: usize, addr: SocketAddr) {
        self.lens[i] = len;
        self.addrs[i] = addr;
        self.offloads[i] = VnetHdr::default();
        self.segment_sizes[i] = 0;
    }

    /// Declares the first `count` frames filled (after `set` on each).
    pub fn set_len(&mut self, count: usize) {
        self.count = count.min(BATCH_SIZE);
    }

    /// Raw pointers to every frame's payload area, for vectored syscalls. All are derived from
    /// one borrow of the buffer, so they stay valid together (a pointer per call would be
    /// invalidated by the next call's `&mut` borrow).
    pub(crate) fn payload_ptrs(&mut self) -> [*mut u8; BATCH_SIZE] {
        let base = self.buf.as_mut_ptr();
        std::array::from_fn(|i| base.wrapping_add(i * FRAME + HEADROOM))
    }
}

/// The datagrams of one UDP frame; see [`Batch::datagrams`]. An empty frame is one empty
/// datagram (the peer sent it, and it is counted as malformed like any other).
#[derive(Debug)]
pub struct Datagrams<'a> {
    rest: Option<&'a [u8]>,
    size: usize,
}

impl<'a> Iterator for Datagrams<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        let rest = self.rest?;
        if self.size == 0 || rest.len() <= self.size {
            self.rest = None;
            return Some(rest);
        }
        let (first, tail) = rest.split_at(self.size);
        self.rest = Some(tail);
        Some(first)
    }
}

impl DatagramSink for Batch {
    fn slot(&mut self) -> Option<&mut [u8]> {
        self.next_free()
    }
    fn push(&mut self, len: usize, to: SocketAddr) {
        self.commit(len, to);
    }
}

impl PacketSink for Batch {
    fn slot(&mut self) -> Option<&mut [u8]> {
        self.next_free()
    }
    fn push(&mut self, len: usize) {
        self.commit(len, UNSPECIFIED);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_independent_and_bounded() {
        let mut batch = Batch::new();
        for i in 0..BATCH_SIZE {
            let slot = batch.next_free().unwrap();
            assert_eq!(slot.len(), FRAME_PAYLOAD);
            slot[..2].copy_from_slice(&(i as u16).to_be_bytes());
            batch.commit(2, UNSPECIFIED);
        }
        assert!(batch.is_full());
        assert!(batch.next_free().is_none());
        for i in 0..BATCH_SIZE {
            assert_eq!(batch.payload(i), &(i as u16).to_be_bytes());
        }
        batch.clear();
        assert!(batch.is_empty());
    }

    #[test]
    fn merged_datagrams_split_by_segment_size() {
        let mut batch = Batch::new();
        let slot = batch.next_free().unwrap();
        for (i, b) in slot[..10].iter_mut().enumerate() {
            *b = i as u8;
        }
        batch.commit(10, UNSPECIFIED);
        assert_eq!(
            batch.datagrams(0).collect::<Vec<_>>(),
            [&[0u8, 1, 2, 3, 4, 5, 6, 7, 8, 9][..]]
        );
        batch.set_segment_size(0, 4);
        let parts: Vec<&[u8]> = batch.datagrams(0).collect();
        assert_eq!(parts, [&[0u8, 1, 2, 3][..], &[4, 5, 6, 7], &[8, 9]]);
        batch.set_segment_size(0, 5);
        assert_eq!(batch.datagrams(0).count(), 2);
        batch.commit(0, UNSPECIFIED);
        assert_eq!(
            batch.datagrams(1).collect::<Vec<_>>(),
            [&[][..]],
            "empty is one datagram"
        );
    }
}
