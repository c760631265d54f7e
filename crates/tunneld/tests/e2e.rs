//! End to end, in network namespaces this test creates: tunneld against tunneld and against
//! wireguard-go, live changes through `wg`, signals, and broken configs. Without root these
//! tests skip (and fail when TUNNELD_REQUIRE_NETNS=1).

mod common;

use common::*;
use std::process::Command;
use tunneld_testnet::{require_netns, unique_name, NetNs};

#[test]
fn tunneld_to_tunneld_v4_v6_ping_and_tcp_both_ways() {
    if !require_netns("tunneld_to_tunneld_v4_v6_ping_and_tcp_both_ways") {
        return;
    }
    let (a, b) = two_sites();
    let (ka, kb) = (genkey(), genkey());
    let (ia, ib) = (unique_name("wg"), unique_name("wg"));
    let ga = Gateway::start(&a, &ia, &ka, &site_body(1, &pubkey(&kb), "192.0.2.2:51820"));
    let gb = Gateway::start(&b, &ib, &kb, &site_body(2, &pubkey(&ka), "192.0.2.1:51820"));

    ping(&a, "10.77.0.2");
    ping(&b, "10.77.0.1");
    ping(&a, "fd77::2");
    ping(&b, "fd77::1");
    tcp_transfer(&a, &b, "10.77.0.2:5001".parse().unwrap(), 4 << 20);
    tcp_transfer(&b, &a, "[fd77::1]:5002".parse().unwrap(), 4 << 20);

    for (ns, gw, peer) in [(&a, &ga, &gb), (&b, &gb, &ga)] {
        let show = ns.run(&["wg", "show", &gw.ifname]);
        assert!(
            show.contains(&format!("public key: {}", gw.public_key)),
            "{show}"
        );
        assert!(
            show.contains(&format!("peer: {}", peer.public_key)),
            "{show}"
        );
        assert!(show.contains("latest handshake:"), "{show}");
        assert!(show.contains("transfer:"), "{show}");
        let dump = wg_dump(ns, &gw.ifname);
        assert_eq!(dump[0].len(), 4, "interface line: {:?}", dump[0]);
        assert_eq!(dump[0][1], gw.public_key);
        assert_eq!(dump[0][2], "51820");
        assert_eq!(dump.len(), 2);
        let p = &dump[1];
        assert_eq!(p.len(), 8, "peer line: {p:?}");
        assert_eq!(p[0], peer.public_key);
        assert!(p[4].parse::<u64>().unwrap() > 0, "no handshake time: {p:?}");
        // Over 4 MiB crossed each way.
        assert!(p[5].parse::<u64>().unwrap() > 4 << 20, "rx: {p:?}");
        assert!(p[6].parse::<u64>().unwrap() > 4 << 20, "tx: {p:?}");
    }
    // tunneld's own view adds per-worker counters.
    let show = a.run(&[TUNNELD, "show", &ga.ifname]);
    assert!(show.contains(&format!("peer: {}", gb.public_key)), "{show}");
    assert!(show.contains("latest handshake: "), "{show}");
    assert!(show.contains("worker 0: sent "), "{show}");
    assert!(show.contains("; drops: "), "{show}");

    // The configured routes and addresses are on the interface.
    let routes = a.run(&["ip", "-4", "route", "show", "dev", &ga.ifname]);
    assert!(routes.contains("10.77.0.2"), "{routes}");
    let mtu = a.run(&["ip", "link", "show", &ga.ifname]);
    assert!(mtu.contains("mtu 1420"), "{mtu}");
}

#[test]
fn ipv6_underlay() {
    if !require_netns("ipv6_underlay") {
        return;
    }
    let a = NetNs::new();
    let b = NetNs::new();
    tunneld_testnet::veth(&a, "fd00:192::1/64", &b, "fd00:192::2/64");
    let (ka, kb) = (genkey(), genkey());
    let (ia, ib) = (unique_name("wg"), unique_name("wg"));
    let _ga = Gateway::start(
        &a,
        &ia,
        &ka,
        &site_body(1, &pubkey(&kb), "[fd00:192::2]:51820"),
    );
    let _gb = Gateway::start(
        &b,
        &ib,
        &kb,
        &site_body(2, &pubkey(&ka), "[fd00:192::1]:51820"),
    );
    ping(&a, "10.77.0.2");
    ping(&b, "fd77::1");
    tcp_transfer(&a, &b, "10.77.0.2:5003".parse().unwrap(), 1 << 20);
}

