//! The config model: valid files parse to the model, broken ones report every problem, each
//! naming its field, never echoing a secret.

use tunneld_config::{self as config, Backend, Endpoint, KeySource, Workers};
use tunneld_crypto::PrivateKey;

fn key() -> String {
    PrivateKey::generate().to_base64().to_string()
}
fn public() -> String {
    PrivateKey::generate().public_key().to_base64()
}

fn errors(text: &str) -> Vec<String> {
    match config::parse(text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.0.iter().map(ToString::to_string).collect(),
    }
}

fn assert_has(errors: &[String], needle: &str) {
    assert!(
        errors.iter().any(|e| e.contains(needle)),
        "no error containing `{needle}` in {errors:#?}"
    );
}

#[test]
fn the_documented_example_parses() {
    let (p1, p2) = (public(), public());
    let text = format!(
        r#"
[interface]
name = "wg0"
private_key_file = "site-a.key"
listen_port = 51820
address = ["10.77.0.1/24", "fd77::1/64"]
mtu = 1420

[dataplane]
backend = "uring"
workers = 2
cpus = [0, 1]
udp_gso = false
udp_gro = false
tun_offload = false
busy_poll_us = 0

[[peer]]
public_key = "{p1}"
preshared_key_file = "psk.key"
endpoint = "192.0.2.2:51820"
allowed_ips = ["10.77.0.2/32", "10.20.0.0/16"]
persistent_keepalive = 25

[[peer]]
public_key = "{p2}"
endpoint = "gw.example.net:51820"
allowed_ips = ["10.30.1.7/16"]
"#
    );
    let c = config::parse(&text).unwrap();
    assert_eq!(c.interface.as_ref().unwrap().name, "wg0");
    assert_eq!(
        c.interface.as_ref().unwrap().private_key,
        KeySource::File("site-a.key".into())
    );
    assert_eq!(c.interface.as_ref().unwrap().listen_port, 51820);
    assert_eq!(
        c.interface.as_ref().unwrap().addresses[0].to_string(),
        "10.77.0.1/24"
    );
    assert_eq!(c.interface.as_ref().unwrap().mtu, 1420);
    assert_eq!(c.dataplane.backend, Backend::Uring);
    assert_eq!(c.dataplane.workers, Workers::Count(2));
    assert_eq!(c.dataplane.cpus, Some(vec![0, 1]));
    assert!(!c.dataplane.udp_gso);
    assert!(!c.dataplane.udp_gro);
    assert!(!c.dataplane.tun_offload);
    assert_eq!(c.dataplane.busy_poll_us, 0);
    assert_eq!(c.peers.len(), 2);
    assert_eq!(c.peers[0].persistent_keepalive, 25);
    assert_eq!(
        c.peers[0].endpoint,
        Some(Endpoint::Addr("192.0.2.2:51820".parse().unwrap()))
    );
    assert!(matches!(c.peers[0].preshared_key, Some(KeySource::File(_))));
    assert_eq!(
        c.peers[1].endpoint,
        Some(Endpoint::Host {
            host: "gw.example.net".into(),
            port: 51820
        })
    );
    // Allowed IPs are truncated to their networks, as the kernel does.
    assert_eq!(c.peers[1].allowed_ips[0].to_string(), "10.30.0.0/16");
}

#[test]
fn defaults_apply_when_optional_fields_are_absent() {
    let c = config::parse(&format!(
        "[interface]\nname = \"wg1\"\nprivate_key = \"{}\"\n",
        key()
    ))
    .unwrap();
    assert_eq!(c.interface.as_ref().unwrap().listen_port, 0);
    assert_eq!(c.interface.as_ref().unwrap().mtu, 1420);
    assert_eq!(c.dataplane.backend, Backend::Auto);
    assert_eq!(c.dataplane.workers, Workers::Auto);
    assert!(c.dataplane.udp_gso);
    assert!(c.dataplane.udp_gro);
    assert!(c.dataplane.tun_offload);
    assert_eq!(c.dataplane.busy_poll_us, 50);
    assert!(c.peers.is_empty());
}

