//! The bare mode (`tunneld INTERFACE`, as `wireguard-go INTERFACE`), in network namespaces
//! this test creates: `wg-quick up`/`down` with tunneld as its userspace implementation
//! against wireguard-go, and a bare interface configured by `wg setconf`/`wg syncconf`
//! against a `tunneld up` gateway.

mod common;

use common::*;
use std::fs;
use std::time::{Duration, Instant};
use tunneld_testnet::{unique_name, NetNs};

/// Runs `cmd` in `ns` and returns its output, failing the test (with both streams) if it
/// fails.
fn run_ok(ns: &NetNs, argv: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = ns.command(argv[0]);
    cmd.args(&argv[1..]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = output_bounded(&mut cmd);
    assert!(
        out.status.success(),
        "{argv:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The tunneld processes serving `ifname`.
fn tunneld_processes(ifname: &str) -> Vec<String> {
    let out = std::process::Command::new("pgrep")
        .args(["-af", &format!("tunneld.* {ifname}$")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect()
}

/// Removes what a failed test may leave: the interface (so the bare tunneld exits) and its
/// socket; the namespaces go with their `NetNs`.
struct Cleanup<'a>(&'a NetNs, String);
impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let _ = self.0.output(&["ip", "link", "del", &self.1]);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !tunneld_processes(&self.1).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = fs::remove_file(socket_path(&self.1));
    }
}

#[test]
fn wg_quick_runs_tunneld_as_its_userspace_implementation() {
    if !require_netns_and_wg("wg_quick_runs_tunneld_as_its_userspace_implementation")
        || !require_tool(
            "wg_quick_runs_tunneld_as_its_userspace_implementation",
            "wg-quick",
        )
        || !require_tool(
            "wg_quick_runs_tunneld_as_its_userspace_implementation",
            "wireguard-go",
        )
    {
        return;
    }
    let (a, b) = two_sites();
    let (ka, kb, psk) = (genkey(), genkey(), genkey());
    let (ia, ib) = (unique_name("wg"), unique_name("wg"));
    let _cleanup = Cleanup(&a, ia.clone());

    step("wireguard-go in B, configured with wg and ip");
    let wg = WireguardGo::start(&b, &ib);
    let dir = tempfile::tempdir().unwrap();
    let psk_file = write_private(dir.path(), "psk", &psk);
    let psk_path = psk_file.to_string_lossy().into_owned();
    wg.configure_as_site_2(&b, &kb, &pubkey(&ka), &["preshared-key", &psk_path]);

    step("wg-quick up in A with tunneld as the userspace implementation");
    let marks = dir.path().join("marks");
    fs::create_dir(&marks).unwrap();
    let conf = dir.path().join(format!("{ia}.conf"));
    let text = format!(
        "[Interface]\nPrivateKey = {ka}\nAddress = 10.77.0.1/24, fd77::1/64\nListenPort = 51820\n\
         MTU = 1420\nPostUp = touch {m}/post-up\nPreDown = touch {m}/pre-down\n\n\
         [Peer]\nPublicKey = {}\nPresharedKey = {psk}\nAllowedIPs = 10.77.0.2/32, fd77::2/128\n\
         Endpoint = 192.0.2.2:51820\nPersistentKeepalive = 25\n",
        pubkey(&kb),
        m = marks.display()
    );
    write_private(dir.path(), &format!("{ia}.conf"), &text);
    let conf = conf.to_string_lossy().into_owned();
    let env = [("WG_QUICK_USERSPACE_IMPLEMENTATION", TUNNELD)];
    run_ok(&a, &["wg-quick", "up", &conf], &env);
    assert!(marks.join("post-up").exists(), "PostUp ran");
    assert_eq!(
        tunneld_processes(&ia).len(),
        1,
        "one tunneld in the background"
    );

    ping(&a, "10.77.0.2");
    ping(&b, "10.77.0.1");
    ping(&a, "fd77::2");
    ping(&b, "fd77::1");
    tcp_transfer(&a, &b, "10.77.0.2:5301".parse().unwrap(), 4 << 20);
    tcp_transfer(&b, &a, "[fd77::1]:5302".parse().unwrap(), 4 << 20);
    let shown = a.run(&["wg", "show", &ia]);
    assert!(shown.contains("latest handshake"), "{shown}");
    assert!(shown.contains("preshared key: (hidden)"), "{shown}");

    step("wg-quick down: no interface, socket, route or process left");
    run_ok(&a, &["wg-quick", "down", &conf], &env);
    assert!(marks.join("pre-down").exists(), "PreDown ran");
    assert!(!a.output(&["ip", "link", "show", &ia]).status.success());
    wait_until("the bare tunneld to exit", || {
        tunneld_processes(&ia).is_empty()
    });
    assert!(!socket_path(&ia).exists());
    let routes = a.run(&["ip", "route"]) + &a.run(&["ip", "-6", "route"]);
    assert!(
        !routes.contains("10.77.0.") && !routes.contains("fd77::"),
        "{routes}"
    );
}

#[test]
fn a_bare_interface_takes_wg_setconf_and_syncconf_keeps_unchanged_sessions() {
    if !require_netns_and_wg(
        "a_bare_interface_takes_wg_setconf_and_syncconf_keeps_unchanged_sessions",
    ) {
        return;
    }
    let (a, b) = two_sites();
    let (ka, kb) = (genkey(), genkey());
    let (ia, ib) = (unique_name("wg"), unique_name("wg"));
    let _cleanup = Cleanup(&a, ia.clone());
    let gb = Gateway::start(&b, &ib, &kb, &site_body(2, &pubkey(&ka), "192.0.2.1:51820"));

    step("a bare interface in A, in the foreground of nobody: tunneld returns once it exists");
    let out = output_bounded(a.command(TUNNELD).arg(&ia));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(socket_path(&ia).exists());
    let bare = wg_dump(&a, &ia);
    assert_eq!(bare[0][0], "(none)", "no private key yet: {bare:?}");
    assert_eq!(bare.len(), 1, "no peers yet");

    step("a config the interface refuses (a peer key no handshake can use) changes nothing");
    let dir = tempfile::tempdir().unwrap();
    let other = genkey();
    // `wg` sends it (it is well-formed); the interface refuses the all-zero public key.
    let broken = format!(
        "[Interface]\nPrivateKey = {ka}\nListenPort = 51820\n\n[Peer]\nPublicKey = {}\nAllowedIPs = 10.77.0.2/32\n\n\
         [Peer]\nPublicKey = AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\nAllowedIPs = 10.66.0.0/16\n",
        pubkey(&kb),
    );
    let broken_file = write_private(dir.path(), "broken.conf", &broken);
    let refused = a.output(&["wg", "setconf", &ia, &broken_file.to_string_lossy()]);
    assert!(
        !refused.status.success(),
        "wg setconf with a low-order key was taken"
    );
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("Unable to modify interface"), "{err}");
    let unchanged = wg_dump(&a, &ia);
    assert_eq!(unchanged[0][0], "(none)", "no key taken: {unchanged:?}");
    assert_eq!(unchanged.len(), 1, "no peer taken: {unchanged:?}");

    step("wg setconf with a key, a port and two peers starts the dataplane");
    let conf = format!(
        "[Interface]\nPrivateKey = {ka}\nListenPort = 51820\n\n\
         [Peer]\nPublicKey = {}\nEndpoint = 192.0.2.2:51820\nAllowedIPs = 10.77.0.2/32, fd77::2/128\n\n\
         [Peer]\nPublicKey = {}\nAllowedIPs = 10.66.0.0/16\n",
        pubkey(&kb),
        pubkey(&other)
    );
    let conf_file = write_private(dir.path(), "a.conf", &conf);
    a.run(&["wg", "setconf", &ia, &conf_file.to_string_lossy()]);
    a.run(&["ip", "addr", "add", "10.77.0.1/24", "dev", &ia]);
    a.run(&["ip", "-6", "addr", "add", "fd77::1/64", "dev", &ia, "nodad"]);
    a.run(&["ip", "link", "set", &ia, "up"]);
    assert!(
        !a.run(&["ip", "route", "show", "dev", &ia])
            .contains("10.66.0.0/16"),
        "the bare mode adds no routes (wg-quick does)"
    );
    ping(&a, "10.77.0.2");
    ping(&b, "fd77::1");
    let dump = wg_dump(&a, &ia);
    assert_eq!(dump[0][2], "51820", "{dump:?}");
    let b_key = pubkey(&kb);
    let handshake = latest_handshake(&a, &ia, &b_key);
    assert!(handshake > 0);

    step("wg syncconf: one peer changed, one unchanged; the unchanged one keeps its session");
    std::thread::sleep(Duration::from_millis(1100));
    let changed = conf.replace("AllowedIPs = 10.66.0.0/16", "AllowedIPs = 10.67.0.0/16");
    let changed_file = write_private(dir.path(), "a2.conf", &changed);
    a.run(&["wg", "syncconf", &ia, &changed_file.to_string_lossy()]);
    let dump = wg_dump(&a, &ia);
    let other_line = dump.iter().find(|l| l[0] == pubkey(&other)).unwrap();
    assert_eq!(other_line[3], "10.67.0.0/16", "{dump:?}");
    assert_eq!(
        latest_handshake(&a, &ia, &b_key),
        handshake,
        "the session was kept"
    );
    ping(&a, "10.77.0.2");
    assert_eq!(
        latest_handshake(&a, &ia, &b_key),
        handshake,
        "no new handshake"
    );

    step("ip link del: the bare tunneld exits and removes its socket");
    a.run(&["ip", "link", "del", &ia]);
    wait_until("the bare tunneld to exit", || {
        tunneld_processes(&ia).is_empty()
    });
    assert!(!socket_path(&ia).exists());
    drop(gb);
}

#[test]
fn a_bad_interface_name_or_option_gets_one_line() {
    for (args, expect) in [
        (&["a/b"][..], "interface.name: `a/b` contains '/'"),
        (&["wg-name-far-too-long"], "longer than 15 bytes"),
        (&["wg0", "--bogus"], "unexpected argument `--bogus`"),
        (
            &["bare", "--dataplane", "workers=lots", "wg0"],
            "dataplane.workers",
        ),
    ] {
        let out = output_bounded(std::process::Command::new(TUNNELD).args(args));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains(expect), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}

/// The first 6 bytes a base64 text encodes (from its first 8 characters).
fn base64_prefix(text: &str) -> [u8; 6] {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bits = text.bytes().take(8).fold(0u64, |acc, c| {
        (acc << 6) | ALPHABET.iter().position(|&a| a == c).unwrap() as u64
    });
    let b = bits.to_be_bytes();
    [b[2], b[3], b[4], b[5], b[6], b[7]]
}

/// The kernel's UDP datagrams received and sent in `ns` (v4 and v6), which AF_XDP traffic
/// never touches.
fn kernel_udp_datagrams(ns: &NetNs) -> u64 {
    let snmp = ns.run(&["cat", "/proc/net/snmp"]) + &ns.run(&["cat", "/proc/net/snmp6"]);
    let mut lines = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (lines.next().unwrap(), lines.next().unwrap());
    let field = |name: &str| -> u64 {
        let at = names.split_whitespace().position(|n| n == name).unwrap();
        values.split_whitespace().nth(at).unwrap().parse().unwrap()
    };
    let v6 = |name: &str| -> u64 {
        snmp.lines()
            .find_map(|l| l.strip_prefix(name))
            .map_or(0, |v| v.trim().parse().unwrap())
    };
    field("InDatagrams") + field("OutDatagrams") + v6("Udp6InDatagrams") + v6("Udp6OutDatagrams")
}

/// `wg-quick` with a peer that takes the default route (`AllowedIPs = 0.0.0.0/0, ::/0`):
/// wg-quick sets an fwmark on the running interface and routes everything not carrying it
/// into the tunnel, so tunneld's own datagrams must carry it or they would loop back into
/// the tunnel. The endpoint here is reached through a default route (B answers for
/// 198.51.100.2 behind 192.0.2.2), as on the Internet. With the recvmmsg backend, and with
/// AF_XDP, whose next-hop lookups must ask for routes with the mark too (the kernel's UDP
/// counters show its datagrams went by AF_XDP, not by the kernel's socket).
#[test]
fn wg_quick_with_a_default_route_marks_tunnelds_datagrams() {
    let test = "wg_quick_with_a_default_route_marks_tunnelds_datagrams";
    if !require_netns_and_wg(test)
        || !require_tool(test, "wg-quick")
        || !require_tool(test, "wireguard-go")
        || !require_tool(test, "nft")
    {
        return;
    }
    // AF_XDP on the veth's one queue: with one worker every datagram goes by AF_XDP; with
    // two, B's key puts the session on the worker with no queue of its own, so everything
    // the queue's worker receives for it is handed over.
    for (backend, workers) in [("mmsg", 2), ("xdp", 1), ("xdp", 2)] {
        step(&format!("backend {backend}, {workers} worker(s)"));
        let (a, b) = (NetNs::new(), NetNs::new());
        let (va, _) = tunneld_testnet::veth(&a, "192.0.2.1/24", &b, "192.0.2.2/24");
        a.run(&["ip", "route", "add", "default", "via", "192.0.2.2"]);
        b.run(&["ip", "addr", "add", "198.51.100.2/32", "dev", "lo"]);
        let ka = genkey();
        // A plain peer's session is on worker (first 4 bytes of its key, little-endian) mod
        // the workers (`owner_of`): on the last worker here.
        let kb = loop {
            let kb = genkey();
            let key = base64_prefix(&pubkey(&kb));
            if u32::from_le_bytes([key[0], key[1], key[2], key[3]]) as usize % workers
                == workers - 1
            {
                break kb;
            }
        };
        let (ia, ib) = (unique_name("wg"), unique_name("wg"));
        let _cleanup = Cleanup(&a, ia.clone());
        let wg = WireguardGo::start(&b, &ib);
        wg.configure_as_site_2(&b, &kb, &pubkey(&ka), &[]);

        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            "[Interface]\nPrivateKey = {ka}\nAddress = 10.77.0.1/24, fd77::1/64\n\n\
             [Peer]\nPublicKey = {}\nAllowedIPs = 0.0.0.0/0, ::/0\n\
             Endpoint = 198.51.100.2:51820\n",
            pubkey(&kb),
        );
        write_private(dir.path(), &format!("{ia}.conf"), &text);
        let conf = dir.path().join(format!("{ia}.conf"));
        let conf = conf.to_string_lossy().into_owned();
        // The bare mode starts with no peer to find the underlay by: name it.
        let dataplane = match backend {
            "xdp" => format!("backend=xdp,workers={workers},xdp_interface={va}"),
            other => format!("backend={other},workers={workers}"),
        };
        let env = [
            ("WG_QUICK_USERSPACE_IMPLEMENTATION", TUNNELD),
            ("TUNNELD_DATAPLANE", dataplane.as_str()),
        ];
        run_ok(&a, &["wg-quick", "up", &conf], &env);
        let mark = run_ok(&a, &["wg", "show", &ia, "fwmark"], &[]);
        let mark = mark.trim();
        assert_ne!(mark, "off", "wg-quick set no mark");
        let port = run_ok(&a, &["wg", "show", &ia, "listen-port"], &[]);
        let sockets = a.run(&["ss", "-uaneH", &format!("sport = :{}", port.trim())]);
        assert!(
            sockets.lines().count() > 0
                && sockets
                    .lines()
                    .all(|l| l.contains(&format!("fwmark:{mark}"))),
            "the sockets do not carry {mark}:\n{sockets}"
        );

        let before = kernel_udp_datagrams(&a);
        ping(&a, "10.77.0.2");
        ping(&a, "fd77::2");
        ping(&b, "10.77.0.1");
        tcp_transfer(&a, &b, "10.77.0.2:5303".parse().unwrap(), 4 << 20);
        if backend == "xdp" && workers == 1 {
            let through_kernel = kernel_udp_datagrams(&a) - before;
            assert!(
                through_kernel < 100,
                "{through_kernel} datagrams went through the kernel's UDP socket"
            );
        }
        run_ok(&a, &["wg-quick", "down", &conf], &env);
        wait_until("the bare tunneld to exit", || {
            tunneld_processes(&ia).is_empty()
        });
    }
}