#[test]
fn tunneld_to_wireguard_go_both_ways() {
    if !require_netns("tunneld_to_wireguard_go_both_ways") {
        return;
    }
    let (a, b) = two_sites();
    let (ka, kb) = (genkey(), genkey());
    let (ia, ib) = (unique_name("wg"), unique_name("wg"));
    let ga = Gateway::start(&a, &ia, &ka, &site_body(1, &pubkey(&kb), "192.0.2.2:51820"));

    let wg = WireguardGo::start(&b, &ib);
    let dir = tempfile::tempdir().unwrap();
    let key = write_private(dir.path(), "b.key", &kb);
    b.run(&[
        "wg",
        "set",
        &ib,
        "private-key",
        &key.to_string_lossy(),
        "listen-port",
        "51820",
        "peer",
        &ga.public_key,
        "endpoint",
        "192.0.2.1:51820",
        "allowed-ips",
        "10.77.0.1/32,fd77::1/128",
    ]);
    b.run(&["ip", "addr", "add", "10.77.0.2/24", "dev", &ib]);
    b.run(&["ip", "-6", "addr", "add", "fd77::2/64", "dev", &ib, "nodad"]);
    b.run(&["ip", "link", "set", &ib, "mtu", "1420", "up"]);

    // wireguard-go initiates this time (b pings first), tunneld responds.
    ping(&b, "10.77.0.1");
    ping(&a, "10.77.0.2");
    ping(&a, "fd77::2");
    ping(&b, "fd77::1");
    tcp_transfer(&a, &b, "10.77.0.2:5004".parse().unwrap(), 4 << 20);
    tcp_transfer(&b, &a, "[fd77::1]:5005".parse().unwrap(), 4 << 20);

    assert!(
        latest_handshake(&a, &ia, &pubkey(&kb)) > 0,
        "tunneld saw no handshake"
    );
    assert!(
        latest_handshake(&b, &ib, &ga.public_key) > 0,
        "wireguard-go saw no handshake"
    );
    drop(wg);
}

#[test]
fn wg_set_adds_changes_and_removes_peers_live() {
    if !require_netns("wg_set_adds_changes_and_removes_peers_live") {
        return;
    }
    let (a, b) = two_sites();
    let (ka, kb) = (genkey(), genkey());
    let (ia, ib) = (unique_name("wg"), unique_name("wg"));
    let ga = Gateway::start(&a, &ia, &ka, &site_body(1, &pubkey(&kb), "192.0.2.2:51820"));
    let gb = Gateway::start(&b, &ib, &kb, &site_body(2, &pubkey(&ka), "192.0.2.1:51820"));
    ping(&a, "10.77.0.2");
    let handshake = latest_handshake(&a, &ia, &gb.public_key);
    assert!(handshake > 0);

    // Add a peer: it shows, and its route exists.
    let newcomer = pubkey(&genkey());
    a.run(&[
        "wg",
        "set",
        &ia,
        "peer",
        &newcomer,
        "allowed-ips",
        "10.77.0.3/32",
    ]);
    let show = a.run(&["wg", "show", &ia]);
    assert!(show.contains(&format!("peer: {newcomer}")), "{show}");
    let routes = a.run(&["ip", "-4", "route", "show", "dev", &ia]);
    assert!(routes.contains("10.77.0.3"), "{routes}");

    // Change the existing peer's allowed IPs: routes follow, the session stays.
    b.run(&["ip", "addr", "add", "10.88.0.2/32", "dev", &ib]);
    a.run(&[
        "wg",
        "set",
        &ia,
        "peer",
        &gb.public_key,
        "allowed-ips",
        "10.77.0.2/32,fd77::2/128,10.88.0.0/24",
    ]);
    let routes = a.run(&["ip", "-4", "route", "show", "dev", &ia]);
    assert!(routes.contains("10.88.0.0/24"), "{routes}");
    ping(&a, "10.77.0.2");
    assert_eq!(
        latest_handshake(&a, &ia, &gb.public_key),
        handshake,
        "changing allowed IPs started a new session"
    );
    let dump = wg_dump(&a, &ia);
    let peer = dump.iter().find(|f| f[0] == gb.public_key).unwrap();
    assert_eq!(peer[3], "10.77.0.2/32,fd77::2/128,10.88.0.0/24");

    // Remove the newcomer: gone from wg and from the routes.
    a.run(&["wg", "set", &ia, "peer", &newcomer, "remove"]);
    let show = a.run(&["wg", "show", &ia]);
    assert!(!show.contains(&newcomer), "{show}");
    let routes = a.run(&["ip", "-4", "route", "show", "dev", &ia]);
    assert!(!routes.contains("10.77.0.3"), "{routes}");

    // A bad request is refused and changes nothing.
    let bad = a.output(&[
        "wg",
        "set",
        &ia,
        "peer",
        &gb.public_key,
        "endpoint",
        "nowhere",
    ]);
    assert!(!bad.status.success());
    ping(&a, "10.77.0.2");
    drop(ga);
}

