//! `cargo xtask bench`: every implementation in the same testbed, the same traffic and the
//! same accounting, interleaved over rounds (A B C A B C ...), medians reported. Writes a
//! Markdown table, a CSV and an SVG chart under target/bench-report/.

use crate::report::{self, cell, median, spread, Table};
use crate::system;
use crate::testbed::{kernel_has_wireguard, Impl, Testbed};
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use tunneld_testnet::require_netns;

/// The offload-capable wireguard-go, the fastest user-space peer in docs/benchmarks.md. The module proxy here refuses
/// the tag `v0.0.20250522` but serves this pseudo-version, whose binary reports itself as
/// "wireguard-go v0.0.20250522"; pinned for reproducibility.
pub(crate) const WIREGUARD_GO_MODULE: &str =
    "golang.zx2c4.com/wireguard@v0.0.0-20260522210424-ecfc5a8d5446";
const BORINGTUN_CLI_VERSION: &str = "0.7.1";
/// gotatun-cli from crates.io (Mullvad's fork of boringtun), a row of docs/benchmarks.md.
const GOTATUN_CLI_VERSION: &str = "0.10.2";

/// The options `bench` and `bench-tls` share.
pub(crate) struct Options {
    pub quick: bool,
    pub rounds: usize,
    pub seconds: u32,
    /// Only the rows whose name contains one of these (case-insensitive); empty: all.
    pub only: Vec<String>,
    /// The TCP congestion control iperf3's connections use, set in both sites' namespaces.
    /// Fixed rather than inherited because a namespace takes the host's default, and the
    /// host's choice moves every row (see docs/benchmarks.md, 2026-11-26, fourth session).
    pub tcp_cc: String,
    /// Put the report on docs/benchmarks.md's front page (`report::update_front_page`).
    pub update_docs: bool,
}

impl Options {
    /// Whether the row called `name` is in this run.
    pub fn keeps(&self, name: &str) -> bool {
        let name = name.to_lowercase();
        self.only.is_empty() || self.only.iter().any(|o| name.contains(o.as_str()))
    }
}

pub(crate) fn parse_options(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        quick: false,
        rounds: 5,
        seconds: 5,
        only: Vec::new(),
        tcp_cc: DEFAULT_TCP_CC.into(),
        update_docs: false,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| -> Result<usize, String> {
            it.next()
                .and_then(|v| v.parse().ok())
                .filter(|v| *v > 0)
                .ok_or_else(|| format!("{name} takes a positive number"))
        };
        match arg.as_str() {
            "--quick" => o.quick = true,
            "--update-docs" => o.update_docs = true,
            "--rounds" => o.rounds = value("--rounds")?,
            "--seconds" => o.seconds = value("--seconds")? as u32,
            "--only" => {
                let list = it
                    .next()
                    .ok_or("--only takes a comma-separated list of row names (parts of them)")?;
                o.only = split_names(list);
            }
            "--tcp-cc" => {
                o.tcp_cc = it
                    .next()
                    .filter(|name| is_congestion_control_name(name))
                    .ok_or("--tcp-cc takes the name of a TCP congestion control, such as cubic or bbr")?
                    .clone();
            }
            other => {
                return Err(format!(
                    "unknown bench option {other} (--quick, --rounds N, --seconds S, --only A,B, --tcp-cc NAME, --update-docs)"
                ))
            }
        }
    }
    if o.quick && o.update_docs {
        return Err(
            "--update-docs takes a full run: a --quick one is a smoke test, not a figure".into(),
        );
    }
    if o.quick {
        o.rounds = 1;
        o.seconds = 1;
    }
    Ok(o)
}

/// Linux's own default, and Debian's.
const DEFAULT_TCP_CC: &str = "cubic";

/// A module name as the kernel spells them (`cubic`, `bbr`, `htcp`, …).
fn is_congestion_control_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() < 16
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// The report's words on the congestion control: which one iperf3's connections ran (each
/// run checks its report), and whether the namespaces took it as their default, which a
/// host restricts to its `tcp_allowed_congestion_control` (the connections a proxy opens
/// itself run the namespaces' default).
pub(crate) fn congestion_control_note(tcp_cc: &str) -> String {
    match report::namespaces_congestion_control(tcp_cc) {
        Ok(()) => format!(
            "TCP congestion control: {tcp_cc}, both sites' default (the host's default: {})",
            system::host_tcp_cc()
        ),
        Err((host, allowed)) => format!(
            "TCP congestion control: {tcp_cc} on iperf3's connections, which ask for it \
             (`-C`); this host lets a namespace default only to {allowed}, so other \
             connections ran the host's default, {host}"
        ),
    }
}

