//! Several workers per gateway, in memory: every worker's device holds every peer, the one
//! carrying a session answers, and the others hand packets and initiations to it. Datagrams
//! reach workers by the rule of the reuseport steering program (`dataplane/src/steering.rs`):
//! by the receiver index for everything that names one, anywhere for initiations.

use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tunneld_crypto::{PresharedKey, PrivateKey};
use tunneld_wireguard::packet::MAX_DATAGRAM;
use tunneld_wireguard::{
    wire, worker_of_index, CookieSecret, DatagramSink, Device, DeviceSettings, Disposition,
    Environment, PacketSink, PeerSettings, SyncReport,
};

#[derive(Default)]
struct Collect {
    scratch: Vec<u8>,
    datagrams: Vec<(SocketAddr, Vec<u8>)>,
    packets: Vec<Vec<u8>>,
    /// How many datagrams fit (a batch's room); `usize::MAX`: unbounded.
    room: usize,
}

impl Collect {
    fn new() -> Self {
        Self::with_room(usize::MAX)
    }

    fn with_room(room: usize) -> Self {
        Self {
            scratch: vec![0; MAX_DATAGRAM],
            room,
            ..Self::default()
        }
    }
}

impl DatagramSink for Collect {
    fn slot(&mut self) -> Option<&mut [u8]> {
        (self.datagrams.len() < self.room).then_some(&mut self.scratch[..])
    }
    fn push(&mut self, len: usize, to: SocketAddr) {
        self.datagrams.push((to, self.scratch[..len].to_vec()));
    }
}

impl PacketSink for Collect {
    fn slot(&mut self) -> Option<&mut [u8]> {
        Some(&mut self.scratch)
    }
    fn push(&mut self, len: usize) {
        self.packets.push(self.scratch[..len].to_vec());
    }
}

/// An IPv4 UDP packet whose payload is `seq`.
fn udp_packet(src: [u8; 4], dst: [u8; 4], sport: u16, seq: u32) -> Vec<u8> {
    let mut p = vec![0u8; 32];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&32u16.to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&src);
    p[16..20].copy_from_slice(&dst);
    p[20..22].copy_from_slice(&sport.to_be_bytes());
    p[22..24].copy_from_slice(&9000u16.to_be_bytes());
    p[24..26].copy_from_slice(&12u16.to_be_bytes());
    p[28..32].copy_from_slice(&seq.to_be_bytes());
    p
}

/// One gateway: a device per worker, all at one address (the reuseport group).
struct Gateway {
    addr: SocketAddr,
    workers: Vec<Device>,
    delivered: Vec<Vec<u8>>,
    /// Hand-offs received, per worker.
    handed: Vec<usize>,
    /// Datagrams land on the worker `landing` says, whatever they name (as on an AF_XDP
    /// queue), rather than by the steering program's rule.
    land_anywhere: bool,
}

impl Gateway {
    fn new(
        addr: &str,
        key: &PrivateKey,
        peer: PeerSettings,
        workers: usize,
        now: Instant,
    ) -> Gateway {
        Gateway::with_cookies(addr, key, peer, workers, now, None)
    }

    /// A gateway whose workers share `cookies` (as tunneld's do); `None`: each worker
    /// makes a secret of its own.
    fn with_cookies(
        addr: &str,
        key: &PrivateKey,
        peer: PeerSettings,
        workers: usize,
        now: Instant,
        cookies: Option<CookieSecret>,
    ) -> Gateway {
        let addr: SocketAddr = addr.parse().unwrap();
        let settings = DeviceSettings {
            private_key: key.clone(),
            listen_port: addr.port(),
            mtu: 1420,
            fwmark: 0,
        };
        Gateway {
            addr,
            workers: (0..workers)
                .map(|w| {
                    let seed = (u64::from(addr.port()) << 16) | w as u64;
                    let mut environment = Environment::seeded(seed, Duration::from_secs(1));
                    if let Some(secret) = &cookies {
                        environment = environment.with_cookie_secret(secret.clone());
                    }
                    Device::for_worker(
                        settings.clone(),
                        vec![peer.clone()],
                        now,
                        w,
                        workers,
                        environment,
                    )
                })
                .collect(),
            delivered: Vec::new(),
            handed: vec![0; workers],
            land_anywhere: false,
        }
    }