#[test]
fn every_error_is_reported_at_once_with_its_field() {
    let p = public();
    let text = format!(
        r#"
[interface]
name = "this-name-is-far-too-long"
private_key = "{}"
listen_port = 70000
address = ["10.0.0.1/33", "banana"]
mtu = 100
colour = "blue"

[dataplane]
backend = "turbo"
workers = 0
udp_gso = "yes"
tun_offload = 1
busy_poll_us = 20000
xdp_interface = "eth 0"

[[peer]]
public_key = "{p}"
endpoint = "192.0.2.1"
allowed_ips = ["10.1.0.0/16"]
persistent_keepalive = -1

[[peer]]
public_key = "{p}"
allowed_ips = ["10.1.0.0/16"]
preshared_key = "x"
preshared_key_file = "y"
"#,
        key()
    );
    let e = errors(&text);
    assert_has(
        &e,
        "interface.name: `this-name-is-far-too-long` is longer than 15 bytes",
    );
    assert_has(&e, "interface.listen_port: 70000 is out of range 0-65535");
    assert_has(&e, "interface.address[0]: `10.0.0.1/33` is not a CIDR");
    assert_has(&e, "interface.address[1]: `banana` is not a CIDR");
    assert_has(&e, "interface.mtu: 100 is out of range 576-65535");
    assert_has(&e, "interface: unknown field `colour`");
    assert_has(&e, "dataplane.backend: `turbo` is not a backend");
    assert_has(&e, "dataplane.workers: 0 is out of range");
    assert_has(&e, "dataplane.udp_gso: must be true or false, not \"yes\"");
    assert_has(&e, "dataplane.tun_offload: must be true or false, not 1");
    assert_has(&e, "dataplane.busy_poll_us: 20000 is out of range 0-10000");
    assert_has(
        &e,
        "dataplane.xdp_interface: `eth 0` is not an interface name",
    );
    assert_has(&e, "peer[0].endpoint: `192.0.2.1` has no port");
    assert_has(
        &e,
        "peer[0].persistent_keepalive: -1 is out of range 0-65535",
    );
    assert_has(&e, "peer[1].public_key: duplicate of peer[0]");
    assert_has(
        &e,
        "peer[1].allowed_ips[0]: 10.1.0.0/16 is also claimed by peer[0]",
    );
    assert_has(
        &e,
        "peer[1]: give `preshared_key` or `preshared_key_file`, not both",
    );
    assert!(e.len() >= 13, "{e:#?}");
}

#[test]
fn keys_are_checked_without_being_echoed() {
    let secret = "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldA==";
    let e = errors(&format!(
        "[interface]\nname = \"wg0\"\nprivate_key = \"{secret}\"\n"
    ));
    assert_has(&e, "interface.private_key: the key decodes to 34 bytes");
    assert!(e.iter().all(|line| !line.contains(secret)), "{e:#?}");
    let e = errors("[interface]\nname = \"wg0\"\nprivate_key = \"@@@\"\n");
    assert_has(&e, "interface.private_key: the key is not valid base64");
    let e = errors("[interface]\nname = \"wg0\"\n");
    assert_has(&e, "interface: missing `private_key` or `private_key_file`");
    let e = errors(&format!(
        "[interface]\nname = \"wg0\"\nprivate_key = \"{}\"\nprivate_key_file = \"k\"\n",
        key()
    ));
    assert_has(&e, "give `private_key` or `private_key_file`, not both");
}

#[test]
fn own_public_key_as_a_peer_is_refused() {
    let k = PrivateKey::generate();
    let e = errors(&format!(
        "[interface]\nname = \"wg0\"\nprivate_key = \"{}\"\n[[peer]]\npublic_key = \"{}\"\n",
        k.to_base64().as_str(),
        k.public_key()
    ));
    assert_has(&e, "peer[0].public_key: is the interface's own public key");
}

#[test]
fn toml_syntax_errors_give_a_line_and_column() {
    let e = errors("[interface]\nname = \"wg0\nmtu = 1\n");
    assert_eq!(e.len(), 1, "{e:#?}");
    assert!(e[0].starts_with("line 2, column"), "{e:#?}");
}

#[test]
fn wrong_types_and_sections_are_named() {
    let e = errors(&format!(
        "unknown_top = 1\n[interface]\nname = 5\nprivate_key = \"{}\"\naddress = \"10.0.0.1/24\"\n[peer]\nx = 1\n",
        key()
    ));
    assert_has(&e, "config: unknown field `unknown_top`");
    assert_has(&e, "interface.name: must be a string, not integer");
    assert_has(
        &e,
        "interface.address: must be a list of strings, not string",
    );
    assert_has(&e, "peer: must be a list of tables");
}

#[test]
fn endpoints_in_every_form() {
    for (text, ok) in [
        ("192.0.2.1:51820", true),
        ("[2001:db8::1]:51820", true),
        ("vpn.example.org:443", true),
        ("192.0.2.1:0", false),
        ("2001:db8::1:51820", false),
        ("[2001:db8::1]", false),
        ("host:99999", false),
        (":51820", false),
        ("bad host:1", false),
    ] {
        assert_eq!(text.parse::<Endpoint>().is_ok(), ok, "{text}");
    }
}

