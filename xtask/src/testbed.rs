//! The end-to-end testbed of docs/benchmarks.md, shared by `demo` and `bench`: two gateway
//! namespaces joined by a veth "internet" (192.0.2.0/24), a tunnel between them (10.77.0.0/24,
//! fd77::/64) run by one implementation, and the measurements taken through it. Everything is
//! created per round and removed when the `Testbed` is dropped.

use std::fs;
use std::net::{SocketAddr, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tunneld_crypto::PublicKey;
use tunneld_testnet::relay::{DirectionCounts, LossyRelay, RelayConfig};
use tunneld_testnet::{unique_name, veth, NetNs};
use tunneld_wireguard::owner_of;

use crate::system;

/// Which tunnel runs between the two sites.
#[derive(Clone, Debug, PartialEq)]
pub enum Impl {
    /// No tunnel: traffic goes over the veth underlay directly.
    Direct,
    /// tunneld, from this repository's release build, with these lines in its `[dataplane]`
    /// section and these in its `[[peer]]` (empty: the defaults).
    Tunneld(PathBuf, &'static str, &'static str),
    /// tunneld with site A's peer on `transport = "tls"` to site B's `[[tls.listen]]
    /// forward_to = "wireguard"` (WireGuard over TLS), with this CA and server certificate
    /// and key for `tls.test`.
    TunneldOverTls {
        bin: PathBuf,
        ca: PathBuf,
        cert: PathBuf,
        key: PathBuf,
    },
    /// A wireguard-go binary (the Debian package, or a module build), configured with `wg`.
    WireguardGo(PathBuf),
    /// boringtun-cli, or gotatun-cli (Mullvad's fork, the same command line), configured
    /// with `wg`.
    Boringtun(PathBuf),
    /// The kernel's WireGuard module, configured with `ip` and `wg`.
    Kernel,
    /// tunneld (this binary, one worker) at site B only. Site A's peer is a program that
    /// carries WireGuard itself (an embedded TCP/IP stack, or a port forwarder such as
    /// onetun), started by the caller with the keys in [`Testbed::site_a_peer`]; B learns
    /// its endpoint from its handshake.
    TunneldSiteB(PathBuf),
}

/// What a site-A program needs to be the WireGuard peer of an [`Impl::TunneldSiteB`] testbed.
#[derive(Clone, Debug)]
pub struct SiteAPeer {
    /// Site A's private key, base64 (as `wg genkey` writes it), in a file only root reads.
    pub private_key_file: PathBuf,
    /// Site B's public key, base64.
    pub peer_public_key: String,
    /// Site B's WireGuard endpoint on the underlay.
    pub endpoint: &'static str,
    /// Site A's own address inside the tunnel (B allows exactly this one).
    pub address: &'static str,
}

/// A process killed and reaped when dropped (SIGTERM first, so tunnels tear down cleanly).
pub struct Guard(pub Child);
impl Drop for Guard {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg(self.0.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Where a testbed's lossy relay listens, in site A.
pub const RELAY_ADDR: &str = "192.0.2.1:51821";

pub struct Testbed {
    /// For a lossy underlay ([`Testbed::with_relay`]): the relay in site A that site A's
    /// WireGuard sends through. Dropped first.
    relay: Option<LossyRelay>,
    pub a: NetNs,
    pub b: NetNs,
    /// The address of site B that traffic is sent to (inside the tunnel, or the underlay).
    pub target_v4: &'static str,
    pub target_v6: &'static str,
    /// The tunnel processes (empty for direct and kernel).
    processes: Vec<Guard>,
    interfaces: Vec<String>,
    /// The congestion control iperf3 asks for on each of its connections (`-C`), once
    /// `set_tcp_congestion_control` has chosen one.
    iperf_cc: Option<String>,
    /// For [`Impl::TunneldSiteB`]: what site A's program is given.
    site_a_peer: Option<SiteAPeer>,
    _dir: TempDir,
}

impl Drop for Testbed {
    fn drop(&mut self) {
        // The tunnel processes first, with SIGTERM, so they tear down and remove their UAPI
        // sockets; only then the namespaces (whose drop SIGKILLs whatever is still inside).
        self.processes.clear();
        for ifname in &self.interfaces {
            // Left only by a process that had to be killed; the name is unique to this run.
            let _ = fs::remove_file(format!("/var/run/wireguard/{ifname}.sock"));
        }
    }
}

/// Longest an iperf3 client may run beyond its `-t` seconds before it is stopped.
const IPERF_GRACE: Duration = Duration::from_secs(20);

fn write_key(dir: &Path, name: &str, tunneld: &Path) -> Result<(PathBuf, String), String> {
    let out = Command::new(tunneld)
        .arg("genkey")
        .output()
        .map_err(|e| format!("tunneld genkey: {e}"))?;
    let path = dir.join(name);
    fs::write(&path, &out.stdout).map_err(|e| e.to_string())?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).map_err(|e| e.to_string())?;
    let public = Command::new(tunneld)
        .arg("pubkey")
        .stdin(fs::File::open(&path).map_err(|e| e.to_string())?)
        .output()
        .map_err(|e| format!("tunneld pubkey: {e}"))?;
    Ok((
        path,
        String::from_utf8_lossy(&public.stdout).trim().to_string(),
    ))
}

/// The worker count of a tunneld row whose peer is plain (one sub-tunnel), if above one.
fn plain_peer_workers(which: &Impl) -> Option<usize> {
    let Impl::Tunneld(_, dataplane, peer) = which else {
        return None;
    };
    if peer.contains("parallel") {
        return None;
    }
    let workers = dataplane
        .lines()
        .find_map(|line| line.trim().strip_prefix("workers = "))?
        .parse()
        .ok()?;
    (workers > 1).then_some(workers)
}

/// Whether the peers of both sites are carried by the same worker index.
fn same_owner(a_pub: &str, b_pub: &str, workers: usize) -> bool {
    let owner = |key: &str| {
        PublicKey::from_base64(key)
            .ok()
            .map(|k| owner_of(&k, 1, 0, workers))
    };
    matches!((owner(a_pub), owner(b_pub)), (Some(a), Some(b)) if a == b)
}

/// The DNS name `Impl::TunneldOverTls`'s server certificate carries.
pub const TLS_NAME: &str = "tunneld-bench.test";

/// Whether this kernel can create WireGuard interfaces (tried in a scratch namespace).
/// The `cpus` line for tunneld at site `me`: the machine's CPUs in order at site A and in
/// reverse at site B. Each tunneld pins worker i to the i-th CPU it is given, so with the
/// same order both sites' worker 0 would share a core, as two gateways on two machines
/// never do; reversed, each worker of A has a core its counterpart in B does not use.
fn site_cpus(me: u8) -> String {
    let mut cpus = allowed_cpus();
    if me == 2 {
        cpus.reverse();
    }
    let list: Vec<String> = cpus.iter().map(ToString::to_string).collect();
    format!("cpus = [{}]", list.join(", "))
}

/// The CPUs this process may run on, from `Cpus_allowed_list` in /proc/self/status
/// ("0-3,6"); CPU 0 alone if it cannot be read.
fn allowed_cpus() -> Vec<usize> {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap_or("0")
        .trim();
    let mut cpus = Vec::new();
    for part in list.split(',') {
        let mut ends = part.split('-').map(|n| n.trim().parse::<usize>());
        match (ends.next(), ends.next()) {
            (Some(Ok(a)), Some(Ok(b))) => cpus.extend(a..=b),
            (Some(Ok(a)), None) => cpus.push(a),
            _ => {}
        }
    }
    if cpus.is_empty() {
        cpus.push(0);
    }
    cpus
}

pub fn kernel_has_wireguard() -> bool {
    let ns = NetNs::new();
    ns.output(&["ip", "link", "add", "wgprobe", "type", "wireguard"])
        .status
        .success()
}

impl Testbed {
    /// Builds the two sites and brings the tunnel up with `which`. `tunneld` is used for keys.
    pub fn new(which: &Impl, tunneld: &Path) -> Result<Testbed, String> {
        Self::with_relay(which, tunneld, None)
    }

    /// As [`Testbed::new`], with site A's WireGuard traffic sent through a [`LossyRelay`]
    /// in A (at [`RELAY_ADDR`]) that drops and delays it, when `relay` is given.
    pub fn with_relay(
        which: &Impl,
        tunneld: &Path,
        relay: Option<RelayConfig>,
    ) -> Result<Testbed, String> {
        let a = NetNs::new();
        let b = NetNs::new();
        veth(&a, "192.0.2.1/24", &b, "192.0.2.2/24");
        let relay = match relay {
            Some(config) => Some(
                LossyRelay::start(
                    &a,
                    RELAY_ADDR.parse().map_err(|e| format!("{e}"))?,
                    "192.0.2.2:51820".parse().map_err(|e| format!("{e}"))?,
                    config,
                )
                .map_err(|e| format!("cannot start the lossy relay: {e}"))?,
            ),
            None => None,
        };
        let a_endpoint = if relay.is_some() {
            RELAY_ADDR
        } else {
            "192.0.2.2:51820"
        };
        let dir = TempDir(std::env::temp_dir().join(unique_name("tdbench")));
        fs::create_dir_all(&dir.0)
            .map_err(|e| format!("cannot create {}: {e}", dir.0.display()))?;
        let mut bed = Testbed {
            relay,
            a,
            b,
            target_v4: "10.77.0.2",
            target_v6: "fd77::2",
            processes: Vec::new(),
            interfaces: Vec::new(),
            iperf_cc: None,
            site_a_peer: None,
            _dir: dir,
        };
        if *which == Impl::Direct {
            bed.target_v4 = "192.0.2.2";
            bed.target_v6 = "";
            return Ok(bed);
        }
        let dir = bed._dir.0.clone();
        let (a_key, a_pub) = write_key(&dir, "a.key", tunneld)?;
        let (mut b_key, mut b_pub) = write_key(&dir, "b.key", tunneld)?;
        // A plain peer is carried by the worker its public key names (`owner_of`). With the
        // same index at both sites, the reversed CPU lists put the two carrying workers on
        // different cores, as on two machines; otherwise a round would run both on one
        // core, and rounds would differ by luck of the keys.
        if let Some(workers) = plain_peer_workers(which) {
            for _ in 0..64 {
                if same_owner(&a_pub, &b_pub, workers) {
                    break;
                }
                (b_key, b_pub) = write_key(&dir, "b.key", tunneld)?;
            }
        }
        let sites = [
            (1u8, a_key, b_pub.clone(), "192.0.2.2"),
            (2u8, b_key, a_pub.clone(), "192.0.2.1"),
        ];
        for (me, key, peer_pub, peer_ip) in sites {
            // Where this site sends its WireGuard traffic: B directly, or A's relay.
            let peer_endpoint = if me == 1 {
                a_endpoint.to_string()
            } else {
                format!("{peer_ip}:51820")
            };
            if me == 1 {
                if let Impl::TunneldSiteB(_) = which {
                    // Nothing runs at site A: the caller's program is its peer.
                    bed.site_a_peer = Some(SiteAPeer {
                        private_key_file: key,
                        peer_public_key: peer_pub,
                        endpoint: a_endpoint,
                        address: "10.77.0.1",
                    });
                    continue;
                }
            }
            let other = 3 - me;
            let ns = if me == 1 { &bed.a } else { &bed.b };
            let ifname = unique_name("tb");
            let log =
                fs::File::create(dir.join(format!("{ifname}.log"))).map_err(|e| e.to_string())?;
            let spawn = |cmd: &mut Command| -> Result<Guard, String> {
                cmd.stdout(Stdio::null())
                    .stderr(log.try_clone().map_err(|e| e.to_string())?)
                    .spawn()
                    .map(Guard)
                    .map_err(|e| format!("cannot start {cmd:?}: {e}"))
            };
            let configure_with_wg = |ns: &NetNs| {
                ns.run(&[
                    "wg",
                    "set",
                    &ifname,
                    "private-key",
                    &key.to_string_lossy(),
                    "listen-port",
                    "51820",
                    "peer",
                    &peer_pub,
                    "endpoint",
                    &peer_endpoint,
                    "allowed-ips",
                    &format!("10.77.0.{other}/32,fd77::{other}/128"),
                ]);
                ns.run(&[
                    "ip",
                    "addr",
                    "add",
                    &format!("10.77.0.{me}/24"),
                    "dev",
                    &ifname,
                ]);
                ns.run(&[
                    "ip",
                    "-6",
                    "addr",
                    "add",
                    &format!("fd77::{me}/64"),
                    "dev",
                    &ifname,
                    "nodad",
                ]);
                ns.run(&["ip", "link", "set", &ifname, "mtu", "1420", "up"]);
            };
            // Recorded before starting anything, so the drop cleans up after a failed start.
            bed.interfaces.push(ifname.clone());
            match which {
                Impl::Direct => unreachable!(),
                Impl::Tunneld(..) | Impl::TunneldOverTls { .. } | Impl::TunneldSiteB(_) => {
                    // What differs between the two: the dataplane lines, how A reaches B, and
                    // B's TLS listener for WireGuard over TLS (B then learns A's endpoint).
                    let (bin, dataplane, peer_lines, tail) = match which {
                        Impl::Tunneld(bin, dataplane, peer) => (
                            bin,
                            dataplane.to_string(),
                            format!("endpoint = \"{peer_endpoint}\"\n{peer}\n"),
                            String::new(),
                        ),
                        Impl::TunneldOverTls {
                            bin,
                            ca,
                            cert,
                            key: tls_key,
                        } => {
                            let dataplane = "backend = \"mmsg\"\nworkers = 1".to_string();
                            if me == 1 {
                                let peer_lines = format!(
                                    "endpoint = \"{peer_ip}:8443\"\ntransport = \"tls\"\n\
                                     tls_server_name = \"{TLS_NAME}\"\ntls_ca_file = \"{}\"\n",
                                    ca.display()
                                );
                                (bin, dataplane, peer_lines, String::new())
                            } else {
                                let tail = format!(
                                    "\n[[tls.listen]]\nlisten = \"192.0.2.2:8443\"\ncert_file = \"{}\"\n\
                                     key_file = \"{}\"\nforward_to = \"wireguard\"\n",
                                    cert.display(),
                                    tls_key.display()
                                );
                                (bin, dataplane, String::new(), tail)
                            }
                        }
                        // No endpoint: site A's program starts every session.
                        Impl::TunneldSiteB(bin) => (
                            bin,
                            "backend = \"mmsg\"\nworkers = 1".to_string(),
                            String::new(),
                            String::new(),
                        ),
                        _ => unreachable!(),
                    };
                    let cpus = site_cpus(me);
                    let config = format!(
                        "[interface]\nname = \"{ifname}\"\nprivate_key_file = \"{}\"\nlisten_port = 51820\n\
                         address = [\"10.77.0.{me}/24\", \"fd77::{me}/64\"]\nmtu = 1420\n\n\
                         [dataplane]\n{dataplane}\n{cpus}\n\n\
                         [[peer]]\npublic_key = \"{peer_pub}\"\n\
                         allowed_ips = [\"10.77.0.{other}/32\", \"fd77::{other}/128\"]\n{peer_lines}{tail}",
                        key.display()
                    );
                    let path = dir.join(format!("{ifname}.toml"));
                    fs::write(&path, config).map_err(|e| e.to_string())?;
                    let mut cmd = ns.command(&bin.to_string_lossy());
                    bed.processes.push(spawn(cmd.arg("up").arg(&path))?);
                    wait_for_socket(&ifname).map_err(|e| format!("{e}{}", bed.logs()))?;
                }
                Impl::WireguardGo(bin) => {
                    let mut cmd = ns.command(&bin.to_string_lossy());
                    cmd.args(["-f", &ifname])
                        .env("WG_PROCESS_FOREGROUND", "1")
                        .env("WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD", "1");
                    bed.processes.push(spawn(&mut cmd)?);
                    wait_for_socket(&ifname).map_err(|e| format!("{e}{}", bed.logs()))?;
                    configure_with_wg(ns);
                }
                Impl::Boringtun(bin) => {
                    let mut cmd = ns.command(&bin.to_string_lossy());
                    cmd.args(["-f", "--disable-drop-privileges", &ifname])
                        .env("WG_SUDO", "1");
                    bed.processes.push(spawn(&mut cmd)?);
                    wait_for_socket(&ifname).map_err(|e| format!("{e}{}", bed.logs()))?;
                    configure_with_wg(ns);
                }
                Impl::Kernel => {
                    ns.run(&["ip", "link", "add", &ifname, "type", "wireguard"]);
                    configure_with_wg(ns);
                }
            }
        }
        if bed.site_a_peer.is_some() {
            // No tunnel until site A's program comes up and starts one.
            return Ok(bed);
        }
        // The first packet waits for the handshake. Through a lossy relay the handshake or
        // the ping may be lost: a few tries.
        let tries = if bed.relay.is_some() { 5 } else { 1 };
        let mut warm = bed.a.output(&["ping", "-c", "1", "-W", "5", bed.target_v4]);
        for _ in 1..tries {
            if warm.status.success() {
                break;
            }
            warm = bed.a.output(&["ping", "-c", "1", "-W", "5", bed.target_v4]);
        }
        if !warm.status.success() {
            return Err(format!(
                "{which:?}: no traffic across the tunnel within 5 s{}",
                bed.logs()
            ));
        }
        Ok(bed)
    }

    /// The lossy relay's counts (toward B, back toward A), for a testbed that has one.
    pub fn relay_counts(&self) -> Option<(DirectionCounts, DirectionCounts)> {
        self.relay
            .as_ref()
            .map(|r| (r.toward_target(), r.toward_source()))
    }

    /// The tail of each tunnel process's log, for error messages.
    pub fn logs(&self) -> String {
        let mut text = String::new();
        for ifname in &self.interfaces {
            let path = self._dir.0.join(format!("{ifname}.log"));
            if let Ok(log) = fs::read_to_string(&path) {
                let lines: Vec<&str> = log.lines().collect();
                let tail = &lines[lines.len().saturating_sub(20)..];
                text.push_str(&format!("\n--- {ifname} log (last lines) ---\n"));
                text.push_str(&tail.join("\n"));
            }
        }
        text
    }

    /// For an [`Impl::TunneldSiteB`] testbed, the keys and addresses site A's program uses.
    pub fn site_a_peer(&self) -> Option<&SiteAPeer> {
        self.site_a_peer.as_ref()
    }

    /// This testbed's private directory (keys, configs, logs), removed with it.
    pub fn dir(&self) -> &Path {
        &self._dir.0
    }

    /// The tunnel interfaces, in site A then site B (B's alone for [`Impl::TunneldSiteB`]).
    pub fn interfaces(&self) -> &[String] {
        &self.interfaces
    }

    /// Seconds since the latest handshake with the peer, as each site's `wg` reports it
    /// (A then B); `None` for a site without one (or without a tunnel).
    pub fn handshake_ages(&self) -> Vec<Option<u64>> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let sites = if self.site_a_peer.is_some() {
            vec![&self.b]
        } else {
            vec![&self.a, &self.b]
        };
        sites
            .into_iter()
            .zip(&self.interfaces)
            .map(|(ns, ifname)| {
                let out = ns.output(&["wg", "show", ifname, "latest-handshakes"]);
                String::from_utf8_lossy(&out.stdout)
                    .split_whitespace()
                    .nth(1)
                    .and_then(|t| t.parse::<u64>().ok())
                    .filter(|t| *t > 0)
                    .map(|t| now.saturating_sub(t))
            })
            .collect()
    }

    pub fn pids(&self) -> Vec<u32> {
        self.processes.iter().map(|g| g.0.id()).collect()
    }

    /// Makes `name` the TCP congestion control of the traffic measured here: iperf3 asks for
    /// it on every connection (`-C`, which root may do for any algorithm the kernel has, and
    /// which iperf3 passes on to its server), and both sites' namespaces take it as their
    /// default where the host lets them, for the connections that do not choose (a TLS
    /// proxy's own). A namespace may only default to an algorithm in the host's
    /// `tcp_allowed_congestion_control` (the kernel answers EPERM otherwise); then the
    /// namespaces keep the host's default and this returns it, for the report to name.
    pub fn set_tcp_congestion_control(&mut self, name: &str) -> Result<Option<String>, String> {
        let setting = format!("net.ipv4.tcp_congestion_control={name}");
        for ns in [&self.a, &self.b] {
            let out = ns.output(&["sysctl", "-qw", &setting]);
            if out.status.success() {
                continue;
            }
            // The kernel loads the algorithm's module before it checks the host's allowed
            // list, so an algorithm it has is available now, whatever the answer was.
            let available = available_congestion_controls();
            if !available.iter().any(|a| a == name) {
                return Err(format!(
                    "cannot use TCP congestion control `{name}` ({}); this kernel offers: {}",
                    String::from_utf8_lossy(&out.stderr).trim(),
                    available.join(" ")
                ));
            }
            self.iperf_cc = Some(name.to_string());
            return Ok(Some(system::host_tcp_cc()));
        }
        self.iperf_cc = Some(name.to_string());
        Ok(None)
    }

    /// Average ping RTT in microseconds over `count` pings (IPv4 or IPv6 target).
    pub fn ping_us(&self, v6: bool, count: u32) -> Option<f64> {
        let target = if v6 { self.target_v6 } else { self.target_v4 };
        if target.is_empty() {
            return None;
        }
        let out = self.a.output(&[
            "ping",
            "-c",
            &count.to_string(),
            "-i",
            "0.05",
            "-W",
            "2",
            target,
        ]);
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .find(|l| l.contains("min/avg/max"))
            .and_then(|l| l.split('=').nth(1))
            .and_then(|v| v.trim().split('/').nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .map(|ms| ms * 1000.0)
    }

    /// A one-shot iperf3 server in B, listening once this returns; stopped when dropped.
    fn iperf_server(&self) -> Result<Guard, String> {
        let server = Guard(
            self.b
                .command("iperf3")
                .args(["-s", "-1", "-B", self.target_v4])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot start iperf3: {e}"))?,
        );
        wait_for_tcp_listener(&self.b, 5201);
        Ok(server)
    }

    /// Runs iperf3 from A to B; returns (received bit/s, tunnel CPU-s, machine CPU-s).
    pub fn iperf_tcp(&self, streams: u32, seconds: u32) -> Result<(f64, f64, f64), String> {
        let _server = self.iperf_server()?;
        let pids = self.pids();
        let (cpu0, machine0) = (cpu_seconds(&pids), machine_busy_seconds());
        let mut client = self.a.command("iperf3");
        client.args([
            "-c",
            self.target_v4,
            "-t",
            &seconds.to_string(),
            "-P",
            &streams.to_string(),
            "-J",
        ]);
        if let Some(cc) = &self.iperf_cc {
            client.args(["-C", cc]);
        }
        let out = system::output_within(
            &mut client,
            Duration::from_secs(seconds.into()) + IPERF_GRACE,
        )?;
        let (cpu1, machine1) = (cpu_seconds(&pids), machine_busy_seconds());
        let json = String::from_utf8_lossy(&out.stdout);
        check_congestion_control(&json, self.iperf_cc.as_deref())?;
        let bps = json_number_after(&json, "\"sum_received\"", "\"bits_per_second\"").ok_or_else(
            || {
                format!(
                    "iperf3 gave no result: {}",
                    json.chars().take(400).collect::<String>()
                )
            },
        )?;
        Ok((bps, cpu1 - cpu0, machine1 - machine0))
    }

    /// Small-packet rate: UDP datagrams of 64 bytes, as fast as iperf3 sends them, for
    /// `seconds`; returns datagrams per second received at B, and the tunnel processes' CPU
    /// seconds meanwhile.
    pub fn small_packet_rate(&self, seconds: u32) -> Result<(f64, f64), String> {
        let _server = self.iperf_server()?;
        let pids = self.pids();
        let cpu0 = cpu_seconds(&pids);
        let out = system::output_within(
            self.a.command("iperf3").args([
                "-c",
                self.target_v4,
                "-u",
                "-l",
                "64",
                "-b",
                "0",
                "-t",
                &seconds.to_string(),
                "-J",
            ]),
            Duration::from_secs(seconds.into()) + IPERF_GRACE,
        )?;
        let cpu = cpu_seconds(&pids) - cpu0;
        let json = String::from_utf8_lossy(&out.stdout);
        let packets = json_number_after(&json, "\"sum\"", "\"packets\"");
        let lost = json_number_after(&json, "\"sum\"", "\"lost_packets\"");
        let secs = json_number_after(&json, "\"sum\"", "\"seconds\"");
        match (packets, lost, secs) {
            (Some(p), Some(l), Some(s)) if s > 0.0 => Ok(((p - l) / s, cpu)),
            _ => Err(format!(
                "iperf3 UDP gave no result: {}",
                json.chars().take(400).collect::<String>()
            )),
        }
    }

    /// RTT percentiles (p50, p99) in microseconds of `count` UDP echoes, one at a time, from a
    /// socket in A to an echo server in B. Bounded: each probe waits at most 1 s.
    pub fn udp_rtt_us(&self, count: usize) -> Option<(f64, f64)> {
        let target: SocketAddr = format!("{}:7777", self.target_v4).parse().ok()?;
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let server = self.b.spawn_in_ns(move || {
            let Ok(sock) = UdpSocket::bind(target) else {
                let _ = ready_tx.send(false);
                return;
            };
            let _ = sock.set_read_timeout(Some(Duration::from_secs(2)));
            let _ = ready_tx.send(true);
            let mut buf = [0u8; 64];
            // Stops once the client has been silent for 2 s (it sends "stop" when done).
            while let Ok((n, from)) = sock.recv_from(&mut buf) {
                if &buf[..n] == b"stop" {
                    break;
                }
                let _ = sock.send_to(&buf[..n], from);
            }
        });
        if !ready_rx
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or(false)
        {
            return None;
        }
        let mut samples = self.a.in_ns(move || {
            let sock = UdpSocket::bind("0.0.0.0:0").ok()?;
            sock.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
            let mut samples = Vec::with_capacity(count);
            let mut buf = [0u8; 64];
            for i in 0..count as u64 {
                let start = Instant::now();
                sock.send_to(&i.to_be_bytes(), target).ok()?;
                if let Ok((8, _)) = sock.recv_from(&mut buf) {
                    samples.push(start.elapsed().as_secs_f64() * 1e6);
                }
            }
            let _ = sock.send_to(b"stop", target);
            Some(samples)
        })?;
        let _ = server.join();
        if samples.is_empty() {
            return None;
        }
        samples.sort_by(f64::total_cmp);
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        Some((at(0.50), at(0.99)))
    }

    /// Peak resident memory (VmHWM) of the tunnel processes, summed, in KiB.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        let pids = self.pids();
        if pids.is_empty() {
            return None;
        }
        Some(peak_rss_kib(&pids))
    }
}

pub fn wait_for_socket(ifname: &str) -> Result<(), String> {
    let path = format!("/var/run/wireguard/{ifname}.sock");
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if Path::new(&path).exists() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("{path} did not appear within 10 s"))
}

