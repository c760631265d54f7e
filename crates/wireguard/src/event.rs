//! What happens to a tunnel's peers, as events: handshakes completed or unanswered,
//! endpoints moved, peers added and removed. The core emits nothing by itself (it is
//! sans-IO); whoever drives devices observes them ([`Device::observe_peers`]) whenever
//! something may have changed and hands the observations to a [`Tracker`], which turns the
//! differences into [`Event`]s, which a [`Hub`] hands to every subscriber. The user-space
//! tunnel and the gateway both do so.
//!
//! [`Device::observe_peers`]: crate::Device::observe_peers

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tunneld_crypto::PublicKey;

/// An attempt to handshake that has had no answer for this long is reported as failed
/// (WireGuard's `REKEY_TIMEOUT`: the initiation is then sent again).
pub const HANDSHAKE_FAILED_AFTER: Duration = Duration::from_secs(5);

/// Something that happened to a tunnel or one of its peers, in the order it was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// A peer was added (at start or later).
    PeerAdded {
        /// The peer.
        peer: PublicKey,
    },
    /// A handshake with the peer completed: a new session carries its traffic. Happens
    /// again at every rekey (every two minutes while traffic flows).
    HandshakeCompleted {
        /// The peer.
        peer: PublicKey,
        /// Where the peer is reached now.
        endpoint: Option<SocketAddr>,
    },
    /// An attempt to handshake with the peer got no answer within
    /// [`HANDSHAKE_FAILED_AFTER`] (reported once per attempt; WireGuard keeps retrying for
    /// 90 s, and any later packet for the peer starts a new attempt).
    HandshakeFailed {
        /// The peer.
        peer: PublicKey,
        /// How long the attempt has gone unanswered.
        waited: Duration,
    },
    /// The peer's endpoint changed: set by a change, or learnt from its authenticated
    /// datagrams (roaming).
    EndpointChanged {
        /// The peer.
        peer: PublicKey,
        /// Its new endpoint.
        endpoint: SocketAddr,
    },
    /// The peer was removed.
    PeerRemoved {
        /// The peer.
        peer: PublicKey,
    },
    /// The tunnel stopped (shut down, or failed); no event follows.
    Stopped,
}

/// One peer's state as a device sees it, for a [`Tracker`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerObservation {
    /// The peer.
    pub public_key: PublicKey,
    /// Where its datagrams go.
    pub endpoint: Option<SocketAddr>,
    /// When its last handshake completed.
    pub last_handshake: Option<Instant>,
    /// When the handshake attempt now under way started, if one is.
    pub attempt_started: Option<Instant>,
}

#[derive(Debug, Clone, Copy)]
struct Known {
    endpoint: Option<SocketAddr>,
    last_handshake: Option<Instant>,
    /// The attempt already reported as failed.
    failed_attempt: Option<Instant>,
}

/// Turns successive observations of a tunnel's peers into [`Event`]s.
///
/// ```
/// use std::time::{Duration, Instant};
/// use tunneld_wireguard::event::{Event, PeerObservation, Tracker};
/// let peer = tunneld_crypto::PrivateKey::generate().public_key();
/// let t0 = Instant::now();
/// let mut seen = PeerObservation { public_key: peer, endpoint: None, last_handshake: None, attempt_started: None };
/// let mut tracker = Tracker::default();
/// assert_eq!(tracker.observe([seen], t0), vec![Event::PeerAdded { peer }]);
/// seen.last_handshake = Some(t0);
/// assert_eq!(tracker.observe([seen], t0), vec![Event::HandshakeCompleted { peer, endpoint: None }]);
/// assert_eq!(tracker.observe([], t0 + Duration::from_secs(1)), vec![Event::PeerRemoved { peer }]);
/// ```
#[derive(Debug, Default)]
pub struct Tracker {
    known: HashMap<PublicKey, Known>,
    /// The peers in the order they were added.
    order: Vec<PublicKey>,
    /// The observation being compared, kept between calls so that one with nothing new
    /// allocates nothing (the user-space engine observes at every tick).
    merged: Vec<PeerObservation>,
    /// Where each key is in `merged` (linear in the peers: a hub has thousands).
    index: HashMap<PublicKey, usize>,
}

