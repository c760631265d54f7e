//! The WireGuard device: one interface's key, its peers, and allowed-IPs routing.
//!
//! All input comes through four calls: [`Device::encapsulate`] (a packet from the overlay),
//! [`Device::decapsulate`] (a datagram from the underlay), [`Device::tick`] (timers) and
//! [`Device::apply`] (a UAPI `set`). Output goes into the caller's sinks.

use crate::allowed_ips::AllowedIps;
use crate::noise::cookie::{CookieJar, CookieSecret};
use crate::noise::handshake::{consume_initiation, HandshakeError, ReceivedInitiation};
use crate::noise::sessions::REKEY_TIMEOUT;
use crate::noise::{self, Local, Opened, Sent, Sessions, Timer};
use crate::packet::{self, flow_hash, padded_len};
use crate::peer::Peer;
use crate::ratelimit::{FairShare, RateLimiter};
use crate::sink::{DatagramSink, PacketSink};
use crate::stats::{DropReason, Stats};
use crate::uapi::{DeviceSnapshot, PeerSnapshot, PeerUpdate, SetRequest, UapiError};
use crate::wire::{self, Handshake, Message};
use ipnet::IpNet;
use rand_core::{CryptoRngCore, SeedableRng};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};
use tunneld_crypto::{PresharedKey, PrivateKey, PublicKey};

/// Under load, a handshake message needs a valid mac2 (a cookie proving its source address),
/// else it gets a cookie reply, and its source's budget (`ratelimit.rs`). A cookie reply makes
/// its initiator wait its whole retransmission time, so the device is under load only when it
/// could not answer a new initiation within that anyway: when the datagrams queued ahead of
/// it (the receive queue the I/O below reports, [`Device::note_backlog`]) at the measured time
/// per handshake would take longer than this, or when handshakes from unproven addresses have
/// spent the device's work budget (`WORK_SHARE`). Four fifths of `REKEY_TIMEOUT` leaves room
/// for the reply's way back and the estimate's error.
const WAIT_LIMIT: Duration = Duration::from_secs(4);
/// The work budget: handshakes without a cookie may take this share of the device's time in
/// the long run, after a burst of `WORK_BURST`. A sustained flood from spoofed addresses,
/// which cannot return a cookie, so costs at most this share; the rest of it gets cookie
/// replies, which cost little.
const WORK_SHARE: f64 = 0.25;
/// The budget's burst: a restart storm the device can answer within a retransmission time
/// is at most that much work, so it fits.
const WORK_BURST: Duration = REKEY_TIMEOUT;
/// Where the I/O reports no backlog, a device cannot tell a burst from a queue: more than this
/// many handshake messages in one turn (one `now`), one full batch of them, puts it under load.
const HANDSHAKE_SLICE: u32 = 64;
/// A receive queue this full (in quarters) drops what comes next: under load whatever the
/// estimate says, so that a flood of spoofed initiations cannot keep the device doing
/// Diffie-Hellman while the kernel throws away what it cannot queue.
const QUEUE_FULL_QUARTERS: usize = 3;
/// What one queued datagram takes of a receive queue: the kernel charges a small datagram's
/// whole buffer (832 bytes on Linux 6.x for a handshake message). A lower figure counts more
/// datagrams, so the estimate errs toward cookies.
const QUEUED_BYTES_PER_DATAGRAM: usize = 768;
/// The time per handshake message before any is measured (a restarted hub meets its storm
/// first): above what one takes on a server core, so that a first flood is not let through.
const INITIAL_COST: Duration = Duration::from_micros(300);
/// Bounds of a measured time per handshake message: a turn's time also holds other work
/// (data, timers, the scheduler's delays), so a sample is clamped before it is averaged.
const MIN_COST: Duration = Duration::from_micros(5);
const MAX_COST: Duration = Duration::from_millis(100);
/// Handshake messages of a turn that make its measure weigh half (a full batch of them).
const BATCH_WEIGHT: u32 = 64;
/// How long the device stays under load after the last sign of overload (the kernel's
/// second), so that the cookies it gave out are asked for when they come back.
const UNDER_LOAD_AFTER: Duration = Duration::from_secs(1);
/// Peer slots must fit in the 24 high bits of a receiver index (a session uses the low 8).
const MAX_PEERS: usize = 1 << 24;

/// Settings of the interface itself.
#[derive(Debug, Clone)]
pub struct DeviceSettings {
    pub private_key: PrivateKey,
    pub listen_port: u16,
    pub mtu: u16,
    pub fwmark: u32,
}

/// Settings of one peer, as the config file gives them. Made by [`PeerSettings::new`]
/// with the defaults below and changed with its methods (or its fields); `#[non_exhaustive]`,
/// so a field added later is no breaking change.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerSettings {
    /// The peer's WireGuard public key: who it is. Required.
    pub public_key: PublicKey,
    /// A preshared key mixed into the handshake (post-quantum hedge), as `wg genpsk`
    /// makes. Default none.
    pub preshared_key: Option<PresharedKey>,
    /// Where the peer's WireGuard listens. Default none: the peer is reached once it has
    /// sent a handshake (its endpoint is learnt, and updated as it roams).
    pub endpoint: Option<SocketAddr>,
    /// The prefixes routed to the peer and accepted from it (cryptokey routing). Default
    /// none: nothing is routed to it, and nothing it sends is accepted.
    pub allowed_ips: Vec<IpNet>,
    /// Prefixes shared with the other peers that share them too (ECMP): an outgoing packet
    /// to one goes to one of those peers, chosen by a hash of its flow (a flow stays on one
    /// peer), and a packet from any of them with its source in it is accepted. Only the
    /// library's peer operations set them (the UAPI text and config files cannot): an
    /// allowed IP claimed for one peer takes the prefix from all of them, as WireGuard
    /// moves an allowed IP. Default none.
    pub shared_ips: Vec<IpNet>,
    /// Seconds between keepalives when nothing else is sent (0: off), to keep a NAT
    /// mapping open. Default 0.
    pub persistent_keepalive: u16,
    /// How many standard WireGuard sessions carry this peer (`parallel = K`): sub-tunnel `j`
    /// is carried by worker `j` (see [`owner_of`]). Default 1: a plain peer.
    pub parallel: u8,
}

impl PeerSettings {
    /// A peer with only its key: no preshared key, no endpoint (it is learnt from the
    /// peer's first handshake), no allowed IPs, no keepalive, one session (`parallel = 1`).
    /// The methods below set the rest.
    ///
    /// ```
    /// # let key = tunneld_crypto::PrivateKey::generate().public_key();
    /// let peer = tunneld_wireguard::PeerSettings::new(key)
    ///     .endpoint("192.0.2.2:51820".parse().unwrap())
    ///     .allowed_ip("10.77.0.0/24".parse().unwrap())
    ///     .persistent_keepalive(25);
    /// assert_eq!(peer.allowed_ips.len(), 1);
    /// ```
    pub fn new(public_key: PublicKey) -> PeerSettings {
        PeerSettings {
            public_key,
            preshared_key: None,
            endpoint: None,
            allowed_ips: Vec::new(),
            shared_ips: Vec::new(),
            persistent_keepalive: 0,
            parallel: 1,
        }
    }

    /// Sets the preshared key.
    pub fn preshared_key(mut self, key: PresharedKey) -> PeerSettings {
        self.preshared_key = Some(key);
        self
    }

    /// Sets where the peer is reached.
    pub fn endpoint(mut self, endpoint: SocketAddr) -> PeerSettings {
        self.endpoint = Some(endpoint);
        self
    }

    /// Adds an allowed IP (a prefix routed to the peer and accepted from it).
    pub fn allowed_ip(mut self, net: IpNet) -> PeerSettings {
        self.allowed_ips.push(net);
        self
    }

    /// Sets the keepalive interval in seconds (0: off).
    pub fn persistent_keepalive(mut self, seconds: u16) -> PeerSettings {
        self.persistent_keepalive = seconds;
        self
    }

    /// Replaces the allowed IPs.
    pub fn allowed_ips(mut self, nets: impl IntoIterator<Item = IpNet>) -> PeerSettings {
        self.allowed_ips = nets.into_iter().collect();
        self
    }

    /// Replaces the prefixes shared with other peers (see the field).
    pub fn shared_ips(mut self, nets: impl IntoIterator<Item = IpNet>) -> PeerSettings {
        self.shared_ips = nets.into_iter().collect();
        self
    }

    /// Sets how many WireGuard sessions carry the peer (`parallel = K`; 1: a plain peer).
    pub fn parallel(mut self, sessions: u8) -> PeerSettings {
        self.parallel = sessions;
        self
    }
}

/// A change to a running peer: what the gateway's `Gateway::update_peer` and the
/// user-space `Tunnel::update_peer` take (re-exported as `tunneld::PeerChange` and
/// `tunneld_userspace::PeerChange`). `None` leaves a setting as it is; the peer keeps its
/// session (a new preshared key starts a new one). Applied as a UAPI `set` of that peer
/// alone (`PeerUpdate::from`).
///
/// ```
/// # let key = tunneld_crypto::PrivateKey::generate().public_key();
/// let change = tunneld_wireguard::PeerChange::new(key)
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
    /// Where to send its datagrams from now on (a peer also moves by itself when its
    /// authenticated datagrams come from elsewhere).
    pub endpoint: Option<SocketAddr>,
    /// Replaces every allowed IP (the gateway's routes follow; the user-space tunnel resets
    /// connections to addresses it no longer routes).
    pub allowed_ips: Option<Vec<IpNet>>,
    /// Replaces every prefix shared with other peers ([`PeerSettings::shared_ips`]).
    pub shared_ips: Option<Vec<IpNet>>,
    /// Seconds; 0 turns it off.
    pub persistent_keepalive: Option<u16>,
    /// `Some(None)` removes the preshared key. A new key starts a new session at once.
    pub preshared_key: Option<Option<PresharedKey>>,
}

