//! An AF_XDP socket over a UMEM of the caller's: its four rings, mapped from the kernel, and
//! the binding to one queue of an interface.
//!
//! The UMEM is a [`MappedRegion`] cut into chunks of [`CHUNK`] bytes; the same region backs
//! the worker's receive and send batches ([`crate::Batch::placed`]), so a datagram is opened
//! in the chunk the kernel received it into and sealed into the chunk it is sent from. A
//! chunk's address (its offset in the region) moves between four owners: the fill ring (the
//! kernel may receive into it), the RX ring (the kernel did), the TX ring (to send), the
//! completion ring (sent). The rings are single-producer, single-consumer arrays of a power
//! of two entries shared with the kernel: the producer writes entries and then publishes its
//! index with a release store; the consumer reads the index with an acquire load, reads the
//! entries, and publishes its own index. Each side caches the other's index and reloads it
//! only when the cached value says the ring is full (or empty).

use crate::batch::MappedRegion;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Bytes per UMEM chunk: a page, the largest the kernel takes in aligned mode.
pub const CHUNK: usize = 4096;
/// At most this many wake-ups per send (each sends up to 32 frames in copy mode: a batch of
/// 64 takes 2, and 8 leave room for what earlier kicks left behind).
const KICKS: usize = 8;
/// Bytes the kernel leaves free at the start of every chunk it receives into
/// (`XDP_PACKET_HEADROOM`).
pub const KERNEL_HEADROOM: usize = 256;
/// Room for `struct xsk_tx_metadata` right in front of every frame sent, where the TX
/// checksum request goes: its flags (8 bytes), then where the checksum starts and where it
/// is stored (2 bytes each), then room for fields of later kernels. Once registered, the
/// kernel refuses a TX descriptor whose frame starts less than this into its chunk.
pub const TX_METADATA_LEN: usize = 24;

/// How a socket ended up bound, strongest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyMode {
    /// The driver DMAs straight into the UMEM.
    ZeroCopy,
    /// The kernel copies between its buffers and the UMEM.
    Copy,
}

/// Who computes the UDP checksums of the frames a socket sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxChecksum {
    /// The device, asked per frame through TX metadata (`XDP_TXMD_FLAGS_CHECKSUM`).
    Device,
    /// tunneld, in software; the reason the device does not.
    Software(&'static str),
}

impl std::fmt::Display for TxChecksum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TxChecksum::Device => f.write_str("device (TX checksum offload)"),
            TxChecksum::Software(why) => write!(f, "software ({why})"),
        }
    }
}

impl TxChecksum {
    /// What the socket's mode and the kernel and driver allow: `metadata` is whether the
    /// kernel took the UMEM's TX metadata room; `device` asks the interface (see `device.rs`)
    /// whether it completes checksums for frames sent in `mode`.
    fn decide(
        metadata: bool,
        mode: CopyMode,
        device: impl FnOnce(CopyMode) -> io::Result<bool>,
    ) -> Self {
        if !metadata {
            return TxChecksum::Software("the kernel takes no AF_XDP TX metadata");
        }
        match (mode, device(mode)) {
            (_, Ok(true)) => TxChecksum::Device,
            (CopyMode::Copy, Ok(false)) => {
                TxChecksum::Software("the interface's TX checksumming is off")
            }
            (CopyMode::ZeroCopy, Ok(false)) => {
                TxChecksum::Software("the driver has no AF_XDP TX checksum offload")
            }
            (_, Err(_)) => TxChecksum::Software("the interface's offloads could not be read"),
        }
    }
}

/// A frame to send: where it starts in the UMEM, its length, and, for the device to
/// complete its UDP checksum, where the UDP header starts in it.
#[derive(Debug, Clone, Copy, Default)]
pub struct TxFrame {
    pub addr: u64,
    pub len: u32,
    pub udp_at: Option<u16>,
}

/// Ring sizes (entries, powers of two).
#[derive(Debug, Clone, Copy)]
pub struct RingSizes {
    pub fill: u32,
    pub completion: u32,
    pub rx: u32,
    pub tx: u32,
}

