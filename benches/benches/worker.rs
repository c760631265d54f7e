//! One worker turn each way over the in-memory backends (`tunneld_dataplane::sim`), no
//! syscalls: per iteration, 64 packets of 1420 bytes are injected into site A's simulated TUN,
//! A's worker turns (reads the batch, encrypts, sends on the simulated link), B's worker turns
//! (receives, decrypts, writes its TUN), and the 64 packets are taken out of B's TUN.
//!
//! The `tso` variant injects TCP super-packets instead (3 × 21 segments of the same 1420-byte
//! size, as a TUN with offloads hands them over), so the cost of cutting them in user space
//! shows against the plain variant, per packet.
//!
//! Besides the core's work this counts the worker's batching and the simulated backends'
//! costs: a lock and a copy per queue operation. Real TUN and UDP backends replace those with
//! syscalls; this is the worker without them.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::time::Instant;
use tunneld_benches::{ipv4_packet, tcp_super_packet, SimPair};
use tunneld_dataplane::offload::VnetHdr;
use tunneld_dataplane::BATCH_SIZE;

const PACKET: usize = 1420;
/// Independent A→B pairs in the "N pairs" variant.
const PAIRS: usize = 2;

/// One batch from A's TUN to B's TUN through both workers; panics unless all of it arrived.
fn one_batch(pair: &mut SimPair, packet: &[u8]) {
    for _ in 0..BATCH_SIZE {
        pair.a.tun.inject(packet);
    }
    deliver(pair, BATCH_SIZE);
}

/// Turns both workers once and takes what reached B's TUN; panics unless `expected` arrived.
fn deliver(pair: &mut SimPair, expected: usize) {
    let now = Instant::now();
    pair.a.worker.turn(now);
    pair.b.worker.turn(now);
    let mut received = 0;
    let mut buf = Vec::with_capacity(2048);
    while pair.b.tun.take_into(&mut buf) {
        received += 1;
    }
    assert_eq!(received, expected, "packets lost between A and B");
}

/// Super-packets of this many segments, this many per turn: 63 packets, about one batch.
const TSO_SEGMENTS: usize = 21;
const TSO_SUPER_PACKETS: usize = 3;

/// Three TCP super-packets from A's TUN, cut into 63 segments, to B's TUN.
fn super_packets(pair: &mut SimPair, super_packet: &(VnetHdr, Vec<u8>)) {
    for _ in 0..TSO_SUPER_PACKETS {
        pair.a.tun.inject_offload(super_packet.0, &super_packet.1);
    }
    deliver(pair, TSO_SUPER_PACKETS * TSO_SEGMENTS);
}

fn bench_worker(c: &mut Criterion) {
    tunneld_benches::aead_from_env();
    let packet = ipv4_packet(PACKET);
    let mut group = c.benchmark_group("worker_turn_64x1420B");

    let mut pair = SimPair::handshaken();
    group.throughput(Throughput::Elements(BATCH_SIZE as u64));
    group.bench_function("1_pair", |bench| {
        bench.iter(|| one_batch(&mut pair, &packet))
    });

    // The single-thread baseline for the multi-core issue: PAIRS independent pairs (each its
    // own devices, link and workers), run one after the other on this one thread. It is NOT a
    // parallel measurement; it shows the per-core figure (and that more workers on one core
    // cost no more per packet than one) that running workers on separate cores scales from.
    let mut pairs: Vec<SimPair> = (0..PAIRS).map(|_| SimPair::handshaken()).collect();
    group.throughput(Throughput::Elements((BATCH_SIZE * PAIRS) as u64));
    group.bench_function(format!("{PAIRS}_pairs_sequential_one_thread"), |bench| {
        bench.iter(|| {
            for pair in &mut pairs {
                one_batch(pair, &packet);
            }
        })
    });

    let tso = tcp_super_packet(TSO_SEGMENTS, PACKET - 40);
    let mut pair = SimPair::handshaken();
    group.throughput(Throughput::Elements(
        (TSO_SUPER_PACKETS * TSO_SEGMENTS) as u64,
    ));
    group.bench_function("1_pair_tso_superpackets", |bench| {
        bench.iter(|| super_packets(&mut pair, &tso))
    });
    group.finish();
}

criterion_group!(benches, bench_worker);
criterion_main!(benches);
