//! The relay workers: one thread per CPU, each an event loop over the forwarded connections
//! it was given, so that the record crypto of many connections runs on a few busy threads
//! rather than on a thread per connection that the scheduler wakes for every message.
//!
//! A connection is set up (TCP connect, TLS handshake) on a short-lived thread of its own,
//! whose blocking calls have deadlines, and then handed to the worker that carries the
//! fewest connections. From then on it lives on that worker until it ends: its sockets are
//! registered once, edge-triggered, for reading and writing, and every readiness event runs
//! [`Relay::step`], which moves what it can and stops where a socket would block.
//!
//! The threads are not pinned: a TLS proxy usually shares its machine with the programs it
//! forwards for, and on the testbed two proxies share two cores; pinning both proxies'
//! busiest worker to the first CPU would put one stream's both ends on one core.

use super::relay::{Relay, Step};
use anyhow::Context;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Duration, Instant};

/// What to do when a connection's relay ends: its result (log it, count it down).
pub type OnEnd = Box<dyn FnOnce(anyhow::Result<()>) + Send>;

/// The token of each worker's waker; connection `i`'s sockets are `2i` (plaintext) and
/// `2i + 1` (TLS).
const WAKE: Token = Token(usize::MAX);
/// Readiness events taken per wait.
const EVENTS: usize = 256;
/// How long a connection with a socket whose receive low-water mark is raised
/// (`stream::Lowat`) may go without being read: the data left below the mark at the end of
/// a burst raises no event, so the worker reads such sockets anyway this often. Short
/// enough for a burst's tail, long enough to cost little: a bulk socket signals every 64
/// KiB, many times a millisecond.
pub const LOWAT_FALLBACK: Duration = Duration::from_millis(1);

/// A connection on a worker, or on its way to one: its relay, and what to do when it ends.
struct Carried {
    relay: Relay,
    on_end: OnEnd,
    /// In the worker's list of connections with a raised low-water mark (so that a step
    /// need not search it).
    listed_raised: bool,
}

/// The sending end of one worker, and how many connections it carries.
struct WorkerHandle {
    to_worker: mpsc::Sender<Carried>,
    waker: Arc<Waker>,
    carried: Arc<AtomicUsize>,
}

/// The process's relay workers, started on first use.
pub struct RelayPool {
    workers: Vec<WorkerHandle>,
}

static POOL: OnceLock<anyhow::Result<RelayPool, String>> = OnceLock::new();

impl RelayPool {
    /// The pool, started on first use with `workers` workers (at least one; the caller's
    /// CPU count): the process has one pool, so later callers' counts do not change it.
    pub fn get(workers: usize) -> anyhow::Result<&'static RelayPool> {
        POOL.get_or_init(|| RelayPool::start(workers.max(1)).map_err(|e| format!("{e:#}")))
            .as_ref()
            .map_err(|e| anyhow::anyhow!("{e}"))
    }

    fn start(count: usize) -> anyhow::Result<RelayPool> {
        let mut workers = Vec::with_capacity(count);
        for i in 0..count {
            let poll = Poll::new().context("cannot make a relay poller")?;
            let waker = Arc::new(Waker::new(poll.registry(), WAKE).context("relay waker")?);
            let (to_worker, from_pool) = mpsc::channel();
            let carried = Arc::new(AtomicUsize::new(0));
            let count = carried.clone();
            std::thread::Builder::new()
                .name(format!("tls-relay-{i}"))
                .spawn(move || run(poll, from_pool, count))
                .context("cannot start a TLS relay thread")?;
            workers.push(WorkerHandle {
                to_worker,
                waker,
                carried,
            });
        }
        Ok(RelayPool { workers })
    }

    /// How many connections each worker carries, if the pool has started.
    pub fn loads() -> Option<Vec<usize>> {
        let pool = POOL.get()?.as_ref().ok()?;
        Some(
            pool.workers
                .iter()
                .map(|w| w.carried.load(Ordering::Relaxed))
                .collect(),
        )
    }

    /// Hands a connection whose handshake is done to the least busy worker (the next one,
    /// should a worker have stopped); `on_end` runs on that worker when the relay ends.
    pub fn relay(&self, relay: Relay, on_end: OnEnd) {
        let mut by_load: Vec<&WorkerHandle> = self.workers.iter().collect();
        by_load.sort_by_key(|w| w.carried.load(Ordering::Relaxed));
        let mut handed = Carried {
            relay,
            on_end,
            listed_raised: false,
        };
        for worker in by_load {
            worker.carried.fetch_add(1, Ordering::Relaxed);
            match worker.to_worker.send(handed) {
                Ok(()) => {
                    if let Err(e) = worker.waker.wake() {
                        tracing::warn!("cannot wake a TLS relay worker: {e}");
                    }
                    return;
                }
                Err(mpsc::SendError(back)) => {
                    worker.carried.fetch_sub(1, Ordering::Relaxed);
                    handed = back;
                }
            }
        }
        (handed.on_end)(Err(anyhow::anyhow!("every TLS relay worker has stopped")));
    }
}

