//! When a hub demands cookies (`device.rs`, `WAIT_LIMIT`): a simulated hub, one `Device`
//! behind a receive queue that holds what arrives between its turns, as a worker's socket
//! does; each turn reads a batch, reports the backlog when the batch was full (as the worker
//! does) and advances the clock by what the batch cost: a Diffie-Hellman handshake
//! `DH_COST`, a cookie reply `COOKIE_COST`. The spokes are real initiators (their own
//! `Device`s) that retransmit 5 s after an unanswered initiation; an attacker's initiation
//! carries a valid mac1 for the hub's key, which is all a spoofed flood can have.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};
use tunneld_crypto::PrivateKey;
use tunneld_wireguard::packet::MAX_DATAGRAM;
use tunneld_wireguard::{
    DatagramSink, Device, DeviceSettings, DropReason, Environment, PacketSink, PeerSettings,
};

/// What the kernel charges a queued handshake datagram (its buffer's truesize, Linux 6.x).
const TRUESIZE: usize = 832;
const BATCH: usize = 64;
/// A slow hub, so that a storm it can still serve in time is a few hundred spokes.
const DH_COST: Duration = Duration::from_millis(4);
const COOKIE_COST: Duration = Duration::from_micros(20);
const OTHER_COST: Duration = Duration::from_micros(5);
const TICK: Duration = Duration::from_millis(250);
const HUB: &str = "192.0.2.1:51820";

#[derive(Default)]
struct Collect {
    scratch: Vec<u8>,
    datagrams: Vec<(SocketAddr, Vec<u8>)>,
    packets: Vec<Vec<u8>>,
}

impl Collect {
    fn new() -> Self {
        Collect {
            scratch: vec![0; MAX_DATAGRAM],
            ..Collect::default()
        }
    }
}

impl DatagramSink for Collect {
    fn slot(&mut self) -> Option<&mut [u8]> {
        Some(&mut self.scratch[..])
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

fn settings(key: &PrivateKey, port: u16) -> DeviceSettings {
    DeviceSettings {
        private_key: key.clone(),
        listen_port: port,
        mtu: 1420,
        fwmark: 0,
    }
}

/// Spoke `i`'s address inside the tunnel.
fn spoke_ip(i: usize) -> [u8; 4] {
    [10, 1 + (i >> 16) as u8, (i >> 8) as u8, i as u8]
}

/// An ICMP-free IPv4 packet from spoke `i` to the hub (a UDP header and a few bytes).
fn packet_from(i: usize) -> Vec<u8> {
    let mut p = vec![0u8; 32];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&32u16.to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&spoke_ip(i));
    p[16..20].copy_from_slice(&[10, 0, 0, 1]);
    p[24..26].copy_from_slice(&12u16.to_be_bytes());
    p
}

struct Spoke {
    addr: SocketAddr,
    device: Device,
    /// When the hub answered it, from the start.
    answered: Option<Duration>,
    cookies: u64,
}

struct Sim {
    hub: Device,
    hub_addr: SocketAddr,
    start: Instant,
    now: Instant,
    next_tick: Instant,
    queue: VecDeque<(SocketAddr, Vec<u8>)>,
    queue_capacity: usize,
    spokes: Vec<Spoke>,
    by_addr: HashMap<SocketAddr, usize>,
    /// The hub's time spent on Diffie-Hellman handshakes.
    dh_time: Duration,
    dh_count: u64,
    cookies_to_others: u64,
    kernel_drops: u64,
}

impl Sim {
    /// A hub whose peers are `spokes` spokes, spoke `i` at `addr(i)`, and whose receive queue
    /// holds `queue_capacity` bytes.
    fn new(spokes: usize, addr: impl Fn(usize) -> SocketAddr, queue_capacity: usize) -> Sim {
        let start = Instant::now();
        let hub_key = PrivateKey::generate();
        let hub_addr: SocketAddr = HUB.parse().unwrap();
        let keys: Vec<PrivateKey> = (0..spokes).map(|_| PrivateKey::generate()).collect();
        let hub = Device::new(
            settings(&hub_key, 51820),
            keys.iter()
                .enumerate()
                .map(|(i, k)| {
                    let [a, b, c, d] = spoke_ip(i);
                    PeerSettings::new(k.public_key())
                        .allowed_ip(format!("{a}.{b}.{c}.{d}/32").parse().unwrap())
                })
                .collect(),
            start,
            Environment::seeded(1, Duration::from_secs(1_000_000)),
        );
        let spokes: Vec<Spoke> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| Spoke {
                addr: addr(i),
                device: Device::new(
                    settings(k, 0),
                    vec![PeerSettings::new(hub_key.public_key())
                        .endpoint(hub_addr)
                        .allowed_ip("10.0.0.0/8".parse().unwrap())],
                    start,
                    Environment::seeded(100 + i as u64, Duration::from_secs(1_000_000)),
                ),
                answered: None,
                cookies: 0,
            })
            .collect();
        let by_addr = spokes
            .iter()
            .enumerate()
            .map(|(i, s)| (s.addr, i))
            .collect();
        Sim {
            hub,
            hub_addr,
            start,
            now: start,
            next_tick: start + TICK,
            queue: VecDeque::new(),
            queue_capacity,
            spokes,
            by_addr,
            dh_time: Duration::ZERO,
            dh_count: 0,
            cookies_to_others: 0,
            kernel_drops: 0,
        }
    }

    fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// A datagram reaches the hub's receive queue, or is dropped when the queue is full.
    fn arrive(&mut self, from: SocketAddr, datagram: Vec<u8>) {
        if (self.queue.len() + 1) * TRUESIZE > self.queue_capacity {
            self.kernel_drops += 1;
        } else {
            self.queue.push_back((from, datagram));
        }
    }

    /// Spoke `i` starts: a packet for the hub, so an initiation.
    fn start_spoke(&mut self, i: usize) {
        let packet = packet_from(i);
        let mut frame = packet.clone();
        frame.resize(packet.len() + 64, 0);
        let mut out = Collect::new();
        let now = self.now;
        self.spokes[i]
            .device
            .encapsulate(&mut frame, packet.len(), now, &mut out);
        let from = self.spokes[i].addr;
        for (_, d) in out.datagrams {
            self.arrive(from, d);
        }
    }

    /// Timers: the spokes' retransmissions and the hub's upkeep.
    fn tick(&mut self) {
        if self.now < self.next_tick {
            return;
        }
        self.next_tick = self.now + TICK;
        let now = self.now;
        let mut sent = Vec::new();
        for s in &mut self.spokes {
            let mut out = Collect::new();
            s.device.tick(now, &mut out);
            sent.extend(out.datagrams.into_iter().map(|(_, d)| (s.addr, d)));
        }
        for (from, d) in sent {
            self.arrive(from, d);
        }
        let mut out = Collect::new();
        self.hub.tick(now, &mut out);
    }

    /// One turn of the hub: a batch from the queue, its cost added to the clock, its replies
    /// delivered. Returns false when the queue was empty.
    fn turn(&mut self) -> bool {
        if self.queue.is_empty() {
            return false;
        }
        let n = self.queue.len().min(BATCH);
        let batch: Vec<_> = self.queue.drain(..n).collect();
        if n == BATCH {
            self.hub
                .note_backlog(self.queue.len() * TRUESIZE, self.queue_capacity, self.now);
        }
        let mut cost = Duration::ZERO;
        let mut replies = Vec::new();
        for (from, datagram) in batch {
            let unknown = self.hub.stats().drops(DropReason::UnknownPeer);
            let (mut tun, mut out) = (Collect::new(), Collect::new());
            self.hub
                .decapsulate(from, &datagram, self.now, &mut tun, &mut out);
            let answered = out.datagrams.iter().any(|(_, d)| d[0] == 2);
            let cookie = out.datagrams.iter().any(|(_, d)| d[0] == 3);
            if answered || self.hub.stats().drops(DropReason::UnknownPeer) > unknown {
                cost += DH_COST;
                self.dh_time += DH_COST;
                self.dh_count += 1;
            } else if cookie {
                cost += COOKIE_COST;
                if !self.by_addr.contains_key(&from) {
                    self.cookies_to_others += 1;
                }
            } else {
                cost += OTHER_COST;
            }
            replies.extend(out.datagrams);
        }
        self.now += cost;
        let now = self.now;
        for (to, reply) in replies {
            let Some(&i) = self.by_addr.get(&to) else {
                continue;
            };
            let s = &mut self.spokes[i];
            match reply[0] {
                2 if s.answered.is_none() => s.answered = Some(now - self.start),
                3 => s.cookies += 1,
                _ => {}
            }
            let (mut tun, mut out) = (Collect::new(), Collect::new());
            s.device
                .decapsulate(self.hub_addr, &reply, now, &mut tun, &mut out);
            let from = s.addr;
            for (_, d) in out.datagrams {
                self.arrive(from, d);
            }
        }
        true
    }

