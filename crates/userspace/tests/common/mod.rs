//! Shared pieces of the user-space tunnel's end-to-end tests: two namespaces joined by a
//! veth underlay (192.0.2.1 here, 192.0.2.2 there); the user-space tunnel's engine runs in
//! the first (its UDP socket is made there), a WireGuard peer (wireguard-go or a tunneld
//! gateway) with a TUN device in the second, and in-process servers entered into the second.

#![allow(dead_code)]

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tunneld_testnet::{unique_name, NetNs};
use tunneld_userspace::{PeerSettings, PrivateKey, PublicKey, Tunnel, TunnelSettings};

// Not every test binary that includes this module uses each.
#[allow(unused_imports)]
pub use tunneld_testnet::{pattern, wait_until, write_private, WAIT};
/// The user-space tunnel's underlay port (fixed, so the far side can be given it).
pub const NEAR_PORT: u16 = 51821;
pub const FAR_PORT: u16 = 51820;

pub fn step(what: &str) {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let t = START.get_or_init(Instant::now).elapsed();
    eprintln!("[step {:.1}s] {what}", t.as_secs_f64());
}

// Not every test binary that includes this module uses it.
#[allow(unused_imports)]
pub use tunneld_testnet::require_tool;

/// The tunneld binary next to this test's executable (`target/<profile>/tunneld`), built by
/// `cargo test --workspace`. Missing: `None` after saying why (a failure under
/// `TUNNELD_REQUIRE_ALL=1`).
pub fn tunneld_binary(test: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let path = exe.parent()?.parent()?.join("tunneld");
    let why = format!(
        "{} is missing; build it with `cargo build -p tunneld-cli` (cargo test --workspace does)",
        path.display()
    );
    tunneld_testnet::skip_unless(
        test,
        path.is_file(),
        "the test against a tunneld gateway",
        tunneld_testnet::Missing::Setup(&why),
    )
    .then_some(path)
}

/// The two sites with wireguard-go on the far side (`Sites::start_wireguard_go`); `None`
/// (a skip) without network namespaces, `wg` or wireguard-go.
pub fn wireguard_go_sites(test: &str) -> Option<Sites> {
    if !tunneld_testnet::require_netns(test)
        || !require_tool(test, "wg")
        || !require_tool(test, "wireguard-go")
    {
        return None;
    }
    let mut sites = sites();
    sites.start_wireguard_go();
    Some(sites)
}

/// The two sites. Fields drop in order: the peer process first, then the namespaces.
pub struct Sites {
    pub peer: Option<FarPeer>,
    pub near: NetNs,
    pub far: NetNs,
    pub near_if: String,
    pub far_if: String,
    pub near_key: PrivateKey,
    pub far_key: PrivateKey,
    pub dir: tempfile::TempDir,
}

pub fn sites() -> Sites {
    let near = NetNs::new();
    let far = NetNs::new();
    let (near_if, far_if) = tunneld_testnet::veth(&near, "192.0.2.1/24", &far, "192.0.2.2/24");
    Sites {
        peer: None,
        near,
        far,
        near_if,
        far_if,
        near_key: PrivateKey::generate(),
        far_key: PrivateKey::generate(),
        dir: tempfile::tempdir().unwrap(),
    }
}

/// The WireGuard process on the far side, stopped when dropped.
pub struct FarPeer {
    pub ifname: String,
    child: Option<Child>,
    log: PathBuf,
    what: &'static str,
}

impl FarPeer {
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops the process (SIGTERM, then SIGKILL) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            tunneld_testnet::stop_process(&mut child);
        }
        let _ = fs::remove_file(tunneld_testnet::uapi_socket_path(&self.ifname));
    }
}

impl Drop for FarPeer {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("--- {} log ---\n{}", self.what, self.log_text());
        }
    }
}

impl Sites {
    /// Starts wireguard-go on the far side, configured with `wg`: 10.77.0.2/24 and
    /// fd77::2/64, our tunnel its one peer.
    pub fn start_wireguard_go(&mut self) {
        let ifname = unique_name("wg");
        step(&format!(
            "start wireguard-go {ifname} in {}",
            self.far.name()
        ));
        let log = self.dir.path().join("wireguard-go.log");
        let child = tunneld_testnet::start_wireguard_go(&self.far, &ifname, &log);
        let mut peer = FarPeer {
            ifname: ifname.clone(),
            child: Some(child),
            log,
            what: "wireguard-go",
        };
        let key = write_private(self.dir.path(), "far.key", &self.far_key.to_base64());
        self.far.run(&[
            "wg",
            "set",
            &ifname,
            "private-key",
            &key.to_string_lossy(),
            "listen-port",
            &FAR_PORT.to_string(),
            "peer",
            &self.near_key.public_key().to_base64(),
            "endpoint",
            &format!("192.0.2.1:{NEAR_PORT}"),
            "allowed-ips",
            "10.77.0.1/32,fd77::1/128",
        ]);
        self.far
            .run(&["ip", "addr", "add", "10.77.0.2/24", "dev", &ifname]);
        self.far.run(&[
            "ip",
            "-6",
            "addr",
            "add",
            "fd77::2/64",
            "dev",
            &ifname,
            "nodad",
        ]);
        self.far
            .run(&["ip", "link", "set", &ifname, "mtu", "1420", "up"]);
        peer.ifname = ifname;
        self.peer = Some(peer);
    }

