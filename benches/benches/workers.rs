//! Multi-core scaling in process: sites A and B with N workers each over the in-memory
//! backends (no kernel), their peer split into N sub-tunnels, lane i (A's worker i and B's
//! worker i) on a thread of its own. Per iteration every lane carries one batch of 64
//! packets of 1420 bytes from A's TUN to B's TUN, each of a flow its own worker carries
//! (one flow per core, inline, as the kernel's TUN queue steering settles into).
//!
//! Throughput is counted over all lanes, so "2_workers" against "1_worker" is the scaling
//! of the design on this machine; the same bench on a larger one shows how far it goes
//! (`TUNNELD_BENCH_WORKERS=8 cargo bench --bench workers` adds that count).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use tunneld_benches::{flow_packet, SimLanes};
use tunneld_dataplane::BATCH_SIZE;

const PACKET: usize = 1420;

/// Runs `iters` batches on every lane at once; returns the wall time from the common start
/// until the last lane is done. Panics if a lane loses packets.
fn run_lanes(lanes: &mut SimLanes, iters: u64) -> Duration {
    let workers = lanes.lanes.len();
    let barrier = Arc::new(Barrier::new(workers + 1));
    let taken = std::mem::take(&mut lanes.lanes);
    let threads: Vec<_> = taken
        .into_iter()
        .enumerate()
        .map(|(i, (mut a, mut b))| {
            let barrier = barrier.clone();
            let packet = flow_packet(PACKET, i, workers);
            std::thread::spawn(move || {
                let mut buf = Vec::with_capacity(2048);
                barrier.wait();
                let start = Instant::now();
                for _ in 0..iters {
                    for _ in 0..BATCH_SIZE {
                        a.tun.inject(&packet);
                    }
                    let now = Instant::now();
                    a.worker.turn(now);
                    b.worker.turn(now);
                    let mut received = 0;
                    while b.tun.take_into(&mut buf) {
                        received += 1;
                    }
                    assert_eq!(received, BATCH_SIZE, "packets lost on lane {i}");
                }
                (a, b, start, Instant::now())
            })
        })
        .collect();
    barrier.wait();
    let mut first: Option<Instant> = None;
    let mut last: Option<Instant> = None;
    for thread in threads {
        let (a, b, start, done) = thread.join().expect("a lane panicked");
        first = Some(first.map_or(start, |f| f.min(start)));
        last = Some(last.map_or(done, |l| l.max(done)));
        lanes.lanes.push((a, b));
    }
    match (first, last) {
        (Some(first), Some(last)) => last - first,
        _ => Duration::ZERO,
    }
}

fn bench_workers(c: &mut Criterion) {
    tunneld_benches::aead_from_env();
    let mut counts = vec![1, 2];
    if let Some(n) = std::env::var("TUNNELD_BENCH_WORKERS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| *n > 2)
    {
        counts.push(n);
    }
    let mut group = c.benchmark_group("workers_64x1420B_per_lane");
    for workers in counts {
        let mut lanes = SimLanes::handshaken(workers);
        group.throughput(Throughput::Elements((BATCH_SIZE * workers) as u64));
        let name = if workers == 1 {
            "1_worker".to_string()
        } else {
            format!("{workers}_workers")
        };
        group.bench_function(name, |bench| {
            bench.iter_custom(|iters| run_lanes(&mut lanes, iters))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_workers);
criterion_main!(benches);
