//! The sans-IO core, no syscalls, per 64-packet batch at 1420 and 64 bytes:
//!
//! - `encrypt+decrypt`: the batch encrypted by one device and decrypted by its peer (session
//!   up), i.e. the whole core data path both ways, crypto included.
//! - `framing (no crypto)`: only the per-packet work the core does around the session on the
//!   way out: find the destination, look it up in the allowed-IPs table, compute the padded
//!   length. It excludes everything `noise::Session::seal` does (header, counter, AEAD, the
//!   copy into the datagram) and the receive side's source check, so it is a floor on the core's own
//!   overhead, not a cost of a full encapsulation.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use std::time::Instant;
use tunneld_benches::{handshaken_pair, host_prefix, ipv4_packet, A_ADDR, B_IP, MTU};
use tunneld_dataplane::{Batch, BATCH_SIZE};
use tunneld_wireguard::allowed_ips::AllowedIps;
use tunneld_wireguard::packet;

fn bench_core(c: &mut Criterion) {
    tunneld_benches::aead_from_env();
    let (mut a, mut b) = handshaken_pair();
    // The same routing table device A has: B's overlay address to peer slot 0.
    let mut routes = AllowedIps::<usize>::new();
    routes.insert(host_prefix(B_IP), 0);

    let mut group = c.benchmark_group("core_batch_64");
    for size in [1420usize, 64] {
        let packet = ipv4_packet(size);
        let mut frames = Batch::new();
        for _ in 0..BATCH_SIZE {
            let slot = frames.next_free().unwrap();
            slot[..size].copy_from_slice(&packet);
            frames.commit(size, A_ADDR);
        }
        // Batches are allocated once and reused, as in the worker: allocating per iteration
        // would measure page faults, not the core.
        let (mut wire, mut tun, mut net) = (Batch::new(), Batch::new(), Batch::new());

        group.throughput(Throughput::Bytes((size * BATCH_SIZE) as u64));
        group.bench_function(format!("encrypt+decrypt/{size}B"), |bench| {
            bench.iter(|| {
                wire.clear();
                tun.clear();
                net.clear();
                let now = Instant::now();
                for i in 0..frames.len() {
                    let (frame, len) = frames.frame_mut(i);
                    a.encapsulate(frame, len, now, &mut wire);
                }
                for i in 0..wire.len() {
                    b.decapsulate(A_ADDR, wire.payload(i), now, &mut tun, &mut net);
                }
                assert_eq!(tun.len(), BATCH_SIZE);
            })
        });

        group.throughput(Throughput::Elements(BATCH_SIZE as u64));
        group.bench_function(format!("framing (no crypto)/{size}B"), |bench| {
            bench.iter(|| {
                let mut padded_total = 0usize;
                for i in 0..frames.len() {
                    let p = black_box(frames.payload(i));
                    let dst = packet::destination(p).expect("an IPv4 packet");
                    let slot = *routes.lookup(dst).expect("a route to B");
                    padded_total += packet::padded_len(p.len(), usize::from(MTU)) + slot;
                }
                black_box(padded_total)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_core);
criterion_main!(benches);
