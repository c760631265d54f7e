//! Liveness probes between a site's gateways: how a standby learns in a fifth of a second,
//! not a lease's TTL, that its site's active gateway died.
//!
//! Every gateway answers probes on UDP [`probe_port`] (its advertised WireGuard port + 1) from
//! the other gateways of its site; a standby probes its site's active gateway every
//! [`INTERVAL`] from a socket connected to it. Each probe and answer carries the sender's
//! public key, a nonce and a MAC keyed from the X25519 of the two gateways' static keys, which
//! only those two can compute: nothing off their path can forge an answer ("alive") or make
//! one fail ("dead") but by dropping packets. An answer counts only for a nonce of one of the
//! last probes sent, so an old one replayed proves nothing.
//!
//! The verdict "dead": no answer for [`DEAD_AFTER`] (four probes), or an ICMP port
//! unreachable (the host lives, the process does not: a `kill -9`) followed by no answer to a
//! probe sent at once, within [`ICMP_CONFIRM`] or twice the last round trip (an ICMP error
//! is not authenticated; a forged one only makes the standby ask again). Only a gateway that
//! has had an answer since it started watching this active gateway judges it: a probe path
//! that never worked (a firewall) is no death. The verdict goes to the member loop, which
//! asks etcd to end the dead gateway's lease: etcd stays the authority (see `take_over`).

use blake2::digest::consts::U16;
use blake2::digest::Mac;
use blake2::{Blake2s256, Blake2sMac, Digest};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tunneld_crypto::{PrivateKey, PublicKey};

/// How often a standby probes its site's active gateway.
pub const INTERVAL: Duration = Duration::from_millis(50);
/// No answer for this long: dead.
pub const DEAD_AFTER: Duration = Duration::from_millis(200);
/// After an ICMP port unreachable, how long an answer may take before it counts as death
/// (at least; twice the last round trip when that is longer).
pub const ICMP_CONFIRM: Duration = Duration::from_millis(30);
/// While the verdict stands (no answer), it is said again this often: the member loop may
/// not have been able to act on it (etcd unreachable).
const REPEAT: Duration = Duration::from_secs(1);
/// Probes whose answers still count.
const OUTSTANDING: usize = 16;

const MAGIC: &[u8; 4] = b"tfp1";
const PROBE_LABEL: &[u8] = b"tunneld fleet probe v1";
const PING: u8 = 1;
const PONG: u8 = 2;
const BODY: usize = 4 + 1 + 32 + 8;
const LEN: usize = BODY + 16;

/// The UDP port a gateway answers probes on: its advertised WireGuard port + 1 (none for
/// 65535).
pub fn probe_port(wireguard_port: u16) -> Option<u16> {
    wireguard_port.checked_add(1)
}

/// The gateway a standby watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watched {
    pub public_key: PublicKey,
    /// Its probe address.
    pub address: SocketAddr,
    /// `site/gateway`, for the log and `show`.
    pub name: String,
}

/// A death the prober saw: the gateway and why.
#[derive(Debug, Clone)]
pub struct Death {
    pub public_key: PublicKey,
    pub name: String,
    pub reason: String,
}

/// What `show` and `/metrics` tell of the probes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeView {
    /// The gateway probed and its probe address.
    pub watched: Option<(String, SocketAddr)>,
    /// The last answer's round trip.
    pub rtt: Option<Duration>,
    /// When the last answer came.
    pub last_answer: Option<Instant>,
    /// Probes answered for other gateways of the site.
    pub answered: u64,
}

/// The keys of one pair of gateways, from their X25519 shared secret and a label that
/// keeps each use's keys apart (probes, a relay's registrations).
pub(crate) struct PairKeys {
    own: PrivateKey,
    own_public: PublicKey,
    label: &'static [u8],
    cache: HashMap<PublicKey, [u8; 32]>,
}

impl PairKeys {
    pub(crate) fn new(own: PrivateKey, label: &'static [u8]) -> PairKeys {
        PairKeys {
            own_public: own.public_key(),
            own,
            label,
            cache: HashMap::new(),
        }
    }

    pub(crate) fn key(&mut self, peer: &PublicKey) -> [u8; 32] {
        if let Some(k) = self.cache.get(peer) {
            return *k;
        }
        let secret = self
            .own
            .to_static_secret()
            .diffie_hellman(&x25519_dalek::PublicKey::from(*peer.as_bytes()));
        let (low, high) = if self.own_public.as_bytes() < peer.as_bytes() {
            (self.own_public, *peer)
        } else {
            (*peer, self.own_public)
        };
        let key: [u8; 32] = Blake2s256::new()
            .chain_update(self.label)
            .chain_update(secret.as_bytes())
            .chain_update(low.as_bytes())
            .chain_update(high.as_bytes())
            .finalize()
            .into();
        self.cache.insert(*peer, key);
        key
    }
}

