//! One peer's WireGuard state machine: its handshakes, its sessions (current, previous and
//! the responder's unconfirmed next) and the protocol's timers (section 6 of the WireGuard
//! paper). Time comes in as `now`; the only other input from outside is randomness for
//! ephemeral keys, indices and jitter.

use super::cookie::consume_cookie_reply;
use super::handshake::{
    consume_response, create_initiation, create_response, tai64n, InitiationState, LocalIdentity,
    PeerIdentity, ReceivedInitiation, INITIATION_LEN, RESPONSE_LEN,
};
use super::session::Session;
use crate::stats::DropReason;
use crate::wire::{CookieReply, Data, Response, DATA_HEADER_LEN};
use rand_chacha::ChaCha20Rng;
use rand_core::{CryptoRngCore, RngCore, SeedableRng};
use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};
use tunneld_crypto::aead::TAG_LEN;
use zeroize::Zeroizing;

const REKEY_AFTER_MESSAGES: u64 = 1 << 60;
const REKEY_AFTER_TIME: Duration = Duration::from_secs(120);
const REJECT_AFTER_TIME: Duration = Duration::from_secs(180);
const REKEY_ATTEMPT_TIME: Duration = Duration::from_secs(90);
pub(crate) const REKEY_TIMEOUT: Duration = Duration::from_secs(5);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// A received initiation closer than this to the previous one is ignored (the kernel's 50
/// per second), so a flood of replayed-but-newer initiations cannot churn sessions.
const MIN_INITIATION_INTERVAL: Duration = Duration::from_millis(20);
/// A cookie from a peer under load is used for this long.
const COOKIE_LIFETIME: Duration = Duration::from_secs(120);
/// Packets held while a handshake is under way; more are dropped.
const MAX_QUEUED: usize = 128;

/// Our side of every handshake: the static key pair and the wall clock anchor that
/// handshake timestamps are made from.
pub struct Local {
    pub identity: LocalIdentity,
    /// Wall-clock time at `anchor`: timestamps must keep rising across restarts, which a
    /// monotonic clock alone cannot give. The caller reads it (the core reads no clock).
    unix_at_anchor: Duration,
    anchor: Instant,
}

impl std::fmt::Debug for Local {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Local").finish_non_exhaustive()
    }
}

impl Local {
    /// Our key, with the wall-clock time (since the Unix epoch) at `now`.
    pub fn new(private: [u8; 32], now: Instant, unix_now: Duration) -> Self {
        Self {
            identity: LocalIdentity::new(private),
            unix_at_anchor: unix_now,
            anchor: now,
        }
    }

    fn timestamp(&self, now: Instant) -> [u8; 12] {
        tai64n(self.unix_at_anchor + now.saturating_duration_since(self.anchor))
    }
}

/// What became of a packet given to [`Sessions::encapsulate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// A data message of this length is in `out`.
    Data(usize),
    /// No session: the packet was queued and a handshake initiation of this length is in `out`.
    Initiation(usize),
    /// No session yet, a handshake is under way: the packet was queued.
    Queued,
    Dropped(DropReason),
}

/// What an authenticated data message held ([`Sessions::receive_data`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened {
    /// An IP packet of `len` bytes from `source` is at the start of `out`.
    Packet {
        len: usize,
        source: IpAddr,
    },
    Keepalive,
}

/// What a timer turn produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timer {
    Idle,
    /// A message to send (an initiation or a keepalive), `len` bytes in `out`.
    Send(usize),
    /// No handshake for three times the session lifetime: every key is gone.
    Expired,
}

struct Pending {
    state: InitiationState,
    sent_at: Instant,
    /// When the first initiation of this attempt went out: retries stop after
    /// REKEY_ATTEMPT_TIME.
    started_at: Instant,
    retry_after: Duration,
}

