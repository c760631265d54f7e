//! A routed underlay and a real etcd cluster on it, for the fleet's test and its bench:
//! each member in a namespace of its own, with TLS and client certificates (made with the
//! `openssl` command) or plain HTTP. Everything goes when dropped.

use crate::{run_ok, stop_process, unique_name, NetNs, WAIT};
use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The underlay: a router in a namespace of its own (with the address given, so that tools
/// can run there), and hosts each on a veth of their own with a /32 and every other address
/// of the subnet through the router. Routed rather than bridged because the kernel's
/// neighbour table is one for all namespaces (1024 entries by default,
/// `net.ipv4.neigh.default.gc_thresh3`): on one bridge, N hosts that all talk to each
/// other fill it with N² entries and the newest hosts' ARP fails ("neighbor table
/// overflow"); routed, each host has one neighbour, the router one per host.
#[derive(Debug)]
pub struct Underlay {
    pub ns: NetNs,
    /// The router's address and the subnet's prefix length.
    router: String,
    prefix: String,
    /// Each host's address and the router's end of its link.
    ports: Mutex<HashMap<String, String>>,
}

impl Underlay {
    /// The router, with `addr` (CIDR: the router's address and the hosts' subnet).
    pub fn new(addr: &str) -> Underlay {
        let (router, prefix) = addr.split_once('/').expect("an address/prefix");
        let ns = NetNs::new();
        ns.run(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        ns.run(&["sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0"]);
        ns.run(&["sysctl", "-qw", "net.ipv4.conf.default.rp_filter=0"]);
        Underlay {
            ns,
            router: router.to_string(),
            prefix: prefix.to_string(),
            ports: Mutex::new(HashMap::new()),
        }
    }

    /// A new namespace on the underlay with `addr` (CIDR; the prefix is the subnet's).
    pub fn host(&self, addr: &str) -> NetNs {
        let ns = NetNs::new();
        self.plug(&ns, addr);
        ns
    }

    /// Puts `ns` on the underlay with `addr` (CIDR); returns its interface's name.
    pub fn plug(&self, ns: &NetNs, addr: &str) -> String {
        let (ip, _) = addr.split_once('/').unwrap_or((addr, ""));
        let (inside, outside) = link(ns, &self.ns);
        ns.run(&["ip", "addr", "add", &format!("{ip}/32"), "dev", &inside]);
        ns.run(&["ip", "link", "set", &inside, "up"]);
        let router = self.router.as_str();
        ns.run(&[
            "ip",
            "route",
            "add",
            &format!("{router}/32"),
            "dev",
            &inside,
        ]);
        let net = format!("{}/{}", network(ip, &self.prefix), self.prefix);
        ns.run(&[
            "ip", "route", "add", &net, "via", router, "dev", &inside, "onlink",
        ]);
        self.ns.run(&[
            "ip",
            "addr",
            "add",
            &format!("{router}/32"),
            "dev",
            &outside,
        ]);
        self.ns.run(&["ip", "link", "set", &outside, "up"]);
        self.ns
            .run(&["ip", "route", "add", &format!("{ip}/32"), "dev", &outside]);
        self.ports.lock().unwrap().insert(ip.to_string(), outside);
        inside
    }

    /// Takes the router's end of the link of the host at `ip` down, as if the host had died:
    /// nothing it sends leaves its namespace and nothing reaches it, with no error or reset
    /// said to anyone, while its own interfaces, addresses and routes stay (without a
    /// carrier) and its processes run on. Undone by [`Underlay::reconnect`].
    pub fn disconnect(&self, ip: &str) {
        let port = self.port(ip);
        self.ns.run(&["ip", "link", "set", &port, "down"]);
    }

    /// Brings the link of the host at `ip` back, with the router's route to it (which taking
    /// the link down removed).
    pub fn reconnect(&self, ip: &str) {
        let port = self.port(ip);
        self.ns.run(&["ip", "link", "set", &port, "up"]);
        self.ns
            .run(&["ip", "route", "replace", &format!("{ip}/32"), "dev", &port]);
    }

    fn port(&self, ip: &str) -> String {
        let ports = self.ports.lock().unwrap();
        ports
            .get(ip)
            .unwrap_or_else(|| panic!("no host {ip} on the underlay"))
            .clone()
    }
}

/// The network address of `ip` (IPv4) under a prefix of `prefix` bits.
fn network(ip: &str, prefix: &str) -> String {
    let addr: std::net::Ipv4Addr = ip.parse().expect("an IPv4 address");
    let bits: u32 = prefix.parse().expect("a prefix length");
    let mask = if bits == 0 {
        0
    } else {
        u32::MAX << (32 - bits)
    };
    std::net::Ipv4Addr::from(u32::from(addr) & mask).to_string()
}

/// A veth pair between two namespaces, both ends down and without addresses.
pub fn link(a: &NetNs, b: &NetNs) -> (String, String) {
    let (ia, ib) = (unique_name("fa"), unique_name("fb"));
    run_ok(Command::new("ip").args([
        "link",
        "add",
        &ia,
        "netns",
        a.name(),
        "type",
        "veth",
        "peer",
        "name",
        &ib,
        "netns",
        b.name(),
    ]));
    (ia, ib)
}

/// A directory removed when dropped.
#[derive(Debug)]
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// One member: its namespace and process.
#[derive(Debug)]
struct Member {
    ip: String,
    ns: NetNs,
    child: Option<Child>,
}

/// An etcd cluster, one member per namespace on an [`Underlay`].
#[derive(Debug)]
pub struct Cluster {
    members: Vec<Member>,
    tls: bool,
    dir: Dir,
}

fn openssl(dir: &Path, args: &[&str]) {
    run_ok(Command::new("openssl").current_dir(dir).args(args));
}

/// `ca.pem`, a server certificate per member IP (`e<i>.pem`/`.key`) and a client
/// certificate (`client.pem`/`.key`) in `dir`.
fn make_certificates(dir: &Path, ips: &[String]) {
    let key = |name: &str| {
        openssl(
            dir,
            &[
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-out",
                &format!("{name}.key"),
            ],
        )
    };
    key("ca");
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            "ca.key",
            "-subj",
            "/CN=fleet-ca",
            "-days",
            "2",
            "-out",
            "ca.pem",
        ],
    );
    let mut leaves: Vec<(String, String)> = ips
        .iter()
        .enumerate()
        .map(|(i, ip)| (format!("e{i}"), format!("IP:{ip},IP:127.0.0.1")))
        .collect();
    leaves.push(("client".into(), "DNS:gateway".into()));
    for (name, san) in leaves {
        key(&name);
        fs::write(
            dir.join(format!("{name}.ext")),
            format!("subjectAltName={san}\nextendedKeyUsage=serverAuth,clientAuth\n"),
        )
        .unwrap();
        openssl(
            dir,
            &[
                "req",
                "-new",
                "-key",
                &format!("{name}.key"),
                "-subj",
                &format!("/CN={name}"),
                "-out",
                &format!("{name}.csr"),
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &format!("{name}.ext"),
                "-out",
                &format!("{name}.pem"),
            ],
        );
    }
}

