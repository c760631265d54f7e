//! The AF_XDP backend's per-datagram header cost (`tunneld_dataplane::xdp::frame`): the
//! Ethernet, IP and UDP headers written in front of a sealed 1420-byte payload, IPv4 and
//! IPv6, with the UDP checksum over the whole datagram (`UdpChecksum::Full`, which reads the
//! payload once and dominates) and with only the pseudo-header's part for a device that
//! checksums (`Offloaded`). The payload is random, as ciphertext is; one byte changes per
//! iteration so no sum can be carried over.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use std::net::SocketAddr;
use tunneld_benches::SplitMix64;
use tunneld_dataplane::xdp::frame::{write_headers, Hop, UdpChecksum, MAX_HEADERS};

const PAYLOAD: usize = 1420;

fn headers(c: &mut Criterion) {
    let mut rng = SplitMix64::new(5);
    let mut frame = vec![0u8; MAX_HEADERS + PAYLOAD];
    for byte in &mut frame {
        *byte = rng.next_u64() as u8;
    }
    let hop_v4 = Hop {
        src_mac: [2, 0, 0, 0, 0, 1],
        dst_mac: [2, 0, 0, 0, 0, 2],
        src_ip: "192.0.2.1".parse().expect("an IPv4 address"),
        ifindex: 3,
    };
    let hop_v6 = Hop {
        src_ip: "fd00::1".parse().expect("an IPv6 address"),
        ..hop_v4
    };
    let mut group = c.benchmark_group("xdp_headers");
    group.throughput(Throughput::Elements(1));
    for (family, hop, dst) in [
        ("v4", hop_v4, "192.0.2.2:51820"),
        ("v6", hop_v6, "[fd00::2]:51820"),
    ] {
        let dst: SocketAddr = dst.parse().expect("a socket address");
        for (checksum, how) in [
            ("full", UdpChecksum::Full),
            ("offloaded", UdpChecksum::Offloaded { ip_id: 7 }),
        ] {
            let mut i = 0u8;
            group.bench_function(format!("{family}_{checksum}_1420B"), |b| {
                b.iter(|| {
                    i = i.wrapping_add(1);
                    frame[MAX_HEADERS] = i;
                    black_box(write_headers(
                        black_box(&mut frame),
                        MAX_HEADERS,
                        PAYLOAD,
                        &hop,
                        9,
                        dst,
                        how,
                    ))
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, headers);
criterion_main!(benches);