/// One ring shared with the kernel: `T` is `u64` (fill, completion: chunk addresses) or
/// `libc::xdp_desc` (RX, TX: address, length, options).
struct Ring<T> {
    producer: NonNull<AtomicU32>,
    consumer: NonNull<AtomicU32>,
    flags: NonNull<AtomicU32>,
    entries: NonNull<T>,
    mask: u32,
    size: u32,
    /// Our side's index (the one we publish) and the other side's, as last read.
    local: u32,
    remote: u32,
    map: NonNull<libc::c_void>,
    map_len: usize,
}

// SAFETY: the ring is owned by one socket, which one worker thread owns; the shared indices
// are atomics and the entries are only touched by the side that owns them at the time.
unsafe impl<T> Send for Ring<T> {}

impl<T: Copy> Ring<T> {
    /// Maps ring `pgoff` of socket `fd`, described by `off`, with `size` entries.
    fn map(
        fd: BorrowedFd<'_>,
        off: &libc::xdp_ring_offset,
        size: u32,
        pgoff: libc::off_t,
        producing: bool,
    ) -> io::Result<Ring<T>> {
        let map_len = off.desc as usize + size as usize * std::mem::size_of::<T>();
        // SAFETY: maps the ring the kernel made for this socket at `pgoff`; checked below.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                pgoff,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let map = NonNull::new(map).ok_or_else(io::Error::last_os_error)?;
        // SAFETY: the offsets come from the kernel's XDP_MMAP_OFFSETS for this ring and lie
        // inside the mapping, suitably aligned.
        let at = |offset: u64| unsafe { map.byte_add(offset as usize) };
        let producer = at(off.producer).cast::<AtomicU32>();
        let consumer = at(off.consumer).cast::<AtomicU32>();
        let mut ring = Ring {
            producer,
            consumer,
            flags: at(off.flags).cast(),
            entries: at(off.desc).cast(),
            mask: size - 1,
            size,
            local: 0,
            remote: 0,
            map,
            map_len,
        };
        // SAFETY: the indices are valid atomics in the mapping (above).
        unsafe {
            if producing {
                ring.local = producer.as_ref().load(Ordering::Relaxed);
                ring.remote = consumer.as_ref().load(Ordering::Acquire);
            } else {
                ring.local = consumer.as_ref().load(Ordering::Relaxed);
                ring.remote = producer.as_ref().load(Ordering::Acquire);
            }
        }
        Ok(ring)
    }

    fn entry(&self, index: u32) -> *mut T {
        // SAFETY: masked into the ring's `size` entries, all inside the mapping.
        unsafe { self.entries.as_ptr().add((index & self.mask) as usize) }
    }

