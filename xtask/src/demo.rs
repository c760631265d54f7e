//! `cargo xtask demo`: two sites in network namespaces, joined by tunneld over a veth
//! "internet" (192.0.2.0/24), with traffic crossing the tunnel (10.77.0.0/24, fd77::/64).

use crate::system;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tunneld_testnet::{require_netns, veth, NetNs};

/// iperf3 run length: long enough for a stable figure, short enough for a demo.
const IPERF_SECONDS: u32 = 5;

/// A process killed and reaped when dropped.
struct Guard(Child);
impl Drop for Guard {
    fn drop(&mut self) {
        // SIGTERM first so tunneld removes its interface cleanly; the namespace goes anyway.
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

/// A temporary directory removed when dropped.
struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

struct Row {
    name: &'static str,
    rtt_ms: Option<f64>,
    gbits: f64,
    cpu_seconds: f64,
}

pub fn run(compare: bool) -> Result<(), String> {
    system::install_tools()?;
    if !require_netns("cargo xtask demo") {
        return Err("the demo needs root (network namespaces)".into());
    }
    let root = system::repo_root()?;
    eprintln!("==> building tunneld (release)");
    system::run(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["build", "--release", "-q", "-p", "tunneld"])
            .current_dir(&root),
    )?;
    let tunneld = root.join("target/release/tunneld");

    let mut rows = vec![site_to_site("tunneld", &tunneld, Impl::Tunneld)?];
    if compare {
        if system::have("wireguard-go") {
            rows.push(site_to_site(
                "wireguard-go (Debian)",
                &tunneld,
                Impl::WireguardGo,
            )?);
        } else {
            eprintln!("wireguard-go is not installed; skipping the comparison");
        }
    }

    println!();
    println!("| path | TCP 1 stream | tunnel CPU-s | Gbit per tunnel CPU-s | ping RTT |");
    println!("|---|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {:.2} Gbit/s | {:.2} | {:.2} | {} |",
            r.name,
            r.gbits,
            r.cpu_seconds,
            if r.cpu_seconds > 0.0 {
                r.gbits * IPERF_SECONDS as f64 / r.cpu_seconds
            } else {
                0.0
            },
            r.rtt_ms
                .map(|ms| format!("{:.0} µs", ms * 1000.0))
                .unwrap_or_else(|| "-".into()),
        );
    }
    println!();
    println!("Both gateways share this machine's cores, so Gbit/s is not one gateway's capacity;");
    println!("Gbit per tunnel CPU-second is the comparable figure. Everything created is removed.");
    Ok(())
}

#[derive(Clone, Copy, PartialEq)]
enum Impl {
    Tunneld,
    WireguardGo,
}

