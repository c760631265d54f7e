//! `cargo xtask bench-fleet-scale`: the fleet's full mesh at N sites (default 50 and 200),
//! one `tunneld up` gateway per site, each in a namespace of its own on one routed
//! underlay (198.51.100.0/24), on a three-member etcd cluster with TLS (as the fleet runs in
//! production and as `bench-fleet` runs it; a fresh cluster for each N, so that its memory
//! is that N's).
//!
//! For each N:
//! - the mesh: N gateways started one after the other; the time from the last one's start
//!   until every one has its N − 1 peers (each gateway's last "peer added" log line);
//! - a new site: site N + 1 started on the steady mesh; per gateway, the time until it added
//!   the newcomer with its subnet (its log line), the newcomer's own time to its N peers,
//!   pings from the newcomer to a sample of sites (time to the first reply), and what the
//!   change cost: etcd events sent to watchers, the gateways' CPU;
//! - at rest: etcd requests per gateway per minute (gRPC messages the members received, by
//!   method, from their metrics), the watchers, a gateway's CPU; resident memory of the
//!   gateways (median, max) and of each etcd member, per site.
//!
//! From two sizes, the slopes, and what they give at 10 000 sites.

use crate::fleet_bench::{http_get, stacks, unix_now, Fleet, Gateway, Spec};
use crate::report::{self, cell, median, percentile, Table};
use crate::system;
use crate::testbed::{cpu_seconds, rss_kib};
use std::collections::BTreeMap;
use std::fs;
use std::io::{Read as _, Write as _};
use std::path::Path;
use std::time::{Duration, Instant};
use tunneld_testnet::etcd::{logged_after, ping_reply_times, Cluster, Underlay};
use tunneld_testnet::{unique_name, NetNs};

/// The largest N the address plan holds: gateways at 198.51.100.10 + i, the newcomer at .250.
const MAX_SITES: usize = 240;
const MEMBERS: [&str; 3] = ["198.51.100.2", "198.51.100.3", "198.51.100.4"];
const NEWCOMER_UNDERLAY: &str = "198.51.100.250";
/// The newcomer's subnet; site i's is 10.100.i.0/24.
const NEWCOMER_SUBNET: &str = "10.101.0.0/24";
/// Sites the newcomer pings.
const PING_SAMPLE: usize = 10;
/// The gateways' lease TTL unless `--lease-ttl` says otherwise: longer than the fleet's
/// default (3 s), as at N = 200 on two shared cores the default's keep-alives (every second,
/// each answered within 1.5 s) starve: leases lapse, every other gateway drops and re-adds
/// the site, and that load makes more lapse (the mesh never settled in 160 s).
const LEASE_TTL: u16 = 10;
/// The extrapolation's size.
const TARGET: f64 = 10_000.0;

struct Options {
    sizes: Vec<usize>,
    rest_seconds: u64,
    lease_ttl: u16,
    update_docs: bool,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        sizes: vec![50, 200],
        rest_seconds: 60,
        lease_ttl: LEASE_TTL,
        update_docs: false,
    };
    let mut quick = false;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => {
                quick = true;
                o.sizes = vec![20];
                o.rest_seconds = 5;
            }
            "--update-docs" => o.update_docs = true,
            "--sizes" => {
                o.sizes = it
                    .next()
                    .map(|v| v.split(',').map(|n| n.trim().parse().ok()).collect())
                    .and_then(|v: Option<Vec<usize>>| v)
                    .filter(|v| !v.is_empty() && v.iter().all(|n| (2..=MAX_SITES).contains(n)))
                    .ok_or(format!(
                        "--sizes takes numbers 2-{MAX_SITES}, comma-separated"
                    ))?
            }
            "--rest" => {
                o.rest_seconds = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|n| (1..=300).contains(n))
                    .ok_or("--rest takes seconds, 1-300")?
            }
            "--lease-ttl" => {
                let range = tunneld_config::MIN_LEASE_TTL..=tunneld_config::MAX_LEASE_TTL;
                o.lease_ttl = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|n| range.contains(n))
                    .ok_or(format!(
                        "--lease-ttl takes seconds, {}-{}",
                        range.start(),
                        range.end()
                    ))?
            }
            other => return Err(format!("bench-fleet-scale: unknown option {other:?}")),
        }
    }
    if quick && o.update_docs {
        return Err("--update-docs takes a full run, not --quick".into());
    }
    Ok(o)
}

