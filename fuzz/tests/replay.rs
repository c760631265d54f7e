//! The fuzz targets on stable: every checked-in seed, then pseudo-random inputs built from
//! the seeds (truncations and byte flips) and from nothing. `cargo xtask test` runs this;
//! `cargo xtask fuzz` runs the real thing on nightly.
//!
//! `cargo run --manifest-path fuzz/Cargo.toml --example write_seeds` rewrites the seeds.

use std::fs;
use std::path::{Path, PathBuf};
use tunneld_fuzz::TARGETS;

fn corpus(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target)
}

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let Ok(entries) = fs::read_dir(corpus(target)) else {
        return Vec::new();
    };
    // Only the checked-in seeds: what libFuzzer adds locally is not in the repository.
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("seed-"))
        })
        .collect();
    files.sort();
    files.iter().filter_map(|f| fs::read(f).ok()).collect()
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn every_target_survives_its_seeds_and_their_mutations() {
    let mut rng = Rng(0x0dd_ba11);
    for (name, run) in TARGETS {
        let seeds = seeds(name);
        assert!(
            !seeds.is_empty(),
            "no seeds for {name} in {}",
            corpus(name).display()
        );
        let mut runs = 0;
        for seed in &seeds {
            run(seed);
            runs += 1;
            for _ in 0..200 {
                let mut input = seed.clone();
                if !input.is_empty() && rng.next().is_multiple_of(2) {
                    let cut = (rng.next() as usize) % input.len();
                    input.truncate(cut);
                }
                for _ in 0..(rng.next() % 4) {
                    if !input.is_empty() {
                        let at = (rng.next() as usize) % input.len();
                        input[at] ^= 1 << (rng.next() % 8);
                    }
                }
                run(&input);
                runs += 1;
            }
        }
        for _ in 0..200 {
            let len = (rng.next() % 600) as usize;
            let input: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            run(&input);
            runs += 1;
        }
        eprintln!("{name}: {} seeds, {runs} runs", seeds.len());
    }
}