    /// The worker a datagram reaches: the one its receiver index names, or `landing` for an
    /// initiation (the kernel's hash of the source).
    fn steer(&self, datagram: &[u8], landing: usize) -> usize {
        if self.land_anywhere {
            return landing % self.workers.len();
        }
        match wire::parse(datagram).ok().and_then(|m| m.receiver()) {
            Some(index) => worker_of_index(index, self.workers.len()),
            None => landing % self.workers.len(),
        }
    }

    /// A packet read from the TUN queue of worker `first`: encrypted there or handed to the
    /// worker carrying its flow. Returns the datagrams to send.
    fn send(&mut self, packet: &[u8], first: usize, now: Instant) -> Vec<(SocketAddr, Vec<u8>)> {
        let mut out = Collect::new();
        let mut frame = packet.to_vec();
        frame.resize(packet.len() + 64, 0);
        let mut w = first % self.workers.len();
        let mut on_first = false;
        // At most two hops: to the flow's sub-tunnel, then (without a session) to sub-tunnel 0.
        for _ in 0..3 {
            let len = packet.len();
            let disposition = if on_first {
                self.workers[w].encapsulate_on_first(&mut frame, len, now, &mut out)
            } else {
                self.workers[w].encapsulate(&mut frame, len, now, &mut out)
            };
            let owner = match disposition {
                Disposition::Done => return out.datagrams,
                Disposition::HandOff(owner) => owner,
                Disposition::HandOffToFirst(owner) => {
                    assert!(!on_first, "sub-tunnel 0 handed on");
                    on_first = true;
                    owner
                }
            };
            assert_ne!(owner, w, "a worker handed a packet to itself");
            self.handed[owner] += 1;
            w = owner;
        }
        panic!("a packet kept being handed on");
    }

    fn receive(
        &mut self,
        from: SocketAddr,
        datagram: &[u8],
        landing: usize,
        now: Instant,
    ) -> Vec<(SocketAddr, Vec<u8>)> {
        let mut tunnel = Collect::new();
        let mut network = Collect::new();
        let w = self.steer(datagram, landing);
        match self.workers[w].decapsulate(from, datagram, now, &mut tunnel, &mut network) {
            Disposition::Done => {}
            Disposition::HandOffToFirst(_) => panic!("a datagram sent to sub-tunnel 0"),
            Disposition::HandOff(owner) => {
                assert!(
                    datagram[0] == 1 || self.land_anywhere,
                    "only initiations are handed off when the steering program places the rest"
                );
                self.handed[owner] += 1;
                let again = self.workers[owner].decapsulate_handed_off(
                    from,
                    datagram,
                    now,
                    &mut tunnel,
                    &mut network,
                );
                assert_eq!(again, Disposition::Done, "a hand-off was handed on");
            }
        }
        self.delivered.extend(tunnel.packets);
        network.datagrams
    }

    /// Every worker's timers: returns what they send (handshakes sub-tunnels asked for).
    fn tick(&mut self, now: Instant) -> Vec<(SocketAddr, Vec<u8>)> {
        let mut out = Collect::new();
        for device in &mut self.workers {
            device.tick(now, &mut out);
        }
        out.datagrams
    }

    fn rx_packets(&self) -> Vec<u64> {
        self.workers.iter().map(|d| d.stats().rx_packets).collect()
    }
}

