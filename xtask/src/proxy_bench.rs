//! `cargo xtask bench-proxy`: proxies into a WireGuard tunnel without root or a TUN device
//! (issue 47): `tunneld proxy` beside wireproxy's engine and onetun. Writes
//! target/bench-report/proxy-report.md.
//!
//! # The testbed
//!
//! Per row and round, fresh: the embedded bench's testbed (xtask/src/embedded_bench.rs):
//! namespaces A and B joined by a veth, tunneld (`up`, TUN, one worker) in B at 10.77.0.2
//! with site A's peer (10.77.0.1/32), and in B, on threads of this process, a TCP sink on
//! 10.77.0.2:5301, a TCP echo server on :5302 and a UDP echo server on :5303. In A, the
//! row's proxy is site A's WireGuard peer and listens on 127.0.0.1; the clients are threads
//! of this process in A that reach B's servers through it:
//!
//! - **tunneld proxy** (`tunneld proxy CONFIG`, the release build): one process serving an
//!   HTTP proxy, SOCKS5 and forwards (TCP to the sink and the echo server, UDP to the UDP
//!   echo); its rows differ in which one the clients use.
//! - **wireproxy's engine** (`xtask/go/netstack-proxy`): wireguard-go's netstack behind Go's
//!   net/http answering CONNECT, built with the machine's Go. wireproxy's SOCKS5 has no UDP
//!   ASSOCIATE and an HTTP proxy carries no UDP, so its UDP cells are "n/a".
//! - **onetun** (the version bench-embedded pins, `cargo install`ed into target/onetun): a
//!   port forwarder, no proxy: TCP forwards to the sink and the echo server, a UDP forward to
//!   the UDP echo.
//!
//! # What each row measures
//!
//! - TCP 1 stream: one connection through the proxy to the sink, written for `--seconds`
//!   (at most [`BULK_WINDOW`] ahead of what the sink has received), measured at the sink.
//! - 64 conns, keep-alive: 64 connections opened through the proxy (one CONNECT or SOCKS5
//!   request each), each keeping one 64-byte request in flight to the echo server.
//! - new connection per request: 64 threads, each opening a connection through the proxy
//!   (connect, the proxy's handshake), one 64-byte request and its echo, close; again.
//! - UDP round trip: one 8-byte datagram at a time to the UDP echo, through SOCKS5's UDP
//!   ASSOCIATE or a UDP forward; each waits at most 1 s (a lost one is counted, not timed).
//! - CPU: the proxy process's (from /proc) over each phase; Gbit and requests per proxy
//!   CPU-second. B's tunneld and the clients are not counted: they are the same for every
//!   row. Peak RSS: the proxy process's VmHWM at the end of the round.

use crate::bench::{parse_options, Options};
use crate::closed_loop::{self, read_echo, request, MESSAGE_BYTES};
use crate::embedded_bench::{
    build_go_program, bulk_on, install_onetun, tail, wait_for_address, wait_listening, with_cpu,
    Sink, BULK_WINDOW, B_TUNNEL, ECHO_PORT, IO_TIMEOUT, MTU, ONETUN_VERSION, RR_LIMIT, SINK_PORT,
};
use crate::report::{self, cell, median, percentile, spread, Table};
use crate::system;
use crate::testbed::{peak_rss_kib, Guard, Impl, Testbed};
use crate::tls_bench::EchoServer;
use std::fmt::Write as _;
use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tunneld_testnet::{require_netns, unique_name, NetNs};

/// B's UDP echo server's port, on [`B_TUNNEL`].
const UDP_ECHO_PORT: u16 = 5303;
/// Where the proxies listen in A.
const HTTP_LISTEN: &str = "127.0.0.1:18080";
const SOCKS_LISTEN: &str = "127.0.0.1:11080";
/// The forwards in A (tunneld's and onetun's): to the sink, the echo server, the UDP echo.
const FORWARD_SINK: &str = "127.0.0.1:15301";
const FORWARD_ECHO: &str = "127.0.0.1:15302";
const FORWARD_UDP: &str = "127.0.0.1:15303";
/// Keep-alive: this many connections, this many round trips in all (fewer with `--quick`).
const RR_CONNS: usize = 64;
const RR_ROUNDS: usize = 50_000;
const RR_ROUNDS_QUICK: usize = 5_000;
/// New connection per request: this many at once, this many requests in all. Each leaves
/// a connection in TIME_WAIT in the proxy's stack, so the count stays well under a stack's
/// ephemeral ports.
const NEW_CONNS: usize = 64;
const NEW_REQUESTS: usize = 10_000;
const NEW_REQUESTS_QUICK: usize = 1_000;
/// UDP round trips, one at a time, after [`UDP_WARM_UP`] uncounted ones.
const UDP_PROBES: usize = 2_000;
const UDP_PROBES_QUICK: usize = 200;
const UDP_WARM_UP: usize = 5;
const UDP_WAIT: Duration = Duration::from_secs(1);
/// The Go module of wireproxy's engine, in the repository.
const NETSTACK_PROXY_SOURCE: &str = "xtask/go/netstack-proxy";

/// Which row: what the targets refer to.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    TunneldHttp,
    TunneldSocks,
    TunneldForward,
    Netstack,
    Onetun,
}

impl Kind {
    /// How the clients reach B's servers through this row's proxy.
    fn access(self) -> Access {
        let addr = |text: &str| text.parse().expect("a constant socket address");
        let target = |port| SocketAddr::new(B_TUNNEL.parse().expect("an IPv4 constant"), port);
        let via_proxy = |proxy| Access::Proxy {
            proxy,
            sink: target(SINK_PORT),
            echo: target(ECHO_PORT),
        };
        match self {
            Kind::TunneldHttp | Kind::Netstack => via_proxy(Proxy::Http(addr(HTTP_LISTEN))),
            Kind::TunneldSocks => via_proxy(Proxy::Socks5(addr(SOCKS_LISTEN))),
            Kind::TunneldForward | Kind::Onetun => Access::Forward {
                sink: addr(FORWARD_SINK),
                echo: addr(FORWARD_ECHO),
            },
        }
    }

