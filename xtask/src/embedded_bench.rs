//! `cargo xtask bench-embedded`: the embedded-stack section of the benchmark (issue 27). A
//! program that carries its own TCP/IP stack and WireGuard (no TUN, no root) is set against
//! the same traffic through tunneld's TUN path and the kernel's TCP, and beside the peers
//! that do the same: wireguard-go's netstack (gVisor) and onetun (smoltcp, a port forwarder).
//! Writes target/bench-report/embedded-report.md and embedded-results.csv.
//!
//! # The testbed
//!
//! Per row and round, fresh: namespaces A and B joined by a veth (192.0.2.1 and 192.0.2.2),
//! tunneld (`up`, one worker) in B at 10.77.0.2 with site A's peer (10.77.0.1/32), and in B,
//! on threads of this process, a TCP sink on 10.77.0.2:[`SINK_PORT`] (counts what it
//! receives) and a TCP echo server on 10.77.0.2:[`ECHO_PORT`]. Site A is one of:
//!
//! - **kernel path** (the reference): tunneld in A too (TUN, the testbed of `cargo xtask
//!   bench`), and the contract implemented with std TCP sockets on a thread in A
//!   ([`reference_client`]);
//! - **an in-process stack** (wireguard-go's netstack, tunneld-userspace): a client program
//!   run in A with `ip netns exec`, following the contract below;
//! - **onetun** in A forwarding 127.0.0.1:15301 and :15302 to the sink and the echo server
//!   through the tunnel, driven by the std TCP client of the kernel path.
//!
//! # The client contract
//!
//! Every in-process row is one program, run in namespace A (its UDP socket lives there):
//!
//! ```text
//! CLIENT --address 10.77.0.1 --peer-addr 10.77.0.2 --sink-port 5301 --echo-port 5302 \
//!        --private-key-file FILE --peer-public-key BASE64 --endpoint 192.0.2.2:51820 \
//!        --mtu 1420  (bulk SECONDS | rr CONNS ROUNDS)
//! ```
//!
//! - `--address`: its own address inside the tunnel; `--peer-addr`: the far side's, where
//!   the sink (`--sink-port`) and the echo server (`--echo-port`) listen; the far side's
//!   WireGuard peer allows exactly `--address`.
//! - `--private-key-file`: a file holding its private key in base64 (as `wg genkey` writes
//!   it, with a newline); `--peer-public-key`: the far side's public key, base64;
//!   `--endpoint`: the far side's WireGuard UDP address. No preshared key, no keepalive: the
//!   client starts the handshake with its first packet.
//! - `bulk SECONDS`: one TCP connection to the sink, written to as fast as the client can
//!   for SECONDS (a decimal number); then the client shuts its sending side and reads until
//!   the sink closes the connection (at most 10 s), which the sink does once it has read to
//!   the end, so every byte has been delivered before the client (and its stack) exits. Prints
//!   `{"mode":"bulk","bytes":N,"seconds":S}` — bytes written, seconds from the first write
//!   to the last.
//! - `rr CONNS ROUNDS`: CONNS connections to the echo server; one round trip on each first
//!   (uncounted: handshakes, warm-up); then each keeps exactly one 64-byte request in flight
//!   (the next is sent when the whole echo is back, and the echo is checked) until ROUNDS
//!   round trips have completed over all of them (ROUNDS ≥ CONNS). Prints
//!   `{"mode":"rr","conns":C,"requests":N,"seconds":S,"requests_per_second":R,"p50_us":P,"p99_us":Q}`
//!   — N = ROUNDS, S from the first counted request to the last echo, R = N / S, and the
//!   round trips' percentiles in µs (nearest rank: the sorted value at round((N−1)·q)).
//! - Output: that one JSON object on one line of stdout (nothing else on stdout; keys in any
//!   order, more keys allowed) and exit status 0; on failure, one line on stderr and a
//!   non-zero status. It must be done within SECONDS + 30 s (bulk) or 90 s (rr, of which at
//!   most 60 s for the round trips); past that it is killed and the round fails.
//! - Threads, runtimes and buffers are the client's choice; all of its process's CPU and
//!   memory count as side A's tunnel.
//!
//! The harness takes the throughput from the sink (bytes received, from the first byte to
//! the end of the stream), so every row is counted the same way; the client's `bytes` must
//! be at least that. The requests per second and percentiles are the client's.
//!
//! # tunneld-userspace's row
//!
//! Pending until `crates/userspace` lands: the row is measured when
//! `crates/userspace/examples/embedded_client.rs` exists, built with
//! `cargo build --release -p tunneld-userspace --example embedded_client` into
//! `target/release/examples/embedded_client`, which must follow the contract above exactly;
//! otherwise the row says "not built in this tree" and is skipped. `--local` (what
//! `cargo xtask test` runs) keeps only the rows built from this repository: the kernel path
//! and tunneld-userspace.
//!
//! # What is counted
//!
//! CPU: the tunnel on each side over the client's run. Side B is tunneld. Side A is tunneld
//! for the kernel path; the client process itself for an in-process stack (its whole life,
//! from `wait4`'s rusage: stack, WireGuard and the traffic it makes); onetun's process for
//! onetun. The kernel's TCP work charged to the std client's thread is not counted (it is
//! the application's side of the socket there). Gbit per CPU-second is the Gbit the sink
//! received over those CPU seconds. Peak memory: VmHWM of side A's tunnel process (the
//! client's `ru_maxrss`, the larger of its two runs, for an in-process stack).

use crate::bench::{parse_options, Options};
use crate::closed_loop::{self, read_echo, request, MESSAGE_BYTES};
use crate::report::{self, cell, median, percentile, spread, Table};
use crate::system;
use crate::testbed::{cpu_seconds, peak_rss_kib, Guard, Impl, Testbed};
use crate::tls_bench::{listening, readable, EchoServer};
use std::fmt::Write as _;
use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tunneld_testnet::relay::RelayConfig;
use tunneld_testnet::{require_netns, NetNs};

/// Site B's address inside the tunnel, where the sink and the echo server listen.
pub(crate) const B_TUNNEL: &str = "10.77.0.2";
pub const SINK_PORT: u16 = 5301;
pub const ECHO_PORT: u16 = 5302;
/// Where onetun, in A, accepts what it forwards to the sink and to the echo server.
const ONETUN_SINK: &str = "127.0.0.1:15301";
const ONETUN_ECHO: &str = "127.0.0.1:15302";
/// The tunnel MTU every row runs with (the testbed's).
pub(crate) const MTU: u32 = 1420;
/// `rr`: this many connections, this many round trips in all (fewer with `--quick`).
const RR_CONNS: usize = 64;
const RR_ROUNDS: usize = 50_000;
const RR_ROUNDS_QUICK: usize = 5_000;
/// Longest a connect or one socket operation may block.
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest the counted round trips of one `rr` run may take.
pub(crate) const RR_LIMIT: Duration = Duration::from_secs(60);
/// How much longer than its work a client program may run before it is killed.
const CLIENT_GRACE: Duration = Duration::from_secs(30);
/// How far the std client's bulk writes may run ahead of what the sink has received. TCP's
/// flow control keeps the kernel path far below it (socket buffers and tunneld's bounded
/// queues: a few MiB); onetun reads its local connection without limit, and without this
/// held the whole stream in memory (5.3 GiB after 5 s in a trial).
pub(crate) const BULK_WINDOW: u64 = 64 << 20;
/// Longest the sink waits for its stream to end after the client has finished.
const SINK_WAIT: Duration = Duration::from_secs(15);

/// onetun from crates.io, pinned (the figures name it).
pub(crate) const ONETUN_VERSION: &str = "0.3.10";
/// The Go module of the wireguard-go netstack client, in the repository.
const NETSTACK_SOURCE: &str = "xtask/go/netstack-client";
/// tunneld-userspace's client, once that crate has it.
const USERSPACE_EXAMPLE: &str = "crates/userspace/examples/embedded_client.rs";

/// Which row: what the report's comparisons and targets refer to.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Kernel,
    Userspace,
    Netstack,
    Onetun,
}

/// How site A carries the traffic.
#[derive(Debug)]
enum Carrier {
    /// std TCP on a thread in A, through tunneld in A and B (TUN): the reference.
    KernelPath,
    /// A program following the client contract, with its own stack and WireGuard.
    InProcess(PathBuf),
    /// onetun in A, with the std TCP client aimed at its local ports.
    Onetun(PathBuf),
}

struct Contender {
    kind: Kind,
    name: String,
    which: Result<Carrier, String>,
    samples: Vec<Sample>,
    /// Each failed round and the first line of its error.
    failures: Vec<(usize, String)>,
}

