//! The worker: one thread that owns a device, its TUN queue and its UDP socket, and runs each
//! batch to completion (read a batch, process it inline, write the results). With several
//! workers ([`Worker::connect`]), what one reads for a session another carries goes to that
//! worker over a bounded single-producer ring (`handoff.rs`): the only crossing between cores.
//!
//! The control plane reaches the worker only through [`WorkerHandle::run`], which sends a
//! closure to run between batches on the worker's own thread: the device is never shared.

use crate::busy_poll::BusyPoll;
use crate::handoff::{self, Cargo, Inbox, Outbox};
use crate::offload::{self, OffloadError};
use crate::waker::Waker;
use crate::{Batch, DatagramIo, PacketIo, FRAME_PAYLOAD};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tunneld_wireguard::{Device, Disposition, DropReason, Stats};

/// How often protocol timers run (boringtun's own device uses 250 ms).
const TICK: Duration = Duration::from_millis(250);
/// Batches taken from one side before looking at the other, so neither starves.
const BATCHES_PER_TURN: usize = 8;
/// A turn that moved at most this many packets is "sparse" traffic, where a reply or the
/// next packet is likely to follow within the busy-poll window (see `Worker::set_busy_poll`).
const SPARSE_TURN: usize = 8;

type Job = Box<dyn FnOnce(&mut Device, Instant) + Send>;

enum Control {
    Run(Job),
    /// A datagram of the control plane's own, sent from the worker's socket.
    Send(std::net::SocketAddr, Vec<u8>),
    Shutdown,
}

/// The control plane's end of a worker.
#[derive(Debug, Clone)]
pub struct WorkerHandle {
    sender: mpsc::Sender<Control>,
    waker: Arc<Waker>,
    progress: Arc<AtomicU64>,
}

/// `TUNNELD_TEST_STALL_AFTER_MS=N`: a test hook that makes the first worker to get there
/// stop making progress N ms after it starts (it sleeps inside its loop, as a worker stuck
/// in a batch would), so a test can see the systemd watchdog stop being fed.
const STALL_HOOK: &str = "TUNNELD_TEST_STALL_AFTER_MS";
static STALLED: AtomicBool = AtomicBool::new(false);

impl WorkerHandle {
    /// How many times the worker has run its timers: it does every 250 ms whether traffic
    /// flows or not, so a count that stops rising is a worker that is stuck (what the
    /// systemd watchdog is fed from).
    pub fn progress(&self) -> u64 {
        self.progress.load(Ordering::Relaxed)
    }

    /// Runs `f` on the worker's thread with its device, between batches, and returns its
    /// result; `None` if the worker has stopped.
    pub fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Device, Instant) -> T + Send + 'static,
    ) -> Option<T> {
        self.start(f)?.recv().ok()
    }

    /// Queues `f` for the worker and returns where its result will arrive.
    fn start<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Device, Instant) -> T + Send + 'static,
    ) -> Option<mpsc::Receiver<T>> {
        let (reply_tx, reply_rx) = mpsc::sync_channel(1);
        let job: Job = Box::new(move |device, now| {
            let _ = reply_tx.send(f(device, now));
        });
        self.sender.send(Control::Run(job)).ok()?;
        self.waker.wake();
        Some(reply_rx)
    }

    /// Sends `datagram` to `to` from the worker's own socket, between batches: so that it
    /// leaves from the port WireGuard's datagrams leave from and a NAT maps it as it maps
    /// them (the fleet registers with a relay so). `false` if the worker has stopped.
    pub fn send_datagram(&self, to: std::net::SocketAddr, datagram: Vec<u8>) -> bool {
        let sent = self.sender.send(Control::Send(to, datagram)).is_ok();
        self.waker.wake();
        sent
    }

    /// Asks the worker to stop after its current batch.
    pub fn shutdown(&self) {
        let _ = self.sender.send(Control::Shutdown);
        self.waker.wake();
    }
}

/// The control plane's end of all the workers of one interface.
#[derive(Debug, Clone)]
pub struct Workers {
    handles: Vec<WorkerHandle>,
}

impl Workers {
    pub fn new(handles: Vec<WorkerHandle>) -> Workers {
        Workers { handles }
    }

