//! The sans-IO core, no syscalls: a batch of 64 packets encrypted by one device and
//! decrypted by its peer, per iteration, at 1420 and 64 bytes.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::net::SocketAddr;
use std::time::Instant;
use tunneld_crypto::PrivateKey;
use tunneld_dataplane::{Batch, BATCH_SIZE};
use tunneld_tunnel::{Device, DeviceSettings, PeerSettings};

fn device(own: &PrivateKey, peer: &PrivateKey, peer_ip: &str, endpoint: &str) -> Device {
    Device::new(
        DeviceSettings {
            private_key: own.clone(),
            listen_port: 51820,
            mtu: 1420,
            fwmark: 0,
        },
        vec![PeerSettings {
            public_key: peer.public_key(),
            preshared_key: None,
            endpoint: Some(endpoint.parse().unwrap()),
            allowed_ips: vec![peer_ip.parse().unwrap()],
            persistent_keepalive: 0,
        }],
        Instant::now(),
    )
}

fn ipv4_packet(len: usize) -> Vec<u8> {
    let mut p = vec![0u8; len];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(len as u16).to_be_bytes());
    p[12..16].copy_from_slice(&[10, 0, 0, 1]);
    p[16..20].copy_from_slice(&[10, 0, 0, 2]);
    p
}

/// Runs datagrams from `out` into `to`, returning what it wrote to its tunnel and network.
fn deliver(to: &mut Device, from: SocketAddr, out: &Batch, tun: &mut Batch, net: &mut Batch) {
    for i in 0..out.len() {
        to.decapsulate(from, out.payload(i), Instant::now(), tun, net);
    }
}

fn bench_core(c: &mut Criterion) {
    let (ka, kb) = (PrivateKey::generate(), PrivateKey::generate());
    let a_addr: SocketAddr = "192.0.2.1:51820".parse().unwrap();
    let b_addr: SocketAddr = "192.0.2.2:51820".parse().unwrap();
    let mut a = device(&ka, &kb, "10.0.0.2/32", "192.0.2.2:51820");
    let mut b = device(&kb, &ka, "10.0.0.1/32", "192.0.2.1:51820");
    let (mut wire, mut back, mut tun) = (Batch::new(), Batch::new(), Batch::new());

    // Handshake: one packet from A, its initiation to B, the response back, the packet flushed.
    let mut first = ipv4_packet(64);
    first.resize(128, 0);
    a.encapsulate(&mut first, 64, Instant::now(), &mut wire);
    deliver(&mut b, a_addr, &wire, &mut tun, &mut back);
    wire.clear();
    deliver(&mut a, b_addr, &back, &mut tun, &mut wire);
    deliver(&mut b, a_addr, &wire, &mut tun, &mut back);
    assert!(
        !tun.is_empty(),
        "handshake did not complete in the bench set-up"
    );

    let mut group = c.benchmark_group("core_batch_64");
    for size in [1420usize, 64] {
        let packet = ipv4_packet(size);
        let mut frames = Batch::new();
        for _ in 0..BATCH_SIZE {
            let slot = frames.next_free().unwrap();
            slot[..size].copy_from_slice(&packet);
            frames.commit(size, a_addr);
        }
        group.throughput(Throughput::Bytes((size * BATCH_SIZE) as u64));
        // Batches are allocated once and reused, as in the worker: allocating per iteration
        // would measure page faults, not the core.
        let (mut wire, mut tun, mut net) = (Batch::new(), Batch::new(), Batch::new());
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
                    b.decapsulate(a_addr, wire.payload(i), now, &mut tun, &mut net);
                }
                assert_eq!(tun.len(), BATCH_SIZE);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_core);
criterion_main!(benches);