#[derive(Clone, Debug, Default)]
struct Sample {
    /// The round (from 1); a failed round leaves a gap.
    round: usize,
    /// What the sink received, from its first byte to the end of the stream.
    bulk_bytes: f64,
    bulk_seconds: f64,
    /// CPU seconds of side A's and side B's tunnels over the bulk run.
    bulk_cpu: f64,
    rr_rps: f64,
    rr_p50_us: f64,
    rr_p99_us: f64,
    /// CPU seconds of both tunnels over the rr run.
    rr_cpu: f64,
    /// Peak resident memory of side A's tunnel process.
    peak_rss_kib: f64,
}

impl Sample {
    fn gbits(&self) -> f64 {
        self.bulk_bytes * 8.0 / 1e9 / self.bulk_seconds
    }

    /// Gbit received per CPU-second of the two tunnels.
    fn gbit_per_cpu(&self) -> f64 {
        if self.bulk_cpu > 0.0 {
            self.bulk_bytes * 8.0 / 1e9 / self.bulk_cpu
        } else {
            f64::NAN
        }
    }
}

/// What a client run does: the last arguments of the contract's command line.
#[derive(Clone, Copy, Debug)]
enum Mode {
    Bulk { seconds: u32 },
    Rr { conns: usize, rounds: usize },
}

impl Mode {
    fn args(self) -> Vec<String> {
        match self {
            Mode::Bulk { seconds } => vec!["bulk".into(), seconds.to_string()],
            Mode::Rr { conns, rounds } => vec!["rr".into(), conns.to_string(), rounds.to_string()],
        }
    }

    /// Longest a client program may take for this run.
    fn limit(self) -> Duration {
        match self {
            Mode::Bulk { seconds } => Duration::from_secs(seconds.into()) + CLIENT_GRACE,
            Mode::Rr { .. } => RR_LIMIT + CLIENT_GRACE,
        }
    }
}

/// A client's result line, as the contract has it.
#[derive(Clone, Debug, PartialEq)]
enum Report {
    Bulk {
        bytes: f64,
        seconds: f64,
    },
    Rr {
        requests: f64,
        seconds: f64,
        requests_per_second: f64,
        p50_us: f64,
        p99_us: f64,
    },
}

pub fn run(args: &[String]) -> Result<(), String> {
    let local = args.iter().any(|a| a == "--local");
    let lossy = args.iter().any(|a| a == "--lossy");
    // `--cells 0.1/80,3/20`: only these cells of the lossy grid (loss in %, RTT in ms).
    let mut cells: Option<Vec<(f64, u64)>> = None;
    // `--seed N`: the lossy grid's drop decisions of an earlier run (its report prints N).
    let mut seed: Option<u64> = None;
    let mut rest: Vec<String> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--local" | "--lossy" => {}
            "--cells" => {
                let list = it.next().ok_or("--cells needs LOSS%/RTTms[,...]")?;
                let mut v = Vec::new();
                for cell in list.split(',') {
                    let (l, r) = cell
                        .split_once('/')
                        .ok_or_else(|| format!("--cells: {cell}: not LOSS/RTT"))?;
                    let l: f64 = l.parse().map_err(|_| format!("--cells: {cell}: loss"))?;
                    let r: u64 = r.parse().map_err(|_| format!("--cells: {cell}: RTT"))?;
                    // The grid's own cell, so that the run compares it exactly.
                    let known = LOSSY_CELLS
                        .iter()
                        .find(|&&(cl, cr)| (cl * 100.0 - l).abs() < 1e-9 && cr == r)
                        .ok_or_else(|| format!("--cells: {cell} is not a cell of the grid"))?;
                    v.push(*known);
                }
                cells = Some(v);
            }
            "--seed" => {
                let text = it.next().ok_or("--seed needs a number")?;
                seed = Some(
                    text.parse()
                        .map_err(|_| format!("--seed: {text}: not a number"))?,
                );
            }
            _ => rest.push(a.clone()),
        }
    }
    let options = parse_options(&rest)?;
    system::install_tools()?;
    if !require_netns("cargo xtask bench-embedded") {
        return Err("the benchmark needs root (network namespaces)".into());
    }
    let root = system::repo_root()?;
    let tunneld = system::build_tunneld()?;
    let rr_rounds = if options.quick {
        RR_ROUNDS_QUICK
    } else {
        RR_ROUNDS
    };

    // Each row's program is built only when the row is in this run (`--only`), and a row
    // that needs a download only without `--local`.
    type Build<'a> = Box<dyn Fn() -> Result<Carrier, String> + 'a>;
    let rows: [(Kind, String, bool, Build); 4] = [
        (
            Kind::Kernel,
            "kernel TCP through tunneld's TUN path (reference)".into(),
            false,
            Box::new(|| Ok(Carrier::KernelPath)),
        ),
        (
            Kind::Userspace,
            "tunneld-userspace (embedded_client example)".into(),
            false,
            Box::new(|| build_userspace_client(&root).map(Carrier::InProcess)),
        ),
        (
            Kind::Netstack,
            "wireguard-go v0.0.20250522 netstack (gVisor)".into(),
            true,
            Box::new(|| build_netstack_client(&root).map(Carrier::InProcess)),
        ),
        (
            Kind::Onetun,
            format!("onetun {ONETUN_VERSION} (smoltcp port forwarder)"),
            true,
            Box::new(|| install_onetun(&root).map(Carrier::Onetun)),
        ),
    ];
    let mut contenders: Vec<Contender> = rows
        .into_iter()
        .filter(|(_, name, _, _)| options.keeps(name))
        .map(|(kind, name, downloads, build)| {
            let which = if downloads && local {
                Err("left out (--local: only rows built from this repository)".to_string())
            } else {
                build()
            };
            contender(kind, &name, which)
        })
        .collect();
    if contenders.is_empty() {
        return Err("--only matched no row".into());
    }
    for c in contenders.iter().filter(|c| c.which.is_err()) {
        let why = c.which.as_ref().err().map(String::as_str).unwrap_or("");
        eprintln!("{}: skipped ({why})", c.name);
    }

    if lossy {
        return lossy_grid(
            &contenders,
            &tunneld,
            &options,
            &root,
            args,
            cells.as_deref(),
            seed,
        );
    }

    let total = options.rounds * contenders.iter().filter(|c| c.which.is_ok()).count();
    let mut done = 0;
    for round in 1..=options.rounds {
        for c in contenders.iter_mut() {
            let Ok(carrier) = &c.which else { continue };
            // Ctrl-C: stop here; what the round under way made has been removed.
            system::check_interrupted()?;
            done += 1;
            eprintln!("[{done}/{total}] round {round}: {}", c.name);
            match measure(carrier, &tunneld, &options, rr_rounds) {
                Ok(sample) => c.samples.push(Sample { round, ..sample }),
                Err(e) => {
                    eprintln!("  failed: {e}");
                    let first = e.lines().next().unwrap_or("").trim().to_string();
                    c.failures.push((round, first));
                }
            }
        }
    }
    system::check_interrupted()?;

    let report_dir = system::target_dir(&root).join("bench-report");
    let measured = report::measured_line("bench-embedded", args);
    let markdown = markdown(&contenders, &options, rr_rounds, &measured);
    report::write(&report_dir, "embedded-report.md", &markdown)?;
    fs::write(report_dir.join("embedded-results.csv"), csv(&contenders))
        .map_err(|e| e.to_string())?;
    println!("Written: target/bench-report/embedded-report.md, embedded-results.csv");
    if options.update_docs {
        report::update_front_page(&root, "embedded", &markdown)?;
    }
    if contenders
        .iter()
        .any(|c| c.which.is_ok() && c.samples.is_empty())
    {
        return Err("some rows produced no measurement (see the table)".into());
    }
    Ok(())
}

fn contender(kind: Kind, name: &str, which: Result<Carrier, String>) -> Contender {
    Contender {
        kind,
        name: name.to_string(),
        which,
        samples: Vec::new(),
        failures: Vec::new(),
    }
}

// ----------------------------------------------------------------------------------------
// Building the rows' programs

/// tunneld-userspace's contract client, when this tree has it.
fn build_userspace_client(root: &Path) -> Result<PathBuf, String> {
    if !root.join(USERSPACE_EXAMPLE).is_file() {
        return Err(format!("not built in this tree (no {USERSPACE_EXAMPLE})"));
    }
    eprintln!("==> building tunneld-userspace's embedded_client example (release)");
    system::run(
        Command::new(system::cargo())
            .args([
                "build",
                "--release",
                "-q",
                "-p",
                "tunneld-userspace",
                "--example",
                "embedded_client",
            ])
            .current_dir(root),
    )
    .map_err(|e| format!("build failed: {e}"))?;
    let bin = system::target_dir(root).join("release/examples/embedded_client");
    bin.is_file()
        .then_some(bin)
        .ok_or_else(|| "the build left no target/release/examples/embedded_client".into())
}

