//! TCP MSS clamping (`[dataplane] clamp_mss`, issue 39), on the wire, in network namespaces
//! this test creates: hosts on both sides advertise an MSS for a 1500-byte LAN (the routes'
//! `advmss`, as a host behind a gateway does), and the SYN and the SYN-ACK that come out of
//! the tunnel carry the tunnel's (MTU 1420: 1380 over IPv4, 1360 over IPv6), both clamped by
//! site B's tunneld, one as it encrypts and one as it decrypts.

mod common;

use common::*;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;
use tunneld_testnet::NetNs;

/// Of each TCP SYN to or from a port: whether it is a SYN-ACK, and its MSS option.
type Syns = Vec<(bool, u16)>;

/// The MSS option of each TCP SYN (or SYN-ACK) to or from `port` among raw IP packets.
fn syn_mss(frames: &[Vec<u8>], port: u16) -> Syns {
    let mut found = Vec::new();
    for p in frames {
        let (tcp_at, is_tcp) = match p.first().map(|b| b >> 4) {
            Some(4) if p.len() >= 20 => (usize::from(p[0] & 0x0f) * 4, p[9] == 6),
            Some(6) if p.len() >= 40 => (40, p[6] == 6),
            _ => continue,
        };
        let Some(t) = p.get(tcp_at..).filter(|t| is_tcp && t.len() >= 20) else {
            continue;
        };
        let (sport, dport) = (
            u16::from_be_bytes([t[0], t[1]]),
            u16::from_be_bytes([t[2], t[3]]),
        );
        if t[13] & 0x02 == 0 || (sport != port && dport != port) {
            continue;
        }
        let header = (usize::from(t[12] >> 4) * 4).min(t.len());
        let mut at = 20;
        while at < header {
            match t[at] {
                0 => break,
                1 => at += 1,
                2 if at + 4 <= header => {
                    found.push((
                        t[13] & 0x10 != 0,
                        u16::from_be_bytes([t[at + 2], t[at + 3]]),
                    ));
                    break;
                }
                _ => at += usize::from(*t.get(at + 1).unwrap_or(&1)).max(2),
            }
        }
    }
    found
}

/// Connects from `a` to `to` (a listener in `b`) while capturing what each side's tunnel
/// interface receives; returns (the SYN as B received it, the SYN-ACK as A received it).
fn connect_and_capture(a: &NetNs, ia: &str, b: &NetNs, ib: &str, to: SocketAddr) -> (Syns, Syns) {
    let capture = |ns: &NetNs, ifname: &str| {
        let ifname = ifname.to_string();
        ns.spawn_in_ns(move || {
            tunneld_testnet::link::capture_received(&ifname, Duration::from_secs(3), 64)
                .expect("capture")
        })
    };
    let (at_b, at_a) = (capture(b, ib), capture(a, ia));
    let listener = b.spawn_in_ns(move || {
        let listener = TcpListener::bind(to).expect("listen");
        let _ = listener.accept();
    });
    std::thread::sleep(Duration::from_millis(500));
    a.in_ns(move || {
        let _stream = TcpStream::connect_timeout(&to, Duration::from_secs(5)).expect("connect");
        std::thread::sleep(Duration::from_millis(200));
    });
    listener.join().unwrap();
    let port = to.port();
    (
        syn_mss(&at_b.join().unwrap(), port),
        syn_mss(&at_a.join().unwrap(), port),
    )
}

#[test]
fn syns_crossing_the_tunnel_get_the_tunnels_mss_both_ways() {
    let test = "syns_crossing_the_tunnel_get_the_tunnels_mss_both_ways";
    if !require_netns_and_wg(test) {
        return;
    }
    let sites = tunneld_sites("\n[dataplane]\nclamp_mss = \"auto\"\n");
    let (a, b) = (&sites.a, &sites.b);
    let (ia, ib) = (sites.ga.ifname.clone(), sites.gb.ifname.clone());
    ping(a, "10.77.0.2");

    step("hosts that advertise a 1500-byte LAN's MSS through the tunnel");
    for (ns, ifname, peer4, peer6) in [
        (a, &ia, "10.77.0.2/32", "fd77::2/128"),
        (b, &ib, "10.77.0.1/32", "fd77::1/128"),
    ] {
        ns.run(&[
            "ip", "route", "replace", peer4, "dev", ifname, "proto", "static", "advmss", "1460",
        ]);
        ns.run(&[
            "ip", "-6", "route", "replace", peer6, "dev", ifname, "proto", "static", "advmss",
            "1440",
        ]);
    }

    step("IPv4: the SYN B receives and the SYN-ACK A receives carry 1380");
    let (syn, syn_ack) = connect_and_capture(a, &ia, b, &ib, "10.77.0.2:5011".parse().unwrap());
    assert_eq!(syn, vec![(false, 1380)], "the SYN out of B's tunnel");
    assert_eq!(syn_ack, vec![(true, 1380)], "the SYN-ACK out of A's tunnel");

    step("IPv6: 1360 both ways");
    let (syn, syn_ack) = connect_and_capture(a, &ia, b, &ib, "[fd77::2]:5012".parse().unwrap());
    assert_eq!(syn, vec![(false, 1360)], "the SYN out of B's tunnel");
    assert_eq!(syn_ack, vec![(true, 1360)], "the SYN-ACK out of A's tunnel");
}