impl Cluster {
    /// Members at `ips` (on `underlay`, its /24), with TLS and client certificates when `tls`,
    /// started and healthy.
    pub fn start(underlay: &Underlay, ips: &[&str], tls: bool) -> Cluster {
        let dir = std::env::temp_dir().join(unique_name("etcd"));
        fs::create_dir_all(dir.join("certs")).unwrap();
        let dir = Dir(dir);
        let ips: Vec<String> = ips.iter().map(|s| s.to_string()).collect();
        if tls {
            make_certificates(&dir.0.join("certs"), &ips);
        }
        let members = ips
            .iter()
            .map(|ip| Member {
                ip: ip.clone(),
                ns: underlay.host(&format!("{ip}/24")),
                child: None,
            })
            .collect();
        let mut cluster = Cluster { members, tls, dir };
        for i in 0..cluster.members.len() {
            cluster.start_member(i);
        }
        cluster.wait_healthy(&underlay.ns);
        cluster
    }

    /// The client URLs.
    pub fn endpoints(&self) -> Vec<String> {
        let scheme = if self.tls { "https" } else { "http" };
        self.members
            .iter()
            .map(|m| format!("{scheme}://{}:2379", m.ip))
            .collect()
    }

    /// Where the CA and the client certificate and key are (with TLS).
    pub fn certs(&self) -> PathBuf {
        self.dir.0.join("certs")
    }

    /// Member `i`'s Prometheus metrics URL (plain HTTP on port 2381).
    pub fn metrics_url(&self, i: usize) -> String {
        format!("http://{}:2381/metrics", self.members[i].ip)
    }

