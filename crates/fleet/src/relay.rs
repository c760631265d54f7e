//! The fleet's relays: a gateway with a public address (`[fleet] relay = true`) forwards the
//! WireGuard datagrams of a pair of gateways that cannot reach each other directly (both
//! behind NATs that map each destination apart, or one such and one that filters by port),
//! without decrypting them.
//!
//! Each pair gets a UDP port of its own on the relay, as a TURN server allocates one: both
//! sides send their WireGuard datagrams to it, and the relay sends each on, unchanged and
//! from that same port, to the other side. To either side the other is then simply at
//! `relay:port`: handshakes, roaming and keepalives work as on any path, and datagrams the
//! kernel merged on receipt (UDP GRO) leave as the same datagrams in one send (GSO).
//!
//! The relay learns where a side is (its NAT's mapping toward that port) only from a
//! registration the side sends from its WireGuard socket (`Gateway::send_datagram`, so the
//! NAT maps it as it maps WireGuard's datagrams): the side's key, its peer's, the port, a
//! stamp that must grow, and a MAC keyed from the X25519 of the side's and the relay's
//! static keys, which no third party has. A datagram from any other address is dropped.
//! The relay is no party to the pair's handshakes and holds none of their keys: what it
//! forwards and counts is ciphertext.

use crate::probe::{mac, PairKeys};
use crate::record::key_hex as hex;
use blake2::digest::Mac;
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tunneld_crypto::{PrivateKey, PublicKey};
use tunneld_dataplane::udp::UdpSocket;
use tunneld_dataplane::{Batch, DatagramIo};

const MAGIC: &[u8; 4] = b"tfr1";
const LABEL: &[u8] = b"tunneld fleet relay v1";
const BODY: usize = 4 + 32 + 32 + 2 + 8;
/// A registration's length on the wire.
pub const REGISTRATION_LEN: usize = BODY + 16;
/// How long a forwarding thread waits for datagrams before it looks whether to stop.
const IDLE: Duration = Duration::from_millis(200);
/// Batches a forwarding thread takes per wake-up before it waits again.
const BATCHES_PER_WAKE: usize = 16;

/// Two gateways' keys, the lower first: the pair a relay port serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pair(pub PublicKey, pub PublicKey);

impl Pair {
    pub fn new(a: PublicKey, b: PublicKey) -> Pair {
        if a.as_bytes() <= b.as_bytes() {
            Pair(a, b)
        } else {
            Pair(b, a)
        }
    }

    /// The other side of the pair from `key`, if `key` is one of its sides.
    pub fn other(&self, key: &PublicKey) -> Option<PublicKey> {
        if *key == self.0 {
            Some(self.1)
        } else if *key == self.1 {
            Some(self.0)
        } else {
            None
        }
    }

    /// `<low hex>-<high hex>`: how the store's keys name it.
    pub fn to_hex(&self) -> String {
        format!("{}-{}", hex(&self.0), hex(&self.1))
    }

    pub fn from_hex(s: &str) -> Option<Pair> {
        let (a, b) = s.split_once('-')?;
        let (a, b) = (
            crate::record::seen_subject(a)?,
            crate::record::seen_subject(b)?,
        );
        (a.as_bytes() < b.as_bytes()).then_some(Pair(a, b))
    }
}

/// A side's registration with `relay` for the pair's `port`: sent from the side's
/// WireGuard socket, so that the relay learns where the side's NAT maps that socket.
pub(crate) fn registration(
    keys: &mut PairKeys,
    own: &PublicKey,
    peer: &PublicKey,
    relay: &PublicKey,
    port: u16,
    stamp: u64,
) -> Vec<u8> {
    let mut packet = Vec::with_capacity(REGISTRATION_LEN);
    packet.extend_from_slice(MAGIC);
    packet.extend_from_slice(own.as_bytes());
    packet.extend_from_slice(peer.as_bytes());
    packet.extend_from_slice(&port.to_be_bytes());
    packet.extend_from_slice(&stamp.to_be_bytes());
    let tag = mac(&keys.key(relay), &packet).finalize().into_bytes();
    packet.extend_from_slice(&tag);
    packet
}

/// The keys a relay checks registrations with: its own static key and the registration
/// label.
pub(crate) fn relay_keys(own: PrivateKey) -> PairKeys {
    PairKeys::new(own, LABEL)
}

