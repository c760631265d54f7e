//! io_uring backends: [`UringUdp`] for the UDP underlay and [`UringTun`] for the TUN device.
//!
//! They keep the contracts of [`UdpSocket`] and [`Tun`], and take one over when made, so
//! binding, socket options, offloads and the planning of sends (GSO runs, coalesced writes)
//! stay in one place. Each backend drives two rings:
//!
//! - A receive ring, with one multishot receive armed on the descriptor (`RecvMsgMulti` on the
//!   socket, `ReadMulti` on the TUN) that takes its buffers from a provided-buffer ring
//!   registered with it. The kernel fills a buffer as each datagram or packet arrives and posts
//!   a completion for it; the ring's descriptor polls readable while completions wait, so it is
//!   what `fd()` returns and the worker's `poll` loop needs no change. `recv_batch` reaps the
//!   completions from shared memory (no syscall while there are some), copies each payload
//!   into the next batch frame and gives the buffer back to the kernel. That copy is the one
//!   this backend adds over recvmmsg, which lands datagrams in the frames directly: the kernel
//!   fills these buffers before anyone knows which batch they will go to.
//! - A call ring, for operations that finish within one call: sends, writes, and TUN reads
//!   where multishot reads are missing. One entry per message, all submitted by one
//!   `io_uring_enter` that also waits for their completions. Every one of them is
//!   non-blocking (`MSG_DONTWAIT`, `RWF_NOWAIT`), so the kernel performs it while submitting
//!   it and never parks it on a wait queue; when the call returns the batch is free again.
//!
//! Two rings because a send must reap its own completions before it returns: receive
//! completions arriving on the same ring meanwhile would have to be set aside, where the
//! worker's `poll` on the ring descriptor would no longer see them.

use crate::offload::{VnetHdr, VNET_HDR_LEN};
use crate::tun::{self, Offloads, Tun};
use crate::udp::{self, UdpSocket};
use crate::{Batch, DatagramIo, PacketIo, BATCH_SIZE, FRAME_PAYLOAD, HEADROOM};
use io_uring::types::{BufRingEntry, CancelBuilder, Fd, RecvMsgOut, SubmitArgs, Timespec};
use io_uring::{cqueue, opcode, squeue, IoUring, Probe};
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU16, Ordering};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

/// Buffers in each provided-buffer ring: how many datagrams or packets the kernel may take in
/// ahead of the worker (the socket's or the device's own queue holds the rest). A power of two,
/// as the kernel requires. The memory is mapped lazily: a buffer costs only the pages the
/// kernel has written (one for a 1400-byte datagram, all of them for a 64 KiB GRO merge).
const RX_BUFFERS: u16 = 256;
/// The buffer group id of that ring (group ids are per ring; each ring has one group).
const BUF_GROUP: u16 = 0;
/// Submission queue of the receive ring: at most an arm and a cancel are queued at once.
const RX_SQ: u32 = 8;
/// Completion queue of the receive ring: a completion holds a buffer until reaped, so this
/// is never outrun (overflows are still handled: the kernel keeps them and we flush).
const RX_CQ: u32 = 2 * RX_BUFFERS as u32;
/// Submission queue of the call ring: one entry per frame at most.
const CALL_SQ: u32 = BATCH_SIZE as u32;
/// Reap-and-re-arm passes in one receive call at most.
const RX_PASSES: usize = 4;
/// `user_data` of cancel requests; multishot receives count up from 1.
const CANCEL: u64 = u64::MAX;
/// How often a failing `io_uring_enter` is retried for transient errors (EAGAIN, EBUSY).
const ENTER_RETRIES: usize = 100;
/// How long `Drop` waits for the kernel to let go of the receive buffers.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// `struct io_uring_recvmsg_out`: the four u32 the kernel puts in front of each multishot
/// recvmsg buffer (the crate parses it, but does not export its size).
const RECVMSG_OUT_LEN: usize = 16;
/// Room for the source address in each receive buffer.
const NAME_LEN: usize = size_of::<libc::sockaddr_storage>();
/// Room for control messages (UDP_GRO's int needs CMSG_SPACE(4) = 24 bytes).
const CONTROL_LEN: usize = 64;
/// A UDP receive buffer: the recvmsg header, name, control, and a whole GRO-merged datagram.
const UDP_BUF_LEN: usize =
    (RECVMSG_OUT_LEN + NAME_LEN + CONTROL_LEN + FRAME_PAYLOAD).div_ceil(64) * 64;
/// A TUN receive buffer: the virtio_net_hdr (when the device has one) and a packet.
const TUN_BUF_LEN: usize = (VNET_HDR_LEN + FRAME_PAYLOAD).div_ceil(64) * 64;

// Every buffer has room for a whole datagram or packet after the headers in front of it,
// and buffers stay 8-aligned (the control messages are walked in place).
const _: () = assert!(UDP_BUF_LEN - RECVMSG_OUT_LEN - NAME_LEN - CONTROL_LEN >= FRAME_PAYLOAD);
const _: () = assert!(TUN_BUF_LEN - VNET_HDR_LEN >= FRAME_PAYLOAD);
const _: () = assert!(UDP_BUF_LEN.is_multiple_of(8) && RX_BUFFERS.is_power_of_two());

/// Packets from the TUN side carry no peer address.
const NO_ADDR: SocketAddr = SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, 0, 0, 0));

/// Whether io_uring works here with the operations these backends use: rings can be made
/// (seccomp profiles and `kernel.io_uring_disabled` forbid it), the opcode probe lists
/// recvmsg (multishot since Linux 6.0), sendmsg, read, writev and cancel, and a provided-buffer
/// ring can be registered. Multishot TUN reads (`ReadMulti`, Linux 6.7) are not required:
/// [`UringTun`] reads packet by packet through the ring without them.
pub fn probe() -> io::Result<()> {
    // Made before the ring, so dropped after it.
    let bufs = BufRing::new(2, 64)?;
    let ring = new_ring(RX_SQ, None)?;
    check_ops(&ring)?;
    // Provided-buffer rings came in Linux 5.19; register a small one and take it out again.
    bufs.register(&ring)?;
    ring.submitter()
        .unregister_buf_ring(BUF_GROUP)
        .map_err(|e| context(e, "cannot unregister a provided-buffer ring"))?;
    Ok(())
}

