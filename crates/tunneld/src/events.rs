//! A gateway's events ([`Gateway::events`](crate::Gateway::events)) and readiness
//! ([`Gateway::wait_ready`](crate::Gateway::wait_ready)): a monitor thread, started by the
//! first subscriber, reads every worker's peers at the workers' tick (250 ms, between
//! batches, as `peers()` does) and turns the differences into events with the core's
//! `event::Tracker`. It only reads (`wait_ready`'s request for a handshake goes through the
//! control handle).

use crate::Error;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tunneld_crypto::PublicKey;
use tunneld_dataplane::worker::Workers;
use tunneld_wireguard::event::{Event, Hub, Readiness, Tracker};

/// How often the monitor looks: the workers' timer tick.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// The events of a gateway from the moment [`Gateway::events`](crate::Gateway::events) was
/// called, in the order they were seen (at most 250 ms after they happened); the last is
/// [`Event::Stopped`], after which [`GatewayEvents::recv`] returns `None`. Events are kept
/// until read (they come at handshake pace), so drop a subscriber you stop reading. Also an
/// `Iterator` (blocking).
///
/// ```no_run
/// # fn run(gateway: tunneld::Gateway) -> Result<(), tunneld::Error> {
/// for event in gateway.events()? {
///     println!("{event:?}");
/// }
/// # Ok(()) }
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

/// What the monitor and the handles share: the core's hub, and whether the monitor has
/// made its first observation (before it, no peer is known).
#[derive(Debug, Default)]
struct Shared {
    hub: Hub<Sender<Event>>,
    primed: bool,
}

/// The monitor of one gateway's interface; started at the first subscriber.
#[derive(Debug)]
pub(crate) struct Monitor {
    shared: Arc<(Mutex<Shared>, Condvar)>,
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Monitor {
    /// Starts the monitor thread over `workers`; returns once it has looked once, so the
    /// peers are known.
    pub(crate) fn start(workers: Workers) -> std::io::Result<Monitor> {
        let shared = Arc::new((Mutex::new(Shared::default()), Condvar::new()));
        let monitored = shared.clone();
        std::thread::Builder::new()
            .name("tunneld-events".into())
            .spawn(move || run(workers, &monitored))?;
        let (mutex, primed) = &*shared;
        let mut guard = lock(mutex);
        while !guard.primed {
            guard = primed.wait(guard).unwrap_or_else(PoisonError::into_inner);
        }
        drop(guard);
        Ok(Monitor { shared })
    }

    pub(crate) fn subscribe(&self) -> GatewayEvents {
        subscribe(&mut lock(&self.shared.0).hub)
    }

    /// Nothing if `peer` has handshaken, else the events that will say when it does.
    pub(crate) fn wait_for(&self, peer: &PublicKey) -> Result<Option<GatewayEvents>, Error> {
        let mut shared = lock(&self.shared.0);
        match shared.hub.readiness(peer) {
            Readiness::Ready => Ok(None),
            Readiness::NotYet => Ok(Some(subscribe(&mut shared.hub))),
            Readiness::Unknown => Err(Error::UnknownPeer(*peer)),
            Readiness::Stopped => Err(Error::Stopped),
        }
    }
}

fn subscribe(hub: &mut Hub<Sender<Event>>) -> GatewayEvents {
    let (tx, rx) = mpsc::channel();
    hub.subscribe(tx);
    GatewayEvents { rx }
}

fn run(workers: Workers, shared: &(Mutex<Shared>, Condvar)) {
    let mut tracker = Tracker::default();
    loop {
        let now = Instant::now();
        let observed =
            workers.run_each(|device, now| device.observe_peers(now).collect::<Vec<_>>());
        let mut guard = lock(&shared.0);
        let Some(observed) = observed else {
            // A worker has stopped: the gateway was shut down, or failed.
            guard.hub.stop();
            guard.primed = true;
            shared.1.notify_all();
            return;
        };
        let events = tracker.observe(observed.into_iter().flatten(), now);
        guard.hub.publish(&events);
        if !guard.primed {
            guard.primed = true;
            shared.1.notify_all();
        }
        drop(guard);
        std::thread::sleep(LOOK_EVERY.saturating_sub(now.elapsed()));
    }
}