pub struct Sessions {
    peer: PeerIdentity,
    psk: Zeroizing<[u8; 32]>,
    /// The high 24 bits of our indices: the device's peer slot.
    slot: u32,
    next_index: u8,
    pending: Option<Pending>,
    current: Option<Box<Session>>,
    previous: Option<Box<Session>>,
    /// A session we answered for; it becomes current when the initiator first uses it.
    next: Option<Box<Session>>,
    cookie: Option<([u8; 16], Instant)>,
    /// mac1 of the last handshake message we sent and its sender index: a cookie reply
    /// names the index and is bound to the mac1.
    last_mac1: Option<([u8; 16], u32)>,
    last_timestamp: Option<[u8; 12]>,
    last_initiation_at: Option<Instant>,
    last_handshake: Option<Instant>,
    queue: VecDeque<Vec<u8>>,
    spare: Vec<Vec<u8>>,
    rekey_wanted: bool,
    /// Data sent with no packet received since: a handshake starts if it lasts.
    unanswered_send: Option<Instant>,
    /// Data received with nothing sent since: a keepalive goes out if it lasts.
    unanswered_receive: Option<Instant>,
    expired: bool,
    /// Ephemeral keys, indices and retry jitter: a generator of the tunnel's own, seeded
    /// from the device's (the caller's) when the tunnel is made, so a run replays from the
    /// caller's seed and tunnels draw without sharing one generator.
    rng: ChaCha20Rng,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("slot", &self.slot)
            .field("current", &self.current.as_ref().map(|s| s.local_index))
            .field("pending", &self.pending.is_some())
            .finish_non_exhaustive()
    }
}

impl Sessions {
    /// A tunnel to `peer_public`, whose indices carry `slot` in their high 24 bits; its
    /// randomness is seeded from `rng`.
    pub fn new(
        local: &Local,
        peer_public: [u8; 32],
        psk: Option<[u8; 32]>,
        slot: u32,
        rng: &mut dyn CryptoRngCore,
    ) -> Result<Self, DropReason> {
        let peer = PeerIdentity::new(&local.identity, peer_public)
            .map_err(|_| DropReason::HandshakeRejected)?;
        Ok(Self::with_identity(peer, psk, slot, rng))
    }

    /// [`Sessions::new`] where no handshake is made with the peer (a checking device, or a
    /// worker that does not carry its session): the key is refused alike, without the static
    /// Diffie-Hellman ([`PeerIdentity::without_static_secret`]).
    pub fn without_static_secret(
        peer_public: [u8; 32],
        psk: Option<[u8; 32]>,
        slot: u32,
        rng: &mut dyn CryptoRngCore,
    ) -> Result<Self, DropReason> {
        let peer = PeerIdentity::without_static_secret(peer_public)
            .map_err(|_| DropReason::HandshakeRejected)?;
        Ok(Self::with_identity(peer, psk, slot, rng))
    }

    fn with_identity(
        peer: PeerIdentity,
        psk: Option<[u8; 32]>,
        slot: u32,
        rng: &mut dyn CryptoRngCore,
    ) -> Self {
        let mut seed = Zeroizing::new([0u8; 32]);
        rng.fill_bytes(&mut *seed);
        let mut rng = ChaCha20Rng::from_seed(*seed);
        Self {
            peer,
            psk: Zeroizing::new(psk.unwrap_or([0; 32])),
            slot,
            next_index: (rng.next_u32() & 0xff) as u8,
            pending: None,
            current: None,
            previous: None,
            next: None,
            cookie: None,
            last_mac1: None,
            last_timestamp: None,
            last_initiation_at: None,
            last_handshake: None,
            queue: VecDeque::new(),
            spare: Vec::new(),
            rekey_wanted: false,
            unanswered_send: None,
            unanswered_receive: None,
            expired: false,
            rng,
        }
    }

    /// Our static key changed: every session and handshake made with the old one ends.
    pub fn set_local(&mut self, local: &Local) -> Result<(), DropReason> {
        let public = self.peer.public();
        self.peer = if self.peer.has_static_secret() {
            PeerIdentity::new(&local.identity, public)
        } else {
            PeerIdentity::without_static_secret(public)
        }
        .map_err(|_| DropReason::HandshakeRejected)?;
        self.clear();
        Ok(())
    }

    /// The peer's keys, for finding it by the static key an initiation carries.
    pub fn identity(&self) -> &PeerIdentity {
        &self.peer
    }