/// The parts of an `--only` list. Row names have commas of their own, always followed by a
/// space ("tunneld (mmsg, all offloads)"), so only a comma followed by something else separates.
fn split_names(list: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut start = 0;
    for (i, _) in list.match_indices(',') {
        if !list[i + 1..].starts_with(' ') {
            names.push(&list[start..i]);
            start = i + 1;
        }
    }
    names.push(&list[start..]);
    names
        .into_iter()
        .map(|n| n.trim().to_lowercase())
        .filter(|n| !n.is_empty())
        .collect()
}

/// tunneld with its defaults on one worker: the row the others are set against, round by round.
const DEFAULT_ROW: &str = "tunneld (mmsg, all offloads)";
/// AF_XDP: the datagrams bypass the kernel's UDP stack (copy mode on the testbed's veth).
const XDP_ROW: &str = "tunneld (xdp, TUN offloads)";
/// The same with UDP checksums computed in software, set against it round by round.
const XDP_SOFTWARE_CHECKSUMS_ROW: &str = "tunneld (xdp, software UDP checksums)";
/// One link on two workers split over two sub-tunnels, set against the same link on one.
const PARALLEL_ROWS: [&str; 2] = [
    "tunneld (2 workers, parallel = 2)",
    "tunneld (2 workers, parallel = 1)",
];

/// One implementation's row: its name, how to run it, or why it is not in this run.
struct Contender {
    name: String,
    which: Result<Impl, String>,
    samples: Vec<Sample>,
}

#[derive(Default, Clone)]
struct Sample {
    /// The round this sample was taken in (from 1); a failed round leaves a gap.
    round: usize,
    tcp1_gbits: f64,
    tcp1_tunnel_cpu: f64,
    tcp1_machine_cpu: f64,
    tcp4_gbits: f64,
    tcp4_tunnel_cpu: f64,
    rtt_p50_us: f64,
    rtt_p99_us: f64,
    small_pps: f64,
    /// Tunnel processes' CPU seconds during the small-packet run.
    small_tunnel_cpu: f64,
    peak_rss_kib: f64,
}

/// Takes `--tunneld-baseline PATH` out of `args` (an option of `bench` and `bench-tls`),
/// leaving the options every bench shares to [`parse_options`]. The path comes back absolute
/// (tunneld starts from `ip netns exec`), and a typo fails here, not in every round.
/// The command line as a report shows it: a baseline build is named as such, not by this
/// machine's path to it.
pub(crate) fn shown_args(args: &[String], baseline: bool) -> Vec<String> {
    let mut shown = args.to_vec();
    if baseline {
        shown.extend(["--tunneld-baseline".into(), "<baseline build>".into()]);
    }
    shown
}

pub(crate) fn take_baseline(args: &[String]) -> Result<(Option<PathBuf>, Vec<String>), String> {
    let mut baseline = None;
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--tunneld-baseline" {
            let path = it
                .next()
                .ok_or("--tunneld-baseline takes the path of a tunneld binary")?;
            let absolute = fs::canonicalize(path)
                .ok()
                .filter(|p| p.is_file())
                .ok_or_else(|| format!("--tunneld-baseline {path}: no such file"))?;
            baseline = Some(absolute);
        } else {
            rest.push(arg.clone());
        }
    }
    Ok((baseline, rest))
}