/// Delivers datagrams between `a` and `b` until none are left; initiations land on the
/// worker `landing` says (rotating, so some land away from their owner).
fn pump(a: &mut Gateway, b: &mut Gateway, mut queue: Vec<(bool, Vec<u8>)>, now: Instant) {
    let mut landing = 0;
    let mut rounds = 0;
    while let Some((to_b, datagram)) = queue.pop() {
        rounds += 1;
        assert!(rounds < 100_000, "datagrams kept bouncing");
        landing += 1;
        let replies = if to_b {
            b.receive(a.addr, &datagram, landing, now)
        } else {
            a.receive(b.addr, &datagram, landing, now)
        };
        queue.extend(replies.into_iter().map(|(_, d)| (!to_b, d)));
    }
}

fn peer(
    key: &PrivateKey,
    endpoint: &str,
    net: &str,
    parallel: u8,
    psk: Option<PresharedKey>,
) -> PeerSettings {
    let mut peer = PeerSettings::new(key.public_key())
        .endpoint(endpoint.parse().unwrap())
        .allowed_ip(net.parse().unwrap())
        .parallel(parallel);
    peer.preshared_key = psk;
    peer
}

/// Gateways a (192.0.2.1, overlay 10.1/16) and b (192.0.2.2, 10.2/16) with new keys, each
/// the other's only peer: (parallel, workers) for each side.
fn two_gateways(
    (parallel_a, workers_a): (u8, usize),
    (parallel_b, workers_b): (u8, usize),
    psk: Option<PresharedKey>,
    now: Instant,
) -> (Gateway, Gateway) {
    let (ka, kb) = (PrivateKey::generate(), PrivateKey::generate());
    let to_b = peer(
        &kb,
        "192.0.2.2:51820",
        "10.2.0.0/16",
        parallel_a,
        psk.clone(),
    );
    let to_a = peer(&ka, "192.0.2.1:51820", "10.1.0.0/16", parallel_b, psk);
    (
        Gateway::new("192.0.2.1:51820", &ka, to_b, workers_a, now),
        Gateway::new("192.0.2.2:51820", &kb, to_a, workers_b, now),
    )
}

/// Runs both gateways' timers and delivers what they send.
fn tick_both(a: &mut Gateway, b: &mut Gateway, now: Instant) {
    let from_a = a.tick(now);
    pump(
        a,
        b,
        from_a.into_iter().map(|(_, d)| (true, d)).collect(),
        now,
    );
    let from_b = b.tick(now);
    pump(
        b,
        a,
        from_b.into_iter().map(|(_, d)| (true, d)).collect(),
        now,
    );
}

/// Sends `flows` flows of `per_flow` sequence-numbered packets from a to b, reading them on
/// rotating workers, and checks every packet arrived with each flow in order.
fn flows_cross_in_order(a: &mut Gateway, b: &mut Gateway, flows: u16, per_flow: u32, now: Instant) {
    let mut reader = 0;
    // The first packets start the handshakes; the queued packets follow them. Sub-tunnels
    // past the first ask for theirs at the next tick, and carry their flows from then on.
    for seq in 0..per_flow {
        for flow in 0..flows {
            reader += 1;
            let packet = udp_packet([10, 1, 0, 1], [10, 2, 0, 1], 40000 + flow, seq);
            let out = a.send(&packet, reader, now);
            pump(a, b, out.into_iter().map(|(_, d)| (true, d)).collect(), now);
        }
        tick_both(a, b, now);
    }
    assert_eq!(
        b.delivered.len(),
        usize::from(flows) * per_flow as usize,
        "every packet arrives"
    );
    for flow in 0..flows {
        let seqs: Vec<u32> = b
            .delivered
            .iter()
            .filter(|p| u16::from_be_bytes([p[20], p[21]]) == 40000 + flow)
            .map(|p| u32::from_be_bytes(p[28..32].try_into().unwrap()))
            .collect();
        assert_eq!(
            seqs,
            (0..per_flow).collect::<Vec<_>>(),
            "flow {flow} in order"
        );
    }
}