    /// Runs `f` on every worker (each between its batches, all at once: a hub's `set` of
    /// thousands of peers takes one worker's time, not the sum) and returns the results in
    /// worker order; `None` if a worker has stopped.
    pub fn run_each<T: Send + 'static>(
        &self,
        f: impl Fn(&mut Device, Instant) -> T + Clone + Send + 'static,
    ) -> Option<Vec<T>> {
        let pending: Vec<Option<mpsc::Receiver<T>>> =
            self.handles.iter().map(|h| h.start(f.clone())).collect();
        pending
            .into_iter()
            .map(|reply| reply.and_then(|r| r.recv().ok()))
            .collect()
    }

    /// [`WorkerHandle::send_datagram`] on the first worker (every worker's socket has the
    /// same port); `false` if it has stopped.
    pub fn send_datagram(&self, to: std::net::SocketAddr, datagram: Vec<u8>) -> bool {
        self.handles
            .first()
            .is_some_and(|h| h.send_datagram(to, datagram))
    }

    /// Runs `f` on the first worker only, for what every worker's device knows alike (each
    /// holds every peer); `None` if it has stopped.
    pub fn run_on_first<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Device, Instant) -> T + Send + 'static,
    ) -> Option<T> {
        self.handles.first()?.run(f)
    }

    /// Each worker's [`WorkerHandle::progress`], in worker order.
    pub fn progress(&self) -> Vec<u64> {
        self.handles.iter().map(WorkerHandle::progress).collect()
    }

    /// Asks every worker to stop after its current batch.
    pub fn shutdown(&self) {
        for handle in &self.handles {
            handle.shutdown();
        }
    }
}

/// A worker ready to run on its own thread.
pub struct Worker<P, D> {
    device: Device,
    overlay: P,
    underlay: D,
    control: mpsc::Receiver<Control>,
    waker: Arc<Waker>,
    overlay_rx: Batch,
    overlay_tx: Batch,
    underlay_rx: Batch,
    underlay_tx: Batch,
    /// Where a TUN super-packet is cut into segments, one at a time, before encryption.
    segment_buf: Box<[u8]>,
    /// Datagrams or packets the kernel refused to take (full buffers); counted, not retried.
    send_shortfall: u64,
    /// How much of `send_shortfall` the device's counters have (as `not_sent` drops, so
    /// `tunneld show` and the metrics see it).
    shortfall_counted: u64,
    /// Super-packets from the TUN that could not be segmented (see `offload::segment`).
    offload_errors: u64,
    /// How long to keep polling without sleeping after a sparse turn (0: never).
    busy_poll: BusyPoll,
    /// Rings to each other worker (`None` for this one) and from each: empty with one worker.
    outboxes: Vec<Option<Outbox>>,
    inboxes: Vec<Inbox>,
    /// Timer runs so far, read by the control plane (`WorkerHandle::progress`).
    progress: Arc<AtomicU64>,
}

impl<P, D> std::fmt::Debug for Worker<P, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl<P: PacketIo, D: DatagramIo> Worker<P, D> {
    pub fn new(device: Device, overlay: P, mut underlay: D) -> io::Result<(Self, WorkerHandle)> {
        let (sender, control) = mpsc::channel();
        let waker = Arc::new(Waker::new()?);
        let progress = Arc::new(AtomicU64::new(0));
        let handle = WorkerHandle {
            sender,
            waker: waker.clone(),
            progress: progress.clone(),
        };
        let (underlay_rx, underlay_tx) = underlay.batches().unwrap_or_default();
        let worker = Self {
            device,
            overlay,
            underlay,
            control,
            waker,
            overlay_rx: Batch::new(),
            overlay_tx: Batch::new(),
            underlay_rx,
            underlay_tx,
            segment_buf: vec![0; FRAME_PAYLOAD].into_boxed_slice(),
            send_shortfall: 0,
            shortfall_counted: 0,
            offload_errors: 0,
            busy_poll: BusyPoll::new(Duration::ZERO),
            outboxes: Vec::new(),
            inboxes: Vec::new(),
            progress,
        };
        Ok((worker, handle))
    }

    /// Joins workers into one interface: worker `i` must hold the device made by
    /// `Device::for_worker(.., i, workers.len())`. Each gets rings to and from every other,
    /// carrying parcels of `mtu` bytes at most.
    pub fn connect(workers: &mut [Self], mtu: usize) {
        let wakers: Vec<Arc<Waker>> = workers.iter().map(|w| w.waker.clone()).collect();
        let ends = handoff::mesh(&wakers, mtu.max(1280) + 32);
        for (worker, (outboxes, inboxes)) in workers.iter_mut().zip(ends) {
            worker.outboxes = outboxes;
            worker.inboxes = inboxes;
        }
    }

