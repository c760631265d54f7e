//! `backend = "xdp"` end to end, in network namespaces joined by veths this test creates:
//! against itself, against wireguard-go, over an IPv6 underlay, beside the kernel's own
//! traffic on the same interface, with fragments, a neighbour whose MAC changes, signals and
//! kill -9, and a veth with two queues. Without root these tests skip (and fail when
//! TUNNELD_REQUIRE_ALL=1). The floods of e2e.rs run against an `xdp` gateway there.

mod common;

use common::*;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};
use tunneld_testnet::{unique_name, veth, NetNs};

const XDP: &str = "\n[dataplane]\nbackend = \"xdp\"\n";

/// Two sites as in `two_sites`, with the veth names, and a gateway in each.
struct XdpSites {
    ga: Gateway,
    gb: Gateway,
    ka: String,
    body_a: String,
    va: String,
    vb: String,
    a: NetNs,
    b: NetNs,
}

fn xdp_sites(extra_a: &str, extra_b: &str) -> XdpSites {
    sites_over(("192.0.2.1/24", "192.0.2.2/24"), extra_a, extra_b)
}

/// Two sites joined by a veth with these underlay addresses (CIDR), a gateway in each.
fn sites_over(underlay: (&str, &str), extra_a: &str, extra_b: &str) -> XdpSites {
    let a = NetNs::new();
    let b = NetNs::new();
    let (va, vb) = veth(&a, underlay.0, &b, underlay.1);
    let endpoint = |cidr: &str| -> String {
        let ip: std::net::IpAddr = cidr.split('/').next().unwrap().parse().unwrap();
        SocketAddr::new(ip, 51820).to_string()
    };
    let (ka, kb) = (genkey(), genkey());
    let (ia, ib) = (unique_name("wg"), unique_name("wg"));
    let body_a = site_body(1, &pubkey(&kb), &endpoint(underlay.1)) + extra_a;
    let body_b = site_body(2, &pubkey(&ka), &endpoint(underlay.0)) + extra_b;
    let ga = Gateway::start(&a, &ia, &ka, &body_a);
    let gb = Gateway::start(&b, &ib, &kb, &body_b);
    XdpSites {
        ga,
        gb,
        ka,
        body_a,
        va,
        vb,
        a,
        b,
    }
}

/// The kernel's UDP counters in `ns` (`Udp:` or `Udp6:` of /proc/net/snmp{,6}): datagrams
/// received and sent through UDP sockets, which AF_XDP traffic never touches.
fn kernel_udp(ns: &NetNs) -> (u64, u64) {
    let snmp = ns.run(&["cat", "/proc/net/snmp"]);
    let mut lines = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (lines.next().unwrap(), lines.next().unwrap());
    let field = |name: &str| -> u64 {
        let at = names.split_whitespace().position(|n| n == name).unwrap();
        values.split_whitespace().nth(at).unwrap().parse().unwrap()
    };
    let snmp6 = ns.run(&["cat", "/proc/net/snmp6"]);
    let v6 = |name: &str| -> u64 {
        snmp6
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map_or(0, |v| v.trim().parse().unwrap())
    };
    (
        field("InDatagrams") + v6("Udp6InDatagrams"),
        field("OutDatagrams") + v6("Udp6OutDatagrams"),
    )
}

/// Whether interface `ifname` in `ns` has an XDP program attached, as `ip link` shows it.
fn has_xdp(ns: &NetNs, ifname: &str) -> bool {
    let link = ns.run(&["ip", "-d", "link", "show", ifname]);
    link.contains("prog/xdp")
}

fn assert_xdp_backend(gateway: &Gateway) {
    let log = gateway.log_text();
    assert!(log.contains("dataplane backend: AF_XDP"), "{log}");
}