pub fn run(args: &[String]) -> Result<(), String> {
    let options = parse(args)?;
    if let Some(why) = tunneld_testnet::netns_unusable() {
        return Err(format!("bench-fleet-scale needs network namespaces: {why}"));
    }
    system::install_tools()?;
    let tunneld = system::build_tunneld()?;
    let dir = std::env::temp_dir().join(unique_name("fleets"));
    fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let began = Instant::now();
    let result = (|| {
        let _sysctls = Sysctls::raise(&NEIGHBOUR_TABLE)?;
        let mut sizes = Vec::new();
        for &n in &options.sizes {
            sizes.push(measure(&tunneld, &dir, n, &options)?);
        }
        Ok::<_, String>(sizes)
    })();
    // FLEET_BENCH_KEEP=1 keeps the gateways' configs and logs, to read after a run.
    if std::env::var_os("FLEET_BENCH_KEEP").is_none() {
        let _ = fs::remove_dir_all(&dir);
    }
    let sizes = result?;
    let markdown = format!(
        "{}\n\n{}",
        report::measured_line("bench-fleet-scale", args),
        render(&sizes, options.lease_ttl, began.elapsed())
    );
    let root = system::repo_root()?;
    let report_dir = system::target_dir(&root).join("bench-report");
    report::write(&report_dir, "fleet-scale-report.md", &markdown)?;
    if options.update_docs {
        report::update_front_page(&root, "fleet-scale", &markdown)?;
    }
    Ok(())
}

/// The kernel's neighbour table is one for all namespaces: the router's N entries, each
/// host's one, and what else runs on the machine, past the default soft limit (512) that
/// starts forced garbage collection. Raised for the bench, restored after.
const NEIGHBOUR_TABLE: [(&str, u64); 3] = [
    ("/proc/sys/net/ipv4/neigh/default/gc_thresh1", 1024),
    ("/proc/sys/net/ipv4/neigh/default/gc_thresh2", 4096),
    ("/proc/sys/net/ipv4/neigh/default/gc_thresh3", 8192),
];