    /// Whether the kernel asked to be woken (`XDP_RING_NEED_WAKEUP`) to go on with this ring.
    fn needs_wakeup(&self) -> bool {
        // SAFETY: a valid atomic in the mapping.
        unsafe { self.flags.as_ref() }.load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    // The producer's side (fill, TX).

    /// Entries free to produce into, reloading the consumer's index only when needed.
    fn free(&mut self, wanted: u32) -> u32 {
        let free = self.size - self.local.wrapping_sub(self.remote);
        if free >= wanted {
            return free;
        }
        // SAFETY: a valid atomic in the mapping.
        self.remote = unsafe { self.consumer.as_ref() }.load(Ordering::Acquire);
        self.size - self.local.wrapping_sub(self.remote)
    }

    /// Writes `items` (at most `free()` of them) and publishes them. Returns how many.
    fn produce(&mut self, items: impl Iterator<Item = T>, room: u32) -> u32 {
        let mut n = 0;
        for item in items.take(room as usize) {
            // SAFETY: the entry is ours until published: between our index and the
            // consumer's plus the ring's size (`room` counted it free).
            unsafe { self.entry(self.local.wrapping_add(n)).write(item) };
            n += 1;
        }
        if n > 0 {
            self.local = self.local.wrapping_add(n);
            // SAFETY: a valid atomic in the mapping.
            unsafe { self.producer.as_ref() }.store(self.local, Ordering::Release);
        }
        n
    }

    // The consumer's side (RX, completion).

    /// Entries ready to consume, reloading the producer's index only when none are cached.
    fn ready(&mut self) -> u32 {
        let ready = self.remote.wrapping_sub(self.local);
        if ready > 0 {
            return ready;
        }
        // SAFETY: a valid atomic in the mapping.
        self.remote = unsafe { self.producer.as_ref() }.load(Ordering::Acquire);
        self.remote.wrapping_sub(self.local)
    }

    /// The `i`th ready entry (`i < ready()`).
    fn peek(&self, i: u32) -> T {
        // SAFETY: the entry was published by the producer (i < ready) and is not reused
        // until we release it.
        unsafe { self.entry(self.local.wrapping_add(i)).read() }
    }

    /// Gives `n` consumed entries back to the producer.
    fn release(&mut self, n: u32) {
        if n > 0 {
            self.local = self.local.wrapping_add(n);
            // SAFETY: a valid atomic in the mapping.
            unsafe { self.consumer.as_ref() }.store(self.local, Ordering::Release);
        }
    }
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, used by nothing else.
        unsafe { libc::munmap(self.map.as_ptr(), self.map_len) };
    }
}

/// An AF_XDP socket bound to one queue, with its UMEM and rings.
pub struct XskSocket {
    fill: Ring<u64>,
    completion: Ring<u64>,
    rx: Ring<libc::xdp_desc>,
    tx: Ring<libc::xdp_desc>,
    mode: CopyMode,
    tx_checksum: TxChecksum,
    /// Whether the UMEM has `TX_METADATA_LEN` bytes of TX metadata room registered.
    tx_metadata: bool,
    /// Declared last: the rings are unmapped before the socket closes.
    fd: OwnedFd,
    /// The UMEM; kept alive as long as the kernel may touch it.
    _umem: Arc<MappedRegion>,
}

impl std::fmt::Debug for XskSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XskSocket")
            .field("fd", &self.fd.as_raw_fd())
            .field("mode", &self.mode)
            .field("tx_checksum", &self.tx_checksum)
            .finish_non_exhaustive()
    }
}