/// Two `xdp` gateways: pings both ways, v4 and v6, and 64 MiB of TCP each way intact, with
/// the kernel's UDP sockets left out of it (a few datagrams at most: the first to a
/// neighbour not yet resolved go through the kernel).
#[test]
fn two_xdp_gateways_carry_pings_and_64_mib_of_tcp_both_ways() {
    if !require_netns_and_wg("two_xdp_gateways_carry_pings_and_64_mib_of_tcp_both_ways") {
        return;
    }
    let s = xdp_sites(XDP, XDP);
    assert_xdp_backend(&s.ga);
    assert_xdp_backend(&s.gb);
    if std::env::var_os("TUNNELD_XDP_SHOW_LOG").is_some() {
        eprintln!("{}", s.gb.log_text());
    }
    assert!(has_xdp(&s.a, &s.va) && has_xdp(&s.b, &s.vb));
    ping(&s.a, "10.77.0.2");
    ping(&s.b, "10.77.0.1");
    ping(&s.a, "fd77::2");
    ping(&s.b, "fd77::1");
    let before = (kernel_udp(&s.a), kernel_udp(&s.b));
    tcp_transfer(&s.a, &s.b, "10.77.0.2:5101".parse().unwrap(), 64 << 20);
    tcp_transfer(&s.b, &s.a, "[fd77::1]:5102".parse().unwrap(), 64 << 20);
    let after = (kernel_udp(&s.a), kernel_udp(&s.b));
    step("the kernel's UDP sockets stayed out of it");
    for (side, (b, a)) in [("A", (before.0, after.0)), ("B", (before.1, after.1))] {
        // 128 MiB in about 95 000 datagrams each way.
        assert!(
            a.0 - b.0 < 100,
            "{side}: {} datagrams through the kernel's UDP receive",
            a.0 - b.0
        );
        assert!(
            a.1 - b.1 < 100,
            "{side}: {} datagrams through the kernel's UDP send",
            a.1 - b.1
        );
    }
    let dump = wg_dump(&s.a, &s.ga.ifname);
    assert!(dump[1][5].parse::<u64>().unwrap() > 64 << 20, "{dump:?}");
}

#[test]
fn an_xdp_gateway_and_wireguard_go_interoperate() {
    let test = "an_xdp_gateway_and_wireguard_go_interoperate";
    if !require_netns_and_wg(test) || !require_tool(test, "wireguard-go") {
        return;
    }
    let a = NetNs::new();
    let b = NetNs::new();
    veth(&a, "192.0.2.1/24", &b, "192.0.2.2/24");
    let (ka, kb) = (genkey(), genkey());
    let (ia, ib) = (unique_name("wg"), unique_name("wg"));
    let ga = Gateway::start(
        &a,
        &ia,
        &ka,
        &(site_body(1, &pubkey(&kb), "192.0.2.2:51820") + XDP),
    );
    assert_xdp_backend(&ga);
    let wg = WireguardGo::start(&b, &ib);
    wg.configure_as_site_2(&b, &kb, &ga.public_key, &["endpoint", "192.0.2.1:51820"]);
    // wireguard-go initiates (b pings first), then the other way round.
    ping(&b, "10.77.0.1");
    ping(&a, "10.77.0.2");
    ping(&a, "fd77::2");
    ping(&b, "fd77::1");
    tcp_transfer(&a, &b, "10.77.0.2:5103".parse().unwrap(), 64 << 20);
    tcp_transfer(&b, &a, "[fd77::1]:5104".parse().unwrap(), 64 << 20);
    drop(wg);
}

#[test]
fn xdp_gateways_over_an_ipv6_underlay() {
    if !require_netns_and_wg("xdp_gateways_over_an_ipv6_underlay") {
        return;
    }
    let s = sites_over(("fd00:192::1/64", "fd00:192::2/64"), XDP, XDP);
    let (a, b) = (&s.a, &s.b);
    assert_xdp_backend(&s.ga);
    assert_xdp_backend(&s.gb);
    ping(a, "10.77.0.2");
    ping(b, "fd77::1");
    let before = kernel_udp(b);
    tcp_transfer(a, b, "10.77.0.2:5105".parse().unwrap(), 16 << 20);
    tcp_transfer(b, a, "[fd77::1]:5106".parse().unwrap(), 16 << 20);
    let after = kernel_udp(b);
    assert!(after.0 - before.0 < 100, "{before:?} -> {after:?}");
}

/// While the tunnel carries a transfer, the same interface still serves the kernel: a ping
/// of the underlay address, a TCP connection and a UDP datagram to other ports.
#[test]
fn the_kernel_keeps_the_rest_of_the_interfaces_traffic() {
    if !require_netns_and_wg("the_kernel_keeps_the_rest_of_the_interfaces_traffic") {
        return;
    }
    let s = xdp_sites(XDP, XDP);
    ping(&s.a, "10.77.0.2");
    std::thread::scope(|scope| {
        let transfer = scope.spawn(|| {
            tcp_transfer(&s.a, &s.b, "10.77.0.2:5107".parse().unwrap(), 64 << 20);
        });
        the_kernels_own_traffic(&s);
        transfer.join().unwrap();
    });
}

