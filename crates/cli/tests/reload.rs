//! SIGHUP re-reads the config, in network namespaces this test creates: peers added, changed
//! and removed on the running interface with their routes, an address added and removed, a config with an error changing
//! nothing, and the session of the unchanged peer kept throughout, with not one datagram of a
//! flow through it lost.

mod common;

use common::*;
use std::fs;
use std::net::UdpSocket;
use std::time::{Duration, Instant};

/// Datagrams of the flow that runs across the reloads, and the pause after each.
const DATAGRAMS: u32 = 8000;
const PACE: Duration = Duration::from_micros(500);

/// Rewrites a gateway's config file (keeping its name and key file) and sends SIGHUP, then
/// waits until the log shows the reload's outcome (`expect`) one more time than before.
fn reload(gw: &Gateway, body: &str, expect: &str) {
    step(&format!("SIGHUP with a new config, expecting \"{expect}\""));
    let before = gw.log_text().matches(expect).count();
    let config = format!(
        "[interface]\nname = \"{}\"\nprivate_key_file = \"private.key\"\n{body}",
        gw.ifname
    );
    fs::write(gw.dir.path().join("gateway.toml"), config).unwrap();
    std::process::Command::new("kill")
        .args(["-HUP", &gw.pid().to_string()])
        .status()
        .unwrap();
    wait_until(expect, || gw.log_text().matches(expect).count() > before);
}

#[test]
fn sighup_applies_the_config_peers_without_losing_a_packet() {
    if !require_netns_and_wg("sighup_applies_the_config_peers_without_losing_a_packet") {
        return;
    }
    let s = tunneld_sites("");
    let (ia, peer_b) = (s.ga.ifname.clone(), s.gb.public_key.clone());
    ping(&s.a, "10.77.0.2");
    let handshake = latest_handshake(&s.a, &ia, &peer_b);
    assert!(handshake > 0);

    step("a sequence-numbered UDP flow from A to B runs across every reload");
    let receiver = s.b.spawn_in_ns(|| {
        let socket = UdpSocket::bind("10.77.0.2:6100").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        let mut seqs = Vec::new();
        let mut buf = [0u8; 16];
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let Ok(n) = socket.recv(&mut buf) else {
                break; // three seconds of silence: the sender is done
            };
            if n == 4 {
                seqs.push(u32::from_be_bytes(buf[..4].try_into().unwrap()));
            }
        }
        seqs
    });
    std::thread::sleep(Duration::from_millis(200));
    let sender = s.a.spawn_in_ns(|| {
        let socket = UdpSocket::bind("10.77.0.1:0").unwrap();
        socket.connect("10.77.0.2:6100").unwrap();
        for seq in 0..DATAGRAMS {
            socket.send(&seq.to_be_bytes()).unwrap();
            std::thread::sleep(PACE);
        }
    });

    let newcomer = pubkey(&genkey());
    let widened = s.body_a.replace(
        "\"fd77::2/128\"]",
        "\"fd77::2/128\", \"10.99.0.0/16\"]\npersistent_keepalive = 25",
    );
    assert_ne!(widened, s.body_a);
    let widened = widened.replace(
        "address = [\"10.77.0.1/24\"",
        "address = [\"10.77.0.1/24\", \"10.78.0.1/24\"",
    );
    assert!(widened.contains("10.78.0.1/24"));
    let with_newcomer = format!(
        "{widened}\n[[peer]]\npublic_key = \"{newcomer}\"\nallowed_ips = [\"10.55.0.0/16\"]\n"
    );
    const RELOADED: &str = "WireGuard settings reloaded";
    reload(&s.ga, &with_newcomer, RELOADED);
    let dump = wg_dump(&s.a, &ia);
    assert_eq!(dump.len(), 3, "the newcomer is added: {dump:?}");
    let newcomer_line = dump.iter().find(|f| f[0] == newcomer).unwrap();
    assert_eq!(newcomer_line[3], "10.55.0.0/16");
    let b_line = dump.iter().find(|f| f[0] == peer_b).unwrap();
    assert!(b_line[3].contains("10.99.0.0/16"), "{b_line:?}");
    assert_eq!(b_line[7], "25", "keepalive applied: {b_line:?}");
    let routes = s.a.run(&["ip", "-4", "route", "show", "dev", &ia]);
    assert!(
        routes.contains("10.55.0.0/16") && routes.contains("10.99.0.0/16"),
        "{routes}"
    );
    let addrs = s.a.run(&["ip", "-4", "addr", "show", "dev", &ia]);
    assert!(
        addrs.contains("10.78.0.1/24"),
        "the new address is added: {addrs}"
    );

    step("a config with an error changes nothing");
    let broken = with_newcomer.replace("10.55.0.0/16", "10.55.0.0/33");
    reload(&s.ga, &broken, "the running WireGuard settings stay");
    assert!(s.ga.log_text().contains("peer[1].allowed_ips[0]"));
    assert_eq!(wg_dump(&s.a, &ia).len(), 3);

    step("a new fwmark is put on the running interface's socket");
    let with_mark = format!("fwmark = 4660\n{}", s.body_a);
    reload(
        &s.ga,
        &with_mark,
        "the interface's sockets carry a new mark",
    );
    assert_eq!(s.a.run(&["wg", "show", &ia, "fwmark"]).trim(), "0x1234");
    let sockets = s.a.run(&["ss", "-uaneH", "sport = :51820"]);
    assert!(sockets.contains("fwmark:0x1234"), "{sockets}");
    assert!(!s.ga.log_text().contains("takes a restart"));

    step("back to the first config, with a setting that takes a restart changed");
    let new_mtu = s.body_a.replace("mtu = 1420", "mtu = 1400");
    assert_ne!(new_mtu, s.body_a);
    reload(&s.ga, &new_mtu, RELOADED);
    assert!(
        s.ga.log_text()
            .contains("interface.mtu changed; that takes a restart"),
        "{}",
        s.ga.log_text()
    );
    let dump = wg_dump(&s.a, &ia);
    assert_eq!(dump.len(), 2, "the newcomer is removed: {dump:?}");
    let routes = s.a.run(&["ip", "-4", "route", "show", "dev", &ia]);
    assert!(
        !routes.contains("10.55.0.0/16") && !routes.contains("10.99.0.0/16"),
        "{routes}"
    );
    let addrs = s.a.run(&["ip", "-4", "addr", "show", "dev", &ia]);
    assert!(
        !addrs.contains("10.78.0.1") && addrs.contains("10.77.0.1/24"),
        "the added address is removed, the first kept: {addrs}"
    );

    sender.join().unwrap();
    let seqs = receiver.join().unwrap();
    let expected: Vec<u32> = (0..DATAGRAMS).collect();
    assert!(
        seqs == expected,
        "{} of {DATAGRAMS} datagrams arrived in order across the reloads",
        seqs.iter()
            .zip(&expected)
            .take_while(|(a, b)| a == b)
            .count()
    );
    assert_eq!(
        latest_handshake(&s.a, &ia, &peer_b),
        handshake,
        "the unchanged peer kept its session (no new handshake)"
    );
    ping(&s.a, "10.77.0.2");
}