fn context(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn new_ring(entries: u32, cq: Option<u32>) -> io::Result<IoUring> {
    let mut builder = IoUring::builder();
    // Keep submitting the entries after one that fails to prepare: every entry then gets a
    // completion, which the call ring counts on.
    builder.setup_submit_all();
    if let Some(cq) = cq {
        builder.setup_cqsize(cq);
    }
    builder.build(entries).map_err(|e| {
        context(
            e,
            "cannot create an io_uring instance (seccomp, or kernel.io_uring_disabled?)",
        )
    })
}

/// Fails unless the kernel has every operation used here; returns the probe for optional ones.
fn check_ops(ring: &IoUring) -> io::Result<Probe> {
    let mut probe = Probe::new();
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(|e| context(e, "cannot probe io_uring operations"))?;
    // SendZc arrived in Linux 6.0 together with multishot recvmsg, which has no opcode of its
    // own: its presence says the recvmsg here can be multishot.
    let needed = [
        (opcode::RecvMsg::CODE, "recvmsg"),
        (opcode::SendMsg::CODE, "sendmsg"),
        (opcode::Read::CODE, "read"),
        (opcode::Writev::CODE, "writev"),
        (opcode::AsyncCancel::CODE, "async cancel"),
        (opcode::SendZc::CODE, "multishot recvmsg"),
    ];
    for (code, what) in needed {
        if !probe.is_supported(code) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("io_uring here has no {what} (Linux 6.0 or later is needed)"),
            ));
        }
    }
    Ok(probe)
}

/// Anonymous memory from `mmap`: zeroed and page-aligned (buffer rings must be).
struct Mmap {
    ptr: NonNull<u8>,
    len: usize,
    /// Set when the kernel might still write here: the mapping is then never unmapped.
    leak: bool,
}

impl Mmap {
    fn new(len: usize) -> io::Result<Mmap> {
        // SAFETY: a new private anonymous mapping at an address the kernel picks aliases
        // nothing that exists.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(context(
                io::Error::last_os_error(),
                "cannot map io_uring buffers",
            ));
        }
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned a null mapping"))?;
        Ok(Mmap {
            ptr,
            len,
            leak: false,
        })
    }

    fn base(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        if self.leak {
            return;
        }
        // SAFETY: exactly the mapping made in `new`; its owner drops it only once the kernel is
        // done with it (otherwise `leak` is set), and no reference into it outlives the owner.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A provided-buffer ring: `count` buffers of `buf_len` bytes, and the ring of entries through
/// which they are lent to the kernel. A buffer is the kernel's from the moment its entry is
/// published below the tail until a completion names it; then it is ours until `push`.
struct BufRing {
    entries: Mmap,
    buffers: Mmap,
    count: u16,
    buf_len: usize,
    /// The tail as we have written it; the kernel sees it at `publish`.
    tail: u16,
}

impl BufRing {
    /// Every buffer starts out lent to the kernel.
    fn new(count: u16, buf_len: usize) -> io::Result<BufRing> {
        debug_assert!(count.is_power_of_two());
        let entries = Mmap::new(usize::from(count) * size_of::<BufRingEntry>())?;
        let buffers = Mmap::new(usize::from(count) * buf_len)?;
        let mut ring = BufRing {
            entries,
            buffers,
            count,
            buf_len,
            tail: 0,
        };
        for bid in 0..count {
            ring.push(bid);
        }
        ring.publish();
        Ok(ring)
    }

    fn register(&self, ring: &IoUring) -> io::Result<()> {
        // SAFETY: the entries mapping holds `count` entries (a power of two), is page-aligned,
        // and lives as long as this value, which its owner keeps until the ring is closed.
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                self.entries.base() as u64,
                self.count,
                BUF_GROUP,
                0,
            )
        }
        .map_err(|e| context(e, "cannot register a provided-buffer ring"))
    }

    /// Buffer `bid`'s first `len` bytes, as the kernel wrote them. `None` for an id or length
    /// out of range (they come from the kernel, but are checked all the same).
    fn buffer(&self, bid: u16, len: usize) -> Option<&[u8]> {
        if bid >= self.count || len > self.buf_len {
            return None;
        }
        // SAFETY: in bounds of the buffers mapping (bid < count, len <= buf_len). A completion
        // named this buffer, so the kernel has handed it over and takes it again only after
        // `push`, which needs `&mut self` and so waits for this borrow to end.
        Some(unsafe {
            std::slice::from_raw_parts(
                self.buffers.base().add(usize::from(bid) * self.buf_len),
                len,
            )
        })
    }

    /// Lends buffer `bid` to the kernel again, from the next `publish` on.
    fn push(&mut self, bid: u16) {
        let slot = usize::from(self.tail & (self.count - 1));
        let addr = self.buffers.base() as u64 + (usize::from(bid) * self.buf_len) as u64;
        // SAFETY: slot < count, inside the entries mapping. The kernel reads only entries
        // between its head and the published tail; a buffer is pushed once per completion
        // that returned it, so fewer than `count` are lent and `slot` lies outside that range.
        // The setters leave the `resv` word alone, which in entry 0 is the tail the kernel
        // reads concurrently.
        let entry = unsafe { &mut *self.entries.base().cast::<BufRingEntry>().add(slot) };
        entry.set_addr(addr);
        entry.set_len(self.buf_len as u32);
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Makes the pushed entries visible to the kernel.
    fn publish(&self) {
        let base = self.entries.base().cast::<BufRingEntry>();
        // SAFETY: `tail` points at entry 0's `resv` u16 inside the mapping, suitably aligned;
        // the kernel reads it with acquire ordering, pairing with this release store, which
        // also orders the entry writes before it. Nothing accesses it non-atomically.
        let tail = unsafe { AtomicU16::from_ptr(BufRingEntry::tail(base).cast_mut()) };
        tail.store(self.tail, Ordering::Release);
    }
}

