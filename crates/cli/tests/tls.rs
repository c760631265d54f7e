//! TLS forwarding end to end: two tunnelds in network namespaces the test creates, site A's
//! `[[tls.forward]]` (plaintext in on 127.0.0.1) to site B's `[[tls.listen]]` on the veth
//! underlay, forwarding to a service on B's loopback. Certificates come from the `openssl` CLI
//! into a temporary directory. Privileged: skipped without root unless
//! TUNNELD_REQUIRE_ALL=1.

mod common;

use common::*;
use std::fs;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tunneld_testnet::NetNs;

const SERVER_NAME: &str = "site-b.test";

fn require(test: &str) -> bool {
    require_netns_and_wg(test) && require_tool(test, "openssl")
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = output_bounded(Command::new("openssl").current_dir(dir).args(args));
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA named `ca` in `dir`: `<ca>.pem` and `<ca>.key`.
fn make_ca(dir: &Path, ca: &str) {
    openssl(
        dir,
        &[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            &format!("{ca}.key"),
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            &format!("{ca}.key"),
            "-subj",
            &format!("/CN={ca}"),
            "-days",
            "2",
            "-out",
            &format!("{ca}.pem"),
        ],
    );
}

/// A leaf `<name>.pem` / `<name>.key` (mode 0600) for DNS name `dns`, signed by `ca`.
fn make_leaf(dir: &Path, ca: &str, name: &str, dns: &str) {
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
    );
    fs::write(
        dir.join(format!("{name}.ext")),
        format!("subjectAltName=DNS:{dns}\nextendedKeyUsage=serverAuth,clientAuth\n"),
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
            &format!("/CN={dns}"),
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
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
            "-out",
            &format!("{name}.pem"),
        ],
    );
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(
        dir.join(format!("{name}.key")),
        fs::Permissions::from_mode(0o600),
    )
    .unwrap();
}

/// A tunneld running a TLS-only config in a namespace; killed and reaped on drop.
struct TlsGateway {
    child: Option<Child>,
    log: PathBuf,
}

impl TlsGateway {
    /// Starts `tunneld up` on `config` (written into `dir`) and waits until every listener it
    /// names in `ready` accepts.
    fn start(ns: &NetNs, dir: &Path, name: &str, config: &str, ready: &[SocketAddr]) -> TlsGateway {
        step(&format!("start tunneld {name} in {}", ns.name()));
        let path = dir.join(format!("{name}.toml"));
        fs::write(&path, config).unwrap();
        let log = dir.join(format!("{name}.log"));
        let child = spawn_up(ns, &path, &log);
        let mut gw = TlsGateway {
            child: Some(child),
            log,
        };
        let ready = ready.to_vec();
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = gw.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("tunneld exited early ({status}):\n{}", gw.log_text());
            }
            let addrs = ready.clone();
            let up = ns.in_ns(move || {
                addrs
                    .iter()
                    .all(|a| TcpStream::connect_timeout(a, Duration::from_secs(1)).is_ok())
            });
            if up {
                return gw;
            }
            assert!(
                Instant::now() < deadline,
                "tunneld did not listen:\n{}",
                gw.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().unwrap().id().to_string();
        assert!(Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .unwrap()
            .success());
    }

    /// Waits until the log contains `text`.
    fn wait_log(&self, text: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let log = self.log_text();
            if log.contains(text) {
                return log;
            }
            assert!(Instant::now() < deadline, "no {text:?} in the log:\n{log}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for TlsGateway {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            // A panic on a connection's thread leaves the process running: the log tells.
            let log = self.log_text();
            if !std::thread::panicking() && log.contains("panicked at") {
                panic!("tunneld panicked ({}):\n{log}", self.log.display());
            }
            if std::thread::panicking() {
                eprintln!(
                    "--- tunneld log ({}) ---\n{}",
                    self.log.display(),
                    self.log_text()
                );
            }
        }
    }
}

/// An echo service in `ns` on `addr`: every connection gets back what it sends, and a
/// half-close once the client half-closes. Runs until the namespace's test ends (bounded per
/// connection by read timeouts).
fn echo_service(ns: &NetNs, addr: SocketAddr) {
    let (tx, rx) = std::sync::mpsc::channel();
    drop(ns.spawn_in_ns(move || {
        let listener = TcpListener::bind(addr).unwrap();
        tx.send(()).unwrap();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { break };
            std::thread::spawn(move || {
                stream.set_read_timeout(Some(WAIT)).unwrap();
                let mut buf = vec![0; 64 * 1024];
                loop {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if stream.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
                let _ = stream.shutdown(Shutdown::Write);
            });
        }
    }));
    rx.recv_timeout(WAIT).expect("echo service started");
}

/// Sends `data` over a connection to `addr` (from inside `ns`), half-closes, and returns what
/// came back until the other side's EOF. Reading and writing run at once, so backpressure in
/// either direction cannot deadlock it.
fn round_trip(addr: SocketAddr, data: Vec<u8>) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect_timeout(&addr, WAIT)?;
    stream.set_read_timeout(Some(WAIT))?;
    stream.set_write_timeout(Some(WAIT))?;
    let mut writer = stream.try_clone()?;
    let sender = std::thread::spawn(move || -> std::io::Result<()> {
        writer.write_all(&data)?;
        writer.shutdown(Shutdown::Write)
    });
    let mut got = Vec::new();
    let read = stream.read_to_end(&mut got);
    sender.join().unwrap()?;
    read?;
    Ok(got)
}

