//! `cargo xtask bench-nat`: sites behind NAT (issue 48). One etcd member (TLS), a public
//! relay site (`[fleet] relay = true`, where this build has relays) and, per round, two
//! fresh sites whose gateways (`tunneld up`) sit behind the NAT kinds of a pair: none
//! (public), endpoint-independent mapping, endpoint-dependent mapping, only TCP 443 out
//! (`testnet::nat`), all on one routed underlay (192.0.2.0/24) in network namespaces.
//!
//! Per pair and round:
//! - first packet: from the moment both gateways are up (their UAPI sockets answer) to the
//!   first reply of a ping from site A's address to site B's (a ping every 10 ms);
//! - the path: what `tunneld show` on A says of B (direct or relayed), checked against what
//!   the pair's NATs allow;
//! - recovery: a ping every 10 ms from A to B while B's NAT (A's, when B has none) forgets
//!   its mappings (`conntrack -F`): the time until replies flow again.
//!
//! Throughput and RTT, direct against relayed for the same pair kind: two sites behind
//! endpoint-independent NATs punch a direct path; the same pair with everything between
//! the two routers' public addresses dropped (an nftables rule on A's router) can only go
//! through the relay. Those two pairs alternate round by round (iperf3, one TCP stream; ping), and
//! over the relayed round the relay's CPU (utime + stime of its tunneld) per Gbit moved.

use crate::fleet_bench::{back_after, iperf, unix_now, Fleet, Gateway, Probe, Spec};
use crate::report::{self, cell, median, Table};
use crate::system;
use crate::testbed::cpu_seconds;
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};
use tunneld_testnet::etcd::{ping_reply_times, Cluster, Underlay};
use tunneld_testnet::nat::{Nat, NatKind};
use tunneld_testnet::{unique_name, NetNs};

const MEMBER: &str = "192.0.2.11";
/// The relay site's underlay address is 192.0.2.RELAY_HOST, its subnet 10.RELAY_HOST.0.0/24.
const RELAY_HOST: u8 = 31;
const PREFIX: &str = "/tunneld/nat-bench";
/// Where the relay's `/metrics` listens, inside its namespace.
const RELAY_METRICS: &str = "127.0.0.1:9586";
/// The sites' underlay addresses are 192.0.2.N for N in this range, one per site over the
/// whole run; N is also its subnet's second octet (10.N.0.0/24) and its name (`sN`).
const SITE_HOSTS: std::ops::RangeInclusive<u8> = 40..=250;
/// The longest a ping may wait for its first reply (or replies for a recovery) before the
/// bench gives up on the pair.
const STEP_LIMIT: Duration = Duration::from_secs(20);
/// How long after the first packet the path `tunneld show` says may take to become the
/// one the NATs allow: a pair that can go direct may meet through the relay first (the
/// relay is asked for after 1 s of search, the punch may take longer) and then tries a
/// direct path once every 10 s.
const PATH_LIMIT: Duration = Duration::from_secs(15);
/// Pings per RTT sample.
const RTT_PINGS: u32 = 20;

struct Options {
    rounds: usize,
    seconds: u32,
    quick: bool,
    update_docs: bool,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        rounds: 3,
        seconds: 3,
        quick: false,
        update_docs: false,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => {
                o.quick = true;
                o.rounds = 1;
                o.seconds = 1;
            }
            "--update-docs" => o.update_docs = true,
            "--rounds" => {
                o.rounds = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|n| (1..=10).contains(n))
                    .ok_or("--rounds takes a number, 1-10")?
            }
            "--seconds" => {
                o.seconds = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|n| (1..=30).contains(n))
                    .ok_or("--seconds takes a number, 1-30")?
            }
            other => return Err(format!("bench-nat: unknown option {other:?}")),
        }
    }
    if o.quick && o.update_docs {
        return Err("--update-docs takes a full run, not --quick".into());
    }
    Ok(o)
}

/// What stands between a site and the underlay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Public,
    Behind(NatKind),
}

impl Kind {
    const EIM: Kind = Kind::Behind(NatKind::EndpointIndependent);
    const EDM: Kind = Kind::Behind(NatKind::EndpointDependent);
    const TCP443: Kind = Kind::Behind(NatKind::Tcp443Only);

