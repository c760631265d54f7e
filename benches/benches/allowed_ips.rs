//! Allowed-IPs longest-prefix match (`tunneld_wireguard::allowed_ips::AllowedIps<usize>`), the
//! lookup the core does for every packet both ways.
//!
//! One table per address family, each with 10 000 distinct random prefixes (v4: /8 to /32,
//! v6: /16 to /128, lengths uniform), from a fixed-seed PRNG so every run sees the same tables.
//! An iteration is 1 000 lookups of addresses drawn at random inside random table prefixes
//! (random host bits), so every lookup matches and walks to a realistic depth; uniformly random
//! v6 addresses would almost all miss at the first levels and flatter the table.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use tunneld_benches::SplitMix64;
use tunneld_wireguard::allowed_ips::AllowedIps;

const PREFIXES: usize = 10_000;
const LOOKUPS: usize = 1_000;

/// `PREFIXES` distinct prefixes made by `make`, mapped to their insertion order.
fn table(
    rng: &mut SplitMix64,
    mut make: impl FnMut(&mut SplitMix64) -> IpNet,
) -> (AllowedIps<usize>, Vec<IpNet>) {
    let mut t = AllowedIps::new();
    let mut nets = Vec::with_capacity(PREFIXES);
    while nets.len() < PREFIXES {
        let net = make(rng).trunc();
        if t.get(net).is_none() {
            t.insert(net, nets.len());
            nets.push(net);
        }
    }
    assert_eq!(t.len(), PREFIXES);
    (t, nets)
}

/// An address inside `net`, with random host bits.
fn address_in(rng: &mut SplitMix64, net: IpNet) -> IpAddr {
    match net {
        IpNet::V4(n) => {
            let host = (rng.next_u64() as u32) & !u32::from(n.netmask());
            IpAddr::V4(Ipv4Addr::from(u32::from(n.network()) | host))
        }
        IpNet::V6(n) => {
            let host = rng.next_u128() & !u128::from(n.netmask());
            IpAddr::V6(Ipv6Addr::from(u128::from(n.network()) | host))
        }
    }
}

fn bench_allowed_ips(c: &mut Criterion) {
    let mut rng = SplitMix64::new(0x5eed_0a11_0ed1_9500);
    let v4 = table(&mut rng, |r| {
        let len = r.range(8, 32) as u8;
        IpNet::V4(Ipv4Net::new(Ipv4Addr::from(r.next_u64() as u32), len).expect("len <= 32"))
    });
    let v6 = table(&mut rng, |r| {
        let len = r.range(16, 128) as u8;
        IpNet::V6(Ipv6Net::new(Ipv6Addr::from(r.next_u128()), len).expect("len <= 128"))
    });

    let mut group = c.benchmark_group("allowed_ips_10k_prefixes");
    group.throughput(Throughput::Elements(LOOKUPS as u64));
    for (family, (table, nets)) in [("v4", &v4), ("v6", &v6)] {
        let addrs: Vec<IpAddr> = (0..LOOKUPS)
            .map(|_| {
                let net = nets[rng.range(0, nets.len() as u64 - 1) as usize];
                address_in(&mut rng, net)
            })
            .collect();
        group.bench_function(format!("lookup_1000/{family}"), |bench| {
            bench.iter(|| {
                let mut hits = 0usize;
                for &addr in &addrs {
                    if let Some(&v) = table.lookup(black_box(addr)) {
                        hits += 1;
                        black_box(v);
                    }
                }
                assert_eq!(hits, LOOKUPS);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_allowed_ips);
criterion_main!(benches);
