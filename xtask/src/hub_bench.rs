//! `cargo xtask bench-hub`: a hub with N peers (issue 39), tunneld beside wireguard-go in
//! interleaved rounds, each round in fresh namespaces. Per hub and N:
//!
//! - **setconf**: `wg setconf` of N peers (each allowed one /32) on a bare interface
//!   (`tunneld IF` / `wireguard-go IF`), wall time;
//! - **up with routes**: from starting the hub to its UAPI answering with N peers and their
//!   N routes in the kernel: for tunneld, `tunneld up` of a config with N peers (its routes
//!   installed in netlink batches); for wireguard-go, `wireguard-go IF`, `wg setconf`, the
//!   address and link, and the N routes by one `ip -batch` (what a script does best);
//! - **dump**: `wg show IF dump` of the N peers, wall time (median of 3);
//! - **RSS per peer**: the hub's resident memory after setconf less before, over N;
//! - **restart storm**: N spokes (`crates/cli/tests/spokes`, the CI test's generator: real
//!   WireGuard initiators, one socket each, 256 source addresses, all starting within one
//!   second, or with `--spread 0` all at once, keeping cookies for their retransmission 5 s
//!   later) against the freshly
//!   configured hub: the time until every spoke's echo came back through its new session,
//!   the initiations sent beyond one per spoke, the cookie replies, and the hub's CPU time
//!   over the storm per confirmed handshake.
//!
//! `--baseline PATH` adds a third hub, another build of tunneld (e.g. main's), in the same
//! interleaved rounds, for a before and after.
//!
//! The generator runs in this process, on the same 2 cores as the hub: its CPU is not the
//! hub's, but it competes for the machine in both rows alike. Writes
//! target/bench-report/hub-report.md.

use crate::report::{self, cell, median, Table};
use crate::system;
use crate::testbed::{cpu_seconds, rss_kib};
use std::fmt::Write as _;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tunneld_crypto::PrivateKey;
use tunneld_testnet::{require_netns, unique_name, NetNs};

#[path = "../../crates/cli/tests/spokes/mod.rs"]
mod spokes;
use spokes::{hub_setconf, spoke_ip, Spokes};

const LISTEN_PORT: u16 = 51820;
/// Longest one storm may run; spokes not back by then count as not confirmed.
const STORM_DEADLINE: Duration = Duration::from_secs(120);
/// Longest a control-plane command (setconf, dump, route batch) may take.
const COMMAND_LIMIT: Duration = Duration::from_secs(600);

#[derive(Clone)]
enum Hub {
    /// A tunneld binary and its name in the report (this build, or `--baseline`'s).
    Tunneld(PathBuf, &'static str),
    WireguardGo(PathBuf),
}

impl Hub {
    fn name(&self) -> &'static str {
        match self {
            Hub::Tunneld(_, name) => name,
            Hub::WireguardGo(_) => "wireguard-go",
        }
    }
    fn bin(&self) -> &Path {
        match self {
            Hub::Tunneld(b, _) | Hub::WireguardGo(b) => b,
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Sample {
    setconf_s: f64,
    up_s: f64,
    dump_s: f64,
    rss_per_peer_kib: f64,
    storm_s: f64,
    /// Spokes in the storm: all the peers, or as many as the limit of open files allows.
    stormed: usize,
    confirmed: usize,
    retransmissions: f64,
    cookie_replies: f64,
    cpu_per_handshake_ms: f64,
}

struct Options {
    peers: Vec<usize>,
    rounds: usize,
    quick: bool,
    update_docs: bool,
    /// Leave out the `tunneld up` measurement (it needs the N routes in the kernel).
    no_up: bool,
    /// Over how long the storm's spokes start (zero: all at once).
    spread: Duration,
    /// Another tunneld binary to measure beside this build's.
    baseline: Option<PathBuf>,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        peers: vec![1_000, 10_000, 100_000],
        rounds: 3,
        quick: false,
        update_docs: false,
        no_up: false,
        spread: Duration::from_secs(1),
        baseline: None,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => o.quick = true,
            "--update-docs" => o.update_docs = true,
            "--no-up" => o.no_up = true,
            "--spread" => {
                o.spread = it
                    .next()
                    .and_then(|v| v.parse::<f64>().ok())
                    .filter(|v| v.is_finite() && (0.0..=60.0).contains(v))
                    .map(Duration::from_secs_f64)
                    .ok_or("--spread takes seconds from 0 (all at once) to 60")?;
            }
            "--baseline" => {
                let path = PathBuf::from(it.next().ok_or("--baseline takes a tunneld binary")?);
                if !path.is_file() {
                    return Err(format!("--baseline: no such file: {}", path.display()));
                }
                // Absolute: the hubs run from other directories.
                o.baseline = Some(
                    fs::canonicalize(&path)
                        .map_err(|e| format!("--baseline {}: {e}", path.display()))?,
                );
            }
            "--rounds" => {
                o.rounds = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|v| *v > 0)
                    .ok_or("--rounds takes a positive number")?;
            }
            "--peers" => {
                let list = it
                    .next()
                    .ok_or("--peers takes a comma-separated list of peer counts")?;
                o.peers = list
                    .split(',')
                    .map(|v| v.trim().replace('_', "").parse::<usize>())
                    .collect::<Result<_, _>>()
                    .map_err(|_| format!("--peers: not a list of numbers: {list}"))?;
                if o.peers.iter().any(|&n| n == 0 || n > 1 << 20) {
                    return Err("--peers: each count must be 1 to 1 048 576".into());
                }
            }
            other => return Err(format!("bench-hub: unknown option {other}")),
        }
    }
    if o.quick {
        o.peers = vec![200];
        o.rounds = 1;
        o.update_docs = false;
    }
    Ok(o)
}