    fn label(self) -> &'static str {
        match self {
            Kind::Public => "public",
            Kind::Behind(NatKind::EndpointIndependent) => "EIM NAT",
            Kind::Behind(NatKind::EndpointDependent) => "EDM NAT",
            Kind::Behind(NatKind::Tcp443Only) => "TCP 443 only",
        }
    }
}

/// Two sites' NAT kinds; `blocked`: everything between their routers dropped (`Nat::block`).
#[derive(Debug, Clone, Copy)]
struct Pair {
    a: Kind,
    b: Kind,
    blocked: bool,
}

impl Pair {
    const fn new(a: Kind, b: Kind) -> Pair {
        Pair {
            a,
            b,
            blocked: false,
        }
    }

    fn name(&self) -> String {
        let block = if self.blocked {
            ", traffic between them dropped"
        } else {
            ""
        };
        format!("{} – {}{block}", self.a.label(), self.b.label())
    }

    /// Whether the pair's NATs leave only the relay: a side that sends only TCP 443 (over
    /// the relay's TLS listener); both behind NAT, not both endpoint-independent (a
    /// port-restricted NAT only lets in whom its site sent to, and an endpoint-dependent
    /// one maps each destination to a port nobody else saw); or a block between them.
    fn relayed(&self) -> bool {
        match (self.a, self.b) {
            (Kind::TCP443, _) | (_, Kind::TCP443) => true,
            (Kind::Public, _) | (_, Kind::Public) => false,
            (Kind::EIM, Kind::EIM) => self.blocked,
            _ => true,
        }
    }

    /// The pairs the throughput rounds compare.
    fn compared(&self) -> bool {
        self.a == Kind::EIM && self.b == Kind::EIM
    }
}

const EIM_EIM_BLOCKED: Pair = Pair {
    a: Kind::EIM,
    b: Kind::EIM,
    blocked: true,
};

fn pairs(quick: bool) -> Vec<Pair> {
    use Kind::Public;
    if quick {
        return vec![
            Pair::new(Public, Kind::EIM),
            Pair::new(Kind::EIM, Kind::EIM),
            EIM_EIM_BLOCKED,
        ];
    }
    vec![
        Pair::new(Public, Public),
        Pair::new(Public, Kind::EIM),
        Pair::new(Public, Kind::EDM),
        Pair::new(Kind::EIM, Kind::EIM),
        Pair::new(Kind::EIM, Kind::EDM),
        Pair::new(Kind::EDM, Kind::EDM),
        EIM_EIM_BLOCKED,
        Pair::new(Public, Kind::TCP443),
        Pair::new(Kind::EIM, Kind::TCP443),
    ]
}

pub fn run(args: &[String]) -> Result<(), String> {
    let options = parse(args)?;
    if let Some(why) = tunneld_testnet::netns_unusable() {
        return Err(format!("bench-nat needs network namespaces: {why}"));
    }
    system::install_tools()?;
    let tunneld = system::build_tunneld()?;
    let dir = std::env::temp_dir().join(unique_name("natb"));
    fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let began = Instant::now();
    let result = measure(&tunneld, &dir, &options);
    // FLEET_BENCH_KEEP=1 keeps the gateways' configs and logs, to read after a run.
    if std::env::var_os("FLEET_BENCH_KEEP").is_none() {
        let _ = fs::remove_dir_all(&dir);
    }
    let results = result?;
    let markdown = format!(
        "{}\n\n{}",
        report::measured_line("bench-nat", args),
        render(&results, &options, began.elapsed())
    );
    let root = system::repo_root()?;
    let report_dir = system::target_dir(&root).join("bench-report");
    report::write(&report_dir, "nat-report.md", &markdown)?;
    if options.update_docs {
        report::update_front_page(&root, "nat", &markdown)?;
    }
    Ok(())
}

/// One site: its place on the underlay (behind its NAT or not).
enum Place {
    Public { ns: NetNs, addr: String },
    Behind(Nat),
}

