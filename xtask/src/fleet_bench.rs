//! `cargo xtask bench-fleet`: the fleet on a real etcd cluster (three members, TLS with
//! client certificates, each in a namespace), with `tunneld up` gateways in namespaces on
//! one routed underlay.
//!
//! - Failover: site B has two gateways and a LAN host; site A pings that host every 10 ms
//!   while B's active gateway is killed (-9) or stopped (SIGTERM), the dead one brought back
//!   as the standby each time, or while its host dies: its links cut, so that nothing of it
//!   forwards (a killed process's kernel still does, through the LAN's fallback route), its
//!   tunneld left running to come back as the standby when the links do. Time until replies
//!   flow again: p50/p99. Meanwhile the LAN host sends a paced TCP stream to site A: its
//!   longest stall (no byte received), and whether it completed intact (no reset).
//! - Joining: N sites (N = 10, 50) form a mesh; then one more starts, and every one of the N
//!   pings it until it answers: time until the last does, from the new tunneld's start.
//! - At rest, with the N + 1 gateways: etcd requests per gateway per minute (gRPC messages
//!   the members received, from their metrics), CPU and memory of a gateway with `[fleet]`
//!   against the same gateway without it (the fleet client's share).
//! - Active-active (`--active-active` runs this round alone): site F's two gateways in
//!   `mode = "active-active"`; iperf3 from site A to F's LAN host, with both carrying and
//!   with one (the other stopped); then 16 paced TCP streams while one gateway is killed
//!   (-9): which flows each gateway forwarded before and after (nftables counters per
//!   stream), how long the moved ones stalled, every stream intact.

use crate::report::{self, cell, median, percentile, Table};
use crate::system;
use crate::testbed::{cpu_seconds, rss_kib, wait_for_socket, Guard};
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tunneld_testnet::etcd::{self, link, Cluster, Underlay};
use tunneld_testnet::{unique_name, NetNs};

const MEMBERS: [&str; 3] = ["192.0.2.11", "192.0.2.12", "192.0.2.13"];
/// The longest any one step may take before the bench gives up on it.
const STEP_LIMIT: Duration = Duration::from_secs(40);

struct Options {
    kills: usize,
    sizes: Vec<usize>,
    rest_seconds: u64,
    quick: bool,
    update_docs: bool,
    /// `--active-active`: that round alone.
    only_active_active: bool,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        kills: 10,
        sizes: vec![10, 50],
        rest_seconds: 30,
        quick: false,
        update_docs: false,
        only_active_active: false,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => {
                o.quick = true;
                o.kills = 1;
                o.sizes = vec![3];
                o.rest_seconds = 5;
            }
            "--update-docs" => o.update_docs = true,
            "--active-active" => o.only_active_active = true,
            "--kills" => {
                o.kills = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|n| *n > 0)
                    .ok_or("--kills takes a number above 0")?
            }
            "--sizes" => {
                o.sizes = it
                    .next()
                    .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
                    .filter(|v: &Vec<usize>| {
                        !v.is_empty() && v.iter().all(|n| (2..=200).contains(n))
                    })
                    .ok_or("--sizes takes numbers 2-200, comma-separated")?
            }
            other => return Err(format!("bench-fleet: unknown option {other:?}")),
        }
    }
    if o.quick && o.update_docs {
        return Err("--update-docs takes a full run, not --quick".into());
    }
    if o.only_active_active && o.update_docs {
        return Err("--update-docs takes a full run, not --active-active alone".into());
    }
    Ok(o)
}

pub fn run(args: &[String]) -> Result<(), String> {
    let options = parse(args)?;
    if let Some(why) = tunneld_testnet::netns_unusable() {
        return Err(format!("bench-fleet needs network namespaces: {why}"));
    }
    system::install_tools()?;
    let tunneld = system::build_tunneld()?;
    let dir = std::env::temp_dir().join(unique_name("fleetb"));
    fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let result = measure(&tunneld, &dir, &options);
    // FLEET_BENCH_KEEP=1 keeps the gateways' configs and logs, to read after a run.
    if std::env::var_os("FLEET_BENCH_KEEP").is_none() {
        let _ = fs::remove_dir_all(&dir);
    }
    let markdown = result?;
    let root = system::repo_root()?;
    let report_dir = system::target_dir(&root).join("bench-report");
    let markdown = format!(
        "{}\n\n{markdown}",
        report::measured_line("bench-fleet", args)
    );
    report::write(&report_dir, "fleet-report.md", &markdown)?;
    if options.update_docs {
        report::update_front_page(&root, "fleet", &markdown)?;
    }
    Ok(())
}

/// A gateway's config and process.
pub(crate) struct Gateway {
    ns_name: String,
    pub(crate) ifname: String,
    config: PathBuf,
    log: PathBuf,
    process: Option<std::process::Child>,
}

impl Gateway {
    fn start(&mut self, tunneld: &Path) -> Result<(), String> {
        let log = fs::File::create(&self.log).map_err(|e| e.to_string())?;
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns_name])
            .arg(tunneld)
            .arg("up")
            .arg(&self.config)
            .env("TUNNELD_LOG", "info,tunneld_fleet=debug")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start tunneld: {e}"))?;
        self.process = Some(child);
        wait_for_socket(&self.ifname).map_err(|e| format!("{e}\n{}", self.log_text()))
    }

    /// Stops it with `signal`, reaped.
    fn stop(&mut self, signal: &str) {
        if let Some(mut child) = self.process.take() {
            let _ = Command::new("kill")
                .args([&format!("-{signal}"), &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while child.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = fs::remove_file(format!("/var/run/wireguard/{}.sock", self.ifname));
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(std::process::Child::id)
    }

    pub(crate) fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub(crate) fn show(&self, tunneld: &Path) -> String {
        let out = Command::new(tunneld)
            .args(["show", &self.ifname])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
        out.unwrap_or_default()
    }

    fn peer_count(&self) -> usize {
        Command::new("wg")
            .args(["show", &self.ifname, "peers"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).lines().count())
            .unwrap_or(0)
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop("TERM");
    }
}

/// A gateway to start: its underlay address, site and name, own address (/32) and its
/// site's subnet.
pub(crate) struct Spec<'a> {
    pub(crate) underlay: &'a str,
    pub(crate) site: &'a str,
    pub(crate) gateway: &'a str,
    pub(crate) address: Option<&'a str>,
    pub(crate) subnet: &'a str,
    /// `[fleet] mode`, when not the default.
    pub(crate) mode: Option<&'a str>,
}

pub(crate) struct Fleet<'a> {
    pub(crate) tunneld: &'a Path,
    pub(crate) dir: &'a Path,
    pub(crate) cluster: &'a Cluster,
    /// `[fleet] lease_ttl`, when not the default.
    pub(crate) lease_ttl: Option<u16>,
}