#[test]
fn sigterm_and_sigint_remove_everything() {
    if !require_netns("sigterm_and_sigint_remove_everything") {
        return;
    }
    for signal in ["TERM", "INT"] {
        let ns = NetNs::new();
        let ifname = unique_name("wg");
        let body = "listen_port = 51820\naddress = [\"10.77.0.1/24\"]\n\n[[peer]]\n\
                    public_key = \"HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw=\"\n\
                    allowed_ips = [\"10.20.0.0/16\"]\n";
        let mut gw = Gateway::start(&ns, &ifname, &genkey(), body);
        assert!(ns.output(&["ip", "link", "show", &ifname]).status.success());
        let status = gw.stop_with(signal);
        assert!(
            status.success(),
            "SIG{signal}: exit {status}\n{}",
            gw.log_text()
        );
        assert!(
            !ns.output(&["ip", "link", "show", &ifname]).status.success(),
            "interface left behind after SIG{signal}"
        );
        assert!(
            !socket_path(&ifname).exists(),
            "socket left behind after SIG{signal}"
        );
        let routes = ns.run(&["ip", "-4", "route"]);
        assert!(!routes.contains("10.20.0.0"), "{routes}");
    }
}

#[test]
fn second_tunneld_for_the_same_interface_is_refused() {
    if !require_netns("second_tunneld_for_the_same_interface_is_refused") {
        return;
    }
    let ns = NetNs::new();
    let ifname = unique_name("wg");
    let body = "listen_port = 51820\n";
    let gw = Gateway::start(&ns, &ifname, &genkey(), body);
    let dir = tempfile::tempdir().unwrap();
    write_private(dir.path(), "k", &genkey());
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[interface]\nname = \"{ifname}\"\nprivate_key_file = \"k\"\nlisten_port = 51821\n"
        ),
    )
    .unwrap();
    let out = ns.output(&[TUNNELD, "up", &cfg.to_string_lossy()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already served"), "{err}");
    // The first one is untouched.
    assert!(ns.output(&["wg", "show", &ifname]).status.success());
    drop(gw);
}

/// (what is wrong, the config's [interface] + [[peer]] text after the name line, the text
/// the error must contain). `KEY` is replaced by a valid private key, `PUB` by a public key.
const BROKEN: &[(&str, &str, &str)] = &[
    (
        "bad base64 key",
        "private_key = \"not base64!!\"\n",
        "interface.private_key",
    ),
    (
        "short key",
        "private_key = \"AAAA\"\n",
        "decodes to 3 bytes",
    ),
    (
        "bad CIDR",
        "private_key = \"KEY\"\naddress = [\"10.0.0.1/33\"]\n",
        "interface.address[0]",
    ),
    (
        "duplicate peer",
        "private_key = \"KEY\"\n[[peer]]\npublic_key = \"PUB\"\n[[peer]]\npublic_key = \"PUB\"\n",
        "peer[1].public_key: duplicate of peer[0]",
    ),
    (
        "unknown field",
        "private_key = \"KEY\"\nlisten_prot = 1\n",
        "unknown field `listen_prot`",
    ),
    (
        "port out of range",
        "private_key = \"KEY\"\nlisten_port = 70000\n",
        "interface.listen_port: 70000 is out of range 0-65535",
    ),
    (
        "missing key file",
        "private_key_file = \"nonexistent.key\"\n",
        "interface.private_key_file: cannot read",
    ),
    (
        "world-readable key file",
        "private_key_file = \"loose.key\"\n",
        "readable by others",
    ),
    (
        "bad endpoint",
        "private_key = \"KEY\"\n[[peer]]\npublic_key = \"PUB\"\nendpoint = \"192.0.2.1\"\n",
        "peer[0].endpoint",
    ),
];

fn broken_config(dir: &std::path::Path, ifname: &str, body: &str) -> std::path::PathBuf {
    let loose = dir.join("loose.key");
    std::fs::write(&loose, genkey()).unwrap();
    std::fs::set_permissions(&loose, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let body = body
        .replace("KEY", &genkey())
        .replace("PUB", &pubkey(&genkey()));
    let path = dir.join("broken.toml");
    std::fs::write(&path, format!("[interface]\nname = \"{ifname}\"\n{body}")).unwrap();
    path
}

#[test]
fn broken_configs_are_refused_by_check_with_the_field_named() {
    for (what, body, expected) in BROKEN {
        let dir = tempfile::tempdir().unwrap();
        let path = broken_config(dir.path(), "wgbroken", body);
        let out = Command::new(TUNNELD)
            .arg("check")
            .arg(&path)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: check accepted it");
        assert!(
            err.contains(expected),
            "{what}: expected `{expected}` in:\n{err}"
        );
        // Never the key itself.
        assert!(!err.contains("private_key = "), "{what}: {err}");
    }
}

#[test]
fn broken_configs_make_up_fail_and_leave_nothing_behind() {
    if !require_netns("broken_configs_make_up_fail_and_leave_nothing_behind") {
        return;
    }
    let ns = NetNs::new();
    for (what, body, expected) in BROKEN {
        let ifname = unique_name("wg");
        let dir = tempfile::tempdir().unwrap();
        let path = broken_config(dir.path(), &ifname, body);
        let out = ns.output(&[TUNNELD, "up", &path.to_string_lossy()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: up accepted it");
        assert!(
            err.contains(expected),
            "{what}: expected `{expected}` in:\n{err}"
        );
        assert!(
            !ns.output(&["ip", "link", "show", &ifname]).status.success(),
            "{what}: interface left behind"
        );
        assert!(!socket_path(&ifname).exists(), "{what}: socket left behind");
    }
}

#[test]
fn genkey_and_pubkey_match_wg() {
    if Command::new("wg").arg("--version").output().is_err() {
        assert!(
            std::env::var("TUNNELD_REQUIRE_NETNS").as_deref() != Ok("1"),
            "wg (wireguard-tools) is not installed"
        );
        eprintln!("SKIPPED genkey_and_pubkey_match_wg: wg is not installed");
        return;
    }
    let wg = |args: &[&str], input: &str| -> String {
        let mut child = Command::new("wg")
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap()
    };
    for _ in 0..5 {
        let ours = genkey();
        assert_eq!(ours.len(), 44);
        assert_eq!(pubkey(&ours), wg(&["pubkey"], &format!("{ours}\n")).trim());
        let theirs = wg(&["genkey"], "");
        assert_eq!(pubkey(theirs.trim()), wg(&["pubkey"], &theirs).trim());
    }
}