    /// After a turn that moved only a few packets, keep polling (without sleeping) for up to
    /// `window` before blocking again, or longer when the traffic keeps coming back just after
    /// it (`busy_poll.rs`). A sleeping thread takes several microseconds to wake, once per
    /// hop; request/response traffic pays that on every packet, and the reply usually comes
    /// within tens of microseconds. Bulk traffic keeps the worker busy anyway, and an idle
    /// tunnel never spins. Costs CPU only while traffic is sparse; zero turns it off.
    pub fn set_busy_poll(&mut self, window: Duration) {
        self.busy_poll = BusyPoll::new(window);
    }

    /// Runs until [`WorkerHandle::shutdown`] (or every handle is dropped). Returns the device
    /// so the caller can read its final state.
    pub fn run(mut self) -> Device {
        let mut next_tick = Instant::now() + TICK;
        let mut logged_drops = 0;
        let stall_at = std::env::var(STALL_HOOK)
            .ok()
            .and_then(|ms| ms.parse().ok())
            .map(|ms| Instant::now() + Duration::from_millis(ms));
        loop {
            let now = Instant::now();
            let timeout = if self.busy_poll.polling(now) {
                // A polling worker must not keep a woken task off its core: the kernel may
                // not preempt it (EEVDF protects a task's slice), and on a busy machine that
                // task is often the one whose reply the worker polls for.
                // SAFETY: sched_yield takes no arguments and cannot fail.
                unsafe { libc::sched_yield() };
                Duration::ZERO
            } else {
                next_tick.saturating_duration_since(now)
            };
            let ready = self.wait(timeout);
            if ready.woken {
                self.waker.reset();
            }
            if !self.serve_control() {
                return self.device;
            }
            let now = Instant::now();
            let moved = self.turn_ready(now, ready);
            self.busy_poll
                .turned(now, moved, (1..=SPARSE_TURN).contains(&moved));
            if now >= next_tick {
                self.tick(now);
                next_tick = now + TICK;
                self.log_new_drops(&mut logged_drops);
                self.progress.fetch_add(1, Ordering::Relaxed);
                if stall_at.is_some_and(|at| now >= at) && !STALLED.swap(true, Ordering::Relaxed) {
                    tracing::warn!("{STALL_HOOK}: this worker stops making progress (a test hook)");
                    loop {
                        std::thread::sleep(Duration::from_secs(3600));
                    }
                }
            }
        }
    }

    /// Runs the protocol timers (and requested handshakes) and sends what they produce; `run`
    /// does this every 250 ms.
    pub fn tick(&mut self, now: Instant) {
        self.device.tick(now, &mut self.underlay_tx);
        self.flush_network();
        let unsent = self.send_shortfall - self.shortfall_counted;
        if unsent > 0 {
            self.device
                .stats_mut()
                .drop_many(DropReason::NotSent, unsent);
            self.shortfall_counted = self.send_shortfall;
        }
    }

    /// One turn of the data path without waiting: what the kernel has ready, processed inline.
    /// Returns whether anything was received.
    pub fn turn(&mut self, now: Instant) -> bool {
        self.turn_ready(
            now,
            Ready {
                overlay: true,
                underlay: true,
                woken: false,
            },
        ) > 0
    }

    /// A turn over the sides `ready` names (a side whose backend has no descriptor is always
    /// tried). Returns how many packets and datagrams were received.
    fn turn_ready(&mut self, now: Instant, ready: Ready) -> usize {
        let mut moved = self.take_handoffs(now);
        // A batch that came back short drained its side: asking again would only cost a
        // system call that finds nothing (the next poll says when more is there).
        if ready.overlay || self.overlay.fd().is_none() {
            for _ in 0..BATCHES_PER_TURN {
                moved += self.overlay_to_underlay(now);
                if !self.overlay_rx.is_full() {
                    break;
                }
            }
        }
        if ready.underlay || self.underlay.fd().is_none() {
            for _ in 0..BATCHES_PER_TURN {
                moved += self.underlay_to_overlay(now);
                if !self.underlay_rx.is_full() {
                    break;
                }
            }
        }
        moved
    }