impl PeerChange {
    /// A change to the peer `public_key` that changes nothing yet.
    pub fn new(public_key: PublicKey) -> PeerChange {
        PeerChange {
            public_key,
            endpoint: None,
            allowed_ips: None,
            shared_ips: None,
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
    pub fn allowed_ips(mut self, allowed_ips: Vec<IpNet>) -> PeerChange {
        self.allowed_ips = Some(allowed_ips);
        self
    }

    /// Sets the new shared prefixes (replacing all of them).
    pub fn shared_ips(mut self, shared_ips: Vec<IpNet>) -> PeerChange {
        self.shared_ips = Some(shared_ips);
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

    /// The change that makes a peer set as `have` into one set as `want` (the same key),
    /// naming only what differs; `None` when nothing does. `parallel` is not a change, and
    /// neither is an endpoint `want` lacks (a peer's endpoint is kept, as WireGuard does).
    ///
    /// ```
    /// # use tunneld_wireguard::{PeerChange, PeerSettings};
    /// # let key = tunneld_crypto::PrivateKey::generate().public_key();
    /// let have = PeerSettings::new(key).persistent_keepalive(25);
    /// let want = have.clone().endpoint("192.0.2.9:51820".parse().unwrap());
    /// let change = PeerChange::between(&have, &want).unwrap();
    /// assert_eq!(change.endpoint, want.endpoint);
    /// assert_eq!(change.persistent_keepalive, None);
    /// assert!(PeerChange::between(&want, &want).is_none());
    /// ```
    pub fn between(have: &PeerSettings, want: &PeerSettings) -> Option<PeerChange> {
        let mut change = PeerChange::new(want.public_key);
        if have.endpoint != want.endpoint {
            change.endpoint = want.endpoint;
        }
        if have.allowed_ips != want.allowed_ips {
            change.allowed_ips = Some(want.allowed_ips.clone());
        }
        if have.shared_ips != want.shared_ips {
            change.shared_ips = Some(want.shared_ips.clone());
        }
        if have.persistent_keepalive != want.persistent_keepalive {
            change.persistent_keepalive = Some(want.persistent_keepalive);
        }
        if have.preshared_key != want.preshared_key {
            change.preshared_key = Some(want.preshared_key.clone());
        }
        (change != PeerChange::new(want.public_key)).then_some(change)
    }
}

impl From<PeerChange> for PeerUpdate {
    /// The `set` of an existing peer (`update_only`) that makes `change`.
    fn from(change: PeerChange) -> PeerUpdate {
        let mut update = PeerUpdate::new(change.public_key);
        update.update_only = true;
        update.preshared_key = change.preshared_key;
        update.endpoint = change.endpoint;
        update.persistent_keepalive = change.persistent_keepalive;
        if let Some(allowed_ips) = change.allowed_ips {
            update.replace_allowed_ips = true;
            update.allowed_ips = allowed_ips;
        }
        update.shared_ips = change.shared_ips;
        update
    }
}

/// What a device takes from outside the protocol: randomness (ephemeral keys, receiver
/// indices, cookie secrets and nonces, retry jitter) and the wall-clock time (the anchor of
/// handshake timestamps, which must keep rising across restarts). The core reads neither
/// itself, so a caller that passes a seeded generator and a fixed time gets a run that
/// replays exactly (the pair harness does).
pub struct Environment {
    rng: Box<dyn CryptoRngCore + Send>,
    unix_now: Duration,
    cookie_secret: Option<CookieSecret>,
}

impl Environment {
    /// `rng` must be a cryptographically secure generator (`rand_core::OsRng` in
    /// production); `unix_now` is the wall-clock time since the Unix epoch at the `now`
    /// given with it to the device.
    pub fn new(rng: impl CryptoRngCore + Send + 'static, unix_now: Duration) -> Self {
        Environment {
            rng: Box::new(rng),
            unix_now,
            cookie_secret: None,
        }
    }

    /// The cookie secret the device makes cookies with, shared with the interface's other
    /// workers so that each honours the cookies the others give out. Without it a device
    /// makes a secret of its own (fine for a single worker).
    pub fn with_cookie_secret(mut self, secret: CookieSecret) -> Self {
        self.cookie_secret = Some(secret);
        self
    }

    /// A deterministic environment for tests and simulations: ChaCha20 seeded from `seed`.
    /// Never use it for a real tunnel: anyone who knows the seed knows every key.
    pub fn seeded(seed: u64, unix_now: Duration) -> Self {
        Environment::new(rand_chacha::ChaCha20Rng::seed_from_u64(seed), unix_now)
    }
}

impl std::fmt::Debug for Environment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Environment")
            .field("unix_now", &self.unix_now)
            .finish_non_exhaustive()
    }
}

/// What [`Device::sync`] changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    pub key_changed: bool,
    pub added: usize,
    pub removed: usize,
    /// Peers whose settings changed with their session kept.
    pub changed: usize,
    /// Peers whose session starts over: a new preshared key or `parallel`.
    pub restarted: Vec<PublicKey>,
}

/// What became of a packet or datagram given to the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Handled here: sent, delivered, answered, or counted as a drop.
    Done,
    /// It belongs to a session that another worker carries (an initiation for it, or a
    /// message naming its receiver index): hand it, unchanged, to that worker. A device made
    /// with [`Device::new`] (one worker) never says this.
    HandOff(usize),
    /// A packet whose flow is on a sub-tunnel with no session (not yet, or never, when the
    /// other side does not split the peer): hand it to this worker, which carries the
    /// peer's sub-tunnel 0, for [`Device::encapsulate_on_first`].
    HandOffToFirst(usize),
}

/// The worker of `workers` that carries sub-tunnel `sub` of a peer split into `parallel`
/// sub-tunnels. A plain peer's worker comes from its public key (which is uniformly
/// random), spreading many peers over the workers; sub-tunnel `j` of a split peer is on
/// worker `j`, so a link's K sub-tunnels use K different workers.
pub fn owner_of(key: &PublicKey, parallel: u8, sub: u8, workers: usize) -> usize {
    let workers = workers.max(1);
    if parallel <= 1 {
        let b = key.as_bytes();
        u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize % workers
    } else {
        usize::from(sub) % workers
    }
}

/// Whether the device is under load: see `WAIT_LIMIT`. A turn is the handling of datagrams
/// read at one `now`; the time from a busy turn's start to the next one's, over the handshake
/// messages it handled, measures what one costs.
#[derive(Debug)]
struct Load {
    /// Under load until then.
    until: Option<Instant>,
    /// The I/O below reports its backlog (`Device::note_backlog`).
    reported: bool,
    turn: Option<Instant>,
    /// Handshake messages handled in full (admitted, or handed over admitted) this turn.
    handled: u32,
    /// Handshake messages with a valid mac1 seen this turn, cookied or not (the rule where
    /// no backlog is reported).
    seen: u32,
    /// A backlog waited behind this turn, so the next one followed at once.
    busy: bool,
    /// Datagrams waiting in the receive queue at this turn's last report.
    queued: usize,
    /// The measured time per handshake message, a moving average of busy turns.
    cost: Duration,
    /// What is left of the work budget (`WORK_SHARE`), in seconds of handshakes, and when it
    /// was last topped up.
    budget: f64,
    budget_at: Option<Instant>,
}

impl Default for Load {
    fn default() -> Load {
        Load {
            until: None,
            reported: false,
            turn: None,
            handled: 0,
            seen: 0,
            busy: false,
            queued: 0,
            cost: INITIAL_COST,
            budget: WORK_BURST.as_secs_f64(),
            budget_at: None,
        }
    }
}

impl Load {
    /// Starts the turn of `now` if it is a new one, measuring the one before if it was busy.
    fn enter(&mut self, now: Instant) {
        if self.turn == Some(now) {
            return;
        }
        if let Some(before) = self.turn {
            // Without backlog reports a turn's length says nothing of its work.
            if self.reported && self.busy && self.handled > 0 {
                let sample = now.saturating_duration_since(before) / self.handled;
                let sample = sample.clamp(MIN_COST, MAX_COST);
                // A turn of a full batch of handshakes weighs half, one of a few little: the
                // measure follows a storm within a few turns, and a turn that was slow for
                // other reasons (preempted, data) moves it little.
                let weight = self.handled.min(BATCH_WEIGHT);
                self.cost = (self.cost * (2 * BATCH_WEIGHT - weight) + sample * weight)
                    / (2 * BATCH_WEIGHT);
            }
        }
        self.turn = Some(now);
        self.handled = 0;
        self.seen = 0;
        self.busy = false;
        self.queued = 0;
    }

    /// How long a datagram arriving now would wait for those queued ahead of it.
    fn predicted_wait(&self) -> Duration {
        self.cost
            .saturating_mul(u32::try_from(self.queued).unwrap_or(u32::MAX))
    }

    /// The work budget at `now`, topped up for the time since it last was.
    fn budget(&mut self, now: Instant) -> f64 {
        if let Some(at) = self.budget_at {
            let earned = now.saturating_duration_since(at).as_secs_f64() * WORK_SHARE;
            self.budget = (self.budget + earned).min(WORK_BURST.as_secs_f64());
        }
        self.budget_at = Some(now);
        self.budget
    }