pub fn run(args: &[String]) -> Result<(), String> {
    let options = parse(args)?;
    if cfg!(debug_assertions) {
        // The spokes' handshakes run in this process: a debug build would make the
        // generator, not the hub, the bottleneck. Run again as a release build.
        let root = system::repo_root()?;
        eprintln!("==> bench-hub runs its spokes in a release build of xtask");
        let status = Command::new(system::cargo())
            .args(["run", "--release", "-q", "-p", "xtask", "--", "bench-hub"])
            .args(args)
            .current_dir(&root)
            .status()
            .map_err(|e| format!("cannot run cargo: {e}"))?;
        return if status.success() {
            Ok(())
        } else {
            Err(format!("bench-hub (release build): {status}"))
        };
    }
    if !require_netns("bench-hub") {
        return Err("bench-hub needs root and network namespaces".into());
    }
    system::install_tools()?;
    let tunneld = system::build_tunneld()?;
    let root = system::repo_root()?;
    let wireguard_go = crate::bench::build_wireguard_go(&root.join("target/bench-tools"))
        .map(|bin| (bin, "wireguard-go v0.0.20250522 (Go module build)"))
        .or_else(|e| {
            eprintln!("bench-hub: {e}; using the Debian package's wireguard-go");
            system::which("wireguard-go")
                .map(|bin| (bin, "wireguard-go (Debian package)"))
                .ok_or_else(|| "no wireguard-go to compare with".to_string())
        })?;
    let mut hubs = vec![Hub::Tunneld(tunneld, "tunneld")];
    if let Some(baseline) = &options.baseline {
        hubs.push(Hub::Tunneld(baseline.clone(), "tunneld (baseline)"));
    }
    hubs.push(Hub::WireguardGo(wireguard_go.0.clone()));

    let mut results: Vec<(usize, &'static str, Vec<Sample>, Option<String>)> = Vec::new();
    for &n in &options.peers {
        eprintln!("==> {n} spokes: making their keys");
        let spokes = Arc::new(Spokes::new(n));
        let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); hubs.len()];
        // A hub that fails a round (wireguard-go refuses more than 65 536 peers) keeps its
        // first error in the report; the other hubs go on.
        let mut failed: Vec<Option<String>> = vec![None; hubs.len()];
        for round in 0..options.rounds {
            for (h, hub) in hubs.iter().enumerate() {
                system::check_interrupted()?;
                if failed[h].is_some() {
                    continue;
                }
                eprintln!("==> {n} peers, round {}, {}", round + 1, hub.name());
                match measure(hub, n, &spokes, &options) {
                    Ok(sample) => {
                        eprintln!("    {sample:?}");
                        samples[h].push(sample);
                    }
                    Err(e) => {
                        eprintln!("    failed: {e}");
                        failed[h] = Some(e);
                    }
                }
            }
        }
        for ((hub, s), failure) in hubs.iter().zip(samples).zip(failed) {
            results.push((n, hub.name(), s, failure));
        }
    }

    let markdown = render(&options, args, &results, wireguard_go.1);
    report::write(
        &system::target_dir(&root).join("bench-report"),
        "hub-report.md",
        &markdown,
    )?;
    if options.update_docs {
        report::update_front_page(&root, "hub", &markdown)?;
    }
    Ok(())
}