/// Waits (bounded) until something listens on TCP `port` in `ns`.
fn wait_for_tcp_listener(ns: &NetNs, port: u16) {
    let needle = format!(":{port} ");
    for _ in 0..100 {
        let out = ns.output(&["ss", "-ltnH"]);
        if String::from_utf8_lossy(&out.stdout).contains(&needle) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// User + system CPU seconds of the processes (from /proc/<pid>/stat).
pub fn cpu_seconds(pids: &[u32]) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    pids.iter()
        .filter_map(|pid| fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|stat| {
            // Fields after the command name, which is in parentheses and may hold spaces.
            let rest = &stat[stat.rfind(')')? + 2..];
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let utime: f64 = fields.get(11)?.parse().ok()?;
            let stime: f64 = fields.get(12)?.parse().ok()?;
            Some((utime + stime) / ticks)
        })
        .sum()
}

/// Busy (non-idle) CPU seconds of the whole machine since boot, from /proc/stat.
pub fn machine_busy_seconds() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let Ok(stat) = fs::read_to_string("/proc/stat") else {
        return 0.0;
    };
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return 0.0;
    };
    let fields: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...: busy is all but idle and iowait.
    let busy: f64 = fields
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, v)| v)
        .sum();
    busy / ticks
}

/// The TCP congestion controls this kernel has loaded (more load on first use).
pub fn available_congestion_controls() -> Vec<String> {
    fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .unwrap_or_default()
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// Fails unless iperf3's JSON report says both ends of its connections ran `wanted` (when
/// one was asked for): a figure is only labelled with the algorithm that produced it.
pub fn check_congestion_control(iperf_json: &str, wanted: Option<&str>) -> Result<(), String> {
    let Some(wanted) = wanted else { return Ok(()) };
    for side in ["sender_tcp_congestion", "receiver_tcp_congestion"] {
        let used = json_string_after(iperf_json, &format!("\"{side}\""));
        if used.as_deref() != Some(wanted) {
            return Err(format!(
                "iperf3 was asked for TCP congestion control `{wanted}` but its report says {side} = {}",
                used.unwrap_or_else(|| "nothing".into())
            ));
        }
    }
    Ok(())
}

/// The string value after `key` (`"key": "value"`) in iperf3's JSON, without a JSON crate.
fn json_string_after(json: &str, key: &str) -> Option<String> {
    let rest = &json[json.find(key)? + key.len()..];
    let rest = rest
        .trim_start()
        .strip_prefix(':')?
        .trim_start()
        .strip_prefix('"')?;
    Some(rest[..rest.find('"')?].to_string())
}

/// The number after `"key":` that follows `anchor` in iperf3's JSON, without a JSON crate.
pub fn json_number_after(json: &str, anchor: &str, key: &str) -> Option<f64> {
    let at = json.rfind(anchor)?;
    let rest = &json[at..];
    let k = rest.find(key)?;
    rest[k + key.len()..]
        .trim_start_matches([':', ' ', '\t'])
        .split([',', '\n', '}'])
        .next()?
        .trim()
        .parse()
        .ok()
}

/// Peak resident memory (VmHWM) of `pids`, summed, in KiB; processes already gone count 0.
pub fn peak_rss_kib(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|&pid| status_kib(pid, "VmHWM:"))
        .sum()
}