/// Sysctls raised to at least a value while this lives; restored when dropped.
struct Sysctls(Vec<(&'static str, String)>);

impl Sysctls {
    fn raise(wanted: &[(&'static str, u64)]) -> Result<Sysctls, String> {
        let mut saved = Sysctls(Vec::new());
        for &(path, value) in wanted {
            let old = fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
            if old.trim().parse::<u64>().is_ok_and(|v| v >= value) {
                continue;
            }
            fs::write(path, value.to_string()).map_err(|e| format!("{path}: {e}"))?;
            saved.0.push((path, old.trim().to_string()));
        }
        Ok(saved)
    }
}

impl Drop for Sysctls {
    fn drop(&mut self) {
        // In reverse: gc_thresh1 <= 2 <= 3 holds at every step.
        for (path, old) in self.0.iter().rev() {
            let _ = fs::write(path, old);
        }
    }
}

/// What one size gave.
struct Size {
    n: usize,
    /// Seconds from starting the gateways one after the other to the last one started.
    start_all: f64,
    /// Per gateway: seconds from the last gateway's start to its own N − 1 peers.
    mesh: Vec<f64>,
    /// Per gateway: seconds from the newcomer's start to its peer for the new site.
    join: Vec<f64>,
    /// Seconds until the newcomer had its N peers.
    newcomer_full: f64,
    /// Per sampled site: seconds from the newcomer's start to a ping's first reply.
    pings: Vec<f64>,
    /// Over the join: etcd events sent to watchers, watch responses sent, the gateways' CPU
    /// seconds (all N, the newcomer excluded).
    join_events: f64,
    join_watch_responses: f64,
    join_cpu: f64,
    /// Reconciles per gateway: from its start to the full mesh, and for the new site.
    mesh_reconciles: f64,
    join_reconciles: f64,
    /// Peers removed in the whole run (a gateway whose lease lapsed under load), summed.
    removed: usize,
    rest: Rest,
}

struct Rest {
    seconds: f64,
    gateways: usize,
    /// gRPC messages the members received, per method, over the rest.
    received: BTreeMap<String, f64>,
    /// Watchers and watch streams on the members (summed), at the end.
    watchers: f64,
    watch_streams: f64,
    /// Events etcd sent to watchers over the rest.
    events: f64,
    /// CPU seconds of a gateway per minute (the mean), and of etcd (all members).
    gateway_cpu_per_minute: f64,
    etcd_cpu_per_minute: f64,
    /// KiB.
    gateway_rss: Vec<f64>,
    /// Bytes, per member.
    etcd_rss: Vec<f64>,
    /// Keys under the fleet's prefix and etcd's database size (bytes, the largest member).
    db_size: f64,
}

/// A steady mesh of `n` sites, then one more; the fleet at rest. Everything it made is gone
/// when it returns, on success or failure.
fn measure(tunneld: &Path, dir: &Path, n: usize, options: &Options) -> Result<Size, String> {
    let rest_seconds = options.rest_seconds;
    eprintln!("==> {n} sites: etcd, three members with TLS");
    let wan = Underlay::new("198.51.100.1/24");
    let cluster = Cluster::start(&wan, &MEMBERS, true);
    let fleet = Fleet {
        tunneld,
        dir,
        cluster: &cluster,
        lease_ttl: Some(options.lease_ttl),
    };
    let prefix = format!("/tunneld/scale-{n}");
    raise_priority(&cluster)?;
    let mut namespaces = Vec::new();
    let mut gateways = Gateways(Vec::new());
    eprintln!("==> {n} sites: starting the gateways");
    let first_start = Instant::now();
    let mut last_start = unix_now();
    for i in 0..n {
        system::check_interrupted()?;
        let underlay = format!("198.51.100.{}", 10 + i);
        let ns = wan.host(&format!("{underlay}/24"));
        last_start = unix_now();
        let g = fleet.gateway(
            &ns,
            Some(&prefix),
            Spec {
                underlay: &underlay,
                site: &format!("s{i}"),
                gateway: "g",
                address: Some(&format!("10.100.{i}.1/32")),
                subnet: &format!("10.100.{i}.0/24"),
                mode: None,
            },
        )?;
        namespaces.push(ns);
        gateways.push(g);
    }
    let start_all = first_start.elapsed().as_secs_f64();
    eprintln!("    started in {start_all:.1} s; waiting for the full mesh");
    // Bounded, with room for a loaded machine: at N = 200 the cold start's mesh has taken
    // two minutes on two shared cores.
    let limit = Duration::from_secs(60 + n as u64);
    wait_until(limit, || {
        Ok(gateways
            .iter()
            .all(|g| peers(&g.ifname).is_ok_and(|p| routed(&p) == n - 1)))
    })
    .map_err(|e| short_of_peers(&gateways, n - 1, &format!("the mesh of {n}: {e}")))?;
    let complete = unix_now() - last_start;
    let mesh_reconciles = reconciles(&gateways) / n as f64;
    // Each gateway's mesh was complete at its last peer change before it was seen complete.
    let mesh: Vec<f64> = gateways
        .iter()
        .map(|g| last_peer_change(&g.log_text(), last_start, complete))
        .collect();
    eprintln!(
        "    full mesh {:.2} s after the last start",
        mesh.iter().copied().fold(f64::NAN, f64::max)
    );
    std::thread::sleep(Duration::from_secs(2));

    eprintln!("==> {n} sites: one more");
    let pids: Vec<u32> = gateways.iter().filter_map(Gateway::pid).collect();
    let before = Metrics::read(&cluster, &wan.ns)?;
    let cpu_before = cpu_seconds(&pids);
    let reconciles_before = reconciles(&gateways);
    let new_ns = wan.host(&format!("{NEWCOMER_UNDERLAY}/24"));
    let t0 = unix_now();
    let newcomer = fleet.gateway(
        &new_ns,
        Some(&prefix),
        Spec {
            underlay: NEWCOMER_UNDERLAY,
            site: "new",
            gateway: "g",
            address: Some("10.101.0.1/32"),
            subnet: NEWCOMER_SUBNET,
            mode: None,
        },
    )?;
    // Pings from the newcomer to sites spread over the mesh, each until its first reply.
    let sample: Vec<usize> = (0..PING_SAMPLE.min(n))
        .map(|k| k * n / PING_SAMPLE.min(n))
        .collect();
    let pingers = std::thread::spawn({
        let ns = new_ns.name().to_string();
        move || first_replies(&ns, &sample, t0)
    });
    let key = public_key_of(dir, &newcomer.ifname)?;
    let added = |g: &Gateway| routed_at(&g.log_text(), &key, t0);
    wait_until(Duration::from_secs(30), || {
        Ok(gateways.iter().all(|g| added(g).is_some()))
    })
    .map_err(|e| {
        let late = gateways.iter().find(|g| added(g).is_none());
        format!(
            "the new site: not every gateway added it: {e}\n{}",
            late.map(Gateway::log_text).unwrap_or_default()
        )
    })?;
    let join: Vec<f64> = gateways.iter().filter_map(added).collect();
    // The store's view, checked where it routes: every gateway has the peer with the subnet.
    for g in gateways.iter() {
        let has = peers(&g.ifname)?
            .iter()
            .any(|(_, ips)| ips.iter().any(|ip| ip == NEWCOMER_SUBNET));
        if !has {
            return Err(format!(
                "{} logged the new site's peer but has no peer for {NEWCOMER_SUBNET}",
                g.ifname
            ));
        }
    }
    wait_until(Duration::from_secs(30), || {
        Ok(routed(&peers(&newcomer.ifname)?) == n)
    })
    .map_err(|e| format!("the newcomer's own peers: {e}\n{}", newcomer.log_text()))?;
    let newcomer_full = last_peer_change(&newcomer.log_text(), t0, unix_now() - t0);
    let pings = pingers
        .join()
        .map_err(|_| "the pings' thread panicked".to_string())?
        .map_err(|e| {
            format!(
                "{e}\n--- the new site's log ---\n{}\n{}",
                newcomer.log_text(),
                newcomer.pid().map(stacks).unwrap_or_default()
            )
        })?;
    // The wave's cost, taken once it has passed (the last ping answered).
    let after = Metrics::read(&cluster, &wan.ns)?;
    let join_cpu = cpu_seconds(&pids) - cpu_before;
    let join_reconciles = (reconciles(&gateways) - reconciles_before) / n as f64;
    eprintln!(
        "    every gateway had it after {:.3} s; pings answered after {:.3} s at the latest",
        join.iter().copied().fold(f64::NAN, f64::max),
        pings.iter().copied().fold(f64::NAN, f64::max)
    );
    gateways.push(newcomer);
    namespaces.push(new_ns);

    eprintln!("==> {n} sites: at rest for {rest_seconds} s");
    std::thread::sleep(Duration::from_secs(2));
    let rest = at_rest(&cluster, &wan.ns, &gateways, rest_seconds)?;
    let removed = gateways
        .iter()
        .map(|g| g.log_text().matches("peer removed").count())
        .sum();
    // The gateways (SIGTERM: they revoke their leases) before their namespaces and etcd; all
    // told at once, as each may take a while to reach a busy store.
    drop(gateways);
    drop(namespaces);
    drop(cluster);
    Ok(Size {
        n,
        start_all,
        mesh,
        join,
        newcomer_full,
        pings,
        join_events: after.sum("etcd_debugging_mvcc_events_total", None)
            - before.sum("etcd_debugging_mvcc_events_total", None),
        join_watch_responses: after.sum("grpc_server_msg_sent_total", Some("Watch"))
            - before.sum("grpc_server_msg_sent_total", Some("Watch")),
        join_cpu,
        mesh_reconciles,
        join_reconciles,
        removed,
        rest,
    })
}

fn at_rest(
    cluster: &Cluster,
    ns: &NetNs,
    gateways: &[Gateway],
    seconds: u64,
) -> Result<Rest, String> {
    let pids: Vec<u32> = gateways.iter().filter_map(Gateway::pid).collect();
    let before = Metrics::read(cluster, ns)?;
    let cpu_before = cpu_seconds(&pids);
    let t = Instant::now();
    let deadline = t + Duration::from_secs(seconds);
    while Instant::now() < deadline {
        system::check_interrupted()?;
        std::thread::sleep(Duration::from_millis(200));
    }
    let elapsed = t.elapsed().as_secs_f64();
    let cpu = cpu_seconds(&pids) - cpu_before;
    let after = Metrics::read(cluster, ns)?;
    let mut received = BTreeMap::new();
    for (method, v) in after.by_method("grpc_server_msg_received_total") {
        let was = before
            .by_method("grpc_server_msg_received_total")
            .get(&method)
            .copied()
            .unwrap_or(0.0);
        if v - was > 0.0 {
            received.insert(method, v - was);
        }
    }
    let per_minute = 60.0 / elapsed;
    Ok(Rest {
        seconds: elapsed,
        gateways: pids.len(),
        received,
        watchers: after.sum("etcd_debugging_mvcc_watcher_total", None),
        watch_streams: after.sum("etcd_debugging_mvcc_watch_stream_total", None),
        events: after.sum("etcd_debugging_mvcc_events_total", None)
            - before.sum("etcd_debugging_mvcc_events_total", None),
        gateway_cpu_per_minute: cpu / pids.len().max(1) as f64 * per_minute,
        etcd_cpu_per_minute: (after.sum("process_cpu_seconds_total", None)
            - before.sum("process_cpu_seconds_total", None))
            * per_minute,
        gateway_rss: pids
            .iter()
            .filter_map(|p| rss_kib(*p))
            .map(|k| k as f64)
            .collect(),
        etcd_rss: after
            .per_member
            .iter()
            .map(|m| value(m, "process_resident_memory_bytes", None))
            .collect(),
        db_size: after
            .per_member
            .iter()
            .map(|m| value(m, "etcd_mvcc_db_total_size_in_use_in_bytes", None))
            .fold(f64::NAN, f64::max),
    })
}

/// The gateways of a run, stopped together when dropped (SIGTERM to all, then each waited
/// for): one by one, each waiting on a busy store to revoke its lease, takes minutes at N =
/// 200.
struct Gateways(Vec<Gateway>);

impl std::ops::Deref for Gateways {
    type Target = Vec<Gateway>;
    fn deref(&self) -> &Vec<Gateway> {
        &self.0
    }
}

impl std::ops::DerefMut for Gateways {
    fn deref_mut(&mut self) -> &mut Vec<Gateway> {
        &mut self.0
    }
}

impl Drop for Gateways {
    fn drop(&mut self) {
        for pid in self.0.iter().filter_map(Gateway::pid) {
            // SAFETY: kill(2) on a child of this process that it has not reaped yet.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        self.0.clear();
    }
}

/// Runs etcd's members above the gateways' CPU priority (nice -10, every thread): in a fleet
/// the store has hosts of its own, and here it shares two cores with N gateways, which
/// would otherwise starve its Raft heartbeats (at N = 200, members lost their leader).
fn raise_priority(cluster: &Cluster) -> Result<(), String> {
    let dir = cluster
        .certs()
        .parent()
        .map(|d| format!("--data-dir={}/e", d.display()))
        .ok_or("the cluster has no directory")?;
    let mut raised = 0;
    for proc_entry in fs::read_dir("/proc").map_err(|e| e.to_string())?.flatten() {
        let cmdline = fs::read(proc_entry.path().join("cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmdline).contains(&dir) {
            continue;
        }
        for task in fs::read_dir(proc_entry.path().join("task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Some(tid) = task
                .file_name()
                .to_str()
                .and_then(|t| t.parse::<u32>().ok())
            {
                // SAFETY: setpriority on a thread id; no memory is passed.
                unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, -10) };
            }
        }
        raised += 1;
    }
    if raised != MEMBERS.len() {
        return Err(format!(
            "found {raised} etcd members to raise the priority of, not {}",
            MEMBERS.len()
        ));
    }
    Ok(())
}

/// Per site in `sample`, seconds from `event` (Unix time) to the first reply to a ping from
/// namespace `ns` to its gateway (10.100.i.1): a ping every 100 ms, started again when it
/// ends without a reply (at once when there is no route yet); 20 s at most.
fn first_replies(ns: &str, sample: &[usize], event: f64) -> Result<Vec<f64>, String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    std::thread::scope(|scope| {
        let pingers: Vec<_> = sample
            .iter()
            .map(|i| {
                let addr = format!("10.100.{i}.1");
                scope.spawn(move || {
                    let mut why = String::new();
                    while Instant::now() < deadline {
                        let out = std::process::Command::new("ip")
                            .args(["netns", "exec", ns, "ping", "-D", "-n", "-c", "1"])
                            .args(["-i", "0.1", "-w", "1", &addr])
                            .output()
                            .map_err(|e| format!("cannot run ping: {e}"))?;
                        if let Some(at) =
                            ping_reply_times(&String::from_utf8_lossy(&out.stdout)).first()
                        {
                            return Ok(at - event);
                        }
                        why = String::from_utf8_lossy(&out.stderr).trim().to_string();
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(format!("no reply from {addr} within 20 s ({why})"))
                })
            })
            .collect();
        pingers
            .into_iter()
            .map(|p| p.join().map_err(|_| "a ping thread panicked".to_string())?)
            .collect()
    })
}

/// Each member's Prometheus metrics text.
struct Metrics {
    per_member: Vec<String>,
}

impl Metrics {
    fn read(cluster: &Cluster, ns: &NetNs) -> Result<Metrics, String> {
        let mut per_member = Vec::new();
        for i in 0..cluster.len() {
            let url = cluster.metrics_url(i);
            let (host, path) = url
                .strip_prefix("http://")
                .and_then(|r| r.split_once('/'))
                .map(|(h, p)| (h.to_string(), format!("/{p}")))
                .ok_or("bad metrics URL")?;
            per_member.push(ns.in_ns(move || http_get(&host, &path))?);
        }
        Ok(Metrics { per_member })
    }

    /// `name` summed over the members (and its labels), only where `grpc_method` is
    /// `method` when one is given.
    fn sum(&self, name: &str, method: Option<&str>) -> f64 {
        self.per_member.iter().map(|m| value(m, name, method)).sum()
    }

    /// `name` summed over the members, per `grpc_method`.
    fn by_method(&self, name: &str) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for text in &self.per_member {
            for (labels, v) in samples(text, name) {
                let method = label(labels, "grpc_method").unwrap_or("?").to_string();
                *out.entry(method).or_insert(0.0) += v;
            }
        }
        out
    }
}

/// The samples of metric `name` in Prometheus text: (labels, value).
fn samples<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    text.lines().filter_map(move |l| {
        let rest = l.strip_prefix(name)?;
        let (labels, v) = match rest.strip_prefix('{') {
            Some(r) => r.split_once("} ")?,
            None => ("", rest.strip_prefix(' ')?),
        };
        Some((labels, v.trim().parse().ok()?))
    })
}

fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    labels.split(',').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| v.trim_matches('"'))
    })
}