fn render(
    options: &Options,
    args: &[String],
    results: &[(usize, &'static str, Vec<Sample>, Option<String>)],
    wireguard_go: &str,
) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "{}", report::measured_line("bench-hub", args));
    let start = if options.spread.is_zero() {
        "all starting at once".to_string()
    } else {
        format!("all starting within {} s", options.spread.as_secs_f64())
    };
    let baseline = options.baseline.as_ref().map_or(String::new(), |_| {
        " \"tunneld (baseline)\" is the binary given by `--baseline` (another build).".into()
    });
    let _ = writeln!(
        md,
        "\nMedians of {} interleaved rounds (tunneld, wireguard-go, tunneld, …), each in fresh \
         namespaces; wireguard-go is {wireguard_go}.{baseline} The restart storm: every spoke a \
         real WireGuard initiator (one socket each, 256 source addresses, {start}), \
         run by this process on the same cores; \"confirmed\" is a spoke's ICMP echo back \
         through its new session, of the spokes that stormed (a spoke is a socket: past the \
         open-files limit, {} here, the first that many peers storm and the rest stay \
         configured). CPU per handshake: the hub's CPU time over the storm / sessions \
         confirmed.\n",
        options.rounds,
        spokes::max_spokes()
    );
    let mut table = Table::new(&[
        "peers",
        "hub",
        "`wg setconf`",
        "up with routes",
        "`wg show dump`",
        "RSS per peer",
        "storm: all confirmed",
        "confirmed",
        "retransmissions",
        "cookie replies",
        "hub CPU per handshake",
    ]);
    for (n, hub, samples, failure) in results {
        if let Some(why) = failure {
            table.note(&format!("{n} {hub}"), &format!("failed: {why}"));
            continue;
        }
        let m = |f: fn(&Sample) -> f64| median(samples.iter().map(f).collect());
        let confirmed = samples.iter().map(|s| s.confirmed).min().unwrap_or(0);
        let stormed = samples.iter().map(|s| s.stormed).min().unwrap_or(0);
        table.row(&[
            format!("{n}"),
            (*hub).to_string(),
            cell(m(|s| s.setconf_s), 2, " s"),
            if options.no_up {
                "–".into()
            } else {
                cell(m(|s| s.up_s), 2, " s")
            },
            cell(m(|s| s.dump_s), 3, " s"),
            cell(m(|s| s.rss_per_peer_kib), 1, " KiB"),
            cell(m(|s| s.storm_s), 1, " s"),
            format!("{confirmed} of {stormed}"),
            cell(m(|s| s.retransmissions), 0, ""),
            cell(m(|s| s.cookie_replies), 0, ""),
            cell(m(|s| s.cpu_per_handshake_ms), 3, " ms"),
        ]);
    }
    md.push_str(table.render());
    md
}