pub fn run(args: &[String]) -> Result<(), String> {
    let (baseline, args) = take_baseline(args)?;
    let options = parse_options(&args)?;
    system::install_tools()?;
    if !require_netns("cargo xtask bench") {
        return Err("the benchmark needs root (network namespaces)".into());
    }
    let root = system::repo_root()?;
    let tunneld = system::build_tunneld()?;
    let tools = root.join("target/bench-tools");

    let mut contenders = vec![
        contender("direct (veth, no tunnel)", Ok(Impl::Direct)),
        contender(
            DEFAULT_ROW,
            Ok(Impl::Tunneld(
                tunneld.clone(),
                "backend = \"mmsg\"\nworkers = 1",
                "",
            )),
        ),
        // One link on two workers: its flows spread over two sub-tunnels, one per core.
        contender(
            PARALLEL_ROWS[0],
            Ok(Impl::Tunneld(
                tunneld.clone(),
                "backend = \"mmsg\"\nworkers = 2",
                "parallel = 2",
            )),
        ),
        contender(
            "wireguard-go (Debian package)",
            system::which("wireguard-go")
                .map(Impl::WireguardGo)
                .ok_or_else(|| "not installed".to_string()),
        ),
    ];
    if options.quick {
        eprintln!("--quick: one short round; the offload steps, Go-module wireguard-go, boringtun-cli, gotatun-cli and kernel rows are left out");
    } else {
        // Each offload step on its own row, so the gain of each shows.
        contenders.insert(
            1,
            contender(
                "tunneld (mmsg, no offloads)",
                Ok(Impl::Tunneld(
                    tunneld.clone(),
                    "backend = \"mmsg\"\nworkers = 1\nudp_gso = false\nudp_gro = false\ntun_offload = false",
                    "",
                )),
            ),
        );
        contenders.insert(
            2,
            contender(
                "tunneld (mmsg, UDP GSO/GRO only)",
                Ok(Impl::Tunneld(
                    tunneld.clone(),
                    "backend = \"mmsg\"\nworkers = 1\ntun_offload = false",
                    "",
                )),
            ),
        );
        contenders.insert(
            4,
            contender(
                "tunneld (uring, all offloads)",
                Ok(Impl::Tunneld(
                    tunneld.clone(),
                    "backend = \"uring\"\nworkers = 1",
                    "",
                )),
            ),
        );
        contenders.insert(
            5,
            contender(
                XDP_ROW,
                Ok(Impl::Tunneld(
                    tunneld.clone(),
                    "backend = \"xdp\"\nworkers = 1",
                    "",
                )),
            ),
        );
        // The same with the UDP checksums computed in software rather than left to the
        // device, so what TX checksum offload gives shows.
        contenders.insert(
            6,
            contender(
                XDP_SOFTWARE_CHECKSUMS_ROW,
                Ok(Impl::Tunneld(
                    tunneld.clone(),
                    "backend = \"xdp\"\nworkers = 1\nxdp_checksum_offload = false",
                    "",
                )),
            ),
        );
        contenders.insert(
            7,
            contender(
                "tunneld (mmsg, all offloads, busy_poll_us = 0)",
                Ok(Impl::Tunneld(
                    tunneld.clone(),
                    "backend = \"mmsg\"\nworkers = 1\nbusy_poll_us = 0",
                    "",
                )),
            ),
        );
        // The same with ring's, then aws-lc's, ChaCha20-Poly1305 instead of the one `auto`
        // picks (the fastest measured at start-up), so what each gives shows.
        contenders.insert(
            8,
            contender(
                "tunneld (mmsg, all offloads, aead = ring)",
                Ok(Impl::Tunneld(
                    tunneld.clone(),
                    "backend = \"mmsg\"\nworkers = 1\naead = \"ring\"",
                    "",
                )),
            ),
        );
        contenders.insert(
            9,
            contender(
                "tunneld (mmsg, all offloads, aead = aws-lc)",
                Ok(Impl::Tunneld(
                    tunneld.clone(),
                    "backend = \"mmsg\"\nworkers = 1\naead = \"aws-lc\"",
                    "",
                )),
            ),
        );
        contenders.insert(
            10,
            contender(
                PARALLEL_ROWS[1],
                Ok(Impl::Tunneld(
                    tunneld.clone(),
                    "backend = \"mmsg\"\nworkers = 2",
                    "",
                )),
            ),
        );
        contenders.push(contender(
            "wireguard-go v0.0.20250522 (Go module build, offloads)",
            build_wireguard_go(&tools).map(Impl::WireguardGo),
        ));
        contenders.push(contender(
            "boringtun-cli 0.7.1",
            install_crate(
                &tools,
                "boringtun-cli",
                BORINGTUN_CLI_VERSION,
                "boringtun-cli",
            )
            .map(Impl::Boringtun),
        ));
        contenders.push(contender(
            "gotatun-cli 0.10.2",
            install_crate(&tools, "gotatun-cli", GOTATUN_CLI_VERSION, "gotatun")
                .map(Impl::Boringtun),
        ));
        contenders.push(contender(
            "kernel WireGuard",
            if kernel_has_wireguard() {
                Ok(Impl::Kernel)
            } else {
                Err("not available on this kernel".into())
            },
        ));
    }
    if let Some(bin) = &baseline {
        // Each tunneld row, preceded by the same row for the baseline build, so the two
        // alternate within each round.
        let mut with_baseline = Vec::new();
        for c in contenders {
            if let Ok(Impl::Tunneld(_, dataplane, peer)) = &c.which {
                with_baseline.push(contender(
                    &format!("{} (baseline)", c.name),
                    Ok(Impl::Tunneld(bin.clone(), dataplane, peer)),
                ));
            }
            with_baseline.push(c);
        }
        contenders = with_baseline;
    }
    contenders.retain(|c| options.keeps(&c.name));
    if contenders.is_empty() {
        return Err("--only matched no row".into());
    }
    for c in contenders.iter().filter(|c| c.which.is_err()) {
        eprintln!(
            "{}: skipped ({})",
            c.name,
            c.which.as_ref().err().unwrap_or(&String::new())
        );
    }

    let total = options.rounds * contenders.iter().filter(|c| c.which.is_ok()).count();
    let mut done = 0;
    for round in 1..=options.rounds {
        for c in contenders.iter_mut() {
            let Ok(which) = &c.which else { continue };
            // Ctrl-C: stop here; the testbed of the round under way has been dropped.
            system::check_interrupted()?;
            done += 1;
            eprintln!("[{done}/{total}] round {round}: {}", c.name);
            match measure(which, &tunneld, &options) {
                Ok(sample) => c.samples.push(Sample { round, ..sample }),
                Err(e) => eprintln!("  failed: {e}"),
            }
        }
    }

    let report_dir = root.join("target/bench-report");
    let shown = shown_args(&args, baseline.is_some());
    let markdown = markdown(
        &contenders,
        &options,
        &report::measured_line("bench", &shown),
    );
    report::write(&report_dir, "report.md", &markdown)?;
    fs::write(report_dir.join("results.csv"), csv(&contenders)).map_err(|e| e.to_string())?;
    chart(&contenders, &report_dir.join("chart.svg"))?;
    println!("Written: target/bench-report/report.md, results.csv, chart.svg");
    if options.update_docs {
        report::update_front_page(&root, "wireguard", &markdown)?;
    }
    if contenders
        .iter()
        .any(|c| c.which.is_ok() && c.samples.is_empty())
    {
        return Err("some implementations produced no measurement (see above)".into());
    }
    Ok(())
}