    pub fn time_since_last_handshake(&self, now: Instant) -> Option<Duration> {
        self.last_handshake
            .map(|t| now.saturating_duration_since(t))
    }

    /// When the handshake attempt under way started (its first initiation), if one is.
    pub fn attempt_started(&self) -> Option<Instant> {
        self.pending.as_ref().map(|p| p.started_at)
    }

    /// Whether a session can carry data now.
    pub fn has_session(&self, now: Instant) -> bool {
        self.usable(now).is_some()
    }

    fn usable(&self, now: Instant) -> Option<&Session> {
        self.current
            .as_deref()
            .filter(|s| now.saturating_duration_since(s.born) < REJECT_AFTER_TIME)
    }

    /// Seals `packet` (padded) into `out` (room for `packet.len() + 32`), or queues it and
    /// starts a handshake when there is no session.
    pub fn encapsulate(
        &mut self,
        local: &Local,
        packet: &[u8],
        out: &mut [u8],
        now: Instant,
    ) -> Sent {
        if self.usable(now).is_some() {
            return match self.seal(packet, out, now) {
                Some(n) => Sent::Data(n),
                None => Sent::Dropped(DropReason::Other),
            };
        }
        self.enqueue(packet);
        // A session we answered for is about to be confirmed: wait for it rather than
        // crossing the initiator's handshake with one of our own.
        let confirming = self
            .next
            .as_ref()
            .is_some_and(|s| now.saturating_duration_since(s.born) < REKEY_TIMEOUT);
        if confirming {
            return Sent::Queued;
        }
        match self.initiate(local, out, now, false) {
            Some(n) => Sent::Initiation(n),
            None => Sent::Queued,
        }
    }

    /// Seals the next queued packet into `out` once a session is up.
    pub fn send_queued(&mut self, out: &mut [u8], now: Instant) -> Option<usize> {
        self.usable(now)?;
        let packet = self.queue.pop_front()?;
        let n = self.seal(&packet, out, now);
        self.spare.push(packet);
        n
    }

    pub fn has_queued(&self) -> bool {
        !self.queue.is_empty()
    }

    /// A keepalive (an empty data message) into `out`, if a session is up.
    pub fn keepalive(&mut self, out: &mut [u8], now: Instant) -> Option<usize> {
        self.usable(now)?;
        self.seal(&[], out, now)
    }

    // Inlined into `encapsulate`, as it was before the data header was written by `wire`:
    // measured in instructions per packet with callgrind (`benches/benches/core.rs`).
    #[inline]
    fn seal(&mut self, packet: &[u8], out: &mut [u8], now: Instant) -> Option<usize> {
        let session = self.current.as_mut()?;
        let n = session.seal(packet, out)?;
        let age = now.saturating_duration_since(session.born);
        if session.sent() >= REKEY_AFTER_MESSAGES || (session.initiator && age >= REKEY_AFTER_TIME)
        {
            self.rekey_wanted = true;
        }
        self.unanswered_receive = None;
        if !packet.is_empty() {
            self.unanswered_send.get_or_insert(now);
        }
        Some(n)
    }

    fn enqueue(&mut self, packet: &[u8]) {
        if self.queue.len() >= MAX_QUEUED {
            return;
        }
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(packet);
        self.queue.push_back(buf);
    }

    /// Writes a handshake initiation into `out`, unless one went out less than
    /// REKEY_TIMEOUT ago and `force` is false.
    pub fn initiate(
        &mut self,
        local: &Local,
        out: &mut [u8],
        now: Instant,
        force: bool,
    ) -> Option<usize> {
        if let Some(p) = &self.pending {
            if !force && now.saturating_duration_since(p.sent_at) < REKEY_TIMEOUT {
                return None;
            }
        }
        let msg: &mut [u8; INITIATION_LEN] = out.get_mut(..INITIATION_LEN)?.try_into().ok()?;
        let index = self.new_index();
        let cookie = self.fresh_cookie(now);
        let state = create_initiation(
            &local.identity,
            &self.peer,
            &self.psk,
            index,
            local.timestamp(now),
            cookie.as_ref(),
            &mut self.rng,
            msg,
        )
        .ok()?;
        self.last_mac1 = Some((state.mac1(), index));
        let started_at = self.pending.as_ref().map_or(now, |p| p.started_at);
        // Jitter keeps two sides that lost packets together from retrying in lock step.
        let jitter = Duration::from_millis(u64::from(self.rng.next_u32() % 334));
        self.pending = Some(Pending {
            state,
            sent_at: now,
            started_at,
            retry_after: REKEY_TIMEOUT + jitter,
        });
        Some(INITIATION_LEN)
    }

