//! WireGuard over TLS: a bridge between a loopback UDP socket and a TLS stream of
//! length-prefixed datagrams (`tunneld_wireguard::framing`). The WireGuard worker is unchanged:
//! it sends to and hears from the bridge's loopback address as it would a UDP peer.
//!
//! - Client side (a peer with `transport = "tls"`): the peer's endpoint is the bridge socket
//!   (127.0.0.1), made at start and kept across reconnects; a thread per peer connects to the
//!   other tunneld, runs the bridge, and reconnects with backoff when the stream ends.
//! - Server side (`[[tls.listen]]` with `forward_to = "wireguard"`): each accepted stream gets
//!   its own loopback socket aimed at the interface's port; WireGuard learns it as the peer's
//!   endpoint from the first authenticated packet, as it does for any roaming peer.
//!
//! The stream never stalls the worker: the bridge reads its UDP socket only while the TLS
//! side has taken everything before, so when the stream is slow the datagrams wait in, and
//! overflow from, the UDP socket's buffer: lost as UDP would lose them, never blocking.
//!
//! The bridge socket is the dataplane's batch socket: it takes the worker's GSO trains
//! whole (UDP GRO) with one `recvmmsg` for many datagrams, and hands decrypted datagrams
//! back with one `sendmmsg` per batch, runs of equal size as one GSO send, so a datagram
//! costs no system call of its own on either side of the bridge.

use super::handshake::Established;
use super::stream::RecordStream;
use anyhow::Context;
use std::io::{self, ErrorKind, IoSlice};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tunneld_dataplane::udp::UdpSocket;
use tunneld_dataplane::{Batch, DatagramIo};
use tunneld_wireguard::framing::{length_prefix, Deframer};

/// Batches taken from the UDP socket per turn at most, so the other direction gets turns.
const BURST: usize = 4;
/// Bytes of framed datagrams taken from the bridge socket before they are sealed.
const FRAMES: usize = 256 * 1024;
/// Reconnect backoff: from the first to the last delay, doubling.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(10));

/// Where the bridge sends the datagrams that arrive over TLS.
#[derive(Clone)]
pub enum UdpPeer {
    /// Client side: the worker's address, learnt from what it sends (known once it has).
    Learnt,
    /// Server side: the interface's UDP port on loopback, known once the interface is up,
    /// unless the stream asked for another (see [`Redirect`]).
    Port(Arc<OnceLock<u16>>, Arc<RedirectSlot>),
}

/// Reads a datagram that came over a server-side stream and says whether it moves the
/// stream's datagrams to another UDP port on loopback (a fleet relay's port for a pair: the
/// datagram is a side's registration with it), and which.
pub type Redirect = Arc<dyn Fn(&[u8]) -> Option<u16> + Send + Sync>;

/// Where a gateway puts its [`Redirect`] once it has one (the fleet starts after the
/// listeners).
#[derive(Default)]
pub struct RedirectSlot(std::sync::RwLock<Option<Redirect>>);

impl std::fmt::Debug for RedirectSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedirectSlot")
            .field("set", &self.get().is_some())
            .finish()
    }
}

impl RedirectSlot {
    /// Puts `redirect` in place for the streams' next turns (`None`: none).
    pub fn set(&self, redirect: Option<Redirect>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = redirect;
    }