impl Place {
    fn new(wan: &Underlay, kind: Kind, host: u8) -> Place {
        let cidr = format!("192.0.2.{host}/24");
        match kind {
            Kind::Public => Place::Public {
                ns: wan.host(&cidr),
                addr: format!("192.0.2.{host}"),
            },
            // One NAT slot per host number: never two alike at once.
            Kind::Behind(kind) => {
                let nat = Nat::new(wan, &cidr, host % 64, kind);
                if kind == NatKind::Tcp443Only {
                    // Its fleet's store, as a network that lets TCP 443 out would reach it.
                    nat.allow_tcp(MEMBER, 2379);
                }
                Place::Behind(nat)
            }
        }
    }

    fn ns(&self) -> &NetNs {
        match self {
            Place::Public { ns, .. } => ns,
            Place::Behind(nat) => &nat.site,
        }
    }

    fn public(&self) -> &str {
        match self {
            Place::Public { addr, .. } => addr,
            Place::Behind(nat) => &nat.public,
        }
    }

    /// What its gateway advertises: all it knows of itself.
    fn advertised(&self) -> &str {
        match self {
            Place::Public { addr, .. } => addr,
            Place::Behind(nat) => &nat.private,
        }
    }

    fn nat(&self) -> Option<&Nat> {
        match self {
            Place::Public { .. } => None,
            Place::Behind(nat) => Some(nat),
        }
    }
}

/// The path `show` says this gateway has to site `site`'s gateway, as written there
/// (`direct via …`, `relayed via …`, `searching …`); `None` when it lists no such gateway.
fn path_of(show: &str, site: &str) -> Option<String> {
    let head = format!("  {site}/gw ");
    let line = show.lines().find(|l| l.starts_with(&head))?;
    let path = line.split_once(", path ")?.1;
    Some(path.split(", seen for ").next().unwrap_or(path).to_string())
}

/// `direct`, `relayed` or what else the path says, without addresses and times.
fn path_kind(path: &str) -> &str {
    path.split_whitespace().next().unwrap_or("none")
}

