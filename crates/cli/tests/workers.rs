//! Several workers end to end, in network namespaces this test creates: a link between two
//! tunnelds split into two sub-tunnels (`parallel = 2`) carries flows on both workers of each
//! side, keeps every flow in order, and shows the spread in `tunneld show`.

mod common;

use common::*;
use std::net::UdpSocket;
use std::time::{Duration, Instant};
use tunneld_testnet::NetNs;

/// The tests here load both cores; run one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Datagrams per flow in the sequence-numbered UDP streams.
const DATAGRAMS: u32 = 20_000;

/// A source port from which a UDP flow 10.77.0.1 → 10.77.0.2:6000 hashes to sub-tunnel `sub`
/// of 2, by tunneld's own flow hash.
fn port_for_sub(sub: u32) -> u16 {
    (40_000u16..)
        .find(|port| {
            let mut p = [0u8; 28];
            p[0] = 0x45;
            p[9] = 17;
            p[12..16].copy_from_slice(&[10, 77, 0, 1]);
            p[16..20].copy_from_slice(&[10, 77, 0, 2]);
            p[20..22].copy_from_slice(&port.to_be_bytes());
            p[22..24].copy_from_slice(&6000u16.to_be_bytes());
            tunneld_wireguard::packet::flow_hash(&p) % 2 == sub
        })
        .unwrap()
}

/// Packets each worker sent into or received from the tunnel (`what`: "sent" or
/// "received"), from `tunneld show`'s "worker N: sent S packets …, received R packets" lines.
fn packets_per_worker(ns: &NetNs, ifname: &str, what: &str) -> Vec<u64> {
    let show = ns.run(&[TUNNELD, "show", ifname]);
    show.lines()
        .filter(|l| l.starts_with("worker "))
        .map(|l| {
            let after = l
                .split(&format!("{what} "))
                .nth(1)
                .unwrap_or_else(|| panic!("{show}"));
            after.split(' ').next().unwrap().parse().unwrap()
        })
        .collect()
}

/// TCP segments retransmitted in `ns` so far (`RetransSegs` of /proc/net/snmp, per namespace).
fn tcp_retransmits(ns: &NetNs) -> u64 {
    let snmp = ns.run(&["cat", "/proc/net/snmp"]);
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next().unwrap(), tcp.next().unwrap());
    let at = names
        .split_whitespace()
        .position(|n| n == "RetransSegs")
        .unwrap();
    values.split_whitespace().nth(at).unwrap().parse().unwrap()
}