/// A request through site A's forward gets nothing back (the connection is refused or closed).
fn assert_nothing_passes(a: &NetNs) {
    let got = a.in_ns(|| round_trip(A_PLAIN.parse().unwrap(), b"hello".to_vec()));
    assert!(got.map_or(true, |g| g.is_empty()), "data passed");
}

/// Every thread's effective, permitted and bounding capability sets, and no_new_privs.
fn thread_privileges(pid: u32) -> Vec<(u64, u64, u64, u64)> {
    let mut out = Vec::new();
    for task in fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let status = fs::read_to_string(task.unwrap().path().join("status")).unwrap();
        let field = |name: &str| -> u64 {
            let line = status.lines().find(|l| l.starts_with(name)).unwrap();
            let value = line[name.len()..].trim();
            u64::from_str_radix(value, 16).unwrap_or_else(|_| value.parse().unwrap())
        };
        out.push((
            field("CapEff:"),
            field("CapPrm:"),
            field("CapBnd:"),
            field("NoNewPrivs:"),
        ));
    }
    out
}

struct Setup {
    dir: tempfile::TempDir,
    a: NetNs,
    b: NetNs,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    make_ca(dir.path(), "ca");
    make_leaf(dir.path(), "ca", "server", SERVER_NAME);
    let (a, b) = two_sites();
    echo_service(&b, "127.0.0.1:7000".parse().unwrap());
    Setup { dir, a, b }
}

const A_PLAIN: &str = "127.0.0.1:15201";
/// Where site A serves `[metrics]`, when a test asks for it.
const A_METRICS: &str = "127.0.0.1:9586";

/// `GET /metrics` from site A; the body.
fn scrape(a: &NetNs) -> String {
    a.in_ns(|| {
        let mut c = TcpStream::connect_timeout(&A_METRICS.parse().unwrap(), WAIT).unwrap();
        c.set_read_timeout(Some(WAIT)).unwrap();
        c.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut reply = String::new();
        c.read_to_string(&mut reply).unwrap();
        assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
        reply
    })
}

/// The value of the sample of exactly `series` (name and labels).
fn sample(text: &str, series: &str) -> u64 {
    let line = text
        .lines()
        .find(|l| l.rsplit_once(' ').is_some_and(|(s, _)| s == series))
        .unwrap_or_else(|| panic!("no {series} in\n{text}"));
    line.rsplit_once(' ').unwrap().1.parse().unwrap()
}
const B_TLS: &str = "192.0.2.2:8443";

fn forward_config(extra: &str) -> String {
    format!(
        "[[tls.forward]]\nlisten = \"{A_PLAIN}\"\nconnect = \"{B_TLS}\"\nserver_name = \"{SERVER_NAME}\"\nca_file = \"ca.pem\"\n{extra}"
    )
}

fn listen_config(extra: &str) -> String {
    format!(
        "[[tls.listen]]\nlisten = \"{B_TLS}\"\ncert_file = \"server.pem\"\nkey_file = \"server.key\"\nforward_to = \"127.0.0.1:7000\"\n{extra}"
    )
}

fn start_pair(s: &Setup, forward_extra: &str, listen_extra: &str) -> (TlsGateway, TlsGateway) {
    let gb = TlsGateway::start(
        &s.b,
        s.dir.path(),
        "site-b",
        &listen_config(listen_extra),
        &[B_TLS.parse().unwrap()],
    );
    let ga = TlsGateway::start(
        &s.a,
        s.dir.path(),
        "site-a",
        &forward_config(forward_extra),
        &[A_PLAIN.parse().unwrap()],
    );
    (ga, gb)
}