    /// Runs turns (and timers) until `until` from the start; `between` is called before each
    /// turn with the time since the last call, to add arrivals.
    fn run(&mut self, until: Duration, mut between: impl FnMut(&mut Sim, Duration)) {
        let mut last = self.now;
        while self.elapsed() < until {
            let since = self.now - last;
            last = self.now;
            between(self, since);
            self.tick();
            if !self.turn() {
                self.now += Duration::from_millis(1);
            }
        }
    }
}

/// Spoke `i`'s address: 256 source addresses, as the bench's storm has.
fn behind_256_addresses(i: usize) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(198, 51, 100, (i % 256) as u8)),
        10_000 + (i / 256) as u16,
    )
}

/// Every spoke of a storm the hub can answer in time starts at once: none gets a cookie,
/// and each is answered before its retransmission. (The rule before demanded cookies once a
/// receive queue was an eighth full: here, from the 158th queued initiation.)
#[test]
fn a_storm_the_hub_can_answer_in_time_gets_no_cookies() {
    let spokes = 600;
    let mut sim = Sim::new(spokes, behind_256_addresses, 1 << 20);
    for i in 0..spokes {
        sim.start_spoke(i);
    }
    assert_eq!(sim.kernel_drops, 0);
    sim.run(Duration::from_secs(4), |_, _| {});
    let cookies: u64 = sim.spokes.iter().map(|s| s.cookies).sum();
    let latest = sim.spokes.iter().filter_map(|s| s.answered).max();
    let unanswered = sim.spokes.iter().filter(|s| s.answered.is_none()).count();
    eprintln!(
        "storm of {spokes} at {DH_COST:?} each: {cookies} cookies, {unanswered} unanswered, last answered at {latest:?}"
    );
    assert_eq!(cookies, 0, "no spoke needed a cookie");
    assert_eq!(unanswered, 0);
    assert!(latest.unwrap() < Duration::from_secs(5), "{latest:?}");
}

/// A flood of initiations with a valid mac1 from spoofed addresses, five times what the hub
/// can handle, for 40 s, and a real spoke that starts a second in: the flood gets cookie
/// replies, the hub's Diffie-Hellman work stays within its budget (the burst plus
/// `WORK_SHARE` of the time), and the spoke, which can return its cookie, is answered.
#[test]
fn a_spoofed_flood_beyond_the_hubs_rate_gets_cookies_and_bounded_work() {
    let mut sim = Sim::new(1, |_| "203.0.113.9:4000".parse().unwrap(), 8 << 20);
    // One initiation of a key the hub does not know, replayed from ever new addresses: a
    // valid mac1 is all a spoofer can make.
    let attacker = PrivateKey::generate();
    let mut device = Device::new(
        settings(&attacker, 0),
        vec![PeerSettings::new(sim.hub.public_key())
            .endpoint(sim.hub_addr)
            .allowed_ip("10.0.0.0/8".parse().unwrap())],
        sim.now,
        Environment::seeded(7, Duration::from_secs(1_000_000)),
    );
    let mut frame = packet_from(0);
    frame.resize(32 + 64, 0);
    let mut out = Collect::new();
    device.encapsulate(&mut frame, 32, sim.now, &mut out);
    let initiation = out.datagrams.remove(0).1;

    let rate = 5.0 / DH_COST.as_secs_f64();
    let (mut owed, mut sent, mut started) = (0.0f64, 0u32, false);
    let mut dh_at_half = None;
    let flood = Duration::from_secs(40);
    sim.run(flood, |sim, since| {
        if !started && sim.elapsed() >= Duration::from_secs(1) {
            started = true;
            sim.start_spoke(0);
        }
        if dh_at_half.is_none() && sim.elapsed() >= Duration::from_secs(20) {
            dh_at_half = Some(sim.dh_time);
        }
        owed += since.as_secs_f64() * rate;
        while owed >= 1.0 {
            owed -= 1.0;
            sent += 1;
            let ip = Ipv4Addr::from(0xc612_0000 + sent % 60_000);
            sim.arrive(SocketAddr::new(IpAddr::V4(ip), 1024), initiation.clone());
        }
    });
    // The burst (`WORK_BURST`) and a quarter of the time (`WORK_SHARE`), at the cost the hub
    // measures: a tenth more for the turns before its measure converged.
    let budget = (5.0 + 0.25 * flood.as_secs_f64()) * 1.1;
    let second_half = (sim.dh_time - dh_at_half.unwrap()).as_secs_f64();
    eprintln!(
        "flood of {sent} in {flood:?}: {} cookie replies, {} handled in full ({:?} of Diffie-Hellman, {second_half:.2} s of it in the last 20 s; budget {budget:.1} s), {} dropped by the queue, spoke answered at {:?}",
        sim.cookies_to_others, sim.dh_count, sim.dh_time, sim.kernel_drops, sim.spokes[0].answered
    );
    assert!(
        sim.cookies_to_others > u64::from(sent) / 2,
        "most of the flood gets cookies"
    );
    assert!(
        sim.dh_time.as_secs_f64() <= budget,
        "the flood's Diffie-Hellman work stays within the budget"
    );
    assert!(
        second_half <= (5.0 + 0.25 * 20.0) * 1.1,
        "any 20 s of the flood: a burst and a quarter of the time at most"
    );
    let answered = sim.spokes[0].answered.expect("the real spoke is answered");
    assert!(
        answered < Duration::from_secs(1 + 5 + 4),
        "the real spoke is in within one retransmission: {answered:?}"
    );
}

