//! A gateway's events ([`Gateway::events`](crate::Gateway::events)) and readiness
//! ([`Gateway::wait_ready`](crate::Gateway::wait_ready)): a monitor thread, started by the
//! first subscriber, reads every worker's peers at the workers' tick (250 ms, between
//! batches, as `peers()` does) and turns the differences into events with the core's
//! `event::Tracker`. It only reads (`wait_ready`'s request for a handshake goes through the
//! control handle).

use std::collections::HashSet;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tunneld_crypto::PublicKey;
use tunneld_dataplane::worker::Workers;
use tunneld_wireguard::event::{Event, Tracker};

/// How often the monitor looks: the workers' timer tick.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// The events of a gateway from the moment [`Gateway::events`](crate::Gateway::events) was
/// called, in the order they were seen (at most 250 ms after they happened); the last is
/// [`Event::Stopped`], after which [`GatewayEvents::recv`] returns `None`. Events are kept
/// until read (they come at handshake pace), so drop a subscriber you stop reading. Also an
/// `Iterator` (blocking).
///
/// ```no_run
/// # fn run(gateway: tunneld::Gateway) {
/// for event in gateway.events() {
///     println!("{event:?}");
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct GatewayEvents {
    rx: Receiver<Event>,
}

impl GatewayEvents {
    /// Blocks until the next event; `None` once the gateway has stopped and every event
    /// was read.
    pub fn recv(&self) -> Option<Event> {
        self.rx.recv().ok()
    }

    /// As [`GatewayEvents::recv`], waiting at most `timeout`: `Err(())` when it passed.
    #[allow(clippy::result_unit_err)]
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Option<Event>, ()> {
        match self.rx.recv_timeout(timeout) {
            Ok(event) => Ok(Some(event)),
            Err(RecvTimeoutError::Disconnected) => Ok(None),
            Err(RecvTimeoutError::Timeout) => Err(()),
        }
    }

    /// The next event if one is waiting, without blocking.
    pub fn try_recv(&self) -> Option<Event> {
        self.rx.try_recv().ok()
    }
}

impl Iterator for GatewayEvents {
    type Item = Event;
    fn next(&mut self) -> Option<Event> {
        self.recv()
    }
}

/// What the monitor and the handles share.
#[derive(Debug, Default)]
struct Hub {
    subscribers: Vec<Sender<Event>>,
    known: HashSet<PublicKey>,
    handshaken: HashSet<PublicKey>,
    stopped: bool,
    /// The monitor has made its first observation (before it, `known` is empty).
    primed: bool,
}

/// The monitor of one gateway's interface; started at the first subscriber.
#[derive(Debug)]
pub(crate) struct Monitor {
    hub: Arc<(Mutex<Hub>, std::sync::Condvar)>,
}

fn lock(hub: &Mutex<Hub>) -> MutexGuard<'_, Hub> {
    hub.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether `peer` is ready, and if not the events to wait on.
pub(crate) enum Readiness {
    Ready,
    Unknown,
    Stopped,
    Wait(GatewayEvents),
}

impl Monitor {
    /// Starts the monitor thread over `workers`; returns once it has looked once, so the
    /// peers are known.
    pub(crate) fn start(workers: Workers) -> std::io::Result<Monitor> {
        let hub = Arc::new((Mutex::new(Hub::default()), std::sync::Condvar::new()));
        let shared = hub.clone();
        std::thread::Builder::new()
            .name("tunneld-events".into())
            .spawn(move || run(workers, &shared))?;
        let (mutex, primed) = &*hub;
        let mut guard = lock(mutex);
        while !guard.primed {
            guard = primed.wait(guard).unwrap_or_else(PoisonError::into_inner);
        }
        drop(guard);
        Ok(Monitor { hub })
    }

    pub(crate) fn subscribe(&self) -> GatewayEvents {
        subscribe(&mut lock(&self.hub.0))
    }

    pub(crate) fn readiness(&self, peer: &PublicKey) -> Readiness {
        let mut hub = lock(&self.hub.0);
        if hub.stopped {
            Readiness::Stopped
        } else if !hub.known.contains(peer) {
            Readiness::Unknown
        } else if hub.handshaken.contains(peer) {
            Readiness::Ready
        } else {
            Readiness::Wait(subscribe(&mut hub))
        }
    }
}

fn subscribe(hub: &mut Hub) -> GatewayEvents {
    let (tx, rx) = mpsc::channel();
    if hub.stopped {
        let _ = tx.send(Event::Stopped);
    } else {
        hub.subscribers.push(tx);
    }
    GatewayEvents { rx }
}

fn run(workers: Workers, hub: &(Mutex<Hub>, std::sync::Condvar)) {
    let mut tracker = Tracker::default();
    loop {
        let now = Instant::now();
        let observed =
            workers.run_each(|device, now| device.observe_peers(now).collect::<Vec<_>>());
        let mut guard = lock(&hub.0);
        let Some(observed) = observed else {
            // A worker has stopped: the gateway was shut down, or failed.
            guard.stopped = true;
            guard.primed = true;
            for s in guard.subscribers.drain(..) {
                let _ = s.send(Event::Stopped);
            }
            hub.1.notify_all();
            return;
        };
        let events = tracker.observe(observed.into_iter().flatten(), now);
        for event in &events {
            match event {
                Event::PeerAdded { peer } => {
                    guard.known.insert(*peer);
                }
                Event::PeerRemoved { peer } => {
                    guard.known.remove(peer);
                    guard.handshaken.remove(peer);
                }
                Event::HandshakeCompleted { peer, .. } => {
                    guard.handshaken.insert(*peer);
                }
                _ => {}
            }
        }
        if !events.is_empty() {
            guard
                .subscribers
                .retain(|s| events.iter().all(|e| s.send(e.clone()).is_ok()));
        }
        if !guard.primed {
            guard.primed = true;
            hub.1.notify_all();
        }
        drop(guard);
        std::thread::sleep(LOOK_EVERY.saturating_sub(now.elapsed()));
    }
}