/// The port a registration is for, if `datagram` looks like one (its MAC is the port's to
/// check): what moves a TLS stream to that port on a relay.
pub fn registration_port(datagram: &[u8]) -> Option<u16> {
    if datagram.len() != REGISTRATION_LEN || &datagram[..4] != MAGIC {
        return None;
    }
    Some(u16::from_be_bytes(datagram[68..70].try_into().ok()?))
}

/// The side a registration for `pair` at `port` names (0 or 1) and its stamp, if it is
/// one and its MAC holds (`keys`: one per side, from the relay's static key).
fn registered(
    datagram: &[u8],
    pair: &Pair,
    port: u16,
    keys: &[[u8; 32]; 2],
) -> Option<(usize, u64)> {
    if datagram.len() != REGISTRATION_LEN || &datagram[..4] != MAGIC {
        return None;
    }
    let sender = PublicKey::from_bytes(datagram[4..36].try_into().ok()?);
    let peer = PublicKey::from_bytes(datagram[36..68].try_into().ok()?);
    let side = if sender == pair.0 { 0 } else { 1 };
    if pair.other(&sender) != Some(peer) {
        return None;
    }
    if u16::from_be_bytes(datagram[68..70].try_into().ok()?) != port {
        return None;
    }
    let stamp = u64::from_be_bytes(datagram[70..78].try_into().ok()?);
    // `verify_slice` compares in constant time.
    mac(&keys[side], &datagram[..BODY])
        .verify_slice(&datagram[BODY..])
        .ok()?;
    Some((side, stamp))
}

/// What one allocation's thread counts, and where it forwards (read by `show`).
#[derive(Debug, Default)]
struct Counters {
    stop: AtomicBool,
    /// Bytes and datagrams forwarded (ciphertext: the relay has nothing else).
    bytes: AtomicU64,
    datagrams: AtomicU64,
    /// Datagrams from no registered side, or for a side not registered yet.
    dropped: AtomicU64,
    registrations: AtomicU64,
    sides: Mutex<[Option<SocketAddr>; 2]>,
}

struct Allocation {
    port: u16,
    counters: Arc<Counters>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// One pair's forwarding as `show` and `/metrics` see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairView {
    pub pair: Pair,
    pub port: u16,
    /// Where each side registered from (`pair.0`'s first).
    pub sides: [Option<SocketAddr>; 2],
    pub bytes: u64,
    pub datagrams: u64,
    pub dropped: u64,
}

/// A relay: one UDP port and one thread per pair it serves. Dropping it stops them all.
pub struct Relay {
    own: PrivateKey,
    /// The address its ports bind (the unspecified address of its public one's family).
    bind: IpAddr,
    allocations: HashMap<Pair, Allocation>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("bind", &self.bind)
            .field("ports", &self.ports())
            .finish_non_exhaustive()
    }
}

impl Relay {
    pub fn new(own: PrivateKey, public: IpAddr) -> Relay {
        let bind = match public {
            IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        };
        Relay {
            own,
            bind,
            allocations: HashMap::new(),
        }
    }

    /// The port serving `pair`, opened now if it has none.
    pub fn allocate(&mut self, pair: Pair) -> std::io::Result<u16> {
        if let Some(a) = self.allocations.get(&pair) {
            return Ok(a.port);
        }
        let mut socket = UdpSocket::bind_addr(SocketAddr::new(self.bind, 0))?;
        if !socket.gso() {
            // Merged datagrams could not leave as they came.
            socket.set_gro(false);
        }
        let port = socket.local_addr().port();
        let mut keys = relay_keys(self.own.clone());
        let macs = [keys.key(&pair.0), keys.key(&pair.1)];
        let counters = Arc::new(Counters::default());
        let thread = {
            let counters = counters.clone();
            std::thread::Builder::new()
                .name("fleet-relay".into())
                .spawn(move || forward(socket, pair, port, macs, &counters))?
        };
        self.allocations.insert(
            pair,
            Allocation {
                port,
                counters,
                thread: Some(thread),
            },
        );
        Ok(port)
    }

    /// Closes every port but those of `keep`.
    pub fn retain(&mut self, keep: impl Fn(&Pair) -> bool) {
        self.allocations.retain(|pair, _| keep(pair));
    }

    /// Whether one of its ports is `port`.
    pub fn serves(&self, port: u16) -> bool {
        self.allocations.values().any(|a| a.port == port)
    }