#[test]
fn a_split_peer_spreads_flows_over_both_workers_in_order() {
    let now = Instant::now();
    let (mut a, mut b) = two_gateways((2, 2), (2, 2), Some(PresharedKey::generate()), now);
    flows_cross_in_order(&mut a, &mut b, 16, 20, now);
    let rx = b.rx_packets();
    assert!(
        rx.iter().all(|n| *n > 0),
        "both sub-tunnels carried flows: {rx:?}"
    );
    assert_eq!(rx.iter().sum::<u64>(), 16 * 20);
    assert!(
        a.handed.iter().sum::<usize>() > 0,
        "packets read on the wrong worker were handed over: {:?} {:?}",
        a.handed,
        b.handed
    );
    // Each worker lists the peer once, for the sub-tunnel it carries.
    for device in &b.workers {
        let snapshot = device.snapshot(now, std::time::Duration::ZERO);
        assert_eq!(snapshot.peers.len(), 1);
        assert!(snapshot.peers[0].last_handshake.is_some());
    }
}

/// Every datagram lands on any worker (an AF_XDP queue's worker, whatever its receiver
/// index names): responses, cookie replies and data go on to the worker carrying their
/// session (responses at a, data at b), and flows cross in order, split or not.
#[test]
fn datagrams_that_land_on_any_worker_reach_their_sessions_worker() {
    let now = Instant::now();
    for parallel in [1, 3] {
        let (mut a, mut b) = two_gateways((parallel, 3), (parallel, 3), None, now);
        a.land_anywhere = true;
        b.land_anywhere = true;
        flows_cross_in_order(&mut a, &mut b, 8, 10, now);
        assert!(
            a.handed.iter().sum::<usize>() > 0 && b.handed.iter().sum::<usize>() > 0,
            "nothing was handed on: {:?} {:?}",
            a.handed,
            b.handed
        );
    }
}

#[test]
fn a_plain_wireguard_peer_works_with_any_worker_count() {
    let now = Instant::now();
    // a is one plain device (like wireguard-go); b has three workers.
    let (mut a, mut b) = two_gateways((1, 1), (1, 3), None, now);
    flows_cross_in_order(&mut a, &mut b, 8, 10, now);
    let carrying: Vec<usize> = (0..3).filter(|w| b.rx_packets()[*w] > 0).collect();
    assert_eq!(carrying.len(), 1, "one worker carries a plain peer");
    // And back: packets read on every worker of b reach a.
    let mut reader = 0;
    for seq in 0..30 {
        reader += 1;
        let packet = udp_packet([10, 2, 0, 1], [10, 1, 0, 1], 7000, seq);
        let out = b.send(&packet, reader, now);
        pump(
            &mut b,
            &mut a,
            out.into_iter().map(|(_, d)| (true, d)).collect(),
            now,
        );
    }
    assert_eq!(a.delivered.len(), 30);
}