/// The wireguard-go netstack client, built with the machine's Go (its modules from the
/// module proxy, the versions its go.mod pins) into target/bench-tools/bin.
fn build_netstack_client(root: &Path) -> Result<PathBuf, String> {
    build_go_program(root, NETSTACK_SOURCE)
}

/// The Go program in `source` (a module under xtask/go), built with the machine's Go into
/// target/bench-tools/bin under the module directory's name.
pub(crate) fn build_go_program(root: &Path, source: &str) -> Result<PathBuf, String> {
    let go = system::which("go").ok_or("no Go toolchain on this machine")?;
    let name = Path::new(source)
        .file_name()
        .ok_or_else(|| format!("{source}: not a directory name"))?;
    let bin = system::target_dir(root).join("bench-tools/bin").join(name);
    eprintln!(
        "==> building {source} with {} (cached after the first time)",
        go.display()
    );
    system::run(
        Command::new(go)
            .arg("build")
            .arg("-o")
            .arg(&bin)
            .arg(".")
            .current_dir(root.join(source))
            .env("GOFLAGS", "-mod=mod -buildvcs=false"),
    )?;
    bin.is_file()
        .then_some(bin)
        .ok_or_else(|| "go build produced no binary".into())
}

/// onetun [`ONETUN_VERSION`] from crates.io into target/onetun, once (and again if the
/// version there is another).
pub(crate) fn install_onetun(root: &Path) -> Result<PathBuf, String> {
    let dir = system::target_dir(root).join("onetun");
    let bin = dir.join("bin/onetun");
    let installed = Command::new(&bin)
        .arg("--version")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .unwrap_or_default();
    if installed == format!("onetun {ONETUN_VERSION}") {
        return Ok(bin);
    }
    eprintln!("==> building onetun {ONETUN_VERSION} (cargo install, a few minutes)");
    system::run(Command::new(system::cargo()).args([
        "install",
        "--quiet",
        "--locked",
        "--force",
        "onetun",
        "--version",
        ONETUN_VERSION,
        "--root",
        &dir.to_string_lossy(),
    ]))?;
    bin.is_file()
        .then_some(bin)
        .ok_or_else(|| "cargo install left no onetun binary".into())
}

// ----------------------------------------------------------------------------------------
// One round of one row

fn measure(
    carrier: &Carrier,
    tunneld: &Path,
    o: &Options,
    rr_rounds: usize,
) -> Result<Sample, String> {
    let which = match carrier {
        Carrier::KernelPath => {
            Impl::Tunneld(tunneld.to_path_buf(), "backend = \"mmsg\"\nworkers = 1", "")
        }
        Carrier::InProcess(_) | Carrier::Onetun(_) => Impl::TunneldSiteB(tunneld.to_path_buf()),
    };
    let mut bed = Testbed::new(&which, tunneld)?;
    bed.set_tcp_congestion_control(&o.tcp_cc)?;
    // The testbed's tunneld processes: A's then B's for the kernel path, B's alone otherwise.
    let bed_pids = bed.pids();
    let b_pid = *bed_pids.last().ok_or("the testbed started no tunneld")?;
    wait_for_address(&bed.b, B_TUNNEL).map_err(|e| format!("{e}{}", bed.logs()))?;
    let sink_addr = socket(B_TUNNEL, SINK_PORT)?;
    let echo_addr = socket(B_TUNNEL, ECHO_PORT)?;
    // Dropped in reverse order: onetun (if any), the echo server, the sink, then the testbed.
    let sink = Sink::start(&bed.b, sink_addr)?;
    let _echo = EchoServer::start(&bed.b, echo_addr)?;
    let bulk = Mode::Bulk { seconds: o.seconds };
    let rr = Mode::Rr {
        conns: RR_CONNS,
        rounds: rr_rounds,
    };
    let cc = o.tcp_cc.clone();

    match carrier {
        Carrier::KernelPath => {
            let a_pid = bed_pids[0];
            let counted = sink.counted();
            let (bulk_report, received, bulk_cpu) = with_cpu(&bed_pids, || {
                let report = bed
                    .a
                    .in_ns(move || reference_client(bulk, sink_addr, &cc, counted))?;
                Ok((report, sink.next()?))
            })?;
            system::check_interrupted()?;
            let cc = o.tcp_cc.clone();
            let counted = sink.counted();
            let (rr_report, (), rr_cpu) = with_cpu(&bed_pids, || {
                let report = bed
                    .a
                    .in_ns(move || reference_client(rr, echo_addr, &cc, counted))?;
                Ok((report, ()))
            })?;
            sample(
                &bulk_report,
                received,
                bulk_cpu,
                &rr_report,
                rr_cpu,
                peak_rss_kib(&[a_pid]) as f64,
            )
        }
        Carrier::Onetun(bin) => {
            let onetun = start_onetun(&bed, bin)?;
            let onetun_pid = onetun.0.id();
            let log = bed.dir().join("onetun.log");
            let log_tail = || tail(&log);
            wait_listening(&bed.a, &[ONETUN_SINK, ONETUN_ECHO])
                .map_err(|e| format!("{e}{}", log_tail()))?;
            let echo_local = socket_text(ONETUN_ECHO)?;
            let sink_local = socket_text(ONETUN_SINK)?;
            bed.a
                .in_ns(move || echo_check(echo_local))
                .map_err(|e| format!("no echo through onetun: {e}{}", log_tail()))?;
            let pids = [onetun_pid, b_pid];
            let counted = sink.counted();
            let (bulk_report, received, bulk_cpu) = with_cpu(&pids, || {
                let report = bed
                    .a
                    .in_ns(move || reference_client(bulk, sink_local, &cc, counted))?;
                Ok((report, sink.next()?))
            })
            .map_err(|e| format!("{e}{}", log_tail()))?;
            system::check_interrupted()?;
            let cc = o.tcp_cc.clone();
            let counted = sink.counted();
            let (rr_report, (), rr_cpu) = with_cpu(&pids, || {
                let report = bed
                    .a
                    .in_ns(move || reference_client(rr, echo_local, &cc, counted))?;
                Ok((report, ()))
            })
            .map_err(|e| format!("{e}{}", log_tail()))?;
            let rss = peak_rss_kib(&[onetun_pid]) as f64;
            drop(onetun);
            sample(&bulk_report, received, bulk_cpu, &rr_report, rr_cpu, rss)
        }
        Carrier::InProcess(bin) => {
            let peer = bed
                .site_a_peer()
                .ok_or("the testbed has no site-A peer")?
                .clone();
            let client = |mode: Mode| -> Result<(Report, Finished, f64), String> {
                let mut cmd = bed.a.command(&bin.to_string_lossy());
                cmd.args(["--address", peer.address, "--peer-addr", B_TUNNEL])
                    .args(["--sink-port", &SINK_PORT.to_string()])
                    .args(["--echo-port", &ECHO_PORT.to_string()])
                    .arg("--private-key-file")
                    .arg(&peer.private_key_file)
                    .args(["--peer-public-key", &peer.peer_public_key])
                    .args(["--endpoint", peer.endpoint, "--mtu", &MTU.to_string()])
                    .args(mode.args());
                let b0 = cpu_seconds(&[b_pid]);
                let finished = run_measured(&mut cmd, mode.limit())?;
                if finished.code != Some(0) {
                    return Err(format!(
                        "the client failed ({}): {}",
                        finished
                            .code
                            .map_or("killed by a signal".into(), |c| format!("exit {c}")),
                        finished.stderr.trim()
                    ));
                }
                let report = parse_report(&finished.stdout)
                    .map_err(|e| format!("the client's output: {e}"))?;
                Ok((report, finished, b0))
            };
            let (bulk_report, bulk_run, b0) = client(bulk)?;
            let received = sink.next()?;
            let bulk_cpu = bulk_run.cpu_seconds + cpu_seconds(&[b_pid]) - b0;
            system::check_interrupted()?;
            let (rr_report, rr_run, b0) = client(rr)?;
            let rr_cpu = rr_run.cpu_seconds + cpu_seconds(&[b_pid]) - b0;
            let rss = bulk_run.max_rss_kib.max(rr_run.max_rss_kib) as f64;
            sample(&bulk_report, received, bulk_cpu, &rr_report, rr_cpu, rss)
        }
    }
}

/// Checks a bulk and an rr report against what the sink saw, and makes the round's sample.
fn sample(
    bulk: &Report,
    received: Received,
    bulk_cpu: f64,
    rr: &Report,
    rr_cpu: f64,
    peak_rss_kib: f64,
) -> Result<Sample, String> {
    let Report::Bulk { bytes, .. } = bulk else {
        return Err("a bulk run reported rr".into());
    };
    if *bytes < received.bytes as f64 {
        return Err(format!(
            "the client says it wrote {bytes} bytes, but the sink received {}",
            received.bytes
        ));
    }
    if received.bytes == 0 || received.seconds <= 0.0 {
        return Err("the sink received nothing".into());
    }
    let Report::Rr {
        requests_per_second,
        p50_us,
        p99_us,
        ..
    } = rr
    else {
        return Err("an rr run reported bulk".into());
    };
    Ok(Sample {
        round: 0,
        bulk_bytes: received.bytes as f64,
        bulk_seconds: received.seconds,
        bulk_cpu,
        rr_rps: *requests_per_second,
        rr_p50_us: *p50_us,
        rr_p99_us: *p99_us,
        rr_cpu,
        peak_rss_kib,
    })
}

