//! `tunneld proxy`, run as an unprivileged user with no capability, in network namespaces
//! this test creates. A "site" namespace runs `tunneld up` (TUN, 10.77.0.1/24) with services
//! behind it: an HTTP server, a TCP and a UDP echo, and dnsmasq as the tunnel's DNS (the
//! only one that knows `web.corp.test`). A "laptop" namespace, joined to it by a veth
//! underlay, runs two proxies as uid 65534: one open, one with a users file. Through them:
//! curl (SOCKS5 with remote names, the HTTP proxy's CONNECT and GET), `nc -X 5`/`-X connect`
//! as `ssh -o ProxyCommand` runs it, a DNS query through SOCKS5 UDP ASSOCIATE, RFC 1929 and
//! Basic authentication, forwards both ways (TCP and UDP), `wg show` and `tunneld show`,
//! a metrics scrape, bad input (malformed SOCKS, oversized and stalled HTTP, a stalled
//! client), 10 000 connections opened and dropped, and SIGTERM. One set-up serves every
//! step, to keep the run short.

mod common;

use common::*;
use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tunneld_testnet::NetNs;

const NAME: &str = "web.corp.test";
/// The user the proxies run as (nobody): no capability, owns only its files.
const UID: u32 = 65534;
const BIG: usize = 8 << 20;

/// Serves, in the current thread's namespace, until the process ends: HTTP on :80 (`/big`
/// is [`BIG`] bytes; any other path is echoed in the body), a TCP echo on :7 (echoes until
/// the client's FIN, then closes) and a UDP echo on :7.
fn site_services() {
    let http = TcpListener::bind("0.0.0.0:80").unwrap();
    std::thread::spawn(move || {
        for stream in http.incoming().flatten() {
            std::thread::spawn(move || serve_http(stream));
        }
    });
    tcp_echo("0.0.0.0:7");
    udp_echo("0.0.0.0:7");
}

fn serve_http(mut stream: TcpStream) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let path = head.split(' ').nth(1).unwrap_or("").to_string();
    let body = if path == "/big" {
        vec![b'x'; BIG]
    } else {
        // The request line and headers as received, so the test sees what the proxy sent.
        format!("hello from the site: {path}\n{head}").into_bytes()
    };
    let _ = stream.write_all(
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    let _ = stream.write_all(&body);
}

fn tcp_echo(addr: &str) {
    let listener = TcpListener::bind(addr).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut read = stream.try_clone().unwrap();
                let mut write = stream;
                let _ = std::io::copy(&mut read, &mut write);
                let _ = write.shutdown(std::net::Shutdown::Write);
            });
        }
    });
}

fn udp_echo(addr: &str) {
    let socket = UdpSocket::bind(addr).unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while let Ok((n, from)) = socket.recv_from(&mut buf) {
            let _ = socket.send_to(&buf[..n], from);
        }
    });
}

/// A `tunneld proxy` running as [`UID`] in a namespace; stopped when dropped.
struct ProxyProcess {
    name: String,
    dir: tempfile::TempDir,
    log: PathBuf,
    child: Option<Child>,
}

fn chown(path: &Path) {
    std::os::unix::fs::chown(path, Some(UID), Some(UID)).unwrap();
}

