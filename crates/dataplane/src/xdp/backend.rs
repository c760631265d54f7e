//! `XdpUdp`: a worker's underlay over an AF_XDP socket, beside the kernel's UDP socket on
//! the same port.
//!
//! The worker's receive and send batches are placed in the socket's UMEM
//! ([`DatagramIo::batches`]): a received datagram is opened where the kernel put it, and the
//! core seals a datagram into the chunk it leaves from, behind headroom where this backend
//! writes the Ethernet, IP and UDP headers. Chunks move without allocation between a free
//! stack, the fill ring (the kernel may receive into them), the receive batch, the send batch
//! and the TX ring (the completion ring gives them back).
//!
//! The kernel's UDP socket stays bound and is read too: it gets what the XDP program passes
//! on (fragments, datagrams from this host), and it sends what the AF_XDP socket cannot: a
//! datagram whose next hop the kernel has not resolved yet (sending it makes the kernel
//! resolve it) or that leaves by another interface. A worker with no queue of its own (more
//! workers than the interface has queues) runs on the kernel socket alone.

use super::frame::{self, Hop, UdpChecksum};
use super::nexthop::{NextHops, Resolution, Resolver};
use super::program::XdpProgram;
use super::socket::{RingSizes, TxChecksum, TxFrame, XskSocket, CHUNK, KERNEL_HEADROOM};
use crate::batch::MappedRegion;
use crate::udp::UdpSocket;
use crate::{Batch, DatagramIo, BATCH_SIZE, HEADROOM};
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Instant;

/// Chunks in one worker's UMEM (4 KiB each: 8 MiB).
pub const UMEM_CHUNKS: usize = 2048;
/// Chunks kept in the fill ring for the kernel to receive into.
const FILL_CHUNKS: usize = 1024;
/// Ring sizes: the fill ring holds every receive chunk; TX and completion a burst of batches.
const RINGS: RingSizes = RingSizes {
    fill: 2048,
    completion: 1024,
    rx: 1024,
    tx: 1024,
};
/// Under load the AF_XDP ring never runs dry; the kernel socket is still read at least once
/// in this many receives so that what the program passes on is not kept waiting.
const KERNEL_SOCKET_EVERY: u32 = 16;

/// The largest WireGuard datagram a chunk can hold, received (behind the kernel's headroom
/// and the link headers) or sent (behind the TX metadata room and the batch's headroom).
pub const MAX_DATAGRAM: usize = CHUNK - KERNEL_HEADROOM - frame::MAX_HEADERS;
/// Where a send frame (its batch headroom first) is placed in its chunk: the bytes in front
/// hold the TX metadata ([`super::socket::TX_METADATA_LEN`]) in front of the headers, and
/// the payload stays cache-line aligned.
const SEND_FRAME_AT: usize = 64;
const _: () = assert!(
    SEND_FRAME_AT + HEADROOM - frame::MAX_HEADERS >= super::socket::TX_METADATA_LEN
        && SEND_FRAME_AT + HEADROOM + MAX_DATAGRAM <= CHUNK
);

/// The AF_XDP half of a worker's underlay.
struct Xsk {
    socket: XskSocket,
    region: Arc<MappedRegion>,
    /// Chunks that are ours and unused.
    free: Vec<u64>,
    /// Chunks of the last receive batch that came from the fill ring, and those that came
    /// from `free` (datagrams from the kernel socket): they go back where they came from.
    held_fill: Vec<u64>,
    held_free: Vec<u64>,
    resolver: Resolver,
    /// Datagrams sent through the kernel socket because no next hop was ready.
    slow_sends: u64,
    /// The IPv4 ID of the next datagram whose checksum the device computes (with software
    /// checksums it comes from the payload's sum: see `frame.rs`).
    ip_id: u16,
}

/// A worker's underlay: AF_XDP for the interface's queue, the kernel's UDP socket for the rest.
pub struct XdpUdp {
    kernel: UdpSocket,
    xsk: Option<Xsk>,
    /// Keeps the program attached while any worker runs.
    _program: Arc<XdpProgram>,
    /// Polls readable when either socket is: what the worker waits on.
    epoll: OwnedFd,
    /// Owned batches for the kernel socket's receives and sends.
    kernel_rx: Batch,
    kernel_tx: Batch,
    /// The next datagram of `kernel_rx` not yet moved into a receive batch.
    kernel_next: usize,
    receives: u32,
    port: u16,
}