/// Runs `f` and returns its results with the CPU seconds `pids` used meanwhile.
pub(crate) fn with_cpu<T, U>(
    pids: &[u32],
    f: impl FnOnce() -> Result<(T, U), String>,
) -> Result<(T, U, f64), String> {
    let cpu0 = cpu_seconds(pids);
    let (t, u) = f()?;
    Ok((t, u, cpu_seconds(pids) - cpu0))
}

fn socket(host: &str, port: u16) -> Result<SocketAddr, String> {
    socket_text(&format!("{host}:{port}"))
}

pub(crate) fn socket_text(text: &str) -> Result<SocketAddr, String> {
    text.parse()
        .map_err(|e| format!("bad socket address {text}: {e}"))
}

/// Waits (at most 10 s) until `addr` is on an interface in `ns`: tunneld gives its TUN the
/// address, and the servers bind to it.
pub(crate) fn wait_for_address(ns: &NetNs, addr: &str) -> Result<(), String> {
    let needle = format!(" {addr}/");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = ns.output(&["ip", "-o", "addr", "show"]);
        if String::from_utf8_lossy(&out.stdout).contains(&needle) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("{addr} was not on an interface within 10 s"));
        }
        system::check_interrupted()?;
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits (at most 10 s) until every address in `addrs` has a TCP listener in `ns`.
pub(crate) fn wait_listening(ns: &NetNs, addrs: &[&str]) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !listening(ns, addrs) {
        if Instant::now() >= deadline {
            return Err(format!(
                "nothing listened on {} within 10 s",
                addrs.join(", ")
            ));
        }
        system::check_interrupted()?;
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// The last lines of a log file, for error messages.
pub(crate) fn tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = &lines[lines.len().saturating_sub(10)..];
    if tail.is_empty() {
        String::new()
    } else {
        format!(
            "\n--- {} (last lines) ---\n{}",
            path.display(),
            tail.join("\n")
        )
    }
}

fn start_onetun(bed: &Testbed, bin: &Path) -> Result<Guard, String> {
    let peer = bed.site_a_peer().ok_or("the testbed has no site-A peer")?;
    let log_path = bed.dir().join("onetun.log");
    let log = fs::File::create(&log_path)
        .map_err(|e| format!("cannot create {}: {e}", log_path.display()))?;
    let mut cmd = bed.a.command(&bin.to_string_lossy());
    cmd.arg(format!("{ONETUN_SINK}:{B_TUNNEL}:{SINK_PORT}:TCP"))
        .arg(format!("{ONETUN_ECHO}:{B_TUNNEL}:{ECHO_PORT}:TCP"))
        .args(["--endpoint-addr", peer.endpoint])
        .args(["--endpoint-public-key", &peer.peer_public_key])
        .arg("--private-key-file")
        .arg(&peer.private_key_file)
        .args(["--source-peer-ip", peer.address])
        .args(["--max-transmission-unit", &MTU.to_string()])
        .args(["--log", "warn"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    cmd.spawn()
        .map(Guard)
        .map_err(|e| format!("cannot start {cmd:?}: {e}"))
}

// ----------------------------------------------------------------------------------------
// The lossy-link grid (`--lossy`)
//
// Per cell (loss × round trip), round and row, fresh: the testbed above with site A's
// WireGuard sent through a `LossyRelay` in A (tunneld_testnet::relay), which drops each
// datagram, either way, with the cell's probability and delays each direction by half the
// cell's round trip. The row's client writes to the sink (bulk, as in the contract) for the
// measuring window plus a margin; the goodput is what the sink received in the window,
// which starts at its first byte. The client is then stopped: a lossy link drains a
// stack's send buffer slowly, and every row would otherwise be timed by its buffer size.
// Rows: the kernel path, tunneld-userspace and wireguard-go's netstack (onetun is left
// out). Rounds are interleaved (round, then cell, then row); the figures are medians. Within
// a round and cell every row meets the same drop decisions (one seed), so that a row is not
// ahead of another by luck: the realized loss of a 10 s run at 3 % moved between 2.3 and
// 3.4 % with a seed per run, and the goodput with it.

/// The grid's cells: loss probability and round trip.
const LOSSY_CELLS: [(f64, u64); 6] = [
    (0.001, 20),
    (0.001, 80),
    (0.01, 20),
    (0.01, 80),
    (0.03, 20),
    (0.03, 80),
];
/// How long a client may take to deliver its first byte (handshake and connect over the
/// lossy link). With one seed per round and cell, the in-process rows' first datagrams (the
/// WireGuard handshake) meet the same drops: three lost cost 15 s of handshake retries, and
/// a SYN queued behind them may wait for its next retransmission (1, 3, 7, 15, 31 s). At
/// 20 s a round at 3 % lost a row to that, not to its TCP.
const LOSSY_FIRST_BYTE: Duration = Duration::from_secs(45);

fn lossy_grid(
    contenders: &[Contender],
    tunneld: &Path,
    o: &Options,
    root: &Path,
    args: &[String],
    cells: Option<&[(f64, u64)]>,
    seed: Option<u64>,
) -> Result<(), String> {
    let in_run = |loss: f64, rtt_ms: u64| cells.is_none_or(|v| v.contains(&(loss, rtt_ms)));
    let rows: Vec<&Contender> = contenders
        .iter()
        .filter(|c| c.kind != Kind::Onetun && c.which.is_ok())
        .collect();
    // goodput[row][cell] = samples in bytes per second
    let mut goodput = vec![vec![Vec::<f64>::new(); LOSSY_CELLS.len()]; rows.len()];
    let mut failures = Vec::new();
    let total = o.rounds * LOSSY_CELLS.iter().filter(|&&(l, r)| in_run(l, r)).count() * rows.len();
    let mut done = 0;
    // One seed per round and cell (the section's comment says why); `--seed` repeats a
    // run's, since a round's drops depend on the base, the round and the cell alone.
    let base_seed = seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("lossy grid: --seed {base_seed}");
    for round in 1..=o.rounds {
        for (ci, &(loss, rtt_ms)) in LOSSY_CELLS.iter().enumerate() {
            if !in_run(loss, rtt_ms) {
                continue;
            }
            let seed = base_seed
                .wrapping_add((round as u64) << 32)
                .wrapping_add(ci as u64)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15);
            for (ri, c) in rows.iter().enumerate() {
                system::check_interrupted()?;
                done += 1;
                let Ok(carrier) = &c.which else { continue };
                eprintln!(
                    "[{done}/{total}] round {round}, loss {} %, RTT {rtt_ms} ms: {}",
                    loss * 100.0,
                    c.name
                );
                let rtt = Duration::from_millis(rtt_ms);
                match lossy_goodput(carrier, tunneld, o, loss, rtt, seed) {
                    Ok(bps) => {
                        eprintln!("  {:.3} MB/s", bps / 1e6);
                        goodput[ri][ci].push(bps);
                    }
                    Err(e) => {
                        eprintln!("  failed: {e}");
                        failures.push(format!(
                            "round {round}, loss {} %, RTT {rtt_ms} ms, {}: {}",
                            loss * 100.0,
                            c.name,
                            e.lines().next().unwrap_or("")
                        ));
                    }
                }
            }
        }
    }
    let median_of = |kind: Kind, ci: usize| -> Option<f64> {
        let ri = rows.iter().position(|c| c.kind == kind)?;
        let v = &goodput[ri][ci];
        (!v.is_empty()).then(|| median(v.clone()))
    };
    let mut md = String::new();
    let _ = writeln!(
        md,
        "### Lossy links: bulk goodput, MB/s (median of {} interleaved rounds, {} s windows; in each round and cell every row draws the same drop decisions, in datagram order)
",
        o.rounds, o.seconds
    );
    let _ = writeln!(
        md,
        "| loss | RTT | kernel path | tunneld-userspace | netstack | userspace / netstack | userspace / kernel | targets (≥ 1× netstack, ≥ 0.5× kernel) |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    let fmt = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{:.3}", v / 1e6));
    for (ci, &(loss, rtt_ms)) in LOSSY_CELLS.iter().enumerate() {
        let k = median_of(Kind::Kernel, ci);
        let u = median_of(Kind::Userspace, ci);
        let n = median_of(Kind::Netstack, ci);
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        };
        let (un, uk) = (ratio(u, n), ratio(u, k));
        let met = match (un, uk) {
            (Some(un), Some(uk)) => {
                if un >= 1.0 && uk >= 0.5 {
                    "met".to_string()
                } else {
                    "**not met**".to_string()
                }
            }
            _ => "–".to_string(),
        };
        let r = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{v:.2}×"));
        let _ = writeln!(
            md,
            "| {} % | {rtt_ms} ms | {} | {} | {} | {} | {} | {met} |",
            loss * 100.0,
            fmt(k),
            fmt(u),
            fmt(n),
            r(un),
            r(uk)
        );
    }
    let _ = writeln!(
        md,
        "
{}",
        congestion_control_note(&o.tcp_cc)
    );
    let _ = writeln!(
        md,
        "
Each round's figures (MB/s), row by row:
"
    );
    for (ri, c) in rows.iter().enumerate() {
        let cells: Vec<String> = goodput[ri]
            .iter()
            .map(|v| {
                v.iter()
                    .map(|b| format!("{:.3}", b / 1e6))
                    .collect::<Vec<_>>()
                    .join("/")
            })
            .collect();
        let _ = writeln!(md, "- {}: {}", c.name, cells.join(" · "));
    }
    if !failures.is_empty() {
        let _ = writeln!(
            md,
            "
Failed runs:
"
        );
        for f in &failures {
            let _ = writeln!(md, "- {f}");
        }
    }
    let _ = writeln!(
        md,
        "
The drops again: `--seed {base_seed}` (with the same rounds; `--cells` keeps them).

{}",
        report::measured_line("bench-embedded", args)
    );
    let report_dir = system::target_dir(root).join("bench-report");
    report::write(&report_dir, "embedded-lossy-report.md", &md)?;
    println!("{md}");
    println!("Written: target/bench-report/embedded-lossy-report.md");
    if rows
        .iter()
        .enumerate()
        .any(|(ri, _)| goodput[ri].iter().all(|v| v.is_empty()))
    {
        return Err("some rows produced no measurement".into());
    }
    Ok(())
}