/// The msghdr a multishot recvmsg is armed with: only the name and control lengths matter,
/// and they fix the layout of every buffer (see `RecvMsgOut::parse`).
fn recv_msghdr() -> libc::msghdr {
    // SAFETY: msghdr is plain data; all zeroes (null pointers, zero lengths) is valid.
    let mut hdr: libc::msghdr = unsafe { zeroed() };
    hdr.msg_namelen = NAME_LEN as libc::socklen_t;
    hdr.msg_controllen = CONTROL_LEN as _;
    hdr
}

enum RxOp {
    /// Multishot recvmsg; the kernel reads the boxed header when the request is prepared.
    RecvMsg(Box<libc::msghdr>),
    /// Multishot read (Linux 6.7).
    Read,
}

/// What one pass over the receive ring found besides data.
struct RxEvents {
    /// The error that ended the armed multishot (ENOBUFS and ECANCELED excepted): it is
    /// re-armed, and the caller decides whether to report it.
    error: Option<i32>,
}

/// A receive ring: a multishot receive on `target` with a provided-buffer ring.
struct Receiver {
    // Field order matters for Drop: the ring is closed before the buffers are unmapped.
    ring: IoUring,
    bufs: BufRing,
    op: RxOp,
    target: RawFd,
    /// `user_data` of the armed multishot; 0 when none is (re-armed on the next call).
    armed: u64,
    /// The thread that armed it: the kernel runs the request's completion work on that thread.
    owner: Option<ThreadId>,
    last_id: u64,
    /// Multishots submitted whose final completion has not been reaped.
    live: u32,
    /// Multishots pushed but not yet taken by the kernel.
    queued: u32,
    /// Whether any data ever came (a multishot the file cannot do fails at once instead).
    delivered: bool,
}

// SAFETY: the mappings and the boxed msghdr belong to this value alone, and the kernel's use
// of them is bound to the ring, which moves with it. Completion work of an armed request runs
// on the thread that armed it, wherever this value is; `adopt_thread` re-arms on the thread
// that receives.
unsafe impl Send for Receiver {}

impl Receiver {
    fn new(target: RawFd, op: RxOp, buf_len: usize) -> io::Result<Receiver> {
        let ring = new_ring(RX_SQ, Some(RX_CQ))?;
        let bufs = BufRing::new(RX_BUFFERS, buf_len)?;
        bufs.register(&ring)?;
        let mut rx = Receiver {
            ring,
            bufs,
            op,
            target,
            armed: 0,
            owner: None,
            last_id: 0,
            live: 0,
            queued: 0,
            delivered: false,
        };
        rx.arm();
        rx.submit()
            .map_err(|e| context(e, "cannot start receiving through io_uring"))?;
        Ok(rx)
    }

    fn fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }

    /// Queues a new multishot receive (submitted by the next `submit`).
    fn arm(&mut self) {
        self.last_id += 1;
        let id = self.last_id;
        let entry = match &self.op {
            RxOp::RecvMsg(msg) => {
                opcode::RecvMsgMulti::new(Fd(self.target), &**msg, BUF_GROUP).build()
            }
            RxOp::Read => opcode::ReadMulti::new(Fd(self.target), 0, BUF_GROUP).build(),
        }
        .user_data(id);
        // SAFETY: the entry refers to the msghdr boxed in `self.op` and to the buffer group
        // registered on this ring, both kept until the ring is closed, and to `target`, which
        // the owning backend closes only after this receiver (field order).
        if unsafe { self.ring.submission().push(&entry) }.is_ok() {
            self.armed = id;
            self.owner = Some(thread::current().id());
            self.queued += 1;
        }
    }

    /// Hands everything queued to the kernel.
    fn submit(&mut self) -> io::Result<()> {
        let mut failures = 0;
        loop {
            match self.ring.submit() {
                Ok(_) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_transient(&e) && failures < ENTER_RETRIES => failures += 1,
                Err(e) => return Err(e),
            }
        }
        if self.ring.submission().is_empty() {
            self.live += std::mem::take(&mut self.queued);
        }
        Ok(())
    }

    /// The kernel runs a multishot's completion work on the thread that armed it. A backend
    /// is usually made on one thread and run on another (the worker's), so the first receive
    /// on a new thread cancels the multishot and arms it again from there.
    fn adopt_thread(&mut self) {
        let me = thread::current().id();
        if self.armed == 0 || self.owner == Some(me) {
            return;
        }
        let cancel = opcode::AsyncCancel::new(self.armed)
            .build()
            .user_data(CANCEL);
        // SAFETY: a cancel request refers to no memory.
        if unsafe { self.ring.submission().push(&cancel) }.is_ok() {
            self.arm();
        }
    }

    /// Appends what the kernel has received to `batch`: `deliver` copies a buffer's contents
    /// into the next frame (or drops them). Reaps without a syscall when completions are
    /// waiting; enters the kernel only to re-arm a multishot that ended, or to flush
    /// completions the kernel held back. Returns the frames added.
    fn receive(
        &mut self,
        batch: &mut Batch,
        mut deliver: impl FnMut(&[u8], &mut Batch),
    ) -> (usize, RxEvents) {
        let start = batch.len();
        let mut events = RxEvents { error: None };
        self.adopt_thread();
        // Every pass ends with a multishot armed and submitted, so whatever happens next (data,
        // or that multishot ending at once, as it does after an empty datagram) posts a
        // completion and wakes the worker's poll. Returning with none armed would leave the
        // ring silent for good. The pass bound only limits the time one call takes.
        for _ in 0..RX_PASSES {
            self.reap(batch, &mut deliver, &mut events);
            if self.armed == 0 {
                self.arm();
            }
            let (queued, overflow) = {
                let sq = self.ring.submission();
                (!sq.is_empty(), sq.cq_overflow())
            };
            if !queued && !overflow {
                break;
            }
            if let Err(e) = self.submit() {
                // Queued entries stay queued and go with the next call's submit.
                tracing::warn!("io_uring receive submit failed: {e}");
                break;
            }
        }
        let n = batch.len() - start;
        self.delivered |= n > 0;
        (n, events)
    }

    /// Takes completions until the batch is full or none are left, returning their buffers.
    fn reap(
        &mut self,
        batch: &mut Batch,
        deliver: &mut impl FnMut(&[u8], &mut Batch),
        events: &mut RxEvents,
    ) {
        let mut cq = self.ring.completion();
        while !batch.is_full() {
            let Some(cqe) = cq.next() else { break };
            let (res, flags, id) = (cqe.result(), cqe.flags(), cqe.user_data());
            if id == CANCEL {
                continue;
            }
            if let Some(bid) = cqueue::buffer_select(flags) {
                if res > 0 {
                    if let Some(data) = self.bufs.buffer(bid, res.unsigned_abs() as usize) {
                        deliver(data, batch);
                    }
                }
                if bid < self.bufs.count {
                    self.bufs.push(bid);
                }
            }
            if !cqueue::more(flags) {
                // This multishot is over: out of buffers, cancelled, failed, or after an
                // empty datagram (which the kernel takes for the end of a stream; its
                // completion above still delivered it).
                self.live = self.live.saturating_sub(1);
                if id == self.armed {
                    self.armed = 0;
                    if res < 0 && res != -libc::ENOBUFS && res != -libc::ECANCELED {
                        events.error = Some(-res);
                    }
                }
            }
        }
        drop(cq);
        self.bufs.publish();
    }
}