fn contender(name: &str, which: Result<Impl, String>) -> Contender {
    Contender {
        name: name.into(),
        which,
        samples: Vec::new(),
    }
}

fn measure(which: &Impl, tunneld: &Path, o: &Options) -> Result<Sample, String> {
    let mut bed = Testbed::new(which, tunneld)?;
    bed.set_tcp_congestion_control(&o.tcp_cc)?;
    let (bps1, cpu1, machine1) = bed.iperf_tcp(1, o.seconds)?;
    system::check_interrupted()?;
    let (bps4, cpu4, _) = bed.iperf_tcp(4, o.seconds)?;
    system::check_interrupted()?;
    let probes = if o.quick { 200 } else { 1000 };
    let (p50, p99) = bed
        .udp_rtt_us(probes)
        .ok_or("the UDP echo got no answers")?;
    let (pps, small_cpu) = bed.small_packet_rate(o.seconds.max(1))?;
    Ok(Sample {
        round: 0,
        tcp1_gbits: bps1 / 1e9,
        tcp1_tunnel_cpu: cpu1,
        tcp1_machine_cpu: machine1,
        tcp4_gbits: bps4 / 1e9,
        tcp4_tunnel_cpu: cpu4,
        rtt_p50_us: p50,
        rtt_p99_us: p99,
        small_pps: pps,
        small_tunnel_cpu: small_cpu,
        peak_rss_kib: bed.peak_rss_kib().map(|v| v as f64).unwrap_or(f64::NAN),
    })
}

/// Medians of one contender: (tcp1, per tunnel CPU-s, machine CPU-s, tcp4, p50, p99, pps, rss MiB).
struct Medians {
    tcp1: f64,
    per_cpu: f64,
    machine_cpu: f64,
    tcp4: f64,
    per_cpu4: f64,
    p50: f64,
    p99: f64,
    pps: f64,
    pps_per_cpu: f64,
    rss_mib: f64,
}