/// Pings `addr` from `ns` every 10 ms until one answers (a ping started again while the
/// route is missing: ping gives up at once on "network unreachable"); the reply's Unix time.
fn first_reply(ns: &NetNs, addr: &str) -> Result<f64, String> {
    let deadline = Instant::now() + STEP_LIMIT;
    loop {
        system::check_interrupted()?;
        let left = deadline.saturating_duration_since(Instant::now()).as_secs() + 1;
        let out = system::output_within(
            ns.command("ping").args([
                "-D",
                "-n",
                "-c",
                "1",
                "-i",
                "0.01",
                "-w",
                &left.to_string(),
                addr,
            ]),
            Duration::from_secs(left + 5),
        )?;
        if let Some(at) = ping_reply_times(&String::from_utf8_lossy(&out.stdout)).first() {
            return Ok(*at);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "no reply to a ping within {} s",
                STEP_LIMIT.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The median round trip (ms) of [`RTT_PINGS`] pings, 10 ms apart.
fn rtt_ms(ns: &NetNs, addr: &str) -> Result<f64, String> {
    let out = system::output_within(
        ns.command("ping").args([
            "-n",
            "-c",
            &RTT_PINGS.to_string(),
            "-i",
            "0.01",
            "-W",
            "1",
            addr,
        ]),
        Duration::from_secs(30),
    )?;
    let text = String::from_utf8_lossy(&out.stdout);
    let times: Vec<f64> = text
        .lines()
        .filter_map(|l| l.split("time=").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    if times.is_empty() {
        return Err(format!("no ping answered: {}", text.trim()));
    }
    Ok(median(times))
}

/// The value of the metric `name` (summed over its label sets) in `/metrics` text.
fn metric(text: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = text
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// The relay's `/metrics`, read inside its namespace (empty when it does not answer).
fn relay_metrics(ns: &NetNs) -> String {
    ns.in_ns(|| crate::fleet_bench::http_get(RELAY_METRICS, "/metrics"))
        .unwrap_or_default()
}

/// What the bench set up and keeps over every round.
struct Bench<'a> {
    tunneld: &'a Path,
    dir: &'a Path,
    wan: &'a Underlay,
    fleet: Fleet<'a>,
    relay_ns: &'a NetNs,
    relay: &'a Gateway,
    seconds: u32,
}

/// What one round of a pair gave.
struct Round {
    /// Seconds from both gateways up to the first ping reply.
    first_packet: f64,
    /// The path A's `show` said B has, once it was the one the NATs allow.
    path: String,
    /// The first path (`direct` or `relayed`) `show` said after the first packet.
    first_path: String,
    /// Seconds from both gateways up to `path`.
    settled: f64,
    /// Seconds from the NAT's flush until replies flowed again (0: no gap over 50 ms);
    /// `None` for a pair with no NAT.
    recovery: Option<f64>,
    /// Which side's NAT was flushed.
    flushed: Option<char>,
    throughput: Option<Throughput>,
}

struct Throughput {
    bits_per_second: f64,
    rtt_ms: f64,
    /// The relay's CPU seconds over the iperf3 run.
    relay_cpu: f64,
    /// What the relay's counter says it forwarded over the run (bytes), where it has one.
    relay_bytes: Option<f64>,
}

impl Bench<'_> {
    /// Site `host`'s gateway: named `s{host}`, with 10.{host}.0.1 and 10.{host}.0.0/24.
    /// A site that sends only TCP 443 carries its datagrams over TLS to the relay.
    fn gateway(&self, place: &Place, host: u8) -> Result<Gateway, String> {
        let tls_only = place
            .nat()
            .is_some_and(|nat| nat.kind == NatKind::Tcp443Only);
        let fleet_lines = if tls_only {
            format!(
                "transport = \"tls\"\nrelay_ca_file = \"{}\"\n",
                self.fleet.cluster.certs().join("ca.pem").display()
            )
        } else {
            String::new()
        };
        self.fleet.gateway_with(
            place.ns(),
            Some(PREFIX),
            Spec {
                underlay: place.advertised(),
                site: &format!("s{host}"),
                gateway: "gw",
                address: Some(&format!("10.{host}.0.1/32")),
                subnet: &format!("10.{host}.0.0/24"),
                mode: None,
            },
            &fleet_lines,
            "",
        )
    }

    /// What a failure says: which pair, what went wrong, and `tunneld show` of both sides
    /// and the relay, with the NATs' mappings.
    fn failure(&self, pair: &Pair, what: &str, sides: [(&Place, &Gateway); 2]) -> String {
        let mut text = format!("bench-nat: {}: {what}", pair.name());
        for ((place, gateway), side) in sides.iter().zip(["A", "B"]) {
            text.push_str(&format!(
                "\n--- site {side} ({} at {}): tunneld show ---\n{}",
                place.advertised(),
                place.public(),
                gateway.show(self.tunneld).trim_end()
            ));
            if let Some(nat) = place.nat() {
                text.push_str(&format!(
                    "\n--- site {side}'s NAT: its mappings ---\n{}",
                    nat.mappings().trim_end()
                ));
            }
        }
        text.push_str(&format!(
            "\n--- the relay: tunneld show ---\n{}",
            self.relay.show(self.tunneld).trim_end()
        ));
        text
    }

    /// One round of `pair` on two fresh sites; with `throughput`, iperf3 and RTT too.
    fn round(&self, pair: &Pair, hosts: (u8, u8), throughput: bool) -> Result<Round, String> {
        let (ha, hb) = hosts;
        let a = Place::new(self.wan, pair.a, ha);
        let b = Place::new(self.wan, pair.b, hb);
        if pair.blocked {
            a.nat()
                .ok_or("a block between two sites needs site A behind a NAT")?
                .block(b.public());
        }
        // Declared after the places: dropped (stopped) before their namespaces go.
        let ga = self.gateway(&a, ha)?;
        let gb = self.gateway(&b, hb)?;
        let up = unix_now();
        let sides = [(&a, &ga), (&b, &gb)];
        let target = format!("10.{hb}.0.1");
        let first_packet = first_reply(a.ns(), &target)
            .map_err(|e| self.failure(pair, &format!("A pings B ({target}): {e}"), sides))?
            - up;

        // The path settles on what the NATs allow (a relayed pair keeps trying a direct one).
        let want = if pair.relayed() { "relayed" } else { "direct" };
        let b_site = format!("s{hb}");
        let deadline = Instant::now() + PATH_LIMIT;
        let mut first_path = None;
        let (path, settled) = loop {
            let path = path_of(&ga.show(self.tunneld), &b_site).unwrap_or_default();
            // `show` looks at the paths five times a second: searching a moment after the
            // first packet crossed is that lag, not a path.
            let kind = path_kind(&path);
            if first_path.is_none() && (kind == "direct" || kind == "relayed") {
                first_path = Some(kind.to_string());
            }
            if kind == want {
                break (path, unix_now() - up);
            }
            if Instant::now() > deadline {
                return Err(self.failure(
                    pair,
                    &format!(
                        "A's path to B is {path:?} {} s after the first packet, not {want} \
                         (the first path it had: {})",
                        PATH_LIMIT.as_secs(),
                        first_path.as_deref().unwrap_or("none")
                    ),
                    sides,
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let first_path = first_path.unwrap_or_default();

        let throughput = if throughput {
            let relay_pid = self.relay.pid().into_iter().collect::<Vec<_>>();
            let bytes_before = metric(
                &relay_metrics(self.relay_ns),
                "tunneld_fleet_relay_bytes_total",
            );
            let cpu_before = cpu_seconds(&relay_pid);
            let bits_per_second = iperf(a.ns(), b.ns(), &target, 1, self.seconds)
                .map_err(|e| self.failure(pair, &format!("iperf3 A → B: {e}"), sides))?;
            let relay_cpu = cpu_seconds(&relay_pid) - cpu_before;
            let bytes_after = metric(
                &relay_metrics(self.relay_ns),
                "tunneld_fleet_relay_bytes_total",
            );
            let rtt_ms = rtt_ms(a.ns(), &target)
                .map_err(|e| self.failure(pair, &format!("RTT A → B: {e}"), sides))?;
            Some(Throughput {
                bits_per_second,
                rtt_ms,
                relay_cpu,
                relay_bytes: bytes_before.zip(bytes_after).map(|(b, a)| a - b),
            })
        } else {
            None
        };

        // B's NAT forgets its mappings (A's when B has none): B only answers, so its NAT
        // lets A in again once B sends of its own (its keepalives).
        let (flushed, nat) = match (b.nat(), a.nat()) {
            (Some(nat), _) => (Some('B'), Some(nat)),
            (None, Some(nat)) => (Some('A'), Some(nat)),
            (None, None) => (None, None),
        };
        let recovery = match nat {
            Some(nat) => {
                let probe = Probe::start(a.ns(), &target, self.dir.join(unique_name("probe")))?;
                // Replies flowing for half a second before the flush.
                let deadline = Instant::now() + STEP_LIMIT;
                while probe
                    .reply_times()
                    .first()
                    .is_none_or(|t| unix_now() - t < 0.5)
                {
                    system::check_interrupted()?;
                    if Instant::now() > deadline {
                        return Err(self.failure(pair, "no reply to the probe's pings", sides));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                let event = unix_now();
                nat.flush();
                let deadline = Instant::now() + STEP_LIMIT;
                loop {
                    if let Some(back) = back_after(&probe.reply_times(), event) {
                        break Some(back);
                    }
                    system::check_interrupted()?;
                    if Instant::now() > deadline {
                        return Err(self.failure(
                            pair,
                            &format!(
                                "no ping reply within {} s of the flush of site {}'s NAT",
                                STEP_LIMIT.as_secs(),
                                flushed.unwrap_or('?')
                            ),
                            sides,
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            None => None,
        };
        Ok(Round {
            first_packet,
            path,
            first_path,
            settled,
            recovery,
            flushed,
            throughput,
        })
    }
}

/// Every round of a pair.
struct PairResult {
    pair: Pair,
    rounds: Vec<Round>,
}

fn measure(tunneld: &Path, dir: &Path, options: &Options) -> Result<Vec<PairResult>, String> {
    let pairs = pairs(options.quick);
    let sites = pairs.len() * 2 * options.rounds;
    if sites > SITE_HOSTS.len() {
        return Err(format!(
            "{sites} sites asked for; the address plan holds {}",
            SITE_HOSTS.len()
        ));
    }
    eprintln!("==> NAT: one etcd member with TLS, the relay site");
    let wan = Underlay::new("192.0.2.1/24");
    let cluster = Cluster::start(&wan, &[MEMBER], true);
    let relay_ns = wan.host(&format!("192.0.2.{RELAY_HOST}/24"));
    let fleet = Fleet {
        tunneld,
        dir,
        cluster: &cluster,
        lease_ttl: None,
    };
    // The relay's TLS listener: the cluster's CA signed a certificate for the name
    // "gateway" (its client certificate), which serves here.
    let certs = cluster.certs();
    let relay_tls = format!("192.0.2.{RELAY_HOST}:443");
    let relay_lines =
        format!("relay = true\nrelay_tls = \"{relay_tls}\"\nrelay_tls_name = \"gateway\"\n");
    let relay_sections = format!(
        "\n[[tls.listen]]\nlisten = \"{relay_tls}\"\ncert_file = \"{}\"\n\
         key_file = \"{}\"\nforward_to = \"wireguard\"\n",
        certs.join("client.pem").display(),
        certs.join("client.key").display()
    );
    let relay = fleet.gateway_with(
        &relay_ns,
        Some(PREFIX),
        Spec {
            underlay: &format!("192.0.2.{RELAY_HOST}"),
            site: "relay",
            gateway: "gw",
            address: Some(&format!("10.{RELAY_HOST}.0.1/32")),
            subnet: &format!("10.{RELAY_HOST}.0.0/24"),
            mode: None,
        },
        &relay_lines,
        &format!("{relay_sections}\n[metrics]\nlisten = \"{RELAY_METRICS}\"\n"),
    )?;
    let bench = Bench {
        tunneld,
        dir,
        wan: &wan,
        fleet,
        relay_ns: &relay_ns,
        relay: &relay,
        seconds: options.seconds,
    };
    let mut results: Vec<PairResult> = pairs
        .iter()
        .map(|&pair| PairResult {
            pair,
            rounds: Vec::new(),
        })
        .collect();
    let mut hosts = SITE_HOSTS;
    // Round by round over the pairs: the direct and the relayed EIM – EIM pairs alternate.
    for round in 0..options.rounds {
        for result in results.iter_mut() {
            let pair = result.pair;
            let (Some(ha), Some(hb)) = (hosts.next(), hosts.next()) else {
                return Err("out of site addresses".into());
            };
            eprintln!(
                "==> round {} of {}: {}",
                round + 1,
                options.rounds,
                pair.name()
            );
            let r = bench.round(&pair, (ha, hb), pair.compared())?;
            eprintln!(
                "    first packet after {:.3} s, path {}{}",
                r.first_packet,
                r.path,
                r.recovery.map_or(String::new(), |s| format!(
                    ", back {s:.3} s after the flush"
                ))
            );
            result.rounds.push(r);
        }
    }
    Ok(results)
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::max)
}

fn render(results: &[PairResult], options: &Options, took: Duration) -> String {
    let mut t = Table::new(&[
        "pair (site A – site B)",
        "path A → B",
        "first packet (median)",
        "max",
        "on that path after (max)",
        "back after a NAT's flush (median)",
        "max",
        "rounds",
    ]);
    for r in results {
        let first: Vec<f64> = r.rounds.iter().map(|x| x.first_packet).collect();
        let back: Vec<f64> = r.rounds.iter().filter_map(|x| x.recovery).collect();
        let paths: std::collections::BTreeSet<&str> =
            r.rounds.iter().map(|x| path_kind(&x.path)).collect();
        let mut path = paths.into_iter().collect::<Vec<_>>().join(", ");
        // Rounds whose first packet crossed another path than the one they settled on.
        let other_first: Vec<&str> = r
            .rounds
            .iter()
            .filter(|x| x.first_path != path_kind(&x.path))
            .map(|x| x.first_path.as_str())
            .collect();
        if !other_first.is_empty() {
            path.push_str(&format!(
                " ({} first in {} of {})",
                other_first.join(", "),
                other_first.len(),
                r.rounds.len()
            ));
        }
        let settled: Vec<f64> = r.rounds.iter().map(|x| x.settled).collect();
        let flushed = r
            .rounds
            .iter()
            .find_map(|x| x.flushed)
            .map_or(String::new(), |s| format!(" ({s}'s)"));
        t.row(&[
            r.pair.name(),
            path,
            cell(median(first.clone()), 2, " s"),
            cell(max(&first), 2, " s"),
            cell(max(&settled), 2, " s"),
            if back.is_empty() {
                "– (no NAT)".into()
            } else {
                format!("{}{flushed}", cell(median(back.clone()), 2, " s"))
            },
            cell(max(&back), 2, " s"),
            r.rounds.len().to_string(),
        ]);
    }
    let mut out = format!(
        "One etcd member (TLS), a public relay site and, per round, two fresh sites whose \
         `tunneld up` gateways sit behind the pair's NATs (network namespaces on one routed \
         underlay; NATs made with nftables: EIM is endpoint-independent mapping, `masquerade`; \
         EDM endpoint-dependent, `masquerade fully-random`; both filter replies by address and \
         port). Each gateway behind NAT advertises only its private address. **First packet**: \
         from both gateways up (their UAPI sockets answer) to the first reply of a ping every \
         10 ms from A's address to B's (targets: < 1 s direct, < 2 s relayed). **Path**: what \
         `tunneld show` on A says of B, checked against what the NATs allow (a pair that can \
         go direct may meet through the relay first, and then tries a direct path every \
         10 s: \"on that path after\" is from both gateways up). **Back after a \
         NAT's flush**: a ping every 10 ms from A to B while B's NAT (A's when B has none) \
         forgets every mapping (`conntrack -F`), the time until replies flow again, 0 when no \
         gap exceeded 50 ms (target < 2 s). \
         {} round(s) per pair, pairs in turn; the whole run took {:.0} s. TCP 443 only: a NAT \
         that lets only TCP to port 443 out (and to the store); such a site's gateway carries \
         its datagrams over TLS to the relay's listener (`transport = \"tls\"`).\n\n{}\n",
        options.rounds,
        took.as_secs_f64(),
        t.render()
    );
    out.push_str(&render_throughput(results, options));
    out
}

/// Direct against relayed for EIM – EIM: throughput, RTT, the relay's CPU per Gbit.
fn render_throughput(results: &[PairResult], options: &Options) -> String {
    let of = |blocked: bool| -> Vec<&Throughput> {
        results
            .iter()
            .filter(|r| r.pair.compared() && r.pair.blocked == blocked)
            .flat_map(|r| r.rounds.iter().filter_map(|x| x.throughput.as_ref()))
            .collect()
    };
    let (direct, relayed) = (of(false), of(true));
    if direct.is_empty() {
        return String::new();
    }
    let mbit = |v: &[&Throughput]| median(v.iter().map(|x| x.bits_per_second / 1e6).collect());
    let rtt = |v: &[&Throughput]| median(v.iter().map(|x| x.rtt_ms).collect());
    // CPU seconds per Gbit of TCP payload delivered (iperf3's), in ms.
    let cpu_per_gbit: Vec<f64> = relayed
        .iter()
        .map(|x| x.relay_cpu / (x.bits_per_second * f64::from(options.seconds) / 1e9) * 1000.0)
        .collect();
    let relay_bytes: Vec<f64> = relayed.iter().filter_map(|x| x.relay_bytes).collect();
    let ratio = |r: f64, d: f64| {
        if relayed.is_empty() {
            "–".to_string()
        } else {
            format!("{:.2}×", r / d)
        }
    };
    let mut t = Table::new(&["EIM – EIM", "direct", "relayed", "relayed ÷ direct"]);
    t.row(&[
        format!("TCP throughput (iperf3, 1 stream, {} s)", options.seconds),
        cell(mbit(&direct), 0, " Mbit/s"),
        cell(mbit(&relayed), 0, " Mbit/s"),
        ratio(mbit(&relayed), mbit(&direct)),
    ]);
    t.row(&[
        format!("RTT (ping, median of {RTT_PINGS})"),
        cell(rtt(&direct), 3, " ms"),
        cell(rtt(&relayed), 3, " ms"),
        ratio(rtt(&relayed), rtt(&direct)),
    ]);
    t.row(&[
        "the relay's CPU per Gbit delivered (utime + stime)".into(),
        "–".into(),
        cell(median(cpu_per_gbit), 0, " ms"),
        String::new(),
    ]);
    let per_round = |v: &[&Throughput]| {
        v.iter()
            .map(|x| format!("{:.0}", x.bits_per_second / 1e6))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let counted = if relay_bytes.is_empty() {
        String::new()
    } else {
        format!(
            " The relay's own counter (`tunneld_fleet_relay_bytes_total`) moved {:.0} MiB per \
             relayed round (median): ciphertext both ways, acknowledgements included.",
            median(relay_bytes) / 1048576.0
        )
    };
    format!(
        "\nDirect against relayed for the same pair kind: two sites behind EIM NATs punch a \
         direct path; the same pair with everything between their routers' public addresses \
         dropped (an nftables rule on A's router; each still reaches the relay) goes through \
         the relay. The two alternate round by round, each on fresh sites (medians; target: \
         relayed ≥ 0.8× direct). Every process shares this machine's cores: the relay's \
         forwarding competes with both gateways' encryption and iperf3.\n\n{}\n\
         Per round, Mbit/s: direct {}; relayed {}.{counted}\n",
        t.render(),
        per_round(&direct),
        if relayed.is_empty() {
            "– (no relay in this build)".to_string()
        } else {
            per_round(&relayed)
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_path_is_read_per_gateway_from_show() {
        let show = "fleet s1/gw\n  relay/gw (active) at 192.0.2.31:51820, serves 10.31.0.0/24, \
                    path direct via 192.0.2.31:51820 for 3 s, seen for 3 s\n  s42/gw (active), \
                    serves 10.42.0.0/24, path relayed via relay/gw (192.0.2.31:51820) for 1 s, \
                    seen for 2 s\n  s43/gw (active), path searching for 2 s (4 addresses \
                    tried), seen for 2 s\n";
        assert_eq!(
            path_of(show, "relay").as_deref(),
            Some("direct via 192.0.2.31:51820 for 3 s")
        );
        let relayed = path_of(show, "s42").unwrap();
        assert_eq!(path_kind(&relayed), "relayed");
        assert_eq!(path_kind(&path_of(show, "s43").unwrap()), "searching");
        assert_eq!(path_of(show, "s4"), None);
    }

    #[test]
    fn which_pairs_need_the_relay() {
        assert!(!Pair::new(Kind::Public, Kind::EDM).relayed());
        assert!(!Pair::new(Kind::EIM, Kind::EIM).relayed());
        assert!(EIM_EIM_BLOCKED.relayed());
        assert!(Pair::new(Kind::EIM, Kind::EDM).relayed());
        assert!(Pair::new(Kind::EDM, Kind::EDM).relayed());
        assert!(Pair::new(Kind::Public, Kind::TCP443).relayed());
    }

    #[test]
    fn metrics_are_summed_over_labels_by_exact_name() {
        let text = "# HELP x\ntunneld_fleet_relay_bytes_total{site=\"r\"} 100\n\
                    tunneld_fleet_relay_bytes_total_other 5\n\
                    tunneld_fleet_relay_bytes_total{site=\"q\"} 20\n";
        assert_eq!(metric(text, "tunneld_fleet_relay_bytes_total"), Some(120.0));
        assert_eq!(metric(text, "tunneld_fleet_relay_datagrams_total"), None);
    }

    #[test]
    fn options_are_bounded() {
        assert!(parse(&["--rounds".into(), "0".into()]).is_err());
        assert!(parse(&["--seconds".into(), "31".into()]).is_err());
        assert!(parse(&["--quick".into(), "--update-docs".into()]).is_err());
        assert_eq!(parse(&["--rounds".into(), "5".into()]).unwrap().rounds, 5);
        // Every site of a full run has an address of its own.
        assert!(pairs(false).len() * 2 * 10 <= SITE_HOSTS.len());
    }
}