    fn get(&self) -> Option<Redirect> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Stops a client side started at run time ([`crate::Bridge`]): set, and its stream shut
/// down, the thread ends.
#[derive(Default)]
pub struct ClientStop {
    stop: std::sync::atomic::AtomicBool,
    stream: std::sync::Mutex<Option<TcpStream>>,
}

impl ClientStop {
    pub fn stop(&self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(s) = self.stream.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Relays between the bridge socket and an established TLS stream until the stream ends
/// (`Ok` for a close_notify, `Err` for anything else).
pub fn bridge(
    udp: &mut UdpSocket,
    peer: &UdpPeer,
    learnt: &mut Option<SocketAddr>,
    tls: TcpStream,
    established: Established,
) -> anyhow::Result<()> {
    let (mut stream, early) = RecordStream::new(tls, established)?;
    // Framed datagrams waiting for record slots: `frames[frames_at..]`. Grows to its
    // high-water mark (about FRAMES plus a batch) once, then stays.
    let mut frames: Vec<u8> = Vec::with_capacity(FRAMES);
    let mut frames_at = 0;
    // Both batches hold only datagrams of this turn; their frames stay allocated throughout.
    let mut from_udp = Box::new(Batch::new());
    let mut to_udp = Box::new(Batch::new());
    let mut deframer = Deframer::new();
    // Where a registration moved this stream's datagrams (server side).
    let mut redirected: Option<SocketAddr> = None;
    let to = |learnt: Option<SocketAddr>, redirected: Option<SocketAddr>| match peer {
        UdpPeer::Learnt => learnt,
        UdpPeer::Port(port, _) => {
            redirected.or_else(|| port.get().map(|p| SocketAddr::from(([127, 0, 0, 1], *p))))
        }
    };
    let redirect = || match peer {
        UdpPeer::Port(_, slot) => slot.get(),
        UdpPeer::Learnt => None,
    };
    // Datagrams that came with the other side's last handshake message were decrypted during
    // the handshake: deliver them now, or they would wait for the stream's next bytes.
    let mut target = Target {
        to: to(*learnt, redirected),
        redirect: redirect(),
        redirected: &mut redirected,
    };
    deliver(&early, &mut deframer, udp, &mut to_udp, &mut target)?;
    send(udp, &mut to_udp)?;
    loop {
        let mut progress = stream.flush()?;
        // UDP → TLS, once the stream has taken what came before.
        if !stream.sending() {
            if frames_at == frames.len() {
                frames.clear();
                frames_at = 0;
                take_datagrams(udp, &mut from_udp, &mut frames, peer, learnt)?;
            }
            if frames_at < frames.len() {
                if !stream.seal_due()? {
                    let mut filled = 0;
                    for slot in stream.slots().iter_mut() {
                        let n = slot.len().min(frames.len() - frames_at - filled);
                        slot[..n].copy_from_slice(&frames[frames_at + filled..][..n]);
                        filled += n;
                    }
                    stream.seal(filled)?;
                    frames_at += filled;
                }
                progress = true;
            }
        }
        // TLS → UDP: the bridge polls level-triggered, so every turn may read.
        // Read until WouldBlock, as level-triggered polling wants.
        stream.mark_readable(true);
        progress |= stream.receive()?;
        let mut target = Target {
            to: to(*learnt, redirected),
            redirect: redirect(),
            redirected: &mut redirected,
        };
        while stream.has_pending() {
            let mut iov = [IoSlice::new(&[]); 16];
            let count = stream.pending(&mut iov);
            let mut taken = 0;
            for piece in &iov[..count] {
                deliver(piece, &mut deframer, udp, &mut to_udp, &mut target)?;
                taken += piece.len();
            }
            stream.take(taken);
        }
        send(udp, &mut to_udp)?;
        if stream.closed() {
            return Ok(());
        }
        if progress {
            continue;
        }
        let mut fds = [
            libc::pollfd {
                fd: udp.fd().unwrap_or(-1),
                events: if stream.sending() { 0 } else { libc::POLLIN },
                revents: 0,
            },
            libc::pollfd {
                fd: stream.socket().as_raw_fd(),
                events: libc::POLLIN | if stream.sending() { libc::POLLOUT } else { 0 },
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfds for the duration of the call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != ErrorKind::Interrupted {
                return Err(e).context("poll");
            }
        }
    }
}

/// Up to `BURST` batches from the bridge socket, framed into `frames`.
fn take_datagrams(
    udp: &mut UdpSocket,
    batch: &mut Batch,
    frames: &mut Vec<u8>,
    peer: &UdpPeer,
    learnt: &mut Option<SocketAddr>,
) -> anyhow::Result<()> {
    for _ in 0..BURST {
        batch.clear();
        let received = udp.recv_batch(batch).context("bridge socket receive")?;
        for i in 0..received {
            if matches!(peer, UdpPeer::Learnt) {
                *learnt = Some(batch.addr(i));
            }
            for datagram in batch.datagrams(i) {
                if let Some(prefix) = length_prefix(datagram.len()).filter(|_| !datagram.is_empty())
                {
                    frames.extend_from_slice(&prefix);
                    frames.extend_from_slice(datagram);
                }
            }
        }
        if received == 0 || frames.len() >= FRAMES {
            break;
        }
    }
    Ok(())
}

/// Where a turn's datagrams from the stream go, and what may move them.
struct Target<'a> {
    to: Option<SocketAddr>,
    redirect: Option<Redirect>,
    redirected: &'a mut Option<SocketAddr>,
}

/// Feeds stream bytes to the deframer and queues every datagram they complete for the
/// worker at `target.to` (or where a registration moved the stream), sending a batch
/// whenever it fills.
fn deliver(
    mut bytes: &[u8],
    deframer: &mut Deframer,
    udp: &mut UdpSocket,
    batch: &mut Batch,
    target: &mut Target<'_>,
) -> anyhow::Result<()> {
    while !bytes.is_empty() {
        let space = deframer.space();
        let n = space.len().min(bytes.len());
        space[..n].copy_from_slice(&bytes[..n]);
        deframer.filled(n);
        bytes = &bytes[n..];
        while let Some(datagram) = deframer.next_datagram() {
            if let Some(port) = target.redirect.as_ref().and_then(|r| r(datagram)) {
                // What came before goes where it was meant to.
                send(udp, batch)?;
                let moved = SocketAddr::from(([127, 0, 0, 1], port));
                if *target.redirected != Some(moved) {
                    tracing::debug!("WireGuard over TLS: the stream's datagrams now go to {moved}");
                }
                *target.redirected = Some(moved);
                target.to = Some(moved);
            }
            // Until the worker has spoken (client side) there is nowhere to deliver; like a
            // full socket buffer, that loses the datagram, which WireGuard retries.
            let Some(to) = target.to else { continue };
            if batch.is_full() {
                send(udp, batch)?;
            }
            // A frame holds any datagram the framing allows (`FRAME_PAYLOAD` > u16::MAX).
            if let Some(frame) = batch.next_free().and_then(|f| f.get_mut(..datagram.len())) {
                frame.copy_from_slice(datagram);
                batch.commit(datagram.len(), to);
            }
        }
    }
    Ok(())
}

/// Sends the batch to the worker and empties it. What the socket refuses (a full buffer, the
/// worker gone for a moment) is lost as UDP would lose it; WireGuard copes.
fn send(udp: &mut UdpSocket, batch: &mut Batch) -> anyhow::Result<()> {
    if !batch.is_empty() {
        udp.send_batch(batch).context("bridge socket send")?;
        batch.clear();
    }
    Ok(())
}

/// A loopback socket for one bridge.
pub fn bridge_socket() -> io::Result<UdpSocket> {
    UdpSocket::bind_addr(SocketAddr::from(([127, 0, 0, 1], 0)))
}

/// The client side of one peer, for ever: connect, bridge, and on any end wait and reconnect
/// (backoff doubling to `BACKOFF.1`, back to the start after a stream that lasted).
/// `connected` runs after each (re)connection: the other end may have restarted, so the
/// caller asks WireGuard for a handshake now rather than after its timers give up.
pub fn run_client(
    name: String,
    mut udp: UdpSocket,
    connect: impl Fn() -> anyhow::Result<(TcpStream, Established)>,
    connected: impl Fn(),
    stop: &ClientStop,
) {
    let mut delay = BACKOFF.0;
    let mut learnt = None;
    let mut failures: u64 = 0;
    while !stop.stopped() {
        let started = Instant::now();
        match connect() {
            Ok((tls, established)) => {
                if let Ok(clone) = tls.try_clone() {
                    *stop.stream.lock().unwrap_or_else(|p| p.into_inner()) = Some(clone);
                }
                if stop.stopped() {
                    return;
                }
                tracing::info!("{name}: WireGuard over TLS connected");
                failures = 0;
                connected();
                let ended = bridge(&mut udp, &UdpPeer::Learnt, &mut learnt, tls, established);
                if stop.stopped() {
                    return;
                }
                match ended {
                    Ok(()) => tracing::info!("{name}: the TLS stream was closed; reconnecting"),
                    Err(e) => tracing::warn!("{name}: TLS stream ended: {e:#}; reconnecting"),
                }
                if started.elapsed() > BACKOFF.1 {
                    delay = BACKOFF.0;
                }
            }
            Err(e) => {
                failures += 1;
                // The first failure and then every doubling: enough to see, never a flood.
                if failures.is_power_of_two() {
                    tracing::warn!("{name}: cannot connect ({failures} attempt(s)): {e:#}");
                }
            }
        }
        // Waits in short steps, so that a stop is seen soon.
        let until = Instant::now() + delay;
        while Instant::now() < until && !stop.stopped() {
            std::thread::sleep(Duration::from_millis(50).min(delay));
        }
        delay = (delay * 2).min(BACKOFF.1);
    }
}