fn value(text: &str, name: &str, method: Option<&str>) -> f64 {
    samples(text, name)
        .filter(|(labels, _)| method.is_none_or(|m| label(labels, "grpc_method") == Some(m)))
        .map(|(_, v)| v)
        .sum()
}

/// A gateway's answer to a UAPI request: `get=1` (its peers) or `fleet=1` (the fleet's
/// `fleet_*` lines).
fn uapi(ifname: &str, request: &str) -> Result<String, String> {
    let path = format!("/var/run/wireguard/{ifname}.sock");
    let mut s =
        std::os::unix::net::UnixStream::connect(&path).map_err(|e| format!("{path}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .and_then(|()| s.write_all(format!("{request}\n\n").as_bytes()))
        .map_err(|e| format!("{path}: {e}"))?;
    let mut text = String::new();
    let mut buf = [0u8; 64 * 1024];
    // The answer ends with an empty line (after `errno=`); the socket may stay open.
    while !text.ends_with("\n\n") {
        let got = s.read(&mut buf).map_err(|e| format!("{path}: {e}"))?;
        if got == 0 {
            break;
        }
        text.push_str(&String::from_utf8_lossy(&buf[..got]));
    }
    Ok(text)
}

/// A gateway's peers from its UAPI socket: public key (hex) and allowed IPs.
fn peers(ifname: &str) -> Result<Vec<(String, Vec<String>)>, String> {
    let text = uapi(ifname, "get=1")?;
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for line in text.lines() {
        if let Some(key) = line.strip_prefix("public_key=") {
            out.push((key.to_string(), Vec::new()));
        } else if let (Some(ip), Some(last)) = (line.strip_prefix("allowed_ip="), out.last_mut()) {
            last.1.push(ip.to_string());
        }
    }
    Ok(out)
}

/// The fleet's reconciles so far, summed over `gateways` (`fleet_reconciles` of each one's
/// UAPI `fleet=1`; a gateway that does not answer counts 0).
fn reconciles(gateways: &[Gateway]) -> f64 {
    gateways
        .iter()
        .filter_map(|g| uapi(&g.ifname, "fleet=1").ok())
        .filter_map(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("fleet_reconciles="))
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .sum()
}

/// Peers with allowed IPs (a site's gateway is added as soon as its record is seen, its
/// subnets once the election says it is the site's active one).
fn routed(peers: &[(String, Vec<String>)]) -> usize {
    peers.iter().filter(|(_, ips)| !ips.is_empty()).count()
}

/// Seconds from `event` to the last peer added or changed in a gateway's log no later than
/// `until` seconds after it.
fn last_peer_change(log: &str, event: f64, until: f64) -> f64 {
    log.lines()
        .filter(|l| l.contains("peer added for") || l.contains("peer changed"))
        .map(|l| since(l, event))
        .filter(|t| *t <= until)
        .fold(f64::NAN, f64::max)
}

/// Seconds from `event` until a gateway's log says the peer `key` (base64) was routed: added
/// with allowed IPs, or changed (given them) after an add without.
fn routed_at(log: &str, key: &str, event: f64) -> Option<f64> {
    let tag = format!("peer={key}");
    log.lines()
        .filter(|l| l.contains(&tag))
        .find(|l| {
            l.contains("peer changed")
                || l.split_once("peer added for ")
                    .is_some_and(|(_, rest)| !rest.starts_with(' '))
        })
        .map(|l| since(l, event))
}

/// The public key (base64) of the gateway `ifname`, from the key file `bench-fleet` wrote.
fn public_key_of(dir: &Path, ifname: &str) -> Result<String, String> {
    let path = dir.join(format!("{ifname}.key"));
    let text = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    tunneld_crypto::PrivateKey::from_base64(text.trim())
        .map(|k| k.public_key().to_base64())
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Seconds from `event` (Unix time) to a log line's time, negative when it came before.
fn since(line: &str, event: f64) -> f64 {
    let after = logged_after(line, event);
    if after > 43_200.0 {
        after - 86_400.0
    } else {
        after
    }
}

fn wait_until(limit: Duration, mut ok: impl FnMut() -> Result<bool, String>) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        // A gateway busy joining may answer its socket late: not yet, rather than a failure.
        if ok().unwrap_or(false) {
            return Ok(());
        }
        system::check_interrupted()?;
        if Instant::now() > deadline {
            return Err(format!("not within {} s", limit.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// `what`, with how many gateways are short of `want` peers and the log of the one shortest.
fn short_of_peers(gateways: &[Gateway], want: usize, what: &str) -> String {
    let counts: Vec<usize> = gateways
        .iter()
        .map(|g| peers(&g.ifname).map_or(0, |p| p.len()))
        .collect();
    let short = counts.iter().filter(|c| **c < want).count();
    let worst = (0..gateways.len()).min_by_key(|i| counts[*i]);
    format!(
        "{what}: {short} of {} gateways short of {want} peers; the one with the fewest ({}):\n{}",
        gateways.len(),
        worst.map_or(0, |i| counts[i]),
        worst.map(|i| gateways[i].log_text()).unwrap_or_default()
    )
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::max)
}

/// A straight line through (x0, y0) and (x1, y1), at x.
fn line_at(x0: f64, y0: f64, x1: f64, y1: f64, x: f64) -> f64 {
    y0 + (y1 - y0) / (x1 - x0) * (x - x0)
}

fn render(sizes: &[Size], lease_ttl: u16, took: Duration) -> String {
    let mut t = Table::new(&["measure (N sites)", "p50", "p99", "max", "samples"]);
    let row = |t: &mut Table, name: String, v: &[f64], decimals: usize, unit: &str| {
        t.row(&[
            name,
            cell(median(v.to_vec()), decimals, unit),
            cell(percentile(v, 0.99), decimals, unit),
            cell(max(v), decimals, unit),
            v.len().to_string(),
        ]);
    };
    for s in sizes {
        let n = s.n;
        row(
            &mut t,
            format!("N = {n}: full mesh, per gateway, from the last gateway's start"),
            &s.mesh,
            2,
            " s",
        );
        row(
            &mut t,
            format!("N = {n}: site N + 1 a peer (with its subnet) of each gateway"),
            &s.join,
            3,
            " s",
        );
        row(
            &mut t,
            format!("N = {n}: a ping from site N + 1 to a sample of sites answered"),
            &s.pings,
            3,
            " s",
        );
        row(
            &mut t,
            format!("N = {n}: gateway resident memory"),
            &s.rest
                .gateway_rss
                .iter()
                .map(|k| k / 1024.0)
                .collect::<Vec<_>>(),
            1,
            " MiB",
        );
    }
    let mut out = format!(
        "N sites, one `tunneld up` gateway each, each in a network namespace of its own on one \
         routed underlay, a full mesh (every gateway ends with N − 1 peers); a three-member \
         etcd cluster with TLS and client certificates (as in production and in \
         `bench-fleet`; a fresh one per N, its members at nice −10: the store would have hosts \
         of its own, and here shares two cores with N gateways), lease TTL {lease_ttl} s \
         (the default is {}). The gateways are started one after the other; then site N + 1 joins the steady mesh; then the fleet \
         rests. Times are from the gateways' own log lines (\"peer added for …\"), checked \
         against their peers over the UAPI socket. The whole run took {:.0} s.\n\n{}\n",
        tunneld_config::DEFAULT_LEASE_TTL,
        took.as_secs_f64(),
        t.render()
    );
    for s in sizes {
        let r = &s.rest;
        let per_gw_min = |v: f64| v / r.gateways.max(1) as f64 * 60.0 / r.seconds;
        let total: f64 = r.received.values().sum();
        let methods: Vec<String> = r
            .received
            .iter()
            .map(|(m, v)| format!("{m} {:.1}", per_gw_min(*v)))
            .collect();
        let etcd_rss: Vec<String> = r
            .etcd_rss
            .iter()
            .map(|b| format!("{:.0}", b / 1048576.0))
            .collect();
        out.push_str(&format!(
            "\n**N = {}** ({} gateways started in {:.1} s): the mesh complete {} after the \
             last start, after {:.1} reconciles per gateway; site N + 1 had its own {} peers \
             after {} and every gateway had it after {}; that change sent {:.0} etcd events \
             to watchers ({:.0} watch responses) and cost each of the N gateways {:.1} \
             reconciles and {} of CPU. At rest over {:.0} s, with {} \
             gateways: **{:.1} etcd requests per gateway per minute** ({}), {:.0} events sent \
             to watchers, {:.0} watchers on {:.0} watch streams; CPU {} per gateway per \
             minute, etcd (three members) {} per minute; gateway memory {} median, {} max; \
             etcd's members {} MiB each, {} per site (the largest member over N + 1, its \
             fixed part included: the slope below is the marginal cost), database {} in use. \
             Peers removed over the run (a lease lapsed under load): {}.\n",
            s.n,
            s.n,
            s.start_all,
            cell(max(&s.mesh), 2, " s"),
            s.mesh_reconciles,
            s.n,
            cell(s.newcomer_full, 3, " s"),
            cell(max(&s.join), 3, " s"),
            s.join_events,
            s.join_watch_responses,
            s.join_reconciles,
            cell(s.join_cpu / s.n as f64 * 1000.0, 1, " ms"),
            r.seconds,
            r.gateways,
            per_gw_min(total),
            methods.join(", "),
            r.events,
            r.watchers,
            r.watch_streams,
            cell(r.gateway_cpu_per_minute * 1000.0, 0, " ms"),
            cell(r.etcd_cpu_per_minute * 1000.0, 0, " ms"),
            cell(median(r.gateway_rss.clone()) / 1024.0, 1, " MiB"),
            cell(max(&r.gateway_rss) / 1024.0, 1, " MiB"),
            etcd_rss.join(", "),
            cell(
                max(&r.etcd_rss) / 1024.0 / r.gateways.max(1) as f64,
                1,
                " KiB"
            ),
            cell(r.db_size / 1024.0, 0, " KiB"),
            s.removed,
        ));
    }
    // Slopes take two different sizes.
    if let [.., a, b] = sizes {
        if a.n != b.n {
            out.push_str(&extrapolate(a, b, lease_ttl));
        }
    }
    out
}

/// The straight lines through the two largest sizes, read at [`TARGET`] sites.
fn extrapolate(a: &Size, b: &Size, lease_ttl: u16) -> String {
    let (x0, x1) = ((a.rest.gateways) as f64, (b.rest.gateways) as f64);
    let at = |y0: f64, y1: f64| line_at(x0, y0, x1, y1, TARGET);
    let rss = |s: &Size| median(s.rest.gateway_rss.clone()) / 1024.0;
    let etcd = |s: &Size| max(&s.rest.etcd_rss) / 1048576.0;
    let events = |s: &Size| s.join_events;
    let cpu = |s: &Size| s.join_cpu / s.n as f64 * 1000.0;
    let join = |s: &Size| max(&s.join);
    let mesh = |s: &Size| max(&s.mesh);
    let per_kib = (rss(b) - rss(a)) * 1024.0 / (x1 - x0);
    let events_10k = at(events(a), events(b));
    format!(
        "\n**Towards {TARGET:.0} sites**, on straight lines through N = {} and N = {} (a \
         gateway's figures against N; etcd's events per change against N): a gateway's memory \
         grows {per_kib:.1} KiB per site (its peer table: {:.0} MiB at {TARGET:.0}); an etcd \
         member's {:.0} MiB; one site joining sends {events_10k:.0} events to watchers (N \
         watchers, each told of the newcomer's keys), so a wave that touches every site (all \
         gateways restarting, a store failover that makes every lease lapse) is N times that, \
         {:.1e} events; a change costs each gateway {} of CPU (its whole view resolved again, \
         O(N) per change: O(N²) per wave for the fleet); the time for every gateway to learn of \
         a new site reads {} on the line ({:.3} s at N = {}, {:.3} s at N = {}); a full mesh from \
         a cold start {} after the last start. At rest a gateway sends the same requests at \
         any N (its lease's keep-alive every TTL / 3): {:.0} a second for the store at \
         {TARGET:.0} sites.\n",
        a.n,
        b.n,
        at(rss(a), rss(b)),
        at(etcd(a), etcd(b)),
        events_10k * TARGET,
        cell(at(cpu(a), cpu(b)), 1, " ms"),
        cell(at(join(a), join(b)), 2, " s"),
        join(a),
        a.n,
        join(b),
        b.n,
        cell(at(mesh(a), mesh(b)), 0, " s"),
        TARGET * 3.0 / f64::from(lease_ttl),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_read_by_name_and_method() {
        let text = "# HELP x\n\
                    grpc_server_msg_received_total{grpc_method=\"LeaseKeepAlive\",grpc_service=\"etcdserverpb.Lease\",grpc_type=\"bidi_stream\"} 120\n\
                    grpc_server_msg_received_total{grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 3\n\
                    grpc_server_msg_received_total_other 9\n\
                    etcd_debugging_mvcc_events_total 42\n";
        assert_eq!(value(text, "etcd_debugging_mvcc_events_total", None), 42.0);
        assert_eq!(value(text, "grpc_server_msg_received_total", None), 123.0);
        assert_eq!(
            value(text, "grpc_server_msg_received_total", Some("Range")),
            3.0
        );
        let m = Metrics {
            per_member: vec![text.into(), text.into()],
        };
        assert_eq!(
            m.by_method("grpc_server_msg_received_total")["LeaseKeepAlive"],
            240.0
        );
    }

    #[test]
    fn options_are_bounded() {
        assert!(parse(&["--sizes".into(), "241".into()]).is_err());
        assert!(parse(&["--sizes".into(), "50,x".into()]).is_err());
        assert_eq!(
            parse(&["--sizes".into(), "5, 9".into()]).unwrap().sizes,
            [5, 9]
        );
        assert!(parse(&["--quick".into(), "--update-docs".into()]).is_err());
        assert!(parse(&["--rest".into(), "0".into()]).is_err());
        assert!(parse(&["--lease-ttl".into(), "0".into()]).is_err());
        assert_eq!(
            parse(&["--lease-ttl".into(), "10".into()])
                .unwrap()
                .lease_ttl,
            10
        );
    }

    #[test]
    fn a_peer_is_routed_once_it_has_its_subnet() {
        let log = "2026-01-02T01:00:00.100000Z  INFO fleet s0/g: peer added for  peer=K= endpoint=x\n\
                   2026-01-02T01:00:00.200000Z  INFO fleet s0/g: peer added for 10.1.0.0/24 peer=L= endpoint=x\n\
                   2026-01-02T01:00:00.300000Z  INFO fleet s0/g: peer changed; its session is kept peer=K=\n";
        let event = 86_400.0 * 20_000.0 + 3600.0;
        let at = |key| routed_at(log, key, event).map(|t| (t * 1000.0).round());
        assert_eq!(at("K="), Some(300.0));
        assert_eq!(at("L="), Some(200.0));
        assert_eq!(at("M="), None);
        assert!((last_peer_change(log, event, 0.25) - 0.2).abs() < 1e-6);
    }

    #[test]
    fn a_line_before_the_event_is_negative() {
        let event = 86_400.0 * 20_000.0 + 3600.0; // 01:00:00 UTC
        assert!((since("2026-01-02T01:00:00.250000Z  INFO x", event) - 0.25).abs() < 1e-6);
        assert!((since("2026-01-02T00:59:59.000000Z  INFO x", event) + 1.0).abs() < 1e-6);
    }
}