/// One worker's loop: take new connections, step the ones with events, end finished ones.
fn run(mut poll: Poll, from_pool: mpsc::Receiver<Carried>, carried: Arc<AtomicUsize>) {
    let mut events = Events::with_capacity(EVENTS);
    let mut slots: Vec<Option<Carried>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    // The connections to step this turn, each once, whichever of its sockets woke it; and
    // those whose last turn ended with more to move, stepped again without an event.
    let mut ready: Vec<usize> = Vec::with_capacity(EVENTS);
    let mut busy: Vec<usize> = Vec::new();
    // Those with a raised receive low-water mark, read anyway once `LOWAT_FALLBACK` has
    // passed since the first of them was listed.
    let mut raised: Vec<usize> = Vec::new();
    let mut raised_since = Instant::now();
    loop {
        let wait = if !busy.is_empty() {
            Some(Duration::ZERO)
        } else if !raised.is_empty() {
            Some(LOWAT_FALLBACK.saturating_sub(raised_since.elapsed()))
        } else {
            None
        };
        if let Err(e) = poll.poll(&mut events, wait) {
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            tracing::error!("TLS relay worker: poll failed: {e}; its connections are dropped");
            for c in slots.into_iter().flatten() {
                carried.fetch_sub(1, Ordering::Relaxed);
                (c.on_end)(Err(anyhow::anyhow!("its relay worker stopped: {e}")));
            }
            return;
        }
        ready.clear();
        ready.append(&mut busy);
        if !raised.is_empty() && raised_since.elapsed() >= LOWAT_FALLBACK {
            for slot in raised.drain(..) {
                // The slot may have been freed (or reused: one read too many, harmless).
                if let Some(Some(c)) = slots.get_mut(slot) {
                    c.listed_raised = false;
                    c.relay.read_anyway();
                    if !ready.contains(&slot) {
                        ready.push(slot);
                    }
                }
            }
        }
        for event in events.iter() {
            if event.token() == WAKE {
                continue;
            }
            let (slot, plain) = (event.token().0 / 2, event.token().0 % 2 == 0);
            let Some(Some(c)) = slots.get_mut(slot) else {
                continue;
            };
            if event.is_readable() || event.is_read_closed() || event.is_error() {
                c.relay
                    .mark_readable(plain, event.is_read_closed() || event.is_error());
            }
            if !ready.contains(&slot) {
                ready.push(slot);
            }
        }
        // New connections: registered, then stepped at once (bytes that came with the
        // handshake raise no new edge).
        while let Ok(handed) = from_pool.try_recv() {
            let slot = free.pop().unwrap_or_else(|| {
                slots.push(None);
                slots.len() - 1
            });
            let (plain, tls) = handed.relay.sockets();
            if let Err(e) =
                register(&poll, plain, 2 * slot).and_then(|()| register(&poll, tls, 2 * slot + 1))
            {
                free.push(slot);
                carried.fetch_sub(1, Ordering::Relaxed);
                (handed.on_end)(Err(e).context("cannot watch the connection's sockets"));
                continue;
            }
            slots[slot] = Some(handed);
            ready.push(slot);
        }
        for &slot in &ready {
            let Some(c) = slots[slot].as_mut() else {
                continue;
            };
            let step = c.relay.step();
            if c.relay.lowat_raised() && !c.listed_raised {
                if raised.is_empty() {
                    raised_since = Instant::now();
                }
                raised.push(slot);
                c.listed_raised = true;
            }
            let ended = match step {
                Ok(Step::Idle) => continue,
                Ok(Step::Busy) => {
                    busy.push(slot);
                    continue;
                }
                Ok(Step::Done) => Ok(()),
                Err(e) => Err(e),
            };
            if let Some(c) = slots[slot].take() {
                let (plain, tls) = c.relay.sockets();
                deregister(&poll, plain);
                deregister(&poll, tls);
                free.push(slot);
                carried.fetch_sub(1, Ordering::Relaxed);
                (c.on_end)(ended);
            }
        }
    }
}

/// Registers a socket the relay owns under `token`, for both directions, edge-triggered.
fn register(poll: &Poll, sock: &TcpStream, token: usize) -> std::io::Result<()> {
    poll.registry().register(
        &mut SourceFd(&sock.as_raw_fd()),
        Token(token),
        Interest::READABLE | Interest::WRITABLE,
    )
}

fn deregister(poll: &Poll, sock: &TcpStream) {
    let _ = poll.registry().deregister(&mut SourceFd(&sock.as_raw_fd()));
}
