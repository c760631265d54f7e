//! Fixed-size batches of frames, allocated once at start-up.
//!
//! A frame is `HEADROOM` bytes of room in front of the payload (so a later backend can prepend
//! a virtio_net_hdr or encapsulate in place) followed by room for the payload. The batch is the
//! unit of I/O: backends fill or drain whole batches per call.
//!
//! Every frame has room for `FRAME_PAYLOAD` bytes until it is filled. A frame filled with
//! [`Batch::commit`] then keeps only its length plus `TAIL_ROOM`, and the next frame starts
//! right after it. Packets are mostly far smaller than the 64 KiB a frame must be able to
//! hold, so a batch of them stays in a few dozen contiguous kilobytes that the caches and the
//! TLB hold, where 64 frames 64 KiB apart would land in the same cache sets and evict each
//! other before the write or send copies them out.

use crate::offload::VnetHdr;
use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::ptr::NonNull;
use std::sync::Arc;
use tunneld_wireguard::{DatagramSink, PacketSink};

/// Frames per batch: the most a backend moves in one call.
pub const BATCH_SIZE: usize = 64;
/// Room in front of every payload for headers a backend or encapsulation prepends.
pub const HEADROOM: usize = 64;
/// Payload bytes per frame: an IP packet of up to 65535 bytes plus the WireGuard overhead.
pub const FRAME_PAYLOAD: usize = tunneld_wireguard::packet::MAX_DATAGRAM;
/// Bytes a frame filled by `commit` keeps after its payload, for whoever rewrites it in place
/// (WireGuard padding after a packet, a segment's tail).
pub const TAIL_ROOM: usize = 64;
/// Where frames start when none has been filled: room for the largest payload each, rounded
/// to cache lines.
const FRAME: usize = (HEADROOM + FRAME_PAYLOAD).next_multiple_of(64);

/// Frame starts with nothing filled: each frame `FRAME` bytes after the one before.
fn fixed_starts() -> [usize; BATCH_SIZE + 1] {
    std::array::from_fn(|i| i * FRAME)
}

const UNSPECIFIED: SocketAddr = SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, 0, 0, 0));

/// Memory the kernel reads and writes directly, shared by the batches over it (AF_XDP's
/// UMEM): mapped once by the backend that owns it and unmapped when the last holder drops.
/// A batch over it touches only the frames its backend placed in it, which belong to user
/// space until the backend hands them back to the kernel.
pub struct MappedRegion {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the region is plain memory; which frames of it a thread may touch is decided by the
// backend that places them (each frame is in at most one batch, or the kernel's).
unsafe impl Send for MappedRegion {}
// SAFETY: as above; `&MappedRegion` only exposes the base pointer and length.
unsafe impl Sync for MappedRegion {}

impl MappedRegion {
    /// Maps `len` bytes of anonymous, zeroed, page-aligned memory.
    pub fn map(len: usize) -> std::io::Result<MappedRegion> {
        // SAFETY: an anonymous private mapping with no address hint; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(std::io::Error::last_os_error)?;
        Ok(MappedRegion { ptr, len })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for MappedRegion {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `map` with this pointer and length, and every batch
        // and socket using it holds an `Arc` to this region, so none is left.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

impl std::fmt::Debug for MappedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedRegion")
            .field("len", &self.len)
            .finish()
    }
}

/// Where a batch's bytes live.
enum Memory {
    /// Its own: frames packed one after another (see the module's doc).
    Owned(Box<[u8]>),
    /// A backend's shared region, in frames of `chunk` bytes the backend places one by one
    /// ([`Batch::place`]); frame `i` runs from `starts[i]` to the end of its chunk.
    Placed {
        region: Arc<MappedRegion>,
        chunk: usize,
    },
}

/// `BATCH_SIZE` frames with a length and a peer address each; `len()` of them are in use.
pub struct Batch {
    memory: Memory,
    /// Where frame `i` starts in `buf` (its headroom first); entry `BATCH_SIZE` is the end.
    /// Frame `i` owns `starts[i]..starts[i + 1]`. Past the first unfilled frame every start
    /// is the fixed `i * FRAME`, and the first unfilled frame starts at or before its fixed
    /// place, so an unfilled frame always owns at least `FRAME` bytes. (A placed batch: see
    /// [`Memory::Placed`].)
    starts: [usize; BATCH_SIZE + 1],
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
            memory: Memory::Owned(vec![0u8; FRAME * BATCH_SIZE].into_boxed_slice()),
            starts: fixed_starts(),
            lens: [0; BATCH_SIZE],
            addrs: [UNSPECIFIED; BATCH_SIZE],
            offloads: [VnetHdr::default(); BATCH_SIZE],
            segment_sizes: [0; BATCH_SIZE],
            count: 0,
        }
    }

