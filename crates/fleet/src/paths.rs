//! Paths to gateways behind NAT, without I/O: which address to try next for each peer the
//! fleet added, and which addresses this gateway tells the fleet it saw.
//!
//! A gateway behind NAT is reached where its NAT maps it, which only those who receive from
//! it see. So every gateway publishes, under its own record, the address each peer's
//! authenticated datagrams came from when that is not one the peer advertises
//! ([`observations`]); the reconcile adds those to the peer's candidates
//! (`Fleet::candidates`). A peer with no live session is searched: its candidates are tried
//! one after the other, [`ATTEMPT`] apart, each with a handshake sent at once
//! (`Gateway::move_peer`), in rounds that back off from [`FIRST_ROUND`] to [`LAST_ROUND`].
//! Both ends of a pair do this when they learn of each other, so each one's initiation
//! opens its own NAT's mapping toward the other, and whichever arrives second finds the
//! way open: a hole punched with WireGuard's own handshakes, which nothing off the path can
//! forge. Once a handshake completes the peer is left alone, and roaming keeps its address.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tunneld_crypto::PublicKey;

/// Time given to one candidate before the next is tried.
pub const ATTEMPT: Duration = Duration::from_millis(300);
/// The wait between the first rounds over a peer's candidates; it doubles up to
/// [`LAST_ROUND`].
pub const FIRST_ROUND: Duration = Duration::from_secs(1);
pub const LAST_ROUND: Duration = Duration::from_secs(16);
/// A session older than this is none (WireGuard's REJECT_AFTER_TIME).
const SESSION_LIFE: Duration = Duration::from_secs(180);
/// Searching this long with no session: the gateway asks for a relay.
pub const RELAY_AFTER: Duration = Duration::from_secs(1);
/// While a relay serves a peer with no session, the move to it is made again this often
/// (the other side may not have registered yet when the first handshake crossed).
pub const RELAY_RETRY: Duration = Duration::from_millis(400);
/// A relayed side registers again this often: after its NAT forgot its mapping the relay
/// learns the new one within this.
pub const REGISTER_EVERY: Duration = Duration::from_secs(1);
/// A relayed pair tries a direct path once in each such slot of the wall clock (at an
/// offset of the pair's own), so both sides try at the same moment without asking each
/// other: the higher-keyed side punches, the lower-keyed one sends a handshake to each
/// direct address in turn without moving off the relay (`Gateway::try_path`); an answer
/// moves it, as roaming does.
pub const UPGRADE_EVERY: Duration = Duration::from_secs(10);
/// How long after the higher-keyed side's punches the lower-keyed side tries the direct
/// address (more than a tick of `PATHS_EVERY`: the two sides' ticks are not in step), and
/// how long its handshake there has to complete.
const PUNCH_LEAD: Duration = Duration::from_millis(450);
const TRIAL: Duration = Duration::from_secs(1);
/// Nothing authenticated from a peer for this long while this side kept sending to it
/// (`SILENT_BYTES` at least): its path is dead, whatever its session's age (WireGuard's own
/// keepalive and rekey timeouts, 10 s and 5 s: a live peer answers within them).
pub const SILENT_AFTER: Duration = Duration::from_secs(15);
const SILENT_BYTES: u64 = 3 * 32;

/// What the gateway says of one peer at a tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerNow {
    pub public_key: PublicKey,
    pub endpoint: Option<SocketAddr>,
    /// How long ago its last handshake completed (`None`: never).
    pub since_handshake: Option<Duration>,
    /// Bytes authenticated from it so far.
    pub rx_bytes: u64,
    /// Bytes sent to it so far.
    pub tx_bytes: u64,
}

/// A peer's path as the search sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathState {
    /// A live session, datagrams going to this address.
    Up { via: SocketAddr, since: Instant },
    /// No live session: trying its candidates (tried so far, over all rounds).
    Searching { since: Instant, tried: u32 },
    /// A live session through a relay, at this address (the pair's port on it).
    Relayed { via: SocketAddr, since: Instant },
}