fn medians(c: &Contender, seconds: f64) -> Medians {
    let m = |f: fn(&Sample) -> f64| median(c.samples.iter().map(f).collect());
    // Gbit per tunnel CPU-second is taken per round, then the median of those (`median`
    // leaves out the rounds without tunnel CPU).
    Medians {
        tcp1: m(|s| s.tcp1_gbits),
        per_cpu: m(per_cpu1) * seconds,
        machine_cpu: m(|s| s.tcp1_machine_cpu),
        tcp4: m(|s| s.tcp4_gbits),
        per_cpu4: m(per_cpu4) * seconds,
        p50: m(|s| s.rtt_p50_us),
        p99: m(|s| s.rtt_p99_us),
        pps: m(|s| s.small_pps),
        pps_per_cpu: m(small_per_cpu) * seconds.max(1.0),
        rss_mib: m(|s| s.peak_rss_kib) / 1024.0,
    }
}

fn markdown(contenders: &[Contender], o: &Options, measured: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{measured}\n\n{} round(s), {} s per iperf3 run, medians. Both gateways share this \
         machine's cores: Gbit per tunnel CPU-second is the comparable figure. {}.\n",
        o.rounds,
        o.seconds,
        congestion_control_note(&o.tcp_cc)
    );
    let mut table = Table::new(&[
        "path",
        "TCP 1 stream",
        "Gbit per tunnel CPU-s",
        "machine CPU-s (1 stream)",
        "TCP 4 streams",
        "Gbit per tunnel CPU-s (4 streams)",
        "UDP RTT p50",
        "p99",
        "64 B UDP rate",
        "64 B packets per tunnel CPU-s",
        "peak RSS (both)",
    ]);
    for c in contenders {
        if let Err(why) = &c.which {
            table.note(&c.name, why);
            continue;
        }
        if c.samples.is_empty() {
            table.note(&c.name, "failed (see log)");
            continue;
        }
        let m = medians(c, o.seconds as f64);
        table.row(&[
            c.name.clone(),
            cell(m.tcp1, 2, " Gbit/s"),
            cell(m.per_cpu, 2, ""),
            cell(m.machine_cpu, 2, ""),
            cell(m.tcp4, 2, " Gbit/s"),
            cell(m.per_cpu4, 2, ""),
            cell(m.p50, 0, " µs"),
            cell(m.p99, 0, " µs"),
            cell(m.pps / 1000.0, 0, " kpps"),
            cell(m.pps_per_cpu / 1000.0, 0, " k"),
            cell(m.rss_mib, 1, " MiB"),
        ]);
    }
    out.push_str(table.render());
    let pairs = comparisons(contenders);
    if !pairs.is_empty() {
        let _ = writeln!(
            out,
            "\nRound by round: each figure below is taken within one round, where the two rows \
             ran minutes apart at most, then the median over the rounds, with their range. \
             The machine's slower and faster spells, which move the medians above, mostly \
             cancel in these.\n"
        );
        let mut table = Table::new(&[
            "rows",
            "TCP 1 stream",
            "Gbit per tunnel CPU-s",
            "TCP 4 streams",
            "Gbit per tunnel CPU-s (4 streams)",
            "UDP RTT p50",
            "64 B packets per tunnel CPU-s",
        ]);
        for (a, b) in pairs {
            let (a, b) = (&contenders[a], &contenders[b]);
            table.row(&[
                format!("{} against {}", a.name, b.name),
                spread(&per_round(a, b, |s| s.tcp1_gbits, ratio), "×", 2),
                spread(&per_round(a, b, per_cpu1, ratio), "×", 2),
                spread(&per_round(a, b, |s| s.tcp4_gbits, ratio), "×", 2),
                spread(&per_round(a, b, per_cpu4, ratio), "×", 2),
                spread(&per_round(a, b, |s| s.rtt_p50_us, difference), " µs", 0),
                spread(&per_round(a, b, small_per_cpu, ratio), "×", 2),
            ]);
        }
        out.push_str(table.render());
    }
    out
}

/// The pairs of rows (indices) compared round by round: tunneld's default row against each
/// other row, the link split over two sub-tunnels against the same link on one, and AF_XDP
/// with the device's UDP checksums against AF_XDP with software ones.
fn comparisons(contenders: &[Contender]) -> Vec<(usize, usize)> {
    let measured = |name: &str| {
        contenders
            .iter()
            .position(|c| c.name == name && !c.samples.is_empty())
    };
    let mut pairs = Vec::new();
    if let Some(default) = measured(DEFAULT_ROW) {
        for (i, c) in contenders.iter().enumerate() {
            if i != default && !c.samples.is_empty() {
                pairs.push((default, i));
            }
        }
    }
    if let (Some(split), Some(single)) = (measured(PARALLEL_ROWS[0]), measured(PARALLEL_ROWS[1])) {
        pairs.push((split, single));
    }
    if let (Some(device), Some(software)) =
        (measured(XDP_ROW), measured(XDP_SOFTWARE_CHECKSUMS_ROW))
    {
        pairs.push((device, software));
    }
    pairs
}