    /// A batch over a backend's shared region, in chunks of `chunk` bytes (a power of two).
    /// Each frame must be placed ([`Batch::place`]) before it is filled; until then every
    /// frame is the region's first chunk.
    pub fn placed(region: Arc<MappedRegion>, chunk: usize) -> Self {
        debug_assert!(chunk.is_power_of_two() && chunk > HEADROOM && chunk <= region.len());
        Self {
            memory: Memory::Placed { region, chunk },
            starts: [0; BATCH_SIZE + 1],
            lens: [0; BATCH_SIZE],
            addrs: [UNSPECIFIED; BATCH_SIZE],
            offloads: [VnetHdr::default(); BATCH_SIZE],
            segment_sizes: [0; BATCH_SIZE],
            count: 0,
        }
    }

    /// Puts frame `i` of a placed batch at `start` in the region: its headroom first, its
    /// payload `HEADROOM` bytes on, its end the end of `start`'s chunk (which must leave room
    /// for the headroom). Does nothing to a batch with memory of its own.
    pub fn place(&mut self, i: usize, start: usize) {
        if let Memory::Placed { region, chunk } = &self.memory {
            debug_assert!(start % chunk + HEADROOM < *chunk && start < region.len());
            self.starts[i] = start;
        }
    }

    /// Where frame `i` starts in the batch's memory (its headroom first): for a placed
    /// batch, its offset in the region.
    pub fn start(&self, i: usize) -> usize {
        self.starts[i]
    }

    /// The end of frame `i` in the batch's memory.
    fn end(&self, i: usize) -> usize {
        match &self.memory {
            Memory::Owned(_) => self.starts[i + 1],
            Memory::Placed { chunk, .. } => (self.starts[i] & !(chunk - 1)) + chunk,
        }
    }

    /// Bytes `start..end` of the batch's memory.
    fn bytes(&self, start: usize, end: usize) -> &[u8] {
        match &self.memory {
            Memory::Owned(buf) => &buf[start..end],
            Memory::Placed { region, .. } => {
                assert!(start <= end && end <= region.len());
                // SAFETY: in bounds (checked); the frame holding these bytes was placed in this
                // batch by its backend, which does not give it to the kernel while it is here.
                unsafe { std::slice::from_raw_parts(region.as_ptr().add(start), end - start) }
            }
        }
    }

    fn bytes_mut(&mut self, start: usize, end: usize) -> &mut [u8] {
        match &mut self.memory {
            Memory::Owned(buf) => &mut buf[start..end],
            Memory::Placed { region, .. } => {
                assert!(start <= end && end <= region.len());
                // SAFETY: as in `bytes`; `&mut self` makes this the only slice of the batch.
                unsafe { std::slice::from_raw_parts_mut(region.as_ptr().add(start), end - start) }
            }
        }
    }