impl Tracker {
    /// Compares `peers` (every peer the tunnel has now; a key seen twice, as the
    /// sub-tunnels of a split peer are, is merged: its latest handshake, its first
    /// endpoint, its oldest attempt) with the last observation, and returns what changed:
    /// per peer in the order added, handshake completed, endpoint changed or handshake
    /// failed; then the removals.
    pub fn observe(
        &mut self,
        peers: impl IntoIterator<Item = PeerObservation>,
        now: Instant,
    ) -> Vec<Event> {
        let mut merged = std::mem::take(&mut self.merged);
        merged.clear();
        self.index.clear();
        for p in peers {
            match self
                .index
                .get(&p.public_key)
                .and_then(|&i| merged.get_mut(i))
            {
                Some(m) => {
                    m.last_handshake = m.last_handshake.max(p.last_handshake);
                    m.endpoint = m.endpoint.or(p.endpoint);
                    m.attempt_started = match (m.attempt_started, p.attempt_started) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                }
                None => {
                    self.index.insert(p.public_key, merged.len());
                    merged.push(p);
                }
            }
        }
        let mut events = Vec::new();
        for p in &merged {
            let peer = p.public_key;
            let known = match self.known.get_mut(&peer) {
                Some(k) => k,
                None => {
                    events.push(Event::PeerAdded { peer });
                    self.order.push(peer);
                    self.known.entry(peer).or_insert(Known {
                        endpoint: p.endpoint,
                        // A peer added with a handshake already done (a re-added key that
                        // kept its session) reports it below.
                        last_handshake: None,
                        failed_attempt: None,
                    })
                }
            };
            if p.endpoint != known.endpoint {
                known.endpoint = p.endpoint;
                if let Some(endpoint) = p.endpoint {
                    events.push(Event::EndpointChanged { peer, endpoint });
                }
            }
            if p.last_handshake.is_some() && p.last_handshake != known.last_handshake {
                known.last_handshake = p.last_handshake;
                events.push(Event::HandshakeCompleted {
                    peer,
                    endpoint: p.endpoint,
                });
            }
            if let Some(started) = p.attempt_started {
                let waited = now.saturating_duration_since(started);
                let answered = p.last_handshake.is_some_and(|h| h >= started);
                if waited >= HANDSHAKE_FAILED_AFTER
                    && !answered
                    && known.failed_attempt != Some(started)
                {
                    known.failed_attempt = Some(started);
                    events.push(Event::HandshakeFailed { peer, waited });
                }
            }
        }
        // `order` holds every peer now seen and those gone: more than `merged`'s, some are gone.
        if self.order.len() > merged.len() {
            let (index, known) = (&self.index, &mut self.known);
            self.order.retain(|peer| {
                let stays = index.contains_key(peer);
                if !stays {
                    known.remove(peer);
                    events.push(Event::PeerRemoved { peer: *peer });
                }
                stays
            });
        }
        self.merged = merged;
        events
    }

    /// Whether `peer` has completed a handshake since it was added (as last observed).
    pub fn handshake_done(&self, peer: &PublicKey) -> bool {
        self.known
            .get(peer)
            .is_some_and(|k| k.last_handshake.is_some())
    }

    /// Whether `peer` was there at the last observation.
    pub fn knows(&self, peer: &PublicKey) -> bool {
        self.known.contains_key(peer)
    }
}

/// Where a [`Hub`] delivers events: the sending end of one subscriber's channel (a
/// `std::sync::mpsc::Sender` for a blocking reader; an async one wrapped in a type of the
/// caller's).
pub trait Subscriber {
    /// Delivers `event`; false once the receiving end is gone (the hub then drops it).
    fn deliver(&self, event: Event) -> bool;
}

impl Subscriber for std::sync::mpsc::Sender<Event> {
    fn deliver(&self, event: Event) -> bool {
        self.send(event).is_ok()
    }
}

