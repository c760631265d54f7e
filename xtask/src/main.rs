//! Project automation. `cargo xtask test` runs the whole suite; `cargo xtask demo` shows two
//! sites joined by tunneld in network namespaces. Both install missing system tools first.

mod bench;
mod closed_loop;
mod demo;
#[cfg(test)]
mod docs_commands;
mod embedded_bench;
mod fleet_bench;
mod fleet_scale;
mod fuzz;
mod hub_bench;
mod kernel_wg;
#[cfg(test)]
mod library_deps;
#[cfg(test)]
mod module_cycles;
mod nat_bench;
#[cfg(test)]
mod one_netlink_parser;
mod package;
mod proxy_bench;
mod publish;
mod rehearsal;
mod report;
mod smoltcp_series;
mod system;
mod testbed;
mod tls_bench;
mod tlsfuzzer;

use std::process::ExitCode;

const USAGE: &str = "usage: cargo xtask <command>

commands:
  test             install missing tools, then fmt, clippy, all tests (incl. netns end to end)
  demo [--compare] two sites joined by tunneld in namespaces: ping, TCP transfer, speed;
                   --compare adds wireguard-go in the same testbed
  bench [--quick] [--rounds N] [--seconds S] [--only NAME,NAME] [--tunneld-baseline BIN]
        [--update-docs]
                   end-to-end comparison in namespaces: direct, tunneld, wireguard-go
                   (Debian; Go-module build), boringtun-cli, gotatun-cli, kernel WireGuard
                   where present;
                   interleaved rounds, medians; report in target/bench-report/;
                   --only keeps the rows whose name contains one of the NAMEs
                   (a comma followed by a space is part of a NAME);
                   --tunneld-baseline adds each tunneld row for another tunneld build too;
                   --update-docs puts the report on docs/benchmarks.md's front page
                   (every bench command takes it; never with --quick)
  bench-tls [--quick] [--rounds N] [--seconds S] [--only NAME,...] [--tunneld-baseline BIN]
        [--update-docs]
                   TCP forwarded over TLS in namespaces: direct, stunnel4, tunneld's
                   [[tls.forward]]/[[tls.listen]]; throughput, proxy CPU, echo latency,
                   64 connections at once; --tunneld-baseline adds each tunneld row for
                   another tunneld build too; report in target/bench-report/tls-report.md
  bench-embedded [--quick] [--rounds N] [--seconds S] [--only NAME,...] [--local]
        [--update-docs]
                   embedded TCP/IP stacks in a WireGuard tunnel (tunneld-userspace,
                   wireguard-go's netstack, onetun) against the kernel's TCP through
                   tunneld's TUN path: 1 stream, 64 connections' requests, CPU, memory;
                   --local keeps the rows built from this repository (no downloads);
                   report in target/bench-report/embedded-report.md
  bench-proxy [--quick] [--rounds N] [--seconds S] [--only NAME,...] [--update-docs]
                   proxies into a WireGuard tunnel without root or TUN: `tunneld proxy`
                   (HTTP CONNECT, SOCKS5, forwards) beside wireproxy's engine (wireguard-go's
                   netstack behind net/http, built with Go) and onetun: 1 stream, 64
                   connections kept alive, a new connection per request, UDP round trips,
                   proxy CPU, memory; report in target/bench-report/proxy-report.md
  bench-fleet [--quick] [--kills N] [--sizes N,...] [--update-docs]
                   the fleet on a three-member etcd cluster in namespaces: failover time
                   after kill -9 and SIGTERM of a site's active gateway (p50/p99 over N
                   each, default 10), time for a new site to be reachable from N = 10 and
                   50 others, etcd requests per gateway per minute, CPU and memory at rest;
                   report in target/bench-report/fleet-report.md
  bench-fleet-scale [--quick] [--sizes N,...] [--rest S] [--lease-ttl S] [--update-docs]
                   the fleet's full mesh at N sites (default 50,200; --quick: 20, about
                   20 s), one `tunneld up` per site in namespaces, three etcd members: mesh
                   time, a new site known to all and pinged, etcd requests and events, CPU
                   and memory at rest (default 60 s), extrapolated to 10 000 sites; lease
                   TTL 10 s by default; report in target/bench-report/fleet-scale-report.md
  bench-nat [--quick] [--rounds N] [--seconds S] [--update-docs]
                   sites behind NAT (issue 48) on one etcd member with a public relay site,
                   per pair of NAT kinds (public, endpoint-independent, endpoint-dependent):
                   time from both gateways up to the first ping through, time back after a
                   NAT's conntrack flush, the path `tunneld show` says (direct, relayed);
                   iperf3 and RTT direct against relayed for the same EIM pair (UDP between
                   them dropped), the relay's CPU per Gbit; N rounds (default 3, --quick: 1
                   of three pairs, about 20 s), S s of iperf3 each (default 3); report in
                   target/bench-report/nat-report.md
  bench-hub [--quick] [--rounds N] [--peers N,...] [--no-up] [--spread S]
             [--baseline TUNNELD] [--update-docs]
                   a hub with N peers (default 1000,10000,100000), tunneld beside
                   wireguard-go: wg setconf, up with routes, wg show dump, RSS per peer,
                   and a restart storm of N real initiators from 256 addresses (time until
                   every session is confirmed, retransmissions, hub CPU per handshake);
                   report in target/bench-report/hub-report.md
  fuzz <target|all|list> [--time N]
                   coverage-guided fuzzing of a target in fuzz/ (nightly + cargo-fuzz,
                   installed when missing); default 60 s each
  tlsfuzzer [SCRIPT...]
                   tlsfuzzer's TLS 1.3 scripts (without names, the test step's 41: conversation,
                   keyupdate, lengths, ...) against tunneld's [[tls.listen]] and openssl
                   s_server side by side in a namespace, every probe, the group scripts again
                   with the opt-in groups (X448, ffdhe*) on both; fails when a probe that
                   passes on OpenSSL does not on tunneld, but the expected differences
                   (named, docs/reliability.md), or when one of those stops differing; report in
                   target/tlsfuzzer-step/report.md; needs root and the vendored copy in
                   ../shared/vendor/tlsfuzzer (or TUNNELD_TLSFUZZER_DIR); installs
                   python3-ecdsa when missing
  tlsfuzzer --compare-all [--limit SECONDS] [--only openssl|tunneld] [--report] [SCRIPT...]
                   the same for every TLS 1.3 script (default 240 s per script); report in
                   target/tlsfuzzer-compare/report.md
  kernel-wg        tunneld against kernel WireGuard in two namespaces: each side initiating,
                   a preshared key, ping and TCP both ways over IPv4 and IPv6, a rekey,
                   `wg show`; on the host when its kernel has WireGuard, else in a QEMU
                   guest (software emulation) booting Debian's kernel with virtme-ng
                   (cached in target/kernel-wg/); needs root; installs QEMU when missing
  deb [--check]    the Debian package (cargo-deb, installed when missing): the binary, the
                   systemd unit, man pages, shell completions, an example config; --check
                   installs it, uses it (and systemd-analyze on its unit), removes it
  deps             only install the system tools the tests and demo need
  smoltcp-series --check | --onto VERSION
                   the smoltcp fork as upstream's package plus vendor/smoltcp-patches/:
                   --check applies the series to smoltcp 0.14.0 from crates.io and fails
                   unless it gives vendor/smoltcp byte for byte; --onto applies it to another
                   upstream release in target/smoltcp-series/onto-VERSION and reports per
                   patch: applied cleanly, with offsets or fuzz, or conflicts and where
  publish-check [--allow-dirty]
                   what depending on the library needs: docs with no warning, and
                   `cargo publish --dry-run` of every published crate (about 2 minutes)
  rehearsal        the published crates as a user gets them: packaged, laid out with the
                   locked crates.io crates as a directory source that replaces crates.io, and
                   a consumer (xtask/rehearsal/consumer.rs) built against them in an empty
                   directory with no [patch], then run in a namespace: an embedded gateway
                   and a user-space tunnel move 1 MiB; needs root to run it";

