//! Shared pieces of the end-to-end tests: gateways run in namespaces the test creates.

#![allow(dead_code)]

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tunneld_testnet::NetNs;

pub const TUNNELD: &str = env!("CARGO_BIN_EXE_tunneld");

// Not every test binary that includes this module uses each.
#[allow(unused_imports)]
pub use tunneld_testnet::{pattern, wait_until, write_private, WAIT};

/// Announces a test step. libtest shows it (with the daemon logs) only when the test fails,
/// so a failure says which step it was in.
pub fn step(what: &str) {
    eprintln!("[step] {what}");
}

pub fn genkey() -> String {
    let out = Command::new(TUNNELD).arg("genkey").output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

pub fn pubkey(private: &str) -> String {
    let mut child = Command::new(TUNNELD)
        .arg("pubkey")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(private.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

pub fn socket_path(ifname: &str) -> PathBuf {
    tunneld_testnet::uapi_socket_path(ifname)
}

/// Runs `cmd` (one that is expected to exit by itself, e.g. `tunneld up` on a broken config)
/// and returns its output; a process still running after [`WAIT`] is killed and the test fails,
/// instead of hanging.
pub fn output_bounded(cmd: &mut Command) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let (out_path, err_path) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out_path).unwrap())
        .stderr(fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let status = wait_bounded(&mut child);
    let stdout = fs::read(&out_path).unwrap_or_default();
    let stderr = fs::read(&err_path).unwrap_or_default();
    let Some(status) = status else {
        panic!(
            "{cmd:?} was still running after {WAIT:?} and was killed; stderr:\n{}",
            String::from_utf8_lossy(&stderr)
        );
    };
    std::process::Output {
        status,
        stdout,
        stderr,
    }
}

/// Runs `cmd` with its stdout a pipe whose reader is already gone, as in `tunneld genkey |
/// true` or `tunneld show | head -1` after its line, and `stdin` written to its stdin.
/// Returns the exit status and what it said on stderr; killed (and the test failed) after
/// [`WAIT`].
pub fn run_into_closed_pipe(cmd: &mut Command, stdin: &str) -> (ExitStatus, String) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let dir = tempfile::tempdir().unwrap();
    let err_path = dir.path().join("stderr");
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(writer)
        .stderr(fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    // A command that does not read its stdin may have exited already.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    let Some(status) = wait_bounded(&mut child) else {
        panic!("{cmd:?} was still running after {WAIT:?} and was killed");
    };
    (status, fs::read_to_string(&err_path).unwrap_or_default())
}

/// Waits for `child` to exit, for at most [`WAIT`]; kills and reaps it after that (`None`).
fn wait_bounded(child: &mut Child) -> Option<ExitStatus> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A `tunneld up` running in a namespace; stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Gateway {
    pub ifname: String,
    pub private_key: String,
    pub public_key: String,
    pub dir: tempfile::TempDir,
    pub log: PathBuf,
    child: Option<Child>,
}