/// What one tick asks the gateway to do.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tick {
    /// Peers to move to an address, each with a handshake at once.
    pub moves: Vec<(PublicKey, SocketAddr)>,
    /// Peers to send a handshake at an address without moving them (a relayed peer's
    /// direct address: an answer from there moves it).
    pub tries: Vec<(PublicKey, SocketAddr)>,
    /// Peers whose relay to register with now (before any move to it).
    pub register: Vec<PublicKey>,
    /// Addresses to send a punch to from the WireGuard socket (opening this side's NAT
    /// toward them for the other side's try of a direct path).
    pub punches: Vec<SocketAddr>,
    /// Peers for which this gateway wants a relay.
    pub want_relay: std::collections::BTreeSet<PublicKey>,
}

/// A relayed peer's life on the relay.
#[derive(Debug)]
struct Relayed {
    via: SocketAddr,
    since: Instant,
    registered: Instant,
    /// The wall-clock slot of the last try of a direct path.
    slot: u64,
    /// A direct address to try at a moment (the lower-keyed side's part).
    try_at: Option<Instant>,
    /// The direct addresses left to try in this slot, in order.
    trying: Vec<SocketAddr>,
    /// A try under way: where, since when.
    trial: Option<(SocketAddr, Instant)>,
}

#[derive(Debug)]
struct Search {
    candidates: Vec<SocketAddr>,
    /// The next candidate to try and when.
    next: usize,
    at: Instant,
    round: Duration,
    since: Instant,
    tried: u32,
    /// Where the last try sent it, and its bytes received at the last tick: a peer whose
    /// datagrams arrive, or that roamed elsewhere, is handshaking (its answer is on the way)
    /// and is not moved under it.
    moved_to: Option<SocketAddr>,
    rx_bytes: u64,
}

/// The paths of the fleet's peers.
#[derive(Debug, Default)]
pub struct Paths {
    searches: HashMap<PublicKey, Search>,
    up: HashMap<PublicKey, (SocketAddr, Instant)>,
    relayed: HashMap<PublicKey, Relayed>,
    /// When each searching peer was last moved to its relay.
    relay_moves: HashMap<PublicKey, Instant>,
    /// Each peer's bytes received and sent when it was last heard from, and when.
    heard: HashMap<PublicKey, (u64, u64, Instant)>,
}

impl Paths {
    /// One tick: the addresses to move peers to now (each with a handshake at once).
    /// `peers` are the fleet's peers as the gateway has them, `candidates` each one's
    /// addresses to try (advertised first).
    pub fn tick(
        &mut self,
        now: Instant,
        peers: &[PeerNow],
        candidates: impl Fn(&PublicKey) -> Vec<SocketAddr>,
    ) -> Vec<(PublicKey, SocketAddr)> {
        let own = PublicKey::from_bytes([0; 32]);
        self.tick_relayed(now, Duration::ZERO, &own, peers, candidates, |_| None)
            .moves
    }