/// BLAKE2s in its keyed mode (a MAC by design), cut to 16 bytes.
type ProbeMac = Blake2sMac<U16>;

pub(crate) fn mac(key: &[u8; 32], body: &[u8]) -> ProbeMac {
    // BLAKE2s takes keys of 1 to 32 bytes: a 32-byte key is always accepted.
    #[allow(clippy::expect_used)]
    let mut mac = <ProbeMac as Mac>::new_from_slice(key).expect("BLAKE2s accepts 32-byte keys");
    mac.update(body);
    mac
}

fn seal(kind: u8, sender: &PublicKey, nonce: u64, key: &[u8; 32]) -> [u8; LEN] {
    let mut packet = [0u8; LEN];
    packet[..4].copy_from_slice(MAGIC);
    packet[4] = kind;
    packet[5..37].copy_from_slice(sender.as_bytes());
    packet[37..45].copy_from_slice(&nonce.to_be_bytes());
    let tag = mac(key, &packet[..BODY]).finalize().into_bytes();
    packet[BODY..].copy_from_slice(&tag);
    packet
}

/// The kind, sender and nonce of a well-formed packet (its MAC not checked yet).
fn open(packet: &[u8]) -> Option<(u8, PublicKey, u64)> {
    if packet.len() != LEN || &packet[..4] != MAGIC {
        return None;
    }
    let sender = PublicKey::from_bytes(packet[5..37].try_into().ok()?);
    let nonce = u64::from_be_bytes(packet[37..45].try_into().ok()?);
    Some((packet[4], sender, nonce))
}

fn authentic(packet: &[u8], key: &[u8; 32]) -> bool {
    // `verify_slice` compares in constant time: a byte-by-byte comparison would leak how much
    // of a forgery was right.
    mac(key, &packet[..BODY])
        .verify_slice(&packet[BODY..])
        .is_ok()
}

struct Inner {
    /// The site's other gateways, whose probes are answered.
    site: Mutex<HashSet<PublicKey>>,
    watched: Mutex<Option<Watched>>,
    view: Mutex<ProbeView>,
    stop: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The probes' two threads: one answers, one probes. Dropping it stops both.
pub(crate) struct Probes {
    inner: Arc<Inner>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Probes {
    /// Answers probes on `port` (both address families where the host has them) and probes
    /// whatever [`Probes::watch`] names; deaths go to `deaths`.
    pub fn start(
        own: PrivateKey,
        port: u16,
        deaths: tokio::sync::mpsc::UnboundedSender<Death>,
        name: String,
    ) -> std::io::Result<Probes> {
        let socket = bind_any(port)?;
        socket.set_read_timeout(Some(Duration::from_millis(200)))?;
        let inner = Arc::new(Inner {
            site: Mutex::new(HashSet::new()),
            watched: Mutex::new(None),
            view: Mutex::new(ProbeView::default()),
            stop: AtomicBool::new(false),
        });
        let keys = || PairKeys::new(own.clone(), PROBE_LABEL);
        let answerer = {
            let (inner, mut keys) = (inner.clone(), keys());
            std::thread::Builder::new()
                .name("fleet-probe-answer".into())
                .spawn(move || answer(&inner, &socket, &mut keys))?
        };
        let prober = {
            let (inner, mut keys) = (inner.clone(), keys());
            std::thread::Builder::new()
                .name("fleet-probe".into())
                .spawn(move || probe(&inner, &mut keys, &deaths, &name))?
        };
        Ok(Probes {
            inner,
            threads: vec![answerer, prober],
        })
    }

    /// The site's other gateways (whose probes are answered) and the one to watch, if any.
    pub fn set(&self, site: impl IntoIterator<Item = PublicKey>, watched: Option<Watched>) {
        *lock(&self.inner.site) = site.into_iter().collect();
        *lock(&self.inner.watched) = watched;
    }

    pub fn view(&self) -> ProbeView {
        lock(&self.inner.view).clone()
    }
}

impl Drop for Probes {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A socket on `port` for both families: IPv6 dual-stack where the host has IPv6, else IPv4.
fn bind_any(port: u16) -> std::io::Result<UdpSocket> {
    UdpSocket::bind(("::", port)).or_else(|_| UdpSocket::bind(("0.0.0.0", port)))
}

fn answer(inner: &Inner, socket: &UdpSocket, keys: &mut PairKeys) {
    let mut buf = [0u8; 128];
    while !inner.stop.load(Ordering::Relaxed) {
        let (len, from) = match socket.recv_from(&mut buf) {
            Ok(got) => got,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => continue,
        };
        let packet = &buf[..len];
        let Some((PING, sender, nonce)) = open(packet) else {
            continue;
        };
        if !lock(&inner.site).contains(&sender) {
            continue;
        }
        let key = keys.key(&sender);
        if !authentic(packet, &key) {
            continue;
        }
        let reply = seal(PONG, &keys.own_public, nonce, &key);
        if socket.send_to(&reply, from).is_ok() {
            lock(&inner.view).answered += 1;
        }
    }
}

/// The prober's state for the gateway it watches.
struct Watch {
    target: Watched,
    socket: UdpSocket,
    key: [u8; 32],
    /// Probes sent whose answers still count: (nonce, when).
    sent: VecDeque<(u64, Instant)>,
    next_nonce: u64,
    /// The last answer (none yet: no verdict).
    last_answer: Option<Instant>,
    rtt: Option<Duration>,
    /// An ICMP port unreachable, after the last answer.
    refused_at: Option<Instant>,
    /// When the verdict was last said (cleared by an answer).
    said_at: Option<Instant>,
}

impl Watch {
    fn new(target: Watched, keys: &mut PairKeys) -> std::io::Result<Watch> {
        let local: SocketAddr = if target.address.is_ipv4() {
            "0.0.0.0:0".parse().expect("an address")
        } else {
            "[::]:0".parse().expect("an address")
        };
        let socket = UdpSocket::bind(local)?;
        // Connected: the kernel reports the peer's ICMP port unreachable on this socket.
        socket.connect(target.address)?;
        let key = keys.key(&target.public_key);
        Ok(Watch {
            target,
            socket,
            key,
            sent: VecDeque::new(),
            next_nonce: crate::jitter_u64(),
            last_answer: None,
            rtt: None,
            refused_at: None,
            said_at: None,
        })
    }