impl Drop for Receiver {
    /// Cancels the multishot receives and waits for their last completions, so the kernel no
    /// longer writes the buffers when they are unmapped. If that cannot be confirmed in time,
    /// the buffers are leaked rather than freed under the kernel.
    fn drop(&mut self) {
        // Everything queued goes in first, so the cancel below covers it; what still cannot
        // be submitted never will be (the ring closes) and so never runs.
        let _ = self.submit();
        let until = Instant::now() + DRAIN_TIMEOUT;
        while self.live > 0 && Instant::now() < until {
            let _ = self.ring.submitter().register_sync_cancel(
                Some(Timespec::from(Duration::from_millis(100))),
                CancelBuilder::any(),
            );
            for cqe in self.ring.completion() {
                if cqe.user_data() != CANCEL && !cqueue::more(cqe.flags()) {
                    self.live = self.live.saturating_sub(1);
                }
            }
            if self.live > 0 {
                // A final completion may still be on its way through the owning thread's
                // completion work; wait a little for it.
                let ts = Timespec::from(Duration::from_millis(10));
                let args = SubmitArgs::new().timespec(&ts);
                let _ = self.ring.submitter().submit_with_args(1, &args);
            }
        }
        if self.live > 0 {
            tracing::warn!(
                "io_uring receive did not stop in {DRAIN_TIMEOUT:?}; leaking its buffers"
            );
            self.bufs.entries.leak = true;
            self.bufs.buffers.leak = true;
        }
    }
}

/// Errors of `io_uring_enter` worth retrying: out of request memory, or completions backed up.
fn is_transient(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY))
}

/// A ring whose operations all finish within the call that submits them.
struct CallRing {
    ring: IoUring,
    /// Set when entries could not be submitted: they point into a batch the caller will reuse,
    /// so the ring is never entered again.
    broken: bool,
}

impl CallRing {
    fn new() -> io::Result<CallRing> {
        Ok(CallRing {
            ring: new_ring(CALL_SQ, None)?,
            broken: false,
        })
    }

    fn check(&mut self) -> io::Result<()> {
        if self.broken {
            return Err(io::Error::other(
                "an earlier io_uring submission failed; this backend is out of service",
            ));
        }
        // Completions left by a call that failed half-way would be taken for this call's.
        for _ in self.ring.completion() {}
        Ok(())
    }

    /// Queues `entry`; false if the queue is full (never with one entry per frame).
    ///
    /// # Safety
    ///
    /// Whatever `entry` points at must stay valid until `run` returns.
    unsafe fn push(&mut self, entry: &squeue::Entry) -> bool {
        // SAFETY: passed on to the caller.
        unsafe { self.ring.submission().push(entry) }.is_ok()
    }

    /// Submits what was pushed and hands each of the `n` completions to `done` (user_data,
    /// result). Returns once all have come: the pushed entries are non-blocking, so the kernel
    /// performs them during the submit and posts their completions before it returns.
    fn run(&mut self, n: usize, mut done: impl FnMut(u64, i32)) -> io::Result<()> {
        let mut reaped = 0;
        let mut failures = 0;
        loop {
            for cqe in self.ring.completion() {
                done(cqe.user_data(), cqe.result());
                reaped += 1;
            }
            let queued = self.ring.submission().len();
            if reaped >= n && queued == 0 {
                return Ok(());
            }
            match self.ring.submit_and_wait(n.saturating_sub(reaped)) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_transient(&e) && failures < ENTER_RETRIES => {
                    failures += 1;
                    thread::yield_now();
                }
                Err(e) => {
                    if !self.ring.submission().is_empty() {
                        self.broken = true;
                    }
                    return Err(e);
                }
            }
        }
    }

    /// `run`, keeping each entry's result by its `user_data` (an index below `BATCH_SIZE`);
    /// entries that never completed read as EAGAIN.
    fn run_collect(&mut self, n: usize) -> io::Result<[i32; BATCH_SIZE]> {
        let mut results = [-libc::EAGAIN; BATCH_SIZE];
        self.run(n, |id, res| {
            if let Some(r) = results.get_mut(id as usize) {
                *r = res;
            }
        })?;
        Ok(results)
    }
}

/// The datagram size of a GRO-merged receive, from its control messages (0: one datagram).
fn gro_size(control: &[u8]) -> u16 {
    // The kernel's CMSG_ALIGN: to the size of a long.
    let align = |n: usize| {
        n.div_ceil(size_of::<usize>())
            .saturating_mul(size_of::<usize>())
    };
    let hdr_len = size_of::<libc::cmsghdr>();
    let mut rest = control;
    while let Some(raw) = rest.get(..hdr_len) {
        // SAFETY: `raw` holds size_of::<cmsghdr>() bytes; cmsghdr is plain integers, read
        // unaligned.
        let c: libc::cmsghdr = unsafe { ptr::read_unaligned(raw.as_ptr().cast()) };
        let len = c.cmsg_len as usize;
        if len < hdr_len {
            break;
        }
        if c.cmsg_level == libc::SOL_UDP && c.cmsg_type == libc::UDP_GRO {
            return rest
                .get(align(hdr_len)..)
                .and_then(|data| data.get(..size_of::<libc::c_int>()))
                .and_then(|b| b.try_into().ok())
                .map(libc::c_int::from_ne_bytes)
                .and_then(|size| u16::try_from(size).ok())
                .unwrap_or(0);
        }
        rest = rest.get(align(len)..).unwrap_or(&[]);
    }
    0
}