    /// The pairs served and their ports.
    pub fn ports(&self) -> BTreeMap<Pair, u16> {
        self.allocations
            .iter()
            .map(|(pair, a)| (*pair, a.port))
            .collect()
    }

    pub fn view(&self) -> Vec<PairView> {
        let mut pairs: Vec<PairView> = self
            .allocations
            .iter()
            .map(|(pair, a)| {
                let c = &a.counters;
                PairView {
                    pair: *pair,
                    port: a.port,
                    sides: *c.sides.lock().unwrap_or_else(|p| p.into_inner()),
                    bytes: c.bytes.load(Ordering::Relaxed),
                    datagrams: c.datagrams.load(Ordering::Relaxed),
                    dropped: c.dropped.load(Ordering::Relaxed),
                }
            })
            .collect();
        pairs.sort_by_key(|p| p.pair);
        pairs
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        self.counters.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One pair's thread: registrations move its sides, datagrams from one side go to the other.
fn forward(mut socket: UdpSocket, pair: Pair, port: u16, macs: [[u8; 32]; 2], c: &Counters) {
    let (mut rx, mut tx) = (Batch::new(), Batch::new());
    let mut sides: [Option<SocketAddr>; 2] = [None, None];
    let mut stamps = [0u64; 2];
    let mut failures = 0u64;
    while !c.stop.load(Ordering::Relaxed) {
        match socket.wait_readable(IDLE) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                failures += 1;
                if failures.is_power_of_two() {
                    tracing::warn!("relay port {port}: waiting for datagrams: {e}");
                }
                std::thread::sleep(IDLE);
                continue;
            }
        }
        for _ in 0..BATCHES_PER_WAKE {
            rx.clear();
            match socket.recv_batch(&mut rx) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    failures += 1;
                    if failures.is_power_of_two() {
                        tracing::warn!("relay port {port}: reading: {e}");
                    }
                    break;
                }
            }
            tx.clear();
            let (mut bytes, mut datagrams, mut dropped) = (0u64, 0u64, 0u64);
            for i in 0..rx.len() {
                let from = rx.addr(i);
                let payload = rx.payload(i);
                let count = rx.datagrams(i).count() as u64;
                if rx.segment_size(i) == 0 {
                    if let Some((side, stamp)) = registered(payload, &pair, port, &macs) {
                        // A replayed registration (an old stamp) moves nothing.
                        if stamp > stamps[side] {
                            stamps[side] = stamp;
                            if sides[side] != Some(from) {
                                sides[side] = Some(from);
                                *c.sides.lock().unwrap_or_else(|p| p.into_inner()) = sides;
                            }
                            c.registrations.fetch_add(1, Ordering::Relaxed);
                        }
                        continue;
                    }
                }
                let to = match sides.iter().position(|s| *s == Some(from)) {
                    Some(side) => sides[1 - side],
                    None => None,
                };
                let (Some(to), Some(slot)) = (to, tx.next_free()) else {
                    dropped += count;
                    continue;
                };
                let len = payload.len().min(slot.len());
                slot[..len].copy_from_slice(&payload[..len]);
                let segment = rx.segment_size(i);
                let j = tx.len();
                tx.commit(len, to);
                tx.set_segment_size(j, segment);
                bytes += len as u64;
                datagrams += count;
            }
            if !tx.is_empty() {
                let sent = socket.send_batch(&mut tx).unwrap_or(0) as u64;
                dropped += datagrams.saturating_sub(sent);
            }
            c.bytes.fetch_add(bytes, Ordering::Relaxed);
            c.datagrams.fetch_add(datagrams, Ordering::Relaxed);
            c.dropped.fetch_add(dropped, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> PrivateKey {
        PrivateKey::generate()
    }

    #[test]
    fn a_pair_names_itself_one_way() {
        let (a, b) = (key().public_key(), key().public_key());
        let pair = Pair::new(a, b);
        assert_eq!(pair, Pair::new(b, a));
        assert_eq!(Pair::from_hex(&pair.to_hex()), Some(pair));
        assert_eq!(pair.other(&a), Some(b));
        assert_eq!(pair.other(&key().public_key()), None);
        let swapped = format!("{}-{}", hex(&pair.1), hex(&pair.0));
        assert_eq!(Pair::from_hex(&swapped), None, "only the lower key first");
        assert_eq!(Pair::from_hex("zz-01"), None);
    }

    /// Only a side of the pair, for this port, with its own static key, registers; a
    /// changed byte or another pair's registration does not.
    #[test]
    fn only_a_side_of_the_pair_can_register() {
        let (relay, a, b, c) = (key(), key(), key(), key());
        let pair = Pair::new(a.public_key(), b.public_key());
        let mut at_relay = relay_keys(relay.clone());
        let macs = [at_relay.key(&pair.0), at_relay.key(&pair.1)];
        let mut a_keys = relay_keys(a.clone());
        let good = registration(
            &mut a_keys,
            &a.public_key(),
            &b.public_key(),
            &relay.public_key(),
            4000,
            7,
        );
        let side = usize::from(pair.0 != a.public_key());
        assert_eq!(registered(&good, &pair, 4000, &macs), Some((side, 7)));
        assert_eq!(registered(&good, &pair, 4001, &macs), None, "another port");
        for i in [0, 4, 40, 69, 75, REGISTRATION_LEN - 1] {
            let mut bad = good.clone();
            bad[i] ^= 1;
            assert_eq!(registered(&bad, &pair, 4000, &macs), None, "byte {i}");
        }
        // C claims to be A: it cannot make A's MAC.
        let mut c_keys = relay_keys(c.clone());
        let forged = registration(
            &mut c_keys,
            &a.public_key(),
            &b.public_key(),
            &relay.public_key(),
            4000,
            8,
        );
        assert_eq!(registered(&forged, &pair, 4000, &macs), None);
        // A registering for a pair with C is not one for A and B.
        let other = registration(
            &mut a_keys,
            &a.public_key(),
            &c.public_key(),
            &relay.public_key(),
            4000,
            9,
        );
        assert_eq!(registered(&other, &pair, 4000, &macs), None);
        assert_eq!(registered(&good[..40], &pair, 4000, &macs), None);
    }

    /// Two sides on loopback registered with a relay port: what one sends reaches the other
    /// unchanged, from the relay's port; a stranger's datagrams go nowhere, and a replayed
    /// registration from the stranger moves no side.
    #[test]
    fn a_relay_port_forwards_between_its_registered_sides_only() {
        use std::net::UdpSocket as Std;
        let (relay, a, b) = (key(), key(), key());
        let (ap, bp) = (a.public_key(), b.public_key());
        let mut server = Relay::new(relay.clone(), "127.0.0.1".parse().unwrap());
        let port = server.allocate(Pair::new(ap, bp)).unwrap();
        assert_eq!(server.allocate(Pair::new(bp, ap)).unwrap(), port);
        let to: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let open = || {
            let s = Std::bind("127.0.0.1:0").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            s
        };
        let (sa, sb, stranger) = (open(), open(), open());
        let register = |s: &Std, own: &PrivateKey, peer: PublicKey, stamp| {
            let mut keys = relay_keys(own.clone());
            let r = registration(
                &mut keys,
                &own.public_key(),
                &peer,
                &relay.public_key(),
                port,
                stamp,
            );
            s.send_to(&r, to).unwrap();
            r
        };
        let from_a = register(&sa, &a, bp, 1);
        register(&sb, &b, ap, 1);
        let mut buf = [0u8; 2048];
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        // The registrations and the first datagram race the thread: send until it crosses.
        let got = loop {
            sa.send_to(b"\x04\0\0\0ciphertext", to).unwrap();
            sb.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            if let Ok((n, from)) = sb.recv_from(&mut buf) {
                break (buf[..n].to_vec(), from);
            }
            assert!(
                std::time::Instant::now() < deadline,
                "nothing crossed the relay"
            );
        };
        assert_eq!(got, (b"\x04\0\0\0ciphertext".to_vec(), to));
        sb.send_to(b"back", to).unwrap();
        sa.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let (n, _) = sa.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"back");

        // A stranger replays A's registration and sends: nothing reaches B, A stays.
        stranger.send_to(&from_a, to).unwrap();
        stranger.send_to(b"not from a side", to).unwrap();
        sb.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        assert!(
            sb.recv_from(&mut buf).is_err(),
            "a stranger's datagram crossed"
        );
        let view = &server.view()[0];
        assert_eq!(view.port, port);
        assert!(view.sides.contains(&Some(sa.local_addr().unwrap())));
        assert!(!view.sides.contains(&Some(stranger.local_addr().unwrap())));
        assert!(view.dropped >= 1);
        assert!(view.bytes >= 18);
        server.retain(|_| false);
        assert!(server.view().is_empty());
    }
}