/// Gbit/s per tunnel CPU-second of a run: times the run's seconds, Gbit per tunnel
/// CPU-second (the seconds cancel in a ratio). Not a number for a row without tunnel
/// processes (the direct path).
fn per_cpu1(s: &Sample) -> f64 {
    per_cpu(s.tcp1_gbits, s.tcp1_tunnel_cpu)
}

fn per_cpu4(s: &Sample) -> f64 {
    per_cpu(s.tcp4_gbits, s.tcp4_tunnel_cpu)
}

/// 64-byte datagrams per second per tunnel CPU-second (times the run's seconds, which
/// cancel in a ratio).
fn small_per_cpu(s: &Sample) -> f64 {
    per_cpu(s.small_pps, s.small_tunnel_cpu)
}

fn per_cpu(gbits: f64, cpu: f64) -> f64 {
    if cpu > 0.0 {
        gbits / cpu
    } else {
        f64::NAN
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    a / b
}

fn difference(a: f64, b: f64) -> f64 {
    a - b
}

/// `combine(f(a's sample), f(b's sample))` for each round both rows measured, leaving out
/// what is not a number (a row without tunnel CPU, such as the direct path).
fn per_round(
    a: &Contender,
    b: &Contender,
    f: fn(&Sample) -> f64,
    combine: fn(f64, f64) -> f64,
) -> Vec<f64> {
    a.samples
        .iter()
        .filter_map(|sa| {
            let sb = b.samples.iter().find(|s| s.round == sa.round)?;
            let v = combine(f(sa), f(sb));
            v.is_finite().then_some(v)
        })
        .collect()
}

fn csv(contenders: &[Contender]) -> String {
    let mut out = String::from(
        "implementation,round,tcp1_gbits,tcp1_tunnel_cpu_s,tcp1_machine_cpu_s,tcp4_gbits,tcp4_tunnel_cpu_s,rtt_p50_us,rtt_p99_us,small_pps,small_tunnel_cpu_s,peak_rss_kib\n",
    );
    for c in contenders {
        for s in &c.samples {
            let _ = writeln!(
                out,
                "\"{}\",{},{:.4},{:.3},{:.3},{:.4},{:.3},{:.1},{:.1},{:.0},{:.3},{}",
                c.name,
                s.round,
                s.tcp1_gbits,
                s.tcp1_tunnel_cpu,
                s.tcp1_machine_cpu,
                s.tcp4_gbits,
                s.tcp4_tunnel_cpu,
                s.rtt_p50_us,
                s.rtt_p99_us,
                s.small_pps,
                s.small_tunnel_cpu,
                s.peak_rss_kib
            );
        }
    }
    out
}

/// Bars of Gbit per tunnel CPU-second (the headline) per implementation.
fn chart(contenders: &[Contender], path: &Path) -> Result<(), String> {
    use plotters::prelude::*;
    let bars: Vec<(String, f64)> = contenders
        .iter()
        .filter(|c| !c.samples.is_empty())
        .map(|c| (c.name.clone(), medians(c, 1.0)))
        .filter(|(_, m)| m.per_cpu.is_finite())
        .map(|(name, m)| (name, m.per_cpu))
        .collect();
    let top = bars.iter().map(|(_, v)| *v).fold(0.0f64, f64::max).max(0.1) * 1.2;
    let root =
        SVGBackend::new(path, (900, 120 + 60 * bars.len().max(1) as u32)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| format!("chart: {e}");
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Throughput per tunnel CPU-second (TCP, 1 stream; higher is better)",
            ("sans-serif", 18),
        )
        .margin(20)
        .x_label_area_size(40)
        .y_label_area_size(330)
        .build_cartesian_2d(0.0..top, 0..bars.len().max(1))
        .map_err(|e| err(&e))?;
    let names: Vec<String> = bars.iter().map(|(n, _)| n.clone()).collect();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("Gbit per tunnel CPU-second")
        .y_labels(bars.len().max(1))
        .y_label_formatter(&|i| names.get(*i).cloned().unwrap_or_default())
        .draw()
        .map_err(|e| err(&e))?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
            let color = if i % 2 == 0 { BLUE } else { GREEN };
            Rectangle::new([(0.0, i), (*v, i + 1)], color.mix(0.6).filled())
        }))
        .map_err(|e| err(&e))?;
    chart
        .draw_series(
            bars.iter()
                .enumerate()
                .map(|(i, (_, v))| Text::new(format!("{v:.2}"), (*v, i), ("sans-serif", 14))),
        )
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// Builds the offload-capable wireguard-go from the Go module proxy with the machine's Go.
pub(crate) fn build_wireguard_go(tools: &Path) -> Result<PathBuf, String> {
    let bin = tools.join("bin/wireguard");
    if bin.is_file() {
        return Ok(bin);
    }
    let go = system::which("go").ok_or("no Go toolchain on this machine")?;
    eprintln!("==> building {WIREGUARD_GO_MODULE} with {}", go.display());
    system::run(
        Command::new(go)
            .args(["install", WIREGUARD_GO_MODULE])
            .env("GOBIN", tools.join("bin"))
            .env("GOFLAGS", "-mod=mod"),
    )?;
    bin.is_file()
        .then_some(bin)
        .ok_or_else(|| "go install produced no binary".into())
}

