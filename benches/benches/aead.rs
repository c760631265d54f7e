//! ChaCha20-Poly1305 alone, through `tunneld_crypto::aead::TransportKey`, once for each
//! implementation this CPU runs (ring, aws-lc, the own AVX-512 one), by message size: seal and
//! open from one buffer into another, as `noise::Session` does. This is the crypto ceiling of
//! one core for the data path; `core.rs` shows what the rest of the core costs on top.
//!
//! A second group seals a full TLS record (16 KiB, AES-256-GCM, a 5-byte header as associated
//! data) with ring and with aws-lc-rs: the record crypto of tunneld's TLS tunnels is ring's
//! because of what this group shows on CPUs with VAES and AVX2 (see `provider` in crates/tls/src/lib.rs).
//!
//! When run by `cargo bench` and an `openssl` binary is on PATH, `openssl speed` for the same
//! AEAD runs once first (at most 60 s) and its table is printed to stderr as a reference
//! ceiling for this machine.

use criterion::{black_box, criterion_group, Criterion, Throughput};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey};
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tunneld_crypto::aead::{Implementation, TransportKey, TAG_LEN};

const SIZES: [usize; 6] = [64, 256, 1420, 4096, 16384, 65536];
const OPENSSL_LIMIT: Duration = Duration::from_secs(60);

/// WireGuard's nonce: 4 zero bytes, then the 64-bit little-endian counter.
fn nonce(counter: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&counter.to_le_bytes());
    Nonce::assume_unique_for_key(n)
}

fn bench_aead(c: &mut Criterion) {
    let key_bytes: [u8; 32] = std::array::from_fn(|i| i as u8);
    // Only what this CPU runs: a key on any other would be ring under another name.
    for implementation in Implementation::available() {
        let mut key = TransportKey::with(implementation, &key_bytes);
        let mut group = c.benchmark_group(format!("chacha20poly1305_{}", implementation.name()));
        for size in SIZES {
            let plaintext: Vec<u8> = (0..size).map(|i| i as u8).collect();
            let mut buf = vec![0u8; size + TAG_LEN];
            group.throughput(Throughput::Bytes(size as u64));

            let mut counter = 0u64;
            group.bench_function(format!("seal/{size}B"), |bench| {
                bench.iter(|| {
                    counter += 1;
                    let (data, tag_out) = buf.split_at_mut(size);
                    tag_out.copy_from_slice(&key.seal_into(counter, black_box(&plaintext), data));
                })
            });

            // One sealed message, opened (decrypt + verify into the buffer) every iteration.
            let mut sealed = plaintext.clone();
            let tag = key.seal(0, &mut sealed);
            sealed.extend_from_slice(&tag);
            group.bench_function(format!("open/{size}B"), |bench| {
                bench.iter(|| {
                    let opened = key
                        .open_into(0, black_box(&sealed), &mut buf)
                        .expect("authentic message");
                    black_box(opened)
                })
            });
        }
        group.finish();
    }
}

/// Whether this process was started to benchmark (`cargo bench` passes `--bench`), rather than
/// listed or run once as a test.
fn benchmarking() -> bool {
    let args: Vec<String> = std::env::args().collect();
    args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--list")
}

/// Runs `openssl speed -evp chacha20-poly1305 -seconds 1` (killed after [`OPENSSL_LIMIT`]) and
/// prints its result table to stderr, or says why there is none.
fn openssl_reference() {
    let child = Command::new("openssl")
        .args(["speed", "-evp", "chacha20-poly1305", "-seconds", "1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("openssl reference: skipped (no `openssl` binary on PATH)");
            return;
        }
        Err(e) => {
            eprintln!("openssl reference: skipped (starting `openssl` failed: {e})");
            return;
        }
    };
    eprintln!(
        "openssl reference: running `openssl speed -evp chacha20-poly1305 -seconds 1` \
         (about 6 s, at most {} s)...",
        OPENSSL_LIMIT.as_secs()
    );
    // Drain both pipes on their own threads so a full pipe never stalls openssl.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() < OPENSSL_LIMIT => {
                std::thread::sleep(Duration::from_millis(100))
            }
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    match status {
        None => eprintln!(
            "openssl reference: killed after {} s, no result",
            OPENSSL_LIMIT.as_secs()
        ),
        Some(s) if !s.success() => {
            eprintln!("openssl reference: `openssl speed` failed ({s}):\n{stderr}")
        }
        Some(_) => {
            // The table is the header line ("type  16 bytes ...") and the rows after it.
            let table: Vec<&str> = stdout
                .lines()
                .skip_while(|l| !l.starts_with("type"))
                .collect();
            let table = if table.is_empty() {
                stdout.trim_end().to_owned()
            } else {
                table.join("\n")
            };
            eprintln!(
                "openssl reference: ChaCha20-Poly1305 ceiling on this machine \
                 (openssl speed, 1 s per size; in 1000s of bytes per second):\n{table}\n"
            );
        }
    }
}

/// The largest TLS record's plaintext.
const TLS_RECORD: usize = 16 * 1024;

fn bench_tls_record(c: &mut Criterion) {
    let key_bytes = [7u8; 32];
    let header = [23u8, 3, 3, 0x40, 0x11];
    let mut record = vec![0x5au8; TLS_RECORD];
    let mut group = c.benchmark_group("aes256gcm_tls_record");
    group.throughput(Throughput::Bytes(TLS_RECORD as u64));

    let ring_key = LessSafeKey::new(
        UnboundKey::new(&ring::aead::AES_256_GCM, &key_bytes).expect("32-byte key"),
    );
    let mut counter = 0u64;
    group.bench_function("ring/seal/16KiB", |bench| {
        bench.iter(|| {
            counter += 1;
            ring_key
                .seal_in_place_separate_tag(nonce(counter), Aad::from(header), &mut record)
                .expect("seal")
        })
    });

    use aws_lc_rs::aead as lc;
    let lc_key = lc::LessSafeKey::new(
        lc::UnboundKey::new(&lc::AES_256_GCM, &key_bytes).expect("32-byte key"),
    );
    group.bench_function("aws-lc-rs/seal/16KiB", |bench| {
        bench.iter(|| {
            counter += 1;
            let mut n = [0u8; 12];
            n[4..].copy_from_slice(&counter.to_le_bytes());
            lc_key
                .seal_in_place_separate_tag(
                    lc::Nonce::assume_unique_for_key(n),
                    lc::Aad::from(header),
                    &mut record,
                )
                .expect("seal")
        })
    });
    group.finish();
}

criterion_group!(benches, bench_aead, bench_tls_record);

fn main() {
    if benchmarking() {
        openssl_reference();
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
