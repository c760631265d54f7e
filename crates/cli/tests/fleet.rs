//! The fleet on etcd, end to end: a three-member etcd cluster (TLS, client certificates),
//! each member in a namespace of its own, and gateways of sites A, B (two gateways) and C in
//! theirs, all on one routed underlay (192.0.2.0/24). Site B's gateways share a LAN with a
//! host (10.2.0.10) whose traffic to other sites goes to B1, or to B2 when B1's link is
//! gone; each B gateway sends what it cannot carry (stopped, or standing by) to the other.
//! A second LAN host (10.2.0.20) routes the other sites through site B's LAN addresses
//! (10.2.0.1, fd00:2::1) alone, which B's active gateway holds: through every failover
//! below they move (its neighbour entries follow), and no two B gateways ever hold them at
//! once (sampled every ~50 ms), also when the active one is cut off etcd alone.
//!
//! One test, in steps, so that the cluster and the gateways are set up once: the mesh forms
//! from empty files; a fourth site joins; site B's active gateway is killed (-9) during a
//! transfer and a standby takes over; then stopped (SIGTERM); an etcd member dies; the
//! whole store stops for 60 s; records written by hand are refused; a second gateway given
//! a live gateway's name is refused on both sides and never routed to (issue 49); the active
//! gateway's record and election key, deleted by hand, come back; site B's active
//! gateway's host dies (its links cut, nothing of it forwards) and the standby takes over,
//! and when the host comes back its gateway stands by; site F's two gateways run
//! active-active (A's flows land on both, a kill -9 of one moves its flows to the other,
//! every byte intact); a client without a certificate is refused. Failover and join times are printed (measured, not asserted beyond a
//! generous bound: `cargo xtask bench-fleet` measures them).
//!
//! A second test, beside it on an underlay and etcd of its own, has sites behind NAT.

mod common;

use common::*;
use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tunneld_testnet::etcd::{self, link, Cluster, Underlay};
use tunneld_testnet::nat::{Nat, NatKind};
use tunneld_testnet::{require_tool, unique_name, NetNs};

const PREFIX: &str = "/tunneld/test";
const MEMBERS: [&str; 3] = ["192.0.2.11", "192.0.2.12", "192.0.2.13"];
/// How long a step may take to converge before the test fails (far above what it takes).
const CONVERGE: Duration = Duration::from_secs(30);

fn require(test: &str) -> bool {
    require_netns_and_wg(test)
        && require_tool(test, "etcd")
        && require_tool(test, "etcdctl")
        && require_tool(test, "openssl")
        && require_tool(test, "nft")
}

/// A site's gateway: its namespace, key and config body (to restart it).
struct Site {
    name: &'static str,
    gateway: &'static str,
    key: String,
    public: String,
    ifname: String,
    body: String,
}

impl Site {
    fn new(
        cluster: &Cluster,
        name: &'static str,
        gateway: &'static str,
        n: u8,
        host: u8,
        own_address: bool,
    ) -> Site {
        let key = genkey();
        let public = pubkey(&key);
        let underlay = format!("192.0.2.{host}");
        let certs = cluster.certs();
        let endpoints: Vec<String> = cluster
            .endpoints()
            .iter()
            .map(|e| format!("\"{e}\""))
            .collect();
        let address = if own_address {
            format!("address = [\"10.{n}.0.1/32\", \"fd00:{n}::1/128\"]\n")
        } else {
            String::new()
        };
        let body = format!(
            "listen_port = 51820\n{address}\n[fleet]\netcd = [{}]\nca_file = \"{}\"\n\
             cert_file = \"{}\"\nkey_file = \"{}\"\nprefix = \"{PREFIX}\"\nsite = \"{name}\"\n\
             gateway = \"{gateway}\"\nadvertise = [\"{underlay}:51820\"]\n\
             subnets = [\"10.{n}.0.0/24\", \"fd00:{n}::/64\"]\n",
            endpoints.join(", "),
            certs.join("ca.pem").display(),
            certs.join("client.pem").display(),
            certs.join("client.key").display(),
        );
        Site {
            name,
            gateway,
            key,
            public,
            ifname: unique_name("fl"),
            body,
        }
    }

    fn start(&self, ns: &NetNs) -> Gateway {
        step(&format!("start gateway {}/{}", self.name, self.gateway));
        Gateway::start(ns, &self.ifname, &self.key, &self.body)
    }
}

fn peers(ns: &NetNs, ifname: &str) -> BTreeSet<String> {
    ns.run(&["wg", "show", ifname, "peers"])
        .lines()
        .map(str::to_string)
        .collect()
}