    /// Whether a handshake message at `now` needs a mac2.
    fn demands_cookie(&mut self, now: Instant) -> bool {
        self.enter(now);
        self.seen = self.seen.saturating_add(1);
        if self.reported {
            // Only while the wait is over the limit: once cookies (cheap) have drained the
            // excess, the rest of the queue is answered. Holding on for a second would give
            // the whole queue a cookie.
            if self.predicted_wait() > WAIT_LIMIT {
                return true;
            }
        } else if self.seen > HANDSHAKE_SLICE {
            self.until = Some(now + UNDER_LOAD_AFTER);
        }
        if self.until.is_some_and(|until| now < until) {
            return true;
        }
        self.budget(now) < self.cost.as_secs_f64()
    }

    /// Counts one handshake message handled in full at `now`, and charges it to the budget
    /// (one with a cookie too: it is work done, though it is never refused for want of it).
    fn handled(&mut self, now: Instant) {
        self.enter(now);
        self.handled = self.handled.saturating_add(1);
        let cost = self.cost.as_secs_f64();
        self.budget = (self.budget(now) - cost).max(0.0);
    }

    fn note_backlog(&mut self, queued: usize, capacity: usize, now: Instant) {
        self.enter(now);
        self.reported = true;
        self.busy |= queued > 0;
        self.queued = queued / QUEUED_BYTES_PER_DATAGRAM;
        let nearly_full = capacity > 0
            && queued.saturating_mul(4) >= capacity.saturating_mul(QUEUE_FULL_QUARTERS);
        if nearly_full {
            self.until = Some(now + UNDER_LOAD_AFTER);
        }
    }

    /// Handshake messages the device can handle in `window`, at the measured cost.
    fn capacity(&self, window: Duration) -> f64 {
        window.as_secs_f64() / self.cost.as_secs_f64()
    }
}

/// What a prefix routes to: one peer (WireGuard's allowed IP) or a group of peers sharing
/// it (`PeerSettings::shared_ips`). Indices into `Device::peers` and `Device::groups`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Peer(usize),
    Group(usize),
}

/// The peers sharing one prefix, each with the seed its weight in a flow's choice comes from.
#[derive(Debug)]
struct Group {
    members: Vec<(usize, u64)>,
}

impl Group {
    /// The member that carries a flow of hash `flow`: the highest weight (rendezvous
    /// hashing). Weights come from the flow and the member's key only, so every worker and
    /// every device with the same members chooses alike, and a member's leaving moves only
    /// its own flows (each other flow's highest weight is still there).
    fn choose(&self, flow: u32) -> Option<usize> {
        if let [(only, _)] = self.members[..] {
            return Some(only);
        }
        self.members
            .iter()
            .max_by_key(|(_, seed)| member_weight(flow, *seed))
            .map(|(slot, _)| *slot)
    }

    fn has(&self, slot: usize) -> bool {
        self.members.iter().any(|(s, _)| *s == slot)
    }
}