    fn base_ptr(&mut self) -> *mut u8 {
        match &mut self.memory {
            Memory::Owned(buf) => buf.as_mut_ptr(),
            Memory::Placed { region, .. } => region.as_ptr(),
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
    /// Empties the batch. A placed batch keeps its frames where they are (its backend moves
    /// them).
    pub fn clear(&mut self) {
        if let Memory::Owned(_) = self.memory {
            self.starts = fixed_starts();
        }
        self.count = 0;
    }

    /// The payload of frame `i` (headroom excluded), `len(i)` bytes.
    pub fn payload(&self, i: usize) -> &[u8] {
        let start = self.starts[i] + HEADROOM;
        self.bytes(start, start + self.lens[i])
    }

    /// The length of frame `i`'s payload.
    pub fn payload_len(&self, i: usize) -> usize {
        self.lens[i]
    }

    /// The whole payload area of frame `i` and its length: at least `FRAME_PAYLOAD` bytes for
    /// a frame filled in place by a backend, its length plus `TAIL_ROOM` for one filled with
    /// `commit` (less only where that would pass `FRAME_PAYLOAD`).
    pub fn frame_mut(&mut self, i: usize) -> (&mut [u8], usize) {
        let (start, end) = (self.starts[i] + HEADROOM, self.end(i));
        let len = self.lens[i];
        (self.bytes_mut(start, end), len)
    }

    /// Frame `i` including its headroom, for backends that prepend headers.
    pub fn raw_frame_mut(&mut self, i: usize) -> &mut [u8] {
        let (start, end) = (self.starts[i], self.end(i));
        self.bytes_mut(start, end)
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

    /// The datagram size of frame `i` if it holds several (see [`Batch::datagrams`]), else 0.
    pub fn segment_size(&self, i: usize) -> u16 {
        self.segment_sizes[i]
    }

    pub fn set_segment_size(&mut self, i: usize, size: u16) {
        self.segment_sizes[i] = size;
    }

    /// The payload area of the next unused frame, for a backend or the core to fill:
    /// `FRAME_PAYLOAD` bytes, or for a placed batch the rest of the frame's chunk.
    pub fn next_free(&mut self) -> Option<&mut [u8]> {
        if self.is_full() {
            return None;
        }
        let i = self.count;
        let start = self.starts[i] + HEADROOM;
        let end = match self.memory {
            Memory::Owned(_) => start + FRAME_PAYLOAD,
            Memory::Placed { .. } => self.end(i),
        };
        Some(self.bytes_mut(start, end))
    }

    /// Marks the next unused frame as holding `len` payload bytes for/from `addr`, and moves
    /// the frame after it up to just past its tail room.
    pub fn commit(&mut self, len: usize, addr: SocketAddr) {
        debug_assert!(self.count < BATCH_SIZE && len <= FRAME_PAYLOAD);
        let i = self.count;
        if i + 1 < BATCH_SIZE && matches!(self.memory, Memory::Owned(_)) {
            let used = (HEADROOM + len + TAIL_ROOM).next_multiple_of(64);
            self.starts[i + 1] = self.starts[i] + used.min(FRAME);
        }
        self.lens[i] = len;
        self.addrs[i] = addr;
        self.offloads[i] = VnetHdr::default();
        self.segment_sizes[i] = 0;
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

    /// Declares the first `count` frames filled (after `set` on each). It only ever adds
    /// frames to those filled: `clear` empties a batch.
    pub fn set_len(&mut self, count: usize) {
        debug_assert!(count >= self.count, "set_len would drop filled frames");
        self.count = count.min(BATCH_SIZE);
    }

    /// Raw pointers to every frame's payload area, for vectored syscalls. All are derived from
    /// one borrow of the buffer, so they stay valid together (a pointer per call would be
    /// invalidated by the next call's `&mut` borrow).
    /// Only for batches with memory of their own: their frames have room for `FRAME_PAYLOAD`.
    pub(crate) fn payload_ptrs(&mut self) -> [*mut u8; BATCH_SIZE] {
        debug_assert!(matches!(self.memory, Memory::Owned(_)));
        let base = self.base_ptr();
        std::array::from_fn(|i| base.wrapping_add(self.starts[i] + HEADROOM))
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

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = match self.rest {
            None => 0,
            Some(rest) if self.size == 0 || rest.len() <= self.size => 1,
            Some(rest) => rest.len().div_ceil(self.size),
        };
        (left, Some(left))
    }
}

impl ExactSizeIterator for Datagrams<'_> {}

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
    fn committed_frames_pack_and_unfilled_ones_keep_full_room() {
        let mut batch = Batch::new();
        let ptrs = |b: &mut Batch| b.payload_ptrs().map(|p| p as usize);
        let fixed = ptrs(&mut batch);
        for (i, len) in [100usize, 1420, 0].into_iter().enumerate() {
            batch.next_free().unwrap()[..len].fill(i as u8 + 1);
            batch.commit(len, UNSPECIFIED);
        }
        let packed = ptrs(&mut batch);
        assert_eq!(
            packed[1] - packed[0],
            256,
            "100 B + headroom + tail room, in lines"
        );
        assert_eq!(packed[2] - packed[1], 1600);
        assert_eq!(packed[3] - packed[2], 128);
        assert_eq!(
            packed[4..],
            fixed[4..],
            "frames past the next free one stay put"
        );
        // A committed frame owns its tail room and no more; the next free one owns a full frame.
        assert_eq!(batch.frame_mut(0).0.len(), 256 - HEADROOM);
        assert!(batch.next_free().unwrap().len() == FRAME_PAYLOAD);
        assert!(batch.raw_frame_mut(3).len() >= HEADROOM + FRAME_PAYLOAD);
        // Packing never moved a payload: each is still what was written.
        assert_eq!(batch.payload(0), &[1; 100]);
        assert_eq!(batch.payload(1), &[2; 1420][..]);
        // A backend filling frames in place after the committed ones (as recvmmsg does).
        let ptrs_now = ptrs(&mut batch);
        batch.set(3, FRAME_PAYLOAD, UNSPECIFIED);
        batch.set(4, FRAME_PAYLOAD, UNSPECIFIED);
        batch.set_len(5);
        assert!(ptrs_now[4] - ptrs_now[3] >= HEADROOM + FRAME_PAYLOAD);
        assert_eq!(batch.payload(4).len(), FRAME_PAYLOAD);
        // A full batch of the largest frames, committed one by one, fits.
        batch.clear();
        assert_eq!(ptrs(&mut batch), fixed, "clear restores the fixed layout");
        for _ in 0..BATCH_SIZE {
            let slot = batch.next_free().unwrap();
            assert_eq!(slot.len(), FRAME_PAYLOAD);
            batch.commit(FRAME_PAYLOAD, UNSPECIFIED);
        }
        assert_eq!(batch.payload(BATCH_SIZE - 1).len(), FRAME_PAYLOAD);
    }

    #[test]
    fn a_placed_batch_uses_the_chunks_it_is_given() {
        const CHUNK: usize = 4096;
        let region = Arc::new(MappedRegion::map(8 * CHUNK).unwrap());
        let mut batch = Batch::placed(region.clone(), CHUNK);
        // Frames in chunks 5 and 2, the second behind 300 bytes of someone's headroom.
        batch.place(0, 5 * CHUNK);
        batch.place(1, 2 * CHUNK + 300);
        let slot = batch.next_free().unwrap();
        assert_eq!(slot.len(), CHUNK - HEADROOM, "the rest of its chunk");
        slot[..3].copy_from_slice(b"abc");
        batch.commit(3, UNSPECIFIED);
        assert_eq!(batch.next_free().unwrap().len(), CHUNK - 300 - HEADROOM);
        batch.commit(0, UNSPECIFIED);
        assert_eq!(batch.payload(0), b"abc");
        assert_eq!(
            batch.start(1),
            2 * CHUNK + 300,
            "commit did not move the next frame"
        );
        assert_eq!(batch.raw_frame_mut(1).len(), CHUNK - 300);
        // The bytes are the region's, where the frame was placed.
        // SAFETY: the test owns the region; nothing else touches it.
        let at = unsafe { *region.as_ptr().add(5 * CHUNK + HEADROOM + 1) };
        assert_eq!(at, b'b');
        batch.clear();
        assert!(batch.is_empty());
        assert_eq!(batch.start(1), 2 * CHUNK + 300, "clear keeps the placement");
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
        assert_eq!(batch.datagrams(0).len(), 1);
        batch.set_segment_size(0, 4);
        let parts: Vec<&[u8]> = batch.datagrams(0).collect();
        assert_eq!(parts, [&[0u8, 1, 2, 3][..], &[4, 5, 6, 7], &[8, 9]]);
        let mut left = batch.datagrams(0);
        assert_eq!(left.len(), 3, "known before walking");
        left.next();
        assert_eq!(left.len(), 2);
        batch.set_segment_size(0, 5);
        assert_eq!(batch.datagrams(0).count(), 2);
        assert_eq!(batch.datagrams(0).len(), 2);
        batch.commit(0, UNSPECIFIED);
        assert_eq!(
            batch.datagrams(1).collect::<Vec<_>>(),
            [&[][..]],
            "empty is one datagram"
        );
        assert_eq!(batch.datagrams(1).len(), 1);
    }
}