#[test]
fn sub_tunnels_pair_only_with_their_own_number() {
    let now = Instant::now();
    // a splits the peer in two, b (one worker) does not: sub-tunnel 0 is standard WireGuard
    // and comes up; sub-tunnel 1's key differs, so its handshake never completes, and its
    // flows go over sub-tunnel 0.
    let (mut a, mut b) = two_gateways((2, 2), (1, 1), None, now);
    let mut reader = 0;
    for flow in 0..16 {
        reader += 1;
        let packet = udp_packet([10, 1, 0, 1], [10, 2, 0, 1], 40000 + flow, 0);
        let out = a.send(&packet, reader, now);
        pump(
            &mut a,
            &mut b,
            out.into_iter().map(|(_, d)| (true, d)).collect(),
            now,
        );
    }
    // Sub-tunnel 1 asks for its handshake at the tick; b answers with sub-tunnel 0's key. The
    // tick comes later than the first initiation: b ignores a peer's initiations closer together
    // than 20 ms, as the kernel does.
    let now = now + std::time::Duration::from_millis(50);
    tick_both(&mut a, &mut b, now);
    let sessions: Vec<bool> = a
        .workers
        .iter()
        .map(|d| {
            d.snapshot(now, std::time::Duration::ZERO).peers[0]
                .last_handshake
                .is_some()
        })
        .collect();
    assert_eq!(
        sessions,
        [true, false],
        "sub-tunnel 0 up, sub-tunnel 1 refused"
    );
    // Refused by the key: B's response, made with sub-tunnel 0's key, fails to authenticate.
    let stats = a.workers[1].stats();
    let refused = stats.drops(tunneld_wireguard::DropReason::DecryptFailed)
        + stats.drops(tunneld_wireguard::DropReason::HandshakeRejected);
    assert!(refused > 0, "{stats:?}");
    // Nothing is lost: flows hashed onto sub-tunnel 1 went over sub-tunnel 0.
    assert_eq!(b.delivered.len(), 16);
    assert!(a.handed[0] > 0, "packets handed to sub-tunnel 0's worker");
}

#[test]
fn packets_queued_during_a_handshake_keep_their_order() {
    let now = Instant::now();
    let (mut a, mut b) = two_gateways((1, 1), (1, 1), None, now);
    // Packets 0..50 wait in A's `Tunn` while the handshake runs.
    let mut initiation = Vec::new();
    for seq in 0..50 {
        initiation.extend(a.send(&udp_packet([10, 1, 0, 1], [10, 2, 0, 1], 7000, seq), 0, now));
    }
    assert_eq!(initiation.len(), 1, "one initiation, the packets queued");
    let response = b.receive(a.addr, &initiation[0].1, 0, now);
    // The response arrives when A's batch has room for only five datagrams: the keepalive
    // and a few queued packets go out, the rest stay queued...
    let mut tunnel = Collect::new();
    let mut cramped = Collect::with_room(5);
    let _ = a.workers[0].decapsulate(b.addr, &response[0].1, now, &mut tunnel, &mut cramped);
    let mut wire = cramped.datagrams;
    // ...and must still leave before the next packet.
    wire.extend(a.send(&udp_packet([10, 1, 0, 1], [10, 2, 0, 1], 7000, 50), 0, now));
    for (_, d) in wire {
        b.receive(a.addr, &d, 0, now);
    }
    let seqs: Vec<u32> = b
        .delivered
        .iter()
        .map(|p| u32::from_be_bytes(p[28..32].try_into().unwrap()))
        .collect();
    assert_eq!(seqs, (0..=50).collect::<Vec<u32>>());
}

#[test]
fn plain_peers_spread_over_the_workers_and_sub_tunnels_go_in_order() {
    // Public keys are uniformly random, so many plain peers spread evenly.
    let mut per_worker = [0usize; 4];
    for _ in 0..400 {
        let key = PrivateKey::generate().public_key();
        per_worker[tunneld_wireguard::owner_of(&key, 1, 0, 4)] += 1;
    }
    assert!(
        per_worker.iter().all(|n| (60..=140).contains(n)),
        "{per_worker:?}"
    );
    // Sub-tunnel j of a split peer is on worker j, whatever the key.
    let key = PrivateKey::generate().public_key();
    let owners: Vec<usize> = (0..4)
        .map(|sub| tunneld_wireguard::owner_of(&key, 4, sub, 4))
        .collect();
    assert_eq!(owners, [0, 1, 2, 3]);
}