    /// [`Paths::tick`] with relays: `relay` is the address of the port a relay serves the
    /// pair of this gateway (`own`) and a peer on, if one does; `wall` the time since the
    /// Unix epoch (which schedules a relayed pair's tries of a direct path on both sides
    /// alike).
    pub fn tick_relayed(
        &mut self,
        now: Instant,
        wall: Duration,
        own: &PublicKey,
        peers: &[PeerNow],
        candidates: impl Fn(&PublicKey) -> Vec<SocketAddr>,
        relay: impl Fn(&PublicKey) -> Option<SocketAddr>,
    ) -> Tick {
        let mut tick = Tick::default();
        let present: std::collections::HashSet<PublicKey> =
            peers.iter().map(|p| p.public_key).collect();
        self.searches.retain(|k, _| present.contains(k));
        self.up.retain(|k, _| present.contains(k));
        self.relayed.retain(|k, _| present.contains(k));
        self.relay_moves.retain(|k, _| present.contains(k));
        self.heard.retain(|k, _| present.contains(k));
        for peer in peers {
            let key = peer.public_key;
            let live =
                peer.since_handshake.is_some_and(|d| d < SESSION_LIFE) && !self.silent(now, peer);
            let relay_at = relay(&key);
            if self.relayed.contains_key(&key)
                && self.relayed_tick(now, wall, own, peer, live, relay_at, &candidates, &mut tick)
            {
                continue;
            }
            let on_relay = relay_at.is_some() && peer.endpoint == relay_at;
            if live && on_relay {
                self.searches.remove(&key);
                self.up.remove(&key);
                self.relay_moves.remove(&key);
                let via = peer.endpoint.unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
                self.relayed.insert(
                    key,
                    Relayed {
                        via,
                        since: now,
                        registered: now,
                        slot: upgrade_slot(wall, own, &key),
                        try_at: None,
                        trying: Vec::new(),
                        trial: None,
                    },
                );
                tick.want_relay.insert(key);
                continue;
            }
            if live {
                self.searches.remove(&key);
                self.relay_moves.remove(&key);
                if let Some(via) = peer.endpoint {
                    let since = match self.up.get(&key) {
                        Some((_, since)) => *since,
                        None => now,
                    };
                    self.up.insert(key, (via, since));
                }
                continue;
            }
            self.up.remove(&key);
            if let Some(search) = self.searches.get(&key) {
                if now.saturating_duration_since(search.since) >= RELAY_AFTER {
                    tick.want_relay.insert(key);
                }
            }
            if let Some(at) = relay_at {
                // A relay serves the pair: direct paths failed long enough. Go through it,
                // again until a session stands (the other side may register late); tries of
                // a direct path come once relayed.
                let heard = self
                    .searches
                    .get(&key)
                    .is_some_and(|s| s.rx_bytes != peer.rx_bytes);
                if let Some(s) = self.searches.get_mut(&key) {
                    s.rx_bytes = peer.rx_bytes;
                }
                tick.want_relay.insert(key);
                let due = self
                    .relay_moves
                    .get(&key)
                    .is_none_or(|t| now.saturating_duration_since(*t) >= RELAY_RETRY);
                if due && !(heard && peer.endpoint == Some(at)) {
                    tick.register.push(key);
                    tick.moves.push((key, at));
                    self.relay_moves.insert(key, now);
                }
                continue;
            }
            let wanted = candidates(&key);
            if wanted.is_empty() {
                self.searches.remove(&key);
                continue;
            }
            let search = self.searches.entry(key).or_insert_with(|| Search {
                candidates: wanted.clone(),
                next: 0,
                at: now,
                round: FIRST_ROUND,
                since: now,
                tried: 0,
                moved_to: None,
                // What a stale session received says nothing now; with none, what came
                // in is the peer's handshake under way.
                rx_bytes: if peer.since_handshake.is_some() {
                    peer.rx_bytes
                } else {
                    0
                },
            });
            let heard = peer.rx_bytes != search.rx_bytes;
            let roamed = search.moved_to.is_some() && peer.endpoint != search.moved_to;
            search.rx_bytes = peer.rx_bytes;
            if heard || roamed {
                // Its handshake is under way where its datagrams come from: give it time.
                search.moved_to = peer.endpoint;
                search.at = search.at.max(now + ATTEMPT);
                continue;
            }
            if search.candidates != wanted {
                // New addresses (a gateway saw it elsewhere): a fresh round, at once.
                search.candidates = wanted;
                search.next = 0;
                search.at = now;
                search.round = FIRST_ROUND;
            }
            if now < search.at {
                continue;
            }
            let to = search.candidates[search.next];
            tick.moves.push((key, to));
            search.moved_to = Some(to);
            search.tried += 1;
            search.next += 1;
            if search.next < search.candidates.len() {
                search.at = now + ATTEMPT;
            } else {
                search.next = 0;
                search.at = now + search.round;
                search.round = (search.round * 2).min(LAST_ROUND);
            }
        }
        tick
    }

    /// Whether `peer` has been silent for `SILENT_AFTER` while this side sent to it: a path
    /// that died under a session (a NAT that changed, a firewall) is searched again, not
    /// left until the session expires.
    fn silent(&mut self, now: Instant, peer: &PeerNow) -> bool {
        let heard =
            self.heard
                .entry(peer.public_key)
                .or_insert((peer.rx_bytes, peer.tx_bytes, now));
        if heard.0 != peer.rx_bytes {
            *heard = (peer.rx_bytes, peer.tx_bytes, now);
            return false;
        }
        now.saturating_duration_since(heard.2) >= SILENT_AFTER
            && peer.tx_bytes.saturating_sub(heard.1) >= SILENT_BYTES
    }