fn wait_peers(ns: &NetNs, ifname: &str, want: &[&Site], what: &str) {
    let want: BTreeSet<String> = want.iter().map(|s| s.public.clone()).collect();
    let deadline = Instant::now() + CONVERGE;
    loop {
        let have = peers(ns, ifname);
        if have == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: peers are {have:?}, want {want:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Pings `addr` from `ns` until it answers; the time it took.
fn reachable(ns: &NetNs, addr: &str) -> Duration {
    let start = Instant::now();
    loop {
        let out = ns.output(&["ping", "-c", "1", "-W", "1", addr]);
        if out.status.success() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < CONVERGE,
            "{addr} unreachable from {} for {CONVERGE:?}",
            ns.name()
        );
    }
}

fn show(ns: &NetNs, ifname: &str) -> String {
    let out = ns.output(&[common::TUNNELD, "show", ifname]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Site A's `GET /metrics`, from inside its namespace.
fn scrape(ns: &NetNs) -> String {
    ns.in_ns(|| {
        let mut stream = TcpStream::connect("127.0.0.1:9586").expect("metrics listener");
        stream.set_read_timeout(Some(WAIT)).unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).unwrap();
        text
    })
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Pings every 50 ms (bounded to `seconds`) and tells when replies resumed after an event.
struct Probe {
    child: Child,
    out: PathBuf,
    _dir: tempfile::TempDir,
}

impl Probe {
    fn start(ns: &NetNs, addr: &str, seconds: u32) -> Probe {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("ping.out");
        let child = ns
            .command("ping")
            .args([
                "-D",
                "-n",
                "-i",
                "0.05",
                "-W",
                "1",
                "-w",
                &seconds.to_string(),
                addr,
            ])
            .stdout(fs::File::create(&out).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Probe {
            child,
            out,
            _dir: dir,
        }
    }

    fn reply_times(&self) -> Vec<f64> {
        etcd::ping_reply_times(&fs::read_to_string(&self.out).unwrap_or_default())
    }

    /// Seconds from `event` (Unix time) until replies flowed again after the gap it caused;
    /// waits for them (bounded).
    fn resumed_after(&self, event: f64) -> f64 {
        let deadline = Instant::now() + CONVERGE;
        loop {
            let times = self.reply_times();
            if let Some(resumed) = etcd::resumed_after(&times, event) {
                return resumed;
            }
            if Instant::now() > deadline {
                // No gap: traffic never stopped.
                if times.iter().any(|t| *t > event + 1.0) {
                    return 0.0;
                }
                panic!("no reply after the event");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `len` bytes to `to_addr` in `to`, paced (64 KiB per 10 ms) so that it lasts
/// through an event; returns a handle that checks every byte arrived.
fn paced_transfer(
    from: &NetNs,
    to: &NetNs,
    to_addr: SocketAddr,
    len: usize,
) -> std::thread::JoinHandle<()> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let receiver = to.spawn_in_ns(move || {
        let listener = TcpListener::bind(to_addr).expect("listen");
        ready_tx.send(()).unwrap();
        let (mut stream, _) = listener.accept().expect("accept");
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let mut got = Vec::with_capacity(len);
        stream.read_to_end(&mut got).expect("receive");
        got
    });
    ready_rx.recv_timeout(WAIT).expect("listener ready");
    let sender = from.spawn_in_ns(move || {
        let data = pattern(len, 7);
        let mut stream = TcpStream::connect_timeout(&to_addr, WAIT).expect("connect");
        stream
            .set_write_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        for chunk in data.chunks(64 * 1024) {
            stream.write_all(chunk).expect("send");
            std::thread::sleep(Duration::from_millis(10));
        }
        stream.shutdown(std::net::Shutdown::Write).unwrap();
    });
    std::thread::spawn(move || {
        sender.join().expect("sender");
        let got = receiver.join().expect("receiver");
        assert_eq!(got.len(), len, "bytes received across the failover");
        assert!(got == pattern(len, 7), "bytes differ across the failover");
    })
}

/// Seconds from `event` (Unix time) to the last log line with `needle`.
fn logged_after(log: &str, needle: &str, event: f64) -> f64 {
    log.lines()
        .rfind(|l| l.contains(needle))
        .map_or(f64::NAN, |l| etcd::logged_after(l, event))
}

/// The log lines from `event` (Unix time) to `seconds` after it.
fn log_window(log: &str, event: f64, seconds: f64) -> String {
    log.lines()
        .filter(|l| {
            let t = logged_after(l, "", event);
            t.is_finite() && t <= seconds
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `wg show <if> allowed-ips`: each peer's allowed IPs, as one line.
fn ns_allowed_ips(ns: &NetNs, ifname: &str) -> std::collections::BTreeMap<String, String> {
    ns.run(&["wg", "show", ifname, "allowed-ips"])
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(k, r)| (k.to_string(), r.to_string()))
        .collect()
}

/// `wg show <if> transfer`: each peer's bytes (received, sent).
fn ns_transfer(ns: &NetNs, ifname: &str) -> std::collections::BTreeMap<String, (u64, u64)> {
    ns.run(&["wg", "show", ifname, "transfer"])
        .lines()
        .filter_map(|l| {
            let mut f = l.split('\t');
            let key = f.next()?.to_string();
            Some((key, (f.next()?.parse().ok()?, f.next()?.parse().ok()?)))
        })
        .collect()
}

fn count(text: &str, needle: &str) -> usize {
    text.matches(needle).count()
}

/// Site B's LAN addresses, held by its active gateway; the LAN host 10.2.0.20 routes the
/// other sites through them alone.
const VIP4: &str = "10.2.0.1/24";
const VIP6: &str = "fd00:2::1/64";

/// A B gateway's LAN interface: its namespace's name and the interface's.
#[derive(Clone)]
struct LanPort {
    ns: String,
    ifname: String,
}

impl LanPort {
    /// Whether it holds either of the LAN addresses now.
    fn holds_vip(&self) -> bool {
        let out = std::process::Command::new("ip")
            .args(["-n", &self.ns, "-o", "addr", "show", "dev", &self.ifname])
            .output()
            .expect("ip addr");
        let text = String::from_utf8_lossy(&out.stdout);
        text.contains(&format!("inet {VIP4} ")) || text.contains(&format!("inet6 {VIP6} "))
    }

    fn mac(&self) -> String {
        let out = std::process::Command::new("ip")
            .args(["-n", &self.ns, "-o", "link", "show", "dev", &self.ifname])
            .output()
            .expect("ip link");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.split("link/ether ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("no MAC in {text}"))
            .to_string()
    }
}

/// The MAC the LAN host's neighbour entry gives `addr` (empty without one).
fn neighbour_mac(host: &NetNs, addr: &str) -> String {
    let out = host.run(&["ip", "neigh", "show", addr]);
    out.split("lladdr ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or("")
        .to_string()
}

/// Samples which of B's gateways hold the LAN addresses every ~50 ms until `stop`: each
/// sample is (Unix time, B1 holds, B2 holds).
struct VipWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<(f64, bool, bool)>>>,
}

impl VipWatch {
    fn start(ports: &[LanPort; 2]) -> VipWatch {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (flag, ports) = (stop.clone(), ports.clone());
        let thread = std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                let t = unix_now();
                samples.push((t, ports[0].holds_vip(), ports[1].holds_vip()));
                std::thread::sleep(Duration::from_millis(40));
            }
            samples
        });
        VipWatch {
            stop,
            thread: Some(thread),
        }
    }

    /// The samples, after checking that no two gateways held the addresses at once.
    fn stop(mut self) -> Vec<(f64, bool, bool)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let samples = self.thread.take().unwrap().join().unwrap();
        let both: Vec<f64> = samples.iter().filter(|s| s.1 && s.2).map(|s| s.0).collect();
        assert!(
            both.is_empty(),
            "both B gateways held the LAN addresses at {both:?} (of {} samples)",
            samples.len()
        );
        samples
    }
}

impl Drop for VipWatch {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Seconds from `event` to the first sample after it in which `holder` (0: B1, 1: B2)
/// holds the addresses (`holds`) or not.
fn first_sample(samples: &[(f64, bool, bool)], event: f64, holder: usize, holds: bool) -> f64 {
    samples
        .iter()
        .find(|s| s.0 >= event && [s.1, s.2][holder] == holds)
        .map_or(f64::NAN, |s| s.0 - event)
}

#[test]
fn a_fleet_forms_fails_over_and_outlives_its_store() {
    if !require("a_fleet_forms_fails_over_and_outlives_its_store") {
        return;
    }
    let wan = Underlay::new("192.0.2.1/24");
    step("etcd: certificates and three members");
    let cluster = Cluster::start(&wan, &MEMBERS, true);

    step("namespaces of sites A, B (two gateways and a LAN host) and C");
    let na = wan.host("192.0.2.21/24");
    let nb1 = wan.host("192.0.2.22/24");
    let nb2 = wan.host("192.0.2.23/24");
    let nc = wan.host("192.0.2.24/24");
    let nd = wan.host("192.0.2.25/24");
    let lan = NetNs::new();
    lan.without_redirects();
    lan.run(&["ip", "link", "add", "brb", "type", "bridge"]);
    lan.run(&["ip", "addr", "add", "10.2.0.10/24", "dev", "brb"]);
    lan.run(&[
        "ip",
        "-6",
        "addr",
        "add",
        "fd00:2::10/64",
        "dev",
        "brb",
        "nodad",
    ]);
    lan.run(&["ip", "link", "set", "brb", "up"]);
    // The LAN bridge's end of each B gateway's link, to cut a host off.
    let mut lan_ports = Vec::new();
    // Each B gateway's end, which holds the LAN addresses while it is active.
    let mut vip_ports = Vec::new();
    for (ns, own, other) in [(&nb1, "2", "3"), (&nb2, "3", "2")] {
        // A standby hands the LAN's packets back onto the LAN (the fallback route below); an
        // ICMP redirect for them would send the LAN host straight to the other gateway, and
        // keep it there for minutes after that one's host dies (docs/fleet.md, §3).
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
        ns.run(&[
            "ip",
            "-6",
            "addr",
            "add",
            &format!("fd00:2::{own}/64"),
            "dev",
            &inside,
            "nodad",
        ]);
        ns.run(&["ip", "link", "set", &inside, "up"]);
        lan.run(&["ip", "link", "set", &outside, "master", "brb", "up"]);
        lan_ports.push(outside);
        vip_ports.push(LanPort {
            ns: ns.name().to_string(),
            ifname: inside,
        });
        ns.run(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        ns.run(&["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]);
        // What this gateway cannot carry (stopped, or standing by) goes to the other one.
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
        ns.run(&[
            "ip",
            "-6",
            "route",
            "add",
            "fd00::/16",
            "via",
            &format!("fd00:2::{other}"),
            "metric",
            "100",
        ]);
    }
    lan.run(&["ip", "route", "add", "10.0.0.0/8", "via", "10.2.0.2"]);
    lan.run(&["ip", "-6", "route", "add", "fd00::/16", "via", "fd00:2::2"]);
    let vip_ports: [LanPort; 2] = vip_ports.try_into().ok().unwrap();
    // A second LAN host whose only way to the other sites is the LAN addresses.
    let vhost = NetNs::new();
    let (inside, outside) = link(&vhost, &lan);
    vhost.run(&["ip", "addr", "add", "10.2.0.20/24", "dev", &inside]);
    vhost.run(&[
        "ip",
        "-6",
        "addr",
        "add",
        "fd00:2::20/64",
        "dev",
        &inside,
        "nodad",
    ]);
    vhost.run(&["ip", "link", "set", &inside, "up"]);
    lan.run(&["ip", "link", "set", &outside, "master", "brb", "up"]);
    vhost.run(&["ip", "route", "add", "10.0.0.0/8", "via", "10.2.0.1"]);
    vhost.run(&["ip", "-6", "route", "add", "fd00::/16", "via", "fd00:2::1"]);

    let mut a = Site::new(&cluster, "a", "a1", 1, 21, true);
    a.body
        .push_str("\n[metrics]\nlisten = \"127.0.0.1:9586\"\n");
    let mut b1 = Site::new(&cluster, "b", "b1", 2, 22, false);
    let mut b2 = Site::new(&cluster, "b", "b2", 2, 23, false);
    for (site, port) in [(&mut b1, &vip_ports[0]), (&mut b2, &vip_ports[1])] {
        site.body.push_str(&format!(
            "lan_interface = \"{}\"\nlan_addresses = [\"{VIP4}\", \"{VIP6}\"]\n",
            port.ifname
        ));
    }

    let c = Site::new(&cluster, "c", "c1", 3, 24, true);
    let d = Site::new(&cluster, "d", "d1", 4, 25, true);

    // B1 first, so that it leads site B.
    let mut gb1 = b1.start(&nb1);
    wait_until("b1 leads site B", || {
        show(&nb1, &b1.ifname).contains("gateway b1 (active)")
    });
    // What a run that died holding them would have left on B2: its start removes it.
    nb2.run(&["ip", "addr", "add", VIP4, "dev", &vip_ports[1].ifname]);
    let mut gb2 = b2.start(&nb2);
    wait_until("b2 removes the LAN address left over", || {
        !vip_ports[1].holds_vip()
    });
    assert!(
        gb2.log_text()
            .contains("removed the LAN address(es) 10.2.0.1/24 from"),
        "{}",
        gb2.log_text()
    );
    let ga = a.start(&na);
    let gc = c.start(&nc);

    step("the mesh forms from empty files");
    // Every gateway of another site is a peer, B's standby too: its path is handshaken
    // before a failover needs it.
    wait_peers(&na, &a.ifname, &[&b1, &b2, &c], "A");
    wait_peers(&nc, &c.ifname, &[&a, &b1, &b2], "C");
    wait_peers(&nb1, &b1.ifname, &[&a, &c], "B1");
    // The standby keeps its peers warm.
    wait_peers(&nb2, &b2.ifname, &[&a, &c], "B2 (standby)");
    for (from, to) in [
        (&na, "10.2.0.10"),
        (&na, "fd00:2::10"),
        (&na, "10.3.0.1"),
        (&na, "fd00:3::1"),
        (&nc, "10.2.0.10"),
        (&nc, "fd00:2::10"),
        (&lan, "10.1.0.1"),
        (&lan, "fd00:1::1"),
        (&na, "10.2.0.20"),
        (&na, "fd00:2::20"),
        (&vhost, "10.1.0.1"),
        (&vhost, "fd00:1::1"),
    ] {
        reachable(from, to);
        ping(from, to);
    }
    assert!(vip_ports[0].holds_vip() && !vip_ports[1].holds_vip());
    assert_eq!(neighbour_mac(&vhost, "10.2.0.1"), vip_ports[0].mac());
    let shown = show(&nb1, &b1.ifname);
    assert!(
        shown.contains(&format!(
            "LAN addresses: held ({VIP4}, {VIP6} on {}); taken 1 times, fenced 0",
            vip_ports[0].ifname
        )),
        "{shown}"
    );
    assert!(
        show(&nb2, &b2.ifname).contains("LAN addresses: not held"),
        "{}",
        show(&nb2, &b2.ifname)
    );
    tcp_transfer(&na, &lan, "10.2.0.10:7001".parse().unwrap(), 16 << 20);
    tcp_transfer(&na, &nc, "10.3.0.1:7002".parse().unwrap(), 16 << 20);
    tcp_transfer(&lan, &nc, "10.3.0.1:7003".parse().unwrap(), 16 << 20);
    let shown = show(&na, &a.ifname);
    assert!(
        shown.contains("fleet: site a, gateway a1 (active)"),
        "{shown}"
    );
    assert!(shown.contains("store: up"), "{shown}");
    assert!(shown.contains("b/b2 (standby)"), "{shown}");
    assert!(
        shown.contains("b/b1 (active) at 192.0.2.22:51820"),
        "{shown}"
    );

    let metrics = scrape(&na);
    for line in [
        "tunneld_fleet_members{site=\"a\",gateway=\"a1\"} 4",
        "tunneld_fleet_active{site=\"a\",gateway=\"a1\"} 1",
        "tunneld_fleet_store_up{site=\"a\",gateway=\"a1\"} 1",
        "tunneld_fleet_rejected_records_total{site=\"a\",gateway=\"a1\"} 0",
    ] {
        assert!(metrics.contains(line), "{line} in:\n{metrics}");
    }

    step("a fourth site joins at run time");
    let joined_at = Instant::now();
    let gd = d.start(&nd);
    for (ns, to) in [
        (&na, "10.4.0.1"),
        (&nc, "10.4.0.1"),
        (&lan, "10.4.0.1"),
        (&nd, "10.1.0.1"),
    ] {
        reachable(ns, to);
    }
    eprintln!(
        "fleet: site D reachable from A, B and C {:.2} s after its tunneld started",
        joined_at.elapsed().as_secs_f64()
    );
    wait_peers(&na, &a.ifname, &[&b1, &b2, &c, &d], "A after D joined");
    let shown = show(&nb2, &b2.ifname);
    assert!(
        shown.contains("  probes: watching b/b1 at 192.0.2.22:51821, rtt "),
        "{shown}"
    );

    step("kill -9 of site B's active gateway during a transfer from A");
    // To the host behind the LAN addresses: its replies follow them to B2.
    let probe = Probe::start(&na, "10.2.0.20", 40);
    let transfer = paced_transfer(&na, &lan, "10.2.0.10:7004".parse().unwrap(), 16 << 20);
    // And from B's LAN to A: both directions of a TCP connection cross the failover.
    let outbound = paced_transfer(&lan, &na, "10.1.0.1:7005".parse().unwrap(), 16 << 20);
    let watch = VipWatch::start(&vip_ports);
    std::thread::sleep(Duration::from_millis(700));
    let killed = unix_now();
    gb1.stop_with("KILL");
    let resumed = probe.resumed_after(killed);
    wait_until("b2 holds the LAN addresses", || vip_ports[1].holds_vip());
    let samples = watch.stop();
    eprintln!(
        "fleet: after kill -9 the kernel dropped B1's LAN addresses {:.2} s later (their \
         lifetime), B2 took them {:.2} s after the kill",
        first_sample(&samples, killed, 0, false),
        first_sample(&samples, killed, 1, true)
    );
    assert!(
        !vip_ports[0].holds_vip(),
        "the killed gateway's addresses expire"
    );
    wait_until("the LAN host's neighbour entry moves to B2", || {
        neighbour_mac(&vhost, "10.2.0.1") == vip_ports[1].mac()
            && neighbour_mac(&vhost, "fd00:2::1") == vip_ports[1].mac()
    });
    eprintln!(
        "fleet: traffic from A to B resumed {resumed:.2} s after kill -9 of B's active gateway \
         (A repointed site B after {:.2} s)",
        logged_after(&ga.log_text(), "site b is served by b2 now", killed)
    );
    transfer.join().expect("the transfer survives the failover");
    outbound
        .join()
        .expect("the transfer from B's LAN survives the failover");
    let took_over = logged_after(&gb2.log_text(), "its lease revoked in etcd", killed);
    eprintln!("fleet: B2 found B1 dead and had its lease revoked {took_over:.2} s after kill -9");
    assert!(
        took_over < 1.0,
        "B2 took over by its probes, not the lease's expiry:\n{}",
        gb2.log_text()
    );
    wait_peers(&na, &a.ifname, &[&b2, &c, &d], "A after B1 died");
    wait_peers(&nc, &c.ifname, &[&a, &b2, &d], "C after B1 died");
    assert!(show(&nb2, &b2.ifname).contains("gateway b2 (active)"));
    drop(probe);

    step("B1 comes back as a standby; SIGTERM of B2 hands site B back to it");
    let gb1_again = b1.start(&nb1);
    wait_until("b1 stands by", || {
        show(&nb1, &b1.ifname).contains("gateway b1 (standby)")
    });
    let probe = Probe::start(&na, "10.2.0.20", 30);
    let watch = VipWatch::start(&vip_ports);
    let outbound = paced_transfer(&lan, &na, "10.1.0.1:7006".parse().unwrap(), 16 << 20);
    std::thread::sleep(Duration::from_millis(500));
    let stopped = unix_now();
    let status = gb2.stop_with("TERM");
    assert!(status.success(), "B2 exits cleanly on SIGTERM");
    assert!(!vip_ports[1].holds_vip(), "a stopped gateway holds nothing");
    let resumed = probe.resumed_after(stopped);
    wait_until("b1 holds the LAN addresses", || vip_ports[0].holds_vip());
    watch.stop();
    wait_until("the LAN host's neighbour entry moves to B1", || {
        neighbour_mac(&vhost, "10.2.0.1") == vip_ports[0].mac()
    });
    assert!(
        gb2.log_text().contains("released the LAN addresses")
            && gb2.log_text().contains(": leaving the fleet"),
        "{}",
        gb2.log_text()
    );
    eprintln!(
        "fleet: traffic from A to B resumed {resumed:.2} s after SIGTERM of B's active gateway \
         (A repointed site B after {:.2} s)",
        logged_after(&ga.log_text(), "site b is served by b1 now", stopped)
    );
    if resumed > 1.0 {
        let gaps: Vec<String> = probe
            .reply_times()
            .windows(2)
            .filter(|w| w[1] > stopped - 1.0 && w[1] - w[0] > 0.2)
            .map(|w| format!("{:.2}..{:.2}", w[0] - stopped, w[1] - stopped))
            .collect();
        eprintln!("gaps in the replies (s from SIGTERM): {gaps:?}");
        for (name, log) in [
            ("A", ga.log_text()),
            ("B1", gb1_again.log_text()),
            ("B2", gb2.log_text()),
        ] {
            eprintln!(
                "--- {name}, the 2 s after SIGTERM ---\n{}",
                log_window(&log, stopped, 2.0)
            );
        }
    }
    outbound
        .join()
        .expect("the transfer from B's LAN survives the SIGTERM");
    wait_peers(&na, &a.ifname, &[&b1, &c, &d], "A after B2 left");
    assert!(
        gb2.log_text().contains("left the fleet (lease revoked)"),
        "{}",
        gb2.log_text()
    );
    drop(probe);
    let mut gb1 = gb1_again;

    let removed_lines = |g: &Gateway| count(&g.log_text(), "peer removed");
    let transfers = |ns: &NetNs, ifname: &str| -> Vec<u64> {
        wg_dump(ns, ifname)
            .iter()
            .skip(1)
            .map(|l| l[5].parse::<u64>().unwrap_or(0))
            .collect()
    };

    step("one etcd member of three dies: nothing changes");
    let mut members = cluster;
    let before = (removed_lines(&ga), peers(&na, &a.ifname));
    members.stop_member(2, "KILL");
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!((removed_lines(&ga), peers(&na, &a.ifname)), before);
    // The other two answer: no gateway may call that an outage (a stream to the dead
    // member failing three times in a row once did, with records put in between).
    for g in [&ga, &gc, &gd] {
        assert_eq!(
            count(&g.log_text(), "the store is unreachable"),
            0,
            "an outage said with two members of three up:\n{}",
            g.log_text()
        );
    }
    ping(&na, "10.2.0.10");
    members.start_member(2);
    members.wait_healthy(&wan.ns);

    step("the whole store stops for 60 s: traffic goes on, no peer is dropped, the LAN addresses are fenced until it is back");
    let before_removed = (removed_lines(&ga), removed_lines(&gc), removed_lines(&gd));
    let before_peers = peers(&na, &a.ifname);
    let rx_before = transfers(&na, &a.ifname);
    members.stop_all("TERM");
    let outage = Instant::now();
    wait_until("A sees the store down", || {
        show(&na, &a.ifname).contains("store: down")
    });
    // B1 cannot tell an outage from its own partition: it gives the addresses up.
    wait_until("b1 gives up the LAN addresses", || {
        !vip_ports[0].holds_vip()
    });
    assert!(
        outage.elapsed() < Duration::from_secs(4),
        "fenced {:?} after the store stopped",
        outage.elapsed()
    );
    assert!(gb1
        .log_text()
        .contains("fenced: no lease keep-alive answered"));
    while outage.elapsed() < Duration::from_secs(60) {
        ping(&na, "10.2.0.10");
        ping(&nc, "10.1.0.1");
        assert_eq!(peers(&na, &a.ifname), before_peers);
        std::thread::sleep(Duration::from_secs(10));
    }
    assert_eq!(
        count(&ga.log_text(), "the store is unreachable"),
        1,
        "said once:\n{}",
        ga.log_text()
    );
    for i in 0..members.len() {
        members.start_member(i);
    }
    members.wait_healthy(&wan.ns);
    for (ns, ifname) in [
        (&na, &a.ifname),
        (&nc, &c.ifname),
        (&nd, &d.ifname),
        (&nb1, &b1.ifname),
    ] {
        wait_until("the gateway reconciles with the store", || {
            show(ns, ifname).contains("store: up")
        });
    }
    assert_eq!(
        (removed_lines(&ga), removed_lines(&gc), removed_lines(&gd)),
        before_removed,
        "no peer was removed through the outage"
    );
    assert_eq!(peers(&na, &a.ifname), before_peers);
    wait_until("b1 holds the LAN addresses again", || {
        vip_ports[0].holds_vip()
    });
    assert!(!vip_ports[1].holds_vip());
    // Counters of a peer removed and added again would have started over.
    let rx_after = transfers(&na, &a.ifname);
    assert!(rx_after
        .iter()
        .zip(&rx_before)
        .all(|(after, before)| after >= before));
    ping(&na, "10.2.0.10");
    assert!(show(&na, &a.ifname).contains("fleet: site a, gateway a1 (active)"));

    step("records written by hand: an invalid one, and a claim on site B's subnet");
    let bad = format!("{PREFIX}/gateways/x/x1");
    let out = members.etcdctl(&wan.ns, &["put", &bad, "{\"public_key\": \"not a key\"}"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let thief = pubkey(&genkey());
    let claim = format!(
        "{{\"public_key\":\"{thief}\",\"endpoints\":[\"192.0.2.99:51820\"],\"subnets\":[\"10.2.0.0/25\"],\"role\":\"active\"}}"
    );
    for (key, value) in [
        (format!("{PREFIX}/gateways/evil/e1"), claim.as_str()),
        (format!("{PREFIX}/elections/evil/1"), "e1"),
    ] {
        let out = members.etcdctl(&wan.ns, &["put", &key, value]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    wait_until("A refuses both records", || {
        let log = ga.log_text();
        log.contains(&format!("ignoring the record {bad}: "))
            && log.contains("claimed first by site b")
    });
    std::thread::sleep(Duration::from_millis(500));
    let log = ga.log_text();
    assert_eq!(
        count(&log, &format!("ignoring the record {bad}:")),
        1,
        "logged once"
    );
    assert!(show(&na, &a.ifname).contains("records rejected: 2"));
    let metrics = scrape(&na);
    for line in [
        "tunneld_fleet_rejected_records_total{site=\"a\",gateway=\"a1\"} 2",
        // B1 to B2, then back.
        "tunneld_fleet_failovers_total{site=\"a\",gateway=\"a1\"} 2",
    ] {
        assert!(metrics.contains(line), "{line} in:\n{metrics}");
    }
    assert!(!metrics.contains("tunneld_fleet_store_errors_total{site=\"a\",gateway=\"a1\"} 0"));
    assert_eq!(peers(&na, &a.ifname), before_peers, "nothing hijacked");
    ping(&na, "10.2.0.10");
    // Gone again: a claim written by hand, with no lease, would outlive site B's records and
    // take its subnet once they all lapse (the first claim stands), as deleting b1's below.
    for key in [
        bad.as_str(),
        &format!("{PREFIX}/gateways/evil/e1"),
        &format!("{PREFIX}/elections/evil/1"),
    ] {
        let out = members.etcdctl(&wan.ns, &["del", key]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    step("a third gateway named b1, with its own key and address, is refused the name");
    let dup = Site::new(&members, "b", "b1", 2, 27, false);
    let ndup = wan.host("192.0.2.27/24");
    let mut gdup = dup.start(&ndup);
    wait_until("the newcomer says its name is held", || {
        gdup.log_text()
            .contains("the name b/b1 is held by another gateway")
    });
    wait_until("b1 hears of the newcomer", || {
        gb1.log_text().contains(&format!(
            "another gateway (public key {} at 192.0.2.27:51820) claims this gateway's name",
            dup.public
        ))
    });
    let shown = show(&ndup, &dup.ifname);
    assert!(shown.contains("gateway b1 (refused)"), "{shown}");
    assert!(
        shown.contains("name refused: held by another gateway"),
        "{shown}"
    );
    assert!(shown.contains("name conflicts: 1"), "{shown}");
    let shown = show(&nb1, &b1.ifname);
    assert!(shown.contains("gateway b1 (active)"), "{shown}");
    assert!(shown.contains("name conflicts: 1"), "{shown}");
    assert!(
        shown.contains(&format!("name conflict: b/b1 held by {}", b1.public)),
        "{shown}"
    );
    // Routing never changes: not at once, not after a while.
    for _ in 0..4 {
        assert_eq!(peers(&na, &a.ifname), before_peers, "nothing hijacked");
        ping(&na, "10.2.0.10");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(!peers(&nc, &c.ifname).contains(&dup.public));
    assert_eq!(
        count(&gdup.log_text(), "is held by another gateway"),
        1,
        "said once"
    );
    step("the newcomer stops: site B stays reachable, b1 active");
    assert!(gdup.stop_with("TERM").success());
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(peers(&na, &a.ifname), before_peers);
    ping(&na, "10.2.0.10");
    ping(&lan, "10.1.0.1");
    assert!(show(&nb1, &b1.ifname).contains("gateway b1 (active)"));

    step("etcdctl del of the active gateway's record and election key: they come back");
    let record_key = format!("{PREFIX}/gateways/b/b1");
    let get = |key: &str, prefix: bool| {
        let mut args = vec!["get", key, "--keys-only"];
        if prefix {
            args.push("--prefix");
        }
        let out = members.etcdctl(&wan.ns, &args);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let deleted = Instant::now();
    let out = members.etcdctl(&wan.ns, &["del", &record_key]);
    assert!(
        String::from_utf8_lossy(&out.stdout).trim() == "1",
        "deleted"
    );
    wait_until("b1 writes its record again", || {
        !get(&record_key, false).is_empty()
    });
    reachable(&na, "10.2.0.10");
    eprintln!(
        "fleet: b1's record back and site B reachable {:.2} s after it was deleted",
        deleted.elapsed().as_secs_f64()
    );
    assert!(gb1
        .log_text()
        .contains("this gateway's record vanished from the store"));
    let election = format!("{PREFIX}/elections/b/");
    let out = members.etcdctl(&wan.ns, &["del", "--prefix", &election]);
    assert!(out.status.success());
    wait_until("b1 stands again", || !get(&election, true).is_empty());
    wait_until("b1 leads site B again", || {
        show(&nb1, &b1.ifname).contains("gateway b1 (active)")
    });
    wait_peers(
        &na,
        &a.ifname,
        &[&b1, &c, &d],
        "A after b1's keys came back",
    );
    reachable(&na, "10.2.0.10");
    ping(&lan, "10.1.0.1");

    step("site B's active host dies (its links cut, its tunneld left running): B2 takes over");
    let gb2 = b2.start(&nb2);
    wait_until("b2 stands by", || {
        show(&nb2, &b2.ifname).contains("gateway b2 (standby)")
    });
    wait_peers(&nb2, &b2.ifname, &[&a, &c, &d], "B2 (standby)");
    let probe = Probe::start(&na, "10.2.0.10", 40);
    std::thread::sleep(Duration::from_millis(500));
    let died = unix_now();
    // Nothing of B1's host forwards now: not its tunneld, not its kernel (the fallback route
    // of the kill -9 step is gone with it), and nobody hears a reset or an ICMP error.
    wan.disconnect("192.0.2.22");
    lan.run(&["ip", "link", "set", &lan_ports[0], "down"]);
    // The LAN's own failover (the operator's VRRP or the like) moves its route to B2; the
    // fleet moves the other sites.
    lan.run(&["ip", "route", "replace", "10.0.0.0/8", "via", "10.2.0.3"]);
    lan.run(&[
        "ip",
        "-6",
        "route",
        "replace",
        "fd00::/16",
        "via",
        "fd00:2::3",
    ]);
    let resumed = probe.resumed_after(died);
    eprintln!(
        "fleet: traffic from A to B resumed {resumed:.2} s after the death of B's active host \
         (A repointed site B after {:.2} s)",
        logged_after(&ga.log_text(), "site b is served by b2 now", died)
    );
    wait_peers(&na, &a.ifname, &[&b2, &c, &d], "A after B1's host died");
    wait_peers(&nc, &c.ifname, &[&a, &b2, &d], "C after B1's host died");
    assert!(show(&nb2, &b2.ifname).contains("gateway b2 (active)"));
    for (from, to) in [
        (&nc, "10.2.0.10"),
        (&nc, "fd00:2::10"),
        (&lan, "10.1.0.1"),
        (&lan, "fd00:1::1"),
    ] {
        reachable(from, to);
    }
    drop(probe);

    step("B1's host comes back, its tunneld unaware of the lease it lost: it stands by");
    wan.reconnect("192.0.2.22");
    lan.run(&["ip", "link", "set", &lan_ports[0], "up"]);
    wait_until("b1 stands by again", || {
        show(&nb1, &b1.ifname).contains("gateway b1 (standby)")
    });
    assert!(
        gb1.log_text()
            .contains("the lease expired in the store; joining again"),
        "{}",
        gb1.log_text()
    );
    std::thread::sleep(Duration::from_secs(1));
    assert!(show(&nb2, &b2.ifname).contains("gateway b2 (active)"));
    assert_eq!(
        peers(&na, &a.ifname),
        [&b1, &b2, &c, &d]
            .iter()
            .map(|s| s.public.clone())
            .collect::<BTreeSet<_>>(),
        "B1 is a peer again, as a standby"
    );
    ping(&na, "10.2.0.10");
    ping(&lan, "10.1.0.1");

    step("site B's active gateway is cut off etcd alone: it gives up the LAN addresses in time, B1 takes them");
    // B2 took the site over by its probes: it takes the LAN addresses a lease TTL later,
    // which B1's return (handshakes sent at once) may beat.
    wait_until("b2 to hold the LAN addresses", || vip_ports[1].holds_vip());
    assert!(vip_ports[1].holds_vip() && !vip_ports[0].holds_vip());
    let probe = Probe::start(&na, "10.2.0.20", 40);
    let watch = VipWatch::start(&vip_ports);
    std::thread::sleep(Duration::from_millis(300));
    // In the underlay's router: B2's packets to and from the members are dropped, silently;
    // its tunnels to the other sites carry on.
    let cut: Vec<Vec<String>> = MEMBERS
        .iter()
        .flat_map(|m| {
            [("192.0.2.23", *m), (*m, "192.0.2.23")].map(|(from, to)| {
                ["from", from, "to", to, "blackhole"]
                    .map(str::to_string)
                    .to_vec()
            })
        })
        .collect();
    let partitioned = unix_now();
    for rule in &cut {
        let mut args = vec!["ip", "rule", "add"];
        args.extend(rule.iter().map(String::as_str));
        wan.ns.run(&args);
    }
    wait_until("b1 holds the LAN addresses", || vip_ports[0].holds_vip());
    let resumed = probe.resumed_after(partitioned);
    let samples = watch.stop();
    let released = first_sample(&samples, partitioned, 1, false);
    let taken = first_sample(&samples, partitioned, 0, true);
    eprintln!(
        "fleet: B2, cut off etcd, gave up the LAN addresses {released:.2} s after the cut; \
         B1 took them {taken:.2} s after it; traffic resumed {resumed:.2} s after it"
    );
    // The bound docs/fleet.md states: within lease_ttl - 0.5 s of the last keep-alive
    // answered (before the cut), and the samples' own lateness.
    assert!(
        released <= 2.5 + 0.3,
        "released {released:.2} s after the cut"
    );
    assert!(
        taken > released,
        "taken {taken:.2} s, released {released:.2} s"
    );
    assert!(gb2
        .log_text()
        .contains("fenced: no lease keep-alive answered"));
    wait_until("the LAN host's neighbour entry moves to B1", || {
        neighbour_mac(&vhost, "10.2.0.1") == vip_ports[0].mac()
    });
    drop(probe);
    for rule in &cut {
        let mut args = vec!["ip", "rule", "del"];
        args.extend(rule.iter().map(String::as_str));
        wan.ns.run(&args);
    }
    wait_until("b2 stands by once it reaches etcd again", || {
        show(&nb2, &b2.ifname).contains("gateway b2 (standby)")
    });
    assert!(vip_ports[0].holds_vip() && !vip_ports[1].holds_vip());

    step("only the probe path between B1 and B2 is cut, etcd reachable: a false death, bounded");
    wait_until("b2's probes of b1 are answered", || {
        show(&nb2, &b2.ifname).contains("  probes: watching b/b1 at 192.0.2.22:51821, rtt ")
    });
    let probe = Probe::start(&na, "10.2.0.20", 40);
    let watch = VipWatch::start(&vip_ports);
    std::thread::sleep(Duration::from_millis(300));
    let cut_at = unix_now();
    // B1 drops every probe that reaches it, silently; all else flows.
    for rule in [
        vec!["nft", "add", "table", "inet", "probecut"],
        vec![
            "nft",
            "add",
            "chain",
            "inet",
            "probecut",
            "input",
            "{ type filter hook input priority 0 ; }",
        ],
        vec![
            "nft", "add", "rule", "inet", "probecut", "input", "udp", "dport", "51821", "drop",
        ],
    ] {
        nb1.run(&rule);
    }
    wait_until("b2 takes over and b1 stands by", || {
        show(&nb2, &b2.ifname).contains("gateway b2 (active)")
            && show(&nb1, &b1.ifname).contains("gateway b1 (standby)")
    });
    wait_until("b2 holds the LAN addresses", || vip_ports[1].holds_vip());
    let resumed = probe.resumed_after(cut_at);
    let samples = watch.stop();
    let b2_active = logged_after(&gb2.log_text(), "now active for site b", cut_at);
    let b1_standing_by = logged_after(&gb1.log_text(), "standing by for site b", cut_at);
    let both_active = b1_standing_by - b2_active;
    eprintln!(
        "fleet: probe path cut: B2 active {b2_active:.3} s after the cut, B1 standing by \
         {b1_standing_by:.3} s after it (both active for {both_active:.3} s); B1 released the \
         LAN addresses {:.2} s and B2 took them {:.2} s after it; traffic from A resumed \
         {resumed:.2} s after it",
        first_sample(&samples, cut_at, 0, false),
        first_sample(&samples, cut_at, 1, true)
    );
    // docs/fleet.md's bound: the wrongly judged gateway stands by when its watch delivers
    // its keys' deletion, else after its next keep-alive (lease_ttl / 3 = 1 s) finds the
    // lease gone.
    assert!(
        both_active < 1.0,
        "two active gateways for {both_active:.3} s:\n{}\n{}",
        gb1.log_text(),
        gb2.log_text()
    );
    drop(probe);
    nb1.run(&["nft", "delete", "table", "inet", "probecut"]);
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        show(&nb2, &b2.ifname).contains("gateway b2 (active)"),
        "no flapping once the path is back"
    );
    ping(&na, "10.2.0.10");
    ping(&lan, "10.1.0.1");

    step("an active-active site: A spreads flows over both its gateways, and a kill -9 moves one's flows to the other");
    let (nf1, nf2) = (wan.host("192.0.2.31/24"), wan.host("192.0.2.32/24"));
    let flan = NetNs::new();
    flan.run(&["ip", "link", "add", "brf", "type", "bridge"]);
    flan.run(&["ip", "addr", "add", "10.6.0.10/24", "dev", "brf"]);
    flan.run(&["ip", "link", "set", "brf", "up"]);
    // The LAN host sends through the site's LAN address, which the elected gateway holds.
    flan.run(&["ip", "route", "add", "10.0.0.0/8", "via", "10.6.0.1"]);
    let mut f1 = Site::new(&members, "f", "f1", 6, 31, false);
    let mut f2 = Site::new(&members, "f", "f2", 6, 32, false);
    for (ns, site, own) in [(&nf1, &mut f1, "2"), (&nf2, &mut f2, "3")] {
        let (inside, outside) = link(ns, &flan);
        ns.run(&[
            "ip",
            "addr",
            "add",
            &format!("10.6.0.{own}/24"),
            "dev",
            &inside,
        ]);
        ns.run(&["ip", "link", "set", &inside, "up"]);
        ns.run(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        flan.run(&["ip", "link", "set", &outside, "master", "brf", "up"]);
        site.body.push_str(&format!(
            "lan_interface = \"{inside}\"\nlan_addresses = [\"10.6.0.1/24\"]\nmode = \"active-active\"\n"
        ));
    }
    let gf1 = f1.start(&nf1);
    wait_until("f1 leads site F", || {
        show(&nf1, &f1.ifname).contains("gateway f1 (active)")
    });
    let mut gf2 = f2.start(&nf2);
    wait_until("f2 carries its share of site F", || {
        show(&nf2, &f2.ifname).contains("gateway f2 (sharing)")
    });
    wait_peers(
        &na,
        &a.ifname,
        &[&b1, &b2, &c, &d, &f1, &f2],
        "A with site F",
    );
    // The shared prefixes show on both of F's gateways, in `wg show` and `tunneld show`.
    wait_until("A routes site F to both of its gateways", || {
        let routes = ns_allowed_ips(&na, &a.ifname);
        [&f1, &f2].iter().all(|f| {
            routes
                .get(&f.public)
                .is_some_and(|r| r.contains("10.6.0.0/24") && r.contains("fd00:6::/64"))
        })
    });
    let shown = show(&na, &a.ifname);
    assert!(
        shown.contains("f/f1 (active)") && shown.contains("f/f2 (sharing)"),
        "{shown}"
    );
    assert!(show(&nf2, &f2.ifname).contains("mode: active-active"));
    // Both of F's gateways route site A themselves.
    for (ns, f) in [(&nf1, &f1), (&nf2, &f2)] {
        assert!(
            ns_allowed_ips(ns, &f.ifname)[&a.public].contains("10.1.0.0/24"),
            "{}",
            ns.run(&["wg", "show", &f.ifname, "allowed-ips"])
        );
    }
    reachable(&na, "10.6.0.10");
    // Sixteen flows: all on one gateway by chance once in 2^15 runs.
    let before = ns_transfer(&na, &a.ifname);
    let flows: Vec<_> = (0..16u16)
        .map(|i| {
            let to = SocketAddr::new("10.6.0.10".parse().unwrap(), 7100 + i);
            paced_transfer(&na, &flan, to, 4 << 20)
        })
        .collect();
    let sent_to = |f: &Site, since: &std::collections::BTreeMap<String, (u64, u64)>| {
        let now = ns_transfer(&na, &a.ifname);
        now[&f.public].1 - since.get(&f.public).map_or(0, |t| t.1)
    };
    wait_until("flows on both of F's gateways", || {
        sent_to(&f1, &before) > 256 << 10 && sent_to(&f2, &before) > 256 << 10
    });
    eprintln!(
        "fleet: active-active site F: A sent {} KiB through f1 and {} KiB through f2 so far",
        sent_to(&f1, &before) >> 10,
        sent_to(&f2, &before) >> 10
    );
    // What F's gateways received, each of its share: their own counters agree.
    for (ns, f) in [(&nf1, &f1), (&nf2, &f2)] {
        assert!(
            ns_transfer(ns, &f.ifname)[&a.public].0 > 256 << 10,
            "{} received its share",
            f.gateway
        );
    }
    let killed = unix_now();
    let at_kill = ns_transfer(&na, &a.ifname);
    gf2.stop_with("KILL");
    wait_peers(&na, &a.ifname, &[&b1, &b2, &c, &d, &f1], "A after f2 died");
    let moved = logged_after(&ga.log_text(), "peer removed", killed);
    let revoked = logged_after(&gf1.log_text(), "its lease revoked in etcd", killed);
    for flow in flows {
        flow.join()
            .expect("every flow survives the kill, its bytes intact");
    }
    let after_f1 = sent_to(&f1, &at_kill);
    eprintln!(
        "fleet: kill -9 of f2: f1 had its lease revoked {revoked:.2} s later, A moved f2's flows to f1 {moved:.2} s after the kill; {} KiB went through f1 after it",
        after_f1 >> 10
    );
    assert!(
        revoked < 1.0,
        "f1 found f2 dead by its probes:\n{}",
        gf1.log_text()
    );
    assert!(show(&nf1, &f1.ifname).contains("gateway f1 (active)"));
    drop((gf1, gf2));

    step("a gateway without a client certificate is refused by etcd");
    let mut e = Site::new(&members, "e", "e1", 5, 26, true);
    e.body = e
        .body
        .lines()
        .filter(|l| !l.starts_with("cert_file") && !l.starts_with("key_file"))
        .map(|l| format!("{l}\n"))
        .collect();
    let ne = wan.host("192.0.2.26/24");
    let ge = e.start(&ne);
    wait_until("E says the store refuses it", || {
        show(&ne, &e.ifname).contains("store: down")
    });
    std::thread::sleep(Duration::from_secs(2));
    assert!(!peers(&na, &a.ifname).contains(&e.public), "E never joined");
    // Said at start, as such, in the log and in `show`.
    assert!(ge
        .log_text()
        .contains("the store does not answer since start"));
    let shown = show(&ne, &e.ifname);
    assert!(shown.contains("gateway e1 (not joined)"), "{shown}");
    assert!(
        shown.contains("store: down: not reached since start: "),
        "{shown}"
    );

    step("stop everything; the gateways leave the fleet");
    gb1.stop_with("TERM");
    drop((ga, gb2, gc, gd, ge, gdup));
}

/// A fleet site's gateway behind `nat`, advertising its private address (all it knows).
fn nat_site(cluster: &Cluster, name: &'static str, n: u8, nat: &Nat) -> Site {
    let mut site = Site::new(cluster, name, "gw", n, 0, true);
    site.body = site.body.replace(
        "advertise = [\"192.0.2.0:51820\"]",
        &format!("advertise = [\"{}:51820\"]", nat.private),
    );
    site
}

/// Sites behind NAT (issue 48), a matrix of NAT kinds on one etcd: a public relay site P,
/// a public site Q, two sites behind endpoint-independent NATs (E1, E2) and two behind
/// endpoint-dependent ones (D1, D2). Each NATed gateway advertises only its private
/// address; P sees where their NATs map them and tells the fleet. Every pair pings, each
/// pair of kinds carries 16 MiB intact; pairs with a public side or two endpoint-independent
/// NATs go direct (E1 and E2 punch a hole with their handshakes), the others through P's
/// relay, which sees only ciphertext. A flush of a NAT is recovered from, direct or relayed,
/// and two sites relayed while a firewall parts them (E3, E4) go direct once it is gone.
#[test]
fn sites_behind_nat_find_a_direct_path_where_their_nats_allow_one_and_a_relay_otherwise() {
    let test =
        "sites_behind_nat_find_a_direct_path_where_their_nats_allow_one_and_a_relay_otherwise";
    if !require(test) || !require_tool(test, "conntrack") || !require_tool(test, "promtool") {
        return;
    }
    let wan = Underlay::new("192.0.2.1/24");
    step("NAT: one etcd member, two public sites (P relays) and eight behind NAT");
    let cluster = Cluster::start(&wan, &MEMBERS[..1], true);
    let np = wan.host("192.0.2.31/24");
    let nq = wan.host("192.0.2.32/24");
    let e1 = Nat::new(&wan, "192.0.2.41/24", 1, NatKind::EndpointIndependent);
    let e2 = Nat::new(&wan, "192.0.2.42/24", 2, NatKind::EndpointIndependent);
    let d1 = Nat::new(&wan, "192.0.2.43/24", 3, NatKind::EndpointDependent);
    let d2 = Nat::new(&wan, "192.0.2.46/24", 6, NatKind::EndpointDependent);
    // E3 and E4 would punch through to each other but for a firewall between them.
    let e3 = Nat::new(&wan, "192.0.2.44/24", 4, NatKind::EndpointIndependent);
    let e4 = Nat::new(&wan, "192.0.2.45/24", 5, NatKind::EndpointIndependent);
    e3.block(&e4.public);
    // T can send only TCP to port 443 (and its fleet's etcd).
    let t = Nat::new(&wan, "192.0.2.47/24", 7, NatKind::Tcp443Only);
    t.allow_tcp("192.0.2.11", 2379);
    let t2 = Nat::new(&wan, "192.0.2.48/24", 8, NatKind::Tcp443Only);
    t2.allow_tcp("192.0.2.11", 2379);
    let certs = cluster.certs();
    let mut p_site = Site::new(&cluster, "p", "gw", 31, 31, true);
    // The relay's TLS listener: the cluster's CA signed a certificate for the name
    // "gateway", which serves.
    p_site.body.push_str(&format!(
        "relay = true\nrelay_tls = \"192.0.2.31:443\"\nrelay_tls_name = \"gateway\"\n\n\
         [[tls.listen]]\nlisten = \"192.0.2.31:443\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n\
         forward_to = \"wireguard\"\n",
        certs.join("client.pem").display(),
        certs.join("client.key").display()
    ));
    let q_site = Site::new(&cluster, "q", "gw", 32, 32, true);
    let e1_site = nat_site(&cluster, "e1", 41, &e1);
    let e2_site = nat_site(&cluster, "e2", 42, &e2);
    let d1_site = nat_site(&cluster, "d1", 43, &d1);
    let d2_site = nat_site(&cluster, "d2", 46, &d2);
    let e3_site = nat_site(&cluster, "e3", 44, &e3);
    let e4_site = nat_site(&cluster, "e4", 45, &e4);
    let tcp_only = |name, n, nat: &Nat| {
        let mut site = nat_site(&cluster, name, n, nat);
        site.body.push_str(&format!(
            "transport = \"tls\"\nrelay_ca_file = \"{}\"\n",
            certs.join("ca.pem").display()
        ));
        site
    };
    let t_site = tcp_only("t", 47, &t);
    let t2_site = tcp_only("t2", 48, &t2);
    // E1 serves its metrics, to see its paths there.
    let mut e1_site = e1_site;
    e1_site
        .body
        .push_str("\n[metrics]\nlisten = \"127.0.0.1:9586\"\n");
    let _p = p_site.start(&np);
    let started = Instant::now();
    let _q = q_site.start(&nq);
    let _e1 = e1_site.start(&e1.site);
    let _e2 = e2_site.start(&e2.site);
    let _d1 = d1_site.start(&d1.site);
    let _d2 = d2_site.start(&d2.site);
    let _e3 = e3_site.start(&e3.site);
    let _e4 = e4_site.start(&e4.site);
    let _t = t_site.start(&t.site);
    let _t2 = t2_site.start(&t2.site);

    // (site, its namespace, its number, whether it is behind an endpoint-dependent NAT or
    // public): what decides a pair's path.
    #[derive(Clone, Copy, PartialEq)]
    enum Kind {
        Public,
        Independent,
        Dependent,
        TcpOnly,
    }
    let matrix: [(&Site, &NetNs, u8, Kind); 8] = [
        (&p_site, &np, 31, Kind::Public),
        (&q_site, &nq, 32, Kind::Public),
        (&e1_site, &e1.site, 41, Kind::Independent),
        (&e2_site, &e2.site, 42, Kind::Independent),
        (&d1_site, &d1.site, 43, Kind::Dependent),
        (&d2_site, &d2.site, 46, Kind::Dependent),
        (&t_site, &t.site, 47, Kind::TcpOnly),
        (&t2_site, &t2.site, 48, Kind::TcpOnly),
    ];
    step("NAT: every pair of the matrix pings, both ways");
    for (i, (a, a_ns, _, _)) in matrix.iter().enumerate() {
        for (b, _, n, _) in &matrix[i + 1..] {
            let took = reachable(a_ns, &format!("10.{n}.0.1"));
            println!(
                "    {} reaches {} {:.2?} after the start ({took:.2?} of pings)",
                a.name,
                b.name,
                started.elapsed()
            );
        }
    }
    for (i, (_, _, n, _)) in matrix.iter().enumerate() {
        for (_, b_ns, _, _) in &matrix[i + 1..] {
            reachable(b_ns, &format!("10.{n}.0.1"));
        }
    }
    step("NAT: direct where a side is public or both NATs map independently, else relayed");
    let deadline = Instant::now() + Duration::from_secs(10);
    for (a, a_ns, _, a_kind) in &matrix {
        for (b, _, _, b_kind) in &matrix {
            if a.name == b.name {
                continue;
            }
            // T reaches P's own listener; every other pair with T goes through it.
            let with_p = a.name == "p" || b.name == "p";
            let relayed = match (a_kind, b_kind) {
                (Kind::TcpOnly, _) | (_, Kind::TcpOnly) => !with_p,
                (Kind::Public, _) | (_, Kind::Public) => false,
                _ => *a_kind == Kind::Dependent || *b_kind == Kind::Dependent,
            };
            let want = match (relayed, *a_kind == Kind::TcpOnly) {
                (true, true) => "path relayed via p/gw (192.0.2.31:443)",
                (true, false) => "path relayed via p/gw (192.0.2.31:",
                (false, true) => "path direct via 192.0.2.31:443",
                (false, false) => "path direct via ",
            };
            let line = path_within(a, a_ns, b, want, deadline);
            assert!(
                line.contains(want),
                "{} to {}: want {want:?}, show says:\n{line}\n{}",
                a.name,
                b.name,
                show(a_ns, &a.ifname)
            );
        }
    }
    // P told the fleet where it sees each NATed gateway, under its own record.
    let listed = cluster.etcdctl(&np, &["get", "--prefix", "--keys-only", PREFIX]);
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.contains("/gateways/p/gw/seen/") && listed.contains("/gateways/p/gw/relaying/"),
        "no seen/ or relaying/ key in the store:\n{listed}"
    );

    step("NAT: 16 MiB intact for each pair of kinds; the relay forwards only ciphertext");
    let received_at_p = || -> u64 {
        // What P's own WireGuard authenticated from the NATed sites (relayed traffic is not
        // for it: it is no party to their sessions and holds none of their keys).
        wg_dump(&np, &p_site.ifname)
            .iter()
            .skip(1)
            .filter(|f| f[0] != q_site.public && f[0] != t_site.public && f[0] != t2_site.public)
            .map(|f| f[5].parse::<u64>().unwrap_or(0))
            .sum()
    };
    let (p_before, relayed_before) = (received_at_p(), scrape_relay_bytes(&p_site.ifname));
    let pairs = [
        (0, 1),
        (1, 2),
        (1, 4),
        (2, 3),
        (2, 4),
        (4, 5),
        (1, 6),
        (2, 6),
        (4, 6),
        (6, 7),
    ];
    for (i, j) in pairs {
        let (a, a_ns, _, _) = matrix[i];
        let (_, b_ns, n, _) = matrix[j];
        let moved = Instant::now();
        common::tcp_transfer(
            a_ns,
            b_ns,
            format!("10.{n}.0.1:5201").parse().unwrap(),
            16 << 20,
        );
        println!(
            "    {} to {}: 16 MiB in {:.2?}",
            a.name,
            matrix[j].0.name,
            moved.elapsed()
        );
    }
    let forwarded = scrape_relay_bytes(&p_site.ifname) - relayed_before;
    let p_more = received_at_p() - p_before;
    assert!(
        forwarded >= 6 * (16 << 20),
        "the relay forwarded {forwarded} bytes for six relayed 16 MiB transfers"
    );
    assert!(
        p_more < 1 << 20,
        "P's WireGuard authenticated {p_more} bytes from NATed sites during the transfers"
    );
    let shown = show(&np, &p_site.ifname);
    let relay_line = shown
        .lines()
        .find(|l| l.contains("relay: serving"))
        .unwrap_or_default()
        .to_string();
    println!("    {}", relay_line.trim());
    // Each pair it serves, by name, with its port.
    let d1_d2 = shown.lines().find(|l| {
        l.contains(" <-> ")
            && l.contains("d1/gw")
            && l.contains("d2/gw")
            && l.contains("on UDP port")
    });
    assert!(
        d1_d2.is_some(),
        "P's show lists no D1 <-> D2 pair:\n{shown}"
    );

    step("NAT: E1's metrics say each path, its kind, where it goes and through which relay");
    let metrics = scrape(&e1.site);
    for (peer, want) in [
        ("d1/gw", "path=\"relayed\",via=\"192.0.2.31:"),
        (
            "e2/gw",
            "path=\"direct\",via=\"192.0.2.42:51820\",relay=\"\"",
        ),
        ("t/gw", "path=\"relayed\",via=\"192.0.2.31:"),
    ] {
        let series = format!(
            "tunneld_fleet_path_seconds{{site=\"e1\",gateway=\"gw\",peer=\"{peer}\",{want}"
        );
        assert!(metrics.contains(&series), "no {series} in:\n{metrics}");
    }
    assert!(
        metrics.contains("tunneld_fleet_paths_relayed{site=\"e1\",gateway=\"gw\"} 4"),
        "E1 goes through the relay to D1, D2, T and T2:\n{metrics}"
    );
    common::promtool_checks(metrics.split_once("\r\n\r\n").map_or("", |(_, body)| body));

    step("NAT: a flush of E1's NAT (its mappings forgotten) is recovered from, direct");
    e1.flush();
    let flushed = Instant::now();
    let took = reachable(&e1.site, "10.42.0.1");
    reachable(&np, "10.41.0.1");
    println!(
        "    E1 reaches E2 again {:.2?} after the flush",
        flushed.elapsed().max(took)
    );

    step("NAT: a flush of D1's NAT is recovered from through the relay");
    d1.flush();
    let flushed = Instant::now();
    let took = reachable(&d1.site, "10.41.0.1");
    reachable(&e1.site, "10.43.0.1");
    reachable(&d2.site, "10.43.0.1");
    println!(
        "    D1 reaches E1 again {:.2?} after the flush",
        flushed.elapsed().max(took)
    );

    step("NAT: E3 and E4, relayed while a firewall parts them, go direct once it is gone");
    reachable(&e3.site, "10.45.0.1");
    let line = path_within(
        &e3_site,
        &e3.site,
        &e4_site,
        "path relayed via p/gw",
        Instant::now(),
    );
    assert!(
        line.contains("path relayed via p/gw"),
        "E3 does not say it goes through P's relay to E4:\n{line}"
    );
    e3.unblock();
    let unblocked = Instant::now();
    let direct = format!("path direct via {}:", e4.public);
    let deadline = unblocked + Duration::from_secs(30);
    let line = path_within(&e3_site, &e3.site, &e4_site, &direct, deadline);
    assert!(
        line.contains(&direct),
        "E3 did not move to a direct path to E4 within 30 s of the firewall's end:\n{line}"
    );
    reachable(&e3.site, "10.45.0.1");
    reachable(&e4.site, "10.44.0.1");
    println!(
        "    E3 and E4 direct {:.2?} after the firewall went (a try every 10 s)",
        unblocked.elapsed()
    );

    step("NAT: the firewall back, E3 and E4 find their direct path dead and go back to the relay");
    e3.block(&e4.public);
    let blocked = Instant::now();
    // Keepalives go out every second from both (they are behind NAT); SILENT_AFTER (15 s)
    // without an answer is a dead path.
    let deadline = blocked + Duration::from_secs(40);
    let line = path_within(
        &e3_site,
        &e3.site,
        &e4_site,
        "path relayed via p/gw",
        deadline,
    );
    assert!(
        line.contains("path relayed via p/gw"),
        "E3 did not go back to the relay within 40 s of the firewall's return:\n{line}"
    );
    reachable(&e3.site, "10.45.0.1");
    reachable(&e4.site, "10.44.0.1");
    println!(
        "    E3 and E4 relayed again {:.2?} after the firewall came back",
        blocked.elapsed()
    );
}

/// `from`'s `tunneld show` line for the gateway of site `to`, once it holds `want` or at
/// `deadline` (shown five times a second).
fn path_within(from: &Site, ns: &NetNs, to: &Site, want: &str, deadline: Instant) -> String {
    loop {
        let line = show(ns, &from.ifname)
            .lines()
            .find(|l| l.starts_with(&format!("  {}/gw ", to.name)))
            .unwrap_or_default()
            .to_string();
        if line.contains(want) || Instant::now() > deadline {
            return line;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The bytes the relay of interface `ifname` forwarded, from its UAPI socket
/// (`fleet_relay`, as `tunneld show` reads it).
fn scrape_relay_bytes(ifname: &str) -> u64 {
    let mut stream =
        std::os::unix::net::UnixStream::connect(common::socket_path(ifname)).expect("UAPI socket");
    stream.set_read_timeout(Some(WAIT)).unwrap();
    stream.write_all(b"fleet=1\n\n").unwrap();
    let mut text = String::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = stream.read(&mut buf) {
        if n == 0 {
            break;
        }
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
        if text.ends_with("\n\n") {
            break;
        }
    }
    text.lines()
        .find_map(|l| l.strip_prefix("fleet_relay="))
        .and_then(|v| v.split(' ').nth(1)?.parse().ok())
        .unwrap_or(0)
}