/// Starts `tunneld up config` in `ns`, its debug log going to `log`.
pub fn spawn_up(ns: &NetNs, config: &Path, log: &Path) -> Child {
    ns.command(TUNNELD)
        .arg("up")
        .arg(config)
        .env("TUNNELD_LOG", "debug")
        .stdout(Stdio::null())
        .stderr(fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

impl Gateway {
    /// Writes a config with `private_key_file` and starts `tunneld up` in `ns`.
    pub fn start(ns: &NetNs, ifname: &str, private_key: &str, body: &str) -> Gateway {
        step(&format!("start tunneld {ifname} in {}", ns.name()));
        let dir = tempfile::tempdir().unwrap();
        write_private(dir.path(), "private.key", private_key);
        let config =
            format!("[interface]\nname = \"{ifname}\"\nprivate_key_file = \"private.key\"\n{body}");
        let path = dir.path().join("gateway.toml");
        fs::write(&path, config).unwrap();
        let log = dir.path().join("tunneld.log");
        let child = spawn_up(ns, &path, &log);
        let public_key = pubkey(private_key);
        let mut gw = Gateway {
            ifname: ifname.to_string(),
            public_key,
            private_key: private_key.to_string(),
            dir,
            log,
            child: Some(child),
        };
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = gw.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("tunneld exited early ({status}):\n{}", gw.log_text());
            }
            // `wg` only once tunneld says the interface is up: before that the path may still
            // be a stale socket of a killed tunneld, which `wg` would unlink as tunneld
            // replaces it.
            let ready = gw.log_text().contains("interface up")
                && socket_path(ifname).exists()
                && ns.output(&["wg", "show", ifname]).status.success();
            if ready {
                return gw;
            }
            assert!(
                Instant::now() < deadline,
                "tunneld did not become ready:\n{}",
                gw.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Sends `signal` and waits for the exit status.
    pub fn stop_with(&mut self, signal: &str) -> ExitStatus {
        let mut child = self.child.take().unwrap();
        Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .unwrap();
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("tunneld did not exit after {signal}:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            tunneld_testnet::stop_process(&mut child);
        }
        // Only left behind when tunneld had to be killed (the signal tests check that it
        // removes it itself); the name is unique to this test, so it is ours to remove.
        let _ = fs::remove_file(socket_path(&self.ifname));
        if std::thread::panicking() {
            eprintln!("--- tunneld log ({}) ---\n{}", self.ifname, self.log_text());
        }
    }
}

/// A wireguard-go process in a namespace, configured with `wg`; killed when dropped.
pub struct WireguardGo {
    pub ifname: String,
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl WireguardGo {
    pub fn start(ns: &NetNs, ifname: &str) -> WireguardGo {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("wireguard-go.log");
        step(&format!("start wireguard-go {ifname} in {}", ns.name()));
        let child = tunneld_testnet::start_wireguard_go(ns, ifname, &log);
        WireguardGo {
            ifname: ifname.to_string(),
            child,
            log,
            _dir: dir,
        }
    }
}

impl WireguardGo {
    /// Configures this interface as site 2 of the tunnel with `wg` and `ip`: key `private`,
    /// port 51820, 10.77.0.2/24 and fd77::2/64, and site 1 (`peer_public`) as its peer,
    /// with `peer_args` added to the peer (`endpoint …`, `preshared-key FILE`, …).
    pub fn configure_as_site_2(
        &self,
        ns: &NetNs,
        private: &str,
        peer_public: &str,
        peer_args: &[&str],
    ) {
        let ib = &self.ifname;
        let key = write_private(self._dir.path(), "site.key", private);
        let key = key.to_string_lossy();
        let mut argv = vec!["wg", "set", ib, "private-key", &key, "listen-port", "51820"];
        argv.extend([
            "peer",
            peer_public,
            "allowed-ips",
            "10.77.0.1/32,fd77::1/128",
        ]);
        argv.extend(peer_args);
        ns.run(&argv);
        ns.run(&["ip", "addr", "add", "10.77.0.2/24", "dev", ib]);
        ns.run(&["ip", "-6", "addr", "add", "fd77::2/64", "dev", ib, "nodad"]);
        ns.run(&["ip", "link", "set", ib, "mtu", "1420", "up"]);
    }
}

// Not every test binary that includes this module uses it.
#[allow(unused_imports)]
pub use tunneld_testnet::require_tool;

/// Both checks every privileged end-to-end test needs: network namespaces and `wg`.
pub fn require_netns_and_wg(test: &str) -> bool {
    tunneld_testnet::require_netns(test) && require_tool(test, "wg")
}

impl Drop for WireguardGo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_file(socket_path(&self.ifname));
        if std::thread::panicking() {
            eprintln!(
                "--- wireguard-go log ---\n{}",
                fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

/// Two namespaces joined by a veth underlay 192.0.2.1/24 <-> 192.0.2.2/24.
pub fn two_sites() -> (NetNs, NetNs) {
    let a = NetNs::new();
    let b = NetNs::new();
    tunneld_testnet::veth(&a, "192.0.2.1/24", &b, "192.0.2.2/24");
    (a, b)
}

/// Two sites joined by tunneld, each the other's only peer, up and answering `wg`. Fields
/// drop in order: the gateways first, then the namespaces.
pub struct Sites {
    pub ga: Gateway,
    pub gb: Gateway,
    /// Site A's private key and config body, to restart it.
    pub ka: String,
    pub body_a: String,
    pub a: NetNs,
    pub b: NetNs,
}

/// [`two_sites`] with a tunneld in each; `extra_b` is appended to site B's config.
pub fn tunneld_sites(extra_b: &str) -> Sites {
    let (a, b) = two_sites();
    let (ka, kb) = (genkey(), genkey());
    let (ia, ib) = (
        tunneld_testnet::unique_name("wg"),
        tunneld_testnet::unique_name("wg"),
    );
    let body_a = site_body(1, &pubkey(&kb), "192.0.2.2:51820");
    let body_b = format!("{}{extra_b}", site_body(2, &pubkey(&ka), "192.0.2.1:51820"));
    let ga = Gateway::start(&a, &ia, &ka, &body_a);
    let gb = Gateway::start(&b, &ib, &kb, &body_b);
    Sites {
        ga,
        gb,
        ka,
        body_a,
        a,
        b,
    }
}

impl Sites {
    /// Starts site A's tunneld again (after it was stopped) with the same key and config.
    pub fn restart_a(&self) -> Gateway {
        Gateway::start(&self.a, &self.ga.ifname, &self.ka, &self.body_a)
    }
}

/// The body of a site's config (after name and key) with one peer.
pub fn site_body(me: u8, peer_public: &str, peer_underlay: &str) -> String {
    let other = 3 - me;
    format!(
        "listen_port = 51820\naddress = [\"10.77.0.{me}/24\", \"fd77::{me}/64\"]\nmtu = 1420\n\n\
         [[peer]]\npublic_key = \"{peer_public}\"\nendpoint = \"{peer_underlay}\"\n\
         allowed_ips = [\"10.77.0.{other}/32\", \"fd77::{other}/128\"]\n"
    )
}

pub fn ping(ns: &NetNs, addr: &str) {
    step(&format!("ping {addr} from {}", ns.name()));
    let out = ns.output(&["ping", "-c", "3", "-i", "0.2", "-W", "3", addr]);
    assert!(
        out.status.success(),
        "ping {addr} from {} failed:\n{}",
        ns.name(),
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Sends `len` bytes over TCP from `from` to `to_addr` (listening inside `to`) and checks
/// that exactly those bytes arrive.
pub fn tcp_transfer(from: &NetNs, to: &NetNs, to_addr: SocketAddr, len: usize) {
    step(&format!(
        "TCP: {len} bytes from {} to {to_addr} in {}",
        from.name(),
        to.name()
    ));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let receiver = to.spawn_in_ns(move || {
        let listener = TcpListener::bind(to_addr).and_then(|l| {
            l.set_nonblocking(true)?;
            Ok(l)
        });
        let _ = ready_tx.send(listener.as_ref().map(|_| ()).map_err(|e| e.to_string()));
        let listener = listener.ok()?;
        // Bounded: a sender that never connects ends the wait instead of hanging the test.
        let deadline = Instant::now() + WAIT;
        let mut stream = loop {
            match listener.accept() {
                Ok((stream, _)) => break stream,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        return None;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(_) => return None,
            }
        };
        stream.set_nonblocking(false).ok()?;
        stream.set_read_timeout(Some(WAIT)).ok()?;
        let mut got = Vec::with_capacity(len);
        stream.read_to_end(&mut got).ok()?;
        Some(got)
    });
    match ready_rx.recv_timeout(WAIT) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("cannot listen on {to_addr} inside {}: {e}", to.name()),
        Err(_) => panic!("the listener on {to_addr} did not start"),
    }
    let data = pattern(len, len as u32);
    let sent = data.clone();
    from.in_ns(move || {
        let mut stream = TcpStream::connect_timeout(&to_addr, WAIT).expect("connect across");
        stream.set_write_timeout(Some(WAIT)).unwrap();
        stream.write_all(&sent).unwrap();
        stream.shutdown(std::net::Shutdown::Write).unwrap();
    });
    let got = receiver
        .join()
        .unwrap()
        .unwrap_or_else(|| panic!("receiving over {to_addr} failed"));
    assert_eq!(got.len(), data.len(), "bytes received over {to_addr}");
    assert!(
        got == data,
        "received bytes differ from those sent over {to_addr}"
    );
}

/// `wg show <if> dump` lines: the interface line (4 fields), then one line per peer (8 fields).
pub fn wg_dump(ns: &NetNs, ifname: &str) -> Vec<Vec<String>> {
    let out = ns.run(&["wg", "show", ifname, "dump"]);
    out.lines()
        .map(|l| l.split('\t').map(str::to_string).collect())
        .collect()
}

/// The latest-handshake time (UNIX seconds) `wg` reports for `peer`.
pub fn latest_handshake(ns: &NetNs, ifname: &str, peer: &str) -> u64 {
    wg_dump(ns, ifname)
        .iter()
        .skip(1)
        .find(|f| f[0] == peer)
        .map(|f| f[4].parse().unwrap())
        .unwrap_or(0)
}

/// The one line of `stderr` that says why tunneld stopped (`tunneld: …` or an `ERROR` log
/// line); fails unless there is exactly one.
pub fn the_one_error_line(stderr: &str) -> &str {
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("tunneld:") || l.contains("ERROR"))
        .collect();
    assert_eq!(errors.len(), 1, "one line with the reason:\n{stderr}");
    errors[0]
}

/// dnsmasq in a namespace, answering only from a hosts file, on one address's port 53;
/// stopped when dropped. Its hosts file is read again on [`Dnsmasq::set_hosts`].
pub struct Dnsmasq {
    child: Child,
    hosts: PathBuf,
    _dir: tempfile::TempDir,
}

impl Dnsmasq {
    /// Starts it on `listen`:53 with `hosts` (lines of `address name`) and `extra` options,
    /// and waits until it listens.
    pub fn start(ns: &NetNs, listen: &str, hosts: &str, extra: &[&str]) -> Dnsmasq {
        let dir = tempfile::tempdir().unwrap();
        let hosts_file = dir.path().join("hosts");
        fs::write(&hosts_file, hosts).unwrap();
        let child = ns
            .command("dnsmasq")
            .args([
                "--keep-in-foreground",
                "--no-resolv",
                "--no-hosts",
                "--bind-interfaces",
                "--log-facility=-",
            ])
            .arg(format!("--listen-address={listen}"))
            .args(extra)
            .arg(format!("--addn-hosts={}", hosts_file.display()))
            .arg(format!("--pid-file={}", dir.path().join("pid").display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("dnsmasq (cargo xtask deps installs dnsmasq-base)");
        let server = Dnsmasq {
            child,
            hosts: hosts_file,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ns.run(&["ss", "-lun"]).contains(&format!("{listen}:53")) {
            assert!(Instant::now() < deadline, "dnsmasq did not start listening");
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// Replaces the hosts file's lines; dnsmasq reads them again on SIGHUP.
    pub fn set_hosts(&self, hosts: &str) {
        fs::write(&self.hosts, hosts).unwrap();
        let hup = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(hup.success());
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        tunneld_testnet::stop_process(&mut self.child);
    }
}

/// Prometheus's own checker (`promtool check metrics`, its lint included) passes `metrics`,
/// a scrape's body.
pub fn promtool_checks(metrics: &str) {
    use std::io::Write;
    let mut promtool = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(metrics.as_bytes())
        .unwrap();
    let checked = promtool.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&checked.stdout).into_owned()
        + &String::from_utf8_lossy(&checked.stderr);
    assert!(
        checked.status.success() && said.trim().is_empty(),
        "promtool check metrics: {}\n{said}",
        checked.status
    );
}