    /// Packets from the TUN, encrypted, out to UDP. Returns how many packets were read (each
    /// segment of a super-packet counted).
    fn overlay_to_underlay(&mut self, now: Instant) -> usize {
        self.overlay_rx.clear();
        match self.overlay.recv_batch(&mut self.overlay_rx) {
            Ok(0) => return 0,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!("reading the TUN device: {e}");
                return 0;
            }
        }
        let mut packets = 0;
        for i in 0..self.overlay_rx.len() {
            let hdr = self.overlay_rx.offload(i);
            // A super-packet's datagrams leave in one send, so the peer receives them together
            // and can write them back as one super-packet (see `underlay_to_overlay`).
            let segments = hdr.segments_at_most(self.overlay_rx.payload_len(i));
            if self.underlay_tx.len() + segments > crate::BATCH_SIZE {
                self.send_shortfall += flush(&mut self.underlay, &mut self.underlay_tx);
            }
            let (frame, len) = self.overlay_rx.frame_mut(i);
            let (device, underlay_tx, underlay) =
                (&mut self.device, &mut self.underlay_tx, &mut self.underlay);
            let (shortfall, outboxes) = (&mut self.send_shortfall, &mut self.outboxes);
            let mut encapsulate = |packet: &mut [u8], len: usize| {
                if underlay_tx.is_full() {
                    *shortfall += flush(underlay, underlay_tx);
                }
                let (owner, cargo) = match device.encapsulate(packet, len, now, underlay_tx) {
                    Disposition::Done => return,
                    Disposition::HandOff(owner) => (owner, Cargo::Packet),
                    Disposition::HandOffToFirst(owner) => (owner, Cargo::PacketOnFirst),
                };
                hand_off(outboxes, device.stats_mut(), owner, cargo, &packet[..len]);
            };
            if hdr.is_plain() {
                encapsulate(frame, len);
                packets += 1;
            } else {
                match offload::segment(frame, len, &hdr, &mut self.segment_buf, encapsulate) {
                    Ok(n) => packets += n,
                    Err(e) => self.offload_error(e),
                }
            }
        }
        self.flush_network();
        self.wake_receivers();
        packets
    }

    fn offload_error(&mut self, e: OffloadError) {
        self.offload_errors += 1;
        if self.offload_errors.is_power_of_two() {
            tracing::warn!(
                "dropped a packet from the TUN device: {e} ({} so far)",
                self.offload_errors
            );
        }
    }

    /// Datagrams from UDP, decrypted, out to the TUN (replies back out to UDP). Returns how
    /// many datagrams were read.
    fn underlay_to_overlay(&mut self, now: Instant) -> usize {
        self.underlay_rx.clear();
        match self.underlay.recv_batch(&mut self.underlay_rx) {
            Ok(0) => return 0,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!("reading the UDP socket: {e}");
                return 0;
            }
        }
        if self.underlay_rx.is_full() {
            // More may wait: how much decides whether handshakes need cookies.
            if let Some((queued, capacity)) = self.underlay.backlog() {
                self.device.note_backlog(queued, capacity, now);
            }
        }
        let mut datagrams = 0;
        for i in 0..self.underlay_rx.len() {
            let from = self.underlay_rx.addr(i);
            // A merged frame is usually one super-packet the peer cut up (or part of one).
            // Its packets go out in one batch, so the batch's end does not cut the TUN
            // super-packet they coalesce back into: two writes, and two TCP ACKs, instead of one.
            if self.overlay_tx.len() + self.underlay_rx.datagrams(i).len() > crate::BATCH_SIZE {
                self.flush_tunnel();
            }
            for datagram in self.underlay_rx.datagrams(i) {
                datagrams += 1;
                self.send_shortfall += make_room(
                    &mut self.overlay,
                    &mut self.overlay_tx,
                    &mut self.underlay,
                    &mut self.underlay_tx,
                );
                let disposition = self.device.decapsulate(
                    from,
                    datagram,
                    now,
                    &mut self.overlay_tx,
                    &mut self.underlay_tx,
                );
                if let Disposition::HandOff(owner) = disposition {
                    let stats = self.device.stats_mut();
                    hand_off(
                        &mut self.outboxes,
                        stats,
                        owner,
                        Cargo::Datagram(from),
                        datagram,
                    );
                }
            }
        }
        self.flush_tunnel();
        self.flush_network();
        self.wake_receivers();
        datagrams
    }

    /// Runs what other workers handed over: packets to encrypt, initiations to answer.
    /// Returns how many parcels there were.
    fn take_handoffs(&mut self, now: Instant) -> usize {
        let mut taken = 0;
        for i in 0..self.inboxes.len() {
            // Bounded like the other sides' turns, so a busy sender cannot starve them.
            for _ in 0..crate::BATCH_SIZE * BATCHES_PER_TURN {
                let Some(mut parcel) = self.inboxes[i].take() else {
                    break;
                };
                taken += 1;
                self.send_shortfall += make_room(
                    &mut self.overlay,
                    &mut self.overlay_tx,
                    &mut self.underlay,
                    &mut self.underlay_tx,
                );
                let disposition = match parcel.cargo {
                    Cargo::Packet => self.device.encapsulate(
                        &mut parcel.buf,
                        parcel.len,
                        now,
                        &mut self.underlay_tx,
                    ),
                    Cargo::PacketOnFirst => self.device.encapsulate_on_first(
                        &mut parcel.buf,
                        parcel.len,
                        now,
                        &mut self.underlay_tx,
                    ),
                    Cargo::Datagram(from) => self.device.decapsulate_handed_off(
                        from,
                        &parcel.buf[..parcel.len],
                        now,
                        &mut self.overlay_tx,
                        &mut self.underlay_tx,
                    ),
                };
                let stats = self.device.stats_mut();
                match (parcel.cargo, disposition) {
                    (_, Disposition::Done) => {}
                    // The flow's sub-tunnel is here but has no session: on to sub-tunnel 0.
                    (Cargo::Packet, Disposition::HandOffToFirst(owner)) => hand_off(
                        &mut self.outboxes,
                        stats,
                        owner,
                        Cargo::PacketOnFirst,
                        &parcel.buf[..parcel.len],
                    ),
                    // Workers agree on owners; only a peer changing under a `set` can disagree.
                    _ => stats.drop(DropReason::Other),
                }
                self.inboxes[i].give_back(parcel);
            }
        }
        if taken > 0 {
            self.device.stats_mut().handoffs_in += taken as u64;
            self.flush_tunnel();
            self.flush_network();
            self.wake_receivers();
        }
        taken
    }

    /// Wakes the workers this batch handed something to.
    fn wake_receivers(&mut self) {
        for outbox in self.outboxes.iter_mut().flatten() {
            outbox.wake_if_sent();
        }
    }

    fn flush_network(&mut self) {
        self.send_shortfall += flush(&mut self.underlay, &mut self.underlay_tx);
    }

    fn flush_tunnel(&mut self) {
        self.send_shortfall += write(&mut self.overlay, &mut self.overlay_tx);
    }

    /// A control-plane datagram out now, after what the batch holds.
    fn send_own(&mut self, to: std::net::SocketAddr, datagram: &[u8]) {
        use tunneld_wireguard::DatagramSink;
        if self.underlay_tx.is_full() {
            self.flush_network();
        }
        if let Some(slot) = self.underlay_tx.slot() {
            let len = datagram.len().min(slot.len());
            slot[..len].copy_from_slice(&datagram[..len]);
            self.underlay_tx.push(len, to);
        }
        self.flush_network();
    }

    /// Runs queued control jobs. Returns `false` when the worker must stop.
    fn serve_control(&mut self) -> bool {
        loop {
            match self.control.try_recv() {
                Ok(Control::Run(job)) => job(&mut self.device, Instant::now()),
                Ok(Control::Send(to, datagram)) => self.send_own(to, &datagram),
                Ok(Control::Shutdown) | Err(mpsc::TryRecvError::Disconnected) => return false,
                Err(mpsc::TryRecvError::Empty) => return true,
            }
        }
    }

    /// Blocks until the TUN, the socket or the control channel has something, or `timeout`
    /// (rounded up to whole milliseconds; zero polls without blocking). Says which side is
    /// readable; after an interrupted or failed poll, both (the reads find out).
    fn wait(&self, timeout: Duration) -> Ready {
        let mut fds = [
            pollfd(self.overlay.fd()),
            pollfd(self.underlay.fd()),
            pollfd(Some(self.waker.as_raw_fd())),
        ];
        let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        // SAFETY: fds is a valid array of pollfd for its whole length; entries with fd -1
        // are ignored by the kernel.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if rc < 0 {
            return Ready {
                overlay: true,
                underlay: true,
                woken: true,
            };
        }
        // Errors and hang-ups count as ready: the read reports them.
        Ready {
            overlay: fds[0].revents != 0,
            underlay: fds[1].revents != 0,
            woken: fds[2].revents != 0,
        }
    }

    /// Says at debug level which drop counters moved since the last tick, so a tunnel that
    /// does not come up explains itself with `TUNNELD_LOG=debug`.
    fn log_new_drops(&self, logged: &mut u64) {
        let stats = self.device.stats();
        if stats.total_drops() != *logged && tracing::enabled!(tracing::Level::DEBUG) {
            *logged = stats.total_drops();
            let drops: Vec<String> = stats
                .nonzero_drops()
                .map(|(reason, n)| format!("{reason}={n}"))
                .collect();
            tracing::debug!("drops so far: {}", drops.join(" "));
        }
    }

    /// Packets or datagrams the kernel did not take.
    pub fn send_shortfall(&self) -> u64 {
        self.send_shortfall
    }

    /// Super-packets from the TUN dropped because they could not be segmented.
    pub fn offload_errors(&self) -> u64 {
        self.offload_errors
    }

    pub fn device(&self) -> &Device {
        &self.device
    }
}