/// A reload (`Device::sync` on every worker) that adds a peer and widens another's allowed
/// IPs keeps the split link's sessions: the next packets go out as data, not handshakes. A
/// new preshared key starts them over.
#[test]
fn a_reload_keeps_the_sessions_of_unchanged_peers() {
    let now = Instant::now();
    let psk = Some(PresharedKey::generate());
    let (ka, kb) = (PrivateKey::generate(), PrivateKey::generate());
    let to_b = peer(&kb, "192.0.2.2:51820", "10.2.0.0/16", 2, psk.clone());
    let to_a = peer(&ka, "192.0.2.1:51820", "10.1.0.0/16", 2, psk);
    let mut a = Gateway::new("192.0.2.1:51820", &ka, to_b.clone(), 2, now);
    let mut b = Gateway::new("192.0.2.2:51820", &kb, to_a, 2, now);
    flows_cross_in_order(&mut a, &mut b, 4, 8, now);

    let mut widened = to_b.clone();
    widened.allowed_ips.push("10.3.0.0/16".parse().unwrap());
    let newcomer = peer(
        &PrivateKey::generate(),
        "192.0.2.3:51820",
        "10.4.0.0/16",
        1,
        None,
    );
    let wanted = vec![widened.clone(), newcomer];
    for device in &mut a.workers {
        let report = device.sync(ka.clone(), &wanted, std::slice::from_ref(&to_b), now);
        let expected = SyncReport {
            added: 1,
            changed: 1,
            ..SyncReport::default()
        };
        assert_eq!(report, expected);
        let routes: Vec<String> = device.routes().iter().map(ToString::to_string).collect();
        for net in ["10.2.0.0/16", "10.3.0.0/16", "10.4.0.0/16"] {
            assert!(routes.contains(&net.to_string()), "{routes:?}");
        }
        // Applying the same config again changes nothing.
        let again = device.sync(ka.clone(), &wanted, &wanted, now);
        assert_eq!(again, SyncReport::default());
    }
    for flow in 0..4 {
        let packet = udp_packet([10, 1, 0, 1], [10, 2, 0, 1], 40000 + flow, 99);
        let out = a.send(&packet, usize::from(flow), now);
        assert!(
            !out.is_empty() && out.iter().all(|(_, d)| d[0] == 4),
            "flow {flow} goes out as data on its kept session"
        );
    }

    let mut new_psk = widened.clone();
    new_psk.preshared_key = Some(PresharedKey::generate());
    for device in &mut a.workers {
        let report = device.sync(ka.clone(), &[new_psk.clone()], &wanted, now);
        assert_eq!(report.removed, 1);
        assert_eq!(report.restarted, vec![kb.public_key()]);
    }
    let packet = udp_packet([10, 1, 0, 1], [10, 2, 0, 1], 40000, 100);
    let out = a.send(&packet, 0, now);
    assert!(
        out.iter().any(|(_, d)| d[0] == 1),
        "a new preshared key starts with a handshake: {:?}",
        out.iter().map(|(_, d)| d[0]).collect::<Vec<_>>()
    );
}

