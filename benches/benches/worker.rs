//! One worker turn each way over the in-memory backends (`tunneld_dataplane::sim`), no
//! syscalls: per iteration, 64 packets of 1420 bytes are injected into site A's simulated TUN,
//! A's worker turns (reads the batch, encrypts, sends on the simulated link), B's worker turns
//! (receives, decrypts, writes its TUN), and the 64 packets are taken out of B's TUN.
//!
//! Besides the core's work this counts the worker's batching and the simulated backends'
//! costs: a lock and a copy per queue operation, and one allocation per packet written to
//! B's TUN (`SimTun::take` hands its buffer out rather than recycling it). Real TUN and UDP
//! backends replace those with syscalls; this is the worker without them.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::time::Instant;
use tunneld_benches::{ipv4_packet, SimPair};
use tunneld_dataplane::BATCH_SIZE;

const PACKET: usize = 1420;
/// Independent A→B pairs in the "N pairs" variant.
const PAIRS: usize = 2;

/// One batch from A's TUN to B's TUN through both workers; panics unless all of it arrived.
fn one_batch(pair: &mut SimPair, packet: &[u8]) {
    for _ in 0..BATCH_SIZE {
        pair.a.tun.inject(packet);
    }
    let now = Instant::now();
    pair.a.worker.turn(now);
    pair.b.worker.turn(now);
    let mut received = 0;
    while pair.b.tun.take().is_some() {
        received += 1;
    }
    assert_eq!(received, BATCH_SIZE, "packets lost between A and B");
}

fn bench_worker(c: &mut Criterion) {
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
    group.finish();
}

criterion_group!(benches, bench_worker);
criterion_main!(benches);