/// Copies a packet or datagram to worker `owner`'s ring, counting it (or its drop when the
/// ring is full: the owner is behind, and waiting would stall this core too).
fn hand_off(
    outboxes: &mut [Option<Outbox>],
    stats: &mut Stats,
    owner: usize,
    cargo: Cargo,
    data: &[u8],
) {
    let sent = outboxes
        .get_mut(owner)
        .and_then(Option::as_mut)
        .is_some_and(|outbox| outbox.send(cargo, data));
    if sent {
        stats.handoffs_out += 1;
    } else {
        stats.drop(DropReason::HandOffFull);
    }
}

/// Sends what is queued when either output batch is (nearly) full, so that the next packet
/// or datagram has room: a handshake can produce a reply plus every packet queued while it
/// ran. Returns how many the kernel did not take.
fn make_room(
    overlay: &mut impl PacketIo,
    overlay_tx: &mut Batch,
    underlay: &mut impl DatagramIo,
    underlay_tx: &mut Batch,
) -> u64 {
    let mut lost = 0;
    if overlay_tx.is_full() {
        lost += write(overlay, overlay_tx);
    }
    if underlay_tx.len() + 8 > crate::BATCH_SIZE {
        lost += flush(underlay, underlay_tx);
    }
    lost
}

/// Sends and empties `batch`; returns how many datagrams the kernel did not take.
fn flush(underlay: &mut impl DatagramIo, batch: &mut Batch) -> u64 {
    drain(batch, "sending on the UDP socket", |b| {
        underlay.send_batch(b)
    })
}