fn the_kernels_own_traffic(s: &XdpSites) {
    ping(&s.a, "192.0.2.2");
    step("TCP to port 7100 of the underlay address");
    let listener = s.b.in_ns(|| TcpListener::bind("192.0.2.2:7100").unwrap());
    s.a.in_ns(|| {
        let mut stream =
            TcpStream::connect_timeout(&"192.0.2.2:7100".parse().unwrap(), WAIT).unwrap();
        std::io::Write::write_all(&mut stream, b"hello").unwrap();
    });
    let (mut accepted, _) = listener.accept().unwrap();
    let mut got = [0u8; 5];
    std::io::Read::read_exact(&mut accepted, &mut got).unwrap();
    assert_eq!(&got, b"hello");
    step("UDP to port 7101 of the underlay address");
    let socket = s.b.in_ns(|| UdpSocket::bind("192.0.2.2:7101").unwrap());
    socket.set_read_timeout(Some(WAIT)).unwrap();
    s.a.in_ns(|| {
        let out = UdpSocket::bind("192.0.2.1:0").unwrap();
        out.send_to(b"datagram", "192.0.2.2:7101").unwrap();
    });
    let mut buf = [0u8; 16];
    let (n, from) = socket.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"datagram");
    assert_eq!(from.ip().to_string(), "192.0.2.1");
}

/// A peer whose underlay MTU is smaller than its datagrams sends them in IP fragments, which
/// the XDP program passes on to the kernel: they reach tunneld through its UDP socket, intact.
#[test]
fn fragmented_datagrams_come_in_through_the_kernel() {
    if !require_netns_and_wg("fragmented_datagrams_come_in_through_the_kernel") {
        return;
    }
    // A on recvmmsg/sendmmsg with a 1300-byte underlay: its 1452-byte datagrams fragment.
    let s = xdp_sites("", XDP);
    s.a.run(&["ip", "link", "set", &s.va, "mtu", "1300"]);
    ping(&s.a, "10.77.0.2");
    let before = kernel_udp(&s.b);
    tcp_transfer(&s.a, &s.b, "10.77.0.2:5108".parse().unwrap(), 8 << 20);
    let after = kernel_udp(&s.b);
    let through_kernel = after.0 - before.0;
    // 8 MiB in about 6000 full-size datagrams, each in two fragments.
    assert!(
        through_kernel > 3000,
        "only {through_kernel} datagrams came in through the kernel"
    );
}

/// A's underlay MAC changes (and is announced, as `arp_notify` does): B's datagrams follow
/// it within a second.
#[test]
fn a_peer_whose_mac_changes_is_followed_within_a_second() {
    if !require_netns_and_wg("a_peer_whose_mac_changes_is_followed_within_a_second") {
        return;
    }
    let s = xdp_sites(XDP, XDP);
    ping(&s.a, "10.77.0.2");
    s.a.run(&[
        "sysctl",
        "-q",
        "-w",
        &format!("net.ipv4.conf.{}.arp_notify=1", s.va),
    ]);
    step("change A's MAC");
    s.a.run(&["ip", "link", "set", &s.va, "address", "02:00:5e:00:53:77"]);
    let changed = Instant::now();
    let mut answered = None;
    while changed.elapsed() < Duration::from_secs(5) {
        if s.a
            .output(&["ping", "-c", "1", "-W", "0.2", "10.77.0.2"])
            .status
            .success()
        {
            answered = Some(changed.elapsed());
            break;
        }
    }
    let took = answered.expect("no answer through the tunnel within 5 s of the MAC change");
    assert!(took < Duration::from_secs(1), "took {took:?}");
    tcp_transfer(&s.a, &s.b, "10.77.0.2:5109".parse().unwrap(), 4 << 20);
}

/// SIGTERM detaches the program; so does kill -9 (the program hangs on a link the process
/// held); a restart attaches one program again, and the tunnel works.
#[test]
fn signals_and_kill_9_leave_no_program_behind() {
    if !require_netns_and_wg("signals_and_kill_9_leave_no_program_behind") {
        return;
    }
    let mut s = xdp_sites(XDP, "");
    assert!(has_xdp(&s.a, &s.va));
    ping(&s.a, "10.77.0.2");
    step("SIGTERM");
    let status = s.ga.stop_with("TERM");
    assert!(status.success(), "{status}");
    assert!(
        !has_xdp(&s.a, &s.va),
        "{}",
        s.a.run(&["ip", "-d", "link", "show", &s.va])
    );
    let mut ga = s.restart_a();
    assert!(has_xdp(&s.a, &s.va));
    step("kill -9");
    ga.stop_with("KILL");
    wait_until("the program to go with the killed process", || {
        !has_xdp(&s.a, &s.va)
    });
    s.ga = s.restart_a();
    let link = s.a.run(&["ip", "-d", "link", "show", &s.va]);
    assert_eq!(link.matches("prog/xdp").count(), 1, "{link}");
    ping(&s.a, "10.77.0.2");
}