fn setsockopt<T>(fd: BorrowedFd<'_>, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` points to a live `T` of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_XDP,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl XskSocket {
    /// Creates an AF_XDP socket with `umem` registered (chunks of [`CHUNK`], with TX metadata
    /// room where the kernel takes it), maps its rings, and binds it to queue `queue` of
    /// interface `ifindex`: zero-copy when `zero_copy` and the driver can, else copy mode;
    /// always with `XDP_USE_NEED_WAKEUP`. TX checksums are left to the device where it
    /// computes them ([`TxChecksum`]) and `checksum_offload` allows. The error says which
    /// step failed.
    pub fn bind(
        umem: Arc<MappedRegion>,
        sizes: RingSizes,
        ifindex: u32,
        queue: u32,
        zero_copy: bool,
        checksum_offload: bool,
    ) -> io::Result<XskSocket> {
        fn context(what: &str) -> impl FnOnce(io::Error) -> io::Error + '_ {
            move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
        }
        // SAFETY: plain socket(2); the result is checked.
        let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(context("cannot create an AF_XDP socket")(
                io::Error::last_os_error(),
            ));
        }
        // SAFETY: a descriptor we just opened and own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut reg = libc::xdp_umem_reg {
            addr: umem.as_ptr() as u64,
            len: umem.len() as u64,
            chunk_size: CHUNK as u32,
            headroom: 0,
            flags: libc::XDP_UMEM_TX_METADATA_LEN,
            tx_metadata_len: TX_METADATA_LEN as u32,
        };
        // A kernel that does not know the flag refuses it (EINVAL) and the UMEM is registered
        // without metadata room. The room is never asked for without the flag: kernels before
        // TX metadata ignore `tx_metadata_len` silently, and would send the frames with the
        // checksum unfinished.
        let tx_metadata =
            checksum_offload && setsockopt(fd.as_fd(), libc::XDP_UMEM_REG, &reg).is_ok();
        if !tx_metadata {
            (reg.flags, reg.tx_metadata_len) = (0, 0);
            setsockopt(fd.as_fd(), libc::XDP_UMEM_REG, &reg)
                .map_err(context("cannot register the UMEM"))?;
        }
        setsockopt(fd.as_fd(), libc::XDP_UMEM_FILL_RING, &sizes.fill)
            .and_then(|()| {
                setsockopt(
                    fd.as_fd(),
                    libc::XDP_UMEM_COMPLETION_RING,
                    &sizes.completion,
                )
            })
            .and_then(|()| setsockopt(fd.as_fd(), libc::XDP_RX_RING, &sizes.rx))
            .and_then(|()| setsockopt(fd.as_fd(), libc::XDP_TX_RING, &sizes.tx))
            .map_err(context("cannot size the AF_XDP rings"))?;
        // SAFETY: all-zero is a valid xdp_mmap_offsets.
        let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
        // SAFETY: `off` is writable for `len` bytes.
        let rc = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                (&mut off as *mut libc::xdp_mmap_offsets).cast(),
                &mut len,
            )
        };
        if rc < 0 || len as usize != std::mem::size_of::<libc::xdp_mmap_offsets>() {
            return Err(context("cannot read the AF_XDP ring offsets")(
                io::Error::last_os_error(),
            ));
        }
        let maps = || -> io::Result<_> {
            Ok((
                Ring::map(
                    fd.as_fd(),
                    &off.fr,
                    sizes.fill,
                    libc::XDP_UMEM_PGOFF_FILL_RING as _,
                    true,
                )?,
                Ring::map(
                    fd.as_fd(),
                    &off.cr,
                    sizes.completion,
                    libc::XDP_UMEM_PGOFF_COMPLETION_RING as _,
                    false,
                )?,
                Ring::map(
                    fd.as_fd(),
                    &off.rx,
                    sizes.rx,
                    libc::XDP_PGOFF_RX_RING,
                    false,
                )?,
                Ring::map(fd.as_fd(), &off.tx, sizes.tx, libc::XDP_PGOFF_TX_RING, true)?,
            ))
        };
        let (fill, completion, rx, tx) = maps().map_err(context("cannot map the AF_XDP rings"))?;
        let bind = |flags: u16| {
            let addr = libc::sockaddr_xdp {
                sxdp_family: libc::AF_XDP as u16,
                sxdp_flags: flags | libc::XDP_USE_NEED_WAKEUP,
                sxdp_ifindex: ifindex,
                sxdp_queue_id: queue,
                sxdp_shared_umem_fd: 0,
            };
            // SAFETY: `addr` is a valid sockaddr_xdp of the size passed.
            let rc = unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    (&addr as *const libc::sockaddr_xdp).cast(),
                    std::mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
                )
            };
            if rc < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        };
        let mode = if zero_copy && bind(libc::XDP_ZEROCOPY).is_ok() {
            CopyMode::ZeroCopy
        } else {
            bind(libc::XDP_COPY).map_err(context(&format!(
                "cannot bind an AF_XDP socket to queue {queue} of interface {ifindex}"
            )))?;
            CopyMode::Copy
        };
        let tx_checksum = if checksum_offload {
            TxChecksum::decide(tx_metadata, mode, |mode| match mode {
                CopyMode::Copy => super::device::tx_checksumming(ifindex),
                CopyMode::ZeroCopy => super::device::xsk_features(ifindex)
                    .map(|f| f & super::device::XSK_TX_CHECKSUM != 0),
            })
        } else {
            TxChecksum::Software("dataplane.xdp_checksum_offload = false")
        };
        Ok(XskSocket {
            fill,
            completion,
            rx,
            tx,
            mode,
            tx_checksum,
            tx_metadata,
            fd,
            _umem: umem,
        })
    }

    pub fn mode(&self) -> CopyMode {
        self.mode
    }

    /// Who computes the UDP checksums of the frames this socket sends.
    pub fn tx_checksum(&self) -> TxChecksum {
        self.tx_checksum
    }

    /// Whether a frame starting at `addr` can be queued: with TX metadata room registered,
    /// the kernel refuses a frame less than [`TX_METADATA_LEN`] into its chunk.
    pub fn can_send_from(&self, addr: u64) -> bool {
        !self.tx_metadata || addr as usize % CHUNK >= TX_METADATA_LEN
    }

    /// Gives chunks (by address) to the kernel to receive into. Returns how many it took.
    pub fn fill(&mut self, addrs: &[u64]) -> usize {
        let room = self.fill.free(addrs.len() as u32);
        self.fill.produce(addrs.iter().copied(), room) as usize
    }

    /// Whether the kernel asked for a wake-up to go on filling (a `recvfrom` or `poll`).
    pub fn fill_needs_wakeup(&self) -> bool {
        self.fill.needs_wakeup()
    }

    /// Calls up to `max` received descriptors with `each` (address of the frame's first
    /// byte, its length), then releases them: their chunks are the caller's now.
    pub fn receive(&mut self, max: usize, mut each: impl FnMut(u64, usize)) -> usize {
        let n = self.rx.ready().min(max as u32);
        for i in 0..n {
            let desc = self.rx.peek(i);
            each(desc.addr, desc.len as usize);
        }
        self.rx.release(n);
        n as usize
    }

    /// Room in the TX ring.
    pub fn tx_room(&mut self, wanted: usize) -> usize {
        self.tx.free(wanted as u32) as usize
    }

    /// Queues frames for sending; the caller checked the room, and that each frame can be
    /// sent from where it is ([`XskSocket::can_send_from`]). A frame with `udp_at` gets a TX
    /// checksum request when the device computes checksums (its UDP checksum field must
    /// then hold the pseudo-header's sum); `udp_at` is ignored otherwise. Returns how many
    /// were queued.
    pub fn transmit(&mut self, frames: impl Iterator<Item = TxFrame>) -> usize {
        let room = self.tx.free(crate::BATCH_SIZE as u32);
        let offload = self.tx_checksum == TxChecksum::Device;
        let umem = &self._umem;
        let descs = frames.map(|frame| {
            // Offloading implies metadata room; a frame without room in front is refused by
            // the kernel anyway (the caller checked).
            let fits = frame.addr as usize % CHUNK >= TX_METADATA_LEN;
            let request = frame.udp_at.filter(|_| offload && fits);
            let options = match request {
                Some(udp_at) => {
                    write_checksum_request(umem, frame.addr as usize, udp_at);
                    libc::XDP_TX_METADATA
                }
                None => 0,
            };
            libc::xdp_desc {
                addr: frame.addr,
                len: frame.len,
                options,
            }
        });
        self.tx.produce(descs, room) as usize
    }

    /// Tells the kernel to send what the TX ring holds, when it asked to be told (in copy
    /// mode it always does: the copy runs in this call). In copy mode one call sends a
    /// bounded number of frames (32 on Linux 6.x) and says EAGAIN when more are left, so it
    /// is called again until the ring is drained, or the kernel is out of room.
    pub fn kick(&mut self) -> io::Result<()> {
        for _ in 0..KICKS {
            if !self.tx.needs_wakeup() || self.tx_pending() == 0 {
                return Ok(());
            }
            // SAFETY: a zero-length send on our socket, the wake-up AF_XDP defines.
            let rc = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
            if rc >= 0 {
                continue;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                // More to send: go on.
                Some(libc::EAGAIN) => continue,
                // The device is busy or out of buffers: what is queued goes with the next
                // kick.
                Some(libc::EBUSY | libc::ENOBUFS | libc::ENETDOWN) => return Ok(()),
                _ => return Err(e),
            }
        }
        Ok(())
    }

    /// Frames in the TX ring the kernel has not taken yet.
    fn tx_pending(&mut self) -> u32 {
        // SAFETY: a valid atomic in the mapping.
        self.tx.remote = unsafe { self.tx.consumer.as_ref() }.load(Ordering::Acquire);
        self.tx.local.wrapping_sub(self.tx.remote)
    }

    /// Wakes the kernel to go on receiving (when `fill_needs_wakeup`).
    pub fn wake_receive(&self) {
        // SAFETY: a zero-length, non-blocking receive on our socket: AF_XDP's wake-up.
        unsafe {
            libc::recvfrom(
                self.fd.as_raw_fd(),
                std::ptr::null_mut(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
    }

    /// Calls `each` with the address of every chunk the kernel finished sending, and
    /// releases them. Returns how many.
    pub fn complete(&mut self, mut each: impl FnMut(u64)) -> usize {
        let n = self.completion.ready();
        for i in 0..n {
            each(self.completion.peek(i));
        }
        self.completion.release(n);
        n as usize
    }

    /// The kernel's drop counters for this socket.
    pub fn statistics(&self) -> io::Result<libc::xdp_statistics> {
        // SAFETY: all-zero is a valid xdp_statistics.
        let mut stats: libc::xdp_statistics = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::xdp_statistics>() as libc::socklen_t;
        // SAFETY: `stats` is writable for `len` bytes.
        let rc = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_XDP,
                libc::XDP_STATISTICS,
                (&mut stats as *mut libc::xdp_statistics).cast(),
                &mut len,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stats)
    }
}

/// Writes a TX checksum request (`struct xsk_tx_metadata`) in the [`TX_METADATA_LEN`] bytes
/// in front of the frame at `addr`: sum from `udp_at` to the end, store at 6 past it.
fn write_checksum_request(umem: &MappedRegion, addr: usize, udp_at: u16) {
    let Some(at) = addr.checked_sub(TX_METADATA_LEN) else {
        return;
    };
    let mut metadata = [0u8; 12];
    metadata[..8].copy_from_slice(&u64::from(libc::XDP_TXMD_FLAGS_CHECKSUM).to_ne_bytes());
    metadata[8..10].copy_from_slice(&udp_at.to_ne_bytes());
    metadata[10..12].copy_from_slice(&(super::frame::UDP_CHECKSUM_OFFSET as u16).to_ne_bytes());
    if at + metadata.len() <= umem.len() {
        // SAFETY: inside the region (checked), in the chunk of a frame about to be queued,
        // which is ours (not the kernel's) until the TX ring is published.
        unsafe {
            std::ptr::copy_nonoverlapping(metadata.as_ptr(), umem.as_ptr().add(at), metadata.len())
        };
    }
}

impl AsFd for XskSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_computes_checksums_only_where_kernel_and_driver_both_do() {
        let yes = |_| Ok(true);
        let no = |_| Ok(false);
        let unknown = |_| Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        for mode in [CopyMode::Copy, CopyMode::ZeroCopy] {
            assert_eq!(TxChecksum::decide(true, mode, yes), TxChecksum::Device);
            // Without metadata room the driver is not even asked.
            let asked = std::cell::Cell::new(false);
            let decided = TxChecksum::decide(false, mode, |_| {
                asked.set(true);
                Ok(true)
            });
            assert!(matches!(decided, TxChecksum::Software(_)) && !asked.get());
            assert!(matches!(
                TxChecksum::decide(true, mode, no),
                TxChecksum::Software(_)
            ));
            assert!(matches!(
                TxChecksum::decide(true, mode, unknown),
                TxChecksum::Software(_)
            ));
        }
        assert_eq!(
            TxChecksum::decide(true, CopyMode::ZeroCopy, no).to_string(),
            "software (the driver has no AF_XDP TX checksum offload)"
        );
    }
}