/// How a peer stands for a wait until it is ready (a handshake completed since it was
/// added), as a [`Hub`] knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// It has handshaken.
    Ready,
    /// Not yet: subscribe, and wait for its `HandshakeCompleted` (or `PeerRemoved`).
    NotYet,
    /// No such peer.
    Unknown,
    /// The tunnel has stopped.
    Stopped,
}

/// What whoever drives a tunnel's devices (the user-space engine, the gateway's monitor)
/// shares with the tunnel's handles: the event subscribers, and which peers exist and have
/// handshaken, for readiness. The driver [`publish`](Hub::publish)es what its [`Tracker`]
/// found and [`stop`](Hub::stop)s it at the end; handles [`subscribe`](Hub::subscribe) and
/// ask [`readiness`](Hub::readiness). Keep it behind a lock taken only when events happen
/// or a handle asks, never on the data path.
#[derive(Debug)]
pub struct Hub<S> {
    subscribers: Vec<S>,
    known: HashSet<PublicKey>,
    handshaken: HashSet<PublicKey>,
    stopped: bool,
}

impl<S> Default for Hub<S> {
    fn default() -> Self {
        Hub {
            subscribers: Vec::new(),
            known: HashSet::new(),
            handshaken: HashSet::new(),
            stopped: false,
        }
    }
}

impl<S: Subscriber> Hub<S> {
    /// Adds a subscriber, which sees every event published from now on; once the hub has
    /// stopped, it is told only [`Event::Stopped`].
    pub fn subscribe(&mut self, subscriber: S) {
        if self.stopped {
            subscriber.deliver(Event::Stopped);
        } else {
            self.subscribers.push(subscriber);
        }
    }

    /// How `peer` stands. For [`Readiness::NotYet`], subscribe before the lock on the hub
    /// is let go, so that its handshake cannot slip between the two.
    pub fn readiness(&self, peer: &PublicKey) -> Readiness {
        if self.stopped {
            Readiness::Stopped
        } else if !self.known.contains(peer) {
            Readiness::Unknown
        } else if self.handshaken.contains(peer) {
            Readiness::Ready
        } else {
            Readiness::NotYet
        }
    }

    /// Records what `events` (one [`Tracker::observe`]'s) say about the peers and delivers
    /// them, in order, to every subscriber; those whose receiving end is gone are dropped.
    pub fn publish(&mut self, events: &[Event]) {
        for event in events {
            match event {
                Event::PeerAdded { peer } => {
                    self.known.insert(*peer);
                }
                Event::PeerRemoved { peer } => {
                    self.known.remove(peer);
                    self.handshaken.remove(peer);
                }
                Event::HandshakeCompleted { peer, .. } => {
                    self.handshaken.insert(*peer);
                }
                _ => {}
            }
        }
        if !events.is_empty() {
            self.subscribers
                .retain(|s| events.iter().all(|e| s.deliver(e.clone())));
        }
    }