/// Many spokes behind their addresses start together, and one address sends far more than
/// its share of what the hub can handle: it gets cookies, the others do not.
#[test]
fn one_address_past_its_share_gets_cookies_and_the_others_do_not() {
    // 200 spokes on 20 addresses; spoke 200 onwards, the loud one, all on one more.
    let loud: SocketAddr = "203.0.113.50:1".parse().unwrap();
    let addr = |i: usize| {
        if i < 200 {
            SocketAddr::new(
                IpAddr::V4(Ipv4Addr::new(198, 51, 100, (i % 20) as u8)),
                10_000 + i as u16,
            )
        } else {
            SocketAddr::new(loud.ip(), 20_000 + i as u16)
        }
    };
    let mut sim = Sim::new(200, addr, 8 << 20);
    // The loud address: the replayed initiation of a key the hub does not know, 2 000 times
    // over 2 s, beside the spokes starting over the same time.
    let attacker = PrivateKey::generate();
    let mut device = Device::new(
        settings(&attacker, 0),
        vec![PeerSettings::new(sim.hub.public_key())
            .endpoint(sim.hub_addr)
            .allowed_ip("10.0.0.0/8".parse().unwrap())],
        sim.now,
        Environment::seeded(9, Duration::from_secs(1_000_000)),
    );
    let mut frame = packet_from(0);
    frame.resize(32 + 64, 0);
    let mut out = Collect::new();
    device.encapsulate(&mut frame, 32, sim.now, &mut out);
    let initiation = out.datagrams.remove(0).1;
    let (mut next_spoke, mut loud_sent) = (0usize, 0u32);
    sim.run(Duration::from_secs(4), |sim, _| {
        let due = (sim.elapsed().as_secs_f64() / 2.0 * 200.0).ceil() as usize;
        while next_spoke < due.min(200) {
            sim.start_spoke(next_spoke);
            next_spoke += 1;
        }
        let due = (sim.elapsed().as_secs_f64() / 2.0 * 2000.0).ceil() as u32;
        while loud_sent < due.min(2000) {
            loud_sent += 1;
            sim.arrive(loud, initiation.clone());
        }
    });
    let spoke_cookies: u64 = sim.spokes.iter().map(|s| s.cookies).sum();
    let unanswered = sim.spokes.iter().filter(|s| s.answered.is_none()).count();
    eprintln!(
        "one loud address of 2000: {} cookies to it; 200 spokes: {spoke_cookies} cookies, {unanswered} unanswered; {} handled in full",
        sim.cookies_to_others, sim.dh_count
    );
    assert!(
        sim.cookies_to_others > 1000,
        "the loud address gets cookies"
    );
    assert_eq!(spoke_cookies, 0, "the spokes get none");
    assert_eq!(unanswered, 0);
}