impl std::fmt::Debug for XdpUdp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpUdp")
            .field("port", &self.port)
            .field("xsk", &self.xsk.as_ref().map(|x| x.socket.mode()))
            .finish_non_exhaustive()
    }
}

fn epoll_over(fds: &[RawFd]) -> io::Result<OwnedFd> {
    // SAFETY: plain epoll_create1; the result is checked.
    let raw = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor we just opened and own.
    let epoll = unsafe { OwnedFd::from_raw_fd(raw) };
    for &fd in fds {
        let mut event = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: fd as u64,
        };
        // SAFETY: valid descriptors and a valid event.
        let rc = unsafe { libc::epoll_ctl(raw, libc::EPOLL_CTL_ADD, fd, &mut event) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(epoll)
}

impl XdpUdp {
    /// A worker's underlay with an AF_XDP socket bound to `queue` of the interface whose
    /// next hops `nexthops` follows (or none: the kernel socket alone), registered in
    /// `program`'s map.
    pub fn new(
        kernel: UdpSocket,
        program: Arc<XdpProgram>,
        queue: Option<u32>,
        zero_copy: bool,
        checksum_offload: bool,
        nexthops: &Arc<NextHops>,
    ) -> io::Result<XdpUdp> {
        let port = kernel.local_port();
        let xsk = match queue {
            Some(queue) => {
                let (ifindex, resolver) = (nexthops.ifindex(), Resolver::new(nexthops.clone())?);
                let region = Arc::new(MappedRegion::map(UMEM_CHUNKS * CHUNK).map_err(|e| {
                    io::Error::new(e.kind(), format!("cannot map the AF_XDP UMEM: {e}"))
                })?);
                let mut socket = XskSocket::bind(
                    region.clone(),
                    RINGS,
                    ifindex,
                    queue,
                    zero_copy,
                    checksum_offload,
                )?;
                program.register_socket(queue, socket.as_fd())?;
                let mut chunks: Vec<u64> =
                    (0..UMEM_CHUNKS as u64).map(|c| c * CHUNK as u64).collect();
                let to_fill = chunks.split_off(UMEM_CHUNKS - FILL_CHUNKS);
                let given = socket.fill(&to_fill);
                chunks.extend_from_slice(&to_fill[given..]);
                Some(Xsk {
                    socket,
                    region,
                    free: chunks,
                    held_fill: Vec::with_capacity(BATCH_SIZE),
                    held_free: Vec::with_capacity(BATCH_SIZE),
                    resolver,
                    slow_sends: 0,
                    // Workers' counters start far apart, so their IDs seldom meet.
                    ip_id: (queue as u16).wrapping_mul(0x9e37),
                })
            }
            None => None,
        };
        let mut fds: Vec<RawFd> = kernel.fd().into_iter().collect();
        if let Some(xsk) = &xsk {
            fds.push(xsk.socket.as_fd().as_raw_fd());
        }
        let epoll = epoll_over(&fds)?;
        let mut kernel = kernel;
        // Datagrams from the kernel socket are copied into chunks one by one: merged ones
        // would only have to be cut up again.
        kernel.set_gro(false);
        Ok(XdpUdp {
            kernel,
            xsk,
            _program: program,
            epoll,
            kernel_rx: Batch::new(),
            kernel_tx: Batch::new(),
            kernel_next: 0,
            receives: 0,
            port,
        })
    }

    /// Whether this worker has an AF_XDP socket (and in which mode it is bound).
    pub fn mode(&self) -> Option<super::socket::CopyMode> {
        self.xsk.as_ref().map(|x| x.socket.mode())
    }

    /// Who computes the UDP checksums of what the AF_XDP socket sends (none: no socket).
    pub fn tx_checksum(&self) -> Option<TxChecksum> {
        self.xsk.as_ref().map(|x| x.socket.tx_checksum())
    }

    /// Datagrams sent through the kernel socket because their next hop was not ready.
    pub fn slow_sends(&self) -> u64 {
        self.xsk.as_ref().map_or(0, |x| x.slow_sends)
    }

    /// Reads the kernel socket into `batch`'s free frames (chunks from the free stack).
    fn receive_from_kernel(&mut self, batch: &mut Batch) -> io::Result<usize> {
        let Some(xsk) = &mut self.xsk else {
            return self.kernel.recv_batch(batch);
        };
        // Chunks the kernel finished sending come back first: under a long burst of sends
        // they may be what the free stack is waiting for.
        xsk.socket
            .complete(|chunk| xsk.free.push(chunk & !(CHUNK as u64 - 1)));
        // What the last read left over (the receive batch was full) goes first; the
        // socket is read again only once it is all taken.
        if self.kernel_next >= self.kernel_rx.len() {
            self.kernel_rx.clear();
            self.kernel_next = 0;
            self.kernel.recv_batch(&mut self.kernel_rx)?;
        }
        let mut n = 0;
        while self.kernel_next < self.kernel_rx.len() && !batch.is_full() {
            let i = self.kernel_next;
            // One datagram per frame: GRO is off on this socket.
            let datagram = self.kernel_rx.payload(i);
            if datagram.len() > CHUNK - HEADROOM {
                self.kernel_next += 1;
                continue;
            }
            let Some(chunk) = xsk.free.pop() else { break };
            xsk.held_free.push(chunk);
            let at = batch.len();
            batch.place(at, chunk as usize);
            let Some(slot) = batch.next_free() else { break };
            slot[..datagram.len()].copy_from_slice(datagram);
            batch.commit(datagram.len(), self.kernel_rx.addr(i));
            self.kernel_next += 1;
            n += 1;
        }
        Ok(n)
    }
}

impl Xsk {
    /// Gives the last receive batch's chunks back, then takes what the RX ring holds into
    /// `batch`.
    fn receive(&mut self, batch: &mut Batch, port: u16) -> usize {
        let given = self.socket.fill(&self.held_fill);
        // The fill ring has room for every receive chunk; should it not, keep the rest free.
        self.free.extend_from_slice(&self.held_fill[given..]);
        self.held_fill.clear();
        self.free.append(&mut self.held_free);
        let (region, held) = (&self.region, &mut self.held_fill);
        self.socket.receive(BATCH_SIZE - batch.len(), |addr, len| {
            let (start, chunk) = (addr as usize, addr as usize & !(CHUNK - 1));
            held.push(chunk as u64);
            let end = start.saturating_add(len);
            if end > chunk + CHUNK || end > region.len() {
                return;
            }
            // SAFETY: the kernel gave this chunk back with `len` bytes received at `addr`
            // (checked to lie within the chunk); it is ours until we fill it again.
            let frame = unsafe { std::slice::from_raw_parts(region.as_ptr().add(start), len) };
            let Some(received) = frame::parse_udp(frame).filter(|r| r.dst_port == port) else {
                return;
            };
            // The batch frame's headroom must stay inside the chunk; it always does behind
            // the kernel's headroom and the link headers.
            if start - chunk + received.payload.start < HEADROOM {
                return;
            }
            let i = batch.len();
            batch.place(i, start + received.payload.start - HEADROOM);
            batch.set(i, received.payload.len(), received.from);
            batch.set_len(i + 1);
        });
        if self.socket.fill_needs_wakeup() {
            self.socket.wake_receive();
        }
        batch.len()
    }
}

impl DatagramIo for XdpUdp {
    fn recv_batch(&mut self, batch: &mut Batch) -> io::Result<usize> {
        let Some(xsk) = &mut self.xsk else {
            return self.kernel.recv_batch(batch);
        };
        let from_ring = xsk.receive(batch, self.port);
        self.receives = self.receives.wrapping_add(1);
        if from_ring == 0 || self.receives.is_multiple_of(KERNEL_SOCKET_EVERY) {
            match self.receive_from_kernel(batch) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if from_ring == 0 => return Err(e),
                Err(_) => {}
            }
        }
        Ok(batch.len())
    }

    fn send_batch(&mut self, batch: &mut Batch) -> io::Result<usize> {
        let Some(xsk) = &mut self.xsk else {
            return self.kernel.send_batch(batch);
        };
        xsk.socket
            .complete(|chunk| xsk.free.push(chunk & !(CHUNK as u64 - 1)));
        let now = Instant::now();
        let port = self.port;
        let offload = xsk.socket.tx_checksum() == TxChecksum::Device;
        let mut queued = [TxFrame::default(); BATCH_SIZE];
        let mut to_ring = 0;
        self.kernel_tx.clear();
        let room = xsk.socket.tx_room(batch.len()).min(xsk.free.len());
        // A batch mostly goes to one peer: its next hop is looked up once per run of
        // datagrams to the same address (and confirmed at most once per run).
        let mut last: Option<(SocketAddr, Option<Hop>)> = None;
        for i in 0..batch.len() {
            let to = batch.addr(i);
            let len = batch.payload_len(i);
            let hop = match last {
                Some((addr, hop)) if addr == to => hop,
                _ => {
                    let hop = match xsk.resolver.resolve(to) {
                        Resolution::Ready(hop) => Some(hop),
                        _ => None,
                    };
                    last = Some((to, hop));
                    // This datagram goes through the kernel, which keeps the neighbour
                    // fresh; the rest of the run takes the AF_XDP socket.
                    if hop.is_some() && xsk.resolver.confirm_due(to, now) {
                        None
                    } else {
                        hop
                    }
                }
            };
            let frame_at = (batch.start(i) + HEADROOM - frame::headers_len(&to)) as u64;
            let hop = hop.filter(|_| to_ring < room && xsk.socket.can_send_from(frame_at));
            let checksum = if offload {
                xsk.ip_id = xsk.ip_id.wrapping_add(1);
                UdpChecksum::Offloaded { ip_id: xsk.ip_id }
            } else {
                UdpChecksum::Full
            };
            let written = hop.and_then(|hop: Hop| {
                let start = batch.start(i);
                let frame = batch.raw_frame_mut(i);
                frame::write_headers(frame, HEADROOM, len, &hop, port, to, checksum).map(|at| {
                    TxFrame {
                        addr: (start + at) as u64,
                        len: (HEADROOM + len - at) as u32,
                        udp_at: offload.then_some(frame::udp_offset(&to) as u16),
                    }
                })
            });
            match written {
                Some(desc) => {
                    queued[to_ring] = desc;
                    to_ring += 1;
                    // The chunk is the kernel's until it completes: a fresh one takes its place.
                    // (`room` counted the free chunks: there is one.)
                    if let Some(chunk) = xsk.free.pop() {
                        batch.place(i, chunk as usize + SEND_FRAME_AT);
                    }
                }
                None => {
                    xsk.slow_sends += 1;
                    if let Some(slot) = self.kernel_tx.next_free() {
                        slot[..len].copy_from_slice(batch.payload(i));
                        self.kernel_tx.commit(len, to);
                    }
                }
            }
        }
        let mut sent = xsk.socket.transmit(queued[..to_ring].iter().copied());
        // The room was checked: this only guards against losing chunks should it not hold.
        for frame in &queued[sent..to_ring] {
            xsk.free.push(frame.addr & !(CHUNK as u64 - 1));
        }
        if sent > 0 {
            if let Err(e) = xsk.socket.kick() {
                tracing::debug!("waking the kernel to send on the AF_XDP socket: {e}");
            }
        }
        if !self.kernel_tx.is_empty() {
            sent += self.kernel.send_batch(&mut self.kernel_tx).unwrap_or(0);
        }
        Ok(sent)
    }

    fn fd(&self) -> Option<RawFd> {
        Some(self.epoll.as_raw_fd())
    }

    fn local_port(&self) -> u16 {
        self.port
    }

    fn batches(&mut self) -> Option<(Batch, Batch)> {
        let xsk = self.xsk.as_mut()?;
        let rx = Batch::placed(xsk.region.clone(), CHUNK);
        let mut tx = Batch::placed(xsk.region.clone(), CHUNK);
        for i in 0..BATCH_SIZE {
            let chunk = xsk.free.pop()?;
            tx.place(i, chunk as usize + SEND_FRAME_AT);
        }
        Some((rx, tx))
    }
}