/// The source address from a multishot recvmsg's name field.
fn source(name: &[u8]) -> Option<SocketAddr> {
    // SAFETY: sockaddr_storage is plain data; all zeroes is valid.
    let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
    let len = name.len().min(size_of::<libc::sockaddr_storage>());
    // SAFETY: copies `len` bytes, no more than either side holds, between distinct objects.
    unsafe {
        ptr::copy_nonoverlapping(name.as_ptr(), ptr::addr_of_mut!(storage).cast::<u8>(), len)
    };
    udp::read_sockaddr(&storage, len as libc::socklen_t)
}

/// Copies one received datagram into the next free frame of `batch` (the one copy of this
/// backend), with its source and GRO segment size. Drops what cannot be parsed or was cut.
fn deliver_datagram(buf: &[u8], hdr: &libc::msghdr, batch: &mut Batch) {
    let Ok(msg) = RecvMsgOut::parse(buf, hdr) else {
        return;
    };
    let payload = msg.payload_data();
    if msg.is_payload_truncated() || payload.len() != msg.incoming_payload_len() as usize {
        return;
    }
    let Some(from) = source(msg.name_data()) else {
        return;
    };
    let Some(slot) = batch.next_free() else {
        return;
    };
    let Some(dst) = slot.get_mut(..payload.len()) else {
        return;
    };
    dst.copy_from_slice(payload);
    let i = batch.len();
    batch.commit(payload.len(), from);
    batch.set_segment_size(i, gro_size(msg.control_data()));
}

/// The UDP underlay through io_uring: a multishot recvmsg with provided buffers, and sendmsg
/// for each message of a batch (GSO runs as one message), submitted together.
pub struct UringUdp {
    // Field order matters for Drop: receives are cancelled before the socket closes.
    rx: Receiver,
    calls: CallRing,
    sock: UdpSocket,
}

impl std::fmt::Debug for UringUdp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringUdp")
            .field("ring", &self.rx.fd())
            .field("socket", &self.sock)
            .finish()
    }
}

impl UringUdp {
    /// Takes over a bound socket (see [`UdpSocket::bind`]); its options (GSO, GRO, mark) carry
    /// over and stay settable here.
    pub fn new(sock: UdpSocket) -> io::Result<UringUdp> {
        let calls = CallRing::new()?;
        check_ops(&calls.ring)?;
        let fd = DatagramIo::fd(&sock)
            .ok_or_else(|| io::Error::other("the UDP socket has no descriptor"))?;
        let rx = Receiver::new(fd, RxOp::RecvMsg(Box::new(recv_msghdr())), UDP_BUF_LEN)?;
        Ok(UringUdp { rx, calls, sock })
    }

    /// The address the socket is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.sock.local_addr()
    }

    /// Whether sends use UDP GSO.
    pub fn gso(&self) -> bool {
        self.sock.gso()
    }

    /// Turns UDP GSO off (or back on, where the kernel has it).
    pub fn set_gso(&mut self, on: bool) {
        self.sock.set_gso(on);
    }

    /// Whether receives take merged datagrams (UDP GRO).
    pub fn gro(&self) -> bool {
        self.sock.gro()
    }

    /// Turns UDP GRO off (or back on, where the kernel has it). Receive buffers always have
    /// room for the control message, so this needs no re-arm.
    pub fn set_gro(&mut self, on: bool) {
        self.sock.set_gro(on);
    }

    /// Marks every datagram the socket sends (SO_MARK); 0 clears it.
    pub fn set_mark(&self, mark: u32) -> io::Result<()> {
        self.sock.set_mark(mark)
    }

    /// Submits messages `0..count` of the socket's send scratch for which `pick` holds, and
    /// tallies their results into `tally`.
    fn send_messages(
        &mut self,
        count: usize,
        pick: impl Fn(usize) -> bool,
        tally: &mut SendTally,
    ) -> io::Result<()> {
        let fd = Fd(self.rx.target);
        let mut pushed = 0;
        for m in 0..count {
            if !pick(m) {
                continue;
            }
            let hdr: *const libc::msghdr = &self.sock.scratch.hdrs[m].msg_hdr;
            let entry = opcode::SendMsg::new(fd, hdr)
                .flags(libc::MSG_DONTWAIT as u32)
                .build()
                .user_data(m as u64);
            // SAFETY: the msghdr, its address and control buffers and its iovecs live in the
            // socket's boxed scratch, the iovecs point at frames of the batch the caller lends
            // for the whole call, and `run` returns only once every entry has completed (or
            // marks the ring broken, so entries left unsubmitted never run).
            if unsafe { self.calls.push(&entry) } {
                pushed += 1;
            }
        }
        let scratch = &self.sock.scratch;
        self.calls.run(pushed, |id, res| {
            let m = id as usize;
            if m >= count {
                return;
            }
            let (first, segments) = (scratch.first[m], scratch.segments[m]);
            if res >= 0 {
                tally.sent += segments;
                return;
            }
            let errno = -res;
            if segments > 1
                && matches!(
                    errno,
                    libc::EIO | libc::EINVAL | libc::EMSGSIZE | libc::ENOPROTOOPT
                )
            {
                for r in &mut tally.refused[first..(first + segments).min(BATCH_SIZE)] {
                    *r = true;
                }
                tally.gso_refused.get_or_insert(errno);
            } else if errno != libc::EAGAIN {
                let e = io::Error::from_raw_os_error(errno);
                if udp::is_fatal(&e) {
                    tally.fatal.get_or_insert(e);
                }
            }
            // EAGAIN: the send buffer is full and the datagrams are dropped, like any other
            // the kernel refuses; the caller counts them.
        })
    }
}