impl Fleet<'_> {
    /// A gateway in `ns` as `spec` says; with no `prefix`, one without `[fleet]`.
    pub(crate) fn gateway(
        &self,
        ns: &NetNs,
        prefix: Option<&str>,
        spec: Spec,
    ) -> Result<Gateway, String> {
        self.gateway_with(ns, prefix, spec, "", "")
    }

    /// [`Fleet::gateway`], with `fleet_lines` added to its `[fleet]` section and `sections`
    /// (whole TOML sections) after it.
    pub(crate) fn gateway_with(
        &self,
        ns: &NetNs,
        prefix: Option<&str>,
        spec: Spec,
        fleet_lines: &str,
        sections: &str,
    ) -> Result<Gateway, String> {
        let Spec {
            underlay,
            site,
            gateway,
            address,
            subnet,
            mode,
        } = spec;
        let ifname = unique_name("fb");
        let key = tunneld_crypto::PrivateKey::generate();
        let key_path = self.dir.join(format!("{ifname}.key"));
        fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&key_path)
            .and_then(|mut f| f.write_all(key.to_base64().as_bytes()))
            .map_err(|e| e.to_string())?;
        let address = address.map_or(String::new(), |a| format!("address = [\"{a}\"]\n"));
        let mut text = format!(
            "[interface]\nname = \"{ifname}\"\nprivate_key_file = \"{}\"\nlisten_port = 51820\n\
             {address}\n[dataplane]\nworkers = 1\n",
            key_path.display()
        );
        if let Some(prefix) = prefix {
            let certs = self.cluster.certs();
            let endpoints: Vec<String> = self
                .cluster
                .endpoints()
                .iter()
                .map(|e| format!("\"{e}\""))
                .collect();
            text.push_str(&format!(
                "\n[fleet]\netcd = [{}]\nca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n\
                 prefix = \"{prefix}\"\nsite = \"{site}\"\ngateway = \"{gateway}\"\n\
                 advertise = [\"{underlay}:51820\"]\nsubnets = [\"{subnet}\"]\n",
                endpoints.join(", "),
                certs.join("ca.pem").display(),
                certs.join("client.pem").display(),
                certs.join("client.key").display(),
            ));
            if let Some(mode) = mode {
                text.push_str(&format!("mode = \"{mode}\"\n"));
            }
            if let Some(ttl) = self.lease_ttl {
                text.push_str(&format!("lease_ttl = {ttl}\n"));
            }
            text.push_str(fleet_lines);
        }
        text.push_str(sections);
        let config = self.dir.join(format!("{ifname}.toml"));
        fs::write(&config, text).map_err(|e| e.to_string())?;
        let mut g = Gateway {
            ns_name: ns.name().to_string(),
            log: self.dir.join(format!("{ifname}.log")),
            ifname,
            config,
            process: None,
        };
        g.start(self.tunneld)?;
        Ok(g)
    }
}

pub(crate) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn wait_for(what: &str, ok: impl FnMut() -> bool) -> Result<(), String> {
    wait_for_within(what, STEP_LIMIT, ok)
}