    /// Answers an initiation from this peer (found by the device from its static key) with a
    /// response in `out`.
    pub fn respond(
        &mut self,
        local: &Local,
        received: &ReceivedInitiation,
        out: &mut [u8],
        now: Instant,
    ) -> Result<usize, DropReason> {
        let timestamp = received.timestamp();
        // TAI64N is big-endian: byte order is time order. An older or equal one is a replay.
        if self.last_timestamp.is_some_and(|last| timestamp <= last) {
            return Err(DropReason::Replay);
        }
        if self
            .last_initiation_at
            .is_some_and(|t| now.saturating_duration_since(t) < MIN_INITIATION_INTERVAL)
        {
            return Err(DropReason::UnderLoad);
        }
        let msg: &mut [u8; RESPONSE_LEN] = out
            .get_mut(..RESPONSE_LEN)
            .and_then(|m| m.try_into().ok())
            .ok_or(DropReason::Other)?;
        let index = self.new_index();
        let cookie = self.fresh_cookie(now);
        let (keys, mac1) = create_response(
            &local.identity,
            &self.peer,
            received,
            &self.psk,
            index,
            cookie.as_ref(),
            &mut self.rng,
            msg,
        )
        .map_err(|_| DropReason::HandshakeRejected)?;
        self.last_timestamp = Some(timestamp);
        self.last_initiation_at = Some(now);
        self.last_mac1 = Some((mac1, index));
        self.next = Some(Box::new(Session::new(
            index,
            received.peer_index(),
            &keys.sending,
            &keys.receiving,
            now,
            false,
        )));
        self.unanswered_send = None;
        Ok(RESPONSE_LEN)
    }

    /// Takes a handshake response to our initiation: the session it completes becomes the
    /// current one. `Some(len)`: a keepalive to send back is in `out`.
    pub fn receive_response(
        &mut self,
        local: &Local,
        msg: Response<'_>,
        out: &mut [u8],
        now: Instant,
    ) -> Result<Option<usize>, DropReason> {
        let Some(pending) = &self.pending else {
            return Err(DropReason::UnknownIndex);
        };
        let response =
            consume_response(&pending.state, &local.identity, &self.peer, &self.psk, msg)
                .map_err(|e| super::drop_reason(&e))?;
        let index = pending.state.local_index();
        self.pending = None;
        // Initiations that crossed: the session we answered for is the one the peer uses
        // (it took our response as the end of its handshake), so it stays open to receive
        // as the previous one; dropping it left both sides sending on sessions the other
        // had dropped until a rekey (as wireguard-go does, it replaces the previous one).
        self.previous = match self.next.take() {
            Some(answered) => Some(answered),
            None => self.current.take(),
        };
        self.current = Some(Box::new(Session::new(
            index,
            response.peer_index,
            &response.keys.sending,
            &response.keys.receiving,
            now,
            true,
        )));
        self.handshake_done(now);
        // The responder may not send until it hears from us on the new session.
        Ok(if self.queue.is_empty() {
            self.keepalive(out, now)
        } else {
            None
        })
    }

    /// Takes a cookie reply to our last handshake message: its cookie goes into our next.
    pub fn receive_cookie(&mut self, msg: CookieReply<'_>, now: Instant) -> Result<(), DropReason> {
        let Some((mac1, index)) = self.last_mac1 else {
            return Err(DropReason::UnknownIndex);
        };
        if msg.receiver() != index {
            return Err(DropReason::UnknownIndex);
        }
        let cookie =
            consume_cookie_reply(&self.peer, &mac1, msg).map_err(|e| super::drop_reason(&e))?;
        self.cookie = Some((cookie, now));
        Ok(())
    }