/// One run of the grid: the goodput (bytes per second at the sink over the window).
fn lossy_goodput(
    carrier: &Carrier,
    tunneld: &Path,
    o: &Options,
    loss: f64,
    rtt: Duration,
    seed: u64,
) -> Result<f64, String> {
    let which = match carrier {
        Carrier::KernelPath => {
            Impl::Tunneld(tunneld.to_path_buf(), "backend = \"mmsg\"\nworkers = 1", "")
        }
        Carrier::InProcess(_) | Carrier::Onetun(_) => Impl::TunneldSiteB(tunneld.to_path_buf()),
    };
    let window = Duration::from_secs(o.seconds.into());
    // The relay outlives the run: first byte, window, and the margin.
    let lifetime = LOSSY_FIRST_BYTE + window + Duration::from_secs(60);
    let config = RelayConfig {
        seed,
        ..RelayConfig::new(loss, rtt, lifetime)
    };
    let mut bed = Testbed::with_relay(&which, tunneld, Some(config))?;
    bed.set_tcp_congestion_control(&o.tcp_cc)?;
    wait_for_address(&bed.b, B_TUNNEL).map_err(|e| format!("{e}{}", bed.logs()))?;
    let sink_addr = socket(B_TUNNEL, SINK_PORT)?;
    let sink = Sink::start(&bed.b, sink_addr)?;
    let counted = sink.counted();
    // The client writes longer than the window; it is stopped once the window is measured.
    let bulk = Mode::Bulk {
        seconds: o.seconds + LOSSY_FIRST_BYTE.as_secs() as u32 + 10,
    };
    let _client: Option<Guard> = match carrier {
        Carrier::KernelPath => {
            let cc = o.tcp_cc.clone();
            let counting = counted.clone();
            // Detached: it ends on its own (its writes fail once the testbed is gone, each
            // within IO_TIMEOUT, or it has written for its seconds).
            drop(
                bed.a
                    .spawn_in_ns(move || reference_client(bulk, sink_addr, &cc, counting)),
            );
            None
        }
        Carrier::InProcess(bin) => {
            let peer = bed
                .site_a_peer()
                .ok_or("the testbed has no site-A peer")?
                .clone();
            let mut cmd = bed.a.command(&bin.to_string_lossy());
            cmd.args(["--address", peer.address, "--peer-addr", B_TUNNEL])
                .args(["--sink-port", &SINK_PORT.to_string()])
                .args(["--echo-port", &ECHO_PORT.to_string()])
                .arg("--private-key-file")
                .arg(&peer.private_key_file)
                .args(["--peer-public-key", &peer.peer_public_key])
                .args(["--endpoint", peer.endpoint, "--mtu", &MTU.to_string()])
                .args(bulk.args())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            Some(Guard(
                cmd.spawn()
                    .map_err(|e| format!("cannot run {cmd:?}: {e}"))?,
            ))
        }
        Carrier::Onetun(_) => return Err("onetun is not in the lossy grid".into()),
    };
    let waited = Instant::now();
    while counted.load(Ordering::Relaxed) == 0 {
        if waited.elapsed() > LOSSY_FIRST_BYTE {
            return Err(format!(
                "no byte reached the sink within {} s",
                LOSSY_FIRST_BYTE.as_secs()
            ));
        }
        system::check_interrupted()?;
        std::thread::sleep(Duration::from_millis(5));
    }
    let start = Instant::now();
    let first = counted.load(Ordering::Relaxed);
    while start.elapsed() < window {
        system::check_interrupted()?;
        std::thread::sleep(Duration::from_millis(20));
    }
    let bytes = counted.load(Ordering::Relaxed) - first;
    let seconds = start.elapsed().as_secs_f64();
    if let Some((toward_b, toward_a)) = bed.relay_counts() {
        eprintln!(
            "  relay: toward B {} datagrams, {} dropped ({:.2} %); back toward A {} datagrams",
            toward_b.received,
            toward_b.dropped,
            100.0 * toward_b.dropped as f64 / toward_b.received.max(1) as f64,
            toward_a.received
        );
    }
    Ok(bytes as f64 / seconds)
}

// ----------------------------------------------------------------------------------------
// Running a client program

/// A client program's end: its exit code (None: killed by a signal), output, and what
/// `wait4` says it used.
struct Finished {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    cpu_seconds: f64,
    max_rss_kib: u64,
}

/// Runs `cmd` (stdin closed, stdout and stderr captured) and reaps it with `wait4`, whose
/// rusage is the process's own CPU time and peak memory, exact even though it has exited.
/// Killed, and an error, past `limit` or on Ctrl-C.
fn run_measured(cmd: &mut Command, limit: Duration) -> Result<Finished, String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    let (stdout, stderr) = system::capture_output(&mut child);
    let pid = child.id() as libc::pid_t;
    let deadline = Instant::now() + limit;
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain integers, for which all zeroes is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let mut stopped = None;
    loop {
        // SAFETY: `pid` is this process's child, reaped only here (std's `Child` is never
        // waited on); `status` and `usage` are valid for writes.
        let reaped = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if reaped == pid {
            break;
        }
        if reaped < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(format!("wait4: {e}"));
        }
        if Instant::now() >= deadline || system::interrupted() {
            stopped = Some(if system::interrupted() {
                "interrupted".to_string()
            } else {
                format!("did not finish within {} s", limit.as_secs())
            });
            // SAFETY: signals our own child, not yet reaped, so the pid is still its.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            loop {
                // SAFETY: as above; blocks until the killed child is reaped.
                let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
                let interrupted = reaped < 0
                    && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted;
                if !interrupted {
                    break;
                }
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(child);
    let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
    let stdout = text(stdout.join().unwrap_or_default());
    let stderr = text(stderr.join().unwrap_or_default());
    if let Some(why) = stopped {
        return Err(format!("the client {why}: {}", stderr.trim()));
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(Finished {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        stdout,
        stderr,
        cpu_seconds: seconds(usage.ru_utime) + seconds(usage.ru_stime),
        // Linux reports ru_maxrss in KiB.
        max_rss_kib: usage.ru_maxrss.max(0) as u64,
    })
}

/// A value of a flat JSON object.
#[derive(Clone, Debug, PartialEq)]
enum Json {
    Number(f64),
    Text(String),
    Other,
}

/// The keys and values of one flat JSON object (`{"k": 1, "m": "x"}`; no nesting, which the
/// contract does not use), without a JSON crate.
fn parse_flat_object(text: &str) -> Result<Vec<(String, Json)>, String> {
    let body = text
        .trim()
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .ok_or("not a JSON object")?;
    let mut fields = Vec::new();
    let mut rest = body.trim_start();
    while !rest.is_empty() {
        let (key, after) = json_string(rest)?;
        rest = after
            .trim_start()
            .strip_prefix(':')
            .ok_or_else(|| format!("no ':' after \"{key}\""))?
            .trim_start();
        let value;
        if rest.starts_with('"') {
            let (text, after) = json_string(rest)?;
            value = Json::Text(text);
            rest = after;
        } else {
            let end = rest.find([',', '}']).unwrap_or(rest.len());
            let token = rest[..end].trim();
            value = match token {
                "true" | "false" | "null" => Json::Other,
                _ => Json::Number(
                    token
                        .parse()
                        .map_err(|_| format!("\"{key}\": {token:?} is not a number"))?,
                ),
            };
            rest = &rest[end..];
        }
        fields.push((key, value));
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix(',') {
            rest = after.trim_start();
            if rest.is_empty() {
                return Err("a ',' before the end".into());
            }
        } else if !rest.is_empty() {
            return Err(format!(
                "unexpected {:?}",
                rest.chars().next().unwrap_or(' ')
            ));
        }
    }
    Ok(fields)
}

/// A JSON string at the start of `text` (escapes: `\"`, `\\`, `\/`, `\n`, `\t`; others kept
/// as the escaped character), and what follows it.
fn json_string(text: &str) -> Result<(String, &str), String> {
    let inner = text.strip_prefix('"').ok_or("expected a string")?;
    let mut out = String::new();
    let mut chars = inner.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((out, &inner[i + 1..])),
            '\\' => match chars.next() {
                Some((_, 'n')) => out.push('\n'),
                Some((_, 't')) => out.push('\t'),
                Some((_, other)) => out.push(other),
                None => break,
            },
            _ => out.push(c),
        }
    }
    Err("an unterminated string".into())
}

