//! Shared set-up of the criterion benchmarks in `benches/`: two sites A and B, their devices,
//! handshaken pairs (sans-IO and as workers over the in-memory backends), test packets and a
//! small deterministic PRNG. Nothing here is timed; the benches time what they call on it.

use ipnet::IpNet;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Instant;
use tunneld_crypto::{PrivateKey, PublicKey};
use tunneld_dataplane::offload::{VnetHdr, F_NEEDS_CSUM, GSO_TCPV4};
use tunneld_dataplane::sim::{self, SimSocket, SimTun};
use tunneld_dataplane::worker::{Worker, WorkerHandle};
use tunneld_dataplane::Batch;
use tunneld_wireguard::{Device, DeviceSettings, PeerSettings};

/// Fixes the data-message AEAD from `TUNNELD_BENCH_AEAD` (`aws-lc`, `ring`, `avx512`), if
/// set, instead of timing each at the first key as tunneld does: under a profiler such as
/// callgrind that timing picks by the profiler's speed. Says on stderr which one runs.
pub fn aead_from_env() {
    use tunneld_crypto::aead::{choice, choose, Implementation};
    if let Ok(name) = std::env::var("TUNNELD_BENCH_AEAD") {
        match Implementation::parse(&name) {
            Ok(preferred) => {
                choose(preferred);
            }
            Err(e) => panic!("TUNNELD_BENCH_AEAD: {e}"),
        }
    }
    eprintln!("data-message AEAD: {}", choice().implementation.name());
}

/// Site A's underlay address (documentation range: never routed).
pub const A_ADDR: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 1), 51820));
/// Site B's underlay address.
pub const B_ADDR: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 2), 51820));
/// Site A's overlay address: the source of every test packet.
pub const A_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
/// Site B's overlay address: the destination of every test packet.
pub const B_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
/// The MTU both devices use.
pub const MTU: u16 = 1420;

/// A device with key `own` and one peer, `peer`, allowed `allowed` and reachable at `endpoint`.
pub fn device(own: &PrivateKey, peer: PublicKey, allowed: IpNet, endpoint: SocketAddr) -> Device {
    Device::new(
        DeviceSettings {
            private_key: own.clone(),
            listen_port: 51820,
            mtu: MTU,
            fwmark: 0,
        },
        vec![PeerSettings::new(peer)
            .endpoint(endpoint)
            .allowed_ip(allowed)],
        Instant::now(),
        tunneld_dataplane::system_environment(),
    )
}

/// The prefix a site's peer is allowed: exactly the other site's overlay address.
pub fn host_prefix(ip: Ipv4Addr) -> IpNet {
    IpNet::new(ip.into(), 32).expect("/32 is a valid prefix length")
}

/// A fresh pair of devices for sites A and B with new keys, each the other's only peer.
/// No session yet.
pub fn device_pair() -> (Device, Device) {
    let (ka, kb) = (PrivateKey::generate(), PrivateKey::generate());
    let a = device(&ka, kb.public_key(), host_prefix(B_IP), B_ADDR);
    let b = device(&kb, ka.public_key(), host_prefix(A_IP), A_ADDR);
    (a, b)
}

/// An IPv4 packet of `len` bytes (at least 20) from A's overlay address to B's; the payload
/// is zeros. Only the fields the core reads are set (version, length, addresses).
pub fn ipv4_packet(len: usize) -> Vec<u8> {
    assert!(len >= 20, "an IPv4 header is 20 bytes");
    let mut p = vec![0u8; len];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&u16::try_from(len).expect("IPv4 length").to_be_bytes());
    p[12..16].copy_from_slice(&A_IP.octets());
    p[16..20].copy_from_slice(&B_IP.octets());
    p
}

/// A TCP/IPv4 super-packet from A's overlay address to B's of `segments` segments of `mss`
/// payload bytes (zeros), with the `virtio_net_hdr` a TUN with TSO gives it. Each segment the
/// worker cuts from it is a `40 + mss`-byte packet.
pub fn tcp_super_packet(segments: usize, mss: usize) -> (VnetHdr, Vec<u8>) {
    let mut p = ipv4_packet(40 + mss * segments);
    p[2..4].fill(0); // a super-packet's IP length is rebuilt per segment
    p[9] = 6; // TCP
    p[32] = 5 << 4; // data offset: 20 bytes
    p[33] = 0x10; // ACK
    let hdr = VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: GSO_TCPV4,
        hdr_len: 40,
        gso_size: u16::try_from(mss).expect("a segment size fits 16 bits"),
        csum_start: 20,
        csum_offset: 16,
    };
    (hdr, p)
}

/// Batches reused across a handshake exchange: allocating them (4 MiB each) per exchange
/// would time page faults, not the protocol.
#[derive(Debug, Default)]
pub struct ExchangeBatches {
    wire: Batch,
    back: Batch,
    tun: Batch,
}