fn main() -> ExitCode {
    system::ensure_sbin_in_path();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if matches!(
        args.first().map(String::as_str),
        Some(
            "demo"
                | "bench"
                | "bench-tls"
                | "bench-embedded"
                | "bench-proxy"
                | "bench-fleet"
                | "bench-fleet-scale"
                | "bench-hub"
                | "bench-nat"
        )
    ) {
        system::catch_interrupts();
    }
    let result = match args.first().map(String::as_str) {
        Some("test") => return test(),
        Some("demo") => demo::run(args.iter().any(|a| a == "--compare")),
        Some("bench") => bench::run(&args[1..]),
        Some("bench-tls") => tls_bench::run(&args[1..]),
        Some("bench-embedded") => embedded_bench::run(&args[1..]),
        Some("bench-proxy") => proxy_bench::run(&args[1..]),
        Some("bench-fleet") => fleet_bench::run(&args[1..]),
        Some("bench-fleet-scale") => fleet_scale::run(&args[1..]),
        Some("bench-hub") => hub_bench::run(&args[1..]),
        Some("bench-nat") => nat_bench::run(&args[1..]),
        Some("fuzz") => fuzz::run(&args[1..]),
        Some("tlsfuzzer") => tlsfuzzer::run(&args[1..]),
        Some("kernel-wg") => system::install_tools().and_then(|()| kernel_wg::run(&args[1..])),
        Some("deps") => system::install_tools(),
        Some("smoltcp-series") => smoltcp_series::run(&args[1..]),
        Some("publish-check") => system::repo_root().and_then(|root| {
            publish::docs(&root)?;
            publish::dry_run(&root, args.iter().any(|a| a == "--allow-dirty"))
        }),
        Some("rehearsal") => system::repo_root().and_then(|root| rehearsal::run_rehearsal(&root)),
        Some("deb") => package::build().and_then(|deb| {
            if args.iter().any(|a| a == "--check") {
                package::check_installed(&deb)
            } else {
                Ok(())
            }
        }),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Seconds of coverage-guided fuzzing per target in `cargo xtask test`.
const FUZZ_SMOKE_SECONDS: u64 = 10;

/// Counts from cargo's `test result:` lines.
#[derive(Default, Debug)]
struct Tally {
    passed: u64,
    failed: u64,
    skipped: u64,
}

impl Tally {
    fn add_line(&mut self, line: &str) {
        let Some(rest) = line.trim().strip_prefix("test result: ") else {
            return;
        };
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else {
                continue;
            };
            let n: u64 = n.parse().unwrap_or(0);
            match what {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.skipped += n,
                _ => {}
            }
        }
    }
}

/// Whether the network-namespace parts can run (root and a working `ip netns`).
fn netns_usable() -> bool {
    tunneld_testnet::netns_unusable().is_none()
}

/// A step of `cargo xtask test` that cannot run here: `SKIPPED` and why, or an error under
/// `TUNNELD_REQUIRE_ALL=1`, the rule of a test's skip (`tunneld_testnet::skip`).
/// How long the test command has run so far, between its steps: where CI's time goes.
fn elapsed(started: std::time::Instant) {
    let secs = started.elapsed().as_secs();
    eprintln!("--- {}m{:02}s into the run", secs / 60, secs % 60);
}

pub fn skip_step(step: &str, why: &str) -> Result<(), String> {
    if tunneld_testnet::skip::all_required() {
        Err(format!("{why} ({}=1)", tunneld_testnet::skip::REQUIRE_ALL))
    } else {
        eprintln!("==> {step}: SKIPPED ({why})");
        Ok(())
    }
}

/// `cargo xtask test`. Runs every step even when one fails, then prints the failed steps and,
/// last and alone on its line, `summary: N passed, M failed, K skipped`.
fn test() -> ExitCode {
    let started = std::time::Instant::now();
    let mut tally = Tally::default();
    let mut failures: Vec<String> = Vec::new();
    if let Err(e) = system::install_tools() {
        eprintln!("xtask: installing tools failed: {e}");
        failures.push("installing tools".into());
    }
    if let Err(e) = system::install_cargo_deny() {
        eprintln!("xtask: installing cargo-deny failed: {e}");
        failures.push("installing cargo-deny".into());
    }
    let root = match system::repo_root() {
        Ok(root) => root,
        Err(e) => {
            eprintln!("xtask: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The user-space tunnel's optional integrations, whose examples and tests need them.
    const USERSPACE_FEATURES: &str =
        "tunneld-userspace/axum,tunneld-userspace/hyper,tunneld-userspace/dns,tunneld-userspace/tonic";
    const SMOLTCP_FORK: &str = "vendor/smoltcp/Cargo.toml";
    // crates/userspace/Cargo.toml's smoltcp features but segmentation-offload, whose upstream
    // tests assume medium-ethernet (they do not build without it, in 0.14.0 as published
    // too); the workspace builds that code and tunneld-userspace's tests run it.
    const SMOLTCP_USERSPACE_FEATURES: &str =
        "std,medium-ip,proto-ipv4,proto-ipv6,socket-tcp,auto-icmp-echo-reply,\
        socket-udp,socket-tcp-cubic,assembler-max-segment-count-32";
    // ci.sh's set without std: the patches build and pass on alloc alone (seconds).
    const SMOLTCP_ALLOC_FEATURES: &str = "alloc,medium-ethernet,proto-ipv4,proto-ipv6,\
        socket-raw,socket-udp,socket-tcp,socket-icmp,proto-ipv6-slaac";
    let steps: &[(&str, &[&str])] = &[
        ("fmt", &["fmt", "--all", "--", "--check"]),
        (
            "clippy",
            &[
                "clippy",
                "--workspace",
                "--exclude",
                "tunneld-smoltcp",
                "--all-targets",
                "--features",
                USERSPACE_FEATURES,
                "--",
                "-D",
                "warnings",
            ],
        ),
        (
            "unit and end-to-end tests",
            &[
                "test",
                "--workspace",
                "--exclude",
                "tunneld-smoltcp",
                "--features",
                USERSPACE_FEATURES,
                "--no-fail-fast",
            ],
        ),
        // Built, not optimised: `cargo bench`'s profile (release without panic=abort) would
        // rebuild every dependency with thin LTO, minutes for no extra check.
        (
            "benches build",
            &[
                "build",
                "--workspace",
                "--exclude",
                "tunneld-smoltcp",
                "--benches",
            ],
        ),
        // The fuzz crate lives outside the workspace: its own fmt, lint, and the stable
        // replay of its targets over the seeds.
        (
            "fmt (fuzz)",
            &["fmt", "--manifest-path", "fuzz/Cargo.toml", "--", "--check"],
        ),
        (
            "clippy (fuzz)",
            &[
                "clippy",
                "--manifest-path",
                "fuzz/Cargo.toml",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ],
        ),
        (
            "fuzz targets, replayed on stable",
            &["test", "--manifest-path", "fuzz/Cargo.toml"],
        ),
        // The smoltcp fork (vendor/smoltcp, published as tunneld-smoltcp) is not linted or
        // tested as ours above: it runs upstream's whole suite the way its ci.sh does (`cargo test` per feature set, the netsim tests), with the patches' own tests:
        // default features (unit, integration and doc tests, examples built); the
        // congestion controllers; what tunneld-userspace enables; no std; netsim's
        // loss/throughput tables (release, as ci.sh runs them). About 4 minutes cold.
        (
            "smoltcp fork: default features",
            &["test", "--manifest-path", SMOLTCP_FORK],
        ),
        (
            "smoltcp fork: Reno and Cubic",
            &[
                "test",
                "--manifest-path",
                SMOLTCP_FORK,
                "--no-default-features",
                "--features",
                "default,socket-tcp-reno,socket-tcp-cubic",
            ],
        ),
        (
            "smoltcp fork: tunneld-userspace's features",
            &[
                "test",
                "--manifest-path",
                SMOLTCP_FORK,
                "--no-default-features",
                "--features",
                SMOLTCP_USERSPACE_FEATURES,
            ],
        ),
        (
            "smoltcp fork: alloc without std",
            &[
                "test",
                "--manifest-path",
                SMOLTCP_FORK,
                "--no-default-features",
                "--features",
                SMOLTCP_ALLOC_FEATURES,
            ],
        ),
        (
            "smoltcp fork: netsim",
            &[
                "test",
                "--manifest-path",
                SMOLTCP_FORK,
                "--release",
                "--features",
                "_netsim",
                "netsim",
            ],
        ),
        // Licences, bans and sources of every dependency against deny.toml.
        (
            "cargo deny",
            &["deny", "check", "bans", "licenses", "sources"],
        ),
    ];
    for (name, args) in steps {
        elapsed(started);
        eprintln!("==> {name}: cargo {}", args.join(" "));
        match system::cargo_streaming(&root, args, |line| tally.add_line(line)) {
            Ok(true) => {}
            Ok(false) => failures.push(name.to_string()),
            Err(e) => {
                eprintln!("xtask: {e}");
                failures.push(name.to_string());
            }
        }
    }
    elapsed(started);
    // The library's docs with no warning, and its API against the latest version tag; the
    // smoltcp fork is its patch series applied to the pristine upstream release; what is
    // published builds and runs as a user gets it.
    for (name, step) in [
        (
            "docs",
            publish::docs as fn(&std::path::Path) -> Result<(), String>,
        ),
        ("semver check", publish::semver),
        ("smoltcp series --check", smoltcp_series::check),
        // The published crates built from their packages by a consumer, with no [patch].
        ("packaged-crates rehearsal", rehearsal::run_rehearsal),
    ] {
        if let Err(e) = step(&root) {
            eprintln!("{name}: {e}");
            failures.push(name.into());
        }
    }
    elapsed(started);
    // Coverage-guided smoke of every fuzz target on nightly (cargo-fuzz installed when
    // missing). Without a nightly toolchain the stable replay above stands in for it: a
    // skip, so a failure under TUNNELD_REQUIRE_ALL=1 like any other.
    let fuzzable = fuzz::nightly_available() && fuzz::install_cargo_fuzz().is_ok();
    if fuzzable {
        for target in fuzz::TARGETS {
            match fuzz::fuzz_one(target, FUZZ_SMOKE_SECONDS) {
                Ok(runs) => eprintln!("fuzz smoke {target}: {runs} runs, no crash"),
                Err(e) => {
                    eprintln!("fuzz smoke: {e}");
                    failures.push(format!("fuzz smoke {target}"));
                }
            }
        }
    } else if let Err(e) = skip_step(
        "fuzz smoke",
        "needs a nightly toolchain and cargo-fuzz; the stable replay ran",
    ) {
        eprintln!("fuzz smoke: {e}");
        failures.push("fuzz smoke".into());
    }
    elapsed(started);
    // The package: built, installed with dpkg, used as a user would, removed. Needs root.
    if netns_usable() {
        eprintln!("==> package: cargo xtask deb, dpkg -i, checks, dpkg -r");
        match package::build().and_then(|deb| package::check_installed(&deb)) {
            Ok(()) => eprintln!("package: built, installed, checked and removed"),
            Err(e) => {
                eprintln!("package: {e}");
                failures.push("package".into());
            }
        }
    } else if let Err(e) = skip_step("package check", "needs root to install it") {
        eprintln!("package: {e}");
        failures.push("package (not root)".into());
    }
    elapsed(started);
    // tlsfuzzer's scripts against a [[tls.listen]] and OpenSSL side by side; each script
    // counts in the summary as one test. Skipped (counted so) without the vendored copy or without root.
    match tlsfuzzer::step() {
        Ok(Some(counts)) => {
            tally.passed += counts.passed;
            tally.failed += counts.failed;
            if counts.failed > 0 {
                failures.push("tlsfuzzer".into());
            }
        }
        Ok(None) => tally.skipped += tlsfuzzer::script_count(),
        Err(e) => {
            eprintln!("tlsfuzzer: {e}");
            failures.push("tlsfuzzer".into());
        }
    }
    elapsed(started);
    // tunneld against kernel WireGuard (in a QEMU guest where this kernel has none); each
    // check counts in the summary as one test. Skipped (counted so) without root.
    match kernel_wg::step() {
        Ok(Some(counts)) => {
            tally.passed += counts.passed;
            tally.failed += counts.failed;
            if counts.failed > 0 {
                failures.push("kernel WireGuard".into());
            }
        }
        Ok(None) => tally.skipped += kernel_wg::check_count(),
        Err(e) => {
            eprintln!("kernel WireGuard: {e}");
            failures.push("kernel WireGuard".into());
        }
    }
    elapsed(started);
    // The end-to-end benchmark harness, one short round, so it never rots. It needs network
    // namespaces: without them it is skipped like the privileged tests (a failure when they
    // are required).
    if netns_usable() {
        eprintln!("==> benchmark harness smoke run: cargo xtask bench --quick");
        if let Err(e) = bench::run(&["--quick".to_string()]) {
            eprintln!("bench --quick: {e}");
            failures.push("bench --quick".into());
        }
        // The embedded-stack section too, with only the rows built from this repository
        // (the kernel path; tunneld-userspace once it is in the tree): no downloads, seconds.
        eprintln!("==> embedded-stack bench smoke run: cargo xtask bench-embedded --quick --local");
        if let Err(e) = embedded_bench::run(&["--quick".to_string(), "--local".to_string()]) {
            eprintln!("bench-embedded --quick --local: {e}");
            failures.push("bench-embedded --quick --local".into());
        }
        // The fleet's: one failover each way and a mesh of three, on a real etcd cluster.
        eprintln!("==> fleet bench smoke run: cargo xtask bench-fleet --quick");
        if let Err(e) = fleet_bench::run(&["--quick".to_string()]) {
            eprintln!("bench-fleet --quick: {e}");
            failures.push("bench-fleet --quick".into());
        }
        // A mesh of twenty sites, a newcomer and the store at rest: about 15 s.
        eprintln!("==> fleet scale smoke run: cargo xtask bench-fleet-scale --quick");
        if let Err(e) = fleet_scale::run(&["--quick".to_string()]) {
            eprintln!("bench-fleet-scale --quick: {e}");
            failures.push("bench-fleet-scale --quick".into());
        }
        // Sites behind NAT: a direct pair, a relayed one, direct against relayed: about 17 s.
        eprintln!("==> NAT bench smoke run: cargo xtask bench-nat --quick");
        if let Err(e) = nat_bench::run(&["--quick".to_string()]) {
            eprintln!("bench-nat --quick: {e}");
            failures.push("bench-nat --quick".into());
        }
    } else if let Err(e) = skip_step(
        "benchmark harness smoke run",
        "needs root for network namespaces",
    ) {
        eprintln!("bench --quick: {e}");
        failures.push("bench --quick (no network namespaces)".into());
    }
    elapsed(started);
    if !failures.is_empty() {
        println!("failed steps: {}", failures.join(", "));
    }
    println!(
        "summary: {} passed, {} failed, {} skipped",
        tally.passed, tally.failed, tally.skipped
    );
    if failures.is_empty() && tally.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::Tally;

    #[test]
    fn tally_reads_cargo_result_lines() {
        let mut t = Tally::default();
        t.add_line("test result: ok. 8 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out; finished in 0.00s");
        t.add_line(
            "test result: FAILED. 1 passed; 3 failed; 0 ignored; 0 measured; 0 filtered out",
        );
        t.add_line("running 4 tests");
        assert_eq!((t.passed, t.failed, t.skipped), (9, 3, 2));
    }
}