fn wait_for_within(
    what: &str,
    limit: Duration,
    mut ok: impl FnMut() -> bool,
) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    while !ok() {
        system::check_interrupted()?;
        if Instant::now() > deadline {
            return Err(format!("{what}: not within {} s", limit.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// A ping every 10 ms from `ns` to `addr`, its replies' times read back.
pub(crate) struct Probe {
    /// Stopped with the probe.
    _process: Guard,
    out: PathBuf,
}

impl Probe {
    pub(crate) fn start(ns: &NetNs, addr: &str, out: PathBuf) -> Result<Probe, String> {
        let file = fs::File::create(&out).map_err(|e| e.to_string())?;
        let child = ns
            .command("ping")
            .args(["-D", "-n", "-i", "0.01", "-W", "1", "-w", "60", addr])
            .stdout(file)
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start ping: {e}"))?;
        Ok(Probe {
            _process: Guard(child),
            out,
        })
    }

    /// The Unix times of its replies so far.
    pub(crate) fn reply_times(&self) -> Vec<f64> {
        etcd::ping_reply_times(&fs::read_to_string(&self.out).unwrap_or_default())
    }

    /// Seconds from `event` (Unix time) to the first reply after the longest gap in the
    /// replies that follows it (0 when no gap exceeded [`LOST`]), once replies have flowed
    /// for [`SETTLED`] after that gap.
    fn resumed_after(&self, event: f64) -> Result<f64, String> {
        let deadline = Instant::now() + STEP_LIMIT;
        loop {
            if let Some(resumed) = back_after(&self.reply_times(), event) {
                return Ok(resumed);
            }
            system::check_interrupted()?;
            if Instant::now() > deadline {
                return Err("no ping reply after the failover".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A gap in a 10 ms ping's replies longer than this is an outage (four replies lost).
const LOST: f64 = 0.05;
/// Replies must have flowed this long after the longest gap before it is known to be over.
const SETTLED: f64 = 1.0;

/// Seconds from `event` to the end of the longest gap in `replies` after it (0 without one
/// longer than [`LOST`]); `None` until replies have flowed for [`SETTLED`] after that gap.
pub(crate) fn back_after(replies: &[f64], event: f64) -> Option<f64> {
    let mut previous = replies
        .iter()
        .copied()
        .rfind(|t| *t <= event)
        .unwrap_or(event);
    let mut longest: Option<(f64, f64)> = None;
    for t in replies.iter().copied().filter(|t| *t > event) {
        if longest.is_none_or(|(gap, _)| t - previous > gap) {
            longest = Some((t - previous, t));
        }
        previous = t;
    }
    let (gap, end) = longest?;
    if previous < end + SETTLED {
        return None;
    }
    Some(if gap > LOST { end - event } else { 0.0 })
}

/// A paced TCP stream from a LAN host to site A across a failover: 16 KiB every 10 ms.
struct Transfer {
    sender: std::thread::JoinHandle<Result<usize, String>>,
    receiver: std::thread::JoinHandle<Result<(usize, f64), String>>,
}

/// The byte at `i` of a transfer: a pattern that shows a lost or repeated segment.
fn pattern_byte(i: usize) -> u8 {
    (i % 251) as u8
}

impl Transfer {
    fn start(
        from: &NetNs,
        to: &NetNs,
        to_addr: std::net::SocketAddr,
        seconds: f64,
    ) -> Result<Transfer, String> {
        use std::io::Read as _;
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let receiver = to.spawn_in_ns(move || {
            let listener =
                std::net::TcpListener::bind(to_addr).map_err(|e| format!("listen: {e}"))?;
            let _ = ready_tx.send(());
            let (mut stream, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
            stream
                .set_read_timeout(Some(STEP_LIMIT))
                .map_err(|e| e.to_string())?;
            let (mut got, mut stall, mut last) = (0usize, 0f64, Instant::now());
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match stream.read(&mut buf) {
                    // The bench's own signal handlers interrupt reads: not the stream's fault.
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    other => other.map_err(|e| format!("receive after {got} bytes: {e}"))?,
                };
                if n == 0 {
                    return Ok((got, stall));
                }
                let now = Instant::now();
                stall = stall.max((now - last).as_secs_f64());
                last = now;
                if let Some(i) = (0..n).find(|&i| buf[i] != pattern_byte(got + i)) {
                    return Err(format!("byte {} differs", got + i));
                }
                got += n;
            }
        });
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| "the transfer's listener did not start".to_string())?;
        let sender = from.spawn_in_ns(move || {
            let mut stream = std::net::TcpStream::connect_timeout(&to_addr, Duration::from_secs(5))
                .map_err(|e| format!("connect: {e}"))?;
            stream
                .set_write_timeout(Some(STEP_LIMIT))
                .map_err(|e| e.to_string())?;
            let (start, mut sent) = (Instant::now(), 0usize);
            while start.elapsed().as_secs_f64() < seconds {
                let chunk: Vec<u8> = (sent..sent + 16 * 1024).map(pattern_byte).collect();
                stream
                    .write_all(&chunk)
                    .map_err(|e| format!("send after {sent} bytes: {e}"))?;
                sent += chunk.len();
                std::thread::sleep(Duration::from_millis(10));
            }
            stream
                .shutdown(std::net::Shutdown::Write)
                .map_err(|e| e.to_string())?;
            Ok(sent)
        });
        Ok(Transfer { sender, receiver })
    }

    /// The longest stall, once every byte arrived; an error on a reset or a loss (the
    /// receiver's first: a receiver that fails closes, and the sender sees a reset).
    fn finish(self) -> Result<f64, String> {
        let sent = self
            .sender
            .join()
            .map_err(|_| "the sender panicked".to_string())?;
        let received = self
            .receiver
            .join()
            .map_err(|_| "the receiver panicked".to_string())?;
        match (received, sent) {
            (Err(r), Err(s)) => Err(format!("receiver: {r}; sender: {s}")),
            (Err(r), Ok(_)) => Err(format!("receiver: {r}")),
            (Ok(_), Err(s)) => Err(format!("sender: {s}")),
            (Ok((got, _)), Ok(sent)) if got != sent => {
                Err(format!("{got} of {sent} bytes received"))
            }
            (Ok((_, stall)), Ok(_)) => Ok(stall),
        }
    }
}

fn measure(tunneld: &Path, dir: &Path, options: &Options) -> Result<String, String> {
    let wan = Underlay::new("192.0.2.1/24");
    eprintln!("==> etcd: three members with TLS");
    let cluster = Cluster::start(&wan, &MEMBERS, true);
    let fleet = Fleet {
        tunneld,
        dir,
        cluster: &cluster,
        lease_ttl: None,
    };
    if options.only_active_active {
        return active_active(&fleet, &wan, options);
    }
    let Failovers {
        kill,
        term,
        host,
        stalls,
        broken,
    } = failovers(&fleet, &wan, options)?;
    let mut table = Table::new(&[
        "measure",
        "p50 (median)",
        "p99 (joining: the last)",
        "samples",
    ]);
    for (name, samples) in [
        (
            "traffic resumes after `kill -9` of the active gateway",
            &kill,
        ),
        ("traffic resumes after SIGTERM of the active gateway", &term),
        (
            "traffic resumes after the active gateway's host dies (links cut)",
            &host,
        ),
    ] {
        table.row(&[
            name.into(),
            cell(percentile(samples, 0.5), 2, " s"),
            cell(percentile(samples, 0.99), 2, " s"),
            samples.len().to_string(),
        ]);
    }
    for (way, name) in [
        "TCP stream's longest stall across `kill -9`",
        "TCP stream's longest stall across SIGTERM",
        "TCP stream's longest stall across the host's death",
    ]
    .into_iter()
    .enumerate()
    {
        let samples = &stalls[way];
        let failed = broken[way].len();
        table.row(&[
            name.into(),
            cell(percentile(samples, 0.5), 2, " s"),
            cell(percentile(samples, 0.99), 2, " s"),
            if failed == 0 {
                format!("{} (every one intact, no reset)", samples.len())
            } else {
                format!("{} intact, {failed} failed", samples.len())
            },
        ]);
    }
    let failures: Vec<&str> = broken.iter().flatten().map(String::as_str).collect();
    let mut rest = String::new();
    for &n in &options.sizes {
        let joined = join(&fleet, &wan, n, options, &mut rest)?;
        table.row(&[
            format!("a new site reachable from each of N = {n} others"),
            cell(median(joined.clone()), 2, " s"),
            cell(joined.iter().copied().fold(f64::NAN, f64::max), 2, " s"),
            joined.len().to_string(),
        ]);
    }
    Ok(format!(
        "Failover: site B's two gateways, the active one killed (-9), stopped (SIGTERM) and \
         cut off with its host (its underlay and LAN links taken down, its tunneld left \
         running), {} times each, back as the standby each time; a ping every 10 ms from site \
         A to a host on B's LAN tells when traffic flows again (the end of the longest gap in \
         its replies after the event; none longer than 50 ms counts as 0), and a TCP stream \
         from that host to site A (16 KiB every 10 ms, from 0.5 s before the event for 3 s) \
         its longest stall; a stream reset or cut short fails the bench (lease TTL 3 s, the \
         default; B's standby finds the active gateway dead by its probes). \
         A killed gateway's kernel still forwards what its LAN sends it to the other gateway; \
         a dead host forwards nothing, so there the LAN host's route is moved to the survivor \
         at the moment of death (the LAN's own failover, VRRP or the like, is the operator's \
         and adds its time if slower): the figure is the fleet's part. Joining: N sites in a \
         mesh, then one more started; the time from its start until each of the N reaches it.\n\n{}\n{}{rest}\n{}",
        options.kills,
        table.render(),
        if failures.is_empty() {
            String::new()
        } else {
            format!("TCP streams that failed: {}.\n\n", failures.join("; "))
        },
        active_active(&fleet, &wan, options)?
    ))
}

/// The streams of the active-active round's kills, and their ports.
const AA_STREAMS: u16 = 16;
const AA_PORT: u16 = 7300;

/// Packets each gateway forwarded to the LAN host per stream (by its port), from the
/// counters of the `aa` table in its namespace.
fn forwarded_per_stream(ns: &NetNs) -> Vec<u64> {
    let text = ns.run(&["nft", "list", "chain", "inet", "aa", "counts"]);
    (0..AA_STREAMS)
        .map(|i| {
            let needle = format!("tcp dport {} counter packets ", AA_PORT + i);
            text.lines()
                .find_map(|l| l.split(&needle).nth(1))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        })
        .collect()
}

/// iperf3 from `from` to `to_addr` (a server started in `to`): received bit/s.
pub(crate) fn iperf(
    from: &NetNs,
    to: &NetNs,
    to_addr: &str,
    streams: u32,
    seconds: u32,
) -> Result<f64, String> {
    let _server = Guard(
        to.command("iperf3")
            .args(["-s", "-1", "-B", to_addr])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start iperf3: {e}"))?,
    );
    wait_for("iperf3 listens", || {
        String::from_utf8_lossy(&to.output(&["ss", "-ltnH"]).stdout).contains(":5201 ")
    })?;
    let out = system::output_within(
        from.command("iperf3").args([
            "-c",
            to_addr,
            "-t",
            &seconds.to_string(),
            "-P",
            &streams.to_string(),
            "-J",
        ]),
        Duration::from_secs(u64::from(seconds) + 20),
    )?;
    let json = String::from_utf8_lossy(&out.stdout);
    crate::testbed::json_number_after(&json, "\"sum_received\"", "\"bits_per_second\"").ok_or_else(
        || {
            format!(
                "iperf3 gave no result: {}",
                json.chars().take(400).collect::<String>()
            )
        },
    )
}

/// Bytes site A's gateway sent each peer (`wg show transfer`), by public key.
fn sent_per_peer(ns: &NetNs, ifname: &str) -> std::collections::HashMap<String, u64> {
    ns.run(&["wg", "show", ifname, "transfer"])
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            Some((f.first()?.to_string(), f.get(2)?.parse().ok()?))
        })
        .collect()
}

/// Site A (one gateway) and site F (two gateways, `mode = "active-active"`, a LAN host):
/// throughput with both of F's gateways carrying and with one, then kills of one.
fn active_active(fleet: &Fleet, wan: &Underlay, options: &Options) -> Result<String, String> {
    let kills = options.kills;
    eprintln!(
        "==> active-active: throughput, then {kills} kill(s) of one of site F's two gateways"
    );
    let prefix = "/tunneld/bench-active-active";
    let na = wan.host("192.0.2.41/24");
    let nf: Vec<NetNs> = ["192.0.2.42/24", "192.0.2.43/24"]
        .iter()
        .map(|a| wan.host(a))
        .collect();
    let lan = NetNs::new();
    lan.run(&["ip", "link", "add", "brf", "type", "bridge"]);
    lan.run(&["ip", "addr", "add", "10.6.0.10/24", "dev", "brf"]);
    lan.run(&["ip", "link", "set", "brf", "up"]);
    // The LAN host sends through f1 (the LAN addresses' holder would do the same): what
    // spreads is what the other sites send, and the streams go from A to the LAN host.
    lan.run(&["ip", "route", "add", "10.0.0.0/8", "via", "10.6.0.2"]);
    for (i, ns) in nf.iter().enumerate() {
        let (inside, outside) = link(ns, &lan);
        ns.run(&[
            "ip",
            "addr",
            "add",
            &format!("10.6.0.{}/24", 2 + i),
            "dev",
            &inside,
        ]);
        ns.run(&["ip", "link", "set", &inside, "up"]);
        lan.run(&["ip", "link", "set", &outside, "master", "brf", "up"]);
        ns.run(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        // A counter per stream of what this gateway forwards to the LAN host.
        ns.run(&["nft", "add", "table", "inet", "aa"]);
        ns.run(&[
            "nft",
            "add chain inet aa counts { type filter hook forward priority 0; policy accept; }",
        ]);
        for p in 0..AA_STREAMS {
            ns.run(&[
                "nft",
                &format!(
                    "add rule inet aa counts ip daddr 10.6.0.10 tcp dport {} counter",
                    AA_PORT + p
                ),
            ]);
        }
    }
    let a = fleet.gateway(
        &na,
        Some(prefix),
        Spec {
            underlay: "192.0.2.41",
            site: "a",
            gateway: "a1",
            address: Some("10.1.0.1/32"),
            subnet: "10.1.0.0/24",
            mode: None,
        },
    )?;
    let spec = |i: usize| Spec {
        underlay: ["192.0.2.42", "192.0.2.43"][i],
        site: "f",
        gateway: ["f1", "f2"][i],
        address: None,
        subnet: "10.6.0.0/24",
        mode: Some("active-active"),
    };
    let mut f = vec![fleet.gateway(&nf[0], Some(prefix), spec(0))?];
    wait_for("f1 leads site f", || {
        f[0].show(fleet.tunneld).contains("gateway f1 (active)")
    })?;
    f.push(fleet.gateway(&nf[1], Some(prefix), spec(1))?);
    let keys: Vec<String> = f
        .iter()
        .map(|g| {
            g.show(fleet.tunneld)
                .lines()
                .find_map(|l| l.trim().strip_prefix("public key: ").map(str::to_string))
                .unwrap_or_default()
        })
        .collect();
    let routed_to_both = || {
        let routes = na.run(&["wg", "show", &a.ifname, "allowed-ips"]);
        keys.iter().all(|k| {
            routes
                .lines()
                .any(|l| l.starts_with(k.as_str()) && l.contains("10.6.0.0/24"))
        })
    };
    let sharing = |g: &Gateway| g.show(fleet.tunneld).contains("gateway f2 (sharing)");
    wait_for("A routes site f to both of its gateways", || {
        sharing(&f[1]) && routed_to_both()
    })?;
    wait_for("A reaches F's LAN", || {
        na.output(&["ping", "-c", "1", "-W", "1", "10.6.0.10"])
            .status
            .success()
    })?;

    // Sixteen streams, so that the hash splits them about evenly.
    let (streams, seconds) = (16, if options.quick { 3 } else { 10 });
    let before = sent_per_peer(&na, &a.ifname);
    let cpu = |g: &Gateway| cpu_seconds(&g.pid().into_iter().collect::<Vec<_>>());
    let cpu_before = [cpu(&f[0]), cpu(&f[1]), cpu(&a)];
    let both = iperf(&na, &lan, "10.6.0.10", streams, seconds)?;
    let cpu_both = [
        cpu(&f[0]) - cpu_before[0],
        cpu(&f[1]) - cpu_before[1],
        cpu(&a) - cpu_before[2],
    ];
    let after = sent_per_peer(&na, &a.ifname);
    let through = |i: usize| {
        after.get(&keys[i]).copied().unwrap_or(0) - before.get(&keys[i]).copied().unwrap_or(0)
    };
    let f2_share = through(1) as f64 / (through(0) + through(1)).max(1) as f64;
    f[1].stop("TERM");
    wait_for("A routes site f to f1 alone", || !routed_to_both())?;
    let cpu_before = [cpu(&f[0]), cpu(&a)];
    let one = iperf(&na, &lan, "10.6.0.10", streams, seconds)?;
    let cpu_one = [cpu(&f[0]) - cpu_before[0], cpu(&a) - cpu_before[1]];
    eprintln!(
        "    {streams} streams, {seconds} s: {:.0} Mbit/s through both gateways (f2 carried {:.0} %; CPU f1 {:.1} s, f2 {:.1} s, a1 {:.1} s), {:.0} Mbit/s through one (CPU f1 {:.1} s, a1 {:.1} s)",
        both / 1e6,
        f2_share * 100.0,
        cpu_both[0],
        cpu_both[1],
        cpu_both[2],
        one / 1e6,
        cpu_one[0],
        cpu_one[1]
    );

    let (mut moved, mut on_killed, mut split, mut broken) =
        (Vec::new(), Vec::new(), 0usize, Vec::new());
    let (mut stalls_moved, mut stalls_kept, mut revoked) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..kills {
        system::check_interrupted()?;
        f[1].start(fleet.tunneld)?;
        wait_for("f2 carries its share again", || {
            sharing(&f[1]) && routed_to_both()
        })?;
        // The counters go on across rounds: this round's are the differences.
        let start = [forwarded_per_stream(&nf[0]), forwarded_per_stream(&nf[1])];
        let since = |now: Vec<u64>, start: &[u64]| -> Vec<u64> {
            now.iter().zip(start).map(|(n, s)| n - s).collect()
        };
        let transfers = (0..AA_STREAMS)
            .map(|i| {
                let to = std::net::SocketAddr::new([10, 6, 0, 10].into(), AA_PORT + i);
                Transfer::start(&na, &lan, to, 3.0)
            })
            .collect::<Result<Vec<_>, _>>()?;
        std::thread::sleep(Duration::from_millis(700));
        let before = [
            since(forwarded_per_stream(&nf[0]), &start[0]),
            since(forwarded_per_stream(&nf[1]), &start[1]),
        ];
        let killed = unix_now();
        f[1].stop("KILL");
        let mut outcomes = Vec::new();
        for t in transfers {
            outcomes.push(t.finish());
        }
        let after_f1 = since(forwarded_per_stream(&nf[0]), &start[0]);
        let mut moved_here = 0;
        let mut on_f2 = 0;
        for (i, outcome) in outcomes.into_iter().enumerate() {
            let (was_f1, was_f2) = (before[0][i] > 0, before[1][i] > 0);
            split += usize::from(was_f1 && was_f2);
            on_f2 += usize::from(was_f2);
            let stall = match outcome {
                Ok(stall) => stall,
                Err(e) => {
                    broken.push(format!("kill {}, stream {i}: {e}", round + 1));
                    continue;
                }
            };
            if was_f2 {
                moved_here += usize::from(after_f1[i] > before[0][i]);
                stalls_moved.push(stall);
            } else {
                stalls_kept.push(stall);
            }
        }
        let took = logged_after_line(&f[0].log_text(), "its lease revoked in etcd", killed);
        revoked.push(took);
        eprintln!(
            "    kill {}: {on_f2} of {AA_STREAMS} streams were on f2, {moved_here} moved to f1 (f1 had f2's lease revoked {took:.3} s after the kill)",
            round + 1
        );
        on_killed.push(on_f2 as f64);
        moved.push(moved_here as f64);
    }
    let mut table = Table::new(&["measure", "p50 (median)", "p99", "samples"]);
    table.row(&[
        format!("throughput A → F, {streams} TCP streams, both gateways carrying"),
        cell(both / 1e6, 0, " Mbit/s"),
        String::new(),
        format!(
            "1 ({:.0} % through f2; CPU f1 {:.1} s, f2 {:.1} s, A's a1 {:.1} s)",
            f2_share * 100.0,
            cpu_both[0],
            cpu_both[1],
            cpu_both[2]
        ),
    ]);
    table.row(&[
        format!("throughput A → F, {streams} TCP streams, one gateway (the other stopped)"),
        cell(one / 1e6, 0, " Mbit/s"),
        String::new(),
        format!("1 (CPU f1 {:.1} s, A's a1 {:.1} s)", cpu_one[0], cpu_one[1]),
    ]);
    for (name, samples) in [
        (
            format!("streams (of {AA_STREAMS}) on the gateway killed"),
            &on_killed,
        ),
        ("of those, moved to the other gateway".to_string(), &moved),
        (
            "the killed gateway's lease revoked by the other (probes), after".to_string(),
            &revoked,
        ),
        ("longest stall of a moved stream".to_string(), &stalls_moved),
        (
            "longest stall of a stream on the survivor".to_string(),
            &stalls_kept,
        ),
    ] {
        let unit = if name.starts_with("streams") || name.starts_with("of those") {
            ""
        } else {
            " s"
        };
        let decimals = if unit.is_empty() { 1 } else { 2 };
        table.row(&[
            name,
            cell(percentile(samples, 0.5), decimals, unit),
            cell(percentile(samples, 0.99), decimals, unit),
            samples.len().to_string(),
        ]);
    }
    Ok(format!(
        "Active-active: site F's two gateways with `mode = \"active-active\"`, site A's one \
         gateway spreading flows over them by a hash of each flow (one worker per gateway). \
         Throughput: iperf3, {streams} streams for {seconds} s from A to a host on F's LAN, its \
         replies through f1; then again with f2 stopped. All three gateways, the LAN host and \
         iperf3 share this machine's {} cores, so two gateways can add at most what the cores \
         left over by one gateway and iperf3 allow: the figure says how much of a second \
         gateway's capacity the machine let through, not what two hosts would carry (the \
         gateways' CPU seconds show the work split between them; A's one gateway, one \
         worker, encrypts every stream on one core either way). Kills: \
         {AA_STREAMS} TCP streams from A to the LAN host (16 KiB every 10 ms for 3 s), f2 \
         killed (-9) 0.7 s in, {kills} time(s); nftables counters in each gateway say which \
         streams it forwarded before and after; streams on both gateways before the kill: \
         {split}.{}\n\n{}",
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        if broken.is_empty() {
            " Every stream completed intact (no reset).".to_string()
        } else {
            format!(" Streams that failed: {}.", broken.join("; "))
        },
        table.render()
    ))
}

/// Seconds from `event` (Unix time) to the last log line with `needle`.
fn logged_after_line(log: &str, needle: &str, event: f64) -> f64 {
    log.lines()
        .rfind(|l| l.contains(needle))
        .map_or(f64::NAN, |l| etcd::logged_after(l, event))
}

/// Seconds until traffic resumed, per way of losing the active gateway.
#[derive(Default)]
struct Failovers {
    kill: Vec<f64>,
    term: Vec<f64>,
    host: Vec<f64>,
    /// The TCP stream's longest stall: kill, SIGTERM, host.
    stalls: [Vec<f64>; 3],
    /// The streams that failed (reset, cut short), why: kill, SIGTERM, host.
    broken: [Vec<String>; 3],
}

/// Site A and site B (two gateways, a LAN host): the failover samples, kill -9, SIGTERM,
/// then host death.
fn failovers(fleet: &Fleet, wan: &Underlay, options: &Options) -> Result<Failovers, String> {
    eprintln!("==> failover: {} kills each way", options.kills);
    let prefix = "/tunneld/bench-failover";
    let na = wan.host("192.0.2.21/24");
    let nb: Vec<NetNs> = ["192.0.2.22/24", "192.0.2.23/24"]
        .iter()
        .map(|a| wan.host(a))
        .collect();
    let lan = NetNs::new();
    // No ICMP redirects on B's LAN: a standby hands the LAN host's packets back onto the LAN
    // to the active gateway, and a redirect taken for them in the moment before a host's
    // death kept the LAN host sending to the dead gateway for minutes (docs/fleet.md, §3).
    lan.without_redirects();
    lan.run(&["ip", "link", "add", "brb", "type", "bridge"]);
    lan.run(&["ip", "addr", "add", "10.2.0.10/24", "dev", "brb"]);
    lan.run(&["ip", "link", "set", "brb", "up"]);
    // The bridge's end of each B gateway's LAN link, to cut its host off.
    let mut lan_ports = Vec::new();
    for (i, ns) in nb.iter().enumerate() {
        let (own, other) = (2 + i, 3 - i);
        ns.without_redirects();
        let (inside, outside) = link(ns, &lan);
        ns.run(&[
            "ip",
            "addr",
            "add",
            &format!("10.2.0.{own}/24"),
            "dev",
            &inside,
        ]);
        ns.run(&["ip", "link", "set", &inside, "up"]);
        lan.run(&["ip", "link", "set", &outside, "master", "brb", "up"]);
        lan_ports.push(outside);
        ns.run(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        ns.run(&[
            "ip",
            "route",
            "add",
            "10.0.0.0/8",
            "via",
            &format!("10.2.0.{other}"),
            "metric",
            "100",
        ]);
    }
    lan.run(&["ip", "route", "add", "10.0.0.0/8", "via", "10.2.0.2"]);
    let a = fleet.gateway(
        &na,
        Some(prefix),
        Spec {
            underlay: "192.0.2.21",
            site: "a",
            gateway: "a1",
            address: Some("10.1.0.1/32"),
            subnet: "10.1.0.0/24",
            mode: None,
        },
    )?;
    let mut b = vec![fleet.gateway(
        &nb[0],
        Some(prefix),
        Spec {
            underlay: "192.0.2.22",
            site: "b",
            gateway: "b1",
            address: None,
            subnet: "10.2.0.0/24",
            mode: None,
        },
    )?];
    wait_for("b1 leads site b", || {
        b[0].show(fleet.tunneld).contains("gateway b1 (active)")
    })?;
    b.push(fleet.gateway(
        &nb[1],
        Some(prefix),
        Spec {
            underlay: "192.0.2.23",
            site: "b",
            gateway: "b2",
            address: None,
            subnet: "10.2.0.0/24",
            mode: None,
        },
    )?);
    wait_for("A reaches B's LAN", || {
        na.output(&["ping", "-c", "1", "-W", "1", "10.2.0.10"])
            .status
            .success()
    })?;
    let mut active = 0;
    let mut samples = Failovers::default();
    let underlay = |i: usize| format!("192.0.2.{}", 22 + i);
    let lan_address = |i: usize| format!("10.2.0.{}", 2 + i);
    let mut stalls: [Vec<f64>; 3] = Default::default();
    let mut broken: [Vec<String>; 3] = Default::default();
    let mut port = 7100u16;
    for (way, (signal, into)) in [
        ("KILL", &mut samples.kill),
        ("TERM", &mut samples.term),
        ("HOST", &mut samples.host),
    ]
    .into_iter()
    .enumerate()
    {
        for round in 0..options.kills {
            system::check_interrupted()?;
            let standby = 1 - active;
            let name = |i: usize| format!("gateway b{} (", i + 1);
            wait_for("the standby is ready", || {
                b[standby]
                    .show(fleet.tunneld)
                    .contains(&format!("{}standby)", name(standby)))
            })?;
            if signal == "HOST" {
                // The LAN host's route to the other sites goes to the active gateway.
                lan.run(&[
                    "ip",
                    "route",
                    "replace",
                    "10.0.0.0/8",
                    "via",
                    &lan_address(active),
                ]);
            }
            let probe = Probe::start(&na, "10.2.0.10", fleet.dir.join("probe.out"))?;
            port += 1;
            let transfer = Transfer::start(
                &lan,
                &na,
                std::net::SocketAddr::from(([10, 1, 0, 1], port)),
                3.0,
            )?;
            std::thread::sleep(Duration::from_millis(500));
            let event = unix_now();
            if signal == "HOST" {
                wan.disconnect(&underlay(active));
                lan.run(&["ip", "link", "set", &lan_ports[active], "down"]);
                lan.run(&[
                    "ip",
                    "route",
                    "replace",
                    "10.0.0.0/8",
                    "via",
                    &lan_address(standby),
                ]);
            } else {
                b[active].stop(signal);
            }
            let resumed = probe.resumed_after(event).map_err(|e| {
                let state = |ns: &NetNs| {
                    let icmp = ns.run(&["grep", "^Icmp:", "/proc/net/snmp"]);
                    format!(
                        "{}{}{}{icmp}{}",
                        ns.run(&["ip", "route"]),
                        ns.run(&["ip", "neigh"]),
                        String::from_utf8_lossy(
                            &ns.output(&["ip", "route", "get", "10.1.0.1"]).stdout
                        ),
                        ns.run(&["wg", "show", "all", "dump"])
                    )
                };
                format!(
                    "{signal} {}: {e}\n--- site A's log ---\n{}\n--- b{}'s log ---\n{}\n--- A ---\n{}\n--- b{} ---\n{}\n--- LAN ---\n{}",
                    round + 1,
                    a.log_text(),
                    standby + 1,
                    b[standby].log_text(),
                    state(&na),
                    standby + 1,
                    state(&nb[standby]),
                    state(&lan)
                )
            })?;
            drop(probe);
            let stall = match transfer.finish() {
                Ok(stall) => {
                    stalls[way].push(stall);
                    stall
                }
                Err(e) => {
                    // Counted and shown, not fatal: the failover figures still stand.
                    eprintln!(
                        "    {signal} {}: the TCP stream across it failed: {e}",
                        round + 1
                    );
                    broken[way].push(format!("{signal} {}: {e}", round + 1));
                    f64::NAN
                }
            };
            let new_name = format!("b{}", standby + 1);
            let repointed = repointed_after(&a.log_text(), &new_name, event);
            eprintln!(
                "    {signal} {}: traffic resumed after {resumed:.3} s (site A repointed site b after {repointed:.3} s); TCP stalled {stall:.3} s",
                round + 1
            );
            if resumed > 6.0 {
                eprintln!(
                    "--- site A's log ---\n{}\n--- {new_name}'s log ---\n{}",
                    a.log_text(),
                    b[standby].log_text()
                );
            }
            into.push(resumed);
            if signal == "HOST" {
                // The host comes back; its tunneld, whose lease expired meanwhile, joins
                // again and stands by.
                wan.reconnect(&underlay(active));
                lan.run(&["ip", "link", "set", &lan_ports[active], "up"]);
                let back = Instant::now();
                wait_for("the gateway whose host came back stands by", || {
                    b[active]
                        .show(fleet.tunneld)
                        .contains(&format!("{}standby)", name(active)))
                })
                .map_err(|e| format!("{e}\n{}", b[active].log_text()))?;
                eprintln!(
                    "    its host back, b{} stands by after {:.2} s",
                    active + 1,
                    back.elapsed().as_secs_f64()
                );
            } else {
                b[active].start(fleet.tunneld)?;
            }
            active = standby;
        }
    }
    samples.stalls = stalls;
    samples.broken = broken;
    Ok(samples)
}

/// N sites in a mesh, then one more: per origin, the seconds until it reached the new one.
/// Also measures the fleet at rest into `rest`.
fn join(
    fleet: &Fleet,
    wan: &Underlay,
    n: usize,
    options: &Options,
    rest: &mut String,
) -> Result<Vec<f64>, String> {
    eprintln!("==> joining: a mesh of {n} sites, then one more");
    let prefix = format!("/tunneld/bench-join-{n}");
    let mut namespaces = Vec::new();
    let mut gateways = Vec::new();
    for i in 0..n {
        let underlay = format!("192.0.2.{}", 100 + i);
        let ns = wan.host(&format!("{underlay}/24"));
        let g = fleet.gateway(
            &ns,
            Some(&prefix),
            Spec {
                underlay: &underlay,
                site: &format!("s{i}"),
                gateway: "g",
                address: Some(&format!("10.64.{i}.1/32")),
                subnet: &format!("10.64.{i}.0/24"),
                mode: None,
            },
        )?;
        namespaces.push(ns);
        gateways.push(g);
    }
    // Many gateways joining at once are many writes for etcd (a lease, a record, an
    // election key each), which a loaded machine's disk may take a while to sync.
    let formed = wait_for_within(
        "the mesh forms",
        STEP_LIMIT + Duration::from_secs(2 * n as u64),
        || gateways.iter().all(|g| g.peer_count() == n - 1),
    );
    if let Err(e) = formed {
        let short: Vec<&Gateway> = gateways.iter().filter(|g| g.peer_count() < n - 1).collect();
        let first = short.iter().min_by_key(|g| g.peer_count());
        return Err(format!(
            "{e}: {} of {n} gateways short of peers; the one with the fewest:\n{}\n{}",
            short.len(),
            first.map(|g| g.log_text()).unwrap_or_default(),
            first.and_then(|g| g.pid()).map(stacks).unwrap_or_default()
        ));
    }
    let new_ns = wan.host("192.0.2.99/24");
    let started = Instant::now();
    let newcomer = fleet.gateway(
        &new_ns,
        Some(&prefix),
        Spec {
            underlay: "192.0.2.99",
            site: "new",
            gateway: "g",
            address: Some("10.65.0.1/32"),
            subnet: "10.65.0.0/24",
            mode: None,
        },
    )?;
    // Per site, a ping every 100 ms until the first reply, started again when one ends
    // without (at once while the site has no route to the new one yet: ping gives up on
    // "network unreachable"); 60 s at most. Its -D time is when the reply came.
    let started_unix = unix_now() - started.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(60);
    let replies: Vec<Option<f64>> = std::thread::scope(|scope| {
        let pingers: Vec<_> = namespaces
            .iter()
            .map(|ns| {
                scope.spawn(move || {
                    while Instant::now() < deadline {
                        let out = ns
                            .command("ping")
                            .args(["-D", "-n", "-c", "1", "-i", "0.1", "-w", "1", "10.65.0.1"])
                            .stderr(Stdio::null())
                            .output()
                            .ok()?;
                        let stdout = String::from_utf8_lossy(&out.stdout);
                        if let Some(at) = etcd::ping_reply_times(&stdout).first() {
                            return Some(*at);
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    None
                })
            })
            .collect();
        pingers
            .into_iter()
            .map(|p| p.join().ok().flatten())
            .collect()
    });
    let mut joined = Vec::new();
    for reply in replies {
        match reply {
            Some(at) => joined.push(at - started_unix),
            None => {
                return Err(format!(
                    "a site did not reach the new one within 60 s:\n{}\n{}",
                    newcomer.log_text(),
                    newcomer.pid().map(stacks).unwrap_or_default()
                ));
            }
        }
    }
    gateways.push(newcomer);

    eprintln!("==> at rest: {} s", options.rest_seconds);
    let plain_ns = wan.host("192.0.2.98/24");
    let plain = fleet.gateway(
        &plain_ns,
        None,
        Spec {
            underlay: "192.0.2.98",
            site: "",
            gateway: "",
            address: Some("10.66.0.1/32"),
            subnet: "",
            mode: None,
        },
    )?;
    std::thread::sleep(Duration::from_secs(2));
    let pids: Vec<u32> = gateways.iter().filter_map(Gateway::pid).collect();
    let plain_pid: Vec<u32> = plain.pid().into_iter().collect();
    let messages_before = etcd_messages(fleet.cluster, &wan.ns)?;
    let (cpu_before, plain_before) = (cpu_seconds(&pids), cpu_seconds(&plain_pid));
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(options.rest_seconds));
    let seconds = t0.elapsed().as_secs_f64();
    let messages = etcd_messages(fleet.cluster, &wan.ns)? - messages_before;
    let cpu = (cpu_seconds(&pids) - cpu_before) / pids.len().max(1) as f64;
    let plain_cpu = cpu_seconds(&plain_pid) - plain_before;
    let rss = median(
        pids.iter()
            .map(|p| rss_kib(*p).unwrap_or(0) as f64)
            .collect(),
    );
    let plain_rss = plain_pid
        .first()
        .map_or(f64::NAN, |p| rss_kib(*p).unwrap_or(0) as f64);
    let per_minute = messages / pids.len().max(1) as f64 * 60.0 / seconds;
    rest.push_str(&format!(
        "\nAt rest with N + 1 = {} gateways, over {seconds:.0} s: **{per_minute:.0} etcd requests \
         per gateway per minute** (gRPC messages the members received: the lease keep-alives, \
         one per third of the TTL); CPU of a gateway {} with `[fleet]` against {} without it; \
         resident memory {} against {} (the fleet client's share is the difference).\n",
        pids.len(),
        cell(cpu * 1000.0 / seconds * 60.0, 0, " ms per minute"),
        cell(plain_cpu * 1000.0 / seconds * 60.0, 0, " ms"),
        cell(rss / 1024.0, 1, " MiB"),
        cell(plain_rss / 1024.0, 1, " MiB"),
    ));
    drop(plain);
    drop(gateways);
    Ok(joined)
}

/// Seconds from `event` (Unix time) to site A's last log line saying site b is served by
/// `name`.
fn repointed_after(log: &str, name: &str, event: f64) -> f64 {
    let needle = format!("site b is served by {name} now");
    log.lines()
        .rev()
        .find(|l| l.contains(&needle))
        .map_or(f64::NAN, |l| etcd::logged_after(l, event))
}

/// gRPC messages the members have received, summed (from each one's metrics, read from
/// `ns`, a namespace on their bridge).
fn etcd_messages(cluster: &Cluster, ns: &NetNs) -> Result<f64, String> {
    let mut total = 0.0;
    for i in 0..cluster.len() {
        let url = cluster.metrics_url(i);
        let (host, path) = url
            .strip_prefix("http://")
            .and_then(|r| r.split_once('/'))
            .map(|(h, p)| (h.to_string(), format!("/{p}")))
            .ok_or("bad metrics URL")?;
        let body = ns.in_ns(move || http_get(&host, &path))?;
        total += body
            .lines()
            .filter(|l| l.starts_with("grpc_server_msg_received_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    Ok(total)
}

/// A plain HTTP/1.0 GET (etcd's metrics listener), bounded in time.
pub(crate) fn http_get(host: &str, path: &str) -> Result<String, String> {
    use std::io::Read as _;
    let addr: std::net::SocketAddr = host.parse().map_err(|_| format!("bad address {host}"))?;
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("GET {host}{path}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .map_err(|e| format!("GET {host}{path}: {e}"))?;
    let mut body = String::new();
    stream
        .read_to_string(&mut body)
        .map_err(|e| format!("GET {host}{path}: {e}"))?;
    Ok(body)
}

/// Where a process's threads are (gdb's backtraces, when gdb is there), for a report.
pub(crate) fn stacks(pid: u32) -> String {
    Command::new("gdb")
        .args([
            "-p",
            &pid.to_string(),
            "-batch",
            "-ex",
            "thread apply all bt 12",
        ])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}