    /// Starts `tunneld up` on the far side with the same addresses; our tunnel its one peer.
    pub fn start_tunneld(&mut self, tunneld: &Path) {
        let ifname = match &self.peer {
            Some(p) => p.ifname.clone(),
            None => unique_name("wg"),
        };
        step(&format!("start tunneld {ifname} in {}", self.far.name()));
        write_private(self.dir.path(), "far.key", &self.far_key.to_base64());
        let config = format!(
            "[interface]\nname = \"{ifname}\"\nprivate_key_file = \"far.key\"\n\
             listen_port = {FAR_PORT}\naddress = [\"10.77.0.2/24\", \"fd77::2/64\"]\nmtu = 1420\n\n\
             [[peer]]\npublic_key = \"{}\"\nendpoint = \"192.0.2.1:{NEAR_PORT}\"\n\
             allowed_ips = [\"10.77.0.1/32\", \"fd77::1/128\"]\n",
            self.near_key.public_key().to_base64()
        );
        let path = self.dir.path().join("far.toml");
        fs::write(&path, config).unwrap();
        let log = self.dir.path().join("tunneld.log");
        let child = self
            .far
            .command(&tunneld.to_string_lossy())
            .arg("up")
            .arg(&path)
            .env("TUNNELD_LOG", "info")
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut peer = FarPeer {
            ifname: ifname.clone(),
            child: Some(child),
            log,
            what: "tunneld",
        };
        let far = &self.far;
        wait_until("tunneld's addresses", || {
            if let Some(Ok(Some(status))) = peer.child.as_mut().map(|c| c.try_wait()) {
                panic!("tunneld exited early ({status}):\n{}", peer.log_text());
            }
            let out = far.output(&["ip", "-o", "addr", "show", "dev", &ifname]);
            let text = String::from_utf8_lossy(&out.stdout);
            text.contains("10.77.0.2/24") && text.contains("fd77::2/64")
        });
        self.peer = Some(peer);
    }

    /// Our tunnel's settings: 10.77.0.1/24 and fd77::1/64, the far side its one peer.
    pub fn settings(&self, keepalive: u16) -> TunnelSettings {
        TunnelSettings::new(self.near_key.clone())
            .listen(format!("0.0.0.0:{NEAR_PORT}").parse().unwrap())
            .address("10.77.0.1/24".parse().unwrap())
            .address("fd77::1/64".parse().unwrap())
            .peer(
                PeerSettings::new(self.far_key.public_key())
                    .endpoint(format!("192.0.2.2:{FAR_PORT}").parse().unwrap())
                    .allowed_ip("10.77.0.2/32".parse().unwrap())
                    .allowed_ip("fd77::2/128".parse().unwrap())
                    .persistent_keepalive(keepalive),
            )
    }

    /// Starts our tunnel with its engine (and UDP socket) in the near namespace.
    pub fn start_tunnel(&self, settings: TunnelSettings) -> Tunnel {
        step("start the user-space tunnel");
        self.near
            .in_ns(move || Tunnel::start(settings))
            .unwrap_or_else(|e| panic!("the tunnel did not start: {e}"))
    }

    pub fn far_public(&self) -> PublicKey {
        self.far_key.public_key()
    }
}