    fn send(&mut self, own: &PublicKey) {
        let nonce = self.next_nonce;
        self.next_nonce = self.next_nonce.wrapping_add(1);
        let packet = seal(PING, own, nonce, &self.key);
        match self.socket.send(&packet) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => self.refused(),
            Err(_) => {}
        }
        self.sent.push_back((nonce, Instant::now()));
        while self.sent.len() > OUTSTANDING {
            self.sent.pop_front();
        }
    }

    fn refused(&mut self) {
        if self.refused_at.is_none() {
            self.refused_at = Some(Instant::now());
        }
    }

    /// Reads what came until `until`.
    fn receive(&mut self, until: Instant, own: &PublicKey) {
        let mut buf = [0u8; 128];
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            let _ = self.socket.set_read_timeout(Some(left));
            match self.socket.recv(&mut buf) {
                Ok(len) => {
                    let packet = &buf[..len];
                    let Some((PONG, sender, nonce)) = open(packet) else {
                        continue;
                    };
                    if sender != self.target.public_key || !authentic(packet, &self.key) {
                        continue;
                    }
                    let Some(&(_, sent)) = self.sent.iter().find(|(n, _)| *n == nonce) else {
                        continue;
                    };
                    let now = Instant::now();
                    self.rtt = Some(now - sent);
                    self.last_answer = Some(now);
                    self.refused_at = None;
                    self.said_at = None;
                }
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                    let first = self.refused_at.is_none();
                    self.refused();
                    // Asked again at once: a forged ICMP error is answered by the live peer.
                    if first {
                        self.send(own);
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return,
                Err(_) => return,
            }
        }
    }