/// Resident memory now (VmRSS) of `pid`, in KiB; `None` once it is gone.
pub fn rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS:")
}

/// A KiB field (`VmRSS:`, `VmHWM:`) of `/proc/<pid>/status`.
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_peers_on_several_workers_need_placing() {
        let bin = PathBuf::from("tunneld");
        let row = |dataplane, peer| Impl::Tunneld(bin.clone(), dataplane, peer);
        assert_eq!(plain_peer_workers(&row("workers = 2", "")), Some(2));
        assert_eq!(
            plain_peer_workers(&row("backend = \"mmsg\"\nworkers = 4", "")),
            Some(4)
        );
        assert_eq!(plain_peer_workers(&row("workers = 1", "")), None);
        assert_eq!(
            plain_peer_workers(&row("workers = 2", "parallel = 2")),
            None
        );
        assert_eq!(plain_peer_workers(&Impl::Direct), None);
    }

    #[test]
    fn same_owner_follows_tunnelds_rule() {
        // owner_of reads the key's first four bytes, little-endian: 0 and 1 here.
        let key = |first: u8| {
            let mut bytes = [0u8; 32];
            bytes[0] = first;
            PublicKey::from_bytes(bytes).to_base64()
        };
        assert!(same_owner(&key(0), &key(2), 2));
        assert!(!same_owner(&key(0), &key(1), 2));
        assert!(same_owner(&key(0), &key(1), 1));
        assert!(!same_owner("not a key", &key(0), 2));
    }
}
