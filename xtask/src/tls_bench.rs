//! `cargo xtask bench-tls`: TCP forwarded over TLS, side by side in the namespace testbed
//! (direct over the veth, tunneld's WireGuard tunnel, stunnel4, tunneld's
//! `[[tls.forward]]`/`[[tls.listen]]`), the same traffic and accounting for each, interleaved over rounds (A B C A B C ...), medians
//! reported. Writes target/bench-report/tls-report.md.
//!
//! Per row and round: a fresh pair of namespaces (underlay 192.0.2.1 in A, 192.0.2.2 in B),
//! the two proxies (client side in A, server side in B), an iperf3 server and a TCP echo
//! server (this process, a thread per connection) in B; iperf3 and the echo client in A.
//! TLS is 1.3 with TLS_AES_256_GCM_SHA384 for stunnel; the certificates (a throwaway CA and a
//! server certificate for `tunneld-bench.test`) are made once per run with the openssl CLI.
//!
//! Phases, in this order: iperf3 (one stream, then [`STREAMS`], each with the proxies' CPU),
//! keep-alive echo
//! latency, new-connection latency, then many connections: [`CONCURRENT`] connections each
//! with one request always outstanding, from one client thread (poll(2)), for requests per
//! second, the proxies' CPU per request and the round trips' p50/p99.
//!
//! `--tunneld-baseline PATH` adds, before each tunneld row, the same row for another tunneld
//! build (say, the previous commit's, copied out of target/ so a rebuild does not replace
//! it), so the two alternate within each round.

use crate::bench::{parse_options, shown_args, take_baseline, Options};
use crate::closed_loop::{self, read_echo, request, MESSAGE_BYTES};
use crate::report::{self, cell, median, percentile, Table};
use crate::system;
use crate::testbed::{
    check_congestion_control, cpu_seconds, json_number_after, peak_rss_kib, Guard, Impl, Testbed,
};
use std::fmt::Write as _;
use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tunneld_testnet::{require_netns, unique_name, NetNs};

/// The DNS name in the server certificate, checked by the client side.
const SERVER_NAME: &str = crate::testbed::TLS_NAME;
/// Site B's underlay address (the testbed's veth).
const B_UNDERLAY: &str = "192.0.2.2";
/// Site B's address inside the WireGuard tunnel (the testbed's).
const B_TUNNEL: &str = "10.77.0.2";
/// Plaintext services in B: iperf3 and the echo server.
const IPERF_PORT: u16 = 5201;
const ECHO_PORT: u16 = 5202;
/// Where the client-side proxy in A accepts plaintext for each service.
const PROXY_IPERF: &str = "127.0.0.1:15201";
const PROXY_IPERF_PORT: u16 = 15201;
const PROXY_ECHO: &str = "127.0.0.1:15202";
/// Where the server-side proxy in B accepts TLS for each service.
const TLS_IPERF: &str = "192.0.2.2:8443";
const TLS_ECHO: &str = "192.0.2.2:8444";

/// Keep-alive latency: round trips on one connection (after a few uncounted warm-up ones,
/// the first of which waits for the proxies' TLS handshake).
const KEEPALIVE_ROUND_TRIPS: usize = 2000;
const KEEPALIVE_WARMUP: usize = 20;
/// New-connection latency: connect + one round trip + close, this many times.
const NEW_CONNECTIONS: usize = 300;
/// Many connections: this many at once, each with one request outstanding, until this many
/// round trips in all (bounded by [`PHASE_LIMIT`] too).
const CONCURRENT: usize = 64;
const MANY_ROUND_TRIPS: usize = 100_000;
/// Longest any single latency phase may take before it is abandoned.
const PHASE_LIMIT: Duration = Duration::from_secs(60);
/// Longest a socket operation of the echo client or server may block.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest the proxies may take to listen.
const READY_LIMIT: Duration = Duration::from_secs(10);
/// The parallel streams of the second iperf3 run.
const STREAMS: usize = 4;
/// Longest an iperf3 client may run beyond its `-t` seconds before it is stopped.
const IPERF_GRACE: Duration = Duration::from_secs(20);

/// What carries the traffic from A to B.
enum Route {
    /// iperf3 and the echo client straight to B over the veth.
    Direct,
    /// iperf3 and the echo client to B's tunnel address through tunneld's WireGuard tunnel
    /// (this binary, one worker each side): the "WireGuard" of Direct vs WireGuard vs TLS.
    WireGuard(PathBuf),
    /// The same through tunneld's WireGuard over TLS (`transport = "tls"`), the fallback
    /// for networks that drop UDP.
    WireGuardOverTls(PathBuf),
    /// stunnel (this binary) on both sides.
    Stunnel(PathBuf),
    /// tunneld (this binary) on both sides.
    Tunneld(PathBuf),
}