/// Under load, a spoke answers a cookie reply from one worker with an initiation carrying
/// that cookie's mac2 (5 s later, as WireGuard initiators do), and the kernel's hash lands
/// it on another worker: with one secret for the interface it is answered; with a secret per
/// worker (what tunneld had) it got another cookie reply, again and again.
#[test]
fn a_cookie_from_one_worker_is_honoured_by_the_others() {
    for shared in [true, false] {
        let now = Instant::now();
        let (ka, kb) = (PrivateKey::generate(), PrivateKey::generate());
        let to_b = peer(&kb, "192.0.2.2:51820", "10.2.0.0/16", 1, None);
        let to_a = peer(&ka, "192.0.2.1:51820", "10.1.0.0/16", 1, None);
        let mut a = Gateway::new("192.0.2.1:51820", &ka, to_b, 1, now);
        let secret = shared.then(|| CookieSecret::new(&mut rand_core::OsRng));
        let mut b = Gateway::with_cookies("192.0.2.2:51820", &kb, to_a, 2, now, secret);
        // A backlog as deep as the socket's queue: every worker of b is under load.
        let load = |b: &mut Gateway, now| {
            for device in &mut b.workers {
                device.note_backlog(1 << 20, 1 << 20, now);
            }
        };
        load(&mut b, now);
        let packet = udp_packet([10, 1, 0, 1], [10, 2, 0, 1], 40000, 0);
        let out = a.send(&packet, 0, now);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].1[0], 1, "an initiation");
        let replies = b.receive(a.addr, &out[0].1, 0, now);
        assert_eq!(replies.len(), 1);
        assert_eq!(replies[0].1[0], 3, "under load: a cookie reply");
        assert!(a.receive(b.addr, &replies[0].1, 0, now).is_empty());
        // The retry, with the cookie, lands on the other worker.
        let later = now + Duration::from_millis(5_500);
        load(&mut b, later);
        let retry = a.tick(later);
        assert_eq!(retry.len(), 1, "a retransmitted initiation");
        assert_eq!(retry[0].1[0], 1);
        let replies = b.receive(a.addr, &retry[0].1, 1, later);
        assert_eq!(replies.len(), 1);
        if shared {
            assert_eq!(replies[0].1[0], 2, "the cookie is honoured: a response");
            pump(&mut a, &mut b, vec![(false, replies[0].1.clone())], later);
            assert_eq!(
                b.delivered,
                vec![packet.clone()],
                "the queued packet arrives"
            );
        } else {
            assert_eq!(replies[0].1[0], 3, "a secret per worker: another cookie");
        }
    }
}

/// A checking device (the bare mode's scratch) takes and refuses `set`s exactly as a real
/// one, without the peers' static Diffie-Hellman: the same peers and routes, and a low-order
/// key refused with the same error.
#[test]
fn a_checking_device_refuses_what_a_real_one_does() {
    use tunneld_wireguard::uapi::{PeerUpdate, SetRequest};
    let now = Instant::now();
    let settings = DeviceSettings {
        private_key: PrivateKey::generate(),
        listen_port: 51820,
        mtu: 1420,
        fwmark: 0,
    };
    let mut real = Device::new(
        settings.clone(),
        Vec::new(),
        now,
        Environment::seeded(1, Duration::from_secs(1)),
    );
    let mut checker = Device::checker(
        settings,
        now,
        Environment::seeded(2, Duration::from_secs(1)),
    );
    let peer = |key: tunneld_crypto::PublicKey, net: &str| {
        let mut update = PeerUpdate::new(key);
        update.replace_allowed_ips = true;
        update.allowed_ips = vec![net.parse().unwrap()];
        update
    };
    let good = SetRequest {
        peers: (0..50u8)
            .map(|i| {
                peer(
                    PrivateKey::generate().public_key(),
                    &format!("10.9.{i}.0/24"),
                )
            })
            .collect(),
        ..SetRequest::default()
    };
    assert!(real.apply(good.clone(), now).is_ok());
    assert!(checker.apply(good, now).is_ok());
    assert_eq!(real.peer_count(), checker.peer_count());
    let mut routes = (real.routes(), checker.routes());
    routes.0.sort();
    routes.1.sort();
    assert_eq!(routes.0, routes.1);
    // u = 0, a point of order 2: refused by both alike.
    let low = tunneld_crypto::PublicKey::from_bytes([0; 32]);
    let bad = SetRequest {
        peers: vec![peer(low, "10.10.0.0/24")],
        ..SetRequest::default()
    };
    let (r, c) = (real.apply(bad.clone(), now), checker.apply(bad, now));
    assert!(r.is_err());
    assert_eq!(r.unwrap_err().to_string(), c.unwrap_err().to_string());
}

