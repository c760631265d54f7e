//! Peers of a running tunnel: what a change names ([`PeerChange`]), the event stream
//! ([`Events`]) and what the engine and the handles share to report events (`Hub`).

use crate::settings::Error;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use tokio::sync::mpsc;
use tunneld_crypto::{PresharedKey, PublicKey};
use tunneld_wireguard::event::{Event, Tracker};

/// What [`Tunnel::update_peer`](crate::Tunnel::update_peer) changes of a peer; `None`
/// leaves a setting as it is.
///
/// ```
/// # let key = tunneld_userspace::PrivateKey::generate().public_key();
/// let change = tunneld_userspace::PeerChange::new(key)
///     .endpoint("192.0.2.9:51820".parse().unwrap())
///     .allowed_ips(vec!["10.77.0.0/24".parse().unwrap()])
///     .persistent_keepalive(25);
/// assert_eq!(change.persistent_keepalive, Some(25));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerChange {
    /// The peer to change.
    pub public_key: PublicKey,
    /// Where to send its datagrams from now on (default: unchanged; a peer also moves by
    /// itself when its authenticated datagrams come from elsewhere).
    pub endpoint: Option<SocketAddr>,
    /// Replaces every allowed IP (default: unchanged). Connections to addresses the tunnel
    /// no longer routes are reset.
    pub allowed_ips: Option<Vec<ipnet::IpNet>>,
    /// Seconds; 0 turns it off (default: unchanged).
    pub persistent_keepalive: Option<u16>,
    /// `Some(None)` removes the preshared key (default: unchanged). A new key starts a new
    /// session at once.
    pub preshared_key: Option<Option<PresharedKey>>,
}

impl PeerChange {
    /// A change to the peer `public_key` that changes nothing yet.
    pub fn new(public_key: PublicKey) -> PeerChange {
        PeerChange {
            public_key,
            endpoint: None,
            allowed_ips: None,
            persistent_keepalive: None,
            preshared_key: None,
        }
    }

    /// Sets the new endpoint.
    pub fn endpoint(mut self, endpoint: SocketAddr) -> PeerChange {
        self.endpoint = Some(endpoint);
        self
    }

    /// Sets the new allowed IPs (replacing all of them).
    pub fn allowed_ips(mut self, allowed_ips: Vec<ipnet::IpNet>) -> PeerChange {
        self.allowed_ips = Some(allowed_ips);
        self
    }

    /// Sets the new keepalive interval in seconds (0: off).
    pub fn persistent_keepalive(mut self, seconds: u16) -> PeerChange {
        self.persistent_keepalive = Some(seconds);
        self
    }

    /// Sets (`Some`) or removes (`None`) the preshared key.
    pub fn preshared_key(mut self, key: Option<PresharedKey>) -> PeerChange {
        self.preshared_key = Some(key);
        self
    }
}

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

/// What the engine tells the handles about peers: the event subscribers and, for
/// [`Tunnel::ready`](crate::Tunnel::ready), which peers exist and which have handshaken.
/// Taken only when events happen or a handle subscribes, never on the data path.
#[derive(Debug, Default)]
pub(crate) struct Hub {
    subscribers: Vec<mpsc::UnboundedSender<Event>>,
    known: HashSet<PublicKey>,
    handshaken: HashSet<PublicKey>,
    stopped: bool,
}

/// How a peer stands for [`Tunnel::ready`](crate::Tunnel::ready).
pub(crate) enum Readiness {
    Ready,
    /// Not yet: the events to wait on.
    Wait(Events),
}

impl Hub {
    pub(crate) fn lock(hub: &Mutex<Hub>) -> MutexGuard<'_, Hub> {
        hub.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new subscriber (told only `Stopped` if the engine has stopped).
    pub(crate) fn subscribe(&mut self) -> Events {
        let (tx, rx) = mpsc::unbounded_channel();
        if self.stopped {
            let _ = tx.send(Event::Stopped);
        } else {
            self.subscribers.push(tx);
        }
        Events { rx }
    }

    /// Whether `peer` has handshaken, or the events that will say when it does.
    pub(crate) fn readiness(&mut self, peer: &PublicKey) -> Result<Readiness, Error> {
        if self.stopped {
            return Err(Error::Stopped);
        }
        if !self.known.contains(peer) {
            return Err(Error::UnknownPeer(*peer));
        }
        if self.handshaken.contains(peer) {
            return Ok(Readiness::Ready);
        }
        Ok(Readiness::Wait(self.subscribe()))
    }

    /// Records what the tracker knows now and sends `events` to every subscriber.
    pub(crate) fn publish(&mut self, tracker: &Tracker, events: Vec<Event>) {
        for event in &events {
            match event {
                Event::PeerAdded { peer } => {
                    self.known.insert(*peer);
                }
                Event::PeerRemoved { peer } => {
                    self.known.remove(peer);
                    self.handshaken.remove(peer);
                }
                Event::HandshakeCompleted { peer, .. } if tracker.handshake_done(peer) => {
                    self.handshaken.insert(*peer);
                }
                _ => {}
            }
        }
        if events.is_empty() {
            return;
        }
        self.subscribers.retain(|s| !s.is_closed());
        for s in &self.subscribers {
            for event in &events {
                let _ = s.send(event.clone());
            }
        }
    }

    /// The engine stopped: `Stopped` to every subscriber, whose streams then end.
    pub(crate) fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        for s in self.subscribers.drain(..) {
            let _ = s.send(Event::Stopped);
        }
    }
}