struct Contender {
    name: String,
    which: Result<Route, String>,
    samples: Vec<Sample>,
    /// The first line of the latest failure, for the table when no round succeeded.
    last_error: Option<String>,
}

#[derive(Clone)]
struct Sample {
    tcp1_gbits: f64,
    /// CPU seconds of both proxies during the iperf3 run (NaN without proxies).
    proxy_cpu: f64,
    /// The same with [`STREAMS`] parallel streams (`iperf3 -P`).
    tcp4_gbits: f64,
    proxy_cpu4: f64,
    keepalive_p50_us: f64,
    keepalive_p99_us: f64,
    new_conn_p50_us: f64,
    /// Many connections: completed round trips per second, and how many completed (fewer
    /// than [`MANY_ROUND_TRIPS`] only if [`PHASE_LIMIT`] passed).
    many_rps: f64,
    many_requests: f64,
    /// CPU seconds of both proxies (or tunnels) during that phase (NaN without).
    many_cpu: f64,
    many_p50_us: f64,
    many_p99_us: f64,
    /// VmHWM of both proxies, summed (NaN without proxies); read last, so it includes the
    /// many-connections phase.
    peak_rss_kib: f64,
}

impl Sample {
    /// Gbit per proxy CPU-second of the one-stream run of `seconds` (`None` without
    /// proxies).
    fn gbit_per_cpu(&self, seconds: u32) -> Option<f64> {
        (self.proxy_cpu > 0.0).then(|| self.tcp1_gbits * f64::from(seconds) / self.proxy_cpu)
    }

    /// The same for the run with [`STREAMS`] streams.
    fn gbit_per_cpu4(&self, seconds: u32) -> Option<f64> {
        (self.proxy_cpu4 > 0.0).then(|| self.tcp4_gbits * f64::from(seconds) / self.proxy_cpu4)
    }
}

pub fn run(args: &[String]) -> Result<(), String> {
    let (baseline, args) = take_baseline(args)?;
    let options = parse_options(&args)?;
    system::install_tools()?;
    if !require_netns("cargo xtask bench-tls") {
        return Err("the benchmark needs root (network namespaces)".into());
    }
    let root = system::repo_root()?;
    // A failed build (say, while someone is half-way through a change) leaves that row out
    // rather than the whole comparison.
    let tunneld = system::build_tunneld().map_err(|e| {
        eprintln!("xtask: {e}");
        "cargo build failed (see above)".to_string()
    });
    let stunnel = system::which("stunnel4")
        .or_else(|| system::which("stunnel"))
        .ok_or_else(|| "not installed (apt-get install stunnel4)".to_string());
    let certs = Certs::generate()?;

    // Each tunneld row, preceded by the same row for the baseline build when one is given,
    // so the two alternate within each round.
    type MakeRoute = fn(PathBuf) -> Route;
    let tunneld_rows: [(&str, MakeRoute); 3] = [
        ("tunneld WireGuard (UDP, 1 worker)", Route::WireGuard),
        (
            "tunneld WireGuard over TLS (1 worker)",
            Route::WireGuardOverTls,
        ),
        ("tunneld TLS forwarding", Route::Tunneld),
    ];
    let mut contenders = vec![contender("direct (veth, no proxy)", Ok(Route::Direct))];
    for (i, (name, route)) in tunneld_rows.into_iter().enumerate() {
        if i == 2 {
            contenders.push(contender(
                "stunnel4 (Debian, OpenSSL)",
                stunnel.clone().map(Route::Stunnel),
            ));
        }
        if let Some(bin) = &baseline {
            contenders.push(contender(
                &format!("{name} (baseline)"),
                Ok(route(bin.clone())),
            ));
        }
        contenders.push(contender(name, tunneld.clone().map(route)));
    }
    if options.quick {
        eprintln!("--quick: one round, 1 s per iperf3 run");
    }
    contenders.retain(|c| options.keeps(&c.name));
    if contenders.is_empty() {
        return Err("--only matched no row".into());
    }
    for c in contenders.iter().filter(|c| c.which.is_err()) {
        eprintln!(
            "{}: skipped ({})",
            c.name,
            c.which.as_ref().err().map(String::as_str).unwrap_or("")
        );
    }

    let total = options.rounds * contenders.iter().filter(|c| c.which.is_ok()).count();
    let mut done = 0;
    for round in 1..=options.rounds {
        for c in contenders.iter_mut() {
            let Ok(which) = &c.which else { continue };
            // Ctrl-C: stop here; what the round under way made has been removed.
            system::check_interrupted()?;
            done += 1;
            eprintln!("[{done}/{total}] round {round}: {}", c.name);
            match measure(which, &certs, &options) {
                Ok(sample) => {
                    // Per round, for the lab notebook (the report has only medians).
                    let shown = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.2}"));
                    eprintln!(
                        "  1 stream {:.2} Gbit/s, {} per proxy CPU-s; 4 streams {:.2} \
                         Gbit/s, {} per proxy CPU-s; keep-alive p50/p99 {:.0}/{:.0} µs; \
                         new connection p50 {:.0} µs",
                        sample.tcp1_gbits,
                        shown(sample.gbit_per_cpu(options.seconds)),
                        sample.tcp4_gbits,
                        shown(sample.gbit_per_cpu4(options.seconds)),
                        sample.keepalive_p50_us,
                        sample.keepalive_p99_us,
                        sample.new_conn_p50_us,
                    );
                    c.samples.push(sample);
                }
                Err(e) => {
                    eprintln!("  failed: {e}");
                    c.last_error = Some(e.lines().next().unwrap_or("").trim().to_string());
                }
            }
        }
    }
    system::check_interrupted()?;

    let shown = shown_args(&args, baseline.is_some());
    let markdown = markdown(
        &contenders,
        &options,
        &report::measured_line("bench-tls", &shown),
    );
    report::write(
        &root.join("target/bench-report"),
        "tls-report.md",
        &markdown,
    )?;
    println!("Written: target/bench-report/tls-report.md");
    if options.update_docs {
        report::update_front_page(&root, "tls", &markdown)?;
    }
    if contenders.iter().any(|c| c.samples.is_empty()) {
        return Err("some rows produced no measurement (see the table)".into());
    }
    Ok(())
}