    /// Starts member `i` (again: with the data it had).
    pub fn start_member(&mut self, i: usize) {
        let cluster: Vec<String> = self
            .members
            .iter()
            .enumerate()
            .map(|(j, m)| format!("e{j}=http://{}:2380", m.ip))
            .collect();
        let (scheme, certs) = (if self.tls { "https" } else { "http" }, self.certs());
        let ip = self.members[i].ip.clone();
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.0.join(format!("e{i}.log")))
            .unwrap();
        let mut cmd = self.members[i].ns.command("etcd");
        cmd.args([
            format!("--name=e{i}"),
            format!("--data-dir={}", self.dir.0.join(format!("e{i}")).display()),
            format!("--listen-client-urls={scheme}://{ip}:2379"),
            format!("--advertise-client-urls={scheme}://{ip}:2379"),
            format!("--listen-peer-urls=http://{ip}:2380"),
            format!("--initial-advertise-peer-urls=http://{ip}:2380"),
            format!("--listen-metrics-urls=http://{ip}:2381"),
            format!("--initial-cluster={}", cluster.join(",")),
            "--initial-cluster-state=new".into(),
            "--initial-cluster-token=tunneld-fleet".into(),
            "--logger=zap".into(),
            "--log-outputs=stderr".into(),
        ]);
        if self.tls {
            cmd.args([
                format!("--cert-file={}", certs.join(format!("e{i}.pem")).display()),
                format!("--key-file={}", certs.join(format!("e{i}.key")).display()),
                format!("--trusted-ca-file={}", certs.join("ca.pem").display()),
                "--client-cert-auth".into(),
            ]);
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd");
        self.members[i].child = Some(child);
    }

    /// Stops member `i` with `signal` (`KILL`, `TERM`) and waits for it.
    pub fn stop_member(&mut self, i: usize, signal: &str) {
        self.stop_members(&[i], signal);
    }

    /// Sends `signal` to every member at once, then waits for each to exit (killing one
    /// that outlives [`WAIT`]): the whole store goes down together, so a client never sees
    /// the last member answer while the others are already gone.
    pub fn stop_all(&mut self, signal: &str) {
        let all: Vec<usize> = (0..self.members.len()).collect();
        self.stop_members(&all, signal);
    }

    fn stop_members(&mut self, which: &[usize], signal: &str) {
        let mut stopping = Vec::new();
        for &i in which {
            if let Some(child) = self.members[i].child.take() {
                let _ = Command::new("kill")
                    .args([&format!("-{signal}"), &child.id().to_string()])
                    .status();
                stopping.push(child);
            }
        }
        let deadline = Instant::now() + WAIT;
        for mut child in stopping {
            while child.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// `etcdctl` (v3, with the client certificate under TLS) from `ns`, bounded in time.
    pub fn etcdctl(&self, ns: &NetNs, args: &[&str]) -> Output {
        let mut cmd = ns.command("etcdctl");
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoints().join(",")))
            .arg("--command-timeout=3s")
            .arg("--dial-timeout=2s");
        if self.tls {
            let certs = self.certs();
            cmd.arg(format!("--cacert={}", certs.join("ca.pem").display()))
                .arg(format!("--cert={}", certs.join("client.pem").display()))
                .arg(format!("--key={}", certs.join("client.key").display()));
        }
        cmd.args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run etcdctl")
    }

    /// Waits until every member answers (panics with the logs after 30 s).
    pub fn wait_healthy(&self, ns: &NetNs) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = self.etcdctl(ns, &["endpoint", "health"]);
            if out.status.success() {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "etcd did not become healthy: {}\n{}",
                    String::from_utf8_lossy(&out.stderr),
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The last lines of every member's log.
    pub fn logs(&self) -> String {
        (0..self.members.len())
            .map(|i| {
                let text =
                    fs::read_to_string(self.dir.0.join(format!("e{i}.log"))).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!("--- etcd e{i} (last lines) ---\n{}", tail.join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(mut child) = m.child.take() {
                stop_process(&mut child);
            }
        }
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
    }
}

/// Seconds from `event` (Unix time) to the time a tunneld log line was written (its UTC
/// timestamp, `2026-01-02T03:04:05.678901Z`, read as a time of day); NaN for a line without
/// one.
pub fn logged_after(line: &str, event: f64) -> f64 {
    let parts: Vec<f64> = line
        .get(11..26)
        .unwrap_or_default()
        .split(':')
        .filter_map(|p| p.parse().ok())
        .collect();
    let [h, m, s] = parts[..] else {
        return f64::NAN;
    };
    (h * 3600.0 + m * 60.0 + s - event.rem_euclid(86_400.0) + 86_400.0).rem_euclid(86_400.0)
}

/// The Unix times of the replies in `ping -D` output.
pub fn ping_reply_times(output: &str) -> Vec<f64> {
    output
        .lines()
        .filter(|l| l.contains("bytes from"))
        .filter_map(|l| l.strip_prefix('[')?.split(']').next()?.parse().ok())
        .collect()
}

/// Seconds from `event` to the first reply after the gap it caused (a pause of more than
/// 0.3 s: a reply that left before the event may still arrive just after it); `None` while
/// no reply has ended a gap.
pub fn resumed_after(replies: &[f64], event: f64) -> Option<f64> {
    let mut previous = replies.iter().copied().rfind(|t| *t <= event);
    for t in replies.iter().copied().filter(|t| *t > event) {
        if t - previous.unwrap_or(event) > 0.3 {
            return Some(t - event);
        }
        previous = Some(t);
    }
    None
}