fn site_to_site(name: &'static str, tunneld: &Path, which: Impl) -> Result<Row, String> {
    eprintln!("==> {name}: two sites in network namespaces");
    let a = NetNs::new();
    let b = NetNs::new();
    veth(&a, "192.0.2.1/24", &b, "192.0.2.2/24");
    let dir = TempDir(std::env::temp_dir().join(format!("tunneld-demo-{}", std::process::id())));
    fs::create_dir_all(&dir.0).map_err(|e| format!("cannot create {}: {e}", dir.0.display()))?;

    let key = |file: &str| -> Result<String, String> {
        let out = Command::new(tunneld)
            .arg("genkey")
            .output()
            .map_err(|e| format!("tunneld genkey: {e}"))?;
        let path = dir.0.join(file);
        fs::write(&path, &out.stdout).map_err(|e| e.to_string())?;
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).map_err(|e| e.to_string())?;
        let public = Command::new(tunneld)
            .arg("pubkey")
            .stdin(fs::File::open(&path).map_err(|e| e.to_string())?)
            .output()
            .map_err(|e| format!("tunneld pubkey: {e}"))?;
        Ok(String::from_utf8_lossy(&public.stdout).trim().to_string())
    };
    let (a_pub, b_pub) = (key("a.key")?, key("b.key")?);
    let if_a = tunneld_testnet::unique_name("dA");
    let if_b = tunneld_testnet::unique_name("dB");

    let mut processes = Vec::new();
    for (ns, ifname, keyfile, me, peer_pub, peer_ip) in [
        (&a, &if_a, "a.key", 1, &b_pub, "192.0.2.2"),
        (&b, &if_b, "b.key", 2, &a_pub, "192.0.2.1"),
    ] {
        let other = 3 - me;
        let log =
            fs::File::create(dir.0.join(format!("{ifname}.log"))).map_err(|e| e.to_string())?;
        match which {
            Impl::Tunneld => {
                let config = format!(
                    "[interface]\nname = \"{ifname}\"\nprivate_key_file = \"{keyfile}\"\nlisten_port = 51820\n\
                     address = [\"10.77.0.{me}/24\", \"fd77::{me}/64\"]\nmtu = 1420\n\n\
                     [[peer]]\npublic_key = \"{peer_pub}\"\nendpoint = \"{peer_ip}:51820\"\n\
                     allowed_ips = [\"10.77.0.{other}/32\", \"fd77::{other}/128\"]\n"
                );
                let path = dir.0.join(format!("{ifname}.toml"));
                fs::write(&path, config).map_err(|e| e.to_string())?;
                let child = ns
                    .command(&tunneld.to_string_lossy())
                    .arg("up")
                    .arg(&path)
                    .stdout(Stdio::null())
                    .stderr(log)
                    .spawn()
                    .map_err(|e| format!("cannot start tunneld: {e}"))?;
                processes.push(Guard(child));
            }
            Impl::WireguardGo => {
                let child = ns
                    .command("wireguard-go")
                    .args(["-f", ifname])
                    .env("WG_PROCESS_FOREGROUND", "1")
                    .env("WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD", "1")
                    .stdout(Stdio::null())
                    .stderr(log)
                    .spawn()
                    .map_err(|e| format!("cannot start wireguard-go: {e}"))?;
                processes.push(Guard(child));
                wait_for_socket(ifname)?;
                let keypath = dir.0.join(keyfile);
                ns.run(&[
                    "wg",
                    "set",
                    ifname,
                    "private-key",
                    &keypath.to_string_lossy(),
                    "listen-port",
                    "51820",
                    "peer",
                    peer_pub,
                    "endpoint",
                    &format!("{peer_ip}:51820"),
                    "allowed-ips",
                    &format!("10.77.0.{other}/32,fd77::{other}/128"),
                ]);
                ns.run(&[
                    "ip",
                    "addr",
                    "add",
                    &format!("10.77.0.{me}/24"),
                    "dev",
                    ifname,
                ]);
                ns.run(&[
                    "ip",
                    "-6",
                    "addr",
                    "add",
                    &format!("fd77::{me}/64"),
                    "dev",
                    ifname,
                    "nodad",
                ]);
                ns.run(&["ip", "link", "set", ifname, "mtu", "1420", "up"]);
            }
        }
    }
    wait_for_socket(&if_a)?;
    wait_for_socket(&if_b)?;

    // The first packet waits for the handshake; measure the round trip after it.
    let warm_up = a.output(&["ping", "-c", "1", "-W", "5", "10.77.0.2"]);
    if !warm_up.status.success() {
        return Err(format!("{name}: no handshake across the tunnel within 5 s"));
    }
    let ping = a.output(&["ping", "-c", "10", "-i", "0.1", "-W", "2", "10.77.0.2"]);
    let ping_text = String::from_utf8_lossy(&ping.stdout);
    if !ping.status.success() {
        return Err(format!(
            "{name}: ping across the tunnel failed:\n{ping_text}"
        ));
    }
    let rtt_ms = ping_text
        .lines()
        .find(|l| l.contains("min/avg/max"))
        .and_then(|l| l.split('=').nth(1))
        .and_then(|v| v.trim().split('/').nth(1))
        .and_then(|v| v.parse::<f64>().ok());
    let ping6 = a.output(&["ping", "-6", "-c", "2", "-i", "0.2", "-W", "2", "fd77::2"]);
    println!(
        "{name}: ping 10.77.0.2 ok (avg {:.3} ms), ping fd77::2 {}",
        rtt_ms.unwrap_or(f64::NAN),
        if ping6.status.success() {
            "ok"
        } else {
            "FAILED"
        }
    );

    let server = Guard(
        b.command("iperf3")
            .args(["-s", "-1", "-B", "10.77.0.2"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start iperf3: {e}"))?,
    );
    std::thread::sleep(Duration::from_millis(300));
    let pids: Vec<u32> = processes.iter().map(|g| g.0.id()).collect();
    let cpu_before = cpu_seconds(&pids);
    let out = a.output(&[
        "iperf3",
        "-c",
        "10.77.0.2",
        "-t",
        &IPERF_SECONDS.to_string(),
        "-J",
    ]);
    let cpu = cpu_seconds(&pids) - cpu_before;
    drop(server);
    let json = String::from_utf8_lossy(&out.stdout);
    let gbits = received_bits_per_second(&json)
        .ok_or_else(|| format!("{name}: iperf3 gave no result:\n{json}"))?
        / 1e9;
    println!("{name}: TCP over the tunnel {gbits:.2} Gbit/s, {cpu:.2} CPU-s in the two gateways");
    Ok(Row {
        name,
        rtt_ms,
        gbits,
        cpu_seconds: cpu,
    })
}

fn wait_for_socket(ifname: &str) -> Result<(), String> {
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

/// User + system CPU seconds of the processes (from /proc/<pid>/stat).
fn cpu_seconds(pids: &[u32]) -> f64 {
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

/// `end.sum_received.bits_per_second` from iperf3's JSON, without a JSON dependency.
fn received_bits_per_second(json: &str) -> Option<f64> {
    let at = json.find("\"sum_received\"")?;
    let rest = &json[at..];
    let key = rest.find("\"bits_per_second\"")?;
    let value = rest[key + "\"bits_per_second\"".len()..]
        .trim_start_matches([':', ' '])
        .split([',', '\n', '}'])
        .next()?;
    value.trim().parse().ok()
}