#[test]
fn many_parallel_connections_carry_their_bytes_intact_both_ways() {
    if !require("many_parallel_connections_carry_their_bytes_intact_both_ways") {
        return;
    }
    let s = setup();
    let (ga, gb) = start_pair(&s, &format!("[metrics]\nlisten = \"{A_METRICS}\"\n"), "");
    step("64 connections at once, sizes from 0 to 3 MiB, echoed back through the TLS pair");
    let results = s.a.in_ns(|| {
        let workers: Vec<_> = (0..64u32)
            .map(|i| {
                std::thread::spawn(move || {
                    let len = match i {
                        0 => 0,
                        1 => 1,
                        _ => (i as usize * 49_157) % (3 << 20),
                    };
                    let data = pattern(len, i);
                    let got = round_trip(A_PLAIN.parse().unwrap(), data.clone());
                    (i, len, got.map(|g| g == data))
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap())
            .collect::<Vec<_>>()
    });
    let sent: u64 = results.iter().map(|(_, len, _)| *len as u64).sum();
    for (i, len, ok) in results {
        match ok {
            Ok(true) => {}
            Ok(false) => panic!(
                "connection {i}: the {len} bytes came back different\n{}\n{}",
                ga.log_text(),
                gb.log_text()
            ),
            Err(e) => panic!(
                "connection {i} ({len} bytes): {e}\n{}\n{}",
                ga.log_text(),
                gb.log_text()
            ),
        }
    }
    assert!(
        ga.log_text()
            .contains("accepting plaintext on 127.0.0.1:15201"),
        "{}",
        ga.log_text()
    );
    step(
        "after bulk both ways (receive low-water marks raised), a 4-byte request still comes back",
    );
    // The relays raise SO_RCVLOWAT on sockets that read in bulk; what is left below the mark
    // raises no event and must be read by the workers' fallback, not wait for more data.
    let bulk_bytes = s.a.in_ns(|| {
        let mut c = TcpStream::connect_timeout(&A_PLAIN.parse().unwrap(), WAIT).unwrap();
        c.set_read_timeout(Some(WAIT)).unwrap();
        c.set_write_timeout(Some(WAIT)).unwrap();
        let mut moved = 0u64;
        for round in 0..3u32 {
            let data = pattern(16 << 20, round);
            let mut writer = c.try_clone().unwrap();
            let sent = data.clone();
            let sender = std::thread::spawn(move || writer.write_all(&sent));
            let mut got = vec![0; data.len()];
            c.read_exact(&mut got).unwrap();
            sender.join().unwrap().unwrap();
            assert!(got == data, "round {round}: the bulk came back different");
            for _ in 0..3 {
                c.write_all(b"ping").unwrap();
                let mut buf = [0; 4];
                c.read_exact(&mut buf).unwrap();
                assert_eq!(&buf, b"ping");
            }
            moved += data.len() as u64 + 12;
        }
        moved
    });
    let sent = sent + bulk_bytes;
    step("site A's /metrics counts the 64 connections and every byte each way");
    let text = scrape(&s.a);
    let listener = "listener=\"tls.forward[0]\"";
    // 64, the connection that showed the gateway was listening, and the bulk one.
    assert_eq!(
        sample(
            &text,
            &format!("tunneld_tls_connections_total{{{listener}}}")
        ),
        66
    );
    assert_eq!(
        sample(
            &text,
            &format!("tunneld_tls_failed_connections_total{{{listener}}}")
        ),
        0
    );
    for direction in ["to_tls", "from_tls"] {
        let series = format!("tunneld_tls_bytes_total{{{listener},direction=\"{direction}\"}}");
        assert_eq!(sample(&text, &series), sent, "{text}");
    }
    step("with only TLS to serve, no thread keeps any capability, relay workers included");
    let live = s.a.in_ns(|| {
        let mut c = TcpStream::connect_timeout(&A_PLAIN.parse().unwrap(), WAIT).unwrap();
        c.set_read_timeout(Some(WAIT)).unwrap();
        c.write_all(b"ping").unwrap();
        let mut buf = [0; 4];
        c.read_exact(&mut buf).unwrap();
        c
    });
    for gw in [&ga, &gb] {
        let threads = thread_privileges(gw.pid());
        // Main, a listener and a relay worker at least.
        assert!(threads.len() >= 3, "{threads:?}");
        assert!(
            threads.iter().all(|t| *t == (0, 0, 0, 1)),
            "capabilities left: {threads:?}"
        );
    }
    drop(live);
    step("32 live connections are carried by the relay workers, not by a thread each");
    let live: Vec<TcpStream> = s.a.in_ns(|| {
        (0..32)
            .map(|_| {
                let mut c = TcpStream::connect_timeout(&A_PLAIN.parse().unwrap(), WAIT).unwrap();
                c.set_read_timeout(Some(WAIT)).unwrap();
                c.write_all(b"ping").unwrap();
                let mut buf = [0; 4];
                c.read_exact(&mut buf).unwrap();
                c
            })
            .collect()
    });
    for gw in [&ga, &gb] {
        // The set-up threads end once they have handed their connection over.
        let deadline = Instant::now() + WAIT;
        let threads = loop {
            let n = fs::read_dir(format!("/proc/{}/task", gw.pid()))
                .unwrap()
                .count();
            if n < live.len() || Instant::now() > deadline {
                break n;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(
            threads < live.len(),
            "{threads} threads for {} connections",
            live.len()
        );
    }
    drop(live);
    let log = gb.log_text();
    assert!(!log.contains("WARN"), "warnings on the server side:\n{log}");
}

#[test]
fn mtls_refuses_a_client_without_a_certificate_and_admits_one_with() {
    if !require("mtls_refuses_a_client_without_a_certificate_and_admits_one_with") {
        return;
    }
    let s = setup();
    make_leaf(s.dir.path(), "ca", "client", "site-a.test");
    let (ga, gb) = start_pair(&s, "", "client_ca_file = \"ca.pem\"\n");
    step("a client without a certificate gets nothing through");
    assert_nothing_passes(&s.a);
    let log = gb.wait_log("TLS handshake failed");
    assert!(
        log.contains("no certificate")
            || log.contains("NoCertificate")
            || log.contains("certificate"),
        "{log}"
    );
    drop(ga);
    step("the same client with a certificate from the CA");
    let ga = TlsGateway::start(
        &s.a,
        s.dir.path(),
        "site-a-mtls",
        &forward_config("cert_file = \"client.pem\"\nkey_file = \"client.key\"\n"),
        &[A_PLAIN.parse().unwrap()],
    );
    let data = pattern(100_000, 7);
    let sent = data.clone();
    let got =
        s.a.in_ns(move || round_trip(A_PLAIN.parse().unwrap(), sent))
            .unwrap();
    assert!(got == data, "echo through mTLS differs\n{}", ga.log_text());
}

#[test]
fn a_wrong_ca_or_name_or_a_refused_target_fail_with_a_clear_error() {
    if !require("a_wrong_ca_or_name_or_a_refused_target_fail_with_a_clear_error") {
        return;
    }
    let s = setup();
    make_ca(s.dir.path(), "other-ca");
    let gb = TlsGateway::start(
        &s.b,
        s.dir.path(),
        "site-b",
        &listen_config(""),
        &[B_TLS.parse().unwrap()],
    );

    step("a client trusting another CA");
    let ga = TlsGateway::start(
        &s.a,
        s.dir.path(),
        "site-a-wrong-ca",
        &forward_config("").replace("ca_file = \"ca.pem\"", "ca_file = \"other-ca.pem\""),
        &[A_PLAIN.parse().unwrap()],
    );
    assert_nothing_passes(&s.a);
    let log = ga.wait_log("TLS handshake with 192.0.2.2:8443 (site-b.test) failed");
    assert!(log.contains("UnknownIssuer"), "{log}");
    drop(ga);

    step("a client expecting another name");
    let ga = TlsGateway::start(
        &s.a,
        s.dir.path(),
        "site-a-wrong-name",
        &forward_config("").replace(SERVER_NAME, "elsewhere.test"),
        &[A_PLAIN.parse().unwrap()],
    );
    assert_nothing_passes(&s.a);
    let log = ga.wait_log("failed");
    assert!(log.contains("not valid for name"), "{log}");
    drop(ga);
    drop(gb);

    step("a server whose target refuses");
    let gb = TlsGateway::start(
        &s.b,
        s.dir.path(),
        "site-b-refused",
        &listen_config("").replace("127.0.0.1:7000", "127.0.0.1:7999"),
        &[B_TLS.parse().unwrap()],
    );
    let ga = TlsGateway::start(
        &s.a,
        s.dir.path(),
        "site-a",
        &forward_config(""),
        &[A_PLAIN.parse().unwrap()],
    );
    assert_nothing_passes(&s.a);
    let log = gb.wait_log("cannot connect to 127.0.0.1:7999");
    assert!(log.contains("refused"), "{log}");
    drop(ga);
}

#[test]
fn sighup_reloads_certificates_without_dropping_live_connections() {
    if !require("sighup_reloads_certificates_without_dropping_live_connections") {
        return;
    }
    let s = setup();
    let (ga, gb) = start_pair(&s, "", "");
    step("a live connection, then a new server certificate from a new CA and SIGHUP");
    let live = s.a.in_ns(|| {
        let mut c = TcpStream::connect_timeout(&A_PLAIN.parse().unwrap(), WAIT).unwrap();
        c.set_read_timeout(Some(WAIT)).unwrap();
        c.write_all(b"before").unwrap();
        let mut buf = [0; 6];
        c.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"before");
        c
    });
    // A broken reload keeps the old certificates.
    fs::write(s.dir.path().join("server.pem"), "not a certificate").unwrap();
    gb.signal("HUP");
    gb.wait_log("TLS reload failed");
    let ok =
        s.a.in_ns(|| round_trip(A_PLAIN.parse().unwrap(), b"still".to_vec()).unwrap());
    assert_eq!(ok, b"still", "after a failed reload");
    make_ca(s.dir.path(), "ca2");
    make_leaf(s.dir.path(), "ca2", "server", SERVER_NAME);
    gb.signal("HUP");
    gb.wait_log("TLS certificates and keys reloaded");
    step("new connections get the new certificate (which site A does not trust)");
    assert_nothing_passes(&s.a);
    ga.wait_log("UnknownIssuer");
    step("the live connection still works");
    let mut live = live;
    live.write_all(b"after!").unwrap();
    let mut buf = [0; 6];
    live.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"after!");
    live.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    live.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
}

/// Drops every UDP datagram on the underlay (192.0.2.0/24) inside `ns`, both ways.
fn block_udp(ns: &NetNs) {
    let table = "table inet tunneld_test_block {\n\
        chain out { type filter hook output priority 0; ip daddr 192.0.2.0/24 meta l4proto udp drop; }\n\
        chain inp { type filter hook input priority 0; ip saddr 192.0.2.0/24 meta l4proto udp drop; }\n\
    }\n";
    let mut child = ns
        .command("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(table.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "nft in {}", ns.name());
}

#[test]
fn a_wireguard_peer_over_tls_works_where_udp_is_dropped() {
    if !require("a_wireguard_peer_over_tls_works_where_udp_is_dropped")
        || !require_tool(
            "a_wireguard_peer_over_tls_works_where_udp_is_dropped",
            "nft",
        )
    {
        return;
    }
    let s = setup();
    let certs = s.dir.path().display().to_string();
    block_udp(&s.a);
    block_udp(&s.b);
    step("UDP between the sites is really dropped");
    let probe = s.b.spawn_in_ns(|| {
        let sock = std::net::UdpSocket::bind("192.0.2.2:9999").unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut buf = [0; 16];
        sock.recv(&mut buf).is_ok()
    });
    std::thread::sleep(Duration::from_millis(100));
    s.a.in_ns(|| {
        let sock = std::net::UdpSocket::bind("192.0.2.1:0").unwrap();
        let _ = sock.send_to(b"probe", "192.0.2.2:9999");
    });
    assert!(
        !probe.join().unwrap(),
        "a UDP datagram crossed the blocked underlay"
    );

    let (ka, kb) = (genkey(), genkey());
    let (ia, ib) = (
        tunneld_testnet::unique_name("wg"),
        tunneld_testnet::unique_name("wg"),
    );
    let body_b = format!(
        "listen_port = 51820\naddress = [\"10.77.0.2/24\", \"fd77::2/64\"]\n\n\
         [[peer]]\npublic_key = \"{}\"\nallowed_ips = [\"10.77.0.1/32\", \"fd77::1/128\"]\n\n\
         [[tls.listen]]\nlisten = \"{B_TLS}\"\ncert_file = \"{certs}/server.pem\"\n\
         key_file = \"{certs}/server.key\"\nforward_to = \"wireguard\"\n",
        pubkey(&ka)
    );
    let body_a = format!(
        "listen_port = 51820\naddress = [\"10.77.0.1/24\", \"fd77::1/64\"]\n\n\
         [[peer]]\npublic_key = \"{}\"\nallowed_ips = [\"10.77.0.2/32\", \"fd77::2/128\"]\n\
         transport = \"tls\"\nendpoint = \"{B_TLS}\"\ntls_server_name = \"{SERVER_NAME}\"\n\
         tls_ca_file = \"{certs}/ca.pem\"\n",
        pubkey(&kb)
    );
    let gb = Gateway::start(&s.b, &ib, &kb, &body_b);
    let ga = Gateway::start(&s.a, &ia, &ka, &body_a);
    ping(&s.a, "10.77.0.2");
    ping(&s.b, "fd77::1");
    tcp_transfer(&s.a, &s.b, "10.77.0.2:5010".parse().unwrap(), 8 << 20);
    tcp_transfer(&s.b, &s.a, "[fd77::1]:5011".parse().unwrap(), 8 << 20);
    assert!(
        ga.log_text().contains("WireGuard over TLS connected"),
        "{}",
        ga.log_text()
    );
    assert!(
        gb.log_text()
            .contains("WireGuard over TLS: stream accepted"),
        "{}",
        gb.log_text()
    );
    step("every thread, the TLS ones included, keeps only CAP_NET_ADMIN");
    const NET_ADMIN: u64 = 1 << 12;
    for pid in [ga.pid(), gb.pid()] {
        let threads = thread_privileges(pid);
        assert!(
            threads
                .iter()
                .all(|t| *t == (NET_ADMIN, NET_ADMIN, NET_ADMIN, 1)),
            "{threads:?}"
        );
    }

    step("site B restarts: site A's transport reconnects and the tunnel comes back");
    drop(gb);
    let restarted = Instant::now();
    let gb = Gateway::start(&s.b, &ib, &kb, &body_b);
    // Site A notices the cut, reconnects after its first backoff step and handshakes at
    // once (the pair harness pins that down in virtual time); here the wait is generous.
    let deadline = restarted + WAIT;
    while !s
        .a
        .output(&["ping", "-c", "1", "-W", "1", "10.77.0.2"])
        .status
        .success()
    {
        assert!(
            Instant::now() < deadline,
            "no ping through the reconnected transport in {WAIT:?}\n{}",
            ga.log_text()
        );
    }
    eprintln!(
        "site B restart to a ping through: {:?}",
        restarted.elapsed()
    );
    ping(&s.a, "10.77.0.2");
    tcp_transfer(&s.b, &s.a, "10.77.0.1:5012".parse().unwrap(), 1 << 20);
    drop(gb);
}

/// Hostile connections to a TLS listener while a transfer runs through it: connections that
/// close at once, random bytes, truncated and malformed TLS records. The transfer completes
/// intact, the server keeps serving, and its log stays short (failures are logged a few at
/// a time, then by powers of two).
#[test]
fn hostile_connections_to_the_listener_do_not_disturb_a_transfer() {
    if !require("hostile_connections_to_the_listener_do_not_disturb_a_transfer") {
        return;
    }
    let s = setup();
    let (ga, gb) = start_pair(&s, "", "");
    step("16 MiB echoed through the pair while 600 hostile connections hit site B");
    let data = pattern(16 << 20, 99);
    let sent = data.clone();
    let transfer =
        s.a.spawn_in_ns(move || round_trip(A_PLAIN.parse().unwrap(), sent));
    let attempts = s.a.in_ns(|| {
        let target: SocketAddr = B_TLS.parse().unwrap();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut made = 0;
        for i in 0..600u32 {
            let Ok(mut c) = TcpStream::connect_timeout(&target, Duration::from_secs(2)) else {
                continue;
            };
            made += 1;
            let _ = c.set_write_timeout(Some(Duration::from_secs(1)));
            let mut junk = vec![0u8; 300];
            for b in junk.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            let bytes: Vec<u8> = match i % 4 {
                0 => Vec::new(),
                1 => junk,
                // A handshake record that announces more than it sends.
                2 => [
                    &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc][..],
                    &junk[..40],
                ]
                .concat(),
                // A record longer than TLS allows.
                _ => [&[0x17, 0x03, 0x03, 0xff, 0xff][..], &junk[..]].concat(),
            };
            let _ = c.write_all(&bytes);
        }
        made
    });
    let got = transfer
        .join()
        .unwrap()
        .expect("the transfer through the pair");
    assert!(got == data, "the transfer came back different");
    assert!(
        attempts > 500,
        "only {attempts} hostile connections were made"
    );
    // Still serving.
    let after =
        s.a.in_ns(|| round_trip(A_PLAIN.parse().unwrap(), b"after".to_vec()).unwrap());
    assert_eq!(after, b"after");
    let log = gb.wait_log("failed so far");
    let warnings = log.lines().filter(|l| l.contains("WARN")).count();
    assert!(
        warnings <= 30,
        "{warnings} warnings for 600 bad connections:\n{log}"
    );
    drop(ga);
}

/// A peer with `transport = "auto"` runs over UDP while UDP works; when UDP between the
/// sites starts being dropped, it moves to TLS on its own and traffic passes again.
#[test]
fn an_auto_peer_falls_back_to_tls_when_udp_stops_working() {
    let test = "an_auto_peer_falls_back_to_tls_when_udp_stops_working";
    if !require(test) || !require_tool(test, "nft") {
        return;
    }
    let s = setup();
    let certs = s.dir.path().display().to_string();
    let (ka, kb) = (genkey(), genkey());
    let (ia, ib) = (
        tunneld_testnet::unique_name("wg"),
        tunneld_testnet::unique_name("wg"),
    );
    let body_b = format!(
        "listen_port = 51820\naddress = [\"10.77.0.2/24\"]\n\n\
         [[peer]]\npublic_key = \"{}\"\nallowed_ips = [\"10.77.0.1/32\"]\n\n\
         [[tls.listen]]\nlisten = \"{B_TLS}\"\ncert_file = \"{certs}/server.pem\"\n\
         key_file = \"{certs}/server.key\"\nforward_to = \"wireguard\"\n",
        pubkey(&ka)
    );
    let body_a = format!(
        "listen_port = 51820\naddress = [\"10.77.0.1/24\"]\n\n\
         [[peer]]\npublic_key = \"{}\"\nallowed_ips = [\"10.77.0.2/32\"]\n\
         transport = \"auto\"\nendpoint = \"192.0.2.2:51820\"\ntls_endpoint = \"{B_TLS}\"\n\
         tls_server_name = \"{SERVER_NAME}\"\ntls_ca_file = \"{certs}/ca.pem\"\n",
        pubkey(&kb)
    );
    let _gb = Gateway::start(&s.b, &ib, &kb, &body_b);
    let ga = Gateway::start(&s.a, &ia, &ka, &body_a);
    step("over UDP while UDP works");
    ping(&s.a, "10.77.0.2");
    tcp_transfer(&s.a, &s.b, "10.77.0.2:5020".parse().unwrap(), 1 << 20);
    assert!(!ga.log_text().contains("falling back"), "{}", ga.log_text());

    step("UDP dropped: pings stop, then pass again over TLS");
    block_udp(&s.a);
    block_udp(&s.b);
    let blocked = Instant::now();
    let deadline = blocked + Duration::from_secs(45);
    while !s
        .a
        .output(&["ping", "-c", "1", "-W", "1", "10.77.0.2"])
        .status
        .success()
        || !ga.log_text().contains("falling back")
    {
        assert!(
            Instant::now() < deadline,
            "no ping over the TLS fallback 45 s after UDP was blocked\n{}",
            ga.log_text()
        );
    }
    eprintln!("UDP blocked to a ping over TLS: {:?}", blocked.elapsed());
    assert!(
        ga.log_text().contains("WireGuard over TLS connected"),
        "{}",
        ga.log_text()
    );
    tcp_transfer(&s.b, &s.a, "10.77.0.1:5021".parse().unwrap(), 4 << 20);

    step("the move is what `wg show` and reloads see: removed by hand, a reload brings the peer back on TLS");
    let peer_line = |dump: Vec<Vec<String>>| dump.into_iter().find(|l| l[0] == pubkey(&kb));
    let bridge = peer_line(wg_dump(&s.a, &ia)).unwrap()[2].clone();
    assert!(
        bridge.starts_with("127.0.0.1:"),
        "the endpoint shown is {bridge}"
    );
    s.a.run(&["wg", "set", &ia, "peer", &pubkey(&kb), "remove"]);
    assert!(peer_line(wg_dump(&s.a, &ia)).is_none());
    let reloads = || ga.log_text().matches("WireGuard settings reloaded").count();
    let before = reloads();
    Command::new("kill")
        .args(["-HUP", &ga.pid().to_string()])
        .status()
        .unwrap();
    wait_until("the reload", || reloads() > before);
    let back = peer_line(wg_dump(&s.a, &ia)).expect("the reload added the peer again");
    assert_eq!(
        back[2], bridge,
        "the reload put the peer back on blocked UDP"
    );
    ping(&s.a, "10.77.0.2");
}

/// A datagram that follows the client's handshake at once (rustls sends it right behind its
/// Finished, so the server reads both together while it completes the handshake) reaches the
/// WireGuard interface then, not when more bytes come down the stream.
#[test]
fn a_datagram_sent_with_the_handshake_is_delivered_at_once() {
    if !require("a_datagram_sent_with_the_handshake_is_delivered_at_once") {
        return;
    }
    let s = setup();
    let certs = s.dir.path().display().to_string();
    let ib = tunneld_testnet::unique_name("wg");
    let body_b = format!(
        "listen_port = 51820\naddress = [\"10.77.0.2/24\"]\n\n\
         [[tls.listen]]\nlisten = \"{B_TLS}\"\ncert_file = \"{certs}/server.pem\"\n\
         key_file = \"{certs}/server.key\"\nforward_to = \"wireguard\"\n"
    );
    let gb = Gateway::start(&s.b, &ib, &genkey(), &body_b);
    let ca = s.dir.path().join("ca.pem");
    let client = s.a.in_ns(move || {
        use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(&ca).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = ServerName::try_from(SERVER_NAME).unwrap();
        let mut conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
        // 32 bytes that are no WireGuard message, framed: the interface counts them as a drop.
        let mut frame = vec![0, 32];
        frame.extend_from_slice(&[0xee; 32]);
        conn.writer().write_all(&frame).unwrap();
        let mut tcp = TcpStream::connect(B_TLS).unwrap();
        while conn.is_handshaking() || conn.wants_write() {
            conn.complete_io(&mut tcp).unwrap();
        }
        // Kept open and silent: nothing more comes down the stream.
        (tcp, conn)
    });
    wait_until("the datagram reaches site B's interface", || {
        s.b.run(&[TUNNELD, "show", &ib]).contains("malformed=1")
    });
    drop(client);
    drop(gb);
}

/// A reload cannot give a peer a TLS transport (its bridge is made at start): the peer is
/// left out with a warning, on every reload that still asks for it, and the other peers are
/// applied as usual.
#[test]
fn a_reload_leaves_a_new_tls_transport_peer_for_a_restart() {
    if !require("a_reload_leaves_a_new_tls_transport_peer_for_a_restart") {
        return;
    }
    let s = setup();
    let certs = s.dir.path().display().to_string();
    let ia = tunneld_testnet::unique_name("wg");
    let (udp_peer, tls_peer) = (pubkey(&genkey()), pubkey(&genkey()));
    let udp_section = |nets: &str| {
        format!(
            "[[peer]]\npublic_key = \"{udp_peer}\"\nendpoint = \"192.0.2.2:51820\"\nallowed_ips = [{nets}]\n"
        )
    };
    let head = "listen_port = 51820\naddress = [\"10.77.0.1/24\"]\n\n";
    let ga = Gateway::start(
        &s.a,
        &ia,
        &genkey(),
        &format!("{head}{}", udp_section("\"10.77.0.2/32\"")),
    );
    // The new TLS peer comes first in the file, before the running one.
    let tls_section = format!(
        "[[peer]]\npublic_key = \"{tls_peer}\"\nallowed_ips = [\"10.88.0.0/16\"]\n\
         transport = \"tls\"\nendpoint = \"{B_TLS}\"\ntls_server_name = \"{SERVER_NAME}\"\n\
         tls_ca_file = \"{certs}/ca.pem\"\n"
    );
    let mut nets = "\"10.77.0.2/32\"".to_string();
    for round in 1..=2 {
        step(&format!("reload {round} asks for the TLS peer"));
        nets.push_str(&format!(", \"10.6{round}.0.0/16\""));
        let body = format!("{head}{tls_section}\n{}", udp_section(&nets));
        let config =
            format!("[interface]\nname = \"{ia}\"\nprivate_key_file = \"private.key\"\n{body}");
        fs::write(ga.dir.path().join("gateway.toml"), config).unwrap();
        let before = ga.log_text().matches("WireGuard settings reloaded").count();
        Command::new("kill")
            .args(["-HUP", &ga.pid().to_string()])
            .status()
            .unwrap();
        wait_until("the reload", || {
            ga.log_text().matches("WireGuard settings reloaded").count() > before
        });
        let warned = ga.log_text().matches("transport is new or changed").count();
        assert_eq!(warned, round, "{}", ga.log_text());
        let dump = wg_dump(&s.a, &ia);
        assert_eq!(dump.len(), 2, "only the UDP peer runs: {dump:?}");
        assert_eq!(dump[1][0], udp_peer);
        assert!(
            dump[1][3].contains(&format!("10.6{round}.0.0/16")),
            "the UDP peer's change is applied: {dump:?}"
        );
        assert_eq!(dump[1][2], "192.0.2.2:51820", "its endpoint is its own");
    }
}

/// An `openssl s_client` or `s_server` in a namespace: lines written to its stdin (text, or
/// its one-letter commands), its output (stdout and stderr) read line by line; killed on
/// drop.
struct OpenSsl {
    child: Child,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl OpenSsl {
    fn start(ns: &NetNs, dir: &Path, args: &[&str]) -> OpenSsl {
        step(&format!("openssl {}", args.join(" ")));
        let mut child = ns
            .command("sh")
            .current_dir(dir)
            .arg("-c")
            // Line-buffered: s_server reports a KeyUpdate with printf.
            .arg(format!("exec stdbuf -oL openssl {} 2>&1", args.join(" ")))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        OpenSsl {
            child,
            stdin,
            lines,
            seen: Vec::new(),
        }
    }

    fn send(&mut self, line: &str) {
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .unwrap();
        self.stdin.flush().unwrap();
    }

    /// Waits for an output line containing `text`.
    fn expect(&mut self, text: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(text);
                    self.seen.push(line);
                    if found {
                        return;
                    }
                }
                Err(_) => panic!(
                    "no {text:?} from openssl; it said:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }
}

impl Drop for OpenSsl {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `openssl s_client` to site B's listener, verifying its certificate, TLS 1.3 only, with
/// `extra` arguments.
fn s_client<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "s_client",
        "-connect",
        B_TLS,
        "-servername",
        SERVER_NAME,
        "-CAfile",
        "ca.pem",
        "-tls1_3",
    ];
    args.extend_from_slice(extra);
    args
}

/// Reads from `stream` until `text` has come.
fn read_until(stream: &mut TcpStream, text: &str) {
    let mut got = Vec::new();
    let mut buf = [0; 4096];
    while !String::from_utf8_lossy(&got).contains(text) {
        match stream.read(&mut buf) {
            Ok(0) => panic!(
                "EOF before {text:?}; got {:?}",
                String::from_utf8_lossy(&got)
            ),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!(
                "reading for {text:?}: {e}; got {:?}",
                String::from_utf8_lossy(&got)
            ),
        }
    }
}

#[test]
fn standard_tls_peers_on_either_side_work_through_key_updates() {
    if !require("standard_tls_peers_on_either_side_work_through_key_updates") {
        return;
    }
    let s = setup();

    step("tunneld's listener, OpenSSL's client: echoes across KeyUpdates both ways");
    let gb = TlsGateway::start(
        &s.b,
        s.dir.path(),
        "site-b",
        &listen_config(""),
        &[B_TLS.parse().unwrap()],
    );
    let mut client = OpenSsl::start(&s.a, s.dir.path(), &s_client(&[]));
    client.expect("Verify return code: 0");
    client.send("hello-1");
    client.expect("hello-1");
    // "K": a KeyUpdate asking for tunneld's in return; "k": one that does not.
    client.send("K");
    client.expect("KEYUPDATE");
    client.send("hello-2");
    client.expect("hello-2");
    client.send("k");
    client.expect("KEYUPDATE");
    client.send("hello-3");
    client.expect("hello-3");
    drop(client);
    step("without `groups`, the listener offers no opt-in group (X448, FFDHE, P-521)");
    let mut client = OpenSsl::start(
        &s.a,
        s.dir.path(),
        &s_client(&["-groups", "X448:ffdhe2048:P-521"]),
    );
    client.expect("alert handshake failure");
    drop(client);
    drop(gb);

    step("a listener with `groups`: what it leaves out is refused, what it lists is used");
    let gb = TlsGateway::start(
        &s.b,
        s.dir.path(),
        "site-b",
        &listen_config("groups = [\"X25519\", \"secp256r1\", \"X448\", \"ffdhe2048\"]"),
        &[B_TLS.parse().unwrap()],
    );
    let mut client = OpenSsl::start(&s.a, s.dir.path(), &s_client(&["-groups", "ffdhe8192"]));
    client.expect("alert handshake failure");
    drop(client);
    // Listed first by the client, ffdhe3072 is not offered: the listener asks for P-256.
    let mut client = OpenSsl::start(
        &s.a,
        s.dir.path(),
        &s_client(&["-groups", "ffdhe3072:P-256"]),
    );
    client.expect("Server Temp Key: ECDH, prime256v1");
    client.expect("Verify return code: 0");
    client.send("hello-groups");
    client.expect("hello-groups");
    drop(client);
    // The opt-in groups it lists.
    for (group, key) in [("X448", "X448"), ("ffdhe2048", "DH, 2048 bits")] {
        let mut client = OpenSsl::start(&s.a, s.dir.path(), &s_client(&["-groups", group]));
        client.expect(&format!("Server Temp Key: {key}"));
        client.expect("Verify return code: 0");
        client.send("hello-opt-in");
        client.expect("hello-opt-in");
        drop(client);
    }
    drop(gb);

    step("tunneld's forward, OpenSSL's server (with session tickets): the same");
    let mut server = OpenSsl::start(
        &s.b,
        s.dir.path(),
        &[
            "s_server",
            "-accept",
            B_TLS,
            "-cert",
            "server.pem",
            "-key",
            "server.key",
            "-tls1_3",
        ],
    );
    server.expect("ACCEPT");
    let ga = TlsGateway::start(
        &s.a,
        s.dir.path(),
        "site-a",
        &forward_config(""),
        &[A_PLAIN.parse().unwrap()],
    );
    let mut plain = s.a.in_ns(|| {
        let c = TcpStream::connect_timeout(&A_PLAIN.parse().unwrap(), WAIT).unwrap();
        c.set_read_timeout(Some(WAIT)).unwrap();
        c
    });
    plain.write_all(b"hello-1\n").unwrap();
    server.expect("hello-1");
    server.send("from-server-1");
    read_until(&mut plain, "from-server-1");
    server.send("K");
    server.expect("SSL_do_handshake -> 1");
    server.send("from-server-2");
    read_until(&mut plain, "from-server-2");
    plain.write_all(b"hello-2\n").unwrap();
    server.expect("hello-2");
    server.send("k");
    server.expect("SSL_do_handshake -> 1");
    server.send("from-server-3");
    read_until(&mut plain, "from-server-3");
    plain.write_all(b"hello-3\n").unwrap();
    server.expect("hello-3");
    let log = ga.log_text();
    assert!(!log.contains("WARN") && !log.contains("ERROR"), "{log}");
}