/// Under load, cookies prove an address, and each address then has its own budget (a burst
/// of 5, then 20 a second): ten spokes behind one address retrying with their cookies at
/// once get five answers, and a spoke at another address is answered all the same.
#[test]
fn under_load_each_source_address_has_a_budget_of_its_own() {
    let now = Instant::now();
    let hub_key = PrivateKey::generate();
    let hub_addr: SocketAddr = "192.0.2.1:51820".parse().unwrap();
    let spokes: Vec<(PrivateKey, SocketAddr)> = (0..11u16)
        .map(|i| {
            let ip = if i < 10 {
                "198.51.100.7"
            } else {
                "198.51.100.8"
            };
            (
                PrivateKey::generate(),
                format!("{ip}:{}", 40000 + i).parse().unwrap(),
            )
        })
        .collect();
    let mut hub = Device::new(
        DeviceSettings {
            private_key: hub_key.clone(),
            listen_port: 51820,
            mtu: 1420,
            fwmark: 0,
        },
        spokes
            .iter()
            .enumerate()
            .map(|(i, (k, _))| peer(k, "192.0.2.99:1", &format!("10.8.{i}.0/24"), 1, None))
            .collect(),
        now,
        Environment::seeded(7, Duration::from_secs(1)),
    );
    let mut devices: Vec<Device> = spokes
        .iter()
        .enumerate()
        .map(|(i, (k, _))| {
            Device::new(
                DeviceSettings {
                    private_key: k.clone(),
                    listen_port: 0,
                    mtu: 1420,
                    fwmark: 0,
                },
                vec![peer(&hub_key, "192.0.2.1:51820", "10.0.0.0/8", 1, None)],
                now,
                Environment::seeded(100 + i as u64, Duration::from_secs(1)),
            )
        })
        .collect();
    // Every spoke's first initiation, at a hub under load: a cookie reply each.
    hub.note_backlog(1 << 20, 1 << 20, now);
    for (i, device) in devices.iter_mut().enumerate() {
        let packet = udp_packet([10, 8, i as u8, 1], [10, 0, 0, 1], 4000, 0);
        let mut frame = packet.clone();
        frame.resize(packet.len() + 64, 0);
        let mut out = Collect::new();
        device.encapsulate(&mut frame, packet.len(), now, &mut out);
        let (mut tun, mut replies) = (Collect::new(), Collect::new());
        hub.decapsulate(
            spokes[i].1,
            &out.datagrams[0].1,
            now,
            &mut tun,
            &mut replies,
        );
        assert_eq!(replies.datagrams.len(), 1);
        assert_eq!(replies.datagrams[0].1[0], 3, "a cookie reply");
        let mut ignored = (Collect::new(), Collect::new());
        device.decapsulate(
            hub_addr,
            &replies.datagrams[0].1,
            now,
            &mut ignored.0,
            &mut ignored.1,
        );
    }
    // Their retries, with cookies, all at one instant, the hub still under load.
    let later = now + Duration::from_millis(5_500);
    hub.note_backlog(1 << 20, 1 << 20, later);
    let mut answered = Vec::new();
    for (i, device) in devices.iter_mut().enumerate() {
        let mut out = Collect::new();
        device.tick(later, &mut out);
        assert_eq!(out.datagrams.len(), 1, "spoke {i} retries");
        let (mut tun, mut replies) = (Collect::new(), Collect::new());
        hub.decapsulate(
            spokes[i].1,
            &out.datagrams[0].1,
            later,
            &mut tun,
            &mut replies,
        );
        answered.push(replies.datagrams.first().map(|(_, d)| d[0]));
    }
    let from_first_address = answered[..10].iter().filter(|a| **a == Some(2)).count();
    assert_eq!(
        from_first_address, 5,
        "one address, one burst: {answered:?}"
    );
    assert!(
        answered[..10].iter().all(|a| *a == Some(2) || a.is_none()),
        "past its budget an address gets nothing, not another cookie: {answered:?}"
    );
    assert_eq!(answered[10], Some(2), "another address is answered");
    assert_eq!(
        hub.stats()
            .drops(tunneld_wireguard::DropReason::RateLimited),
        5
    );
}