/// A client's result: the last non-empty line of its stdout, checked against the contract.
fn parse_report(stdout: &str) -> Result<Report, String> {
    let line = stdout
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .ok_or("no result line")?;
    let fields = parse_flat_object(line).map_err(|e| format!("{e}: {line}"))?;
    let text = |key: &str| {
        fields.iter().find_map(|(k, v)| match v {
            Json::Text(t) if k == key => Some(t.as_str()),
            _ => None,
        })
    };
    let number = |key: &str| -> Result<f64, String> {
        fields
            .iter()
            .find_map(|(k, v)| match v {
                Json::Number(n) if k == key && n.is_finite() && *n >= 0.0 => Some(*n),
                _ => None,
            })
            .ok_or_else(|| format!("no non-negative number \"{key}\" in {line}"))
    };
    match text("mode") {
        Some("bulk") => {
            let (bytes, seconds) = (number("bytes")?, number("seconds")?);
            if seconds <= 0.0 {
                return Err(format!("a bulk run of no time: {line}"));
            }
            Ok(Report::Bulk { bytes, seconds })
        }
        Some("rr") => {
            let requests = number("requests")?;
            if requests < 1.0 {
                return Err(format!("no round trip: {line}"));
            }
            Ok(Report::Rr {
                requests,
                seconds: number("seconds")?,
                requests_per_second: number("requests_per_second")?,
                p50_us: number("p50_us")?,
                p99_us: number("p99_us")?,
            })
        }
        _ => Err(format!("no \"mode\" of \"bulk\" or \"rr\": {line}")),
    }
}

// ----------------------------------------------------------------------------------------
// The reference client (std TCP, the kernel's stack) and the servers in B

/// The client contract with std TCP sockets, on the calling thread (which has entered
/// namespace A): `bulk` to a sink or `rr` to an echo server at `target`. Its sockets use the
/// congestion control `cc`, as iperf3's `-C` does in `cargo xtask bench`. `received`, the
/// sink's count of bytes received, keeps bulk writes within [`BULK_WINDOW`] of it.
fn reference_client(
    mode: Mode,
    target: SocketAddr,
    cc: &str,
    received: Arc<AtomicU64>,
) -> Result<Report, String> {
    match mode {
        Mode::Bulk { seconds } => {
            reference_bulk(target, Duration::from_secs(seconds.into()), cc, &received)
        }
        Mode::Rr { conns, rounds } => reference_rr(target, conns, rounds, cc),
    }
}

fn connect(addr: SocketAddr, cc: &str) -> Result<TcpStream, String> {
    let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
        .map_err(|e| format!("connect {addr}: {e}"))?;
    set_congestion_control(&stream, cc)?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    Ok(stream)
}

fn set_congestion_control(stream: &TcpStream, name: &str) -> Result<(), String> {
    // SAFETY: a valid socket and a buffer of `name.len()` bytes, alive for the call.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr().cast(),
            name.len() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!(
            "TCP congestion control {name}: {}",
            std::io::Error::last_os_error()
        ))
    }
}

fn reference_bulk(
    sink: SocketAddr,
    length: Duration,
    cc: &str,
    received: &AtomicU64,
) -> Result<Report, String> {
    let stream = connect(sink, cc)?;
    let (bytes, seconds) = bulk_on(stream, length, received)?;
    Ok(Report::Bulk {
        bytes: bytes as f64,
        seconds,
    })
}

/// The bulk half of the contract on a connected `stream`: writes for `length`, within
/// [`BULK_WINDOW`] of `received` (the sink's running count), then shuts the sending side and
/// waits for the sink to close. Returns the bytes written and the seconds of writing.
pub(crate) fn bulk_on(
    mut stream: TcpStream,
    length: Duration,
    received: &AtomicU64,
) -> Result<(u64, f64), String> {
    let buf = vec![0x5au8; 128 * 1024];
    let base = received.load(Ordering::Relaxed);
    let start = Instant::now();
    let mut bytes = 0u64;
    'writing: while start.elapsed() < length {
        if system::interrupted() {
            return Err("interrupted".into());
        }
        while bytes.saturating_sub(received.load(Ordering::Relaxed) - base) > BULK_WINDOW {
            if start.elapsed() >= length {
                break 'writing;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        // Bounded: a write blocks at most IO_TIMEOUT.
        let n = stream
            .write(&buf)
            .map_err(|e| format!("write after {bytes} bytes: {e}"))?;
        bytes += n as u64;
    }
    let seconds = start.elapsed().as_secs_f64();
    // As the contract has it: shut the sending side, then wait (each read at most
    // IO_TIMEOUT) for the sink to close once it has read everything.
    stream
        .shutdown(std::net::Shutdown::Write)
        .map_err(|e| format!("shutdown: {e}"))?;
    std::io::copy(&mut stream, &mut std::io::sink())
        .map_err(|e| format!("waiting for the sink to close: {e}"))?;
    Ok((bytes, seconds))
}

/// `conns` connections to `echo`, one uncounted round trip on each, then one request in
/// flight on each until `rounds` round trips are done (`closed_loop`), within [`RR_LIMIT`].
fn reference_rr(echo: SocketAddr, conns: usize, rounds: usize, cc: &str) -> Result<Report, String> {
    let mut streams = Vec::with_capacity(conns);
    for i in 0..conns {
        streams.push(connect(echo, cc).map_err(|e| format!("connection {i}: {e}"))?);
    }
    closed_loop::warm_up(&mut streams)?;
    let outcome = closed_loop::run(streams, rounds, Instant::now() + RR_LIMIT, IO_TIMEOUT)?;
    if !outcome.finished {
        return Err(format!(
            "{} of {rounds} round trips done in the {} s limit",
            outcome.rtts_us.len(),
            RR_LIMIT.as_secs()
        ));
    }
    let mut rtts_us = outcome.rtts_us;
    let seconds = outcome.elapsed.as_secs_f64();
    rtts_us.sort_by(f64::total_cmp);
    Ok(Report::Rr {
        requests: rtts_us.len() as f64,
        seconds,
        requests_per_second: rtts_us.len() as f64 / seconds,
        p50_us: percentile(&rtts_us, 0.50),
        p99_us: percentile(&rtts_us, 0.99),
    })
}

/// One round trip on a new connection, retried until it works or 15 s pass (the first
/// waits for the tunnel's handshake).
fn echo_check(addr: SocketAddr) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let attempt = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
            .map_err(|e| e.to_string())
            .and_then(|mut s| {
                s.set_read_timeout(Some(Duration::from_secs(3)))
                    .map_err(|e| e.to_string())?;
                let req = request(u64::MAX);
                s.write_all(&req).map_err(|e| e.to_string())?;
                read_echo(&mut s, &req)
            });
        match attempt {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline || system::interrupted() => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// What the sink received on one connection.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Received {
    pub bytes: u64,
    /// From the first byte to the end of the stream.
    pub seconds: f64,
}

/// A TCP sink on a thread that entered a namespace: each connection read to its end on a
/// thread of its own, and what it carried reported on a channel. Stops accepting when
/// dropped.
pub(crate) struct Sink {
    stop: Arc<AtomicBool>,
    /// Bytes received on all connections so far, counted as they arrive.
    counted: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
    received: mpsc::Receiver<Result<Received, String>>,
}

impl Sink {
    pub(crate) fn start(ns: &NetNs, addr: SocketAddr) -> Result<Sink, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
        let (tx, received) = mpsc::channel();
        let stopping = stop.clone();
        let counted = Arc::new(AtomicU64::new(0));
        let counting = counted.clone();
        let thread = ns.spawn_in_ns(move || {
            let listener = match TcpListener::bind(addr) {
                Ok(l) => l,
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("the sink cannot bind {addr}: {e}")));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(()));
            // Bounded even if never stopped: at most an hour.
            let deadline = Instant::now() + Duration::from_secs(3600);
            while !stopping.load(Ordering::SeqCst) && Instant::now() < deadline {
                if !readable(listener.as_raw_fd(), 100) {
                    continue;
                }
                if let Ok((stream, _)) = listener.accept() {
                    let tx = tx.clone();
                    let counting = counting.clone();
                    std::thread::spawn(move || {
                        let _ = tx.send(drain(stream, &counting));
                    });
                }
            }
        });
        let ready = ready_rx
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|_| Err("the sink did not start within 5 s".into()));
        let sink = Sink {
            stop,
            counted,
            thread: Some(thread),
            received,
        };
        ready.map(|()| sink)
    }

    /// The running count of bytes received, for a client to keep within a window of it.
    pub(crate) fn counted(&self) -> Arc<AtomicU64> {
        self.counted.clone()
    }

    /// What the next connection to end carried (waits at most [`SINK_WAIT`]).
    pub(crate) fn next(&self) -> Result<Received, String> {
        self.received.recv_timeout(SINK_WAIT).map_err(|_| {
            format!(
                "the sink saw no stream end within {} s",
                SINK_WAIT.as_secs()
            )
        })?
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Reads `stream` to its end (each read waits at most [`IO_TIMEOUT`]), adding what arrives
/// to `counted` as it does.
fn drain(mut stream: TcpStream, counted: &AtomicU64) -> Result<Received, String> {
    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
    let mut buf = vec![0u8; 256 * 1024];
    let mut bytes = 0u64;
    let mut first = None;
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                first.get_or_insert_with(Instant::now);
                bytes += n as u64;
                counted.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("the sink, after {bytes} bytes: {e}")),
        }
    }
    Ok(Received {
        bytes,
        seconds: first.map_or(0.0, |t| t.elapsed().as_secs_f64()),
    })
}

