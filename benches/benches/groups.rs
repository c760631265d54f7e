//! What a TLS listener's server side of one key exchange costs, per key exchange group
//! `[[tls.listen]] groups` can name: rustls's `start_and_complete`, which is what a TLS 1.3
//! server runs on the client's key share (its own key pair and the shared secret; for
//! X25519MLKEM768, the encapsulation as well). The client's share is made once, outside the
//! measurement. The default groups are rustls's aws-lc-rs provider's; the opt-in ones are
//! `tunneld_tls::groups::OPT_IN` (README, "TLS key exchange", quotes these numbers).

use criterion::{black_box, criterion_group, Criterion};
use rustls::crypto::SupportedKxGroup;
use std::time::Duration;

fn bench_groups(c: &mut Criterion) {
    let defaults = rustls::crypto::aws_lc_rs::default_provider().kx_groups;
    let every: Vec<&'static dyn SupportedKxGroup> = defaults
        .into_iter()
        .chain(tunneld_tls::groups::OPT_IN)
        .collect();
    let mut group = c.benchmark_group("kx_server");
    // ffdhe8192 takes about 20 ms a run: few samples keep the whole bench near a minute.
    group.sample_size(20);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));
    for kx in every {
        let client = kx.start().expect("a client key share");
        let share = client.pub_key().to_vec();
        group.bench_function(format!("{:?}", kx.name()), |b| {
            b.iter(|| {
                let done = kx
                    .start_and_complete(black_box(&share))
                    .expect("the server side of an exchange");
                black_box(done.secret.secret_bytes().len())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_groups);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