/// Runs a whole handshake between `a` and `b` without a session: `frame` (whose first `len`
/// bytes are a packet from A to B, the rest room for padding) makes A initiate, B responds,
/// A confirms with a keepalive and sends the queued packet, B decrypts it. Returns how many
/// packets reached B's tunnel: 1 when the handshake completed.
pub fn handshake(
    a: &mut Device,
    b: &mut Device,
    frame: &mut [u8],
    len: usize,
    bufs: &mut ExchangeBatches,
) -> usize {
    let ExchangeBatches { wire, back, tun } = bufs;
    wire.clear();
    back.clear();
    tun.clear();
    let now = Instant::now();
    // Initiation (the packet is queued inside A's `Tunn`).
    a.encapsulate(frame, len, now, wire);
    // Response.
    for i in 0..wire.len() {
        b.decapsulate(A_ADDR, wire.payload(i), now, tun, back);
    }
    // Keepalive plus the queued packet.
    wire.clear();
    for i in 0..back.len() {
        a.decapsulate(B_ADDR, back.payload(i), now, tun, wire);
    }
    // B decrypts the packet.
    back.clear();
    for i in 0..wire.len() {
        b.decapsulate(A_ADDR, wire.payload(i), now, tun, back);
    }
    tun.len()
}

/// A pair of devices with a session up, ready for data in both directions.
pub fn handshaken_pair() -> (Device, Device) {
    let (mut a, mut b) = device_pair();
    let mut frame = ipv4_packet(64);
    frame.resize(128, 0);
    let delivered = handshake(
        &mut a,
        &mut b,
        &mut frame,
        64,
        &mut ExchangeBatches::default(),
    );
    assert_eq!(
        delivered, 1,
        "handshake did not complete in the bench set-up"
    );
    (a, b)
}

/// One site run by a real [`Worker`] over the in-memory backends.
#[derive(Debug)]
pub struct SimSite {
    pub worker: Worker<SimTun, SimSocket>,
    /// The "kernel" side of the site's TUN device: inject packets, take what was written.
    pub tun: SimTun,
    /// Kept so the worker's control channel stays open (only `turn` is used).
    _handle: WorkerHandle,
}

impl SimSite {
    fn new(device: Device, udp: SimSocket) -> SimSite {
        let tun = SimTun::new();
        let (worker, handle) =
            Worker::new(device, tun.clone(), udp).expect("creating a worker's eventfd");
        SimSite {
            worker,
            tun,
            _handle: handle,
        }
    }
}

/// Sites A and B as workers joined by a simulated link, with a session up.
#[derive(Debug)]
pub struct SimPair {
    pub a: SimSite,
    pub b: SimSite,
}

impl SimPair {
    /// New keys, a new link, and a completed handshake (driven by one packet from A to B,
    /// taken out of B's TUN again).
    pub fn handshaken() -> SimPair {
        let (da, db) = device_pair();
        let (udp_a, udp_b) = sim::link(A_ADDR, B_ADDR);
        let mut pair = SimPair {
            a: SimSite::new(da, udp_a),
            b: SimSite::new(db, udp_b),
        };
        assert!(pair.a.tun.inject(&ipv4_packet(64)));
        // Initiation, response, keepalive + queued packet, delivery: two turns each.
        for _ in 0..4 {
            let now = Instant::now();
            pair.a.worker.turn(now);
            pair.b.worker.turn(now);
        }
        assert!(
            pair.b.tun.take().is_some(),
            "worker handshake did not complete in the bench set-up"
        );
        pair
    }
}

/// Sites A and B of `workers` workers each over the in-memory backends, their peer split
/// into `workers` sub-tunnels. Lane `i` is A's worker `i` and B's worker `i`, joined by a
/// simulated link of their own: on real sockets the reuseport steering does the same, as
/// every datagram of sub-tunnel `i` names worker `i` on both sides. Workers of a site are
/// joined by their hand-off rings.
#[derive(Debug)]
pub struct SimLanes {
    pub lanes: Vec<(SimSite, SimSite)>,
}