impl XdpSites {
    fn restart_a(&self) -> Gateway {
        Gateway::start(&self.a, &self.ga.ifname, &self.ka, &self.body_a)
    }
}

/// A veth with two queues and two workers on each side, the peer split in two sub-tunnels:
/// each worker's AF_XDP socket carries its share.
#[test]
fn two_queues_two_workers_each_socket_carries_traffic() {
    if !require_netns_and_wg("two_queues_two_workers_each_socket_carries_traffic") {
        return;
    }
    let a = NetNs::new();
    let b = NetNs::new();
    let (va, vb) = (unique_name("va"), unique_name("vb"));
    tunneld_testnet::run_ok(std::process::Command::new("ip").args([
        "link",
        "add",
        &va,
        "netns",
        a.name(),
        "numtxqueues",
        "2",
        "numrxqueues",
        "2",
        "type",
        "veth",
        "peer",
        "name",
        &vb,
        "netns",
        b.name(),
        "numtxqueues",
        "2",
        "numrxqueues",
        "2",
    ]));
    for (ns, ifname, addr) in [(&a, &va, "192.0.2.1/24"), (&b, &vb, "192.0.2.2/24")] {
        ns.run(&["ip", "addr", "add", addr, "dev", ifname]);
        ns.run(&["ip", "link", "set", ifname, "up"]);
    }
    let (ka, kb) = (genkey(), genkey());
    let (ia, ib) = (unique_name("wg"), unique_name("wg"));
    let two = "\n[dataplane]\nbackend = \"xdp\"\nworkers = 2\n";
    let body = |me: u8, peer: &str, at: &str| {
        site_body(me, peer, at).replace("allowed_ips", "parallel = 2\nallowed_ips") + two
    };
    let ga = Gateway::start(&a, &ia, &ka, &body(1, &pubkey(&kb), "192.0.2.2:51820"));
    let gb = Gateway::start(&b, &ib, &kb, &body(2, &pubkey(&ka), "192.0.2.1:51820"));
    for gw in [&ga, &gb] {
        let log = gw.log_text();
        assert!(log.contains("queues=2"), "{log}");
    }
    ping(&a, "10.77.0.2");
    let before = kernel_udp(&b);
    step("16 transfers at once, spread over the two sub-tunnels");
    std::thread::scope(|scope| {
        for i in 0..16u16 {
            let (a, b) = (&a, &b);
            scope.spawn(move || {
                let to: SocketAddr = format!("10.77.0.2:{}", 5200 + i).parse().unwrap();
                tcp_transfer(a, b, to, 1 << 20);
            });
        }
    });
    let after = kernel_udp(&b);
    assert!(after.0 - before.0 < 100, "{before:?} -> {after:?}");
    // Each worker received its sub-tunnel's datagrams itself (not from the other worker),
    // and not through the kernel's UDP socket (above): through its AF_XDP socket.
    let show = b.run(&[TUNNELD, "show", &gb.ifname]);
    let count_after = |line: &str, label: &str| -> u64 {
        line.split(label)
            .nth(1)
            .and_then(|r| r.split([' ', ',', ';']).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    for worker in ["worker 0:", "worker 1:"] {
        let line = show
            .lines()
            .find(|l| l.trim_start().starts_with(worker))
            .unwrap_or_else(|| panic!("no {worker} in\n{show}"));
        let received = count_after(line, "received ");
        let handed_in = count_after(line, "taken from other workers ");
        assert!(
            received > 1000 && handed_in < received / 4,
            "{worker} received {received}, {handed_in} of them from the other:\n{show}"
        );
    }
}

/// After set-up every thread of an `xdp` gateway holds only CAP_NET_ADMIN and CAP_BPF (the
/// address map is updated as the interface's addresses change), and the map follows a new
/// address: a datagram to it is carried by the AF_XDP socket, not the kernel's.
#[test]
fn an_xdp_gateway_keeps_net_admin_and_bpf_only_and_follows_new_addresses() {
    if !require_netns_and_wg(
        "an_xdp_gateway_keeps_net_admin_and_bpf_only_and_follows_new_addresses",
    ) {
        return;
    }
    let s = xdp_sites("", XDP);
    const NET_ADMIN_AND_BPF: u64 = (1 << 12) | (1 << 39);
    let mut threads = 0;
    for task in std::fs::read_dir(format!("/proc/{}/task", s.gb.pid())).unwrap() {
        let status = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap();
        for field in ["CapEff:", "CapPrm:", "CapBnd:"] {
            let value = status
                .lines()
                .find_map(|l| l.strip_prefix(field))
                .map(|v| u64::from_str_radix(v.trim(), 16).unwrap());
            assert_eq!(value, Some(NET_ADMIN_AND_BPF), "{field}\n{status}");
        }
        threads += 1;
    }
    assert!(
        threads >= 4,
        "main, worker, UAPI and next-hop threads: {threads}"
    );
    ping(&s.a, "10.77.0.2");
    step("a second address on B's underlay; A's peer endpoint moves to it");
    s.b.run(&["ip", "addr", "add", "192.0.2.12/24", "dev", &s.vb]);
    std::thread::sleep(Duration::from_millis(600));
    let peer_b = &s.gb.public_key;
    s.a.run(&[
        "wg",
        "set",
        &s.ga.ifname,
        "peer",
        peer_b,
        "endpoint",
        "192.0.2.12:51820",
    ]);
    let before = kernel_udp(&s.b);
    tcp_transfer(&s.a, &s.b, "10.77.0.2:5110".parse().unwrap(), 8 << 20);
    let after = kernel_udp(&s.b);
    assert!(after.0 - before.0 < 100, "{before:?} -> {after:?}");
}

/// `backend = "xdp"` where AF_XDP cannot run (here: without CAP_BPF) is refused at start-up
/// with one line that says why, and leaves nothing behind.
#[test]
fn xdp_without_cap_bpf_is_refused_with_the_reason() {
    let test = "xdp_without_cap_bpf_is_refused_with_the_reason";
    if !require_netns_and_wg(test) || !require_tool(test, "setpriv") {
        return;
    }
    let a = NetNs::new();
    let b = NetNs::new();
    let (va, _vb) = veth(&a, "192.0.2.1/24", &b, "192.0.2.2/24");
    let dir = tempfile::tempdir().unwrap();
    write_private(dir.path(), "private.key", &genkey());
    let ifname = unique_name("wg");
    let config = format!(
        "[interface]\nname = \"{ifname}\"\nprivate_key_file = \"private.key\"\n{}{XDP}",
        site_body(1, &pubkey(&genkey()), "192.0.2.2:51820")
    );
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config).unwrap();
    let out = output_bounded(
        a.command("setpriv")
            .args([
                "--inh-caps=-bpf,-sys_admin",
                "--bounding-set=-bpf,-sys_admin",
                "--",
            ])
            .arg(TUNNELD)
            .arg("up")
            .arg(&path),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started without CAP_BPF:\n{stderr}");
    let error = the_one_error_line(&stderr);
    assert!(
        error.contains("xdp") && error.contains("CAP_BPF"),
        "{stderr}"
    );
    assert!(!has_xdp(&a, &va));
    let links = a.run(&["ip", "link", "show"]);
    assert!(
        !links.contains(&ifname),
        "the interface was left behind:\n{links}"
    );
}

/// The UDP datagrams from `from` port 51820 in `frames` (Ethernet, then IPv4 or IPv6): for
/// each, its checksum field, the full checksum it should hold, and the pseudo-header's sum
/// alone (what a device that completes checksums is handed).
fn udp_checksums(frames: &[Vec<u8>], from: IpAddr) -> Vec<(u16, u16, u16)> {
    fn sum(bytes: &[u8]) -> u32 {
        bytes
            .chunks(2)
            .map(|p| u32::from(u16::from_be_bytes([p[0], *p.get(1).unwrap_or(&0)])))
            .sum()
    }
    fn fold(mut s: u32) -> u16 {
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        s as u16
    }
    let mut found = Vec::new();
    for f in frames {
        let Some(ip) = f.get(14..) else { continue };
        let (src, dst, segment): (&[u8], &[u8], &[u8]) = match (f[12], f[13], from) {
            (0x08, 0x00, IpAddr::V4(_)) if ip.len() >= 20 && ip[9] == 17 => {
                let (ihl, total) = (
                    usize::from(ip[0] & 0xf) * 4,
                    usize::from(u16::from_be_bytes([ip[2], ip[3]])),
                );
                (&ip[12..16], &ip[16..20], &ip[ihl..total.min(ip.len())])
            }
            (0x86, 0xdd, IpAddr::V6(_)) if ip.len() >= 40 && ip[6] == 17 => {
                let len = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
                (&ip[8..24], &ip[24..40], &ip[40..(40 + len).min(ip.len())])
            }
            _ => continue,
        };
        let source: IpAddr = match from {
            IpAddr::V4(_) => <[u8; 4]>::try_from(src).unwrap().into(),
            IpAddr::V6(_) => <[u8; 16]>::try_from(src).unwrap().into(),
        };
        if source != from || segment.len() < 8 || segment[0..2] != 51820u16.to_be_bytes() {
            continue;
        }
        let pseudo = sum(src) + sum(dst) + 17 + segment.len() as u32;
        let field = u16::from_be_bytes([segment[6], segment[7]]);
        let full = match !fold(pseudo + sum(&segment[..6]) + sum(&segment[8..])) {
            0 => 0xffff,
            c => c,
        };
        found.push((field, full, fold(pseudo)));
    }
    found
}

/// Pings B's tunnel address from A while capturing what B's underlay interface receives:
/// the checksums of A's datagrams (see `udp_checksums`), at least 5 of them.
fn checksums_of_a_ping(s: &XdpSites, a_underlay: IpAddr) -> Vec<(u16, u16, u16)> {
    let vb = s.vb.clone();
    let capture = s.b.spawn_in_ns(move || {
        tunneld_testnet::link::capture_received(&vb, Duration::from_secs(4), 40)
    });
    std::thread::sleep(Duration::from_millis(200));
    let out =
        s.a.output(&["ping", "-c", "10", "-i", "0.05", "-W", "2", "10.77.0.2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let frames = capture.join().unwrap().expect("capture on the underlay");
    let found = udp_checksums(&frames, a_underlay);
    assert!(
        found.len() >= 5,
        "{} of A's datagrams in {} frames",
        found.len(),
        frames.len()
    );
    found
}

/// TX checksum offload. With the interface's TX checksumming on, an xdp gateway leaves its
/// UDP checksums to the device: a veth never finishes them (its peer's kernel takes them as
/// checked, as it does the kernel's own UDP sockets' datagrams), so the frames B receives
/// hold just the pseudo-header's sum, which shows the request went with them. Turned off
/// under the running gateway, the kernel finishes them on the way out: every checksum on
/// the wire is right, so the request named the right place. Started with it off, tunneld
/// computes them itself: right too. Over IPv4 and IPv6 underlays.
#[test]
fn udp_checksums_are_left_to_the_device_and_right_on_the_wire() {
    if !require_netns_and_wg("udp_checksums_are_left_to_the_device_and_right_on_the_wire") {
        return;
    }
    for underlay in [
        ("192.0.2.1/24", "192.0.2.2/24"),
        ("fd00:192::1/64", "fd00:192::2/64"),
    ] {
        let a_underlay: IpAddr = underlay.0.split('/').next().unwrap().parse().unwrap();
        let mut s = sites_over(underlay, XDP, "");
        let log = s.ga.log_text();
        assert!(log.contains("udp_checksums=device"), "{log}");
        ping(&s.a, "10.77.0.2");
        step("the device's checksumming on: the frames carry the request");
        for (field, full, partial) in checksums_of_a_ping(&s, a_underlay) {
            assert_eq!(
                field, partial,
                "not left to the device (full would be {full:#x})"
            );
        }
        step("turned off under the gateway: the kernel finishes them");
        let va = s.va.clone();
        s.a.in_ns(move || tunneld_testnet::link::set_tx_checksumming(&va, false))
            .expect("ethtool -K tx off");
        for (field, full, _) in checksums_of_a_ping(&s, a_underlay) {
            assert_eq!(field, full, "a wrong checksum on the wire");
        }
        step("started with it off: tunneld computes them");
        let status = s.ga.stop_with("TERM");
        assert!(status.success(), "{status}");
        s.ga = s.restart_a();
        let log = s.ga.log_text();
        assert!(
            log.contains("udp_checksums=software (the interface's TX checksumming is off)"),
            "{log}"
        );
        ping(&s.a, "10.77.0.2");
        for (field, full, _) in checksums_of_a_ping(&s, a_underlay) {
            assert_eq!(field, full, "a wrong checksum on the wire");
        }
    }
}