/// Installs a WireGuard implementation's command-line crate (boringtun-cli, gotatun-cli) from
/// crates.io into target/bench-tools, once; returns its binary, `bin_name`.
fn install_crate(
    tools: &Path,
    name: &str,
    version: &str,
    bin_name: &str,
) -> Result<PathBuf, String> {
    let bin = tools.join("bin").join(bin_name);
    if bin.is_file() {
        return Ok(bin);
    }
    eprintln!("==> building {name} {version} (cargo install, a few minutes)");
    system::run(Command::new(system::cargo()).args([
        "install",
        "--quiet",
        "--locked",
        name,
        "--version",
        version,
        "--root",
        &tools.to_string_lossy(),
    ]))?;
    Ok(bin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_docs_are_updated_only_when_asked_and_never_by_a_quick_run() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(
            parse_options(&args(&["--update-docs"]))
                .unwrap()
                .update_docs
        );
        assert!(
            !parse_options(&args(&["--rounds", "3"]))
                .unwrap()
                .update_docs
        );
        assert!(!parse_options(&args(&["--quick"])).unwrap().update_docs);
        let err = parse_options(&args(&["--quick", "--update-docs"]))
            .err()
            .unwrap();
        assert!(err.contains("--update-docs takes a full run"), "{err}");
    }

    #[test]
    fn medians_of_odd_even_and_missing() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(vec![f64::NAN]).is_nan());
    }

    fn row(name: &str, rounds: &[(usize, f64, f64)]) -> Contender {
        Contender {
            name: name.into(),
            which: Ok(Impl::Direct),
            samples: rounds
                .iter()
                .map(|&(round, gbits, cpu)| Sample {
                    round,
                    tcp1_gbits: gbits,
                    tcp1_tunnel_cpu: cpu,
                    rtt_p50_us: gbits * 10.0,
                    ..Sample::default()
                })
                .collect(),
        }
    }

    #[test]
    fn rounds_are_paired_by_number_and_gaps_left_out() {
        // Round 2 of `b` failed; round 3 of `a` did.
        let a = row(DEFAULT_ROW, &[(1, 4.0, 2.0), (2, 3.0, 2.0), (4, 6.0, 2.0)]);
        let b = row("peer", &[(1, 2.0, 2.0), (3, 1.0, 1.0), (4, 2.0, 1.0)]);
        assert_eq!(per_round(&a, &b, |s| s.tcp1_gbits, ratio), [2.0, 3.0]);
        assert_eq!(per_round(&a, &b, per_cpu1, ratio), [2.0, 1.5]);
        assert_eq!(
            per_round(&a, &b, |s| s.rtt_p50_us, difference),
            [20.0, 40.0]
        );
        // No tunnel CPU (the direct path): no ratio, not an infinite one.
        let direct = row("direct", &[(1, 20.0, 0.0)]);
        assert!(per_round(&a, &direct, per_cpu1, ratio).is_empty());
        assert_eq!(spread(&[2.0, 1.5, 2.5], "×", 2), "2.00× (1.50–2.50)");
        assert_eq!(spread(&[44.0, -3.0], " µs", 0), "+20 µs (-3–+44)");
        assert_eq!(spread(&[], "×", 2), "–");
    }

    #[test]
    fn the_default_row_meets_every_other_and_k2_meets_k1() {
        let rows = [
            row("direct", &[(1, 20.0, 0.0)]),
            row(PARALLEL_ROWS[1], &[(1, 3.0, 1.0)]),
            row(DEFAULT_ROW, &[(1, 4.0, 2.0)]),
            row("not measured", &[]),
            row(PARALLEL_ROWS[0], &[(1, 3.0, 1.0)]),
        ];
        assert_eq!(comparisons(&rows), [(2, 0), (2, 1), (2, 4), (4, 1)]);
        assert!(comparisons(&rows[3..]).is_empty());
        // AF_XDP's two checksum rows meet each other, with or without the default row.
        let xdp = [
            row(XDP_SOFTWARE_CHECKSUMS_ROW, &[(1, 2.0, 1.0)]),
            row(XDP_ROW, &[(1, 2.2, 1.0)]),
        ];
        assert_eq!(comparisons(&xdp), [(1, 0)]);
    }

    #[test]
    fn only_splits_at_commas_that_are_not_part_of_a_row_name() {
        assert_eq!(
            split_names("tunneld,wireguard-go"),
            ["tunneld", "wireguard-go"]
        );
        let names = split_names("mmsg, all offloads),Go module, boringtun");
        assert_eq!(names, ["mmsg, all offloads)", "go module, boringtun"]);
        let o = parse_options(&["--only".into(), "mmsg, all offloads),Go module".into()]).unwrap();
        assert!(o.keeps("tunneld (mmsg, all offloads)"));
        assert!(!o.keeps("tunneld (mmsg, no offloads)"));
        assert!(!o.keeps("tunneld (mmsg, all offloads, busy_poll_us = 0)"));
        assert!(o.keeps("wireguard-go v0.0.20250522 (Go module build, offloads)"));
    }

    #[test]
    fn congestion_control_defaults_to_cubic_and_takes_only_module_names() {
        assert_eq!(parse_options(&[]).unwrap().tcp_cc, "cubic");
        let o = parse_options(&["--tcp-cc".into(), "bbr".into(), "--quick".into()]).unwrap();
        assert_eq!(o.tcp_cc, "bbr");
        for bad in [
            &["--tcp-cc"][..],
            &["--tcp-cc", ""],
            &["--tcp-cc", "bbr=1"],
            &["--tcp-cc", "../x"],
        ] {
            let args: Vec<String> = bad.iter().map(|s| s.to_string()).collect();
            let err = parse_options(&args).err().unwrap();
            assert!(err.starts_with("--tcp-cc takes"), "{err}");
        }
    }

    #[test]
    fn iperf3_must_report_the_congestion_control_asked_for() {
        use crate::testbed::check_congestion_control;
        let json = r#"{"end": {"sum_received": {"bits_per_second": 1e9},
            "sender_tcp_congestion":	"cubic",
            "receiver_tcp_congestion":	"cubic"}}"#;
        assert!(check_congestion_control(json, Some("cubic")).is_ok());
        assert!(check_congestion_control(json, None).is_ok());
        let err = check_congestion_control(json, Some("bbr")).unwrap_err();
        assert!(err.contains("sender_tcp_congestion = cubic"), "{err}");
        let mixed = json.replace(
            r#""receiver_tcp_congestion":	"cubic""#,
            r#""receiver_tcp_congestion": "bbr""#,
        );
        let err = check_congestion_control(&mixed, Some("cubic")).unwrap_err();
        assert!(err.contains("receiver_tcp_congestion = bbr"), "{err}");
        let err = check_congestion_control("{}", Some("cubic")).unwrap_err();
        assert!(err.contains("nothing"), "{err}");
    }

    #[test]
    fn baseline_is_taken_out_and_made_absolute() {
        // Any file that exists will do: this test's own binary.
        let exe = std::env::current_exe().unwrap();
        let args: Vec<String> = vec![
            "--quick".into(),
            "--tunneld-baseline".into(),
            exe.to_string_lossy().into(),
            "--only".into(),
            "TLS".into(),
        ];
        let (baseline, rest) = take_baseline(&args).unwrap();
        assert_eq!(baseline, Some(fs::canonicalize(&exe).unwrap()));
        assert_eq!(rest, ["--quick", "--only", "TLS"]);
        assert!(take_baseline(&["--tunneld-baseline".into()]).is_err());
        let missing = ["--tunneld-baseline".into(), "no/such/tunneld".into()];
        assert!(take_baseline(&missing)
            .unwrap_err()
            .contains("no/such/tunneld"));
    }
}