    /// How its UDP round trips go, or why it has none.
    fn udp(self) -> Result<UdpPath, &'static str> {
        let addr = |text: &str| text.parse().expect("a constant socket address");
        let target = SocketAddrV4::new(B_TUNNEL.parse().expect("an IPv4 constant"), UDP_ECHO_PORT);
        match self {
            // The HTTP row's process serves SOCKS5 too: its UDP is SOCKS5's.
            Kind::TunneldHttp | Kind::TunneldSocks => Ok(UdpPath::Socks5 {
                proxy: addr(SOCKS_LISTEN),
                target,
            }),
            Kind::TunneldForward | Kind::Onetun => Ok(UdpPath::Forward(addr(FORWARD_UDP))),
            Kind::Netstack => Err("n/a: wireproxy's SOCKS5 has no UDP ASSOCIATE, HTTP no UDP"),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Proxy {
    Http(SocketAddr),
    Socks5(SocketAddr),
}

#[derive(Clone, Copy, Debug)]
enum Access {
    /// Through a proxy to B's servers' own addresses.
    Proxy {
        proxy: Proxy,
        sink: SocketAddr,
        echo: SocketAddr,
    },
    /// To local ports forwarded to B's servers.
    Forward { sink: SocketAddr, echo: SocketAddr },
}

#[derive(Clone, Copy, Debug)]
enum Target {
    Sink,
    Echo,
}

impl Access {
    /// A connection to `target` through this access, ready to carry its bytes.
    fn open(self, target: Target) -> Result<TcpStream, String> {
        let (first_hop, proxied) = match (self, target) {
            (Access::Forward { sink, .. }, Target::Sink) => (sink, None),
            (Access::Forward { echo, .. }, Target::Echo) => (echo, None),
            (Access::Proxy { proxy, sink, .. }, Target::Sink) => {
                (proxy.addr(), Some((proxy, sink)))
            }
            (Access::Proxy { proxy, echo, .. }, Target::Echo) => {
                (proxy.addr(), Some((proxy, echo)))
            }
        };
        let mut stream = TcpStream::connect_timeout(&first_hop, IO_TIMEOUT)
            .map_err(|e| format!("connect {first_hop}: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(IO_TIMEOUT))
            .map_err(|e| e.to_string())?;
        stream
            .set_write_timeout(Some(IO_TIMEOUT))
            .map_err(|e| e.to_string())?;
        match proxied {
            None => {}
            Some((Proxy::Http(_), to)) => http_connect(&mut stream, to)?,
            Some((Proxy::Socks5(_), to)) => socks5_connect(&mut stream, to)?,
        }
        Ok(stream)
    }
}

impl Proxy {
    fn addr(self) -> SocketAddr {
        match self {
            Proxy::Http(a) | Proxy::Socks5(a) => a,
        }
    }
}

/// `CONNECT to` on an HTTP proxy connection; Ok once the proxy answered 2xx. The servers
/// behind it never speak first, so nothing follows the answer's blank line.
fn http_connect(stream: &mut TcpStream, to: SocketAddr) -> Result<(), String> {
    let request = format!("CONNECT {to} HTTP/1.1\r\nHost: {to}\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("CONNECT: write: {e}"))?;
    let mut answer = Vec::with_capacity(128);
    let mut buf = [0u8; 512];
    while !answer.ends_with(b"\r\n\r\n") {
        if answer.len() > 8192 {
            return Err("CONNECT: an answer over 8 KiB".into());
        }
        let n = stream
            .read(&mut buf)
            .map_err(|e| format!("CONNECT: read: {e}"))?;
        if n == 0 {
            return Err("CONNECT: the proxy closed the connection".into());
        }
        answer.extend_from_slice(&buf[..n]);
    }
    let status = String::from_utf8_lossy(&answer);
    let line = status.lines().next().unwrap_or("");
    match line.split_whitespace().nth(1) {
        Some(code) if code.starts_with('2') && code.len() == 3 => Ok(()),
        _ => Err(format!("CONNECT {to}: {line}")),
    }
}

/// Reads a SOCKS5 reply (RFC 1928, 6) and returns its bound address (IPv4 only here).
fn socks5_reply(stream: &mut TcpStream, what: &str) -> Result<SocketAddr, String> {
    let mut head = [0u8; 4];
    stream
        .read_exact(&mut head)
        .map_err(|e| format!("SOCKS5 {what}: read: {e}"))?;
    if head[0] != 5 || head[1] != 0 {
        return Err(format!("SOCKS5 {what}: refused (reply {})", head[1]));
    }
    if head[3] != 1 {
        return Err(format!(
            "SOCKS5 {what}: a bound address of type {}, not IPv4",
            head[3]
        ));
    }
    let mut addr = [0u8; 6];
    stream
        .read_exact(&mut addr)
        .map_err(|e| format!("SOCKS5 {what}: read: {e}"))?;
    let ip = Ipv4Addr::new(addr[0], addr[1], addr[2], addr[3]);
    Ok(SocketAddr::from((
        ip,
        u16::from_be_bytes([addr[4], addr[5]]),
    )))
}

/// The method negotiation (no authentication), then `command` to `to`, one step at a time
/// as a conforming client waits for each answer. Returns the reply's bound address.
fn socks5_request(
    stream: &mut TcpStream,
    command: u8,
    to: SocketAddrV4,
    what: &str,
) -> Result<SocketAddr, String> {
    stream
        .write_all(&[5, 1, 0])
        .map_err(|e| format!("SOCKS5 greeting: write: {e}"))?;
    let mut choice = [0u8; 2];
    stream
        .read_exact(&mut choice)
        .map_err(|e| format!("SOCKS5 greeting: read: {e}"))?;
    if choice != [5, 0] {
        return Err(format!("SOCKS5: the proxy chose method {}", choice[1]));
    }
    let mut request = vec![5, command, 0, 1];
    request.extend_from_slice(&to.ip().octets());
    request.extend_from_slice(&to.port().to_be_bytes());
    stream
        .write_all(&request)
        .map_err(|e| format!("SOCKS5 {what}: write: {e}"))?;
    socks5_reply(stream, what)
}

fn socks5_connect(stream: &mut TcpStream, to: SocketAddr) -> Result<(), String> {
    let SocketAddr::V4(to) = to else {
        return Err("SOCKS5: the bench's targets are IPv4".into());
    };
    socks5_request(stream, 1, to, "CONNECT").map(|_| ())
}

/// How a row's UDP datagrams reach B's UDP echo.
#[derive(Clone, Copy, Debug)]
enum UdpPath {
    /// SOCKS5 UDP ASSOCIATE on `proxy`, each datagram addressed to `target`.
    Socks5 {
        proxy: SocketAddr,
        target: SocketAddrV4,
    },
    /// A local UDP port forwarded to the echo.
    Forward(SocketAddr),
}

/// One round's figures for one row.
#[derive(Clone, Debug, Default)]
struct Sample {
    /// The round (from 1); a failed round leaves a gap.
    round: usize,
    bulk_bytes: f64,
    bulk_seconds: f64,
    bulk_cpu: f64,
    keep_requests: f64,
    keep_rps: f64,
    keep_p50_us: f64,
    keep_p99_us: f64,
    keep_cpu: f64,
    new_requests: f64,
    new_rps: f64,
    new_p50_us: f64,
    new_p99_us: f64,
    new_cpu: f64,
    /// NaN for a row without UDP.
    udp_p50_us: f64,
    udp_p99_us: f64,
    udp_lost: f64,
    peak_rss_kib: f64,
}

impl Sample {
    fn gbits(&self) -> f64 {
        self.bulk_bytes * 8.0 / 1e9 / self.bulk_seconds
    }
    fn gbit_per_cpu(&self) -> f64 {
        per_cpu(self.bulk_bytes * 8.0 / 1e9, self.bulk_cpu)
    }
    /// Keep-alive requests per proxy CPU-second.
    fn keep_per_cpu(&self) -> f64 {
        per_cpu(self.keep_requests, self.keep_cpu)
    }
    /// New-connection requests per proxy CPU-second.
    fn new_per_cpu(&self) -> f64 {
        per_cpu(self.new_requests, self.new_cpu)
    }
}

fn per_cpu(work: f64, cpu: f64) -> f64 {
    if cpu > 0.0 {
        work / cpu
    } else {
        f64::NAN
    }
}

struct Contender {
    kind: Kind,
    name: String,
    /// The program the row runs, or why it is not in this run.
    program: Result<PathBuf, String>,
    samples: Vec<Sample>,
    /// Each failed round and the first line of its error.
    failures: Vec<(usize, String)>,
}

/// How many requests and probes a run makes.
#[derive(Clone, Copy)]
struct Sizes {
    keep_rounds: usize,
    new_requests: usize,
    udp_probes: usize,
}

pub fn run(args: &[String]) -> Result<(), String> {
    let options = parse_options(args)?;
    system::install_tools()?;
    if !require_netns("cargo xtask bench-proxy") {
        return Err("the benchmark needs root (network namespaces)".into());
    }
    let root = system::repo_root()?;
    let tunneld = system::build_tunneld()?;
    let sizes = if options.quick {
        Sizes {
            keep_rounds: RR_ROUNDS_QUICK,
            new_requests: NEW_REQUESTS_QUICK,
            udp_probes: UDP_PROBES_QUICK,
        }
    } else {
        Sizes {
            keep_rounds: RR_ROUNDS,
            new_requests: NEW_REQUESTS,
            udp_probes: UDP_PROBES,
        }
    };

    // Each row's program is built only when the row is in this run (`--only`).
    type Build<'a> = Box<dyn Fn() -> Result<PathBuf, String> + 'a>;
    let tunneld_proxy = || tunneld_has_proxy(&tunneld).map(|()| tunneld.clone());
    let rows: [(Kind, String, Build); 5] = [
        (
            Kind::TunneldHttp,
            "tunneld proxy, HTTP CONNECT".into(),
            Box::new(tunneld_proxy),
        ),
        (
            Kind::TunneldSocks,
            "tunneld proxy, SOCKS5".into(),
            Box::new(tunneld_proxy),
        ),
        (
            Kind::TunneldForward,
            "tunneld proxy, TCP/UDP forwards".into(),
            Box::new(tunneld_proxy),
        ),
        (
            Kind::Netstack,
            "wireguard-go v0.0.20250522 netstack + net/http CONNECT (wireproxy's engine)".into(),
            Box::new(|| build_go_program(&root, NETSTACK_PROXY_SOURCE)),
        ),
        (
            Kind::Onetun,
            format!("onetun {ONETUN_VERSION}, TCP/UDP forwards"),
            Box::new(|| install_onetun(&root)),
        ),
    ];
    let mut contenders: Vec<Contender> = rows
        .into_iter()
        .filter(|(_, name, _)| options.keeps(name))
        .map(|(kind, name, build)| Contender {
            kind,
            name,
            program: build(),
            samples: Vec::new(),
            failures: Vec::new(),
        })
        .collect();
    if contenders.is_empty() {
        return Err("--only matched no row".into());
    }
    for c in contenders.iter().filter(|c| c.program.is_err()) {
        let why = c.program.as_ref().err().map(String::as_str).unwrap_or("");
        eprintln!("{}: skipped ({why})", c.name);
    }

    let total = options.rounds * contenders.iter().filter(|c| c.program.is_ok()).count();
    let mut done = 0;
    for round in 1..=options.rounds {
        for c in contenders.iter_mut() {
            let Ok(program) = &c.program else { continue };
            system::check_interrupted()?;
            done += 1;
            eprintln!("[{done}/{total}] round {round}: {}", c.name);
            match measure(c.kind, program, &tunneld, &options, sizes) {
                Ok(sample) => {
                    eprintln!(
                        "  {:.2} Gbit/s, {:.2} Gbit per CPU-s; keep-alive {:.0}/s; new conn {:.0}/s; UDP p50 {:.0} µs; {:.1} MiB",
                        sample.gbits(),
                        sample.gbit_per_cpu(),
                        sample.keep_rps,
                        sample.new_rps,
                        sample.udp_p50_us,
                        sample.peak_rss_kib / 1024.0
                    );
                    c.samples.push(Sample { round, ..sample });
                }
                Err(e) => {
                    eprintln!("  failed: {e}");
                    let first = e.lines().next().unwrap_or("").trim().to_string();
                    c.failures.push((round, first));
                }
            }
        }
    }
    system::check_interrupted()?;

    let report_dir = system::target_dir(&root).join("bench-report");
    let measured = report::measured_line("bench-proxy", args);
    let markdown = markdown(&contenders, &options, sizes, &measured);
    report::write(&report_dir, "proxy-report.md", &markdown)?;
    println!("Written: target/bench-report/proxy-report.md");
    if options.update_docs {
        report::update_front_page(&root, "proxy", &markdown)?;
    }
    if contenders
        .iter()
        .any(|c| c.program.is_ok() && c.samples.is_empty())
    {
        return Err("some rows produced no measurement (see the table)".into());
    }
    Ok(())
}

/// Whether this tunneld build has the `proxy` command (`tunneld help proxy` exits 0).
fn tunneld_has_proxy(tunneld: &Path) -> Result<(), String> {
    let out = Command::new(tunneld)
        .args(["help", "proxy"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", tunneld.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err("not in this tree (this tunneld has no `proxy` command)".into())
    }
}

// ----------------------------------------------------------------------------------------
// One round of one row

fn measure(
    kind: Kind,
    program: &Path,
    tunneld: &Path,
    o: &Options,
    sizes: Sizes,
) -> Result<Sample, String> {
    let mut bed = Testbed::new(&Impl::TunneldSiteB(tunneld.to_path_buf()), tunneld)?;
    bed.set_tcp_congestion_control(&o.tcp_cc)?;
    wait_for_address(&bed.b, B_TUNNEL).map_err(|e| format!("{e}{}", bed.logs()))?;
    let b_ip = B_TUNNEL.parse().map_err(|e| format!("{B_TUNNEL}: {e}"))?;
    // Dropped in reverse order: the proxy, the servers, then the testbed.
    let sink = Sink::start(&bed.b, SocketAddr::new(b_ip, SINK_PORT))?;
    let _echo = EchoServer::start(&bed.b, SocketAddr::new(b_ip, ECHO_PORT))?;
    let _udp_echo = UdpEcho::start(&bed.b, SocketAddr::new(b_ip, UDP_ECHO_PORT))?;
    let log = bed.dir().join("proxy.log");
    let proxy = start_proxy(kind, program, &bed, &log)?;
    let pid = proxy.0.id();
    let log_tail = || tail(&log);
    let listeners: &[&str] = match kind {
        Kind::TunneldHttp | Kind::TunneldSocks | Kind::TunneldForward => {
            &[HTTP_LISTEN, SOCKS_LISTEN, FORWARD_SINK, FORWARD_ECHO]
        }
        Kind::Netstack => &[HTTP_LISTEN],
        Kind::Onetun => &[FORWARD_SINK, FORWARD_ECHO],
    };
    wait_listening(&bed.a, listeners).map_err(|e| format!("{e}{}", log_tail()))?;
    let access = kind.access();
    // The first connection waits for the WireGuard handshake.
    bed.a
        .in_ns(move || echo_check(access))
        .map_err(|e| format!("no echo through the proxy: {e}{}", log_tail()))?;

    let seconds = Duration::from_secs(o.seconds.into());
    let counted = sink.counted();
    let ((bytes, _), received, bulk_cpu) = with_cpu(&[pid], || {
        let written = bed.a.in_ns(move || {
            let stream = access.open(Target::Sink)?;
            bulk_on(stream, seconds, &counted)
        })?;
        Ok((written, sink.next()?))
    })
    .map_err(|e| format!("TCP stream: {e}{}", log_tail()))?;
    if bytes < received.bytes || received.bytes == 0 || received.seconds <= 0.0 {
        return Err(format!(
            "TCP stream: {bytes} bytes written, {} received",
            received.bytes
        ));
    }
    // Where the peak memory comes from: VmHWM after each phase, on the progress line.
    let hwm_after_stream = peak_rss_kib(&[pid]);
    system::check_interrupted()?;

    let keep_rounds = sizes.keep_rounds;
    let (keep, (), keep_cpu) = with_cpu(&[pid], || {
        Ok((bed.a.in_ns(move || keep_alive(access, keep_rounds))?, ()))
    })
    .map_err(|e| format!("keep-alive: {e}{}", log_tail()))?;
    let hwm_after_keep_alive = peak_rss_kib(&[pid]);
    system::check_interrupted()?;

    let new_requests = sizes.new_requests;
    let (new, (), new_cpu) = with_cpu(&[pid], || {
        Ok((
            bed.a
                .in_ns(move || new_connections(access, NEW_CONNS, new_requests))?,
            (),
        ))
    })
    .map_err(|e| format!("new connections: {e}{}", log_tail()))?;
    let hwm_after_new = peak_rss_kib(&[pid]);
    system::check_interrupted()?;

    let (udp_p50_us, udp_p99_us, udp_lost) = match kind.udp() {
        Ok(path) => {
            let probes = sizes.udp_probes;
            let udp = bed
                .a
                .in_ns(move || udp_round_trips(path, probes))
                .map_err(|e| format!("UDP: {e}{}", log_tail()))?;
            (udp.p50_us, udp.p99_us, udp.lost as f64)
        }
        Err(_) => (f64::NAN, f64::NAN, f64::NAN),
    };
    let peak_rss_kib = peak_rss_kib(&[pid]) as f64;
    eprintln!(
        "  proxy VmHWM: {:.1} MiB after the stream, {:.1} after keep-alive, {:.1} after new connections, {:.1} at the end",
        hwm_after_stream as f64 / 1024.0,
        hwm_after_keep_alive as f64 / 1024.0,
        hwm_after_new as f64 / 1024.0,
        peak_rss_kib / 1024.0
    );
    drop(proxy);
    Ok(Sample {
        round: 0,
        bulk_bytes: received.bytes as f64,
        bulk_seconds: received.seconds,
        bulk_cpu,
        keep_requests: keep.requests as f64,
        keep_rps: keep.per_second(),
        keep_p50_us: keep.p50_us,
        keep_p99_us: keep.p99_us,
        keep_cpu,
        new_requests: new.requests as f64,
        new_rps: new.per_second(),
        new_p50_us: new.p50_us,
        new_p99_us: new.p99_us,
        new_cpu,
        udp_p50_us,
        udp_p99_us,
        udp_lost,
        peak_rss_kib,
    })
}

/// Starts the row's proxy in A as site A's WireGuard peer, its stderr in `log`.
fn start_proxy(kind: Kind, program: &Path, bed: &Testbed, log: &Path) -> Result<Guard, String> {
    let peer = bed.site_a_peer().ok_or("the testbed has no site-A peer")?;
    let log_file =
        fs::File::create(log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
    let mut cmd = bed.a.command(&program.to_string_lossy());
    match kind {
        Kind::TunneldHttp | Kind::TunneldSocks | Kind::TunneldForward => {
            let config = bed.dir().join("proxy.toml");
            let text = tunneld_proxy_config(
                &unique_name("tp"),
                &peer.private_key_file,
                peer.address,
                &peer.peer_public_key,
                peer.endpoint,
            );
            fs::write(&config, text)
                .map_err(|e| format!("cannot write {}: {e}", config.display()))?;
            cmd.arg("proxy").arg(&config);
        }
        Kind::Netstack => {
            cmd.args(["--address", peer.address])
                .args(["--allowed-ip", &format!("{B_TUNNEL}/32")])
                .arg("--private-key-file")
                .arg(&peer.private_key_file)
                .args(["--peer-public-key", &peer.peer_public_key])
                .args(["--endpoint", peer.endpoint])
                .args(["--mtu", &MTU.to_string(), "--http", HTTP_LISTEN]);
        }
        Kind::Onetun => {
            cmd.arg(format!("{FORWARD_SINK}:{B_TUNNEL}:{SINK_PORT}:TCP"))
                .arg(format!("{FORWARD_ECHO}:{B_TUNNEL}:{ECHO_PORT}:TCP"))
                .arg(format!("{FORWARD_UDP}:{B_TUNNEL}:{UDP_ECHO_PORT}:UDP"))
                .args(["--endpoint-addr", peer.endpoint])
                .args(["--endpoint-public-key", &peer.peer_public_key])
                .arg("--private-key-file")
                .arg(&peer.private_key_file)
                .args(["--source-peer-ip", peer.address])
                .args(["--max-transmission-unit", &MTU.to_string()])
                .args(["--log", "warn"]);
        }
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .map(Guard)
        .map_err(|e| format!("cannot start {cmd:?}: {e}"))
}

/// The `tunneld proxy` config of the tunneld rows (the `[proxy]` surface of issue 47): site
/// A's key and address, B as the one peer, every listener the rows use.
fn tunneld_proxy_config(
    name: &str,
    key_file: &Path,
    address: &str,
    peer_public_key: &str,
    endpoint: &str,
) -> String {
    format!(
        "[interface]\nname = \"{name}\"\nprivate_key_file = \"{}\"\n\
         address = [\"{address}/32\"]\nmtu = {MTU}\n\n\
         [[peer]]\npublic_key = \"{peer_public_key}\"\nendpoint = \"{endpoint}\"\n\
         allowed_ips = [\"{B_TUNNEL}/32\"]\n\n\
         [proxy]\nhttp = \"{HTTP_LISTEN}\"\nsocks5 = \"{SOCKS_LISTEN}\"\n\n\
         [[proxy.forward]]\nprotocol = \"tcp\"\nlisten = \"{FORWARD_SINK}\"\nto = \"{B_TUNNEL}:{SINK_PORT}\"\n\n\
         [[proxy.forward]]\nprotocol = \"tcp\"\nlisten = \"{FORWARD_ECHO}\"\nto = \"{B_TUNNEL}:{ECHO_PORT}\"\n\n\
         [[proxy.forward]]\nprotocol = \"udp\"\nlisten = \"{FORWARD_UDP}\"\nto = \"{B_TUNNEL}:{UDP_ECHO_PORT}\"\n",
        key_file.display()
    )
}

// ----------------------------------------------------------------------------------------
// The clients (threads of this process in A)

/// One round trip on a new connection through `access`, retried until it works or 15 s
/// pass (the first waits for the tunnel's handshake).
fn echo_check(access: Access) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let attempt = access.open(Target::Echo).and_then(|mut s| {
            s.set_read_timeout(Some(Duration::from_secs(3)))
                .map_err(|e| e.to_string())?;
            let req = request(u64::MAX);
            s.write_all(&req).map_err(|e| e.to_string())?;
            read_echo(&mut s, &req)
        });
        match attempt {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline || system::interrupted() => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// Round trips of a request-rate run.
struct Requests {
    requests: usize,
    seconds: f64,
    p50_us: f64,
    p99_us: f64,
}

impl Requests {
    fn per_second(&self) -> f64 {
        self.requests as f64 / self.seconds
    }

    fn from_rtts(mut rtts_us: Vec<f64>, seconds: f64) -> Requests {
        rtts_us.sort_by(f64::total_cmp);
        Requests {
            requests: rtts_us.len(),
            seconds,
            p50_us: percentile(&rtts_us, 0.50),
            p99_us: percentile(&rtts_us, 0.99),
        }
    }
}

/// [`RR_CONNS`] connections through `access` (one proxy handshake each), one uncounted
/// round trip on each, then one request in flight on each until `rounds` are done.
fn keep_alive(access: Access, rounds: usize) -> Result<Requests, String> {
    let mut streams = Vec::with_capacity(RR_CONNS);
    for i in 0..RR_CONNS {
        streams.push(
            access
                .open(Target::Echo)
                .map_err(|e| format!("connection {i}: {e}"))?,
        );
    }
    closed_loop::warm_up(&mut streams)?;
    let outcome = closed_loop::run(streams, rounds, Instant::now() + RR_LIMIT, IO_TIMEOUT)?;
    if !outcome.finished {
        return Err(format!(
            "{} of {rounds} round trips done in the {} s limit",
            outcome.rtts_us.len(),
            RR_LIMIT.as_secs()
        ));
    }
    Ok(Requests::from_rtts(
        outcome.rtts_us,
        outcome.elapsed.as_secs_f64(),
    ))
}

/// `workers` threads, each opening a connection through `access`, sending one request,
/// reading its echo and closing, again, until `total` requests are done (within
/// [`RR_LIMIT`]). A request's time runs from its connect to its echo.
fn new_connections(access: Access, workers: usize, total: usize) -> Result<Requests, String> {
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let deadline = Instant::now() + RR_LIMIT;
    let start = Instant::now();
    // Threads made here are in this thread's namespace (A).
    let results: Vec<Result<Vec<f64>, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut rtts = Vec::new();
                    loop {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        if n >= total || failed.load(Ordering::Relaxed) {
                            return Ok(rtts);
                        }
                        if Instant::now() >= deadline || system::interrupted() {
                            failed.store(true, Ordering::Relaxed);
                            return Err(format!(
                                "not done within {} s (or interrupted)",
                                RR_LIMIT.as_secs()
                            ));
                        }
                        let sent = Instant::now();
                        let outcome = access.open(Target::Echo).and_then(|mut stream| {
                            let req = request(n as u64);
                            stream.write_all(&req).map_err(|e| format!("write: {e}"))?;
                            read_echo(&mut stream, &req)
                        });
                        if let Err(e) = outcome {
                            failed.store(true, Ordering::Relaxed);
                            return Err(format!("request {n}: {e}"));
                        }
                        rtts.push(sent.elapsed().as_secs_f64() * 1e6);
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a client thread panicked".into()))
            })
            .collect()
    });
    let seconds = start.elapsed().as_secs_f64();
    let mut all = Vec::with_capacity(total);
    for r in results {
        all.extend(r?);
    }
    Ok(Requests::from_rtts(all, seconds))
}

struct UdpFigures {
    p50_us: f64,
    p99_us: f64,
    lost: usize,
}

/// `probes` UDP round trips to B's echo through `path`, one at a time (each waits at most
/// [`UDP_WAIT`]), after [`UDP_WARM_UP`] uncounted ones.
fn udp_round_trips(path: UdpPath, probes: usize) -> Result<UdpFigures, String> {
    let socket = UdpSocket::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    socket
        .set_read_timeout(Some(UDP_WAIT))
        .map_err(|e| e.to_string())?;
    // SOCKS5's control connection lives as long as the association.
    let mut _control = None;
    let (relay, header) = match path {
        UdpPath::Forward(addr) => (addr, Vec::new()),
        UdpPath::Socks5 { proxy, target } => {
            let mut control = TcpStream::connect_timeout(&proxy, IO_TIMEOUT)
                .map_err(|e| format!("connect {proxy}: {e}"))?;
            control
                .set_read_timeout(Some(IO_TIMEOUT))
                .map_err(|e| e.to_string())?;
            // The client's own address: where its datagrams will come from.
            let from = match socket.local_addr().map_err(|e| e.to_string())? {
                SocketAddr::V4(a) => a,
                SocketAddr::V6(_) => return Err("an IPv6 client socket".into()),
            };
            let mut relay = socks5_request(&mut control, 3, from, "UDP ASSOCIATE")?;
            if relay.ip().is_unspecified() {
                relay.set_ip(proxy.ip());
            }
            _control = Some(control);
            // RFC 1928, 7: RSV RSV FRAG ATYP DST.ADDR DST.PORT, then the data.
            let mut header = vec![0, 0, 0, 1];
            header.extend_from_slice(&target.ip().octets());
            header.extend_from_slice(&target.port().to_be_bytes());
            (relay, header)
        }
    };
    let mut rtts = Vec::with_capacity(probes);
    let mut lost = 0;
    let mut buf = [0u8; 2048];
    for i in 0..(UDP_WARM_UP + probes) as u64 {
        system::check_interrupted()?;
        let mut datagram = header.clone();
        datagram.extend_from_slice(&i.to_be_bytes());
        let sent = Instant::now();
        socket
            .send_to(&datagram, relay)
            .map_err(|e| format!("send to {relay}: {e}"))?;
        // Late echoes of earlier probes are read past until this one's, or the wait ends.
        let answered = loop {
            let left = UDP_WAIT.saturating_sub(sent.elapsed());
            if left.is_zero() {
                break false;
            }
            socket
                .set_read_timeout(Some(left))
                .map_err(|e| e.to_string())?;
            match socket.recv_from(&mut buf) {
                Ok((n, _)) if n == datagram.len() && buf[n - 8..n] == i.to_be_bytes() => {
                    break true
                }
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    break false
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("receive: {e}")),
            }
        };
        if (i as usize) < UDP_WARM_UP {
            continue;
        }
        if answered {
            rtts.push(sent.elapsed().as_secs_f64() * 1e6);
        } else {
            lost += 1;
        }
    }
    if rtts.is_empty() {
        return Err(format!("none of {probes} datagrams came back"));
    }
    Ok(UdpFigures {
        p50_us: percentile(&rtts, 0.50),
        p99_us: percentile(&rtts, 0.99),
        lost,
    })
}

/// A UDP echo server on a thread that entered a namespace; stops when dropped.
struct UdpEcho {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl UdpEcho {
    fn start(ns: &NetNs, addr: SocketAddr) -> Result<UdpEcho, String> {
        let socket = ns
            .in_ns(move || UdpSocket::bind(addr))
            .map_err(|e| format!("the UDP echo cannot bind {addr}: {e}"))?;
        // Wakes every 100 ms to see the stop flag.
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .map_err(|e| e.to_string())?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            // Bounded even if never stopped: at most an hour.
            let deadline = Instant::now() + Duration::from_secs(3600);
            while !stopping.load(Ordering::SeqCst) && Instant::now() < deadline {
                if let Ok((n, from)) = socket.recv_from(&mut buf) {
                    let _ = socket.send_to(&buf[..n], from);
                }
            }
        });
        Ok(UdpEcho {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for UdpEcho {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

// ----------------------------------------------------------------------------------------
// The report

/// `f(a's sample) / f(b's sample)` for each round both rows measured (finite ones only).
fn per_round(a: &Contender, b: &Contender, f: Metric) -> Vec<f64> {
    a.samples
        .iter()
        .filter_map(|sa| {
            let sb = b.samples.iter().find(|s| s.round == sa.round)?;
            let v = f(sa) / f(sb);
            v.is_finite().then_some(v)
        })
        .collect()
}

type Metric = fn(&Sample) -> f64;

/// Issue 47's targets: (what, tunneld's row, the row set against, metric, the ratio wanted,
/// whether it is a floor (at least) or a ceiling (below)).
const TARGETS: [(&str, Kind, Kind, Metric, f64, bool); 5] = [
    (
        "Gbit per proxy CPU-s (HTTP CONNECT), against the netstack proxy",
        Kind::TunneldHttp,
        Kind::Netstack,
        Sample::gbit_per_cpu,
        3.0,
        true,
    ),
    (
        "keep-alive requests per proxy CPU-s (HTTP CONNECT), against the netstack proxy",
        Kind::TunneldHttp,
        Kind::Netstack,
        Sample::keep_per_cpu,
        1.0,
        true,
    ),
    (
        "new-connection requests per proxy CPU-s (HTTP CONNECT), against the netstack proxy",
        Kind::TunneldHttp,
        Kind::Netstack,
        Sample::new_per_cpu,
        1.0,
        true,
    ),
    (
        "peak RSS (HTTP CONNECT), against the netstack proxy",
        Kind::TunneldHttp,
        Kind::Netstack,
        |s| s.peak_rss_kib,
        1.0,
        false,
    ),
    (
        "Gbit per proxy CPU-s (TCP forward), against onetun",
        Kind::TunneldForward,
        Kind::Onetun,
        Sample::gbit_per_cpu,
        10.0,
        true,
    ),
];

fn markdown(contenders: &[Contender], o: &Options, sizes: Sizes, measured: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{measured}\n\nProxies into a WireGuard tunnel with no TUN and no root, in namespace A, \
         to tunneld (`up`, TUN, one worker) in namespace B over a veth; the clients are \
         threads in A reaching B's servers through each proxy. {} round(s), interleaved, \
         medians. TCP 1 stream: {} s of one connection through the proxy (or forward) writing \
         as fast as it can, measured at B's sink (the writer stays within {} MiB of what the \
         sink has received). Keep-alive: {RR_CONNS} connections opened through the proxy \
         (one CONNECT or SOCKS5 request each), each keeping one {MESSAGE_BYTES}-byte request \
         in flight to B's echo server, {} round trips in all. New connection: {NEW_CONNS} \
         clients at once, each connecting to the proxy, passing its handshake, one \
         {MESSAGE_BYTES}-byte request and its echo, closing, {} requests in all (time from \
         connect to echo). UDP: {} round trips of 8 bytes, one at a time, through SOCKS5 \
         UDP ASSOCIATE (tunneld's HTTP and SOCKS5 rows: one process serves both) or a UDP \
         forward. Proxy CPU-s: the proxy process over the TCP stream; \"per proxy CPU-s\" \
         divides each phase's work by the proxy's CPU over that phase (B's tunneld and the \
         clients are not counted: they are the same for every row). Peak RSS: the proxy \
         process's VmHWM. Everything shares this machine's cores. {}\n",
        o.rounds,
        o.seconds,
        BULK_WINDOW >> 20,
        sizes.keep_rounds,
        sizes.new_requests,
        sizes.udp_probes,
        congestion_control_note(&o.tcp_cc),
    );
    let mut table = Table::new(&[
        "proxy (side A)",
        "rounds measured",
        "TCP 1 stream",
        "proxy CPU-s (stream)",
        "Gbit per proxy CPU-s",
        "keep-alive requests/s",
        "per proxy CPU-s",
        "p50",
        "p99",
        "new connection requests/s",
        "per proxy CPU-s",
        "p50",
        "p99",
        "UDP RTT p50",
        "p99",
        "peak RSS",
    ]);
    for c in contenders {
        if let Err(why) = &c.program {
            table.note(&c.name, why);
            continue;
        }
        let rounds = format!(
            "{} of {}",
            c.samples.len(),
            c.samples.len() + c.failures.len()
        );
        if c.samples.is_empty() {
            let mut cells = vec![c.name.clone(), rounds, "failed (below)".into()];
            cells.resize(16, String::new());
            table.row(&cells);
            continue;
        }
        let m = |f: Metric| median(c.samples.iter().map(f).collect());
        let (udp50, udp99) = match c.kind.udp() {
            Ok(_) => (
                cell(m(|s| s.udp_p50_us), 0, " µs"),
                cell(m(|s| s.udp_p99_us), 0, " µs"),
            ),
            Err(why) => (why.split(':').next().unwrap_or("n/a").into(), String::new()),
        };
        table.row(&[
            c.name.clone(),
            rounds,
            cell(m(Sample::gbits), 2, " Gbit/s"),
            cell(m(|s| s.bulk_cpu), 2, ""),
            cell(m(Sample::gbit_per_cpu), 2, ""),
            cell(m(|s| s.keep_rps), 0, ""),
            cell(m(Sample::keep_per_cpu), 0, ""),
            cell(m(|s| s.keep_p50_us), 0, " µs"),
            cell(m(|s| s.keep_p99_us), 0, " µs"),
            cell(m(|s| s.new_rps), 0, ""),
            cell(m(Sample::new_per_cpu), 0, ""),
            cell(m(|s| s.new_p50_us), 0, " µs"),
            cell(m(|s| s.new_p99_us), 0, " µs"),
            udp50,
            udp99,
            cell(m(|s| s.peak_rss_kib) / 1024.0, 1, " MiB"),
        ]);
    }
    out.push_str(table.render());
    let mut notes = Vec::new();
    for c in contenders.iter().filter(|c| !c.samples.is_empty()) {
        if let Err(why) = c.kind.udp() {
            notes.push(format!("UDP of {}: {why}.", c.name));
        }
        let lost: f64 = c
            .samples
            .iter()
            .map(|s| s.udp_lost)
            .filter(|v| v.is_finite())
            .sum();
        if lost > 0.0 {
            notes.push(format!(
                "{}: {lost} UDP datagrams of {} lost (not in the percentiles).",
                c.name,
                c.samples.len() * sizes.udp_probes
            ));
        }
    }
    if !notes.is_empty() {
        let _ = writeln!(out, "\n{}", notes.join("\n"));
    }
    let failures: Vec<String> = contenders
        .iter()
        .flat_map(|c| {
            c.failures.iter().map(|(round, why)| {
                format!("- {}, round {round}: {}", c.name, why.replace('|', "\\|"))
            })
        })
        .collect();
    if !failures.is_empty() {
        let _ = writeln!(
            out,
            "\nFailed rounds (left out of the medians):\n\n{}",
            failures.join("\n")
        );
    }

    let _ = writeln!(
        out,
        "\nIssue 47's targets for `tunneld proxy` (each ratio within one round, then the \
         median over the rounds and their range):\n"
    );
    let _ = writeln!(out, "| tunneld proxy's | wanted | measured | |");
    let _ = writeln!(out, "|---|---:|---:|---|");
    let row = |kind: Kind| contenders.iter().find(|c| c.kind == kind);
    for (what, ours, against, metric, wanted, floor) in TARGETS {
        let (measured_cell, verdict) = match (row(ours), row(against)) {
            (Some(u), Some(other)) if !u.samples.is_empty() && !other.samples.is_empty() => {
                let values = per_round(u, other, metric);
                let mid = median(values.clone());
                let met = if floor { mid >= wanted } else { mid < wanted };
                let verdict = if !mid.is_finite() {
                    "no figure"
                } else if met {
                    "met"
                } else {
                    "**not met**"
                };
                (spread(&values, "×", 2), verdict)
            }
            (Some(u), _) if u.program.is_err() => ("–".to_string(), "pending: not built"),
            (Some(_), Some(_)) => ("–".to_string(), "no measurement"),
            _ => ("–".to_string(), "pending: a row is not in this run"),
        };
        let sign = if floor { "≥" } else { "<" };
        let _ = writeln!(
            out,
            "| {what} | {sign} {wanted}× | {measured_cell} | {verdict} |"
        );
    }
    out
}

/// Which congestion control the kernel's TCP ran here: B's servers' sockets (the far end of
/// every proxied connection) take the namespaces' default; the proxies' stacks run their own,
/// and the clients' connections to them stay on loopback.
fn congestion_control_note(cc: &str) -> String {
    let used = match report::namespaces_congestion_control(cc) {
        Ok(()) => cc.to_string(),
        Err((host, allowed)) => {
            format!("{host} (the host's: it lets a namespace default only to {allowed})")
        }
    };
    format!(
        "TCP congestion control of B's sockets: {used}, the namespaces' default; the proxies' \
         stacks run their own."
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;
    use std::net::TcpListener;

    /// A one-connection server on loopback that, step by step, reads so many bytes and
    /// answers with the step's bytes; hands back all it read.
    fn serve_once(script: &'static [(usize, &'static [u8])]) -> (SocketAddr, JoinHandle<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let thread = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut all = Vec::new();
            for (reads, reply) in script {
                let mut got = vec![0u8; *reads];
                s.read_exact(&mut got).unwrap();
                all.extend(got);
                s.write_all(reply).unwrap();
            }
            all
        });
        (addr, thread)
    }

    #[test]
    fn http_connect_asks_for_the_target_and_reads_the_answer() {
        let to: SocketAddr = "10.77.0.2:5302".parse().unwrap();
        let request = format!("CONNECT {to} HTTP/1.1\r\nHost: {to}\r\n\r\n");
        // The request's length: "CONNECT 10.77.0.2:5302 HTTP/1.1\r\nHost: 10.77.0.2:5302\r\n\r\n".
        assert_eq!(request.len(), 57);
        let (addr, server) = serve_once(&[(57, b"HTTP/1.1 200 OK\r\nX: y\r\n\r\n")]);
        let mut s = TcpStream::connect(addr).unwrap();
        http_connect(&mut s, to).unwrap();
        assert_eq!(server.join().unwrap(), request.as_bytes());

        let (addr, _server) = serve_once(&[(57, b"HTTP/1.1 502 Bad Gateway\r\n\r\n")]);
        let mut s = TcpStream::connect(addr).unwrap();
        let err = http_connect(&mut s, to).unwrap_err();
        assert!(err.contains("502 Bad Gateway"), "{err}");
    }

    #[test]
    fn socks5_speaks_rfc_1928_and_reads_the_bound_address() {
        let to: SocketAddrV4 = "10.77.0.2:5303".parse().unwrap();
        let (addr, server) = serve_once(&[
            (3, b"\x05\x00"),
            (10, b"\x05\x00\x00\x01\x7f\x00\x00\x01\x1f\x90"),
        ]);
        let mut s = TcpStream::connect(addr).unwrap();
        let bound = socks5_request(&mut s, 3, to, "UDP ASSOCIATE").unwrap();
        assert_eq!(bound, "127.0.0.1:8080".parse::<SocketAddr>().unwrap());
        assert_eq!(
            server.join().unwrap(),
            [5, 1, 0, 5, 3, 0, 1, 10, 77, 0, 2, 0x14, 0xb7]
        );

        let (addr, _server) = serve_once(&[
            (3, b"\x05\x00"),
            (10, b"\x05\x05\x00\x01\x00\x00\x00\x00\x00\x00"),
        ]);
        let mut s = TcpStream::connect(addr).unwrap();
        let err = socks5_request(&mut s, 1, to, "CONNECT").unwrap_err();
        assert_eq!(err, "SOCKS5 CONNECT: refused (reply 5)");
    }

    #[test]
    fn the_tunneld_config_has_every_listener_the_rows_use() {
        let text = tunneld_proxy_config(
            "tp1",
            Path::new("/k/a.key"),
            "10.77.0.1",
            "PUB",
            "192.0.2.2:51820",
        );
        for needle in [
            "name = \"tp1\"",
            "private_key_file = \"/k/a.key\"",
            "address = [\"10.77.0.1/32\"]",
            "endpoint = \"192.0.2.2:51820\"",
            "allowed_ips = [\"10.77.0.2/32\"]",
            &format!("http = \"{HTTP_LISTEN}\""),
            &format!("socks5 = \"{SOCKS_LISTEN}\""),
            &format!("listen = \"{FORWARD_UDP}\"\nto = \"10.77.0.2:{UDP_ECHO_PORT}\""),
        ] {
            assert!(text.contains(needle), "no {needle} in\n{text}");
        }
        assert_eq!(text.matches("[[proxy.forward]]").count(), 3);
        let lines: Vec<String> = text.as_bytes().lines().map(Result::unwrap).collect();
        assert!(lines.iter().all(|l| !l.starts_with(' ')), "{text}");
    }

    fn row(kind: Kind, rounds: &[(usize, f64, f64)]) -> Contender {
        Contender {
            kind,
            name: format!("{kind:?}"),
            program: Ok(PathBuf::from("p")),
            samples: rounds
                .iter()
                .map(|&(round, gbit_per_cpu, rss)| Sample {
                    round,
                    bulk_bytes: gbit_per_cpu * 1e9 / 8.0,
                    bulk_seconds: 1.0,
                    bulk_cpu: 1.0,
                    keep_requests: 1000.0,
                    keep_cpu: 1.0,
                    new_requests: 100.0,
                    new_cpu: 1.0,
                    udp_p50_us: f64::NAN,
                    udp_p99_us: f64::NAN,
                    udp_lost: f64::NAN,
                    peak_rss_kib: rss,
                    ..Sample::default()
                })
                .collect(),
            failures: Vec::new(),
        }
    }

    #[test]
    fn targets_are_judged_round_by_round_with_rss_a_ceiling() {
        let http = row(Kind::TunneldHttp, &[(1, 3.0, 10.0), (2, 2.0, 10.0)]);
        let netstack = row(Kind::Netstack, &[(1, 1.0, 100.0), (2, 1.0, 5.0)]);
        let forward = row(Kind::TunneldForward, &[(1, 3.0, 10.0)]);
        let onetun = row(Kind::Onetun, &[(1, 0.1, 50.0)]);
        let o = parse_options(&["--quick".into()]).unwrap();
        let sizes = Sizes {
            keep_rounds: 1,
            new_requests: 1,
            udp_probes: 1,
        };
        let text = markdown(&[http, netstack, forward, onetun], &o, sizes, "Measured.");
        let line = |start: &str| {
            text.lines()
                .find(|l| l.starts_with(start))
                .unwrap_or_else(|| panic!("no line {start} in\n{text}"))
                .to_string()
        };
        // 3× and 2×: a median of 2.5×, under the 3× wanted.
        let gbit = line("| Gbit per proxy CPU-s (HTTP CONNECT)");
        assert!(
            gbit.contains("2.50× (2.00–3.00)") && gbit.ends_with("**not met** |"),
            "{gbit}"
        );
        assert!(line("| keep-alive requests").ends_with("| met |"));
        // RSS 0.1× and 2×: a median of 1.05×, not below 1×.
        assert!(line("| peak RSS").ends_with("**not met** |"));
        assert!(line("| Gbit per proxy CPU-s (TCP forward)").contains("30.00×"));
        assert!(text.contains("UDP of Netstack: n/a"), "{text}");
        assert!(text.contains("| Netstack | 2 of 2 |"), "{text}");

        let pending = Contender {
            program: Err("not in this tree".into()),
            ..row(Kind::TunneldHttp, &[])
        };
        let text = markdown(
            &[pending, row(Kind::Netstack, &[(1, 1.0, 1.0)])],
            &o,
            sizes,
            "M.",
        );
        assert_eq!(text.matches("pending: not built").count(), 4, "{text}");
    }

    #[test]
    fn the_go_proxy_pins_the_wireguard_go_the_bench_builds() {
        use crate::bench::WIREGUARD_GO_MODULE;
        let root = system::repo_root().unwrap();
        let go_mod = fs::read_to_string(root.join(NETSTACK_PROXY_SOURCE).join("go.mod")).unwrap();
        let (module, version) = WIREGUARD_GO_MODULE.split_once('@').unwrap();
        assert!(
            go_mod.contains(&format!("{module} {version}")),
            "{NETSTACK_PROXY_SOURCE}/go.mod must require {WIREGUARD_GO_MODULE}"
        );
    }
}