    /// Opens a data message into `out`, on whichever of our sessions it names.
    pub fn receive_data(
        &mut self,
        data: Data<'_>,
        out: &mut [u8],
        now: Instant,
    ) -> Result<Opened, DropReason> {
        let index = data.receiver();
        let named = |s: &Option<Box<Session>>| s.as_ref().is_some_and(|s| s.local_index == index);
        let which = if named(&self.current) {
            &mut self.current
        } else if named(&self.next) {
            &mut self.next
        } else if named(&self.previous) {
            &mut self.previous
        } else {
            return Err(DropReason::UnknownIndex);
        };
        let Some(session) = which.as_mut() else {
            return Err(DropReason::UnknownIndex);
        };
        if now.saturating_duration_since(session.born) >= REJECT_AFTER_TIME {
            return Err(DropReason::Expired);
        }
        let len = session.open(data, out)?;
        let rekey_on_receive = session.initiator
            && now.saturating_duration_since(session.born)
                >= REJECT_AFTER_TIME - KEEPALIVE_TIMEOUT - REKEY_TIMEOUT;
        if named(&self.next) {
            // The initiator used the session we answered for: it is confirmed.
            self.previous = self.current.take();
            self.current = self.next.take();
            self.handshake_done(now);
        }
        if rekey_on_receive && named(&self.current) {
            self.rekey_wanted = true;
        }
        self.unanswered_send = None;
        if len == 0 {
            return Ok(Opened::Keepalive);
        }
        self.unanswered_receive.get_or_insert(now);
        match inner_packet(&out[..len]) {
            Some((len, source)) => Ok(Opened::Packet { len, source }),
            None => Err(DropReason::Malformed),
        }
    }

    /// Runs the timers: handshake retries and their end, rekeys, keepalives, expiry.
    pub fn tick(&mut self, local: &Local, out: &mut [u8], now: Instant) -> Timer {
        let since = |t: Instant| now.saturating_duration_since(t);
        if !self.expired
            && self
                .last_handshake
                .is_some_and(|t| since(t) >= REJECT_AFTER_TIME * 3)
        {
            self.clear();
            self.expired = true;
            return Timer::Expired;
        }
        if let Some(p) = &self.pending {
            if since(p.started_at) >= REKEY_ATTEMPT_TIME {
                // Give up; the next packet to send starts a new attempt.
                self.pending = None;
                self.drop_queue();
                self.unanswered_send = None;
            } else if since(p.sent_at) >= p.retry_after {
                return self.timer_initiation(local, out, now);
            }
        } else if self.rekey_wanted
            || self
                .unanswered_send
                .is_some_and(|t| since(t) >= KEEPALIVE_TIMEOUT + REKEY_TIMEOUT)
        {
            self.rekey_wanted = false;
            self.unanswered_send = None;
            return self.timer_initiation(local, out, now);
        }
        if self
            .unanswered_receive
            .is_some_and(|t| since(t) >= KEEPALIVE_TIMEOUT)
        {
            if let Some(n) = self.keepalive(out, now) {
                return Timer::Send(n);
            }
        }
        Timer::Idle
    }

    fn timer_initiation(&mut self, local: &Local, out: &mut [u8], now: Instant) -> Timer {
        match self.initiate(local, out, now, true) {
            Some(n) => Timer::Send(n),
            None => Timer::Idle,
        }
    }

    fn handshake_done(&mut self, now: Instant) {
        self.last_handshake = Some(now);
        self.expired = false;
        self.rekey_wanted = false;
    }

    fn clear(&mut self) {
        self.pending = None;
        self.current = None;
        self.previous = None;
        self.next = None;
        self.drop_queue();
        self.rekey_wanted = false;
        self.unanswered_send = None;
        self.unanswered_receive = None;
    }

    fn drop_queue(&mut self) {
        while let Some(buf) = self.queue.pop_front() {
            self.spare.push(buf);
        }
    }

    fn fresh_cookie(&self, now: Instant) -> Option<[u8; 16]> {
        self.cookie
            .filter(|(_, at)| now.saturating_duration_since(*at) < COOKIE_LIFETIME)
            .map(|(c, _)| c)
    }