/// The results of one `send_batch`.
struct SendTally {
    sent: usize,
    /// Datagrams whose GSO message the kernel refused (to be sent one by one).
    refused: [bool; BATCH_SIZE],
    gso_refused: Option<i32>,
    fatal: Option<io::Error>,
}

impl DatagramIo for UringUdp {
    /// The socket's queue: what the multishot receive has not yet moved into the ring.
    fn backlog(&self) -> Option<(usize, usize)> {
        self.sock.backlog()
    }

    fn recv_batch(&mut self, batch: &mut Batch) -> io::Result<usize> {
        if batch.is_full() {
            return Ok(0);
        }
        let hdr = recv_msghdr();
        let (n, events) = self
            .rx
            .receive(batch, |buf, batch| deliver_datagram(buf, &hdr, batch));
        match events.error.map(io::Error::from_raw_os_error) {
            Some(e) if n == 0 && udp::is_fatal(&e) => Err(e),
            _ => Ok(n),
        }
    }

    fn send_batch(&mut self, batch: &mut Batch) -> io::Result<usize> {
        if batch.is_empty() {
            return Ok(0);
        }
        self.calls.check()?;
        let mut tally = SendTally {
            sent: 0,
            refused: [false; BATCH_SIZE],
            gso_refused: None,
            fatal: None,
        };
        let count = self.sock.build_send(batch, 0);
        self.send_messages(count, |_| true, &mut tally)?;
        if let Some(errno) = tally.gso_refused {
            // Degrade, never fail: the refused runs go again datagram by datagram, and so
            // does everything from now on.
            let e = io::Error::from_raw_os_error(errno);
            tracing::warn!("UDP GSO refused by the kernel ({e}); sending without it");
            self.sock.set_gso(false);
            let from = tally.refused.iter().position(|&r| r).unwrap_or(0);
            let retry = tally.refused;
            let count = self.sock.build_send(batch, from);
            let first = self.sock.scratch.first;
            self.send_messages(count, |m| retry[first[m]], &mut tally)?;
        }
        match tally.fatal {
            Some(e) if tally.sent == 0 => Err(e),
            _ => Ok(tally.sent),
        }
    }

    /// The receive ring's descriptor: it polls readable while completions wait.
    fn fd(&self) -> Option<RawFd> {
        Some(self.rx.fd())
    }

    fn local_port(&self) -> u16 {
        self.sock.local_port()
    }
}

/// The iovecs of one batch of TUN writes: each write's head, then its members.
struct Iovecs(Box<[libc::iovec; BATCH_SIZE]>);

// SAFETY: the pointers are rewritten before every write and point only into the batch
// borrowed for that call; nothing is shared between threads through them.
unsafe impl Send for Iovecs {}

enum Reads {
    /// A multishot read on the receive ring; `fd()` is the ring's.
    Multishot(Box<Receiver>),
    /// Reads straight into the batch's frames through the call ring, `burst` at a time (it
    /// grows while every read finds a packet); `fd()` is the TUN's own.
    Single { burst: usize },
}

/// The TUN device through io_uring: a multishot read with provided buffers where the kernel
/// has one (Linux 6.7), else batches of single reads; a `writev` per planned write, all
/// submitted together.
pub struct UringTun {
    // Field order matters for Drop: reads are cancelled before the device closes.
    reads: Reads,
    calls: CallRing,
    iovs: Iovecs,
    /// `RWF_NOWAIT`, or 0 on a kernel whose TUN refuses it (where O_NONBLOCK then does).
    rw_flags: i32,
    tun: Tun,
}

impl std::fmt::Debug for UringTun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringTun")
            .field("tun", &self.tun)
            .field("multishot", &matches!(self.reads, Reads::Multishot(_)))
            .finish()
    }
}

impl UringTun {
    /// Takes over a TUN device, plain or with offloads.
    pub fn new(tun: Tun) -> io::Result<UringTun> {
        UringTun::build(tun, true)
    }

    /// Like [`UringTun::new`], but reading packet by packet even where multishot reads exist
    /// (what kernels before 6.7 get): no copy out of a provided buffer, which pays off when
    /// packets are large (TUN offloads on).
    pub fn with_single_reads(tun: Tun) -> io::Result<UringTun> {
        UringTun::build(tun, false)
    }

    fn build(tun: Tun, multishot: bool) -> io::Result<UringTun> {
        let calls = CallRing::new()?;
        let probe = check_ops(&calls.ring)?;
        let fd = PacketIo::fd(&tun)
            .ok_or_else(|| io::Error::other("the TUN device has no descriptor"))?;
        let reads = if multishot && probe.is_supported(opcode::ReadMulti::CODE) {
            Reads::Multishot(Box::new(Receiver::new(fd, RxOp::Read, TUN_BUF_LEN)?))
        } else {
            Reads::Single { burst: 1 }
        };
        let empty = libc::iovec {
            iov_base: ptr::null_mut(),
            iov_len: 0,
        };
        Ok(UringTun {
            reads,
            calls,
            iovs: Iovecs(Box::new([empty; BATCH_SIZE])),
            rw_flags: libc::RWF_NOWAIT,
            tun,
        })
    }

    /// The interface name.
    pub fn name(&self) -> &str {
        self.tun.name()
    }

    /// The offloads in use.
    pub fn offloads(&self) -> Offloads {
        self.tun.offloads()
    }

    /// How many packets so far were written as part of a super-packet.
    pub fn coalesced(&self) -> u64 {
        self.tun.coalesced
    }

    /// Whether reads are multishot (false: single reads, before Linux 6.7 or by choice).
    pub fn multishot(&self) -> bool {
        matches!(self.reads, Reads::Multishot(_))
    }

    fn tun_fd(&self) -> RawFd {
        PacketIo::fd(&self.tun).unwrap_or(-1)
    }

    /// A result the TUN refused because of RWF_NOWAIT: stop asking for it (O_NONBLOCK alone
    /// then keeps io_uring from waiting, on such kernels). Returns whether that was it.
    fn nowait_refused(&mut self, errno: i32) -> bool {
        if errno == libc::EOPNOTSUPP && self.rw_flags != 0 {
            tracing::warn!("the TUN device refuses RWF_NOWAIT; relying on O_NONBLOCK");
            self.rw_flags = 0;
            return true;
        }
        false
    }