/// Sends two sequence-numbered UDP flows from site A (10.77.0.1) to site B (10.77.0.2:6000),
/// one hashed onto each of two sub-tunnels, and checks that most of each arrived and that
/// nothing arrived out of order.
fn udp_flows_arrive_in_order(a: &NetNs, b: &NetNs) {
    let ports = [port_for_sub(0), port_for_sub(1)];
    let receiver = b.spawn_in_ns(move || {
        let socket = UdpSocket::bind("10.77.0.2:6000").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let mut seqs: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
        let mut buf = [0u8; 64];
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let Ok((n, from)) = socket.recv_from(&mut buf) else {
                break; // two seconds of silence: the senders are done
            };
            if n < 4 {
                continue;
            }
            if let Some(flow) = ports.iter().position(|p| *p == from.port()) {
                seqs[flow].push(u32::from_be_bytes(buf[..4].try_into().unwrap()));
            }
        }
        seqs
    });
    std::thread::sleep(Duration::from_millis(200));
    a.in_ns(move || {
        let sockets: Vec<UdpSocket> = ports
            .iter()
            .map(|p| {
                let s = UdpSocket::bind(("10.77.0.1", *p)).unwrap();
                s.connect("10.77.0.2:6000").unwrap();
                s
            })
            .collect();
        // A first datagram per flow (too short to count) brings up its sub-tunnel, which
        // asks for its handshake at a tick; until then the flow crosses on sub-tunnel 0, and
        // when it moves over it may be reordered once. The test is of the steady state.
        for s in &sockets {
            let _ = s.send(&[0]);
        }
        std::thread::sleep(Duration::from_millis(600));
        for seq in 0..DATAGRAMS {
            for s in &sockets {
                let _ = s.send(&seq.to_be_bytes());
            }
            // Bounded pace: a short pause every 16 datagrams keeps queues from overflowing.
            if seq % 16 == 15 {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    });
    let seqs = receiver.join().unwrap();
    for (flow, got) in seqs.iter().enumerate() {
        // UDP under load may drop some; a flow whose sub-tunnel swallowed it gets none.
        assert!(
            got.len() as u32 > DATAGRAMS / 4,
            "flow {flow}: only {} of {DATAGRAMS} datagrams arrived",
            got.len()
        );
        let reordered = got.windows(2).filter(|w| w[1] <= w[0]).count();
        assert_eq!(reordered, 0, "flow {flow}: datagrams out of order");
    }
}

#[test]
fn a_split_link_uses_both_workers_and_keeps_each_flow_in_order() {
    if !require_netns_and_wg("a_split_link_uses_both_workers_and_keeps_each_flow_in_order") {
        return;
    }
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Site A asks for one sub-tunnel per worker, which with two workers is what B says.
    let auto = "parallel = \"auto\"\n\n[dataplane]\nworkers = 2\n";
    let split = "parallel = 2\n\n[dataplane]\nworkers = 2\n";
    let (a, b) = two_sites();
    let (ka, kb) = (genkey(), genkey());
    let (ia, ib) = (
        tunneld_testnet::unique_name("wg"),
        tunneld_testnet::unique_name("wg"),
    );
    let body_a = site_body(1, &pubkey(&kb), "192.0.2.2:51820") + auto;
    let body_b = site_body(2, &pubkey(&ka), "192.0.2.1:51820") + split;
    let mut ga = Gateway::start(&a, &ia, &ka, &body_a);
    let _gb = Gateway::start(&b, &ib, &kb, &body_b);
    ping(&a, "10.77.0.2");

    step("two sequence-numbered UDP flows, one per sub-tunnel");
    udp_flows_arrive_in_order(&a, &b);
    // Each sub-tunnel's worker encrypts its flow at A and decrypts it at B.
    for (ns, ifname, what) in [(&a, &ia, "sent"), (&b, &ib, "received")] {
        let packets = packets_per_worker(ns, ifname, what);
        assert_eq!(packets.len(), 2, "two workers in `tunneld show`");
        assert!(
            packets.iter().all(|n| *n >= u64::from(DATAGRAMS / 4)),
            "both workers carry a flow ({what}): {packets:?}"
        );
    }

    // And which worker carries which sub-tunnel.
    let show = a.run(&[TUNNELD, "show", &ia]);
    let short: String = pubkey(&kb).chars().take(8).collect();
    for sub in 0..2 {
        assert!(
            show.contains(&format!("carries: {short}… (sub-tunnel {sub})")),
            "{show}"
        );
    }

    step("TCP across the split link: no retransmits from reordering");
    let before = tcp_retransmits(&a);
    tcp_transfer(&a, &b, "10.77.0.2:5010".parse().unwrap(), 32 << 20);
    let retransmits = tcp_retransmits(&a) - before;
    eprintln!("TCP retransmits over 32 MiB: {retransmits}");
    assert!(
        retransmits < 20,
        "{retransmits} TCP segments retransmitted over 32 MiB"
    );

    step("wg sees one interface: each peer once, its sub-tunnels' bytes added up");
    let dump = wg_dump(&a, &ia);
    assert_eq!(dump.len(), 2, "interface and one peer: {dump:?}");
    let tx: u64 = dump[1][6].parse().unwrap();
    assert!(
        tx > 32 << 20,
        "bytes sent to the peer, over both sub-tunnels: {tx}"
    );
    step("wg set reaches every worker");
    let newcomer = pubkey(&genkey());
    a.run(&[
        "wg",
        "set",
        &ia,
        "peer",
        &newcomer,
        "allowed-ips",
        "10.99.0.0/16",
    ]);
    let dump = wg_dump(&a, &ia);
    assert_eq!(dump.len(), 3, "the new peer is listed once: {dump:?}");
    let routes = a.run(&["ip", "-4", "route", "show", "dev", &ia]);
    assert!(routes.contains("10.99.0.0/16"), "{routes}");
    a.run(&["wg", "set", &ia, "peer", &newcomer, "remove"]);
    assert_eq!(wg_dump(&a, &ia).len(), 2);
    ping(&a, "10.77.0.2");

    step("SIGTERM stops every worker and removes the interface");
    assert!(ga.stop_with("TERM").success(), "{}", ga.log_text());
    assert!(!a.output(&["ip", "link", "show", &ia]).status.success());
    assert!(!socket_path(&ia).exists());
}

#[test]
fn a_split_link_to_a_side_that_does_not_split_loses_nothing() {
    if !require_netns_and_wg("a_split_link_to_a_side_that_does_not_split_loses_nothing") {
        return;
    }
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Site A splits the link in two; site B (a plain WireGuard peer, as far as it goes) does
    // not: sub-tunnel 1 never comes up and its flows go over sub-tunnel 0.
    let (a, b) = two_sites();
    let (ka, kb) = (genkey(), genkey());
    let (ia, ib) = (
        tunneld_testnet::unique_name("wg"),
        tunneld_testnet::unique_name("wg"),
    );
    let body_a = site_body(1, &pubkey(&kb), "192.0.2.2:51820")
        + "parallel = 2\n\n[dataplane]\nworkers = 2\n";
    let body_b = site_body(2, &pubkey(&ka), "192.0.2.1:51820");
    let ga = Gateway::start(&a, &ia, &ka, &body_a);
    let _gb = Gateway::start(&b, &ib, &kb, &body_b);
    ping(&a, "10.77.0.2");
    step("two UDP flows, one on each sub-tunnel");
    udp_flows_arrive_in_order(&a, &b);
    tcp_transfer(&a, &b, "10.77.0.2:5011".parse().unwrap(), 8 << 20);
    wait_until("the warning about the refused sub-tunnel", || {
        ga.log_text()
            .contains("Is `parallel = 2` set on the other side too?")
    });
}