    /// A new index: the slot, and a counter that no live session or handshake uses.
    fn new_index(&mut self) -> u32 {
        loop {
            self.next_index = self.next_index.wrapping_add(1);
            let index = (self.slot << 8) | u32::from(self.next_index);
            let used = [&self.current, &self.previous, &self.next]
                .iter()
                .any(|s| s.as_ref().is_some_and(|s| s.local_index == index))
                || self
                    .pending
                    .as_ref()
                    .is_some_and(|p| p.state.local_index() == index);
            if !used {
                return index;
            }
        }
    }
}

/// The length (without padding) and source of the IP packet a data message carried, `None`
/// if it is not a whole IPv4 or IPv6 packet.
fn inner_packet(plain: &[u8]) -> Option<(usize, IpAddr)> {
    match plain.first()? >> 4 {
        4 if plain.len() >= 20 => {
            let len = usize::from(u16::from_be_bytes([plain[2], plain[3]]));
            let source: [u8; 4] = plain[12..16].try_into().ok()?;
            (20..=plain.len())
                .contains(&len)
                .then_some((len, IpAddr::V4(Ipv4Addr::from(source))))
        }
        6 if plain.len() >= 40 => {
            let len = 40 + usize::from(u16::from_be_bytes([plain[4], plain[5]]));
            let source: [u8; 16] = plain[8..24].try_into().ok()?;
            (len <= plain.len()).then_some((len, IpAddr::V6(Ipv6Addr::from(source))))
        }
        _ => None,
    }
}

/// Room a data message needs in `out` for a (padded) packet of `len` bytes.
pub const fn sealed_len(len: usize) -> usize {
    DATA_HEADER_LEN + len + TAG_LEN
}