    /// Why the watched gateway is dead, if it is.
    fn verdict(&self, now: Instant) -> Option<String> {
        let last = self.last_answer?;
        let silent = now.saturating_duration_since(last);
        if let Some(refused) = self.refused_at {
            let confirm = ICMP_CONFIRM.max(self.rtt.unwrap_or_default() * 2);
            if now.saturating_duration_since(refused) >= confirm {
                return Some(format!(
                    "its host answers its probe port with ICMP port unreachable (no tunneld there), its last answer {} ms ago",
                    silent.as_millis()
                ));
            }
        }
        (silent >= DEAD_AFTER)
            .then(|| format!("no answer to its probes for {} ms", silent.as_millis()))
    }
}

fn probe(
    inner: &Inner,
    keys: &mut PairKeys,
    deaths: &tokio::sync::mpsc::UnboundedSender<Death>,
    name: &str,
) {
    let own = keys.own_public;
    let mut watch: Option<Watch> = None;
    let mut next = Instant::now();
    while !inner.stop.load(Ordering::Relaxed) {
        let target = lock(&inner.watched).clone();
        if watch.as_ref().map(|w| &w.target) != target.as_ref() {
            watch = target.and_then(|t| match Watch::new(t.clone(), keys) {
                Ok(w) => Some(w),
                Err(e) => {
                    tracing::warn!(
                        "{name}: cannot probe {} at {}: {e}; its death shows only when its lease expires",
                        t.name,
                        t.address
                    );
                    None
                }
            });
            let mut view = lock(&inner.view);
            view.watched = watch
                .as_ref()
                .map(|w| (w.target.name.clone(), w.target.address));
            view.rtt = None;
            view.last_answer = None;
        }
        let Some(w) = watch.as_mut() else {
            std::thread::sleep(INTERVAL);
            next = Instant::now();
            continue;
        };
        w.send(&own);
        next += INTERVAL;
        let now = Instant::now();
        if next < now {
            next = now + INTERVAL;
        }
        // Read until the next probe, deciding as soon as something is decided.
        while Instant::now() < next {
            let step = (Instant::now() + Duration::from_millis(10)).min(next);
            w.receive(step, &own);
            let now = Instant::now();
            if let Some(reason) = w.verdict(now) {
                if w.said_at.is_none_or(|t| now >= t + REPEAT) {
                    w.said_at = Some(now);
                    let _ = deaths.send(Death {
                        public_key: w.target.public_key,
                        name: w.target.name.clone(),
                        reason,
                    });
                }
            }
        }
        let mut view = lock(&inner.view);
        view.rtt = w.rtt;
        view.last_answer = w.last_answer;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (PairKeys, PairKeys) {
        let (a, b) = (PrivateKey::generate(), PrivateKey::generate());
        let keys = |k: &PrivateKey| PairKeys::new(k.clone(), PROBE_LABEL);
        (keys(&a), keys(&b))
    }

    /// Both ends derive the same key; a third gateway's, a changed byte, a reflected probe
    /// (its kind changed) or a wrong sender fail.
    #[test]
    fn only_the_two_gateways_can_make_a_probe_or_its_answer() {
        let (mut a, mut b) = pair();
        let (mut c, _) = pair();
        let ab = a.key(&b.own_public);
        assert_eq!(ab, b.key(&a.own_public));
        assert_ne!(ab, c.key(&b.own_public));
        let ping = seal(PING, &a.own_public, 7, &ab);
        assert_eq!(open(&ping), Some((PING, a.own_public, 7)));
        assert!(authentic(&ping, &ab));
        assert!(!authentic(&ping, &c.key(&b.own_public)));
        for i in 0..LEN {
            let mut bad = ping;
            bad[i] ^= 1;
            assert!(
                open(&bad).is_none() || !authentic(&bad, &ab),
                "byte {i} changed"
            );
        }
        assert!(open(&ping[..LEN - 1]).is_none());
    }

    /// Over loopback: a live answerer keeps the verdict away; once it stops, the socket
    /// answers ICMP port unreachable and the verdict follows within the confirmation time.
    #[test]
    fn a_closed_probe_port_is_a_death_at_once_and_silence_after_dead_after() {
        let (a, b) = (PrivateKey::generate(), PrivateKey::generate());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let port = {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            s.local_addr().unwrap().port()
        };
        let answering = Probes::start(
            a.clone(),
            port,
            tokio::sync::mpsc::unbounded_channel().0,
            "a".into(),
        )
        .unwrap();
        answering.set([b.public_key()], None);
        let watching = Probes::start(b.clone(), 0, tx, "b".into()).unwrap();
        watching.set(
            [a.public_key()],
            Some(Watched {
                public_key: a.public_key(),
                address: SocketAddr::from(([127, 0, 0, 1], port)),
                name: "s/a".into(),
            }),
        );
        std::thread::sleep(Duration::from_millis(500));
        assert!(rx.try_recv().is_err(), "a live gateway is no death");
        let view = watching.view();
        assert!(view.rtt.is_some() && view.last_answer.is_some(), "{view:?}");
        assert!(answering.view().answered >= 5);
        let stopped = Instant::now();
        drop(answering);
        let death = loop {
            if let Ok(d) = rx.try_recv() {
                break d;
            }
            assert!(stopped.elapsed() < Duration::from_secs(2), "no verdict");
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(death.public_key, a.public_key());
        assert!(
            death.reason.contains("ICMP port unreachable"),
            "{}",
            death.reason
        );
        assert!(stopped.elapsed() < DEAD_AFTER + Duration::from_millis(100));
    }
}