/// Writes and empties `batch`; returns how many packets the kernel did not take.
fn write(overlay: &mut impl PacketIo, batch: &mut Batch) -> u64 {
    drain(batch, "writing the TUN device", |b| overlay.send_batch(b))
}

/// Hands a non-empty `batch` to `send`, empties it, and counts what was not taken (all of it
/// on an error, which is logged at debug level: it recurs with every batch).
fn drain(batch: &mut Batch, what: &str, send: impl FnOnce(&mut Batch) -> io::Result<usize>) -> u64 {
    if batch.is_empty() {
        return 0;
    }
    let lost = match send(batch) {
        Ok(sent) => batch.len() - sent.min(batch.len()),
        Err(e) => {
            tracing::debug!("{what}: {e}");
            batch.len()
        }
    };
    batch.clear();
    lost as u64
}

/// Which sides `poll` reported readable.
#[derive(Debug, Clone, Copy)]
struct Ready {
    overlay: bool,
    underlay: bool,
    /// The waker's eventfd is readable: it must be read back to zero, or every poll returns
    /// at once. Reading it only then saves a system call per turn (and per busy-poll spin);
    /// the control channel and the hand-off rings are checked every turn regardless.
    woken: bool,
}

fn pollfd(fd: Option<RawFd>) -> libc::pollfd {
    libc::pollfd {
        fd: fd.unwrap_or(-1),
        events: libc::POLLIN,
        revents: 0,
    }
}