fn contender(name: &str, which: Result<Route, String>) -> Contender {
    Contender {
        name: name.to_string(),
        which,
        samples: Vec::new(),
        last_error: None,
    }
}

/// One round of one row, in a testbed of its own that is gone when this returns.
fn measure(which: &Route, certs: &Certs, o: &Options) -> Result<Sample, String> {
    let mut bed = match which {
        Route::WireGuard(bin) => Testbed::new(
            &Impl::Tunneld(bin.clone(), "backend = \"mmsg\"\nworkers = 1", ""),
            bin,
        )?,
        Route::WireGuardOverTls(bin) => Testbed::new(
            &Impl::TunneldOverTls {
                bin: bin.clone(),
                ca: certs.ca.clone(),
                cert: certs.cert.clone(),
                key: certs.key.clone(),
            },
            bin,
        )?,
        // Only the namespaces and the veth underlay (no tunnel, so no keys: the path is
        // unused).
        _ => Testbed::new(&Impl::Direct, Path::new("/nonexistent"))?,
    };
    bed.set_tcp_congestion_control(&o.tcp_cc)?;
    let proxied = matches!(which, Route::Stunnel(_) | Route::Tunneld(_));
    // Services listen where the server-side proxy forwards to, or where B is reached.
    let service_host = match which {
        Route::Direct => B_UNDERLAY,
        Route::WireGuard(_) | Route::WireGuardOverTls(_) => B_TUNNEL,
        Route::Stunnel(_) | Route::Tunneld(_) => "127.0.0.1",
    };
    let echo_bind = sock(&format!("{service_host}:{ECHO_PORT}"))?;
    let (iperf_target, iperf_port, echo_target) = if proxied {
        ("127.0.0.1", PROXY_IPERF_PORT, sock(PROXY_ECHO)?)
    } else {
        (service_host, IPERF_PORT, echo_bind)
    };

    // Locals drop in reverse order: the iperf3 server and the proxies (SIGTERM, reaped) go
    // first, then the echo server, then the namespaces (which kill whatever is left inside).
    let _echo = EchoServer::start(&bed.b, echo_bind)?;
    let run_dir = certs.dir.0.join(unique_name("run"));
    fs::create_dir(&run_dir).map_err(|e| format!("cannot create {}: {e}", run_dir.display()))?;
    let mut proxies = match which {
        Route::Direct | Route::WireGuard(_) | Route::WireGuardOverTls(_) => Vec::new(),
        Route::Stunnel(bin) => start_stunnel(&bed, bin, certs, &run_dir)?,
        Route::Tunneld(bin) => start_tunneld(&bed, bin, certs, &run_dir)?,
    };
    if proxied {
        wait_ready(&bed, &mut proxies)?;
        // End to end through both proxies once (bounded) before anything is measured.
        echo_check(&bed.a, echo_target)
            .map_err(|e| format!("no echo through the proxies: {e}{}", logs(&proxies)))?;
    }
    system::check_interrupted()?;

    // Throughput, and the proxies' (or the tunnels') CPU while it runs.
    let pids: Vec<u32> = match which {
        Route::WireGuard(_) | Route::WireGuardOverTls(_) => bed.pids(),
        _ => proxies.iter().map(|p| p.guard.0.id()).collect(),
    };
    let iperf = |streams: usize| -> Result<(f64, f64), String> {
        let _iperf_server = iperf_server(&bed.b, service_host)?;
        let cpu0 = cpu_seconds(&pids);
        let out = system::output_within(
            bed.a.command("iperf3").args([
                "-c",
                iperf_target,
                "-p",
                &iperf_port.to_string(),
                "-t",
                &o.seconds.to_string(),
                "-P",
                &streams.to_string(),
                "-J",
                "-C",
                &o.tcp_cc,
            ]),
            Duration::from_secs(o.seconds.into()) + IPERF_GRACE,
        )?;
        let cpu1 = cpu_seconds(&pids);
        let json = String::from_utf8_lossy(&out.stdout);
        check_congestion_control(&json, Some(&o.tcp_cc))?;
        // The last `sum_received` is the whole run's, over all streams.
        let bps = json_number_after(&json, "\"sum_received\"", "\"bits_per_second\"").ok_or_else(
            || {
                format!(
                    "iperf3 gave no result: {}{}",
                    json.chars().take(400).collect::<String>(),
                    logs(&proxies)
                )
            },
        )?;
        Ok((bps, cpu1 - cpu0))
    };
    let (bps, cpu) = iperf(1)?;
    system::check_interrupted()?;
    let (bps4, cpu4) = iperf(STREAMS)?;
    system::check_interrupted()?;

    let keepalive = keepalive_rtts_us(&bed.a, echo_target)
        .map_err(|e| format!("keep-alive echo: {e}{}", logs(&proxies)))?;
    system::check_interrupted()?;
    let new_conn = new_connection_rtts_us(&bed.a, echo_target)
        .map_err(|e| format!("new-connection echo: {e}{}", logs(&proxies)))?;
    system::check_interrupted()?;
    let many = many_connections(&bed.a, echo_target, pids.clone())
        .map_err(|e| format!("{CONCURRENT} connections echo: {e}{}", logs(&proxies)))?;

    let (proxy_cpu, proxy_cpu4, many_cpu, peak_rss_kib) = if !pids.is_empty() {
        (cpu, cpu4, many.cpu, peak_rss_kib(&pids) as f64)
    } else {
        (f64::NAN, f64::NAN, f64::NAN, f64::NAN)
    };
    Ok(Sample {
        tcp1_gbits: bps / 1e9,
        proxy_cpu,
        tcp4_gbits: bps4 / 1e9,
        proxy_cpu4,
        keepalive_p50_us: percentile(&keepalive, 0.50),
        keepalive_p99_us: percentile(&keepalive, 0.99),
        new_conn_p50_us: percentile(&new_conn, 0.50),
        many_rps: many.rtts_us.len() as f64 / many.elapsed.as_secs_f64(),
        many_requests: many.rtts_us.len() as f64,
        many_cpu,
        many_p50_us: percentile(&many.rtts_us, 0.50),
        many_p99_us: percentile(&many.rtts_us, 0.99),
        peak_rss_kib,
    })
}