    /// The tunnel stopped: [`Event::Stopped`] to every subscriber, whose streams then end.
    /// Again does nothing.
    pub fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        for s in self.subscribers.drain(..) {
            s.deliver(Event::Stopped);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tunneld_crypto::PrivateKey;

    fn seen(peer: PublicKey) -> PeerObservation {
        PeerObservation {
            public_key: peer,
            endpoint: None,
            last_handshake: None,
            attempt_started: None,
        }
    }

    #[test]
    fn each_change_is_reported_once_in_order() {
        let (a, b) = (
            PrivateKey::generate().public_key(),
            PrivateKey::generate().public_key(),
        );
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut tracker = Tracker::default();
        let mut pa = seen(a);
        let mut pb = seen(b);
        pb.endpoint = Some("192.0.2.2:51820".parse().unwrap());
        assert_eq!(
            tracker.observe([pa, pb], t0),
            vec![Event::PeerAdded { peer: a }, Event::PeerAdded { peer: b }]
        );
        assert!(tracker.observe([pa, pb], at(1)).is_empty(), "no change");

        // An attempt: reported failed once it waited 5 s, and only once.
        pb.attempt_started = Some(at(1));
        assert!(tracker.observe([pa, pb], at(5)).is_empty());
        assert_eq!(
            tracker.observe([pa, pb], at(6)),
            vec![Event::HandshakeFailed {
                peer: b,
                waited: Duration::from_secs(5)
            }]
        );
        assert!(tracker.observe([pa, pb], at(9)).is_empty());

        // It completes, at a new endpoint; a is removed.
        pb.attempt_started = None;
        pb.last_handshake = Some(at(10));
        pb.endpoint = Some("192.0.2.3:51820".parse().unwrap());
        assert_eq!(
            tracker.observe([pb], at(10)),
            vec![
                Event::EndpointChanged {
                    peer: b,
                    endpoint: pb.endpoint.unwrap()
                },
                Event::HandshakeCompleted {
                    peer: b,
                    endpoint: pb.endpoint
                },
                Event::PeerRemoved { peer: a },
            ]
        );
        assert!(tracker.handshake_done(&b) && !tracker.knows(&a));

        // A rekey is a new completion; a re-added key starts over.
        pb.last_handshake = Some(at(130));
        pa.last_handshake = Some(at(120));
        assert_eq!(
            tracker.observe([pb, pa], at(130)),
            vec![
                Event::HandshakeCompleted {
                    peer: b,
                    endpoint: pb.endpoint
                },
                Event::PeerAdded { peer: a },
                Event::HandshakeCompleted {
                    peer: a,
                    endpoint: None
                },
            ]
        );
    }

    #[test]
    fn sub_tunnels_of_one_peer_merge() {
        let a = PrivateKey::generate().public_key();
        let t0 = Instant::now();
        let mut tracker = Tracker::default();
        let mut first = seen(a);
        let mut second = seen(a);
        tracker.observe([first, second], t0);
        first.last_handshake = Some(t0);
        second.attempt_started = Some(t0);
        // One completion; the other sub-tunnel's attempt started no later than the
        // handshake, so it is not a failure.
        assert_eq!(
            tracker.observe([first, second], t0 + Duration::from_secs(6)),
            vec![Event::HandshakeCompleted {
                peer: a,
                endpoint: None
            }]
        );
    }

    #[test]
    fn a_hub_tracks_readiness_and_delivers_in_order_until_stopped() {
        use std::sync::mpsc;
        let (a, b) = (
            PrivateKey::generate().public_key(),
            PrivateKey::generate().public_key(),
        );
        let mut hub: Hub<mpsc::Sender<Event>> = Hub::default();
        assert_eq!(hub.readiness(&a), Readiness::Unknown);
        let (tx, rx) = mpsc::channel();
        hub.subscribe(tx);
        let (gone, gone_rx) = mpsc::channel();
        hub.subscribe(gone);
        drop(gone_rx);
        let added = [Event::PeerAdded { peer: a }, Event::PeerAdded { peer: b }];
        hub.publish(&added);
        assert_eq!(
            hub.subscribers.len(),
            1,
            "a subscriber that is gone is dropped"
        );
        assert_eq!(hub.readiness(&a), Readiness::NotYet);
        let done = Event::HandshakeCompleted {
            peer: a,
            endpoint: None,
        };
        hub.publish(std::slice::from_ref(&done));
        assert_eq!(hub.readiness(&a), Readiness::Ready);
        assert_eq!(hub.readiness(&b), Readiness::NotYet);
        hub.publish(&[Event::PeerRemoved { peer: a }]);
        assert_eq!(hub.readiness(&a), Readiness::Unknown);
        hub.stop();
        hub.stop();
        assert_eq!(hub.readiness(&b), Readiness::Stopped);
        let seen: Vec<Event> = rx.try_iter().collect();
        assert_eq!(
            seen,
            [
                &added[..],
                &[done, Event::PeerRemoved { peer: a }, Event::Stopped]
            ]
            .concat()
        );
        let (late, late_rx) = mpsc::channel();
        hub.subscribe(late);
        assert_eq!(late_rx.try_iter().collect::<Vec<_>>(), [Event::Stopped]);
        assert!(hub.subscribers.is_empty());
    }
}
