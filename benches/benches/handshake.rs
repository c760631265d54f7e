//! Handshakes per second on one core: a fresh pair of devices (new keys, no session) per
//! iteration, timed over the whole exchange, sans-IO: A's initiation (triggered by a packet),
//! B's response, A's keepalive plus the queued first data packet, and B decrypting it.
//!
//! The devices are made in `iter_batched`'s untimed set-up, so key generation and device
//! construction are not counted. Fresh devices also keep every exchange clear of the
//! device's "under load" rule (more than 64 handshake messages in one turn where no backlog
//! is reported, `HANDSHAKE_SLICE` in crates/wireguard/src/device.rs), which a long-lived
//! pair would meet at the same `now` and answer with cookies instead.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use tunneld_benches::{device_pair, handshake, ipv4_packet, ExchangeBatches};

fn bench_handshake(c: &mut Criterion) {
    let len = 64;
    let mut frame = ipv4_packet(len);
    frame.resize(128, 0);
    let mut bufs = ExchangeBatches::default();

    let mut group = c.benchmark_group("handshake");
    group.throughput(Throughput::Elements(1));
    group.bench_function("initiation+response+first_data", |bench| {
        bench.iter_batched(
            device_pair,
            |(mut a, mut b)| {
                let delivered = handshake(&mut a, &mut b, &mut frame, len, &mut bufs);
                assert_eq!(delivered, 1, "handshake did not complete");
                // Returned so that dropping the devices is not timed.
                (a, b)
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, bench_handshake);
criterion_main!(benches);