// ----------------------------------------------------------------------------------------
// The report

/// `f(a's sample) / f(b's sample)` for each round both rows measured (finite ones only).
fn per_round(a: &Contender, b: &Contender, f: fn(&Sample) -> f64) -> Vec<f64> {
    a.samples
        .iter()
        .filter_map(|sa| {
            let sb = b.samples.iter().find(|s| s.round == sa.round)?;
            let v = f(sa) / f(sb);
            v.is_finite().then_some(v)
        })
        .collect()
}

/// Issue 27's targets for tunneld-userspace: (what, the row set against, metric, at least).
type Metric = fn(&Sample) -> f64;
const TARGETS: [(&str, Kind, Metric, f64); 4] = [
    (
        "TCP Gbit/s, against the kernel path",
        Kind::Kernel,
        Sample::gbits,
        0.5,
    ),
    (
        "64 connections' requests/s, against the kernel path",
        Kind::Kernel,
        |s| s.rr_rps,
        0.5,
    ),
    (
        "Gbit per CPU-second, against wireguard-go's netstack",
        Kind::Netstack,
        Sample::gbit_per_cpu,
        2.0,
    ),
    (
        "Gbit per CPU-second, against onetun",
        Kind::Onetun,
        Sample::gbit_per_cpu,
        5.0,
    ),
];

fn markdown(contenders: &[Contender], o: &Options, rr_rounds: usize, measured: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{measured}\n\nEmbedded TCP/IP stacks inside a WireGuard tunnel (site A) against the kernel's TCP \
         through tunneld's TUN path, to tunneld at site B (one worker each), over a veth \
         between two namespaces. {} round(s), interleaved, medians. TCP 1 stream: {} s of \
         one connection writing as fast as it can, measured at B's sink. {RR_CONNS} conns: \
         {RR_CONNS} connections each keeping one {MESSAGE_BYTES}-byte request in flight to \
         B's echo server, {rr_rounds} round trips in all. Tunnel CPU is side A's tunnel \
         (tunneld for the kernel path, the client process for an in-process stack, onetun's \
         process) plus B's tunneld over the run; the kernel's TCP work in the std client's \
         thread is not counted. Peak RSS is side A's tunnel process. Everything shares this \
         machine's cores. {} The std client's bulk writes stay within {} MiB of what the \
         sink has received: TCP's flow control keeps the kernel path far below that, but \
         onetun reads its local connection without limit and would hold the whole stream in \
         memory.\n",
        o.rounds,
        o.seconds,
        congestion_control_note(&o.tcp_cc),
        BULK_WINDOW >> 20,
    );
    let concurrent_requests = format!("{RR_CONNS} conns: requests/s");
    let mut table = Table::new(&[
        "side A",
        "rounds measured",
        "TCP 1 stream",
        "tunnel CPU-s (A + B)",
        "Gbit per tunnel CPU-s",
        &concurrent_requests,
        "p50",
        "p99",
        "peak RSS (side A)",
    ]);
    for c in contenders {
        if let Err(why) = &c.which {
            table.note(&c.name, why);
            continue;
        }
        let rounds = format!(
            "{} of {}",
            c.samples.len(),
            c.samples.len() + c.failures.len()
        );
        if c.samples.is_empty() {
            let mut cells = vec![c.name.clone(), rounds, "failed (below)".into()];
            cells.resize(9, String::new());
            table.row(&cells);
            continue;
        }
        let m = |f: fn(&Sample) -> f64| median(c.samples.iter().map(f).collect());
        table.row(&[
            c.name.clone(),
            rounds,
            cell(m(Sample::gbits), 2, " Gbit/s"),
            cell(m(|s| s.bulk_cpu), 2, ""),
            cell(m(Sample::gbit_per_cpu), 2, ""),
            cell(m(|s| s.rr_rps), 0, ""),
            cell(m(|s| s.rr_p50_us), 0, " µs"),
            cell(m(|s| s.rr_p99_us), 0, " µs"),
            cell(m(|s| s.peak_rss_kib) / 1024.0, 1, " MiB"),
        ]);
    }
    out.push_str(table.render());
    let failures: Vec<String> = contenders
        .iter()
        .flat_map(|c| {
            c.failures.iter().map(|(round, why)| {
                format!("- {}, round {round}: {}", c.name, why.replace('|', "\\|"))
            })
        })
        .collect();
    if !failures.is_empty() {
        let _ = writeln!(
            out,
            "\nFailed rounds (left out of the medians):\n\n{}",
            failures.join("\n")
        );
    }

    let measured = |kind: Kind| {
        contenders
            .iter()
            .find(|c| c.kind == kind && !c.samples.is_empty())
    };
    if let Some(kernel) = measured(Kind::Kernel) {
        let others: Vec<&Contender> = contenders
            .iter()
            .filter(|c| c.kind != Kind::Kernel && !c.samples.is_empty())
            .collect();
        if !others.is_empty() {
            let _ = writeln!(
                out,
                "\nAgainst the kernel path, round by round (each ratio within one round, then \
                 the median over the rounds and their range):\n"
            );
            let mut table = Table::new(&[
                "side A",
                "TCP 1 stream",
                &concurrent_requests,
                "Gbit per tunnel CPU-s",
            ]);
            for c in others {
                table.row(&[
                    c.name.clone(),
                    spread(&per_round(c, kernel, Sample::gbits), "×", 2),
                    spread(&per_round(c, kernel, |s| s.rr_rps), "×", 2),
                    spread(&per_round(c, kernel, Sample::gbit_per_cpu), "×", 2),
                ]);
            }
            out.push_str(table.render());
        }
    }

    let _ = writeln!(
        out,
        "\nIssue 27's targets for tunneld-userspace (round by round, as above):\n"
    );
    let _ = writeln!(out, "| tunneld-userspace's | wanted | measured | |");
    let _ = writeln!(out, "|---|---:|---:|---|");
    let userspace = contenders.iter().find(|c| c.kind == Kind::Userspace);
    for (what, against, metric, wanted) in TARGETS {
        let (measured_cell, verdict) = match (userspace, measured(against)) {
            (Some(u), Some(other)) if !u.samples.is_empty() => {
                let values = per_round(u, other, metric);
                let mid = median(values.clone());
                let verdict = if !mid.is_finite() {
                    "no figure"
                } else if mid >= wanted {
                    "met"
                } else {
                    "not met"
                };
                (spread(&values, "×", 2), verdict)
            }
            (Some(u), _) if u.which.is_err() => ("–".to_string(), "pending: not built"),
            (Some(_), Some(_)) => ("–".to_string(), "no measurement"),
            _ => ("–".to_string(), "pending: a row is not in this run"),
        };
        let _ = writeln!(
            out,
            "| {what} | ≥ {wanted}× | {measured_cell} | {verdict} |"
        );
    }
    out
}