    /// A relayed peer's tick: registrations, tries of a direct path, and whether it is
    /// still relayed (`false`: it left the relay, handled as any peer).
    #[allow(clippy::too_many_arguments)]
    fn relayed_tick(
        &mut self,
        now: Instant,
        wall: Duration,
        own: &PublicKey,
        peer: &PeerNow,
        live: bool,
        relay_at: Option<SocketAddr>,
        candidates: &impl Fn(&PublicKey) -> Vec<SocketAddr>,
        tick: &mut Tick,
    ) -> bool {
        let key = peer.public_key;
        let Some(r) = self.relayed.get_mut(&key) else {
            return false;
        };
        if let Some((to, started)) = r.trial {
            let answered = live
                && peer.endpoint == Some(to)
                && peer
                    .since_handshake
                    .is_some_and(|d| d < now.saturating_duration_since(started));
            if answered {
                // A direct path: the relay is let go.
                self.relayed.remove(&key);
                self.up.insert(key, (to, now));
                return true;
            }
            // Each address but the last gets an attempt's time; the last a whole trial's.
            let window = if r.trying.is_empty() { TRIAL } else { ATTEMPT };
            if now.saturating_duration_since(started) < window {
                tick.want_relay.insert(key);
                return true;
            }
            r.trial = None;
            if !r.trying.is_empty() {
                let next = r.trying.remove(0);
                r.trial = Some((next, now));
                tick.tries.push((key, next));
                tick.want_relay.insert(key);
                return true;
            }
        }
        let Some(at) = relay_at.filter(|_| live) else {
            // The relay went, or the session did: search again.
            self.relayed.remove(&key);
            return false;
        };
        if let Some(e) = peer.endpoint.filter(|e| *e != at) {
            // Roamed off the relay: the other side's try of a direct path reached this one
            // (its authenticated datagrams come straight from there).
            self.relayed.remove(&key);
            self.up.insert(key, (e, now));
            return true;
        }
        r.via = at;
        tick.want_relay.insert(key);
        if now.saturating_duration_since(r.registered) >= REGISTER_EVERY {
            r.registered = now;
            tick.register.push(key);
        }
        let slot = upgrade_slot(wall, own, &key);
        if slot != r.slot {
            r.slot = slot;
            let direct = candidates(&key);
            if !direct.is_empty() {
                if own.as_bytes() < key.as_bytes() {
                    // Where others saw it (last) before what it advertises, which is
                    // what a site behind NAT cannot be reached at.
                    r.trying = direct.into_iter().rev().collect();
                    r.try_at = Some(now + PUNCH_LEAD);
                } else {
                    tick.punches.extend(direct);
                }
            }
        }
        if let Some(at_time) = r.try_at {
            if now >= at_time && !r.trying.is_empty() {
                r.try_at = None;
                let to = r.trying.remove(0);
                r.trial = Some((to, now));
                tick.tries.push((key, to));
            }
        }
        true
    }

    /// Each peer's path now.
    pub fn state(&self, key: &PublicKey) -> Option<PathState> {
        if let Some(r) = self.relayed.get(key) {
            return Some(PathState::Relayed {
                via: r.via,
                since: r.since,
            });
        }
        if let Some((via, since)) = self.up.get(key) {
            return Some(PathState::Up {
                via: *via,
                since: *since,
            });
        }
        self.searches.get(key).map(|s| PathState::Searching {
            since: s.since,
            tried: s.tried,
        })
    }
}

/// The wall-clock slot in which a relayed pair tries a direct path: both sides compute the
/// same (the offset is the pair's), and pairs spread over the slot.
fn upgrade_slot(wall: Duration, own: &PublicKey, peer: &PublicKey) -> u64 {
    let pair = crate::relay::Pair::new(*own, *peer);
    let offset = pair
        .0
        .as_bytes()
        .iter()
        .chain(pair.1.as_bytes())
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(*b)));
    let every = UPGRADE_EVERY.as_millis() as u64;
    (wall.as_millis() as u64 + offset % every) / every
}

