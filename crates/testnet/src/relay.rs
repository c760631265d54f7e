//! A lossy, slow underlay in user space: a UDP forwarder placed on the path between two
//! sites that drops each datagram with a given probability and delays each direction by
//! half a round trip. This kernel has no netem qdisc, so loss and delay are made here.
//!
//! Site A's WireGuard is pointed at [`LossyRelay::addr`] (in A's namespace) instead of B's
//! endpoint; the relay sends on to B from a socket of its own, and B's replies go back to
//! whoever last sent to the relay (B roams to the relay's address, as to any endpoint).
//! Every thread stops when the relay is dropped, at the end of its lifetime, or after its
//! datagram budget, whichever comes first.

use crate::NetNs;
use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the relay does to traffic, and how long it may run.
#[derive(Clone, Copy, Debug)]
pub struct RelayConfig {
    /// Probability in [0, 1] that a datagram (either direction) is dropped.
    pub loss: f64,
    /// Added to each direction: half the round trip the relay adds.
    pub one_way_delay: Duration,
    /// Seed of the drop decisions (the same seed drops the same datagrams in order).
    pub seed: u64,
    /// The relay stops forwarding after this long.
    pub lifetime: Duration,
    /// ... or after this many datagrams received (both directions together).
    pub max_datagrams: u64,
    /// Datagrams held in one direction's delay line at most; beyond it they are dropped
    /// (and counted as overflow, not loss).
    pub max_queued: usize,
}

impl RelayConfig {
    /// `loss` and a round trip of `rtt`, for at most `lifetime`, with generous bounds on
    /// count and queue.
    pub fn new(loss: f64, rtt: Duration, lifetime: Duration) -> RelayConfig {
        RelayConfig {
            loss,
            one_way_delay: rtt / 2,
            seed: 0x5eed_1e55,
            lifetime,
            max_datagrams: 50_000_000,
            max_queued: 65_536,
        }
    }
}

/// Counts of one direction.
#[derive(Debug, Default)]
pub struct DirectionStats {
    /// Datagrams received.
    pub received: AtomicU64,
    /// Of those, dropped on purpose.
    pub dropped: AtomicU64,
    /// Dropped because the delay line was full.
    pub overflow: AtomicU64,
    /// Datagrams sent on, and their bytes.
    pub forwarded: AtomicU64,
    pub forwarded_bytes: AtomicU64,
}

/// A snapshot of one direction's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirectionCounts {
    pub received: u64,
    pub dropped: u64,
    pub overflow: u64,
    pub forwarded: u64,
    pub forwarded_bytes: u64,
}

impl DirectionStats {
    fn snapshot(&self) -> DirectionCounts {
        DirectionCounts {
            received: self.received.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            overflow: self.overflow.load(Ordering::Relaxed),
            forwarded: self.forwarded.load(Ordering::Relaxed),
            forwarded_bytes: self.forwarded_bytes.load(Ordering::Relaxed),
        }
    }
}

pub struct LossyRelay {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// A to B (toward the far site), then B to A.
    stats: [Arc<DirectionStats>; 2],
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for LossyRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LossyRelay")
            .field("addr", &self.addr)
            .finish()
    }
}

/// How often the threads look at the stop flag while waiting.
const POLL: Duration = Duration::from_millis(20);

/// Socket buffers of the relay's sockets.
const SOCKET_BUFFER: libc::c_int = 16 << 20;

/// Asks for [`SOCKET_BUFFER`] each way (the FORCE options, past rmem_max, need
/// CAP_NET_ADMIN; without it, what the plain ones give).
fn big_buffers(socket: &UdpSocket) {
    use std::os::fd::AsRawFd;
    let set = |option: libc::c_int| {
        let value = SOCKET_BUFFER;
        // SAFETY: a valid socket and a c_int option value that outlives the call.
        unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                option,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            ) == 0
        }
    };
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        if !set(force) {
            set(plain);
        }
    }
}

/// A small fast PRNG (xorshift64*), enough to decide drops; no dependency.
struct Rng(u64);
impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

