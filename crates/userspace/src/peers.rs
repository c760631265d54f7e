//! Peers of a running tunnel: the event stream ([`Events`]) and what the engine and the
//! handles share to report events (`Hub`, the core's `event::Hub` over tokio channels).

use crate::settings::Error;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use tokio::sync::mpsc;
use tunneld_crypto::PublicKey;
use tunneld_wireguard::event::{self, Event, Readiness};

/// The events of a tunnel from the moment [`Tunnel::events`](crate::Tunnel::events) was
/// called, in the order the engine saw them; [`Event::Stopped`] is the last, after which
/// [`Events::recv`] returns `None`. Events are kept until read (they come at handshake
/// pace: a few per peer every two minutes), so a subscriber that never reads should be
/// dropped.
///
/// ```no_run
/// # async fn run(tunnel: tunneld_userspace::Tunnel) {
/// use tunneld_userspace::Event;
/// let mut events = tunnel.events();
/// while let Some(event) = events.recv().await {
///     match event {
///         Event::HandshakeCompleted { peer, endpoint } => println!("{peer} up at {endpoint:?}"),
///         Event::HandshakeFailed { peer, waited } => println!("{peer}: no answer for {waited:?}"),
///         other => println!("{other:?}"),
///     }
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct Events {
    rx: mpsc::UnboundedReceiver<Event>,
}

impl Events {
    /// The next event; `None` once the tunnel has stopped and every event was read.
    ///
    /// Cancel safe: an event is taken only when this returns it.
    pub async fn recv(&mut self) -> Option<Event> {
        self.rx.recv().await
    }

    /// The next event if one is there: `Poll::Ready(None)` once the tunnel has stopped
    /// and every event was read.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        self.rx.poll_recv(cx)
    }

    /// The next event if one is waiting, without waiting.
    pub fn try_recv(&mut self) -> Option<Event> {
        self.rx.try_recv().ok()
    }
}

/// An [`Events`] stream's sending end, as the hub keeps it.
#[derive(Debug)]
pub(crate) struct Subscriber(mpsc::UnboundedSender<Event>);

impl event::Subscriber for Subscriber {
    fn deliver(&self, event: Event) -> bool {
        self.0.send(event).is_ok()
    }
}

/// What the engine tells the handles about peers: the event subscribers and, for
/// [`Tunnel::ready`](crate::Tunnel::ready), which peers exist and which have handshaken.
/// Taken only when events happen or a handle subscribes, never on the data path.
pub(crate) type Hub = event::Hub<Subscriber>;

pub(crate) fn lock(hub: &Mutex<Hub>) -> MutexGuard<'_, Hub> {
    hub.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A new subscriber of `hub` (told only `Stopped` if the engine has stopped).
pub(crate) fn subscribe(hub: &mut Hub) -> Events {
    let (tx, rx) = mpsc::unbounded_channel();
    hub.subscribe(Subscriber(tx));
    Events { rx }
}

/// Nothing if `peer` has handshaken, else the events that will say when it does.
pub(crate) fn wait_for(hub: &Mutex<Hub>, peer: &PublicKey) -> Result<Option<Events>, Error> {
    let mut hub = lock(hub);
    match hub.readiness(peer) {
        Readiness::Ready => Ok(None),
        Readiness::NotYet => Ok(Some(subscribe(&mut hub))),
        Readiness::Unknown => Err(Error::UnknownPeer(*peer)),
        Readiness::Stopped => Err(Error::Stopped),
    }
}