/// Our `Sessions` against boringtun's `Tunn` over a perfect link, with both clocks in step:
/// boringtun (a dev-dependency with `mock-instant`) reads `MockClock`, ours the `now` passed
/// in. Ten minutes of traffic each way cross several rekeys, whoever initiated first.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::noise::handshake::consume_initiation;
    use crate::noise::handshake::tests::{boringtun, ipv4_udp, keys};
    use crate::wire::{self, Message};
    use boringtun::noise::{Tunn, TunnResult};
    use mock_instant::MockClock;

    struct Link {
        ours: Sessions,
        local: Local,
        theirs: Tunn,
        now: Instant,
        start: Instant,
        /// Datagrams in flight: (to us?, bytes).
        wire: VecDeque<(bool, Vec<u8>)>,
        to_us: Vec<Vec<u8>>,
        to_them: Vec<Vec<u8>>,
        initiations: [u32; 2],
    }

    impl Link {
        fn new() -> Self {
            let (a, b) = (keys(), keys());
            let now = Instant::now();
            let unix = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            let local = Local::new(a.private, now, unix);
            MockClock::set_time(Duration::ZERO);
            Self {
                ours: Sessions::new(&local, b.public, None, 7, &mut rand_core::OsRng).unwrap(),
                local,
                theirs: boringtun(&b, a.public, None, None),
                now,
                start: now,
                wire: VecDeque::new(),
                to_us: Vec::new(),
                to_them: Vec::new(),
                initiations: [0; 2],
            }
        }

        fn advance(&mut self, by: Duration) {
            self.now += by;
            MockClock::advance(by);
        }

        fn send_ours(&mut self, packet: &[u8]) {
            let mut out = vec![0u8; 2048];
            match self
                .ours
                .encapsulate(&self.local, packet, &mut out, self.now)
            {
                Sent::Data(n) | Sent::Initiation(n) => {
                    self.wire.push_back((false, out[..n].to_vec()))
                }
                Sent::Queued => {}
                Sent::Dropped(r) => panic!("our tunnel dropped a packet: {r}"),
            }
        }

        fn send_theirs(&mut self, packet: &[u8]) {
            let mut out = vec![0u8; 2048];
            match self.theirs.encapsulate(packet, &mut out) {
                TunnResult::WriteToNetwork(d) => self.wire.push_back((true, d.to_vec())),
                TunnResult::Done => {}
                other => panic!("boringtun: {other:?}"),
            }
        }

        fn tick(&mut self) {
            let mut out = vec![0u8; 2048];
            if let Timer::Send(n) = self.ours.tick(&self.local, &mut out, self.now) {
                self.wire.push_back((false, out[..n].to_vec()));
            }
            if let TunnResult::WriteToNetwork(d) = self.theirs.update_timers(&mut out) {
                self.wire.push_back((true, d.to_vec()));
            }
        }

        /// Delivers everything in flight, and what that makes either side send, in order.
        fn deliver(&mut self) {
            let mut out = vec![0u8; 2048];
            while let Some((to_us, datagram)) = self.wire.pop_front() {
                if datagram[0] == 1 {
                    self.initiations[usize::from(to_us)] += 1;
                }
                if to_us {
                    self.deliver_to_us(&datagram, &mut out);
                } else {
                    self.deliver_to_them(&datagram, &mut out);
                }
            }
        }

        fn deliver_to_us(&mut self, datagram: &[u8], out: &mut [u8]) {
            let (ours, local, now) = (&mut self.ours, &self.local, self.now);
            let dropped = |r: DropReason| panic!("we dropped boringtun's datagram: {r}");
            match wire::parse(datagram).unwrap() {
                Message::Initiation(initiation) => {
                    let peer = ours.identity();
                    let received = consume_initiation(&local.identity, initiation, |k| {
                        (*k == peer.public()).then_some(peer)
                    })
                    .unwrap();
                    let n = ours.respond(local, &received, out, now).unwrap();
                    self.wire.push_back((false, out[..n].to_vec()));
                    return;
                }
                Message::Response(response) => {
                    match ours.receive_response(local, response, out, now) {
                        Ok(Some(n)) => self.wire.push_back((false, out[..n].to_vec())),
                        Ok(None) => {}
                        Err(r) => dropped(r),
                    }
                }
                Message::CookieReply(reply) => {
                    ours.receive_cookie(reply, now).unwrap_or_else(dropped)
                }
                Message::Data(data) => match ours.receive_data(data, out, now) {
                    Ok(Opened::Packet { len, .. }) => self.to_us.push(out[..len].to_vec()),
                    Ok(Opened::Keepalive) => {}
                    Err(r) => dropped(r),
                },
            }
            while let Some(n) = ours.send_queued(out, now) {
                self.wire.push_back((false, out[..n].to_vec()));
            }
        }

        fn deliver_to_them(&mut self, datagram: &[u8], out: &mut [u8]) {
            let mut result = self.theirs.decapsulate(None, datagram, out);
            loop {
                match result {
                    TunnResult::WriteToNetwork(d) => self.wire.push_back((true, d.to_vec())),
                    TunnResult::WriteToTunnelV4(p, _) => {
                        self.to_them.push(p.to_vec());
                        return;
                    }
                    TunnResult::Done => return,
                    other => panic!("boringtun refused our datagram: {other:?}"),
                }
                // boringtun sends what it queued during the handshake one call at a time.
                result = self.theirs.decapsulate(None, &[], out);
            }
        }

        fn elapsed(&self) -> Duration {
            self.now - self.start
        }
    }

    /// Ten minutes, a packet each way every second, timers every 250 ms: every packet
    /// arrives, and the sessions are renewed about every two minutes.
    fn ten_minutes(we_start: bool) {
        let mut link = Link::new();
        let mut sent = 0u32;
        while link.elapsed() < Duration::from_secs(600) {
            for step in 0..4 {
                if step == 0 {
                    let ping = ipv4_udp(
                        [10, 0, 0, 1].into(),
                        [10, 0, 0, 2].into(),
                        &sent.to_be_bytes(),
                    );
                    let pong = ipv4_udp(
                        [10, 0, 0, 2].into(),
                        [10, 0, 0, 1].into(),
                        &sent.to_be_bytes(),
                    );
                    if we_start {
                        link.send_ours(&ping);
                        link.deliver();
                        link.send_theirs(&pong);
                    } else {
                        link.send_theirs(&pong);
                        link.deliver();
                        link.send_ours(&ping);
                    }
                    link.deliver();
                    sent += 1;
                }
                link.advance(Duration::from_millis(250));
                link.tick();
                link.deliver();
            }
        }
        assert_eq!(link.to_them.len() as u32, sent, "our packets lost");
        assert_eq!(link.to_us.len() as u32, sent, "boringtun's packets lost");
        for (i, (a, b)) in link.to_them.iter().zip(&link.to_us).enumerate() {
            assert_eq!(
                a[28..],
                (i as u32).to_be_bytes(),
                "our packet {i} out of order"
            );
            assert_eq!(
                b[28..],
                (i as u32).to_be_bytes(),
                "boringtun's packet {i} out of order"
            );
        }
        let handshakes = link.initiations[0] + link.initiations[1];
        // The first, then one per REKEY_AFTER_TIME (2 min), by whichever side initiated.
        assert!(
            (5..=7).contains(&handshakes),
            "initiations ours/theirs {:?} in 10 minutes",
            link.initiations
        );
    }

    #[test]
    fn ten_minutes_with_boringtun_when_we_initiate() {
        ten_minutes(true);
    }

    #[test]
    fn ten_minutes_with_boringtun_when_it_initiates() {
        ten_minutes(false);
    }

    /// Two of ours initiate at once (both add the other with a keepalive, as the fleet's
    /// gateways do): each answers the other's initiation, then takes the answer to its own.
    /// Data then flows both ways at once, each side on the session it initiated.
    #[test]
    fn crossed_initiations_leave_both_sides_a_working_session() {
        let (ka, kb) = (keys(), keys());
        let now = Instant::now();
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        let (la, lb) = (
            Local::new(ka.private, now, unix),
            Local::new(kb.private, now, unix),
        );
        let mut a = Sessions::new(&la, kb.public, None, 1, &mut rand_core::OsRng).unwrap();
        let mut b = Sessions::new(&lb, ka.public, None, 2, &mut rand_core::OsRng).unwrap();
        let mut init_a = vec![0u8; 2048];
        let mut init_b = vec![0u8; 2048];
        let n = a.initiate(&la, &mut init_a, now, false).unwrap();
        init_a.truncate(n);
        let n = b.initiate(&lb, &mut init_b, now, false).unwrap();
        init_b.truncate(n);
        let respond = |s: &mut Sessions, local: &Local, init: &[u8]| {
            let Message::Initiation(msg) = wire::parse(init).unwrap() else {
                panic!("an initiation")
            };
            let peer = s.identity();
            let received = consume_initiation(&local.identity, msg, |k| {
                (*k == peer.public()).then_some(peer)
            })
            .unwrap();
            let mut out = vec![0u8; 2048];
            let n = s.respond(local, &received, &mut out, now).unwrap();
            out.truncate(n);
            out
        };
        let resp_a = respond(&mut a, &la, &init_b);
        let resp_b = respond(&mut b, &lb, &init_a);
        let take = |s: &mut Sessions, local: &Local, resp: &[u8]| {
            let Message::Response(msg) = wire::parse(resp).unwrap() else {
                panic!("a response")
            };
            let mut out = vec![0u8; 2048];
            s.receive_response(local, msg, &mut out, now).unwrap();
        };
        take(&mut a, &la, &resp_b);
        take(&mut b, &lb, &resp_a);
        let packet = ipv4_udp(
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::new(10, 0, 0, 2),
            b"across",
        );
        let send = |from: &mut Sessions, local: &Local, to: &mut Sessions| {
            let mut out = vec![0u8; 2048];
            let Sent::Data(n) = from.encapsulate(local, &packet, &mut out, now) else {
                panic!("a session to send on")
            };
            let Message::Data(data) = wire::parse(&out[..n]).unwrap() else {
                panic!("data")
            };
            let mut plain = vec![0u8; 2048];
            match to.receive_data(data, &mut plain, now) {
                Ok(Opened::Packet { .. }) => {}
                other => panic!("the other side cannot open it: {other:?}"),
            }
        };
        send(&mut a, &la, &mut b);
        send(&mut b, &lb, &mut a);
        send(&mut a, &la, &mut b);
    }
}