impl LossyRelay {
    /// Starts a relay in `ns`: it listens on `listen` (site A's programs send there) and
    /// forwards to `target` (site B's WireGuard endpoint) from an ephemeral port on
    /// `listen`'s address.
    pub fn start(
        ns: &NetNs,
        listen: SocketAddr,
        target: SocketAddr,
        config: RelayConfig,
    ) -> io::Result<LossyRelay> {
        if !(0.0..=1.0).contains(&config.loss) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "loss must be within [0, 1]",
            ));
        }
        let bind_upstream = SocketAddr::new(listen.ip(), 0);
        let (near, far) = ns.in_ns(move || -> io::Result<(UdpSocket, UdpSocket)> {
            Ok((UdpSocket::bind(listen)?, UdpSocket::bind(bind_upstream)?))
        })?;
        let addr = near.local_addr()?;
        // Bursts (a window sent at once) must reach the relay's own loss, not the socket's:
        // a default receive buffer (about 200 KiB) would add drops of its own.
        for socket in [&near, &far] {
            big_buffers(socket);
        }
        near.set_read_timeout(Some(POLL))?;
        far.set_read_timeout(Some(POLL))?;
        let near = Arc::new(near);
        let far = Arc::new(far);
        let stop = Arc::new(AtomicBool::new(false));
        let deadline = Instant::now() + config.lifetime;
        let budget = Arc::new(AtomicU64::new(config.max_datagrams));
        // Where B's replies go: whoever last sent to the relay from site A.
        let client: Arc<Mutex<Option<SocketAddr>>> = Arc::new(Mutex::new(None));
        let stats = [
            Arc::new(DirectionStats::default()),
            Arc::new(DirectionStats::default()),
        ];
        let mut threads = Vec::new();
        for (dir, (from, to)) in [(near.clone(), far.clone()), (far.clone(), near.clone())]
            .into_iter()
            .enumerate()
        {
            let (tx, rx) = mpsc::sync_channel::<(Instant, Vec<u8>)>(config.max_queued);
            let queued = Arc::new(AtomicU64::new(0));
            // Receiver: decides drops and timestamps what goes on.
            {
                let stop = stop.clone();
                let stats = stats[dir].clone();
                let client = client.clone();
                let budget = budget.clone();
                let queued = queued.clone();
                let mut rng = Rng(config.seed.wrapping_add(dir as u64 * 0x9e37_79b9) | 1);
                threads.push(std::thread::spawn(move || {
                    let mut buf = vec![0u8; 65_536];
                    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                        let (n, src) = match from.recv_from(&mut buf) {
                            Ok(got) => got,
                            Err(e)
                                if matches!(
                                    e.kind(),
                                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                                ) =>
                            {
                                continue
                            }
                            Err(_) => continue,
                        };
                        if budget
                            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                                b.checked_sub(1)
                            })
                            .is_err()
                        {
                            break;
                        }
                        if dir == 0 {
                            *client.lock().unwrap_or_else(|e| e.into_inner()) = Some(src);
                        }
                        stats.received.fetch_add(1, Ordering::Relaxed);
                        if config.loss > 0.0 && rng.next_f64() < config.loss {
                            stats.dropped.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        if queued.load(Ordering::Relaxed) >= config.max_queued as u64 {
                            stats.overflow.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        queued.fetch_add(1, Ordering::Relaxed);
                        let due = Instant::now() + config.one_way_delay;
                        if tx.try_send((due, buf[..n].to_vec())).is_err() {
                            queued.fetch_sub(1, Ordering::Relaxed);
                            stats.overflow.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }));
            }
            // Sender: holds each datagram until it is due, in order (the delay is the
            // same for all, so the line stays sorted).
            {
                let stop = stop.clone();
                let stats = stats[dir].clone();
                let client = client.clone();
                threads.push(std::thread::spawn(move || {
                    let mut line: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
                    loop {
                        if stop.load(Ordering::Relaxed) || Instant::now() >= deadline {
                            break;
                        }
                        let wait = line
                            .front()
                            .map(|(due, _)| due.saturating_duration_since(Instant::now()))
                            .unwrap_or(POLL)
                            .min(POLL);
                        match rx.recv_timeout(wait) {
                            Ok(item) => {
                                line.push_back(item);
                                while let Ok(item) = rx.try_recv() {
                                    line.push_back(item);
                                }
                            }
                            Err(mpsc::RecvTimeoutError::Timeout) => {}
                            Err(mpsc::RecvTimeoutError::Disconnected) => {
                                if line.is_empty() {
                                    break;
                                }
                            }
                        }
                        let now = Instant::now();
                        while line.front().is_some_and(|(due, _)| *due <= now) {
                            let Some((_, datagram)) = line.pop_front() else {
                                break;
                            };
                            queued.fetch_sub(1, Ordering::Relaxed);
                            let dest = if dir == 0 {
                                Some(target)
                            } else {
                                *client.lock().unwrap_or_else(|e| e.into_inner())
                            };
                            if let Some(dest) = dest {
                                if to.send_to(&datagram, dest).is_ok() {
                                    stats.forwarded.fetch_add(1, Ordering::Relaxed);
                                    stats
                                        .forwarded_bytes
                                        .fetch_add(datagram.len() as u64, Ordering::Relaxed);
                                }
                            }
                        }
                    }
                }));
            }
        }
        Ok(LossyRelay {
            addr,
            stop,
            stats,
            threads,
        })
    }

    /// Where site A's WireGuard should send: the relay's listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Counts toward site B (the endpoint) so far.
    pub fn toward_target(&self) -> DirectionCounts {
        self.stats[0].snapshot()
    }

    /// Counts back toward site A so far.
    pub fn toward_source(&self) -> DirectionCounts {
        self.stats[1].snapshot()
    }
}

impl Drop for LossyRelay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_drops_about_the_asked_share() {
        let mut rng = Rng(0x5eed_1e55 | 1);
        let n = 200_000;
        let dropped = (0..n).filter(|_| rng.next_f64() < 0.03).count();
        let share = dropped as f64 / n as f64;
        assert!((0.027..0.033).contains(&share), "{share}");
    }
}