/// A member's seed: a peer's public key is uniformly random, so its first bytes do.
fn member_seed(key: &PublicKey) -> u64 {
    let b = key.as_bytes();
    u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

/// The weight of a member of seed `seed` for a flow of hash `flow` (MurmurHash3's final mix
/// of the two, so that every bit of both moves the result).
fn member_weight(flow: u32, seed: u64) -> u64 {
    let mut h = seed ^ u64::from(flow).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h = (h ^ (h >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
    h = (h ^ (h >> 33)).wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

pub struct Device {
    private_key: PrivateKey,
    local: Local,
    listen_port: u16,
    mtu: u16,
    fwmark: u32,
    /// Peer slots; a slot's index is the high 24 bits of its receiver indices.
    peers: Vec<Option<Peer>>,
    /// Places in `peers` left empty by a removal, for the next peer added.
    free: Vec<usize>,
    by_key: HashMap<PublicKey, usize>,
    /// Peer `i` (its place in `peers`) uses slot `i * slot_stride + slot_offset` in its
    /// receiver indices: see `for_worker`.
    slot_stride: usize,
    slot_offset: usize,
    routes: AllowedIps<Route>,
    /// The groups `Route::Group` names; `None`: a place free for the next.
    groups: Vec<Option<Group>>,
    /// TCP SYNs crossing the tunnel get their MSS lowered to this (IPv4, IPv6), if set.
    clamp_mss: Option<(u16, u16)>,
    /// A device that only checks requests (`Device::checker`): peers get no static secret.
    checking: bool,
    cookies: CookieJar,
    /// Per-source handshake budgets, asked under load.
    limiter: RateLimiter,
    /// Per-source shares of the device's handshake capacity, asked when not under load.
    shares: FairShare,
    load: Load,
    stats: Stats,
    rng: Box<dyn CryptoRngCore + Send>,
    /// The wall clock at `started` (from the `Environment`), for a new key's timestamps.
    unix_at_start: Duration,
    started: Instant,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Keys stay out of debug output; the public key identifies the device.
        f.debug_struct("Device")
            .field("public_key", &self.public_key())
            .field("listen_port", &self.listen_port)
            .field("peers", &self.by_key.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Device {
    pub fn new(
        settings: DeviceSettings,
        peers: Vec<PeerSettings>,
        now: Instant,
        environment: Environment,
    ) -> Self {
        Device::for_worker(settings, peers, now, 0, 1, environment)
    }

    /// A device that only checks `set` requests (`apply`) and reports what they would make
    /// (`snapshot`), and never handshakes: its peers get no static Diffie-Hellman, the most
    /// of a set's cost, and a low-order key is refused as [`Device::new`]'s would be. The
    /// bare mode checks requests on one before the workers apply them.
    pub fn checker(settings: DeviceSettings, now: Instant, environment: Environment) -> Self {
        let mut device = Device::new(settings, Vec::new(), now, environment);
        device.checking = true;
        device
    }

    /// A device for worker `worker` of `workers`: the receiver indices it hands out name a
    /// slot `s` with `s % workers == worker`, so that a datagram's index says which worker
    /// owns its session (the reuseport steering program reads exactly that), and indices of
    /// other workers are unknown here.
    pub fn for_worker(
        settings: DeviceSettings,
        peers: Vec<PeerSettings>,
        now: Instant,
        worker: usize,
        workers: usize,
        environment: Environment,
    ) -> Self {
        let workers = workers.max(1);
        let Environment {
            mut rng,
            unix_now,
            cookie_secret,
        } = environment;
        let cookies = match cookie_secret {
            Some(secret) => CookieJar::shared(secret),
            None => CookieJar::new(&mut *rng),
        };
        let mut device = Self {
            local: Local::new(*settings.private_key.as_bytes(), now, unix_now),
            private_key: settings.private_key,
            listen_port: settings.listen_port,
            mtu: settings.mtu,
            fwmark: settings.fwmark,
            peers: Vec::new(),
            free: Vec::new(),
            by_key: HashMap::new(),
            routes: AllowedIps::new(),
            groups: Vec::new(),
            clamp_mss: None,
            checking: false,
            cookies,
            limiter: RateLimiter::default(),
            shares: FairShare::default(),
            load: Load::default(),
            stats: Stats::default(),
            rng,
            unix_at_start: unix_now,
            started: now,
            slot_stride: workers,
            slot_offset: worker % workers,
        };
        for p in peers {
            // Config validation already refused duplicates and the slot space is 2^24.
            let _ = device.insert_peer(p);
        }
        device
    }

    /// Adds a peer with all its settings (added first, so that it gets its share of
    /// sub-tunnels, then configured).
    fn insert_peer(&mut self, p: PeerSettings) -> Result<(), UapiError> {
        self.add_peer(p.public_key, p.parallel)?;
        self.update_peer(PeerUpdate {
            public_key: p.public_key,
            remove: false,
            update_only: false,
            preshared_key: Some(p.preshared_key),
            endpoint: p.endpoint,
            persistent_keepalive: Some(p.persistent_keepalive),
            replace_allowed_ips: true,
            allowed_ips: p.allowed_ips,
            shared_ips: Some(p.shared_ips),
        })
    }

    /// Makes the device's key and peers what a reloaded config says (`wanted`), keeping the
    /// session of every peer whose keys did not change: peers missing from `wanted` go,
    /// new ones come, and the rest change only what differs. An endpoint is set only where
    /// the config's changed since `previous` (what was applied last), so a peer that roamed
    /// stays where it roamed to.
    pub fn sync(
        &mut self,
        private_key: PrivateKey,
        wanted: &[PeerSettings],
        previous: &[PeerSettings],
        now: Instant,
    ) -> SyncReport {
        let mut report = SyncReport::default();
        if private_key != self.private_key {
            self.set_private_key(private_key, now);
            report.key_changed = true;
        }
        let wanted_keys: std::collections::HashSet<&PublicKey> =
            wanted.iter().map(|p| &p.public_key).collect();
        let previous: HashMap<&PublicKey, &PeerSettings> =
            previous.iter().map(|p| (&p.public_key, p)).collect();
        let gone: Vec<PublicKey> = self
            .by_key
            .keys()
            .filter(|k| !wanted_keys.contains(k))
            .copied()
            .collect();
        for key in gone {
            self.remove_peer(&key);
            report.removed += 1;
        }
        let max_parallel = u8::try_from(self.slot_stride).unwrap_or(u8::MAX);
        for p in wanted {
            let live = self
                .by_key
                .get(&p.public_key)
                .and_then(|&s| self.peers[s].as_ref());
            let Some(live) = live else {
                if self.insert_peer(p.clone()).is_ok() {
                    report.added += 1;
                }
                continue;
            };
            if live.parallel != p.parallel.clamp(1, max_parallel) {
                // Its sub-tunnels' places and keys change: a new peer in effect.
                self.remove_peer(&p.public_key);
                if self.insert_peer(p.clone()).is_ok() {
                    report.restarted.push(p.public_key);
                }
                continue;
            }
            let before = previous.get(&p.public_key);
            let endpoint = p
                .endpoint
                .filter(|e| before.is_none_or(|b| b.endpoint != Some(*e)));
            let mut allowed: Vec<IpNet> = p.allowed_ips.iter().map(IpNet::trunc).collect();
            allowed.sort_unstable();
            allowed.dedup();
            let mut live_allowed = live.allowed_ips.clone();
            live_allowed.sort_unstable();
            let new_psk = live.preshared_key != p.preshared_key;
            let new_allowed = live_allowed != allowed;
            let mut shared: Vec<IpNet> = p.shared_ips.iter().map(IpNet::trunc).collect();
            shared.sort_unstable();
            shared.dedup();
            let mut live_shared = live.shared_ips.clone();
            live_shared.sort_unstable();
            let new_shared = live_shared != shared;
            let new_keepalive = live.persistent_keepalive != p.persistent_keepalive;
            if !(new_psk || new_allowed || new_shared || new_keepalive || endpoint.is_some()) {
                continue;
            }
            let _ = self.update_peer(PeerUpdate {
                public_key: p.public_key,
                remove: false,
                update_only: true,
                preshared_key: Some(p.preshared_key.clone()),
                endpoint,
                persistent_keepalive: Some(p.persistent_keepalive),
                replace_allowed_ips: new_allowed,
                allowed_ips: if new_allowed { allowed } else { Vec::new() },
                shared_ips: new_shared.then_some(shared),
            });
            if new_psk {
                // A new key takes effect at once, in a new session, rather than at the next
                // rekey up to two minutes later: a mistyped key shows when it is made.
                report.restarted.push(p.public_key);
            } else {
                report.changed += 1;
            }
        }
        report
    }

    pub fn public_key(&self) -> PublicKey {
        self.private_key.public_key()
    }
    pub fn listen_port(&self) -> u16 {
        self.listen_port
    }
    /// Records the port the socket actually bound (when the config asked for any port).
    pub fn set_listen_port(&mut self, port: u16) {
        self.listen_port = port;
    }
    pub fn mtu(&self) -> u16 {
        self.mtu
    }
    /// Lowers the MSS of TCP SYNs crossing the tunnel, both ways, to at most `mss` (IPv4,
    /// IPv6; [`packet::mss_for_mtu`] of the tunnel's MTU for `clamp_mss = "auto"`), inline
    /// before encryption and after decryption; `None` leaves them alone.
    pub fn set_clamp_mss(&mut self, mss: Option<(u16, u16)>) {
        self.clamp_mss = mss;
    }
    pub fn clamp_mss(&self) -> Option<(u16, u16)> {
        self.clamp_mss
    }
    pub fn stats(&self) -> &Stats {
        &self.stats
    }
    /// For the worker, which counts its hand-offs with the device's counters.
    pub fn stats_mut(&mut self) -> &mut Stats {
        &mut self.stats
    }
    pub fn peer_count(&self) -> usize {
        self.by_key.len()
    }
    /// The peers whose sessions this worker carries, with the sub-tunnel of a split one.
    pub fn carried(&self) -> Vec<(PublicKey, Option<u8>)> {
        self.peers
            .iter()
            .flatten()
            .filter(|p| p.owned)
            .map(|p| (p.public_key, (p.parallel > 1).then_some(p.sub)))
            .collect()
    }

    /// The worker that must handle `peer`'s sub-tunnel `sub` (any number: taken modulo the
    /// peer's sub-tunnels) when it is not this one.
    fn elsewhere(&self, peer: &Peer, sub: usize) -> Option<usize> {
        let sub = (sub % usize::from(peer.parallel.max(1))) as u8;
        let owner = owner_of(&peer.public_key, peer.parallel, sub, self.slot_stride);
        (owner != self.slot_offset).then_some(owner)
    }

    /// Every prefix some peer is allowed, i.e. the routes the interface needs.
    pub fn routes(&self) -> Vec<IpNet> {
        self.routes.iter().map(|(net, _)| net).collect()
    }

    /// The peer whose allowed IPs route `ip` (the longest prefix), if any; for a shared
    /// prefix, the member that carries flows of hash `flow_hash(…)` 0 (the hash of a packet
    /// with no ports).
    pub fn peer_for(&self, ip: IpAddr) -> Option<PublicKey> {
        let slot = match *self.routes.lookup(ip)? {
            Route::Peer(slot) => slot,
            Route::Group(g) => self.groups.get(g)?.as_ref()?.choose(0)?,
        };
        Some(self.peers.get(slot)?.as_ref()?.public_key)
    }

    /// The peer that carries `packet` (an IP packet to send): [`Device::peer_for`] its
    /// destination, a shared prefix's member chosen by the packet's flow.
    pub fn peer_for_packet(&self, packet: &[u8]) -> Option<PublicKey> {
        let dst = packet::destination(packet)?;
        let slot = match *self.routes.lookup(dst)? {
            Route::Peer(slot) => slot,
            Route::Group(g) => self.groups.get(g)?.as_ref()?.choose(flow_hash(packet))?,
        };
        Some(self.peers.get(slot)?.as_ref()?.public_key)
    }

    /// Encrypts one IP packet read from the overlay and queues the datagram in `out`.
    ///
    /// `frame` is the packet's whole buffer: the packet is its first `len` bytes and the rest
    /// is room for padding, so padding needs no copy.
    pub fn encapsulate(
        &mut self,
        frame: &mut [u8],
        len: usize,
        now: Instant,
        out: &mut impl DatagramSink,
    ) -> Disposition {
        self.encapsulate_on(frame, len, now, out, false)
    }

    /// [`Device::encapsulate`] over the peer's sub-tunnel 0, whatever the flow: for a packet
    /// handed over with [`Disposition::HandOffToFirst`].
    pub fn encapsulate_on_first(
        &mut self,
        frame: &mut [u8],
        len: usize,
        now: Instant,
        out: &mut impl DatagramSink,
    ) -> Disposition {
        self.encapsulate_on(frame, len, now, out, true)
    }

    fn encapsulate_on(
        &mut self,
        frame: &mut [u8],
        len: usize,
        now: Instant,
        out: &mut impl DatagramSink,
        first: bool,
    ) -> Disposition {
        let Some(dst) = packet::destination(&frame[..len]) else {
            self.stats.drop(DropReason::NotIp);
            return Disposition::Done;
        };
        let slot = match self.routes.lookup_cached(dst) {
            Some(Route::Peer(slot)) => slot,
            Some(Route::Group(g)) => {
                match self.groups[g]
                    .as_ref()
                    .and_then(|g| g.choose(flow_hash(&frame[..len])))
                {
                    Some(slot) => slot,
                    None => {
                        self.stats.drop(DropReason::NoRoute);
                        return Disposition::Done;
                    }
                }
            }
            None => {
                self.stats.drop(DropReason::NoRoute);
                return Disposition::Done;
            }
        };
        let Some(peer) = self.peers[slot].as_ref() else {
            self.stats.drop(DropReason::NoRoute);
            return Disposition::Done;
        };
        // A flow keeps to one sub-tunnel, so its packets stay in order.
        let sub = if peer.parallel > 1 && !first {
            flow_hash(&frame[..len]) as usize
        } else {
            0
        };
        if let Some(worker) = self.elsewhere(peer, sub) {
            return Disposition::HandOff(worker);
        }
        let Some(peer) = self.peers[slot].as_mut() else {
            return Disposition::Done;
        };
        let Some(endpoint) = peer.endpoint else {
            self.stats.drop(DropReason::NoEndpoint);
            return Disposition::Done;
        };
        if peer.sub > 0 && peer.sessions.time_since_last_handshake(now).is_none() {
            // No session on this sub-tunnel: the packet goes over sub-tunnel 0, so that a side
            // that does not split the peer (yet) loses nothing, and this one asks for a
            // session at the next tick. Not at once: sub-tunnel 0 is likely handshaking now,
            // and a side that does not split the peer keeps one timestamp for both, so the
            // later-made initiation arriving first would have the other refused as a replay.
            peer.handshake_requested = true;
            let first_owner = owner_of(&peer.public_key, peer.parallel, 0, self.slot_stride);
            return Disposition::HandOffToFirst(first_owner);
        }
        // Packets queued during a handshake go first, or they would arrive after this one.
        if peer.maybe_queued {
            Self::flush_queued(peer, now, out, &mut self.stats);
        }
        if let Some(mss) = self.clamp_mss {
            if packet::clamp_mss(&mut frame[..len], mss) {
                self.stats.mss_clamped += 1;
            }
        }
        let padded = padded_len(len, usize::from(self.mtu)).min(frame.len());
        frame[len..padded].fill(0);
        let Some(buf) = out.slot() else {
            self.stats.drop(DropReason::NetworkBatchFull);
            return Disposition::Done;
        };
        let n = match peer
            .sessions
            .encapsulate(&self.local, &frame[..padded], buf, now)
        {
            Sent::Data(n) => {
                self.stats.tx_packets += 1;
                n
            }
            Sent::Initiation(n) => {
                // No session yet: the packet was queued and this is a handshake initiation.
                peer.maybe_queued = true;
                self.stats.handshakes_sent += 1;
                n
            }
            Sent::Queued => {
                peer.maybe_queued = true;
                return Disposition::Done;
            }
            Sent::Dropped(reason) => {
                self.stats.drop(reason);
                return Disposition::Done;
            }
        };
        out.push(n, endpoint);
        peer.last_sent = Some(now);
        peer.tx_bytes += n as u64;
        self.stats.tx_bytes += n as u64;
        Disposition::Done
    }

    /// Handles one datagram received from `from`: decrypted packets go to `overlay`, replies
    /// (handshake responses, cookies, queued packets) to `underlay`. The datagram is parsed
    /// once, here ([`wire::parse`]); what does not parse is counted as `malformed`.
    pub fn decapsulate(
        &mut self,
        from: SocketAddr,
        datagram: &[u8],
        now: Instant,
        overlay: &mut impl PacketSink,
        underlay: &mut impl DatagramSink,
    ) -> Disposition {
        self.decapsulate_checked(from, datagram, now, overlay, underlay, false)
    }

    /// [`Device::decapsulate`] of a datagram another worker handed over
    /// ([`Disposition::HandOff`]): a handshake initiation was admitted there (mac1, and
    /// under load mac2 and its source's budget, against the interface's one cookie secret),
    /// so it is not checked or charged to its source twice; its work counts here (the load's
    /// measure of time per handshake).
    pub fn decapsulate_handed_off(
        &mut self,
        from: SocketAddr,
        datagram: &[u8],
        now: Instant,
        overlay: &mut impl PacketSink,
        underlay: &mut impl DatagramSink,
    ) -> Disposition {
        self.decapsulate_checked(from, datagram, now, overlay, underlay, true)
    }

    fn decapsulate_checked(
        &mut self,
        from: SocketAddr,
        datagram: &[u8],
        now: Instant,
        overlay: &mut impl PacketSink,
        underlay: &mut impl DatagramSink,
        admitted: bool,
    ) -> Disposition {
        let message = match wire::parse(datagram) {
            Ok(message) => message,
            Err(unparsed) => {
                self.stats.drop(unparsed.into());
                return Disposition::Done;
            }
        };
        // A message that names our receiver index belongs to the worker whose slot that is.
        // The steering program sends it there; one that landed here anyway (an AF_XDP queue,
        // whose hash knows no indices) goes on to it before any work is done on it here.
        if let Some(owner) = message.receiver().and_then(|index| self.index_owner(index)) {
            return Disposition::HandOff(owner);
        }
        let authenticated = match message {
            Message::Initiation(initiation) => {
                self.receive_initiation(from, initiation, now, underlay, admitted)
            }
            Message::Response(response) => self.receive_response(from, response, now, underlay),
            Message::CookieReply(reply) => self.receive_cookie(reply, now),
            Message::Data(data) => self.receive_data(data, now, overlay),
        };
        let slot = match authenticated {
            Ok(slot) => slot,
            Err(disposition) => return disposition,
        };
        // Each receive_* found the peer in this slot.
        let Some(Some(peer)) = self.peers.get_mut(slot) else {
            return Disposition::Done;
        };

        // Authenticated: the peer may have roamed to a new address.
        if peer.endpoint != Some(from) && peer.connected {
            tracing::info!(peer = %peer.public_key, endpoint = %from, "peer roamed");
        }
        if !peer.connected && !matches!(message, Message::CookieReply(_)) {
            tracing::info!(peer = %peer.public_key, endpoint = %from, "session established");
            peer.connected = true;
        }
        peer.endpoint = Some(from);
        peer.rx_bytes += message.len() as u64;
        self.stats.rx_bytes += message.len() as u64;
        if peer.maybe_queued {
            Self::flush_queued(peer, now, underlay, &mut self.stats);
        }
        Disposition::Done
    }

    // The receive_* steps of `decapsulate`, one per message: `Ok(slot)` when the message
    // authenticated as from the peer in `slot`, else what `decapsulate` returns (a drop is
    // counted by then).

    /// A handshake initiation: answered by the worker that carries the initiator's session.
    fn receive_initiation(
        &mut self,
        from: SocketAddr,
        initiation: wire::Initiation<'_>,
        now: Instant,
        underlay: &mut impl DatagramSink,
        admitted: bool,
    ) -> Result<usize, Disposition> {
        if admitted {
            // Its cost falls here now: it counts toward this worker's measure.
            self.load.handled(now);
        } else if !self.admit_handshake(from, initiation.into(), now, underlay) {
            return Err(Disposition::Done);
        }
        let (slot, received) = match self.initiator_slot(initiation) {
            Ok(found) => found,
            Err(Some(slot)) => {
                // The worker carrying the peer reads it in full (admitted here already).
                let owner = self
                    .peers
                    .get(slot)
                    .and_then(Option::as_ref)
                    .and_then(|peer| self.elsewhere(peer, index_slot(initiation.sender())));
                return Err(match owner {
                    Some(worker) => Disposition::HandOff(worker),
                    None => {
                        self.stats.drop(DropReason::UnknownPeer);
                        Disposition::Done
                    }
                });
            }
            Err(None) => return Err(Disposition::Done),
        };
        // Initiations arrive at any worker: the one carrying the session answers. A split
        // peer's initiator names its sub-tunnel by its own index (`add_peer`).
        let Some(Some(peer)) = self.peers.get(slot) else {
            self.stats.drop(DropReason::UnknownPeer);
            return Err(Disposition::Done);
        };
        if let Some(worker) = self.elsewhere(peer, index_slot(initiation.sender())) {
            return Err(Disposition::HandOff(worker));
        }
        let Some(Some(peer)) = self.peers.get_mut(slot) else {
            self.stats.drop(DropReason::UnknownIndex);
            return Err(Disposition::Done);
        };
        let Some(buf) = underlay.slot() else {
            self.stats.drop(DropReason::NetworkBatchFull);
            return Err(Disposition::Done);
        };
        match peer.sessions.respond(&self.local, &received, buf, now) {
            Ok(n) => {
                underlay.push(n, from);
                peer.last_sent = Some(now);
                peer.tx_bytes += n as u64;
                self.stats.tx_bytes += n as u64;
                Ok(slot)
            }
            Err(reason) => {
                self.stats.drop(reason);
                Err(Disposition::Done)
            }
        }
    }

    /// A handshake response to one of our initiations: it completes a session.
    fn receive_response(
        &mut self,
        from: SocketAddr,
        response: wire::Response<'_>,
        now: Instant,
        underlay: &mut impl DatagramSink,
    ) -> Result<usize, Disposition> {
        if !self.admit_handshake(from, response.into(), now, underlay) {
            return Err(Disposition::Done);
        }
        let slot = self.local_slot(response.receiver());
        let Some(Some(peer)) = self.peers.get_mut(slot) else {
            self.stats.drop(DropReason::UnknownIndex);
            return Err(Disposition::Done);
        };
        let Some(buf) = underlay.slot() else {
            self.stats.drop(DropReason::NetworkBatchFull);
            return Err(Disposition::Done);
        };
        match peer
            .sessions
            .receive_response(&self.local, response, buf, now)
        {
            Ok(Some(n)) => {
                underlay.push(n, from);
                peer.last_sent = Some(now);
                peer.tx_bytes += n as u64;
                self.stats.tx_bytes += n as u64;
            }
            Ok(None) => {}
            Err(reason) => {
                // The usual cause: the other side does not split the peer the same way, so it
                // answers with another sub-tunnel's key. Said once per peer.
                if peer.sub > 0 && !peer.warned_sub_tunnel {
                    peer.warned_sub_tunnel = true;
                    tracing::warn!(
                        peer = %peer.public_key,
                        "sub-tunnel {} of {}: the handshake response does not authenticate; \
                         its flows go over sub-tunnel 0 until it does. Is `parallel = {}` set \
                         on the other side too?",
                        peer.sub,
                        peer.parallel,
                        peer.parallel
                    );
                }
                self.stats.drop(reason);
                return Err(Disposition::Done);
            }
        }
        peer.maybe_queued = true;
        Ok(slot)
    }

    /// A cookie reply to one of our handshake messages: the peer is under load.
    fn receive_cookie(
        &mut self,
        reply: wire::CookieReply<'_>,
        now: Instant,
    ) -> Result<usize, Disposition> {
        let slot = self.local_slot(reply.receiver());
        let Some(Some(peer)) = self.peers.get_mut(slot) else {
            self.stats.drop(DropReason::UnknownIndex);
            return Err(Disposition::Done);
        };
        if let Err(reason) = peer.sessions.receive_cookie(reply, now) {
            self.stats.drop(reason);
            return Err(Disposition::Done);
        }
        peer.maybe_queued = true;
        Ok(slot)
    }

    /// A data message: its packet goes to the overlay if its source is one the peer may use.
    fn receive_data(
        &mut self,
        data: wire::Data<'_>,
        now: Instant,
        overlay: &mut impl PacketSink,
    ) -> Result<usize, Disposition> {
        let slot = self.local_slot(data.receiver());
        let Some(Some(peer)) = self.peers.get_mut(slot) else {
            self.stats.drop(DropReason::UnknownIndex);
            return Err(Disposition::Done);
        };
        let Some(buf) = overlay.slot() else {
            self.stats.drop(DropReason::TunnelBatchFull);
            return Err(Disposition::Done);
        };
        match peer.sessions.receive_data(data, buf, now) {
            Ok(Opened::Packet { len, source }) => {
                let allowed = match self.routes.lookup_cached(source) {
                    Some(Route::Peer(s)) => s == slot,
                    Some(Route::Group(g)) => self.groups[g].as_ref().is_some_and(|g| g.has(slot)),
                    None => false,
                };
                if allowed {
                    if let Some(mss) = self.clamp_mss {
                        if packet::clamp_mss(&mut buf[..len], mss) {
                            self.stats.mss_clamped += 1;
                        }
                    }
                    overlay.push(len);
                    self.stats.rx_packets += 1;
                } else {
                    self.stats.drop(DropReason::SourceNotAllowed);
                }
            }
            Ok(Opened::Keepalive) => {}
            Err(reason) => {
                self.stats.drop(reason);
                return Err(Disposition::Done);
            }
        }
        Ok(slot)
    }

    /// The first check of a handshake message (initiation or response): its mac1 must be
    /// right, and when the device is under load (`WAIT_LIMIT`) or its source is past its fair
    /// share its mac2 too (or the sender gets a cookie reply instead), and its source must then
    /// be within its budget. False when the message goes no further.
    fn admit_handshake(
        &mut self,
        from: SocketAddr,
        message: Handshake<'_>,
        now: Instant,
        underlay: &mut impl DatagramSink,
    ) -> bool {
        if !self.local.identity.verify_mac1(message) {
            self.stats.drop(DropReason::InvalidMac);
            return false;
        }
        if !self.load.demands_cookie(now)
            && self
                .shares
                .allow(from.ip(), now, self.load.capacity(REKEY_TIMEOUT))
        {
            self.load.handled(now);
            return true;
        }
        if self.cookies.mac2_valid(message, from, now) {
            if self.limiter.allow(from.ip(), now) {
                self.load.handled(now);
                return true;
            }
            self.stats.drop(DropReason::RateLimited);
            return false;
        }
        let Some(buf) = underlay.slot() else {
            self.stats.drop(DropReason::NetworkBatchFull);
            return false;
        };
        let reply = buf
            .get_mut(..wire::COOKIE_REPLY_LEN)
            .and_then(|b| b.try_into().ok());
        match reply {
            Some(reply) => {
                if self
                    .cookies
                    .write_reply(
                        &self.local.identity,
                        message,
                        from,
                        now,
                        &mut *self.rng,
                        reply,
                    )
                    .is_ok()
                {
                    underlay.push(wire::COOKIE_REPLY_LEN, from);
                    self.stats.cookie_replies_sent += 1;
                }
            }
            None => self.stats.drop(DropReason::Other),
        }
        self.stats.drop(DropReason::UnderLoad);
        false
    }

    /// Tells the device how much work waits behind the batch it is handling: `queued` bytes
    /// in a receive queue that holds `capacity` (a socket's `SO_MEMINFO`). While the queued
    /// datagrams would take longer than `WAIT_LIMIT` at the measured time per handshake, the
    /// device is under load (this turn); when the queue is three quarters full, for a second.
    /// Once a backlog has been reported, that decides, not the count of handshakes per turn.
    pub fn note_backlog(&mut self, queued: usize, capacity: usize, now: Instant) {
        self.load.note_backlog(queued, capacity, now);
    }

    /// Whether a backlog (`note_backlog`, or a full batch of handshakes in one turn) put the
    /// device under load at `now`: every handshake needs a cookie. (A spent work budget, or a
    /// source past its share, asks for cookies too, message by message.)
    pub fn under_load(&self, now: Instant) -> bool {
        self.load.until.is_some_and(|until| now < until)
    }

    /// For a handshake initiation: the slot of the initiating peer, found by the static key
    /// it carries, and the initiation decrypted (a worker that hands it off wasted that).
    /// The peer an initiation is from and the initiation read: `Err(Some(slot))` when the
    /// peer in `slot` is carried by another worker (this one has no static secret for it,
    /// so it reads no further than the sender's key), `Err(None)` when it is dropped
    /// (counted).
    fn initiator_slot(
        &mut self,
        initiation: wire::Initiation<'_>,
    ) -> Result<(usize, ReceivedInitiation), Option<usize>> {
        let by_key = &self.by_key;
        let peers = &self.peers;
        let mut slot = None;
        let found = consume_initiation(&self.local.identity, initiation, |key| {
            let s = *by_key.get(&PublicKey::from_bytes(*key))?;
            slot = Some(s);
            peers.get(s)?.as_ref().map(|p| p.sessions.identity())
        });
        match (found, slot) {
            (Ok(received), Some(slot)) => Ok((slot, received)),
            (Err(HandshakeError::NotCarriedHere), Some(slot)) => Err(Some(slot)),
            (Ok(_), None) => Err(None),
            (Err(e), _) => {
                self.stats.drop(noise::drop_reason(&e));
                Err(None)
            }
        }
    }

    /// Sends `peer` a handshake initiation, unless one went out less than REKEY_TIMEOUT ago
    /// (the handshake in progress is left to finish). False when `underlay`
    /// has no room (counted).
    fn initiate(
        local: &Local,
        peer: &mut Peer,
        now: Instant,
        force: bool,
        to: Option<SocketAddr>,
        underlay: &mut impl DatagramSink,
        stats: &mut Stats,
    ) -> bool {
        let Some(buf) = underlay.slot() else {
            stats.drop(DropReason::NetworkBatchFull);
            return false;
        };
        let Some(endpoint) = to.or(peer.endpoint) else {
            return true;
        };
        if let Some(n) = peer.sessions.initiate(local, buf, now, force) {
            underlay.push(n, endpoint);
            peer.last_sent = Some(now);
            peer.tx_bytes += n as u64;
            stats.tx_bytes += n as u64;
            stats.handshakes_sent += 1;
        }
        true
    }

    /// Sends what the peer's sessions queued while it had no session, now that it may have one.
    fn flush_queued(
        peer: &mut Peer,
        now: Instant,
        underlay: &mut impl DatagramSink,
        stats: &mut Stats,
    ) {
        let Some(endpoint) = peer.endpoint else {
            return;
        };
        if !peer.sessions.has_session(now) {
            return;
        }
        while peer.sessions.has_queued() {
            let Some(buf) = underlay.slot() else {
                // Try again on the next datagram or tick.
                return;
            };
            let Some(n) = peer.sessions.send_queued(buf, now) else {
                break;
            };
            underlay.push(n, endpoint);
            peer.last_sent = Some(now);
            peer.tx_bytes += n as u64;
            stats.tx_bytes += n as u64;
            stats.tx_packets += 1;
        }
        peer.maybe_queued = false;
    }

    /// Asks for a handshake with `peer` at the next `tick`, rather than when the timers get
    /// to it: for when its path was just re-established (a reconnected TLS transport, whose
    /// other end may have restarted and lost the session). False for an unknown peer.
    pub fn request_handshake(&mut self, peer: &PublicKey) -> bool {
        let Some(slot) = self.by_key.get(peer).copied() else {
            return false;
        };
        match self.peers.get_mut(slot).and_then(Option::as_mut) {
            Some(p) => {
                p.handshake_requested = true;
                true
            }
            None => false,
        }
    }

    /// Bytes sent to and authenticated from `peer` so far (tx, rx); `None` for an unknown peer.
    pub fn peer_traffic(&self, peer: &PublicKey) -> Option<(u64, u64)> {
        let slot = *self.by_key.get(peer)?;
        let p = self.peers.get(slot)?.as_ref()?;
        Some((p.tx_bytes, p.rx_bytes))
    }

    /// Where `peer`'s datagrams go, as the device that carries its session knows it (a
    /// roaming peer's latest address); `None` for an unknown peer, one carried by another
    /// device, or one with no endpoint yet.
    pub fn carried_peer_endpoint(&self, peer: &PublicKey) -> Option<SocketAddr> {
        let slot = *self.by_key.get(peer)?;
        let p = self.peers.get(slot)?.as_ref()?;
        p.endpoint.filter(|_| p.owned)
    }

    /// The state of every peer whose session this device carries, for an
    /// [`event::Tracker`](crate::event::Tracker): endpoint, last handshake, attempt under way.
    pub fn observe_peers(
        &self,
        now: Instant,
    ) -> impl Iterator<Item = crate::event::PeerObservation> + '_ {
        self.peers
            .iter()
            .flatten()
            .filter(|p| p.owned)
            .map(move |p| crate::event::PeerObservation {
                public_key: p.public_key,
                endpoint: p.endpoint,
                last_handshake: p
                    .sessions
                    .time_since_last_handshake(now)
                    .and_then(|age| now.checked_sub(age)),
                attempt_started: p.sessions.attempt_started(),
            })
    }

    /// Sends `peer`'s datagrams to `endpoint` from now on and handshakes there at the next
    /// tick, even if an initiation to the old address is under way (it may never be
    /// answered, and would hold the next one back for its whole retransmission time): for a
    /// transport change (UDP to TLS) or a path to try (a peer behind NAT). False for an
    /// unknown peer.
    pub fn move_peer(&mut self, peer: &PublicKey, endpoint: SocketAddr) -> bool {
        let Some(slot) = self.by_key.get(peer).copied() else {
            return false;
        };
        match self.peers.get_mut(slot).and_then(Option::as_mut) {
            Some(p) => {
                p.endpoint = Some(endpoint);
                p.handshake_forced = true;
                true
            }
            None => false,
        }
    }

    /// Sends `peer` a handshake initiation at `to` at the next tick, leaving its endpoint
    /// where it is: a path to try without moving off the one that works (a relayed peer's
    /// direct address). If the peer answers from there, the answer, authenticated, moves it
    /// as roaming does; if not, nothing changed. False for an unknown peer.
    pub fn try_path(&mut self, peer: &PublicKey, to: SocketAddr) -> bool {
        let Some(slot) = self.by_key.get(peer).copied() else {
            return false;
        };
        match self.peers.get_mut(slot).and_then(Option::as_mut) {
            Some(p) => {
                p.path_to_try = Some(to);
                p.handshake_forced = true;
                true
            }
            None => false,
        }
    }

    /// Runs the protocol timers (handshake retries, rekeys, keepalives) of every peer.
    /// Call it every few hundred milliseconds.
    pub fn tick(&mut self, now: Instant, underlay: &mut impl DatagramSink) {
        self.limiter.sweep(now);
        self.shares.sweep(now);
        // Another worker runs the timers of the sessions it carries.
        for peer in self.peers.iter_mut().flatten().filter(|p| p.owned) {
            let Some(buf) = underlay.slot() else {
                self.stats.drop(DropReason::NetworkBatchFull);
                return;
            };
            match peer.sessions.tick(&self.local, buf, now) {
                Timer::Send(n) => {
                    if let Some(endpoint) = peer.endpoint {
                        underlay.push(n, endpoint);
                        peer.last_sent = Some(now);
                        peer.tx_bytes += n as u64;
                        self.stats.tx_bytes += n as u64;
                    }
                }
                Timer::Expired if peer.connected => {
                    tracing::info!(peer = %peer.public_key, "session expired: no handshake for 9 minutes");
                    peer.connected = false;
                }
                Timer::Expired | Timer::Idle => {}
            }
            let forced = std::mem::take(&mut peer.handshake_forced);
            let to = peer.path_to_try.take();
            if (std::mem::take(&mut peer.handshake_requested) || forced)
                && !Self::initiate(
                    &self.local,
                    peer,
                    now,
                    forced,
                    to,
                    underlay,
                    &mut self.stats,
                )
            {
                return;
            }
            if peer.keepalive_due(now) {
                let Some(buf) = underlay.slot() else {
                    self.stats.drop(DropReason::NetworkBatchFull);
                    return;
                };
                match (peer.sessions.keepalive(buf, now), peer.endpoint) {
                    (Some(n), Some(endpoint)) => {
                        underlay.push(n, endpoint);
                        peer.last_sent = Some(now);
                        peer.tx_bytes += n as u64;
                        self.stats.tx_bytes += n as u64;
                    }
                    (None, Some(_)) => {
                        // No session yet (a start, a restart, a peer just configured): as
                        // in the kernel, the keepalive waits for one and starts its
                        // handshake, so the far side can reach us before we send anything.
                        // The sessions' own timers retry it; this path waits an interval.
                        peer.last_sent = Some(now);
                        if !Self::initiate(
                            &self.local,
                            peer,
                            now,
                            false,
                            None,
                            underlay,
                            &mut self.stats,
                        ) {
                            return;
                        }
                    }
                    (_, None) => {}
                }
            }
            if peer.maybe_queued {
                Self::flush_queued(peer, now, underlay, &mut self.stats);
            }
        }
    }

    /// The mark the interface's sockets are to carry (`fwmark`; 0: none).
    pub fn fwmark(&self) -> u32 {
        self.fwmark
    }

    /// The state `wg show` displays. `unix_now` is the wall-clock time, for handshake ages.
    pub fn snapshot(&self, now: Instant, unix_now: Duration) -> DeviceSnapshot {
        let peers = self
            .peers
            .iter()
            .flatten()
            .filter(|p| p.owned)
            .map(|peer| PeerSnapshot {
                public_key: peer.public_key,
                preshared_key: peer.preshared_key.clone(),
                endpoint: peer.endpoint,
                last_handshake: peer
                    .sessions
                    .time_since_last_handshake(now)
                    .map(|age| unix_now.saturating_sub(age)),
                tx_bytes: peer.tx_bytes,
                rx_bytes: peer.rx_bytes,
                persistent_keepalive: peer.persistent_keepalive,
                // A shared prefix shows on every peer sharing it.
                allowed_ips: peer
                    .allowed_ips
                    .iter()
                    .chain(&peer.shared_ips)
                    .copied()
                    .collect(),
            })
            .collect();
        DeviceSnapshot {
            private_key: Some(self.private_key.clone()),
            listen_port: self.listen_port,
            fwmark: self.fwmark,
            peers,
        }
    }

    /// Applies a UAPI `set`, in order, as WireGuard does. Changing an existing peer keeps its
    /// session, except for a new preshared key, which starts a new one at once (see `sync`).
    /// Device-level changes tunneld cannot make live are refused before anything changes. A
    /// new `fwmark` is recorded only: marking the sockets is the caller's (tunneld's UAPI
    /// server marks them before its workers apply the request).
    pub fn apply(&mut self, request: SetRequest, now: Instant) -> Result<(), UapiError> {
        let unsupported = |message: String| UapiError {
            errno: libc_errno::EOPNOTSUPP,
            message,
        };
        if let Some(port) = request.listen_port.filter(|p| *p != self.listen_port) {
            return Err(unsupported(format!(
                "listen_port: changing the port of a running tunneld ({} to {port}) is not supported; edit the config and restart",
                self.listen_port
            )));
        }
        if let Some(None) = request.private_key {
            return Err(unsupported(
                "private_key: removing the private key is not supported".into(),
            ));
        }
        if let Some(mark) = request.fwmark {
            self.fwmark = mark;
        }
        if let Some(Some(key)) = request.private_key {
            self.set_private_key(key, now);
        }
        if request.replace_peers {
            let keys: Vec<PublicKey> = self.by_key.keys().copied().collect();
            for key in keys {
                self.remove_peer(&key);
            }
        }
        for update in request.peers {
            self.update_peer(update)?;
        }
        Ok(())
    }

    fn set_private_key(&mut self, key: PrivateKey, now: Instant) {
        if key == self.private_key {
            return;
        }
        let unix_now = self.unix_at_start + now.saturating_duration_since(self.started);
        self.local = Local::new(*key.as_bytes(), now, unix_now);
        self.private_key = key;
        if self.checking {
            // No static secrets to make again; a key's order does not depend on ours.
            return;
        }
        let mut unusable = Vec::new();
        for peer in self.peers.iter_mut().flatten() {
            if peer.sessions.set_local(&self.local).is_err() {
                unusable.push(peer.public_key);
            }
        }
        // A peer whose key makes no handshake possible with the new one (a low-order
        // point) cannot be carried; WireGuard drops such peers too.
        for key in unusable {
            tracing::warn!(peer = %key, "peer removed: its public key cannot make a handshake with the new private key");
            self.remove_peer(&key);
        }
    }

    fn remove_peer(&mut self, key: &PublicKey) {
        if let Some(slot) = self.by_key.remove(key) {
            // A peer's `allowed_ips` are exactly the prefixes it holds in `routes` (one that
            // moves to another peer leaves its list), so its own list is all there is to
            // take out: no walk over every route.
            if let Some(peer) = self.peers[slot].take() {
                for net in peer.allowed_ips {
                    if self.routes.get(net) == Some(&Route::Peer(slot)) {
                        self.routes.remove(net);
                    }
                }
                for net in peer.shared_ips {
                    self.leave_group(slot, net);
                }
            }
            self.free.push(slot);
        }
    }

    fn update_peer(&mut self, update: PeerUpdate) -> Result<(), UapiError> {
        if update.remove {
            self.remove_peer(&update.public_key);
            return Ok(());
        }
        if update.public_key == self.public_key() {
            // WireGuard ignores a peer that has the interface's own key.
            return Ok(());
        }
        let slot = match self.by_key.get(&update.public_key) {
            Some(&slot) => slot,
            None if update.update_only => return Ok(()),
            None => self.add_peer(update.public_key, 1)?,
        };
        let wire_slot = self.wire_slot(slot);
        let Some(peer) = self.peers[slot].as_mut() else {
            return Ok(());
        };
        if let Some(psk) = update.preshared_key {
            let psk = psk.filter(|k| !k.is_zero());
            if psk != peer.preshared_key {
                let session_psk = if peer.parallel > 1 {
                    PresharedKey::for_sub_tunnel(psk.as_ref(), peer.sub)
                } else {
                    psk.clone()
                };
                // A new key starts a new session, as a reload reports (`SyncReport::restarted`).
                peer.sessions = new_sessions(
                    !self.checking && peer.owned,
                    &self.local,
                    *peer.public_key.as_bytes(),
                    session_psk.map(|k| *k.as_bytes()),
                    wire_slot,
                    &mut *self.rng,
                )
                .map_err(|_| low_order(&peer.public_key))?;
                peer.preshared_key = psk;
            }
        }
        if let Some(endpoint) = update.endpoint {
            peer.endpoint = Some(endpoint);
        }
        if let Some(keepalive) = update.persistent_keepalive {
            if keepalive != peer.persistent_keepalive {
                peer.persistent_keepalive = keepalive;
                // Like the kernel: a newly enabled keepalive goes out at the next tick.
                peer.last_sent = None;
            }
        }
        if update.replace_allowed_ips {
            for net in peer.allowed_ips.drain(..) {
                self.routes.remove(net);
            }
        }
        if let Some(shared) = update.shared_ips {
            let before = self.peers[slot]
                .as_mut()
                .map(|p| std::mem::take(&mut p.shared_ips))
                .unwrap_or_default();
            let shared: Vec<IpNet> = shared.into_iter().map(|n| n.trunc()).collect();
            // Leaving only the groups it is no longer in keeps the others' membership (and
            // so the flows on it) untouched.
            for net in before.iter().filter(|n| !shared.contains(n)) {
                self.leave_group(slot, *net);
            }
            if let Some(peer) = self.peers[slot].as_mut() {
                peer.shared_ips = before.into_iter().filter(|n| shared.contains(n)).collect();
            }
            for net in shared {
                self.join_group(slot, net);
            }
        }
        for net in update.allowed_ips {
            let net = net.trunc();
            // A prefix moves to the peer that claims it last, as in the kernel.
            if let Some(previous) = self.routes.insert(net, Route::Peer(slot)) {
                self.release(net, previous, slot);
            }
            if let Some(peer) = self.peers[slot].as_mut() {
                if !peer.allowed_ips.contains(&net) {
                    peer.allowed_ips.push(net);
                }
            }
        }
        Ok(())
    }

    /// Takes `net` off the peers `previous` (what routed it before) names, but `slot`:
    /// another claim has just replaced it in `routes`.
    fn release(&mut self, net: IpNet, previous: Route, slot: usize) {
        match previous {
            Route::Peer(p) if p == slot => {}
            Route::Peer(p) => {
                if let Some(Some(other)) = self.peers.get_mut(p) {
                    other.allowed_ips.retain(|n| *n != net);
                }
            }
            Route::Group(g) => {
                let group = self.groups.get_mut(g).and_then(Option::take);
                for (member, _) in group.map(|g| g.members).unwrap_or_default() {
                    if let Some(Some(other)) = self.peers.get_mut(member) {
                        other.shared_ips.retain(|n| *n != net);
                    }
                }
            }
        }
    }

    /// Makes peer `slot` a member of `net`'s group: made if `net` has none, taking the prefix
    /// from a peer that held it alone (this one too), as any later claim of an allowed IP.
    fn join_group(&mut self, slot: usize, net: IpNet) {
        let Some(key) = self
            .peers
            .get(slot)
            .and_then(Option::as_ref)
            .map(|p| p.public_key)
        else {
            return;
        };
        let member = (slot, member_seed(&key));
        match self.routes.get(net).copied() {
            Some(Route::Group(g)) => {
                if let Some(group) = self.groups.get_mut(g).and_then(Option::as_mut) {
                    if !group.has(slot) {
                        group.members.push(member);
                    }
                }
            }
            _ => {
                let group = Some(Group {
                    members: vec![member],
                });
                let g = match self.groups.iter().position(Option::is_none) {
                    Some(free) => {
                        self.groups[free] = group;
                        free
                    }
                    None => {
                        self.groups.push(group);
                        self.groups.len() - 1
                    }
                };
                if let Some(Route::Peer(p)) = self.routes.insert(net, Route::Group(g)) {
                    if let Some(Some(other)) = self.peers.get_mut(p) {
                        other.allowed_ips.retain(|n| *n != net);
                    }
                }
            }
        }
        if let Some(peer) = self.peers[slot].as_mut() {
            if !peer.shared_ips.contains(&net) {
                peer.shared_ips.push(net);
            }
        }
    }

    /// Takes peer `slot` out of `net`'s group; the last member out takes the route with it.
    fn leave_group(&mut self, slot: usize, net: IpNet) {
        let Some(Route::Group(g)) = self.routes.get(net).copied() else {
            return;
        };
        let Some(group) = self.groups.get_mut(g).and_then(Option::as_mut) else {
            return;
        };
        group.members.retain(|(s, _)| *s != slot);
        if group.members.is_empty() {
            self.groups[g] = None;
            self.routes.remove(net);
        }
    }

    /// The slot peer `local` writes into its receiver indices.
    fn wire_slot(&self, local: usize) -> u32 {
        // add_peer keeps local * stride + offset below MAX_PEERS (2^24).
        u32::try_from(local * self.slot_stride + self.slot_offset).unwrap_or(u32::MAX)
    }

    /// The worker whose slot receiver index `index` names, when that is another worker than
    /// this one (`None`: the index is this worker's, known or not).
    fn index_owner(&self, index: u32) -> Option<usize> {
        let owner = worker_of_index(index, self.slot_stride);
        (owner != self.slot_offset).then_some(owner)
    }

    /// The place in `peers` of the slot receiver index `index` names; out of range (so
    /// unknown) when the slot belongs to another worker.
    fn local_slot(&self, index: u32) -> usize {
        let slot = index_slot(index);
        if slot % self.slot_stride == self.slot_offset {
            slot / self.slot_stride
        } else {
            usize::MAX
        }
    }

    /// Adds `key` split into `parallel` sub-tunnels (at most one per worker). Every worker's
    /// device holds every peer, so that each can route and recognise it, but only the
    /// worker carrying a session runs it. That worker takes a slot whose number is `sub`
    /// modulo `parallel`: the receiver index of its handshake initiations then tells the
    /// other side's workers which sub-tunnel the initiation is for.
    fn add_peer(&mut self, key: PublicKey, parallel: u8) -> Result<usize, UapiError> {
        let (worker, workers) = (self.slot_offset, self.slot_stride);
        let parallel = parallel.clamp(1, u8::try_from(workers).unwrap_or(u8::MAX));
        let owned_sub = if parallel > 1 {
            (worker < usize::from(parallel)).then_some(worker as u8)
        } else {
            (owner_of(&key, 1, 0, workers) == worker).then_some(0)
        };
        let capacity = (MAX_PEERS - worker).div_ceil(workers);
        let fits = |place: usize| match owned_sub {
            Some(sub) if parallel > 1 => {
                (place * workers + worker) % usize::from(parallel) == usize::from(sub)
            }
            _ => true,
        };
        // Places freed by removals, newest first; a place that does not fit this peer
        // stays for another (only a split peer's places must fit).
        let free = self
            .free
            .iter()
            .rposition(|&p| self.peers.get(p).is_some_and(Option::is_none) && fits(p))
            .map(|i| self.free.swap_remove(i));
        let slot = match free {
            Some(free) => free,
            None => {
                // Places that do not fit stay free for plain peers.
                let next = (self.peers.len()..capacity).find(|&p| fits(p));
                match next {
                    Some(place) => {
                        // The places skipped stay free for plain peers.
                        self.free.extend(self.peers.len()..place);
                        self.peers.resize_with(place + 1, || None);
                        place
                    }
                    None => {
                        return Err(UapiError {
                            errno: libc_errno::ENOSPC,
                            message: format!("public_key: cannot add more than {MAX_PEERS} peers"),
                        })
                    }
                }
            }
        };
        let sub = owned_sub.unwrap_or(0);
        // Sub-tunnels past the first use a key of their own, also without a configured one.
        let psk = if parallel > 1 {
            PresharedKey::for_sub_tunnel(None, sub).map(|k| *k.as_bytes())
        } else {
            None
        };
        let wire_slot = self.wire_slot(slot);
        let sessions = new_sessions(
            !self.checking && owned_sub.is_some(),
            &self.local,
            *key.as_bytes(),
            psk,
            wire_slot,
            &mut *self.rng,
        )
        .map_err(|_| low_order(&key))?;
        let mut peer = Peer::new(key, sessions);
        peer.parallel = parallel;
        peer.sub = sub;
        peer.owned = owned_sub.is_some();
        self.peers[slot] = Some(peer);
        self.by_key.insert(key, slot);
        Ok(slot)
    }
}

/// A peer's sessions: with its static Diffie-Hellman where handshakes with it are made
/// (`handshakes`: the worker that carries it, on a device that is not only checking), else
/// without, which saves that Diffie-Hellman on every other worker.
fn new_sessions(
    handshakes: bool,
    local: &Local,
    peer_public: [u8; 32],
    psk: Option<[u8; 32]>,
    slot: u32,
    rng: &mut dyn rand_core::CryptoRngCore,
) -> Result<Sessions, DropReason> {
    if handshakes {
        Sessions::new(local, peer_public, psk, slot, rng)
    } else {
        Sessions::without_static_secret(peer_public, psk, slot, rng)
    }
}

/// The refusal of a peer key no handshake can be made with.
fn low_order(key: &PublicKey) -> UapiError {
    UapiError {
        errno: libc_errno::EINVAL,
        message: format!(
            "public_key: {key} is a low-order point; no handshake can be made with it"
        ),
    }
}

/// The peer slot a receiver index names: its high 24 bits (a session's index is in the low 8).
fn index_slot(index: u32) -> usize {
    (index >> 8) as usize
}

/// The worker of `workers` whose session receiver index `index` names: its slot modulo the
/// workers, since [`Device::for_worker`] hands worker `w` only slots `s` with
/// `s % workers == w`. The reuseport steering program computes the same in the kernel.
pub fn worker_of_index(index: u32, workers: usize) -> usize {
    index_slot(index) % workers.max(1)
}

/// The errno values UAPI replies use (Linux numbering, as `wg` expects).
mod libc_errno {
    pub const EINVAL: i32 = 22;
    pub const ENOSPC: i32 = 28;
    pub const EOPNOTSUPP: i32 = 95;
}