    /// Batches of reads straight into the frames, until the device has nothing more.
    fn read_single(&mut self, batch: &mut Batch) -> io::Result<usize> {
        let hdr = self.tun.vnet_hdr_len.min(HEADROOM);
        let fd = Fd(self.tun_fd());
        let mut got = 0;
        let mut fatal = None;
        while !batch.is_full() {
            let Reads::Single { burst } = self.reads else {
                break;
            };
            let start = batch.len();
            let k = burst.min(BATCH_SIZE - start);
            let frames = batch.payload_ptrs();
            let mut pushed = 0;
            for j in 0..k {
                // Each read starts `hdr` bytes into the headroom: the header lands there and
                // the packet in the payload area.
                let buf = frames[start + j].wrapping_sub(hdr);
                let entry = opcode::Read::new(fd, buf, (hdr + FRAME_PAYLOAD) as u32)
                    .rw_flags(self.rw_flags)
                    .build()
                    .user_data(j as u64);
                // SAFETY: `buf` is `hdr` bytes before frame start+j's payload (HEADROOM >=
                // hdr), with hdr + FRAME_PAYLOAD writable bytes to the end of that frame, and
                // no other read targets it; the batch is borrowed for the whole call and `run`
                // returns only once every read has completed.
                if unsafe { self.calls.push(&entry) } {
                    pushed += 1;
                }
            }
            let results = self.calls.run_collect(pushed)?;
            let mut filled = 0;
            let mut lens = [0; BATCH_SIZE];
            let mut drained = false;
            for (j, &res) in results.iter().enumerate().take(pushed) {
                if res < 0 {
                    let errno = -res;
                    drained |= errno == libc::EAGAIN || self.nowait_refused(errno);
                    let e = io::Error::from_raw_os_error(errno);
                    if tun::is_fatal(&e) {
                        fatal.get_or_insert(e);
                        drained = true;
                    }
                    continue;
                }
                // res <= hdr + FRAME_PAYLOAD: the read's length. Empty reads and headers
                // without a packet deliver nothing.
                let n = res.unsigned_abs() as usize;
                if n <= hdr || n > hdr + FRAME_PAYLOAD {
                    continue;
                }
                let (from, to) = (start + j, start + filled);
                if from != to {
                    // An earlier read found nothing: move this packet down so the frames in
                    // use stay contiguous.
                    // SAFETY: both spans are `n` bytes starting `hdr` bytes before a payload,
                    // inside two distinct frames of the batch (so not overlapping); the reads
                    // are complete and nothing else refers to these frames now.
                    unsafe {
                        ptr::copy_nonoverlapping(
                            frames[from].wrapping_sub(hdr),
                            frames[to].wrapping_sub(hdr),
                            n,
                        )
                    };
                }
                lens[filled] = n - hdr;
                filled += 1;
            }
            // The raw pointers are done with; from here the batch is used through references.
            for (k, &len) in lens.iter().enumerate().take(filled) {
                let i = start + k;
                batch.set(i, len, NO_ADDR);
                if hdr == VNET_HDR_LEN {
                    let raw = &batch.raw_frame_mut(i)[HEADROOM - VNET_HDR_LEN..HEADROOM];
                    if let Ok(h) = <&[u8; VNET_HDR_LEN]>::try_from(raw) {
                        let h = VnetHdr::decode(h);
                        batch.set_offload(i, h);
                    }
                }
            }
            batch.set_len(start + filled);
            got += filled;
            // Grow the burst while every read finds a packet; after a short one, start the
            // next call from about what was there.
            let next = if drained {
                (filled + 1).next_power_of_two()
            } else {
                burst * 2
            };
            self.reads = Reads::Single {
                burst: next.clamp(1, BATCH_SIZE),
            };
            if drained || filled == 0 {
                break;
            }
        }
        match fatal {
            Some(e) if got == 0 => Err(e),
            _ => Ok(got),
        }
    }
}

/// Copies one packet read from the TUN into the next free frame of `batch` (the one copy of
/// the multishot path), with its offload header when the device has one.
fn deliver_packet(buf: &[u8], hdr_len: usize, batch: &mut Batch) {
    // A header without a packet (or an empty read) delivers nothing.
    let Some(packet) = buf.get(hdr_len..).filter(|p| !p.is_empty()) else {
        return;
    };
    let Some(slot) = batch.next_free() else {
        return;
    };
    let Some(dst) = slot.get_mut(..packet.len()) else {
        return;
    };
    dst.copy_from_slice(packet);
    let i = batch.len();
    batch.commit(packet.len(), NO_ADDR);
    if hdr_len == VNET_HDR_LEN {
        if let Ok(h) = <&[u8; VNET_HDR_LEN]>::try_from(&buf[..VNET_HDR_LEN]) {
            batch.set_offload(i, VnetHdr::decode(h));
        }
    }
}

impl PacketIo for UringTun {
    fn recv_batch(&mut self, batch: &mut Batch) -> io::Result<usize> {
        if batch.is_full() {
            return Ok(0);
        }
        let hdr_len = self.tun.vnet_hdr_len.min(HEADROOM);
        let Reads::Multishot(rx) = &mut self.reads else {
            return self.read_single(batch);
        };
        let (n, events) = rx.receive(batch, |buf, batch| deliver_packet(buf, hdr_len, batch));
        let Some(errno) = events.error else {
            return Ok(n);
        };
        let never_worked = !rx.delivered;
        if never_worked && matches!(errno, libc::EINVAL | libc::EOPNOTSUPP | libc::EBADFD) {
            // The kernel lists multishot reads but cannot do them on this device.
            let e = io::Error::from_raw_os_error(errno);
            tracing::warn!("multishot reads fail on the TUN device ({e}); reading one by one");
            self.reads = Reads::Single { burst: 1 };
            return self.read_single(batch).map(|m| m + n);
        }
        let e = io::Error::from_raw_os_error(errno);
        if n == 0 && tun::is_fatal(&e) {
            return Err(e);
        }
        Ok(n)
    }