/// Runs `argv` in `ns` within [`COMMAND_LIMIT`]; an error with its stderr when it fails.
fn run_in(ns: &NetNs, argv: &[&str]) -> Result<String, String> {
    let out = system::output_within(ns.command(argv[0]).args(&argv[1..]), COMMAND_LIMIT)?;
    if !out.status.success() {
        return Err(format!(
            "{} {} ({}) {}",
            argv[0],
            argv.get(1).copied().unwrap_or(""),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ip -batch -` in `ns` with `commands` on its stdin.
fn ip_batch(ns: &NetNs, commands: &str) -> Result<(), String> {
    let out = system::output_with_input(
        ns.command("ip").args(["-batch", "-"]),
        commands.as_bytes(),
        COMMAND_LIMIT,
    )?;
    if !out.status.success() {
        return Err(format!(
            "ip -batch failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// The pid of the process serving `ifname` (its command line ends with the name).
fn pid_of(ifname: &str) -> Result<u32, String> {
    let out = Command::new("pgrep")
        .args(["-f", &format!(" {ifname}$")])
        .output()
        .map_err(|e| format!("pgrep: {e}"))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .max()
        .ok_or_else(|| format!("no process serves {ifname}"))
}

/// Stops the hub (SIGTERM, then SIGKILL after 5 s) and removes its interface.
fn stop(ns: &NetNs, pid: u32, ifname: &str) {
    // SAFETY: kill sends a signal to a process this bench started.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: as above.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let _ = ns.output(&["ip", "link", "del", ifname]);
    let _ = fs::remove_file(format!("/var/run/wireguard/{ifname}.sock"));
}

fn measure(hub: &Hub, n: usize, spokes: &Arc<Spokes>, options: &Options) -> Result<Sample, String> {
    let mut sample = Sample::default();
    let dir = std::env::temp_dir().join(unique_name("bench-hub"));
    fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let result = measure_in(hub, n, spokes, options, &dir, &mut sample);
    let _ = fs::remove_dir_all(&dir);
    result.map(|()| sample)
}

fn measure_in(
    hub: &Hub,
    n: usize,
    spokes: &Arc<Spokes>,
    options: &Options,
    dir: &Path,
    sample: &mut Sample,
) -> Result<(), String> {
    let hub_key = PrivateKey::generate();
    let publics = spokes.public_keys();
    let conf = dir.join("hub.conf");
    fs::write(&conf, hub_setconf(&hub_key, LISTEN_PORT, &publics))
        .map_err(|e| format!("{}: {e}", conf.display()))?;
    let conf_path = conf.to_string_lossy().into_owned();

    if !options.no_up {
        sample.up_s = up_with_routes(hub, n, &hub_key, &publics, dir, &conf_path)?;
    }

    let hub_ns = NetNs::new();
    let spokes_ns = NetNs::new();
    tunneld_testnet::hub_and_spokes(&hub_ns, &spokes_ns);

    let ifname = unique_name("hub");
    let bin = hub.bin().to_string_lossy().into_owned();
    run_in(&hub_ns, &[&bin, &ifname])?;
    let pid = pid_of(&ifname)?;
    let result = (|| {
        run_in(
            &hub_ns,
            &["ip", "addr", "add", "10.0.0.1/8", "dev", &ifname],
        )?;
        run_in(&hub_ns, &["ip", "link", "set", &ifname, "up"])?;
        let rss_before = rss_kib(pid).map_or(f64::NAN, |k| k as f64);
        let started = Instant::now();
        run_in(&hub_ns, &["wg", "setconf", &ifname, &conf_path])?;
        sample.setconf_s = started.elapsed().as_secs_f64();
        sample.rss_per_peer_kib =
            (rss_kib(pid).map_or(f64::NAN, |k| k as f64) - rss_before) / n as f64;
        let mut dumps = Vec::new();
        for _ in 0..3 {
            let started = Instant::now();
            let dump = run_in(&hub_ns, &["wg", "show", &ifname, "dump"])?;
            dumps.push(started.elapsed().as_secs_f64());
            let lines = dump.lines().count();
            if lines != n + 1 {
                return Err(format!("wg show dump gave {lines} lines for {n} peers"));
            }
        }
        sample.dump_s = median(dumps);

        let cpu_before = cpu_seconds(&[pid]);
        let spokes = spokes.clone();
        let hub_public = hub_key.public_key();
        // A spoke is a socket: past the open-files limit, the first that many of the peers
        // storm (the rest stay configured and idle).
        let count = n.min(spokes::max_spokes());
        sample.stormed = count;
        let spread = options.spread;
        let report = spokes_ns.in_ns(move || {
            spokes.storm(
                count,
                hub_public,
                SocketAddr::from(([192, 0, 2, 1], LISTEN_PORT)),
                &tunneld_testnet::spoke_source_addresses(),
                spread,
                STORM_DEADLINE,
            )
        });
        let cpu = cpu_seconds(&[pid]) - cpu_before;
        if spread.is_zero() {
            eprintln!(
                "    every spoke's first initiation made in {:.2} s, then all sent at once",
                report.prepared.as_secs_f64()
            );
        }
        if let Some(e) = &report.error {
            return Err(format!("the storm stopped: {e}"));
        }
        if report.confirmed < count {
            eprintln!("    the spokes' own drops: {:?}", report.spoke_drops);
            // What the hub says of itself, to tell a lost datagram from a refused one.
            if let Hub::Tunneld(bin, _) = hub {
                let bin = bin.to_string_lossy().into_owned();
                let show = run_in(&hub_ns, &[&bin, "show", &ifname]).unwrap_or_else(|e| e);
                // The interface and its workers' counters, not every peer.
                let lines: Vec<&str> = show.lines().collect();
                let show = lines
                    .iter()
                    .take(4)
                    .chain(lines.iter().skip(lines.len().saturating_sub(40)))
                    .copied()
                    .collect::<Vec<_>>()
                    .join("\n");
                eprintln!(
                    "    {} of {count} confirmed; the hub:\n{show}",
                    report.confirmed
                );
            }
        }
        sample.storm_s = report.took.as_secs_f64();
        sample.confirmed = report.confirmed;
        sample.retransmissions = report.retransmissions as f64;
        sample.cookie_replies = report.cookie_replies as f64;
        sample.cpu_per_handshake_ms = cpu * 1000.0 / report.confirmed.max(1) as f64;
        Ok(())
    })();
    stop(&hub_ns, pid, &ifname);
    result
}

/// Seconds from starting the hub to its UAPI answering with `n` peers and their `n`
/// routes in the kernel.
fn up_with_routes(
    hub: &Hub,
    n: usize,
    hub_key: &PrivateKey,
    publics: &[tunneld_crypto::PublicKey],
    dir: &Path,
    conf_path: &str,
) -> Result<f64, String> {
    let ns = NetNs::new();
    let ifname = unique_name("up");
    let bin = hub.bin().to_string_lossy().into_owned();
    let started;
    let mut child = None;
    match hub {
        Hub::Tunneld(..) => {
            let key_file = dir.join("hub.key");
            fs::write(&key_file, format!("{}\n", &*hub_key.to_base64()))
                .map_err(|e| format!("{}: {e}", key_file.display()))?;
            let mut toml = format!(
                "[interface]\nname = \"{ifname}\"\nprivate_key_file = \"{}\"\n\
                 listen_port = {LISTEN_PORT}\naddress = [\"10.0.0.1/32\"]\n",
                key_file.display()
            );
            for (i, key) in publics.iter().enumerate() {
                let _ = write!(
                    toml,
                    "\n[[peer]]\npublic_key = \"{}\"\nallowed_ips = [\"{}/32\"]\n",
                    key.to_base64(),
                    spoke_ip(i)
                );
            }
            let config = dir.join("hub.toml");
            fs::write(&config, toml).map_err(|e| format!("{}: {e}", config.display()))?;
            use std::os::unix::fs::PermissionsExt;
            let _ = fs::set_permissions(&key_file, fs::Permissions::from_mode(0o600));
            started = Instant::now();
            child = Some(
                ns.command(&bin)
                    .args(["up", &config.to_string_lossy()])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .map_err(|e| format!("tunneld up: {e}"))?,
            );
            let deadline = started + COMMAND_LIMIT;
            loop {
                let out = ns.output(&["wg", "show", &ifname, "peers"]);
                if out.status.success() && out.stdout.iter().filter(|&&b| b == b'\n').count() == n {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!("tunneld up of {n} peers not answering"));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        Hub::WireguardGo(_) => {
            started = Instant::now();
            run_in(&ns, &[&bin, &ifname])?;
            run_in(&ns, &["wg", "setconf", &ifname, conf_path])?;
            run_in(&ns, &["ip", "addr", "add", "10.0.0.1/32", "dev", &ifname])?;
            run_in(&ns, &["ip", "link", "set", &ifname, "up"])?;
            let mut batch = String::with_capacity(n * 40);
            for i in 0..n {
                let _ = writeln!(batch, "route add {}/32 dev {ifname}", spoke_ip(i));
            }
            ip_batch(&ns, &batch)?;
        }
    }
    let took = started.elapsed().as_secs_f64();
    let routes = run_in(&ns, &["ip", "-4", "route", "show", "dev", &ifname])?;
    let count = routes.lines().filter(|l| l.starts_with("10.")).count();
    match &mut child {
        // tunneld up: SIGTERM, its clean teardown (interface, routes, UAPI socket).
        Some(child) => {
            // SAFETY: kill sends a signal to this bench's own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        None => {
            if let Ok(pid) = pid_of(&ifname) {
                stop(&ns, pid, &ifname);
            }
        }
    }
    if count < n {
        return Err(format!(
            "{}: {count} routes in the kernel for {n} peers",
            hub.name()
        ));
    }
    Ok(took)
}