impl SimLanes {
    /// New keys and links, and every sub-tunnel's handshake completed.
    pub fn handshaken(workers: usize) -> SimLanes {
        let (ka, kb) = (PrivateKey::generate(), PrivateKey::generate());
        let site_device = |own: &PrivateKey, peer: PublicKey, allowed, endpoint, w| {
            let settings = DeviceSettings {
                private_key: own.clone(),
                listen_port: 51820,
                mtu: MTU,
                fwmark: 0,
            };
            let peer = PeerSettings::new(peer)
                .endpoint(endpoint)
                .allowed_ip(allowed)
                .parallel(u8::try_from(workers).expect("at most 255 workers"));
            Device::for_worker(
                settings,
                vec![peer],
                Instant::now(),
                w,
                workers,
                tunneld_dataplane::system_environment(),
            )
        };
        let mut a_workers = Vec::new();
        let mut b_workers = Vec::new();
        let mut tuns = Vec::new();
        for w in 0..workers {
            let (udp_a, udp_b) = sim::link(A_ADDR, B_ADDR);
            let da = site_device(&ka, kb.public_key(), host_prefix(B_IP), B_ADDR, w);
            let db = site_device(&kb, ka.public_key(), host_prefix(A_IP), A_ADDR, w);
            let (ta, tb) = (SimTun::new(), SimTun::new());
            let (wa, ha) = Worker::new(da, ta.clone(), udp_a).expect("creating a worker's eventfd");
            let (wb, hb) = Worker::new(db, tb.clone(), udp_b).expect("creating a worker's eventfd");
            a_workers.push((wa, ha));
            b_workers.push((wb, hb));
            tuns.push((ta, tb));
        }
        let split = |pairs: Vec<(Worker<SimTun, SimSocket>, WorkerHandle)>| {
            let (mut workers, handles): (Vec<_>, Vec<_>) = pairs.into_iter().unzip();
            Worker::connect(&mut workers, usize::from(MTU));
            workers.into_iter().zip(handles)
        };
        let lanes = split(a_workers)
            .zip(split(b_workers))
            .zip(tuns)
            .map(|(((wa, ha), (wb, hb)), (ta, tb))| {
                let site = |worker, tun, handle| SimSite {
                    worker,
                    tun,
                    _handle: handle,
                };
                (site(wa, ta, ha), site(wb, tb, hb))
            })
            .collect();
        let mut lanes = SimLanes { lanes };
        // The first packet of each lane crosses on sub-tunnel 0 (the only one with a session
        // so far) and has its own sub-tunnel ask for a handshake at the next tick; the second
        // must then cross on its own lane.
        for round in 0..2 {
            for (i, (a, _)) in lanes.lanes.iter().enumerate() {
                assert!(a.tun.inject(&flow_packet(64, i, workers)));
            }
            for _ in 0..6 {
                lanes.turn_all();
            }
            lanes.tick_all();
            for _ in 0..6 {
                lanes.turn_all();
            }
            for (i, (_, b)) in lanes.lanes.iter().enumerate() {
                let mut arrived = 0;
                while b.tun.take().is_some() {
                    arrived += 1;
                }
                assert!(
                    round == 0 || arrived == 1,
                    "sub-tunnel {i} did not come up in the bench set-up"
                );
            }
        }
        lanes
    }

    /// The timers of every worker, on this thread (sub-tunnels ask for their first
    /// handshake there).
    pub fn tick_all(&mut self) {
        let now = Instant::now();
        for (a, b) in &mut self.lanes {
            a.worker.tick(now);
            b.worker.tick(now);
        }
    }

    /// One turn of every worker, on this thread.
    pub fn turn_all(&mut self) {
        let now = Instant::now();
        for (a, b) in &mut self.lanes {
            a.worker.turn(now);
            b.worker.turn(now);
        }
    }
}

/// A UDP/IPv4 packet of `len` bytes (at least 28) from A's overlay address to B's whose
/// flow hashes to sub-tunnel `sub` of `subs`: what a TUN queue of worker `sub` reads once the
/// kernel has learnt where the flow's replies come from.
pub fn flow_packet(len: usize, sub: usize, subs: usize) -> Vec<u8> {
    let mut p = ipv4_packet(len.max(28));
    p[9] = 17;
    p[22..24].copy_from_slice(&5201u16.to_be_bytes());
    for port in 10_000u16.. {
        p[20..22].copy_from_slice(&port.to_be_bytes());
        if tunneld_wireguard::packet::flow_hash(&p) as usize % subs == sub {
            break;
        }
    }
    p
}

/// SplitMix64: a tiny deterministic PRNG, so every run benchmarks the same tables.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn next_u128(&mut self) -> u128 {
        (u128::from(self.next_u64()) << 64) | u128::from(self.next_u64())
    }

    /// Uniform in `lo..=hi` (the modulo bias is irrelevant for ranges this small).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sans_io_pair_handshakes_and_carries_data() {
        let (mut a, mut b) = handshaken_pair();
        let mut frame = ipv4_packet(1420);
        frame.resize(1500, 0);
        let (mut wire, mut tun, mut net) = (Batch::new(), Batch::new(), Batch::new());
        a.encapsulate(&mut frame, 1420, Instant::now(), &mut wire);
        assert_eq!(wire.len(), 1);
        b.decapsulate(A_ADDR, wire.payload(0), Instant::now(), &mut tun, &mut net);
        assert_eq!(tun.payload(0), &ipv4_packet(1420)[..]);
    }

    #[test]
    fn sim_pair_handshakes_and_carries_a_batch() {
        let mut pair = SimPair::handshaken();
        for _ in 0..64 {
            assert!(pair.a.tun.inject(&ipv4_packet(1420)));
        }
        let now = Instant::now();
        pair.a.worker.turn(now);
        pair.b.worker.turn(now);
        assert_eq!(pair.b.tun.written(), 64);
    }

    #[test]
    fn prng_is_deterministic_and_in_range() {
        let (mut x, mut y) = (SplitMix64::new(7), SplitMix64::new(7));
        for _ in 0..1000 {
            let v = x.range(8, 32);
            assert!((8..=32).contains(&v));
            assert_eq!(v, y.range(8, 32));
        }
    }
}