/// A TCP echo server in a namespace: a thread per connection, echoing until EOF and then
/// closing. Stops accepting when dropped.
pub struct EchoServer {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EchoServer {
    pub fn start(ns: &NetNs, addrs: &[SocketAddr]) -> EchoServer {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let addrs = addrs.to_vec();
        let flag = stop.clone();
        let thread = ns.spawn_in_ns(move || {
            let listeners: Vec<TcpListener> = addrs
                .iter()
                .map(|a| {
                    let l = TcpListener::bind(a).unwrap_or_else(|e| panic!("bind {a}: {e}"));
                    l.set_nonblocking(true).unwrap();
                    l
                })
                .collect();
            ready_tx.send(()).unwrap();
            while !flag.load(Ordering::Relaxed) {
                let mut idle = true;
                for l in &listeners {
                    if let Ok((stream, _)) = l.accept() {
                        idle = false;
                        std::thread::spawn(move || echo(stream));
                    }
                }
                if idle {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        });
        ready_rx.recv_timeout(WAIT).expect("echo server started");
        EchoServer {
            stop,
            thread: Some(thread),
        }
    }
}

fn echo(mut stream: TcpStream) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(120)));
    let peer = stream.peer_addr().ok();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            // A signal handled by this process is not the peer's doing.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // Closing now, with the peer's data unread, resets the connection: say why,
                // so that a test that sees the reset shows its cause.
                eprintln!("echo server: reading from {peer:?}: {e}");
                break;
            }
            Ok(n) => {
                if let Err(e) = stream.write_all(&buf[..n]) {
                    eprintln!("echo server: writing to {peer:?}: {e}");
                    return;
                }
            }
        }
    }
    let _ = stream.shutdown(std::net::Shutdown::Write);
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `count` concurrent TCP streams through the tunnel to the echo server at port 7 (every
/// fourth over IPv6), of 0 to `max` bytes; each checks that its bytes came back intact.
pub async fn echo_streams(tunnel: &Tunnel, count: usize, max: usize) {
    step(&format!(
        "{count} concurrent echoed TCP streams of up to {max} bytes"
    ));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..count {
        let tunnel = tunnel.clone();
        let len = if count > 1 {
            max * i / (count - 1)
        } else {
            max
        };
        let target: SocketAddr = if i % 4 == 3 {
            "[fd77::2]:7".parse().unwrap()
        } else {
            "10.77.0.2:7".parse().unwrap()
        };
        tasks.spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let stream = tunnel
                .tcp_connect(target)
                .await
                .unwrap_or_else(|e| panic!("stream {i}: connect {target}: {e}"));
            assert_eq!(stream.peer_addr().unwrap(), target);
            let data = pattern(len, i as u32);
            // Half the streams use into_split, half tokio::io::split.
            let got = if i % 2 == 0 {
                let (mut r, mut w) = stream.into_split();
                let writer = tokio::spawn(async move {
                    w.write_all(&data).await?;
                    w.shutdown().await
                });
                let mut got = Vec::with_capacity(len);
                r.read_to_end(&mut got)
                    .await
                    .unwrap_or_else(|e| panic!("stream {i}: read: {e}"));
                writer
                    .await
                    .unwrap()
                    .unwrap_or_else(|e| panic!("stream {i}: write: {e}"));
                got
            } else {
                let (mut r, mut w) = tokio::io::split(stream);
                let writer = tokio::spawn(async move {
                    w.write_all(&data).await?;
                    w.shutdown().await
                });
                let mut got = Vec::with_capacity(len);
                r.read_to_end(&mut got)
                    .await
                    .unwrap_or_else(|e| panic!("stream {i}: read: {e}"));
                writer
                    .await
                    .unwrap()
                    .unwrap_or_else(|e| panic!("stream {i}: write: {e}"));
                got
            };
            assert_eq!(got.len(), len, "stream {i}: bytes echoed");
            assert!(
                got == pattern(len, i as u32),
                "stream {i}: echoed bytes differ"
            );
        });
    }
    while let Some(done) = tasks.join_next().await {
        if let Err(e) = done {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

/// A listener in our tunnel, reached from the far side over IPv4 and IPv6: the far side
/// sends 1 MiB on each connection and gets it echoed back.
pub async fn listen_reached_from_far(tunnel: &Tunnel, far: &NetNs) {
    step("tcp_listen in the tunnel, connected to from the far side");
    let listener = tunnel
        .tcp_listen("0.0.0.0:8000".parse().unwrap())
        .await
        .unwrap();
    assert_eq!(listener.local_addr().unwrap().port(), 8000);
    let server = tokio::spawn(async move {
        let mut peers = Vec::new();
        let mut echoes = Vec::new();
        for _ in 0..2 {
            let (stream, from) = listener.accept().await.unwrap();
            peers.push(from);
            echoes.push(tokio::spawn(async move {
                let (mut r, mut w) = tokio::io::split(stream);
                tokio::io::copy(&mut r, &mut w).await.unwrap();
                tokio::io::AsyncWriteExt::shutdown(&mut w).await.unwrap();
            }));
        }
        for e in echoes {
            e.await.unwrap();
        }
        peers
    });
    let client = far.spawn_in_ns(|| {
        for (n, target) in ["10.77.0.1:8000", "[fd77::1]:8000"].iter().enumerate() {
            let target: SocketAddr = target.parse().unwrap();
            let mut s = TcpStream::connect_timeout(&target, WAIT)
                .unwrap_or_else(|e| panic!("far side: connect {target}: {e}"));
            s.set_read_timeout(Some(WAIT)).unwrap();
            let data = pattern(1 << 20, 1000 + n as u32);
            let mut w = s.try_clone().unwrap();
            let sent = data.clone();
            let writer = std::thread::spawn(move || {
                w.write_all(&sent).unwrap();
                w.shutdown(std::net::Shutdown::Write).unwrap();
            });
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap_or_else(|e| {
                panic!(
                    "far side: reading the echo from {target}: {e} after {} bytes",
                    got.len()
                )
            });
            writer.join().unwrap();
            assert!(
                got == data,
                "far side: echo from {target} differs ({} bytes)",
                got.len()
            );
        }
    });
    let peers = server.await.unwrap();
    client.join().unwrap();
    assert!(peers[0].is_ipv4() && peers[1].is_ipv6(), "peers: {peers:?}");
}

/// UDP both ways: our socket to an echo server on the far side (IPv4 and IPv6), and the
/// far side to a socket bound in our tunnel.
/// The tunnel's own addresses answer ping from the far side (smoltcp's echo reply: a
/// user-space peer looks alive to `ping` as a kernel one does), IPv4 and IPv6.
pub fn ping_answered_from_far(far: &NetNs) {
    step("ping the tunnel's addresses from the far side");
    for target in ["10.77.0.1", "fd77::1"] {
        let out = far.output(&["ping", "-c", "3", "-i", "0.2", "-W", "2", target]);
        assert!(
            out.status.success(),
            "ping {target} through the tunnel: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

pub async fn udp_both_ways(tunnel: &Tunnel, far: &NetNs) {
    step("UDP: to the far side and back, IPv4 and IPv6");
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let echo = far.spawn_in_ns(move || {
        let sockets: Vec<std::net::UdpSocket> = ["10.77.0.2:9", "[fd77::2]:9"]
            .iter()
            .map(|a| {
                let s = std::net::UdpSocket::bind(a).unwrap();
                s.set_nonblocking(true).unwrap();
                s
            })
            .collect();
        ready_tx.send(()).unwrap();
        let mut buf = [0u8; 2048];
        while !flag.load(Ordering::Relaxed) {
            let mut idle = true;
            for s in &sockets {
                if let Ok((n, from)) = s.recv_from(&mut buf) {
                    idle = false;
                    let _ = s.send_to(&buf[..n], from);
                }
            }
            if idle {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    ready_rx.recv_timeout(WAIT).unwrap();
    let socket = tunnel.udp_bind("0.0.0.0:0".parse().unwrap()).await.unwrap();
    for (k, target) in ["10.77.0.2:9", "[fd77::2]:9"].iter().enumerate() {
        let target: SocketAddr = target.parse().unwrap();
        for n in 0..20u32 {
            let msg = pattern(100 + 60 * n as usize, 7 * n + k as u32);
            // Sent again until answered: UDP may be lost (it is not, on a veth, but the
            // test says what it checks, not that the link is perfect).
            let mut buf = [0u8; 2048];
            let got = loop {
                socket.send_to(&msg, target).await.unwrap();
                match tokio::time::timeout(Duration::from_secs(1), socket.recv_from(&mut buf)).await
                {
                    Ok(r) => break r.unwrap(),
                    Err(_) => continue,
                }
            };
            assert_eq!(got, (msg.len(), target));
            assert_eq!(&buf[..got.0], &msg[..]);
        }
    }
    assert!(
        socket
            .send_to(&vec![0u8; 1500], "10.77.0.2:9".parse().unwrap())
            .await
            .is_err(),
        "a datagram larger than the MTU is refused"
    );
    stop.store(true, Ordering::Relaxed);
    echo.join().unwrap();

    step("UDP: from the far side to a socket in our tunnel, and the reply");
    let socket = tunnel.udp_bind("[::]:9000".parse().unwrap()).await.unwrap();
    let responder = tokio::spawn(async move {
        let mut buf = [0u8; 2048];
        for _ in 0..2 {
            let (n, from) = socket.recv_from(&mut buf).await.unwrap();
            let mut reply = b"re:".to_vec();
            reply.extend_from_slice(&buf[..n]);
            socket.send_to(&reply, from).await.unwrap();
        }
    });
    let client = far.spawn_in_ns(|| {
        for (target, bind) in [
            ("10.77.0.1:9000", "10.77.0.2:0"),
            ("[fd77::1]:9000", "[fd77::2]:0"),
        ] {
            let s = std::net::UdpSocket::bind(bind).unwrap();
            s.set_read_timeout(Some(WAIT)).unwrap();
            s.send_to(b"hello from far", target).unwrap();
            let mut buf = [0u8; 64];
            let (n, from) = s
                .recv_from(&mut buf)
                .unwrap_or_else(|e| panic!("far side: no reply from {target}: {e}"));
            assert_eq!(&buf[..n], b"re:hello from far");
            assert_eq!(from, target.parse::<SocketAddr>().unwrap());
        }
    });
    tokio::time::timeout(WAIT, responder)
        .await
        .expect("replies in time")
        .unwrap();
    client.join().unwrap();
}

/// A multi-threaded tokio runtime for a test.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}