    fn send_batch(&mut self, batch: &mut Batch) -> io::Result<usize> {
        if batch.is_empty() {
            return Ok(0);
        }
        self.calls.check()?;
        let fd = Fd(self.tun_fd());
        let offload = self.tun.vnet_hdr_len == VNET_HDR_LEN;
        let writes = if offload {
            let groups = self.tun.coalescer.plan(batch);
            for g in 0..groups {
                let planned = self.tun.coalescer.planned(g);
                let raw = batch.raw_frame_mut(planned.head);
                raw[HEADROOM - VNET_HDR_LEN..HEADROOM].copy_from_slice(&planned.hdr.encode());
            }
            groups
        } else {
            batch.len()
        };
        // From here on the frames are only read, through pointers from one borrow.
        let frames = batch.payload_ptrs();
        let iovs = &mut self.iovs.0;
        let mut at = 0;
        let mut pushed = 0;
        for w in 0..writes {
            let first = at;
            if offload {
                let planned = self.tun.coalescer.planned(w);
                iovs[at] = libc::iovec {
                    // The header sits in the headroom right in front of the payload.
                    iov_base: frames[planned.head].wrapping_sub(VNET_HDR_LEN).cast(),
                    iov_len: VNET_HDR_LEN + batch.payload_len(planned.head),
                };
                at += 1;
                for m in self.tun.coalescer.members(w) {
                    iovs[at] = libc::iovec {
                        iov_base: frames[m].wrapping_add(planned.member_hl).cast(),
                        iov_len: batch.payload_len(m).saturating_sub(planned.member_hl),
                    };
                    at += 1;
                }
            } else {
                iovs[at] = libc::iovec {
                    iov_base: frames[w].cast(),
                    iov_len: batch.payload_len(w),
                };
                at += 1;
            }
            let entry = opcode::Writev::new(fd, iovs[first..].as_ptr(), (at - first) as u32)
                .rw_flags(self.rw_flags)
                .build()
                .user_data(w as u64);
            // SAFETY: the iovecs live in `self.iovs`, which is not touched again until `run`
            // has returned, and point at frames of `batch` (every frame is one write's head or
            // member, so at most BATCH_SIZE iovecs), which is borrowed for the whole call;
            // `run` returns only once every write has completed.
            if unsafe { self.calls.push(&entry) } {
                pushed += 1;
            }
        }
        let results = self.calls.run_collect(pushed)?;

        let mut sent = 0;
        let mut fatal = None;
        for (w, &res) in results.iter().enumerate().take(writes) {
            let planned = offload.then(|| self.tun.coalescer.planned(w));
            let packets = planned.map_or(1, |p| p.count);
            if res >= 0 {
                sent += packets;
                if packets > 1 {
                    self.tun.coalesced += packets as u64;
                }
                continue;
            }
            let errno = -res;
            let e = io::Error::from_raw_os_error(errno);
            if errno == libc::EAGAIN || self.nowait_refused(errno) {
                // The device queue is full (or the flag was refused): dropped and counted by
                // the caller.
            } else if tun::is_fatal(&e) {
                fatal.get_or_insert(e);
            } else if let Some(p) = planned.filter(|p| p.count > 1) {
                // Degrade, never fail: a kernel that refuses one kind of super-packet gets
                // that kind packet by packet from now on (this group is lost, and counted).
                if self.tun.coalescer.disable(p.hdr.gso_type) {
                    tracing::warn!(
                        "the kernel refused a coalesced packet (GSO type {}); writing that kind packet by packet",
                        p.hdr.gso_type
                    );
                }
            }
        }
        match fatal {
            Some(e) if sent == 0 => Err(e),
            _ => Ok(sent),
        }
    }

    /// The receive ring's descriptor with multishot reads (it polls readable while
    /// completions wait), else the TUN's own.
    fn fd(&self) -> Option<RawFd> {
        match &self.reads {
            Reads::Multishot(rx) => Some(rx.fd()),
            Reads::Single { .. } => PacketIo::fd(&self.tun),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmsg(level: i32, ty: i32, value: libc::c_int) -> Vec<u8> {
        // SAFETY: CMSG_* only compute sizes.
        let (space, len) = unsafe {
            (
                libc::CMSG_SPACE(size_of::<libc::c_int>() as u32) as usize,
                libc::CMSG_LEN(size_of::<libc::c_int>() as u32) as usize,
            )
        };
        let mut buf = vec![0u8; space];
        // SAFETY: as above.
        let data = unsafe { libc::CMSG_LEN(0) } as usize;
        // SAFETY: cmsghdr is plain data; all zeroes is valid.
        let mut hdr: libc::cmsghdr = unsafe { zeroed() };
        hdr.cmsg_len = len as _;
        hdr.cmsg_level = level;
        hdr.cmsg_type = ty;
        // SAFETY: buf holds at least size_of::<cmsghdr>() bytes.
        unsafe { ptr::write_unaligned(buf.as_mut_ptr().cast(), hdr) };
        buf[data..data + 4].copy_from_slice(&value.to_ne_bytes());
        buf
    }

    #[test]
    fn gro_size_is_found_among_control_messages() {
        assert_eq!(gro_size(&[]), 0);
        assert_eq!(gro_size(&cmsg(libc::SOL_UDP, libc::UDP_GRO, 1452)), 1452);
        let mut two = cmsg(libc::SOL_IP, libc::IP_TTL, 64);
        two.extend(cmsg(libc::SOL_UDP, libc::UDP_GRO, 1200));
        assert_eq!(gro_size(&two), 1200);
        assert_eq!(
            gro_size(&cmsg(libc::SOL_UDP, libc::UDP_GRO, -1)),
            0,
            "nonsense"
        );
        let cut = cmsg(libc::SOL_UDP, libc::UDP_GRO, 1452);
        assert_eq!(gro_size(&cut[..cut.len() - 6]), 0, "cut short");
        let mut zero_len = cmsg(libc::SOL_UDP, libc::UDP_GRO, 9);
        zero_len[..size_of::<usize>()].fill(0);
        assert_eq!(gro_size(&zero_len), 0, "no endless loop on a zero length");
    }
}