#[test]
fn names_interfaces_cannot_have_are_refused() {
    for name in ["", ".", "..", "a/b", "a:b", "a b", "sixteen-chars-xx"] {
        let e = errors(&format!(
            "[interface]\nname = \"{name}\"\nprivate_key = \"{}\"\n",
            key()
        ));
        assert_has(&e, "interface.name");
    }
}

#[test]
fn ipv6_needs_an_mtu_of_at_least_1280() {
    let e = errors(&format!(
        "[interface]\nname = \"wg0\"\nprivate_key = \"{}\"\naddress = [\"fd00::1/64\"]\nmtu = 1200\n",
        key()
    ));
    assert_has(&e, "the minimum for IPv6");
}

#[test]
fn wg_quick_files_import_to_a_config_that_parses() {
    let (k, p, psk) = (key(), public(), key());
    let conf = format!(
        "# site a\n[Interface]\nPrivateKey = {k}\nAddress = 10.77.0.1/24, fd77::1/64\nListenPort = 51820\n\
         DNS = 10.77.0.53\nPostUp = iptables -A FORWARD\nMTU = 1400\n\n\
         [Peer]\nPublicKey = {p}\nPresharedKey = {psk}\nEndpoint = 192.0.2.2:51820\n\
         AllowedIPs = 10.77.0.2/32, 10.20.0.0/16\nPersistentKeepalive = 25\n"
    );
    let toml = config::import_wg_quick(&conf, "site-a").unwrap();
    assert!(toml.contains("# not imported (no tunneld equivalent): [Interface] DNS = 10.77.0.53"));
    assert!(toml.contains("PostUp"));
    let c = config::parse(&toml).unwrap();
    assert_eq!(c.interface.as_ref().unwrap().name, "site-a");
    assert_eq!(c.interface.as_ref().unwrap().listen_port, 51820);
    assert_eq!(c.interface.as_ref().unwrap().mtu, 1400);
    assert_eq!(c.interface.as_ref().unwrap().addresses.len(), 2);
    assert_eq!(c.peers[0].allowed_ips.len(), 2);
    assert_eq!(c.peers[0].persistent_keepalive, 25);
    assert!(matches!(
        c.peers[0].preshared_key,
        Some(KeySource::Inline(_))
    ));

    let bad = config::import_wg_quick("[Interface]\nPrivateKey\n[Wat]\n", "x").unwrap_err();
    assert_eq!(bad.0.len(), 2, "{bad}");
}

#[test]
fn arbitrary_text_never_panics() {
    let seeds = [
        "[interface]\nname = \"wg0\"\n",
        "[[peer]]\nallowed_ips = [1, 2]\n",
        "[interface]\nmtu = 1e9\n",
        "[dataplane]\ncpus = [-1, \"x\"]\nworkers = \"many\"\n",
    ];
    for seed in seeds {
        for cut in 0..seed.len() {
            if seed.is_char_boundary(cut) {
                let _ = config::parse(&seed[..cut]);
            }
        }
    }
}

#[test]
fn the_xdp_interface_goes_with_the_xdp_backend_only() {
    let text = |backend: &str| {
        format!(
            "[interface]\nname = \"wg0\"\nprivate_key = \"{}\"\n\n[dataplane]\nbackend = \"{backend}\"\nxdp_interface = \"eth0\"\n",
            key()
        )
    };
    let c = config::parse(&text("xdp")).unwrap();
    assert_eq!(c.dataplane.backend, Backend::Xdp);
    assert_eq!(c.dataplane.xdp_interface.as_deref(), Some("eth0"));
    let e = errors(&text("mmsg"));
    assert_has(
        &e,
        "dataplane.xdp_interface: is only used with backend = \"xdp\" (this config says `mmsg`)",
    );
}

#[test]
fn xdp_checksum_offload_is_on_by_default_and_goes_with_the_xdp_backend_only() {
    let text = |backend: &str, line: &str| {
        format!(
            "[interface]\nname = \"wg0\"\nprivate_key = \"{}\"\n\n[dataplane]\nbackend = \"{backend}\"\n{line}",
            key()
        )
    };
    assert!(
        config::parse(&text("xdp", ""))
            .unwrap()
            .dataplane
            .xdp_checksum_offload
    );
    let off = config::parse(&text("xdp", "xdp_checksum_offload = false\n")).unwrap();
    assert!(!off.dataplane.xdp_checksum_offload);
    assert_has(
        &errors(&text("xdp", "xdp_checksum_offload = \"no\"\n")),
        "dataplane.xdp_checksum_offload: must be true or false, not \"no\"",
    );
    assert_has(
        &errors(&text("uring", "xdp_checksum_offload = false\n")),
        "dataplane.xdp_checksum_offload: is only used with backend = \"xdp\" (this config says `uring`)",
    );
}