/// What this gateway tells the fleet it saw: for each peer with a live session whose
/// datagrams come from an address it does not advertise, that address. Loopback
/// addresses (a TLS transport's bridge) say nothing of where the peer is.
pub fn observations(
    peers: &[PeerNow],
    advertised: impl Fn(&PublicKey) -> Vec<SocketAddr>,
) -> BTreeMap<PublicKey, SocketAddr> {
    peers
        .iter()
        .filter(|p| p.since_handshake.is_some_and(|d| d < SESSION_LIFE))
        .filter_map(|p| Some((p.public_key, p.endpoint?)))
        .filter(|(_, at)| !at.ip().is_loopback() && !at.ip().is_unspecified())
        .filter(|(key, at)| !advertised(key).contains(at))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> PublicKey {
        tunneld_crypto::PrivateKey::generate().public_key()
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn silent(key: PublicKey, at: &str) -> PeerNow {
        PeerNow {
            public_key: key,
            endpoint: Some(addr(at)),
            since_handshake: None,
            rx_bytes: 0,
            tx_bytes: 0,
        }
    }

    /// One peer as the gateway has it: its endpoint follows the moves, as `move_peer` does.
    struct Sim {
        paths: Paths,
        peer: PeerNow,
        t0: Instant,
    }

    impl Sim {
        fn new(at: &str) -> Sim {
            Sim {
                paths: Paths::default(),
                peer: silent(key(), at),
                t0: Instant::now(),
            }
        }

        fn at(&mut self, t: Duration, candidates: &[SocketAddr]) -> Vec<SocketAddr> {
            let moves = self
                .paths
                .tick(self.t0 + t, std::slice::from_ref(&self.peer), |_| {
                    candidates.to_vec()
                });
            for (_, to) in &moves {
                self.peer.endpoint = Some(*to);
            }
            moves.into_iter().map(|(_, to)| to).collect()
        }
    }

    #[test]
    fn a_silent_peer_s_candidates_are_tried_in_turn_then_in_rounds_that_back_off() {
        let both = [addr("198.51.100.2:51820"), addr("192.0.2.61:51820")];
        let mut sim = Sim::new("198.51.100.2:51820");
        let mut at = |t: Duration| sim.at(t, &both);
        assert_eq!(at(Duration::ZERO), vec![both[0]]);
        assert_eq!(at(Duration::from_millis(100)), vec![]);
        assert_eq!(at(ATTEMPT), vec![both[1]]);
        // The round is over: the next one a second later, the one after two.
        assert_eq!(at(ATTEMPT + Duration::from_millis(900)), vec![]);
        let second = ATTEMPT + FIRST_ROUND;
        assert_eq!(at(second), vec![both[0]]);
        assert_eq!(at(second + ATTEMPT), vec![both[1]]);
        assert_eq!(at(second + ATTEMPT + FIRST_ROUND), vec![]);
        assert_eq!(at(second + ATTEMPT + 2 * FIRST_ROUND), vec![both[0]]);
    }

    #[test]
    fn a_new_candidate_starts_a_round_at_once_and_a_handshake_ends_the_search() {
        let first = [addr("198.51.100.2:51820")];
        let mut sim = Sim::new("198.51.100.2:51820");
        assert_eq!(sim.at(Duration::ZERO, &first), vec![first[0]]);
        assert_eq!(sim.at(ATTEMPT, &first), vec![]);
        // Another gateway saw it at its NAT's address.
        let more = [first[0], addr("192.0.2.61:40000")];
        assert_eq!(sim.at(ATTEMPT, &more), vec![more[0]]);
        assert_eq!(sim.at(2 * ATTEMPT, &more), vec![more[1]]);
        sim.peer.since_handshake = Some(Duration::from_millis(5));
        sim.peer.rx_bytes = 92;
        assert_eq!(sim.at(3 * ATTEMPT, &more), vec![]);
        let key = sim.peer.public_key;
        assert_eq!(
            sim.paths.state(&key),
            Some(PathState::Up {
                via: more[1],
                since: sim.t0 + 3 * ATTEMPT
            })
        );
        // Its session gone stale, the search starts over.
        sim.peer.since_handshake = Some(SESSION_LIFE);
        assert_eq!(sim.at(4 * ATTEMPT, &more), vec![more[0]]);
        // A peer the fleet removed is forgotten.
        sim.paths.tick(sim.t0 + 5 * ATTEMPT, &[], |_| more.to_vec());
        assert_eq!(sim.paths.state(&key), None);
    }

    #[test]
    fn a_peer_heard_from_or_roamed_is_not_moved_under_its_handshake() {
        let peer = key();
        let both = vec![addr("198.51.100.2:51820"), addr("192.0.2.61:51820")];
        let mut paths = Paths::default();
        let t0 = Instant::now();
        let mut now = silent(peer, "198.51.100.2:51820");
        assert_eq!(
            paths.tick(t0, std::slice::from_ref(&now), |_| both.clone()),
            vec![(peer, both[0])]
        );
        // Its initiation came in from its NAT: roaming moved it there, not yet answered.
        now.endpoint = Some(addr("192.0.2.61:40000"));
        now.rx_bytes = 148;
        assert!(paths
            .tick(t0 + ATTEMPT, &[now.clone()], |_| both.clone())
            .is_empty());
        // Nothing more heard and no session after a while: the next candidate.
        let later = t0 + 3 * ATTEMPT;
        assert_eq!(
            paths.tick(later, &[now.clone()], |_| both.clone()),
            vec![(peer, both[1])]
        );
    }

    /// A peer with no session whose pair a relay serves goes through it (registering first,
    /// and again until a session stands); once relayed, the lower-keyed side tries the
    /// direct addresses in one slot, seen ones first, and comes back without an answer.
    #[test]
    fn a_relayed_peer_goes_through_its_relay_and_tries_a_direct_path_once_a_slot() {
        let (a, b) = (key(), key());
        let (own, peer) = if a.as_bytes() < b.as_bytes() {
            (a, b)
        } else {
            (b, a)
        };
        let relay = addr("192.0.2.31:40000");
        let direct = vec![addr("198.51.100.2:51820"), addr("192.0.2.61:51820")];
        let mut paths = Paths::default();
        let t0 = Instant::now();
        let wall = Duration::from_secs(1_000_000);
        let mut now = silent(peer, "198.51.100.2:51820");
        let tick = |paths: &mut Paths, t: Duration, p: &PeerNow, served: bool| {
            paths.tick_relayed(
                t0 + t,
                wall + t,
                &own,
                std::slice::from_ref(p),
                |_| direct.clone(),
                |_| served.then_some(relay),
            )
        };
        // No relay yet: the direct search, and after RELAY_AFTER a relay is wanted.
        let first = tick(&mut paths, Duration::ZERO, &now, false);
        assert_eq!(first.moves, vec![(peer, direct[0])]);
        assert!(first.want_relay.is_empty());
        assert!(tick(&mut paths, RELAY_AFTER, &now, false)
            .want_relay
            .contains(&peer));
        // The relay serves the pair: register, move, and again until a session stands.
        let served = tick(&mut paths, RELAY_AFTER, &now, true);
        assert_eq!(
            (served.register, served.moves),
            (vec![peer], vec![(peer, relay)])
        );
        now.endpoint = Some(relay);
        let again = RELAY_AFTER + RELAY_RETRY;
        assert_eq!(
            tick(&mut paths, again, &now, true).moves,
            vec![(peer, relay)]
        );
        now.since_handshake = Some(Duration::from_millis(10));
        now.rx_bytes = 92;
        let relayed = tick(&mut paths, again + ATTEMPT, &now, true);
        assert!(relayed.moves.is_empty() && relayed.want_relay.contains(&peer));
        assert!(matches!(
            paths.state(&peer),
            Some(PathState::Relayed { via, .. }) if via == relay
        ));
        // Within the next slot: a handshake to the seen address, then to the advertised
        // one, none moving the peer off the relay.
        let mut tried = Vec::new();
        let mut t = again + ATTEMPT;
        let handshake_at = again + ATTEMPT - Duration::from_millis(10);
        // One slot starts within UPGRADE_EVERY (where in it depends on the pair).
        while t < again + UPGRADE_EVERY + 2 * TRIAL + ATTEMPT * 4 && tried.len() < 2 {
            t += Duration::from_millis(100);
            now.since_handshake = Some(t - handshake_at);
            let ticked = tick(&mut paths, t, &now, true);
            assert!(ticked.moves.is_empty(), "a try moves nothing");
            tried.extend(ticked.tries.into_iter().map(|(_, to)| to));
        }
        assert_eq!(tried, vec![direct[1], direct[0]]);
        for _ in 0..15 {
            t += Duration::from_millis(100);
            now.since_handshake = Some(t - handshake_at);
            tick(&mut paths, t, &now, true);
        }
        assert!(matches!(
            paths.state(&peer),
            Some(PathState::Relayed { .. })
        ));
        // The other side's try reached this one: its datagrams come straight from it.
        now.endpoint = Some(direct[1]);
        tick(&mut paths, t + ATTEMPT, &now, true);
        assert!(matches!(
            paths.state(&peer),
            Some(PathState::Up { via, .. }) if via == direct[1]
        ));
    }

    /// A path that dies under a live session (nothing heard for `SILENT_AFTER` while this
    /// side kept sending) is searched again; a peer that is only idle (nothing sent) is not.
    #[test]
    fn a_peer_silent_while_sent_to_is_searched_again_and_an_idle_one_is_not() {
        let both = vec![addr("198.51.100.2:51820"), addr("192.0.2.61:51820")];
        let mut paths = Paths::default();
        let t0 = Instant::now();
        let (dead, idle) = (key(), key());
        let live = |k, at: &str| PeerNow {
            public_key: k,
            endpoint: Some(addr(at)),
            since_handshake: Some(Duration::from_secs(1)),
            rx_bytes: 500,
            tx_bytes: 500,
        };
        let (mut d, i) = (
            live(dead, "192.0.2.61:51820"),
            live(idle, "192.0.2.62:51820"),
        );
        assert!(paths
            .tick(t0, &[d.clone(), i.clone()], |_| both.clone())
            .is_empty());
        // Keepalives go out to `dead`, nothing comes back.
        d.tx_bytes += 10 * 32;
        let early = t0 + SILENT_AFTER - Duration::from_secs(1);
        assert!(paths
            .tick(early, &[d.clone(), i.clone()], |_| both.clone())
            .is_empty());
        let moves = paths.tick(t0 + SILENT_AFTER, &[d.clone(), i.clone()], |_| both.clone());
        assert_eq!(moves, vec![(dead, both[0])]);
        assert!(matches!(
            paths.state(&dead),
            Some(PathState::Searching { .. })
        ));
        assert!(matches!(paths.state(&idle), Some(PathState::Up { .. })));
        // Heard from again (its handshake on the new path): up.
        d.rx_bytes += 92;
        d.endpoint = Some(both[0]);
        let later = t0 + SILENT_AFTER + ATTEMPT;
        assert!(paths.tick(later, &[d, i], |_| both.clone()).is_empty());
        assert!(matches!(paths.state(&dead), Some(PathState::Up { .. })));
    }

    #[test]
    fn only_addresses_a_peer_does_not_advertise_are_told() {
        let (natted, public, bridged, silent_one) = (key(), key(), key(), key());
        let live = |k, at: &str| PeerNow {
            public_key: k,
            endpoint: Some(addr(at)),
            since_handshake: Some(Duration::from_secs(3)),
            rx_bytes: 92,
            tx_bytes: 92,
        };
        let peers = [
            live(natted, "192.0.2.61:40000"),
            live(public, "192.0.2.21:51820"),
            live(bridged, "127.0.0.1:40999"),
            silent(silent_one, "192.0.2.70:51820"),
        ];
        let advertised = |k: &PublicKey| {
            if *k == public {
                vec![addr("192.0.2.21:51820")]
            } else {
                vec![addr("198.51.100.2:51820")]
            }
        };
        let told = observations(&peers, advertised);
        assert_eq!(told, BTreeMap::from([(natted, addr("192.0.2.61:40000"))]));
    }
}