fn sock(text: &str) -> Result<SocketAddr, String> {
    text.parse()
        .map_err(|e| format!("bad socket address {text}: {e}"))
}

// ----------------------------------------------------------------------------------------
// Certificates

/// A directory removed (with everything in it) when dropped.
struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The throwaway CA and the server's certificate and key, in a private temp dir that also
/// holds each round's configs and logs.
struct Certs {
    dir: TempDir,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl Certs {
    fn generate() -> Result<Certs, String> {
        let dir = TempDir(std::env::temp_dir().join(unique_name("tlsb")));
        fs::create_dir(&dir.0).map_err(|e| format!("cannot create {}: {e}", dir.0.display()))?;
        fs::set_permissions(&dir.0, fs::Permissions::from_mode(0o700))
            .map_err(|e| e.to_string())?;
        let d = dir.0.clone();
        let p = |name: &str| d.join(name).to_string_lossy().into_owned();
        eprintln!("==> test CA and server certificate for {SERVER_NAME} (openssl, P-256)");
        let ec = ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"];
        openssl(&[&["genpkey"], &ec[..], &["-out", &p("ca.key")]].concat())?;
        openssl(&[
            "req",
            "-x509",
            "-new",
            "-key",
            &p("ca.key"),
            "-subj",
            "/CN=tunneld bench test CA",
            "-days",
            "2",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-out",
            &p("ca.pem"),
        ])?;
        // PKCS#8 PEM ("BEGIN PRIVATE KEY"), as genpkey writes it.
        openssl(&[&["genpkey"], &ec[..], &["-out", &p("server.key")]].concat())?;
        fs::set_permissions(d.join("server.key"), fs::Permissions::from_mode(0o600))
            .map_err(|e| e.to_string())?;
        openssl(&[
            "req",
            "-new",
            "-key",
            &p("server.key"),
            "-subj",
            &format!("/CN={SERVER_NAME}"),
            "-out",
            &p("server.csr"),
        ])?;
        fs::write(
            d.join("server.ext"),
            format!(
                "basicConstraints = critical, CA:FALSE\n\
                 keyUsage = critical, digitalSignature\n\
                 extendedKeyUsage = serverAuth\n\
                 subjectAltName = DNS:{SERVER_NAME}\n\
                 subjectKeyIdentifier = hash\n\
                 authorityKeyIdentifier = keyid\n"
            ),
        )
        .map_err(|e| e.to_string())?;
        openssl(&[
            "x509",
            "-req",
            "-in",
            &p("server.csr"),
            "-CA",
            &p("ca.pem"),
            "-CAkey",
            &p("ca.key"),
            "-set_serial",
            "2",
            "-days",
            "2",
            "-sha256",
            "-extfile",
            &p("server.ext"),
            "-out",
            &p("server.pem"),
        ])?;
        openssl(&["verify", "-CAfile", &p("ca.pem"), &p("server.pem")])?;
        Ok(Certs {
            ca: d.join("ca.pem"),
            cert: d.join("server.pem"),
            key: d.join("server.key"),
            dir,
        })
    }
}

fn openssl(args: &[&str]) -> Result<(), String> {
    let out = system::output_within(Command::new("openssl").args(args), Duration::from_secs(30))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "openssl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

// ----------------------------------------------------------------------------------------
// The proxies

/// A proxy process (killed with SIGTERM and reaped when dropped) and its stderr log.
struct Proxy {
    name: String,
    guard: Guard,
    log: PathBuf,
}

fn spawn_proxy(name: &str, mut cmd: Command, log: PathBuf) -> Result<Proxy, String> {
    let file =
        fs::File::create(&log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
    Ok(Proxy {
        name: name.to_string(),
        guard: Guard(child),
        log,
    })
}

fn write_config(path: &Path, text: &str) -> Result<(), String> {
    fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn start_stunnel(
    bed: &Testbed,
    bin: &Path,
    certs: &Certs,
    dir: &Path,
) -> Result<Vec<Proxy>, String> {
    // Service-level options in the global section are the defaults of every service.
    let common = "foreground = yes\npid =\nsyslog = no\ndebug = warning\n\
                  sslVersionMin = TLSv1.3\nciphersuites = TLS_AES_256_GCM_SHA384\n";
    let client = format!(
        "{common}client = yes\nCAfile = {ca}\nverifyChain = yes\ncheckHost = {SERVER_NAME}\n\
         sni = {SERVER_NAME}\n\n\
         [iperf]\naccept = {PROXY_IPERF}\nconnect = {TLS_IPERF}\n\n\
         [echo]\naccept = {PROXY_ECHO}\nconnect = {TLS_ECHO}\n",
        ca = certs.ca.display(),
    );
    let server = format!(
        "{common}cert = {cert}\nkey = {key}\n\n\
         [iperf]\naccept = {TLS_IPERF}\nconnect = 127.0.0.1:{IPERF_PORT}\n\n\
         [echo]\naccept = {TLS_ECHO}\nconnect = 127.0.0.1:{ECHO_PORT}\n",
        cert = certs.cert.display(),
        key = certs.key.display(),
    );
    let mut proxies = Vec::new();
    for (side, ns, config) in [("client", &bed.a, client), ("server", &bed.b, server)] {
        let path = dir.join(format!("stunnel-{side}.conf"));
        write_config(&path, &config)?;
        let mut cmd = ns.command(&bin.to_string_lossy());
        cmd.arg(&path);
        proxies.push(spawn_proxy(
            &format!("stunnel ({side}, in {})", ns.name()),
            cmd,
            dir.join(format!("stunnel-{side}.log")),
        )?);
    }
    Ok(proxies)
}

fn start_tunneld(
    bed: &Testbed,
    bin: &Path,
    certs: &Certs,
    dir: &Path,
) -> Result<Vec<Proxy>, String> {
    let client = format!(
        "[[tls.forward]]\nlisten = \"{PROXY_IPERF}\"\nconnect = \"{TLS_IPERF}\"\n\
         server_name = \"{SERVER_NAME}\"\nca_file = \"{ca}\"\n\n\
         [[tls.forward]]\nlisten = \"{PROXY_ECHO}\"\nconnect = \"{TLS_ECHO}\"\n\
         server_name = \"{SERVER_NAME}\"\nca_file = \"{ca}\"\n",
        ca = certs.ca.display(),
    );
    let server = format!(
        "[[tls.listen]]\nlisten = \"{TLS_IPERF}\"\ncert_file = \"{cert}\"\nkey_file = \"{key}\"\n\
         forward_to = \"127.0.0.1:{IPERF_PORT}\"\n\n\
         [[tls.listen]]\nlisten = \"{TLS_ECHO}\"\ncert_file = \"{cert}\"\nkey_file = \"{key}\"\n\
         forward_to = \"127.0.0.1:{ECHO_PORT}\"\n",
        cert = certs.cert.display(),
        key = certs.key.display(),
    );
    let mut proxies = Vec::new();
    for (side, ns, config) in [("client", &bed.a, client), ("server", &bed.b, server)] {
        let path = dir.join(format!("tunneld-{side}.toml"));
        write_config(&path, &config)?;
        let mut cmd = ns.command(&bin.to_string_lossy());
        cmd.arg("up").arg(&path);
        proxies.push(spawn_proxy(
            &format!("tunneld ({side}, in {})", ns.name()),
            cmd,
            dir.join(format!("tunneld-{side}.log")),
        )?);
    }
    Ok(proxies)
}

/// Waits (at most [`READY_LIMIT`]) until both proxies listen on both services. A proxy that
/// exits instead fails the round with the first line it wrote to stderr.
fn wait_ready(bed: &Testbed, proxies: &mut [Proxy]) -> Result<(), String> {
    let deadline = Instant::now() + READY_LIMIT;
    loop {
        for p in proxies.iter_mut() {
            if let Ok(Some(status)) = p.guard.0.try_wait() {
                let log = fs::read_to_string(&p.log).unwrap_or_default();
                let first = log
                    .lines()
                    .map(str::trim)
                    .find(|l| !l.is_empty())
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("{} exited ({status}) and wrote nothing", p.name));
                return Err(format!("{first}{}", logs(proxies)));
            }
        }
        if listening(&bed.a, &[PROXY_IPERF, PROXY_ECHO])
            && listening(&bed.b, &[TLS_IPERF, TLS_ECHO])
        {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the proxies did not listen on {PROXY_IPERF}, {PROXY_ECHO} (A) and {TLS_IPERF}, \
                 {TLS_ECHO} (B) within {} s{}",
                READY_LIMIT.as_secs(),
                logs(proxies)
            ));
        }
        system::check_interrupted()?;
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether every address in `addrs` has a listening TCP socket in `ns`.
pub(crate) fn listening(ns: &NetNs, addrs: &[&str]) -> bool {
    let out = ns.output(&["ss", "-ltnH"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let local: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .collect();
    addrs.iter().all(|a| local.contains(a))
}

/// The tail of each proxy's log, for error messages.
fn logs(proxies: &[Proxy]) -> String {
    let mut text = String::new();
    for p in proxies {
        if let Ok(log) = fs::read_to_string(&p.log) {
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(10)..];
            if !tail.is_empty() {
                let _ = write!(
                    text,
                    "\n--- {} log (last lines) ---\n{}",
                    p.name,
                    tail.join("\n")
                );
            }
        }
    }
    text
}

/// A one-shot iperf3 server in `ns` on `host`:5201, listening once this returns.
fn iperf_server(ns: &NetNs, host: &str) -> Result<Guard, String> {
    let server = Guard(
        ns.command("iperf3")
            .args(["-s", "-1", "-B", host, "-p", &IPERF_PORT.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start iperf3: {e}"))?,
    );
    let addr = format!("{host}:{IPERF_PORT}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !listening(ns, &[&addr]) {
        if Instant::now() >= deadline {
            return Err(format!("iperf3 -s did not listen on {addr} within 5 s"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(server)
}

// ----------------------------------------------------------------------------------------
// The echo server (in B) and its clients (in A)

/// A TCP echo server on a thread that entered a namespace, a thread per connection. Stops
/// accepting when dropped; connection threads end when their client closes (or after
/// [`IO_TIMEOUT`] of silence).
pub(crate) struct EchoServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EchoServer {
    pub(crate) fn start(ns: &NetNs, addr: SocketAddr) -> Result<EchoServer, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
        let stopping = stop.clone();
        let thread = ns.spawn_in_ns(move || {
            let listener = match TcpListener::bind(addr) {
                Ok(l) => l,
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("echo server cannot bind {addr}: {e}")));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(()));
            // Bounded even if never stopped: at most an hour.
            let deadline = Instant::now() + Duration::from_secs(3600);
            while !stopping.load(Ordering::SeqCst) && Instant::now() < deadline {
                // Wait for a connection at most 100 ms, so the stop flag is seen; an incoming
                // connection wakes it at once (no polling delay in the latency figures).
                if !readable(listener.as_raw_fd(), 100) {
                    continue;
                }
                if let Ok((stream, _)) = listener.accept() {
                    std::thread::spawn(move || echo_connection(stream));
                }
            }
        });
        let ready = ready_rx
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|_| Err("echo server did not start within 5 s".into()));
        let server = EchoServer {
            stop,
            thread: Some(thread),
        };
        ready.map(|()| server)
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Whether `fd` becomes readable within `timeout_ms`.
pub(crate) fn readable(fd: std::os::fd::RawFd, timeout_ms: i32) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, alive for the whole call.
    unsafe { libc::poll(&mut pfd, 1, timeout_ms) > 0 }
}

fn echo_connection(mut stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if stream.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}

/// Connects to `addr` with the client options every measurement uses.
fn connect(addr: SocketAddr) -> Result<TcpStream, String> {
    let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
        .map_err(|e| format!("connect {addr}: {e}"))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    Ok(stream)
}

/// One request echoed back whole and unchanged.
fn round_trip(stream: &mut TcpStream, request: &[u8; MESSAGE_BYTES]) -> Result<(), String> {
    stream
        .write_all(request)
        .map_err(|e| format!("write: {e}"))?;
    read_echo(stream, request)
}

/// One round trip on a new connection, retried until it works or [`READY_LIMIT`] passes.
fn echo_check(ns: &NetNs, addr: SocketAddr) -> Result<(), String> {
    ns.in_ns(move || {
        let deadline = Instant::now() + READY_LIMIT;
        loop {
            let result = connect(addr).and_then(|mut s| round_trip(&mut s, &request(0)));
            match result {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() >= deadline || system::interrupted() => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    })
}

/// Round-trip times (µs) of [`KEEPALIVE_ROUND_TRIPS`] requests on one connection, from `ns`.
fn keepalive_rtts_us(ns: &NetNs, addr: SocketAddr) -> Result<Vec<f64>, String> {
    ns.in_ns(move || {
        let deadline = Instant::now() + PHASE_LIMIT;
        let mut stream = connect(addr)?;
        let mut samples = Vec::with_capacity(KEEPALIVE_ROUND_TRIPS);
        for i in 0..KEEPALIVE_WARMUP + KEEPALIVE_ROUND_TRIPS {
            if Instant::now() >= deadline || system::interrupted() {
                return Err(format!("stopped after {i} round trips"));
            }
            let req = request(i as u64);
            let start = Instant::now();
            round_trip(&mut stream, &req)?;
            if i >= KEEPALIVE_WARMUP {
                samples.push(start.elapsed().as_secs_f64() * 1e6);
            }
        }
        Ok(samples)
    })
}

/// Times (µs) of [`NEW_CONNECTIONS`] × (connect, one round trip, close), from `ns`.
fn new_connection_rtts_us(ns: &NetNs, addr: SocketAddr) -> Result<Vec<f64>, String> {
    ns.in_ns(move || {
        let deadline = Instant::now() + PHASE_LIMIT;
        let mut samples = Vec::with_capacity(NEW_CONNECTIONS);
        for i in 0..NEW_CONNECTIONS {
            if Instant::now() >= deadline || system::interrupted() {
                return Err(format!("stopped after {i} connections"));
            }
            let start = Instant::now();
            let mut stream = connect(addr)?;
            round_trip(&mut stream, &request(i as u64))?;
            drop(stream);
            samples.push(start.elapsed().as_secs_f64() * 1e6);
        }
        Ok(samples)
    })
}

/// What the many-connections phase measured.
struct Many {
    /// Round-trip times (µs), one per completed request.
    rtts_us: Vec<f64>,
    elapsed: Duration,
    /// CPU seconds of the given pids over `elapsed`.
    cpu: f64,
}

/// [`CONCURRENT`] connections to `addr` from `ns`, each with exactly one request outstanding
/// (`closed_loop`), until [`MANY_ROUND_TRIPS`] have completed or [`PHASE_LIMIT`] passes.
/// `pids`' CPU is read around the loop only, not the connects and warm-up.
fn many_connections(ns: &NetNs, addr: SocketAddr, pids: Vec<u32>) -> Result<Many, String> {
    ns.in_ns(move || {
        let deadline = Instant::now() + PHASE_LIMIT;
        let mut streams = Vec::with_capacity(CONCURRENT);
        for i in 0..CONCURRENT {
            if Instant::now() >= deadline || system::interrupted() {
                return Err(format!("stopped after {i} connects"));
            }
            streams.push(connect(addr).map_err(|e| format!("connection {i}: {e}"))?);
        }
        closed_loop::warm_up(&mut streams)?;
        let cpu0 = cpu_seconds(&pids);
        let outcome = closed_loop::run(streams, MANY_ROUND_TRIPS, deadline, IO_TIMEOUT)?;
        let cpu = cpu_seconds(&pids) - cpu0;
        if !outcome.finished {
            eprintln!(
                "  {CONCURRENT} connections: {} s limit reached after {} round trips",
                PHASE_LIMIT.as_secs(),
                outcome.rtts_us.len()
            );
        }
        if outcome.rtts_us.is_empty() {
            return Err("no round trip completed".into());
        }
        Ok(Many {
            rtts_us: outcome.rtts_us,
            elapsed: outcome.elapsed,
            cpu,
        })
    })
}

// ----------------------------------------------------------------------------------------
// The report

fn markdown(contenders: &[Contender], o: &Options, measured: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{measured}\n\nTCP forwarded over TLS 1.3 (stunnel: TLS_AES_256_GCM_SHA384; P-256 certificates) \
         between two namespaces over a veth, and through tunneld's WireGuard tunnel for \
         comparison (its row's CPU is the two tunnelds'). {} round(s), {} s per iperf3 run \
         (1 stream, then 4), \
         medians. Both proxies and the traffic share this machine's cores: Gbit per proxy \
         CPU-second is the comparable figure. Latency: {MESSAGE_BYTES}-byte requests echoed from B; \
         keep-alive is {KEEPALIVE_ROUND_TRIPS} round trips on one connection, new \
         connection is connect + one round trip + close, {NEW_CONNECTIONS} times; \
         {CONCURRENT} conns is {CONCURRENT} connections each with one request always \
         outstanding, from one client thread, {MANY_ROUND_TRIPS} round trips in all (its CPU \
         is the proxies' during that phase). {}.\n",
        o.rounds,
        o.seconds,
        crate::bench::congestion_control_note(&o.tcp_cc)
    );
    let concurrent_requests = format!("{CONCURRENT} conns: requests/s");
    let streams = format!("TCP {STREAMS} streams");
    let concurrent_p50 = format!("{CONCURRENT} conns p50");
    let mut table = Table::new(&[
        "path",
        "TCP 1 stream",
        "Gbit per proxy CPU-s",
        "proxy CPU-s",
        &streams,
        "Gbit per proxy CPU-s (4)",
        "keep-alive p50",
        "p99",
        "new connection p50",
        &concurrent_requests,
        "requests per proxy CPU-ms",
        &concurrent_p50,
        "p99",
        "peak RSS (both)",
    ]);
    for c in contenders {
        if let Err(why) = &c.which {
            table.note(&c.name, why);
            continue;
        }
        if c.samples.is_empty() {
            let why = c.last_error.as_deref().unwrap_or("no measurement");
            table.note(&c.name, &format!("failed: {why}"));
            continue;
        }
        let m = |f: fn(&Sample) -> f64| median(c.samples.iter().map(f).collect());
        // Gbit per proxy CPU-second, per round, then the median of those.
        let per_cpu = median(
            c.samples
                .iter()
                .filter_map(|s| s.gbit_per_cpu(o.seconds))
                .collect(),
        );
        let per_cpu4 = median(
            c.samples
                .iter()
                .filter_map(|s| s.gbit_per_cpu4(o.seconds))
                .collect(),
        );
        let per_cpu_ms = median(
            c.samples
                .iter()
                .filter(|s| s.many_cpu > 0.0)
                .map(|s| s.many_requests / (s.many_cpu * 1000.0))
                .collect(),
        );
        table.row(&[
            c.name.clone(),
            cell(m(|s| s.tcp1_gbits), 2, " Gbit/s"),
            cell(per_cpu, 2, ""),
            cell(m(|s| s.proxy_cpu), 2, ""),
            cell(m(|s| s.tcp4_gbits), 2, " Gbit/s"),
            cell(per_cpu4, 2, ""),
            cell(m(|s| s.keepalive_p50_us), 0, " µs"),
            cell(m(|s| s.keepalive_p99_us), 0, " µs"),
            cell(m(|s| s.new_conn_p50_us), 0, " µs"),
            cell(m(|s| s.many_rps), 0, ""),
            cell(per_cpu_ms, 1, ""),
            cell(m(|s| s.many_p50_us), 0, " µs"),
            cell(m(|s| s.many_p99_us), 0, " µs"),
            cell(m(|s| s.peak_rss_kib) / 1024.0, 1, " MiB"),
        ]);
    }
    out.push_str(table.render());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_options() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 51.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert!(percentile(&[], 0.5).is_nan());
        let o = parse_options(&[
            "--rounds".into(),
            "3".into(),
            "--seconds".into(),
            "2".into(),
        ])
        .unwrap();
        assert_eq!((o.rounds, o.seconds, o.quick), (3, 2, false));
        let o = parse_options(&["--quick".into()]).unwrap();
        assert_eq!((o.rounds, o.seconds), (1, 1));
        assert!(parse_options(&["--only".into()]).is_err());
    }
}