impl ProxyProcess {
    /// Writes the key (and `users`, if any) owned by [`UID`], mode 600, then the config
    /// (`[interface]` with them, then `body`), and starts the proxy as that user.
    fn start(ns: &NetNs, key: &str, users: Option<&str>, body: &str) -> ProxyProcess {
        let name = tunneld_testnet::unique_name("px");
        step(&format!("tunneld proxy {name} as uid {UID}"));
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        write_private(dir.path(), "proxy.key", key);
        chown(&dir.path().join("proxy.key"));
        if let Some(users) = users {
            write_private(dir.path(), "users", users);
            chown(&dir.path().join("users"));
        }
        let runtime = dir.path().join("run");
        fs::create_dir(&runtime).unwrap();
        fs::set_permissions(&runtime, fs::Permissions::from_mode(0o700)).unwrap();
        chown(&runtime);
        let config = dir.path().join("proxy.toml");
        fs::write(
            &config,
            format!("[interface]\nname = \"{name}\"\nprivate_key_file = \"proxy.key\"\n{body}"),
        )
        .unwrap();
        let log = dir.path().join("proxy.log");
        let child = ns
            .command("setpriv")
            .args([
                &format!("--reuid={UID}"),
                &format!("--regid={UID}"),
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                TUNNELD,
                "proxy",
            ])
            .arg(&config)
            .env("XDG_RUNTIME_DIR", &runtime)
            .env_remove("RUNTIME_DIRECTORY")
            .env("TUNNELD_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut proxy = ProxyProcess {
            name,
            dir,
            log,
            child: Some(child),
        };
        let deadline = Instant::now() + WAIT;
        while !proxy.log_text().contains("proxy: tunnel ") {
            if let Some(status) = proxy.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("tunneld proxy exited ({status}):\n{}", proxy.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "not ready:\n{}",
                proxy.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        proxy
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    fn status_field(&self, field: &str) -> String {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .unwrap_or_else(|| panic!("no {field} in /proc/PID/status"))
            .trim()
            .to_string()
    }

    fn rss_kib(&self) -> u64 {
        self.status_field("VmRSS")
            .trim_end_matches(" kB")
            .trim()
            .parse()
            .unwrap()
    }

    fn socket(&self) -> PathBuf {
        self.dir
            .path()
            .join("run")
            .join("tunneld")
            .join(format!("{}.sock", self.name))
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            tunneld_testnet::stop_process(&mut child);
        }
        let _ =
            fs::remove_file(Path::new("/var/run/wireguard").join(format!("{}.sock", self.name)));
        if std::thread::panicking() {
            eprintln!("--- proxy log ({}) ---\n{}", self.name, self.log_text());
        }
    }
}

fn curl(ns: &NetNs, args: &[&str]) -> std::process::Output {
    let mut cmd = ns.command("curl");
    cmd.args(["-sS", "--max-time", "10"]).args(args);
    output_bounded(&mut cmd)
}

fn curl_ok(ns: &NetNs, args: &[&str]) -> String {
    let out = curl(ns, args);
    assert!(
        out.status.success(),
        "curl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A SOCKS5 client's negotiation without authentication, up to the request's reply.
fn socks_request(proxy: &str, command: u8, target: SocketAddr) -> (TcpStream, Vec<u8>) {
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&[5, 1, 0]).unwrap();
    let mut chosen = [0u8; 2];
    s.read_exact(&mut chosen).unwrap();
    assert_eq!(chosen, [5, 0]);
    let SocketAddr::V4(v4) = target else { panic!() };
    let mut request = vec![5, command, 0, 1];
    request.extend_from_slice(&v4.ip().octets());
    request.extend_from_slice(&v4.port().to_be_bytes());
    s.write_all(&request).unwrap();
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).unwrap();
    (s, reply.to_vec())
}

/// Whether the proxy closed `s` (EOF or reset) within its read timeout.
fn closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// Bytes sent on a raw SOCKS5 connection, and what comes back before the proxy closes.
fn socks_raw(proxy: &str, send: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(send).unwrap();
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    got
}

/// A DNS query for `name`'s A record.
fn dns_query(name: &str) -> Vec<u8> {
    let mut q = vec![0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// SO_LINGER with no time: closing sends a reset, as a client that vanishes does (and
/// leaves no TIME_WAIT behind to slow the next connections down).
fn reset_on_close(s: &TcpStream) {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on an open socket with a value of the size it is told.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0);
}

fn metric(text: &str, prefix: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

#[test]
fn tunneld_proxy_serves_without_privileges() {
    let test = "proxy";
    if !require_netns_and_wg(test)
        || !require_tool(test, "dnsmasq")
        || !require_tool(test, "curl")
        || !require_tool(test, "nc")
        || !require_tool(test, "setpriv")
    {
        return;
    }
    let site = NetNs::new();
    let laptop = NetNs::new();
    tunneld_testnet::veth(&laptop, "192.0.2.1/24", &site, "192.0.2.2/24");
    let (site_key, open_key, auth_key) = (genkey(), genkey(), genkey());
    let site_name = tunneld_testnet::unique_name("wg");
    let gateway = Gateway::start(
        &site,
        &site_name,
        &site_key,
        &format!(
            "listen_port = 51820\naddress = [\"10.77.0.1/24\"]\n\
             [[peer]]\npublic_key = \"{}\"\nallowed_ips = [\"10.77.0.2/32\"]\n\
             [[peer]]\npublic_key = \"{}\"\nallowed_ips = [\"10.77.0.3/32\"]\n",
            pubkey(&open_key),
            pubkey(&auth_key)
        ),
    );
    site.in_ns(site_services);
    step("dnsmasq in the site");
    let _dns = Dnsmasq::start(&site, "10.77.0.1", &format!("10.77.0.1 {NAME}\n"), &[]);
    // The reverse forwards' local ends, in the laptop.
    laptop.in_ns(|| {
        tcp_echo("127.0.0.1:18080");
        udp_echo("127.0.0.1:18053");
    });
    let peer = format!(
        "[[peer]]\npublic_key = \"{}\"\nendpoint = \"192.0.2.2:51820\"\nallowed_ips = [\"10.77.0.0/24\"]\npersistent_keepalive = 25\n",
        pubkey(&site_key)
    );
    let open = ProxyProcess::start(
        &laptop,
        &open_key,
        None,
        &format!(
            "address = [\"10.77.0.2/32\"]\n{peer}\n[metrics]\nlisten = \"127.0.0.1:9586\"\n\
             [proxy]\nsocks5 = \"127.0.0.1:1080\"\nhttp = \"127.0.0.1:8080\"\ndns = [\"10.77.0.1\"]\n\
             [[proxy.forward]]\nlisten = \"127.0.0.1:2222\"\nto = \"10.77.0.1:7\"\n\
             [[proxy.forward]]\nprotocol = \"udp\"\nlisten = \"127.0.0.1:2222\"\nto = \"{NAME}:7\"\n\
             [[proxy.reverse]]\nlisten = \"10.77.0.2:8080\"\nto = \"127.0.0.1:18080\"\n\
             [[proxy.reverse]]\nprotocol = \"udp\"\nlisten = \"10.77.0.2:8053\"\nto = \"127.0.0.1:18053\"\n"
        ),
    );
    let auth = ProxyProcess::start(
        &laptop,
        &auth_key,
        Some("# who may use the proxy\nalice:right horse\n"),
        &format!(
            "address = [\"10.77.0.3/32\"]\n{peer}\n\
             [proxy]\nsocks5 = \"127.0.0.1:1081\"\nhttp = \"127.0.0.1:8081\"\ndns = [\"10.77.0.1\"]\nusers_file = \"users\"\n"
        ),
    );
    step("the proxy has no capability and runs as nobody");
    assert_eq!(open.status_field("CapEff"), "0000000000000000");
    assert!(open.status_field("Uid").starts_with(&UID.to_string()));
    assert!(open
        .log_text()
        .contains(&open.socket().display().to_string()));

    // Stalled from the start: each is closed after the handshake timeout (10 s), while the
    // steps below are served meanwhile.
    let stalled_since = Instant::now();
    let (mut stalled_socks, mut stalled_http) = laptop.in_ns(|| {
        let socks = TcpStream::connect("127.0.0.1:1080").unwrap();
        let mut http = TcpStream::connect("127.0.0.1:8080").unwrap();
        http.write_all(b"GET http://10.77.0.1/ HTTP/1.1\r\nHost: 10")
            .unwrap();
        (socks, http)
    });

    step("ping from the site: the proxy's tunnel address answers, as a kernel peer would");
    let ping = site.output(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.77.0.2"]);
    assert!(
        ping.status.success(),
        "ping 10.77.0.2: {}",
        String::from_utf8_lossy(&ping.stdout)
    );

    step("curl --socks5-hostname: a name only the tunnel's DNS knows");
    let deadline = Instant::now() + Duration::from_secs(15);
    let body = loop {
        let out = curl(
            &laptop,
            &[
                "--socks5-hostname",
                "127.0.0.1:1080",
                &format!("http://{NAME}/hello"),
            ],
        );
        if out.status.success() {
            break String::from_utf8_lossy(&out.stdout).into_owned();
        }
        assert!(
            Instant::now() < deadline,
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(body.starts_with("hello from the site: /hello"), "{body}");

    step("curl through the HTTP proxy: a plain GET, hop-by-hop headers removed");
    let body = curl_ok(
        &laptop,
        &[
            "-x",
            "http://127.0.0.1:8080",
            "-H",
            "Keep-Alive: 5",
            &format!("http://{NAME}/plain?q=1"),
        ],
    );
    assert!(
        body.starts_with("hello from the site: /plain?q=1"),
        "{body}"
    );
    assert!(
        body.contains("GET /plain?q=1 HTTP/1.1\r\n"),
        "origin form: {body}"
    );
    assert!(body.contains("Connection: close\r\n"), "{body}");
    assert!(
        !body.contains("Keep-Alive") && !body.contains("Proxy-Connection"),
        "{body}"
    );

    step("curl --proxytunnel: CONNECT to a server without TLS");
    let body = curl_ok(
        &laptop,
        &[
            "-p",
            "-x",
            "http://127.0.0.1:8080",
            "http://10.77.0.1/tunnelled",
        ],
    );
    assert!(
        body.starts_with("hello from the site: /tunnelled"),
        "{body}"
    );

    step("a transfer through SOCKS5");
    let out = curl_ok(
        &laptop,
        &[
            "--socks5-hostname",
            "127.0.0.1:1080",
            "-o",
            "/dev/null",
            "-w",
            "%{size_download} %{speed_download}",
            &format!("http://{NAME}/big"),
        ],
    );
    let mut words = out.split(' ');
    assert_eq!(words.next().unwrap(), BIG.to_string());
    let speed: f64 = words.next().unwrap().parse().unwrap();
    eprintln!(
        "[measured] {BIG} bytes through SOCKS5: {:.1} MB/s",
        speed / 1e6
    );

    step("nc -X 5 and nc -X connect (ssh's ProxyCommand): bytes both ways, half-closes passed on");
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input");
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(&input, &data).unwrap();
    for (mode, proxy) in [("5", "127.0.0.1:1080"), ("connect", "127.0.0.1:8080")] {
        // Through a shell: output_bounded gives the command no standard input of its own.
        let script = format!(
            "nc -N -X {mode} -x {proxy} 10.77.0.1 7 < {}",
            input.display()
        );
        let out = output_bounded(laptop.command("sh").args(["-c", &script]));
        assert!(
            out.status.success(),
            "nc -X {mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.stdout == data,
            "nc -X {mode}: {} bytes back of {}",
            out.stdout.len(),
            data.len()
        );
    }

    step("a DNS query through SOCKS5 UDP ASSOCIATE");
    let answer = laptop.in_ns(|| {
        let (control, reply) = socks_request("127.0.0.1:1080", 3, "0.0.0.0:0".parse().unwrap());
        assert_eq!(reply[1], 0, "UDP ASSOCIATE refused: {reply:?}");
        let relay = SocketAddr::from((
            [reply[4], reply[5], reply[6], reply[7]],
            u16::from_be_bytes([reply[8], reply[9]]),
        ));
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        udp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut datagram = vec![0, 0, 0, 1, 10, 77, 0, 1, 0, 53];
        datagram.extend_from_slice(&dns_query(NAME));
        // A fragment is dropped (RFC 1928: FRAG != 0 is not reassembled).
        let mut fragment = datagram.clone();
        fragment[2] = 1;
        udp.send_to(&fragment, relay).unwrap();
        udp.send_to(&datagram, relay).unwrap();
        let mut buf = [0u8; 1500];
        let (n, _) = udp.recv_from(&mut buf).unwrap();
        drop(control);
        buf[..n].to_vec()
    });
    assert_eq!(
        &answer[..10],
        &[0, 0, 0, 1, 10, 77, 0, 1, 0, 53],
        "the reply's header names the server"
    );
    assert_eq!(
        &answer[10..12],
        &[0x12, 0x34],
        "the DNS answer to our query"
    );
    assert!(
        answer.ends_with(&[10, 77, 0, 1]),
        "{NAME} is 10.77.0.1: {answer:?}"
    );

    step("RFC 1929 and Basic authentication: right and wrong passwords");
    let url = format!("http://{NAME}/authed");
    let body = curl_ok(
        &laptop,
        &[
            "--socks5-hostname",
            "alice:right%20horse@127.0.0.1:1081",
            &url,
        ],
    );
    assert!(body.starts_with("hello from the site: /authed"), "{body}");
    let wrong = curl(
        &laptop,
        &["--socks5-hostname", "alice:wrong@127.0.0.1:1081", &url],
    );
    assert!(!wrong.status.success());
    let refused = laptop.in_ns(|| {
        let mut s = TcpStream::connect("127.0.0.1:1081").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(&[5, 1, 2, 1, 5]).unwrap();
        s.write_all(b"alice\x05wrong").unwrap();
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        got
    });
    assert_eq!(
        refused,
        [5, 2, 1, 1],
        "username/password chosen, then status 1 and closed"
    );
    let no_auth = laptop.in_ns(|| socks_raw("127.0.0.1:1081", &[5, 1, 0]));
    assert_eq!(
        no_auth,
        [5, 0xff],
        "no acceptable method without credentials"
    );
    let body = curl_ok(
        &laptop,
        &["-x", "http://alice:right%20horse@127.0.0.1:8081", &url],
    );
    assert!(body.starts_with("hello from the site: /authed"), "{body}");
    let code = curl(
        &laptop,
        &[
            "-x",
            "http://127.0.0.1:8081",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &url,
        ],
    );
    assert_eq!(String::from_utf8_lossy(&code.stdout), "407");

    step("SIGHUP: a new password and a new peer apply; a moved listener waits for a restart");
    let extra = pubkey(&genkey());
    fs::write(auth.dir.path().join("users"), "alice:new horse\n").unwrap();
    let config = auth.dir.path().join("proxy.toml");
    let text = fs::read_to_string(&config)
        .unwrap()
        .replace("127.0.0.1:1081", "127.0.0.1:1091")
        + &format!("\n[[peer]]\npublic_key = \"{extra}\"\nallowed_ips = [\"10.99.0.0/24\"]\n");
    fs::write(&config, text).unwrap();
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &auth.pid().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    wait_until("the reload is logged", || {
        auth.log_text()
            .contains("reload: 1 peer(s) added, 0 removed, 0 changed")
    });
    assert!(
        auth.log_text()
            .contains("[proxy] (but users_file, which reloads) changed"),
        "{}",
        auth.log_text()
    );
    let old = curl(
        &laptop,
        &[
            "--socks5-hostname",
            "alice:right%20horse@127.0.0.1:1081",
            &url,
        ],
    );
    assert!(!old.status.success(), "the old password no longer works");
    let body = curl_ok(
        &laptop,
        &[
            "--socks5-hostname",
            "alice:new%20horse@127.0.0.1:1081",
            &url,
        ],
    );
    assert!(body.starts_with("hello from the site: /authed"), "{body}");
    let shown = laptop.run(&[TUNNELD, "show", auth.socket().to_str().unwrap()]);
    assert!(
        shown.contains(&extra),
        "tunneld show lists the new peer: {shown}"
    );
    assert!(
        !auth.status_field("State").starts_with('Z'),
        "still running"
    );

    step("forwards: local TCP and UDP into the tunnel, and ports inside the tunnel to local ones");
    laptop.in_ns(|| {
        let mut s = TcpStream::connect("127.0.0.1:2222").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"through the forward").unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut back = String::new();
        s.read_to_string(&mut back).unwrap();
        assert_eq!(back, "through the forward");
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        udp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        udp.send_to(b"udp forward", "127.0.0.1:2222").unwrap();
        let mut buf = [0u8; 64];
        let (n, _) = udp.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"udp forward");
    });
    site.in_ns(|| {
        let mut s = TcpStream::connect("10.77.0.2:8080").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"reverse").unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut back = String::new();
        s.read_to_string(&mut back).unwrap();
        assert_eq!(back, "reverse");
        let udp = UdpSocket::bind("10.77.0.1:0").unwrap();
        udp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        udp.send_to(b"udp reverse", "10.77.0.2:8053").unwrap();
        let mut buf = [0u8; 64];
        let (n, from) = udp.recv_from(&mut buf).unwrap();
        assert_eq!(
            (&buf[..n], from),
            (&b"udp reverse"[..], "10.77.0.2:8053".parse().unwrap())
        );
    });

    step("wg show and tunneld show against the proxy's socket");
    let socket = open.socket();
    assert!(socket.exists(), "{}", socket.display());
    // `wg` only looks in /var/run/wireguard, which this user may not write: a link there.
    fs::create_dir_all("/var/run/wireguard").unwrap();
    let link = Path::new("/var/run/wireguard").join(format!("{}.sock", open.name));
    std::os::unix::fs::symlink(&socket, &link).unwrap();
    let wg = laptop.run(&["wg", "show", &open.name]);
    assert!(wg.contains(&format!("peer: {}", pubkey(&site_key))), "{wg}");
    assert!(wg.contains("latest handshake"), "{wg}");
    assert!(
        wg.contains(&format!("public key: {}", pubkey(&open_key))),
        "{wg}"
    );
    for which in [open.name.clone(), socket.display().to_string()] {
        let out = output_bounded(Command::new(TUNNELD).args(["show", &which]));
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "tunneld show {which}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            shown.contains(&format!("interface: {}", open.name)),
            "{shown}"
        );
        assert!(shown.contains(&pubkey(&site_key)), "{shown}");
    }
    step("wg set: peers change through the tunnel; the port is refused while it runs");
    let extra = pubkey(&genkey());
    laptop.run(&[
        "wg",
        "set",
        &open.name,
        "peer",
        &extra,
        "allowed-ips",
        "10.99.0.0/24",
    ]);
    let ips = laptop.run(&["wg", "show", &open.name, "allowed-ips"]);
    assert!(ips.contains(&format!("{extra}\t10.99.0.0/24")), "{ips}");
    let port = laptop.output(&["wg", "set", &open.name, "listen-port", "1"]);
    assert!(!port.status.success(), "a new listen port was taken");
    laptop.run(&["wg", "set", &open.name, "peer", &extra, "remove"]);
    assert!(!laptop
        .run(&["wg", "show", &open.name, "peers"])
        .contains(&extra));
    fs::remove_file(&link).unwrap();

    step("malformed SOCKS5 and HTTP: a reply where the RFC has one, then closed");
    laptop.in_ns(|| {
        let p = "127.0.0.1:1080";
        assert_eq!(
            socks_raw(p, &[4, 1, 0, 80, 10, 77, 0, 1, 0]),
            b"",
            "SOCKS4: closed"
        );
        assert_eq!(socks_raw(p, &[5, 0]), [5, 0xff], "zero methods");
        assert_eq!(socks_raw(p, &[5]), b"", "truncated greeting");
        assert_eq!(socks_raw(p, &[5, 1, 0, 5, 1]), [5, 0], "truncated request");
        assert_eq!(
            socks_raw(p, &[5, 1, 0, 4, 1, 0, 1]),
            [5, 0],
            "request of version 4"
        );
        let bind = socks_raw(p, &[5, 1, 0, 5, 2, 0, 1, 10, 77, 0, 1, 0, 7]);
        assert_eq!(&bind[..4], &[5, 0, 5, 7], "BIND: command not supported");
        let atyp = socks_raw(p, &[5, 1, 0, 5, 1, 0, 9, 1, 2, 3]);
        assert_eq!(&atyp[..4], &[5, 0, 5, 8], "address type not supported");
        let (_, reply) = socks_request(p, 1, "10.99.0.1:80".parse().unwrap());
        assert_eq!(reply[1], 3, "no peer routes 10.99.0.1: network unreachable");
        let (_, reply) = socks_request(p, 1, "10.77.0.1:9".parse().unwrap());
        assert_eq!(reply[1], 5, "nothing listens on port 9: connection refused");

        let h = "127.0.0.1:8080";
        let mut big = b"GET http://10.77.0.1/ HTTP/1.1\r\nX-Big: ".to_vec();
        big.extend(std::iter::repeat_n(b'a', 20_000));
        big.extend_from_slice(b"\r\n\r\n");
        let said = String::from_utf8_lossy(&socks_raw(h, &big)).into_owned();
        assert!(said.starts_with("HTTP/1.1 431 "), "{said}");
        for (request, status) in [
            (&b"GET /relative HTTP/1.1\r\nHost: x\r\n\r\n"[..], "400"),
            (b"BREW http HTTP/1.1\r\n\r\n", "400"),
            (b"nonsense\r\n\r\n", "400"),
            (b"CONNECT 10.77.0.1 HTTP/1.1\r\n\r\n", "400"),
            (b"GET https://10.77.0.1/ HTTP/1.1\r\n\r\n", "400"),
            (b"CONNECT 10.99.0.1:80 HTTP/1.1\r\n\r\n", "502"),
        ] {
            let said = String::from_utf8_lossy(&socks_raw(h, request)).into_owned();
            assert!(said.starts_with(&format!("HTTP/1.1 {status} ")), "{said}");
        }
    });

    step("stalled clients are closed after the handshake timeout; others were served meanwhile");
    for stalled in [&mut stalled_socks, &mut stalled_http] {
        stalled
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        assert!(closed(stalled), "a stalled client stays connected");
        let after = stalled_since.elapsed();
        assert!(
            after >= Duration::from_secs(9),
            "closed after {after:?}, before the timeout"
        );
    }

    step("10 000 connections opened and dropped: served after, none left open, memory back");
    let scrape = || curl_ok(&laptop, &["http://127.0.0.1:9586/metrics"]);
    let name = open.name.clone();
    let rss_before = open.rss_kib();
    let started = Instant::now();
    laptop.in_ns(|| {
        for batch in 0..20 {
            let mut streams = Vec::new();
            for i in 0..500 {
                let mut s = TcpStream::connect(if i % 2 == 0 {
                    "127.0.0.1:1080"
                } else {
                    "127.0.0.1:8080"
                })
                .unwrap();
                // Some say something first, some nothing.
                if batch % 2 == 0 {
                    let _ = s.write_all(if i % 2 == 0 {
                        &[5, 1, 0][..]
                    } else {
                        b"GET http://"
                    });
                }
                // Half vanish abruptly (a reset); the rest close (a FIN).
                if i % 4 < 2 {
                    reset_on_close(&s);
                }
                streams.push(s);
            }
        }
    });
    eprintln!(
        "[measured] 10 000 connections opened and dropped in {:?}",
        started.elapsed()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let metrics = scrape();
        // UDP forward sessions stay until idle (60 s): TCP connections are counted here.
        let open_tcp = ["socks5", "http"].iter().map(|kind| {
            metric(
                &metrics,
                &format!(
                    "tunneld_proxy_connections_active{{interface=\"{name}\",listener=\"{kind}\"}}"
                ),
            )
        });
        if open_tcp.sum::<u64>() == 0 {
            break metrics;
        }
        assert!(
            Instant::now() < deadline,
            "connections still open:\n{metrics}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let rss_after = open.rss_kib();
    eprintln!("[measured] proxy RSS {rss_before} KiB before, {rss_after} KiB after");
    assert!(
        rss_after <= rss_before + 16 * 1024,
        "RSS {rss_before} KiB before, {rss_after} KiB after"
    );
    assert!(
        metric(&metrics, "tunneld_proxy_connections_accepted_total") >= 10_000,
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("tunneld_peers{{interface=\"{}\"}} 1", open.name)),
        "{metrics}"
    );
    assert!(
        metric(&metrics, "tunneld_proxy_bytes_total{") > BIG as u64,
        "{metrics}"
    );
    assert!(
        metric(&metrics, "tunneld_proxy_udp_associations_total") >= 1,
        "{metrics}"
    );
    let body = curl_ok(
        &laptop,
        &[
            "--socks5-hostname",
            "127.0.0.1:1080",
            &format!("http://{NAME}/after"),
        ],
    );
    assert!(body.starts_with("hello from the site: /after"), "{body}");

    step("SIGTERM: exit 0, the socket removed");
    let mut open = open;
    let mut child = open.child.take().unwrap();
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}:\n{}", open.log_text());
    assert!(
        open.log_text().contains("SIGTERM: proxy stopped"),
        "{}",
        open.log_text()
    );
    assert!(!socket.exists());
    drop(auth);
    drop(gateway);
}

/// `tunneld check` takes a proxy config by the proxy's rules and refuses what `tunneld proxy`
/// refuses, one line naming the field; `tunneld up` refuses a proxy config; the example in
/// dist/ passes.
#[test]
fn proxy_configs_are_checked_by_the_proxy_rules() {
    let dir = tempfile::tempdir().unwrap();
    write_private(dir.path(), "corp.key", &genkey());
    write_private(dir.path(), "proxy-users", "alice:secret\n");
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../dist/proxy.toml");
    let good = fs::read_to_string(example).unwrap();
    let path = dir.path().join("proxy.toml");
    fs::write(&path, &good).unwrap();
    let out = output_bounded(Command::new(TUNNELD).arg("check").arg(&path));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let up = output_bounded(Command::new(TUNNELD).arg("up").arg(&path));
    let said = String::from_utf8_lossy(&up.stderr);
    assert!(!up.status.success());
    assert!(
        the_one_error_line(&said)
            .ends_with("[proxy]: this is a proxy config; run `tunneld proxy FILE`"),
        "{said}"
    );

    let base = good.split("[metrics]").next().unwrap().to_string();
    for (change, field) in [
        (format!("{good}\n[dataplane]\nworkers = 2\n"), "dataplane: "),
        (
            good.replace("listen_port = 51821", "listen_port = 51821\nfwmark = 1"),
            "interface.fwmark: ",
        ),
        (
            good.replace(
                "persistent_keepalive = 25",
                "persistent_keepalive = 25\nparallel = 2",
            ),
            "peer[0].parallel: ",
        ),
        (
            good.replace("resolve = \"tunnel\"", "resolve = \"nowhere\""),
            "proxy.resolve: ",
        ),
        (format!("{base}\n[proxy]\n"), "proxy: "),
        (
            good.replace("to = \"127.0.0.1:80\"", "to = \"web:80\""),
            "proxy.reverse[0].to: ",
        ),
    ] {
        fs::write(&path, &change).unwrap();
        let out = output_bounded(Command::new(TUNNELD).arg("check").arg(&path));
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{field}: check said ok");
        let lines: Vec<&str> = said.lines().collect();
        assert_eq!(lines.len(), 1, "{field}: one line: {said}");
        assert!(
            lines[0].contains(&format!("proxy.toml: {field}")),
            "{field}: {said}"
        );
        let run = output_bounded(Command::new(TUNNELD).arg("proxy").arg(&path));
        let run_said = String::from_utf8_lossy(&run.stderr);
        assert_eq!(
            the_one_error_line(&run_said).strip_prefix("tunneld: "),
            Some(lines[0]),
            "proxy refuses what check refuses"
        );
    }
    // A users file others may read is refused like a key file.
    fs::write(&path, &good).unwrap();
    fs::set_permissions(
        dir.path().join("proxy-users"),
        fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let out = output_bounded(Command::new(TUNNELD).arg("check").arg(&path));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(said.contains("proxy.toml: proxy.users_file: "), "{said}");
    assert_eq!(said.lines().count(), 1, "{said}");
}