/// Which TCP congestion control the report's figures ran under: the std client asks for
/// `cc` on each of its sockets; the namespaces (and so the far side's sockets) default to
/// it where the host allows, else to the host's default; the in-process stacks have their own.
fn congestion_control_note(cc: &str) -> String {
    let namespaces = match report::namespaces_congestion_control(cc) {
        Ok(()) => cc.to_string(),
        Err((host, allowed)) => {
            format!("{host} (the host's: it lets a namespace default only to {allowed})")
        }
    };
    format!(
        "TCP congestion control: {cc} on the std client's sockets (asked for on each), \
         {namespaces} as the namespaces' default; the in-process stacks run their own."
    )
}

fn csv(contenders: &[Contender]) -> String {
    let mut out = String::from(
        "row,round,sink_bytes,sink_seconds,gbits,bulk_tunnel_cpu_s,gbit_per_cpu_s,rr_requests_per_s,rr_p50_us,rr_p99_us,rr_tunnel_cpu_s,peak_rss_kib\n",
    );
    for c in contenders {
        for s in &c.samples {
            let _ = writeln!(
                out,
                "\"{}\",{},{:.0},{:.3},{:.4},{:.3},{:.4},{:.0},{:.1},{:.1},{:.3},{:.0}",
                c.name,
                s.round,
                s.bulk_bytes,
                s.bulk_seconds,
                s.gbits(),
                s.bulk_cpu,
                s.gbit_per_cpu(),
                s.rr_rps,
                s.rr_p50_us,
                s.rr_p99_us,
                s.rr_cpu,
                s.peak_rss_kib
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_lines_parse() {
        let bulk =
            parse_report("{\"mode\":\"bulk\",\"bytes\":1250000000,\"seconds\":5.001}\n").unwrap();
        assert_eq!(
            bulk,
            Report::Bulk {
                bytes: 1.25e9,
                seconds: 5.001
            }
        );
        // Keys in any order, spaces, more keys, and noise on earlier lines.
        let rr = parse_report(
            "starting\n{ \"p99_us\": 812.5, \"requests\": 50000, \"mode\": \"rr\", \"conns\": 64,\n\
             \"seconds\": 2.5, \"requests_per_second\": 20000, \"p50_us\": 3.1e2, \"stack\": \"smoltcp\", \"ok\": true }\n\n",
        );
        // A line break inside the object is not one line: only the last line is read.
        assert!(rr.is_err());
        let rr = parse_report(
            "starting\n{ \"p99_us\": 812.5, \"requests\": 50000, \"mode\": \"rr\", \"conns\": 64, \
             \"seconds\": 2.5, \"requests_per_second\": 20000, \"p50_us\": 3.1e2, \"stack\": \"smol\\\"tcp\", \"ok\": true }\n\n",
        )
        .unwrap();
        assert_eq!(
            rr,
            Report::Rr {
                requests: 50000.0,
                seconds: 2.5,
                requests_per_second: 20000.0,
                p50_us: 310.0,
                p99_us: 812.5
            }
        );
    }

    #[test]
    fn bad_contract_lines_are_errors_that_say_why() {
        let err = |s: &str| parse_report(s).unwrap_err();
        assert!(err("").contains("no result line"));
        assert!(err("bulk 5 GB").contains("not a JSON object"));
        assert!(err("{\"mode\":\"bulk\",\"bytes\":10}").contains("\"seconds\""));
        assert!(err("{\"mode\":\"bulk\",\"bytes\":-1,\"seconds\":1}").contains("\"bytes\""));
        assert!(err("{\"mode\":\"bulk\",\"bytes\":1,\"seconds\":0}").contains("no time"));
        assert!(err("{\"mode\":\"stream\",\"bytes\":1}").contains("\"mode\""));
        assert!(err("{\"mode\":\"bulk\",\"bytes\":\"many\",\"seconds\":1}").contains("\"bytes\""));
        assert!(err("{\"mode\":\"bulk\",\"bytes\":1x,\"seconds\":1}").contains("not a number"));
        assert!(err("{\"mode\":\"rr\",\"requests\":0,\"seconds\":1}").contains("no round trip"));
        assert!(err("{\"mode\":\"bulk\",}").contains("before the end"));
        assert!(err("{\"mode\":\"bulk").contains("not a JSON object"));
        assert!(err("{\"mode:1}").contains("unterminated"));
        assert!(err("{\"mode\" 1}").contains("no ':'"));
    }

    #[test]
    fn modes_give_the_contracts_arguments_and_limits() {
        assert_eq!(Mode::Bulk { seconds: 5 }.args(), ["bulk", "5"]);
        let rr = Mode::Rr {
            conns: 64,
            rounds: 50_000,
        };
        assert_eq!(rr.args(), ["rr", "64", "50000"]);
        assert_eq!(Mode::Bulk { seconds: 5 }.limit(), Duration::from_secs(35));
        assert_eq!(rr.limit(), Duration::from_secs(90));
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 51.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert!(percentile(&[], 0.5).is_nan());
    }

    fn row(kind: Kind, rounds: &[(usize, f64, f64)]) -> Contender {
        Contender {
            kind,
            name: format!("{kind:?}"),
            which: Ok(Carrier::KernelPath),
            samples: rounds
                .iter()
                .map(|&(round, gbits, cpu)| Sample {
                    round,
                    bulk_bytes: gbits * 1e9 / 8.0,
                    bulk_seconds: 1.0,
                    bulk_cpu: cpu,
                    rr_rps: gbits * 1000.0,
                    ..Sample::default()
                })
                .collect(),
            failures: Vec::new(),
        }
    }

    #[test]
    fn targets_are_judged_round_by_round_and_pending_without_the_row() {
        let kernel = row(Kind::Kernel, &[(1, 4.0, 2.0), (2, 4.0, 2.0), (3, 2.0, 1.0)]);
        let netstack = row(Kind::Netstack, &[(1, 1.0, 1.0), (2, 1.0, 1.0)]);
        let onetun = row(Kind::Onetun, &[(1, 0.1, 1.0), (2, 0.1, 1.0)]);
        // Round 3 of the userspace row has no netstack round to meet.
        let userspace = row(
            Kind::Userspace,
            &[(1, 3.0, 1.0), (2, 2.0, 1.0), (3, 0.5, 1.0)],
        );
        assert_eq!(
            per_round(&userspace, &kernel, Sample::gbits),
            [0.75, 0.5, 0.25]
        );
        assert_eq!(
            per_round(&userspace, &netstack, Sample::gbit_per_cpu),
            [3.0, 2.0]
        );
        let o = parse_options(&["--quick".into()]).unwrap();
        let text = markdown(&[kernel, userspace, netstack, onetun], &o, 100, "Measured.");
        let line = |start: &str| {
            text.lines()
                .find(|l| l.starts_with(start))
                .unwrap_or_else(|| panic!("no line {start} in\n{text}"))
                .to_string()
        };
        assert!(line("| TCP Gbit/s, against the kernel path").ends_with("| met |"));
        assert!(line("| Gbit per CPU-second, against wireguard-go").contains("2.50×"));
        assert!(line("| Gbit per CPU-second, against onetun").ends_with("| met |"));

        let pending = contender(Kind::Userspace, "u", Err("not built in this tree".into()));
        let mut kernel = row(Kind::Kernel, &[(1, 4.0, 2.0)]);
        kernel
            .failures
            .push((2, "connection 63: no echo | within 10 s".into()));
        let text = markdown(&[kernel, pending], &o, 100, "Measured.");
        assert_eq!(text.matches("pending: not built").count(), 4, "{text}");
        assert!(text.contains("| u | not built in this tree |"));
        assert!(text.contains("| Kernel | 1 of 2 | 4.00 Gbit/s |"), "{text}");
        assert!(
            text.contains("- Kernel, round 2: connection 63: no echo \\| within 10 s"),
            "{text}"
        );
    }

    #[test]
    fn the_go_client_pins_the_wireguard_go_the_bench_builds() {
        use crate::bench::WIREGUARD_GO_MODULE;
        let root = system::repo_root().unwrap();
        let go_mod = fs::read_to_string(root.join(NETSTACK_SOURCE).join("go.mod")).unwrap();
        let (module, version) = WIREGUARD_GO_MODULE.split_once('@').unwrap();
        assert!(
            go_mod.contains(&format!("{module} {version}")),
            "{NETSTACK_SOURCE}/go.mod must require {WIREGUARD_GO_MODULE}"
        );
    }
}
