//! Config validation, error by error: each bad value gives one line naming its field, all of
//! them at once, never echoing a secret; wg-quick files import to configs that parse.

use tunneld_config::{
    self as config, Backend, ClampMss, Config, Endpoint, KeySource, Parallel, Workers,
};
use tunneld_crypto::{PresharedKey, PrivateKey, PublicKey};

/// Fixed keys, so that failures are reproducible.
fn private(byte: u8) -> PrivateKey {
    PrivateKey::from_bytes([byte; 32])
}
fn public(byte: u8) -> PublicKey {
    private(byte).public_key()
}

/// A valid `[interface]` with an inline key, followed by `rest`.
fn with_interface(rest: &str) -> String {
    format!(
        "[interface]\nname = \"wg0\"\nprivate_key = \"{}\"\n{rest}",
        private(1).to_base64().as_str()
    )
}

fn errors(text: &str) -> Vec<String> {
    match config::parse(text) {
        Ok(c) => panic!("accepted: {c:?}\n{text}"),
        Err(e) => {
            assert!(!e.0.is_empty(), "an error without a line");
            e.0.iter().map(ToString::to_string).collect()
        }
    }
}

/// The one error `text` gives.
fn error(text: &str) -> String {
    let e = errors(text);
    assert_eq!(e.len(), 1, "{e:#?}");
    e.into_iter().next().unwrap_or_default()
}

fn ok(text: &str) -> Config {
    config::parse(text).unwrap_or_else(|e| panic!("refused:\n{e}\n---\n{text}"))
}

#[test]
fn the_brief_example_parses_to_the_model() {
    let text = format!(
        r#"
[interface]
name = "wg0"
private_key_file = "site-a.key"      # or private_key
listen_port = 51820
address = ["10.77.0.1/24", "fd77::1/64"]
mtu = 1420
fwmark = 0x20

[dataplane]
backend = "xdp"
workers = "auto"
cpus = [0, 1]

[[peer]]
public_key = "{}"
preshared_key = "{}"
endpoint = "[2001:db8::2]:51820"
allowed_ips = ["10.77.0.2/32", "10.20.0.9/16", "fd20::1/48"]
persistent_keepalive = 25
parallel = 2
"#,
        public(2),
        PresharedKey::from_bytes([9; 32]).to_base64().as_str()
    );
    let c = ok(&text);
    assert_eq!(
        c.interface.as_ref().unwrap().private_key,
        KeySource::File("site-a.key".into())
    );
    // Interface addresses keep their host bits; allowed IPs are truncated to the network.
    assert_eq!(
        c.interface.as_ref().unwrap().addresses[1].to_string(),
        "fd77::1/64"
    );
    assert_eq!(c.interface.as_ref().unwrap().fwmark, 0x20);
    assert_eq!(c.dataplane.backend, Backend::Xdp);
    assert_eq!(c.dataplane.workers, Workers::Auto);
    let peer = &c.peers[0];
    assert_eq!(peer.public_key, public(2));
    assert_eq!(
        peer.preshared_key,
        Some(KeySource::Inline(PresharedKey::from_bytes([9; 32])))
    );
    assert_eq!(
        peer.endpoint.as_ref().map(ToString::to_string).as_deref(),
        Some("[2001:db8::2]:51820")
    );
    let nets: Vec<String> = peer.allowed_ips.iter().map(ToString::to_string).collect();
    assert_eq!(nets, ["10.77.0.2/32", "10.20.0.0/16", "fd20::/48"]);
    assert_eq!(peer.parallel, Parallel::Count(2));
    // The model compares whole: parsing twice gives the same config.
    assert_eq!(ok(&text), c);
}

#[test]
fn each_bad_field_gives_one_line_naming_it() {
    let key = public(2);
    for (rest, expected) in [
        (
            "listen_port = 65536\n",
            "interface.listen_port: 65536 is out of range 0-65535",
        ),
        (
            "listen_port = \"51820\"\n",
            "interface.listen_port: must be an integer, not \"51820\"",
        ),
        (
            "mtu = 575\n",
            "interface.mtu: 575 is out of range 576-65535",
        ),
        (
            "mtu = 1279\naddress = [\"fd00::1/64\"]\n",
            "interface.mtu: 1279 is below 1280, the minimum for IPv6, and an IPv6 address is configured",
        ),
        (
            "fwmark = -1\n",
            "interface.fwmark: -1 is out of range 0-4294967295",
        ),
        (
            "address = [\"10.0.0.1/33\"]\n",
            "interface.address[0]: `10.0.0.1/33` is not a CIDR (prefix length 33 > 32)",
        ),
        (
            "address = [\"10.0.0.1\", 7]\n",
            "interface.address[1]: must be a string, not integer",
        ),
        (
            "address = [\"0.0.0.0/8\"]\n",
            "interface.address[0]: `0.0.0.0/8` is not a usable interface address",
        ),
        (
            "adress = []\n",
            "interface: unknown field `adress` (did you mean `address`?)",
        ),
        (
            "[dataplane]\nbackend = \"dpdk\"\n",
            "dataplane.backend: `dpdk` is not a backend (expected one of: auto, xdp, uring, mmsg)",
        ),
        (
            "[dataplane]\nworkers = 0\n",
            "dataplane.workers: 0 is out of range 1-256, the queues a TUN device has (or write \"auto\")",
        ),
        (
            "[dataplane]\nworkers = \"all\"\n",
            "dataplane.workers: must be \"auto\" or a number, not \"all\"",
        ),
        (
            "[dataplane]\ncpus = [1, 1]\n",
            "dataplane.cpus[1]: CPU 1 is already listed at [0]",
        ),
        (
            "[dataplane]\ncpus = []\n",
            "dataplane.cpus: is empty (leave it out to use every CPU)",
        ),
        (
            "[dataplane]\ncpu = [0]\n",
            "dataplane: unknown field `cpu` (did you mean `cpus`?)",
        ),
        (
            &format!("[[peer]]\npublic_key = \"{key}\"\nalowed_ips = []\n"),
            "peer[0]: unknown field `alowed_ips` (did you mean `allowed_ips`?)",
        ),
        (
            &format!("[[peer]]\npublic_key = \"{key}\"\nallowed_ips = [\"10.0.0.0/33\"]\n"),
            "peer[0].allowed_ips[0]: `10.0.0.0/33` is not a CIDR (prefix length 33 > 32)",
        ),
        (
            &format!("[[peer]]\npublic_key = \"{key}\"\nallowed_ips = [\"10.0.0.0/8x\"]\n"),
            "peer[0].allowed_ips[0]: `10.0.0.0/8x` is not a CIDR (prefix length `8x` is not a number 0-32)",
        ),
        (
            &format!("[[peer]]\npublic_key = \"{key}\"\npersistent_keepalive = 65536\n"),
            "peer[0].persistent_keepalive: 65536 is out of range 0-65535",
        ),
        (
            &format!("[[peer]]\npublic_key = \"{key}\"\nparallel = 0\n"),
            "peer[0].parallel: 0 is out of range 1-64",
        ),
        (
            &format!("[[peer]]\npublic_key = \"{key}\"\nparallel = 4\n[dataplane]\nworkers = 2\n"),
            "peer[0].parallel: 4 sub-tunnels need as many workers, and dataplane.workers is 2",
        ),
        (
            &format!("[[peer]]\npublic_key = \"{key}\"\nparallel = \"many\"\n"),
            "peer[0].parallel: must be a number of sub-tunnels (1-64) or \"auto\", not \"many\"",
        ),
        (
            "[[peer]]\nendpoint = \"192.0.2.1:1\"\n",
            "peer[0].public_key: missing (the peer's base64 key, as `wg pubkey` prints it)",
        ),
        (
            "[[peer]]\npublic_key = \"AAAA\"\n",
            "peer[0].public_key: `AAAA` decodes to 3 bytes, a key is 32 bytes (44 base64 characters)",
        ),
        (
            "[[peers]]\nx = 1\n",
            "config: unknown section `[[peers]]` (did you mean `[[peer]]`?)",
        ),
        (
            "[dataplan]\n",
            "config: unknown section `[dataplan]` (did you mean `[dataplane]`?)",
        ),
    ] {
        assert_eq!(error(&with_interface(rest)), expected, "{rest}");
    }
}

#[test]
fn endpoints_are_checked_and_shown_as_written() {
    for (text, shown) in [
        ("192.0.2.2:51820", "192.0.2.2:51820"),
        ("[2001:db8::2]:51820", "[2001:db8::2]:51820"),
        ("[fe80::1%3]:51820", "[fe80::1%3]:51820"),
        ("gw.example.net:51820", "gw.example.net:51820"),
        ("gw.example.net.:443", "gw.example.net.:443"),
        ("_srv-name.example:1", "_srv-name.example:1"),
    ] {
        match text.parse::<Endpoint>() {
            Ok(e) => assert_eq!(e.to_string(), shown),
            Err(why) => panic!("{text}: {why}"),
        }
    }
    for (text, why) in [
        ("192.0.2.2", "`192.0.2.2` has no port (write host:port)"),
        ("192.0.2.2:", "`192.0.2.2:` has no port after `:`"),
        (
            "192.0.2.2:0",
            "`192.0.2.2:0` has port 0; give the port the peer listens on (1-65535)",
        ),
        (
            "192.0.2.2:65536",
            "`192.0.2.2:65536`: port `65536` is out of range 1-65535",
        ),
        (
            "192.0.2.2:http",
            "`192.0.2.2:http`: port `http` is not a number",
        ),
        (
            "192.0.2.300:1",
            "`192.0.2.300:1`: `192.0.2.300` is not a valid IPv4 address",
        ),
        (
            "2001:db8::2:51820",
            "`2001:db8::2:51820`: write IPv6 endpoints in brackets, as [address]:port",
        ),
        (
            "[2001:db8::2]",
            "`[2001:db8::2]` has no port (write [address]:port)",
        ),
        (
            "[2001:db8::2:51820",
            "`[2001:db8::2:51820` has no `]` after the IPv6 address",
        ),
        (
            "[2001:db8::2]51820",
            "`[2001:db8::2]51820`: expected `:port` after `]`",
        ),
        (
            "[192.0.2.2]:1",
            "`[192.0.2.2]:1`: `192.0.2.2` is not an IPv6 address",
        ),
        (
            "[fe80::1%eth0]:1",
            "`[fe80::1%eth0]:1`: the zone `eth0` must be an interface index (a number)",
        ),
        (":51820", "`:51820` has no host before the port"),
        (
            "bad host:1",
            "`bad host:1`: `bad host` is not an IP address or host name",
        ),
        (
            "-x.example:1",
            "`-x.example:1`: `-x.example` is not an IP address or host name",
        ),
        ("", "is empty (write host:port)"),
    ] {
        assert_eq!(text.parse::<Endpoint>().unwrap_err(), why, "{text}");
    }
    // And in a file, under the peer's field.
    let e = error(&with_interface(&format!(
        "[[peer]]\npublic_key = \"{}\"\nendpoint = \"[::1]\"\n",
        public(2)
    )));
    assert_eq!(
        e,
        "peer[0].endpoint: `[::1]` has no port (write [address]:port)"
    );
}

#[test]
fn interface_names_follow_the_kernel_rules() {
    for name in ["wg0", "a", "fifteen-chars-x", "wg.site-a", "wg_0"] {
        let c = ok(&format!(
            "[interface]\nname = \"{name}\"\nprivate_key_file = \"k\"\n"
        ));
        assert_eq!(c.interface.as_ref().unwrap().name, name);
    }
    for (name, why) in [
        ("", "is empty (e.g. \"wg0\")"),
        (
            "sixteen-chars-xx",
            "`sixteen-chars-xx` is longer than 15 bytes",
        ),
        ("ééééééééé", "`ééééééééé` is longer than 15 bytes"),
        (".", "`.` is not a valid interface name"),
        ("..", "`..` is not a valid interface name"),
        ("a/b", "`a/b` contains '/', which interface names cannot"),
        ("a:b", "`a:b` contains ':', which interface names cannot"),
        ("a b", "`a b` contains ' ', which interface names cannot"),
        (
            "a\\tb",
            "`a\\tb` contains '\\t', which interface names cannot",
        ),
        (
            "a\\u0000b",
            "`a\\u{0}b` contains '\\0', which interface names cannot",
        ),
    ] {
        let e = error(&format!(
            "[interface]\nname = \"{name}\"\nprivate_key_file = \"k\"\n"
        ));
        assert_eq!(e, format!("interface.name: {why}"), "{name}");
    }
}

#[test]
fn every_problem_is_reported_in_one_pass() {
    let e = errors(&format!(
        r#"
[interface]
name = "wg0/1"
private_key = "{own}"
listen_port = -5
address = ["fd00::1/64", "10.0.0.1/40"]
mtu = 1000

[dataplane]
backend = "fast"
workers = 0

[[peer]]
public_key = "{own_public}"
endpoint = "example.org"
allowed_ips = ["10.1.0.0/16"]

[[peer]]
public_key = "AAAA"
allowed_ips = ["10.2.0.0/16"]

[[peer]]
public_key = "{p}"
allowed_ips = ["10.1.0.7/16", "10.2.0.0/16", "bogus"]
persistent_keepalive = 1.5

[[peer]]
public_key = "{p}"
"#,
        own = private(1).to_base64().as_str(),
        own_public = public(1),
        p = public(3),
    ));
    let expected = [
        "interface.name: `wg0/1` contains '/', which interface names cannot",
        "interface.listen_port: -5 is out of range 0-65535",
        "interface.address[1]: `10.0.0.1/40` is not a CIDR (prefix length 40 > 32)",
        "interface.mtu: 1000 is below 1280, the minimum for IPv6, and an IPv6 address is configured",
        "dataplane.backend: `fast` is not a backend (expected one of: auto, xdp, uring, mmsg)",
        "dataplane.workers: 0 is out of range 1-256, the queues a TUN device has (or write \"auto\")",
        "peer[0].endpoint: `example.org` has no port (write host:port)",
        "peer[1].public_key: `AAAA` decodes to 3 bytes, a key is 32 bytes (44 base64 characters)",
        "peer[2].allowed_ips[2]: `bogus` is not a CIDR (write address/prefix, e.g. 10.0.0.0/24)",
        "peer[2].persistent_keepalive: must be an integer, not float",
        "peer[0].public_key: is the interface's own public key (a gateway cannot be its own peer)",
        "peer[2].allowed_ips[0]: 10.1.0.0/16 is also claimed by peer[0]",
        "peer[2].allowed_ips[1]: 10.2.0.0/16 is also claimed by peer[1]",
        "peer[3].public_key: duplicate of peer[2]",
    ];
    assert_eq!(e, expected);
}

#[test]
fn key_sources_are_one_of_two() {
    let k = private(1).to_base64().to_string();
    let c = ok(&format!(
        "[interface]\nname = \"wg0\"\nprivate_key = \"{k}\"\n"
    ));
    assert_eq!(
        c.interface.as_ref().unwrap().private_key,
        KeySource::Inline(private(1))
    );
    for (body, expected) in [
        (
            String::new(),
            "interface: missing `private_key` or `private_key_file`".to_string(),
        ),
        (
            format!("private_key = \"{k}\"\nprivate_key_file = \"k\"\n"),
            "interface: give `private_key` or `private_key_file`, not both".into(),
        ),
        (
            "private_key_file = \"\"\n".into(),
            "interface.private_key_file: is empty (give a file path)".into(),
        ),
        (
            "private_key = 5\n".into(),
            "interface.private_key: must be a string, not integer".into(),
        ),
        (
            "private_key_file = \"k\"\n[[peer]]\npublic_key = \"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\"\npreshared_key = \"x\"\npreshared_key_file = \"y\"\n".into(),
            "peer[0]: give `preshared_key` or `preshared_key_file`, not both".into(),
        ),
    ] {
        assert_eq!(
            error(&format!("[interface]\nname = \"wg0\"\n{body}")),
            expected
        );
    }
}

#[test]
fn secrets_are_never_echoed() {
    // Wrong length, bad base64, and a key in the wrong place: none of them may print it.
    let secret_long = "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldA==";
    let secret_bad = "c2VjcmV0!!!c2VjcmV0";
    for (text, needle) in [
        (
            format!("[interface]\nname = \"wg0\"\nprivate_key = \"{secret_long}\"\n"),
            "interface.private_key: the key decodes to 34 bytes, a key is 32 bytes (44 base64 characters)",
        ),
        (
            format!("[interface]\nname = \"wg0\"\nprivate_key = \"{secret_bad}\"\n"),
            "interface.private_key: the key is not valid base64",
        ),
        (
            format!(
                "[interface]\nname = \"wg0\"\nprivate_key_file = \"k\"\n[[peer]]\npublic_key = \"{}\"\npreshared_key = \"{secret_long}\"\n",
                public(2)
            ),
            "peer[0].preshared_key: the key decodes to 34 bytes",
        ),
    ] {
        let e = errors(&text).join("\n");
        assert!(e.contains(needle), "{e}");
        assert!(!e.contains(secret_long) && !e.contains(secret_bad), "{e}");
    }
}

#[test]
fn toml_syntax_errors_are_one_line_with_position() {
    for (text, position) in [
        ("[interface]\nname = \"wg0\nmtu = 1\n", "line 2, column"),
        ("[interface]\nname = \"é\" x\n", "line 2, column 12"),
        ("[interface]\nname = 1\nname = 2\n", "line 3, column 1"),
    ] {
        let e = error(text);
        assert!(e.starts_with(position), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}

#[test]
fn long_and_multiline_values_stay_on_one_line() {
    let e = error(&with_interface(
        "[dataplane]\nbackend = \"\"\"\nturbo\nboost\"\"\"\n",
    ));
    assert_eq!(
        e,
        "dataplane.backend: `turbo\\nboost` is not a backend (expected one of: auto, xdp, uring, mmsg)"
    );
    let e = error(&with_interface(&format!(
        "address = [\"{}\"]\n",
        "9".repeat(10_000)
    )));
    assert!(e.len() < 200, "{e}");
}

#[test]
fn mangled_configs_never_panic_and_always_explain() {
    let valid = format!(
        "[interface]\nname = \"wg0\"\nprivate_key = \"{}\"\nlisten_port = 51820\naddress = [\"10.77.0.1/24\", \"fd77::1/64\"]\n\
         [dataplane]\nbackend = \"auto\"\nworkers = 2\ncpus = [0]\n\
         [[peer]]\npublic_key = \"{}\"\nendpoint = \"[2001:db8::1]:51820\"\nallowed_ips = [\"10.77.0.2/32\"]\npersistent_keepalive = 25\n",
        private(1).to_base64().as_str(),
        public(2)
    );
    ok(&valid);
    let replacements = [
        "", "\"", "[", "]", "=", "\n", "0", "-", ":", "/", "é", "\u{0}",
    ];
    for cut in (0..=valid.len()).filter(|i| valid.is_char_boundary(*i)) {
        if let Err(e) = config::parse(&valid[..cut]) {
            assert!(!e.0.is_empty());
        }
        let next = valid[cut..]
            .chars()
            .next()
            .map_or(cut, |c| cut + c.len_utf8());
        for r in replacements {
            let text = format!("{}{r}{}", &valid[..cut], &valid[next..]);
            if let Err(e) = config::parse(&text) {
                assert!(!e.0.is_empty(), "{text}");
                assert!(e.0.iter().all(|e| !e.to_string().contains('\n')), "{e}");
            }
        }
    }
}

#[test]
fn errors_display_one_per_line() {
    let e = config::parse("[interface]\n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "interface.name: missing (the interface to create, e.g. \"wg0\")\n\
         interface: missing `private_key` or `private_key_file`"
    );
    let _: &dyn std::error::Error = &e;
}

fn sample_conf() -> String {
    format!(
        "# Site A\n\
         [Interface]\n\
         PrivateKey = {}   # ours\n\
         Address = 10.77.0.1/24,fd77::1/64\n\
         address = 10.78.0.1/24\n\
         ListenPort = 51820\n\
         MTU = 1400\n\
         FwMark = 0x1f\n\
         DNS = 10.77.0.53\n\
         Table = off\n\
         PostUp = iptables -A FORWARD -i %i -j ACCEPT\n\
         SaveConfig = true\n\
         \n\
         [Peer]\n\
         PublicKey = {}\n\
         PresharedKey = {}\n\
         Endpoint = vpn.example.org:51820\n\
         AllowedIPs = 10.77.0.2/32, 10.20.0.0/16\n\
         AllowedIPs = fd77::2/128\n\
         PersistentKeepalive = off\n\
         \n\
         [peer]\n\
         publickey = {}\n\
         allowedips = 10.30.0.0/16\n",
        private(1).to_base64().as_str(),
        public(2),
        PresharedKey::from_bytes([7; 32]).to_base64().as_str(),
        public(3),
    )
}

#[test]
fn wg_quick_import_keeps_everything_it_can_and_says_what_it_cannot() {
    let toml = config::import_wg_quick(&sample_conf(), "site-a").unwrap();
    for skipped in [
        "# not imported (no tunneld equivalent): [Interface] DNS = 10.77.0.53\n",
        "# not imported (no tunneld equivalent): [Interface] Table = off\n",
        "# not imported (no tunneld equivalent): [Interface] PostUp = iptables -A FORWARD -i %i -j ACCEPT\n",
        "# not imported (no tunneld equivalent): [Interface] SaveConfig = true\n",
    ] {
        assert!(toml.contains(skipped), "{skipped}\n---\n{toml}");
    }
    // Written in the documented order, name first.
    assert!(
        toml.contains("[interface]\nname = \"site-a\"\nprivate_key = "),
        "{toml}"
    );
    let c = ok(&toml);
    assert_eq!(
        c.interface.as_ref().unwrap().private_key,
        KeySource::Inline(private(1))
    );
    assert_eq!(c.interface.as_ref().unwrap().listen_port, 51820);
    assert_eq!(c.interface.as_ref().unwrap().mtu, 1400);
    assert_eq!(c.interface.as_ref().unwrap().fwmark, 0x1f);
    let addresses: Vec<String> = c
        .interface
        .as_ref()
        .unwrap()
        .addresses
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(addresses, ["10.77.0.1/24", "fd77::1/64", "10.78.0.1/24"]);
    assert_eq!(c.peers.len(), 2);
    assert_eq!(c.peers[0].public_key, public(2));
    assert_eq!(
        c.peers[0].preshared_key,
        Some(KeySource::Inline(PresharedKey::from_bytes([7; 32])))
    );
    assert_eq!(
        c.peers[0].endpoint,
        Some(Endpoint::Host {
            host: "vpn.example.org".into(),
            port: 51820
        })
    );
    assert_eq!(c.peers[0].allowed_ips.len(), 3);
    assert_eq!(c.peers[0].persistent_keepalive, 0);
    assert_eq!(c.peers[1].public_key, public(3));
}

#[test]
fn wg_quick_import_errors_name_the_conf_line() {
    let e = config::import_wg_quick(
        "Address = 10.0.0.1/24\n[Interface]\nListenPort = many\nPrivateKey\n[Wat]\n",
        "wg0",
    )
    .unwrap_err();
    let lines: Vec<String> = e.0.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            "line 1: `Address` is outside an [Interface] or [Peer] section",
            "line 3: ListenPort: `many` is not a number",
            "line 4: expected `Key = Value`",
            "line 5: unknown section `[Wat]` (expected [Interface] or [Peer])",
        ]
    );

    // Problems found by validating the result point back at the .conf too; keys stay hidden.
    let secret = "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldA==";
    let conf = format!(
        "[Interface]\nPrivateKey = {secret}\nListenPort = 70000\n\n[Peer]\nAllowedIPs = 10.0.0.0/8,\n  \nAllowedIPs = 10.0.0.1/33\n"
    );
    let e = config::import_wg_quick(&conf, "wg0").unwrap_err();
    let lines: Vec<String> = e.0.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            "line 2 (PrivateKey): the key decodes to 34 bytes, a key is 32 bytes (44 base64 characters)",
            "line 3 (ListenPort): 70000 is out of range 0-65535",
            "peer[0].public_key ([Peer] at line 5): missing (the peer's base64 key, as `wg pubkey` prints it)",
            "line 8 (AllowedIPs): `10.0.0.1/33` is not a CIDR (prefix length 33 > 32)",
        ]
    );
    assert!(!e.to_string().contains(secret));
}

#[test]
fn wg_quick_import_never_panics() {
    let conf = sample_conf();
    for cut in (0..=conf.len()).filter(|i| conf.is_char_boundary(*i)) {
        for name in ["wg0", "", "a/b"] {
            if let Err(e) = config::import_wg_quick(&conf[..cut], name) {
                assert!(!e.0.is_empty());
            }
        }
    }
    // A key in the wrong section is refused (it may be a secret that a comment would copy);
    // an unknown key is kept as a comment that says so.
    let e = config::import_wg_quick(
        "[Peer]\nPrivateKey = c2VjcmV0\n[Interface]\nEndpoint = 192.0.2.1:1\n",
        "wg0",
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "line 2: `PrivateKey` belongs in [Interface], not [Peer]\n\
         line 4: `Endpoint` belongs in [Peer], not [Interface]"
    );
    let toml = config::import_wg_quick(
        &format!(
            "[Interface]\nPrivateKey = {}\nListenPrt = 1\n",
            private(1).to_base64().as_str()
        ),
        "wg0",
    )
    .unwrap();
    assert!(
        toml.contains("\n# not imported (unknown key): [Interface] ListenPrt = 1\n"),
        "{toml}"
    );
    // Control characters in a skipped line cannot break the TOML comment it becomes.
    let toml = config::import_wg_quick(
        &format!(
            "[Interface]\nPrivateKey = {}\nPostUp = echo \u{7f}\u{1}x\n",
            private(1).to_base64().as_str()
        ),
        "wg0",
    )
    .unwrap();
    assert!(toml.contains("PostUp = echo ??x"), "{toml}");
}

const TLS_ONLY: &str = r#"
[[tls.forward]]
listen = "127.0.0.1:15201"
connect = "site-b.example:8443"
server_name = "site-b.example"
ca_file = "ca.pem"

[[tls.forward]]
listen = "[::1]:15202"
connect = "192.0.2.2:8444"
server_name = "192.0.2.2"
ca_file = "ca.pem"
cert_file = "client.pem"
key_file = "client.key"

[[tls.listen]]
listen = "0.0.0.0:8443"
cert_file = "server.pem"
key_file = "server.key"
forward_to = "127.0.0.1:5201"
client_ca_file = "clients.pem"
"#;

#[test]
fn a_tls_only_config_needs_no_interface() {
    let c = ok(TLS_ONLY);
    assert!(c.interface.is_none() && c.peers.is_empty());
    assert_eq!(c.tls.forwards.len(), 2);
    let f = &c.tls.forwards[0];
    assert_eq!(f.listen, "127.0.0.1:15201".parse().unwrap());
    assert_eq!(f.connect.to_string(), "site-b.example:8443");
    assert_eq!(f.server_name, "site-b.example");
    assert!(f.client_cert.is_none());
    let mtls = c.tls.forwards[1].client_cert.as_ref().unwrap();
    assert_eq!(mtls.key_file, std::path::Path::new("client.key"));
    let l = &c.tls.listens[0];
    assert_eq!(l.forward_to.to_string(), "127.0.0.1:5201");
    assert_eq!(
        l.client_ca_file.as_deref(),
        Some(std::path::Path::new("clients.pem"))
    );
}

#[test]
fn a_listener_offers_the_groups_it_lists_in_their_order() {
    assert_eq!(ok(TLS_ONLY).tls.listens[0].groups, None);
    let with = |groups: &str| format!("{TLS_ONLY}groups = {groups}\n");
    let c = ok(&with(r#"["x25519", "SECP256R1", "X25519MLKEM768"]"#));
    assert_eq!(
        c.tls.listens[0].groups.as_deref(),
        Some(&["X25519", "secp256r1", "X25519MLKEM768"][..])
    );
    // The opt-in groups, which no listener offers unless it lists them.
    let c = ok(&with(r#"["X448", "ffdhe2048", "FFDHE8192", "secp521r1"]"#));
    assert_eq!(
        c.tls.listens[0].groups.as_deref(),
        Some(&["X448", "ffdhe2048", "ffdhe8192", "secp521r1"][..])
    );
    assert_eq!(
        error(&with(r#"["x25519", "ffdhe1024"]"#)),
        "tls.listen[0].groups[1]: `ffdhe1024` is not a key exchange group tunneld offers \
         (known: X25519MLKEM768, X25519, secp256r1, secp384r1, secp521r1, X448, ffdhe2048, \
         ffdhe3072, ffdhe4096, ffdhe6144, ffdhe8192)"
    );
    assert_eq!(
        error(&with(r#"["X25519", "x25519"]"#)),
        "tls.listen[0].groups[1]: X25519 is listed twice"
    );
    assert!(error(&with("[]")).starts_with("tls.listen[0].groups: is empty"));
    assert_eq!(
        error(&with(r#""X25519""#)),
        "tls.listen[0].groups: must be a list of strings, not string"
    );
}

#[test]
fn tls_sections_go_with_an_interface_too() {
    let text = with_interface(TLS_ONLY);
    let c = ok(&text);
    assert!(c.interface.is_some());
    assert_eq!(c.tls.listens.len(), 1);
}

#[test]
fn tls_errors_name_their_field() {
    let bad = r#"
[[tls.forward]]
listen = "localhost:15201"
connect = "site-b.example"
server_name = "not a name!"
cert_file = "client.pem"
colour = "blue"

[[tls.listen]]
listen = "0.0.0.0:0"
forward_to = "127.0.0.1:5201"
"#;
    let e = errors(bad);
    let expect = [
        "tls.forward[0].listen: `localhost:15201` is not an address:port",
        "tls.forward[0].connect: `site-b.example` has no port",
        "tls.forward[0].server_name: `not a name!` is not a DNS name or an IP address",
        "tls.forward[0].ca_file: missing",
        "tls.forward[0].key_file: missing: `cert_file` needs `key_file` too",
        "tls.forward[0]: unknown field `colour`",
        "tls.listen[0].listen: `0.0.0.0:0`: the port must not be 0",
        "tls.listen[0].cert_file: missing",
        "tls.listen[0].key_file: missing",
    ];
    for want in expect {
        assert!(
            e.iter().any(|l| l.starts_with(want)),
            "no {want:?} in {e:#?}"
        );
    }
    assert_eq!(e.len(), expect.len(), "{e:#?}");
}

#[test]
fn tls_shapes_and_clashes_are_refused() {
    assert!(error("[tls.forward]\nlisten = \"127.0.0.1:1\"\n")
        .starts_with("tls.forward: must be a list of tables: write [[tls.forward]]"));
    assert_eq!(
        error("[tls]\n"),
        "tls: has no [[tls.forward]] or [[tls.listen]] sections, and there is no [interface]: nothing to run"
    );
    assert!(error("[tls]\nforwards = 1\n")
        .contains("unknown field `forwards` (did you mean `forward`?)"));
    let twice = format!(
        "{TLS_ONLY}\n[[tls.listen]]\nlisten = \"127.0.0.1:15201\"\ncert_file = \"s.pem\"\nkey_file = \"s.key\"\nforward_to = \"127.0.0.1:1\"\n"
    );
    assert_eq!(
        error(&twice),
        "tls.listen[1].listen: 127.0.0.1:15201 is already used by tls.forward[0].listen"
    );
    let peers_only = "[[peer]]\npublic_key = \"x\"\n[[tls.listen]]\n";
    assert!(errors(peers_only)
        .iter()
        .any(|l| l == "interface: missing [interface] section (the [[peer]] sections need one)"));
    assert_eq!(
        error(""),
        "interface: missing [interface] section (or [[tls.forward]]/[[tls.listen]] for TLS forwarding only)"
    );
}

#[test]
fn a_peer_over_tls_names_its_server_and_ca() {
    let peer = |extra: &str| {
        with_interface(&format!(
            "[[peer]]\npublic_key = \"{}\"\nallowed_ips = [\"10.0.0.2/32\"]\n{extra}",
            public(2)
        ))
    };
    let c = ok(&peer(
        "transport = \"tls\"\nendpoint = \"site-b.example:443\"\ntls_server_name = \"site-b.example\"\ntls_ca_file = \"ca.pem\"\n",
    ));
    let tls = c.peers[0].tls.as_ref().unwrap();
    assert_eq!(tls.server_name, "site-b.example");
    assert!(tls.client_cert.is_none());
    assert!(ok(&peer("transport = \"udp\"\n")).peers[0].tls.is_none());
    assert_eq!(
        error(&peer("transport = \"quic\"\n")),
        "peer[0].transport: `quic` is not a transport (expected \"udp\", \"tls\" or \"auto\")"
    );
    assert_eq!(
        error(&peer("tls_ca_file = \"ca.pem\"\n")),
        "peer[0].tls_ca_file: is only used with transport = \"tls\" or \"auto\""
    );
    let e = errors(&peer("transport = \"tls\"\ntls_cert_file = \"c.pem\"\n"));
    for want in [
        "peer[0].endpoint: missing: with transport = \"tls\"",
        "peer[0].tls_server_name: missing",
        "peer[0].tls_ca_file: missing",
        "peer[0].tls_key_file: missing: `tls_cert_file` needs `tls_key_file` too",
    ] {
        assert!(
            e.iter().any(|l| l.starts_with(want)),
            "no {want:?} in {e:#?}"
        );
    }
    assert_eq!(e.len(), 4, "{e:#?}");
    assert_eq!(
        error("[[tls.listen]]\nlisten = \"0.0.0.0:443\"\ncert_file = \"s.pem\"\nkey_file = \"s.key\"\nforward_to = \"wireguard\"\n"),
        "tls.listen[0].forward_to: \"wireguard\" needs an [interface] in this config"
    );
    let with_wg = with_interface(
        "[[tls.listen]]\nlisten = \"0.0.0.0:443\"\ncert_file = \"s.pem\"\nkey_file = \"s.key\"\nforward_to = \"wireguard\"\n",
    );
    assert_eq!(
        ok(&with_wg).tls.listens[0].forward_to,
        config::TlsTarget::WireGuard
    );
}

#[test]
fn an_auto_peer_has_a_udp_endpoint_and_a_tls_one() {
    let peer = |extra: &str| {
        with_interface(&format!(
            "[[peer]]\npublic_key = \"{}\"\nallowed_ips = [\"10.0.0.2/32\"]\n\
             tls_server_name = \"b.example\"\ntls_ca_file = \"ca.pem\"\n{extra}",
            public(2)
        ))
    };
    let c = ok(&peer(
        "transport = \"auto\"\nendpoint = \"192.0.2.2:51820\"\ntls_endpoint = \"b.example:443\"\n",
    ));
    assert_eq!(
        c.peers[0].endpoint.as_ref().unwrap().to_string(),
        "192.0.2.2:51820"
    );
    let tls = c.peers[0].tls.as_ref().unwrap();
    assert_eq!(tls.fallback.as_ref().unwrap().to_string(), "b.example:443");
    assert!(error(&peer(
        "transport = \"auto\"\nendpoint = \"192.0.2.2:51820\"\n"
    ))
    .starts_with("peer[0].tls_endpoint: missing"));
    assert!(error(&peer(
        "transport = \"auto\"\ntls_endpoint = \"b.example:443\"\n"
    ))
    .starts_with(
        "peer[0].endpoint: missing: with transport = \"auto\" it is the peer's UDP address"
    ));
    assert!(error(&peer(
        "transport = \"tls\"\nendpoint = \"b.example:443\"\ntls_endpoint = \"b.example:443\"\n"
    ))
    .starts_with("peer[0].tls_endpoint: is only used with transport = \"auto\""));
}

#[test]
fn parallel_auto_is_one_sub_tunnel_per_worker() {
    let text = with_interface(&format!(
        "[[peer]]\npublic_key = \"{}\"\nparallel = \"auto\"\n",
        public(2)
    ));
    let parallel = ok(&text).peers[0].parallel;
    assert_eq!(parallel, Parallel::Auto);
    assert!(!parallel.is_plain());
    assert_eq!(parallel.sub_tunnels(1), 1);
    assert_eq!(parallel.sub_tunnels(6), 6);
    // Never more than a peer can be split into, whatever the worker count.
    assert_eq!(parallel.sub_tunnels(256), config::MAX_PARALLEL);
    // Leaving it out, or 1, is a plain peer.
    let text = with_interface(&format!("[[peer]]\npublic_key = \"{}\"\n", public(2)));
    assert!(ok(&text).peers[0].parallel.is_plain());
    assert_eq!(Parallel::Count(3).sub_tunnels(8), 3);
}

#[test]
fn metrics_takes_an_address_and_serves_wireguard_or_tls() {
    let c = ok(&with_interface("[metrics]\nlisten = \"127.0.0.1:9586\"\n"));
    assert_eq!(
        c.metrics.map(|m| m.listen.to_string()).as_deref(),
        Some("127.0.0.1:9586")
    );
    assert_eq!(ok(&with_interface("")).metrics, None);
    for (body, starts) in [
        (
            "[metrics]\nlisten = \"9586\"\n",
            "metrics.listen: `9586` is not an address:port",
        ),
        ("[metrics]\n", "metrics.listen: missing"),
        (
            "[metrics]\nlisten = \"127.0.0.1:9586\"\nport = 1\n",
            "metrics: unknown field `port`",
        ),
    ] {
        let e = error(&with_interface(body));
        assert!(e.starts_with(starts), "{body:?}: {e}");
    }
    let e = error(&format!("metrics = 1\n{}", with_interface("")));
    assert!(e.starts_with("metrics: must be a table"), "{e}");
    let tls_only =
        "[metrics]\nlisten = \"127.0.0.1:9586\"\n[[tls.forward]]\nlisten = \"127.0.0.1:1\"\n\
                    connect = \"192.0.2.2:8443\"\nserver_name = \"b.test\"\nca_file = \"ca.pem\"\n";
    assert!(
        ok(tls_only).metrics.is_some(),
        "TLS sections have counters too"
    );
}

/// `[dataplane] aead` names an implementation or `auto`; anything else is one clear error.
#[test]
fn dataplane_aead_is_auto_or_an_implementation() {
    use tunneld_crypto::aead::Implementation;
    assert_eq!(ok(&with_interface("[dataplane]\n")).dataplane.aead, None);
    assert_eq!(
        ok(&with_interface("[dataplane]\naead = \"auto\"\n"))
            .dataplane
            .aead,
        None
    );
    assert_eq!(
        ok(&with_interface("[dataplane]\naead = \"ring\"\n"))
            .dataplane
            .aead,
        Some(Implementation::Ring)
    );
    let names: Vec<&str> = Implementation::ALL.iter().map(|i| i.name()).collect();
    for (text, expected) in [
        (
            "[dataplane]\naead = \"fast\"\n".to_string(),
            format!(
                "dataplane.aead: `fast` is not an AEAD implementation (expected one of: auto, {})",
                names.join(", ")
            ),
        ),
        (
            "[dataplane]\naead = 3\n".to_string(),
            "dataplane.aead: must be a string, not integer".to_string(),
        ),
    ] {
        assert_eq!(error(&with_interface(&text)), expected, "{text}");
    }
}

// What was tests/config_parse.rs (the first suite of the model), merged here: its configs
// and the fields it checks differ from the ones above, so every assertion of it stays.

/// Fresh random keys, for the tests where any key will do.
fn random_private() -> String {
    PrivateKey::generate().to_base64().to_string()
}
fn random_public() -> String {
    PrivateKey::generate().public_key().to_base64()
}

fn assert_has(errors: &[String], needle: &str) {
    assert!(
        errors.iter().any(|e| e.contains(needle)),
        "no error containing `{needle}` in {errors:#?}"
    );
}

#[test]
fn the_documented_example_parses() {
    let (p1, p2) = (random_public(), random_public());
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
        random_private()
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
    let p = random_public();
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
clamp_mss = "always"

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
        random_private()
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
        "dataplane.clamp_mss: must be \"auto\" (from the tunnel MTU), an MSS of 536-65495 or false, not \"always\"",
    );
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
        random_private()
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
        random_private()
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
            random_private()
        ));
        assert_has(&e, "interface.name");
    }
}

#[test]
fn ipv6_needs_an_mtu_of_at_least_1280() {
    let e = errors(&format!(
        "[interface]\nname = \"wg0\"\nprivate_key = \"{}\"\naddress = [\"fd00::1/64\"]\nmtu = 1200\n",
        random_private()
    ));
    assert_has(&e, "the minimum for IPv6");
}

#[test]
fn wg_quick_files_import_to_a_config_that_parses() {
    let (k, p, psk) = (random_private(), random_public(), random_private());
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
            random_private()
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
            random_private()
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

const FLEET_INTERFACE: &str = "[interface]\nname = \"wg0\"\nprivate_key_file = \"k\"\n";

fn fleet(body: &str) -> String {
    format!("{FLEET_INTERFACE}\n[fleet]\n{body}")
}

const FLEET_OK: &str = r#"etcd = ["https://192.0.2.11:2379", "https://[2001:db8::1]:2379"]
ca_file = "ca.pem"
cert_file = "gw.pem"
key_file = "gw.key"
prefix = "/tunneld/corp/"
site = "berlin"
advertise = ["192.0.2.21:51820"]
subnets = ["10.2.0.1/24", "fd00:2::/64"]
"#;

#[test]
fn a_fleet_section_parses_with_its_defaults() {
    let c = ok(&fleet(FLEET_OK));
    let f = c.fleet.expect("the fleet");
    assert_eq!(f.prefix, "/tunneld/corp");
    assert_eq!(f.site, "berlin");
    assert_eq!(f.gateway, None);
    assert_eq!(f.lease_ttl, config::DEFAULT_LEASE_TTL);
    assert_eq!(f.persistent_keepalive, config::DEFAULT_FLEET_KEEPALIVE);
    assert_eq!(
        f.subnets[0].to_string(),
        "10.2.0.0/24",
        "truncated to the network"
    );
    assert!(f.client_cert.is_some() && !f.insecure);
    let plain = ok(&fleet(
        "etcd = [\"http://127.0.0.1:2379\"]\ninsecure = true\nprefix = \"/f\"\nsite = \"a\"\n\
         advertise = [\"192.0.2.1:51820\"]\nsubnets = [\"10.1.0.0/24\"]\nlease_ttl = 10\n",
    ));
    assert!(plain.fleet.unwrap().insecure);
    assert_eq!(f.mode, config::SiteMode::ActiveStandby, "the default mode");
    let both = ok(&fleet(&format!("{FLEET_OK}mode = \"active-active\"\n")));
    assert_eq!(both.fleet.unwrap().mode, config::SiteMode::ActiveActive);
    assert!(!f.relay, "no relay by default");
    let relay = ok(&fleet(&format!(
        "{FLEET_OK}relay = true\nrelay_tls = \"192.0.2.31:443\"\n\n[[tls.listen]]\n\
         listen = \"0.0.0.0:443\"\ncert_file = \"r.pem\"\nkey_file = \"r.key\"\n\
         forward_to = \"wireguard\"\n"
    )))
    .fleet
    .unwrap();
    assert!(relay.relay);
    assert_eq!(
        relay.relay_tls,
        Some(("192.0.2.31:443".parse().unwrap(), "192.0.2.31".to_string()))
    );
    let tcp_only = ok(&fleet(&format!(
        "{FLEET_OK}transport = \"tls\"\nrelay_ca_file = \"relay-ca.pem\"\n"
    )));
    assert_eq!(
        tcp_only.fleet.unwrap().tls_only,
        Some("relay-ca.pem".into())
    );
}

#[test]
fn fleet_errors_name_the_field_in_one_line() {
    let with = |from: &str, to: &str| fleet(&FLEET_OK.replace(from, to));
    let cases: Vec<(String, &str)> = vec![
        (
            with("https://192.0.2.11:2379", "http://192.0.2.11:2379"),
            "fleet.etcd[0]: `http://192.0.2.11:2379` is plain HTTP",
        ),
        (
            with("https://192.0.2.11:2379", "192.0.2.11:2379"),
            "is not an etcd URL",
        ),
        (
            with("https://192.0.2.11:2379", "https://192.0.2.11"),
            "has no port",
        ),
        (
            with("ca_file = \"ca.pem\"\n", ""),
            "fleet: missing `ca_file`",
        ),
        (
            with("key_file = \"gw.key\"\n", ""),
            "`cert_file` needs `key_file`",
        ),
        (
            with("/tunneld/corp/", "tunneld"),
            "fleet.prefix: `tunneld` must start with `/`",
        ),
        (
            with("/tunneld/corp/", "/a b"),
            "fleet.prefix: component `a b` may hold only",
        ),
        (
            with("\"berlin\"", "\"ber/lin\""),
            "fleet.site: `ber/lin` may hold only",
        ),
        (
            with("192.0.2.21:51820", "gw.example:51820"),
            "fleet.advertise[0]: `gw.example:51820` is not an address:port",
        ),
        (
            with("\"fd00:2::/64\"", "\"10.2.0.128/25\""),
            "fleet.subnets[1]: 10.2.0.128/25 overlaps 10.2.0.0/24",
        ),
        (
            with("[\"10.2.0.1/24\", \"fd00:2::/64\"]", "[]"),
            "fleet.subnets: is empty",
        ),
        (
            fleet(&format!("{FLEET_OK}mode = \"active-passive\"\n")),
            "fleet.mode: `active-passive` is not a mode (write \"active-standby\" or \"active-active\")",
        ),
        (
            fleet(&format!("{FLEET_OK}mode = 2\n")),
            "fleet.mode: must be a string, not integer",
        ),
        (
            fleet(&format!("{FLEET_OK}relay = \"yes\"\n")),
            "fleet.relay: must be true or false, not string",
        ),
        (
            fleet(&format!("{FLEET_OK}relay_tls = \"192.0.2.31:443\"\n")),
            "fleet.relay_tls: needs `relay = true`",
        ),
        (
            fleet(&format!("{FLEET_OK}relay = true\nrelay_tls = \"relay:443\"\n")),
            "fleet.relay_tls: `relay:443` is not an address:port",
        ),
        (
            fleet(&format!(
                "{FLEET_OK}relay = true\nrelay_tls = \"192.0.2.31:443\"\n"
            )),
            "fleet.relay_tls: 192.0.2.31:443 is no [[tls.listen]] with forward_to = \"wireguard\"",
        ),
        (
            fleet(&format!("{FLEET_OK}transport = \"tls\"\n")),
            "fleet.transport: \"tls\" needs `relay_ca_file`",
        ),
        (
            fleet(&format!("{FLEET_OK}transport = \"quic\"\n")),
            "fleet.transport: `quic` is not a transport",
        ),
        (
            fleet(&format!("{FLEET_OK}lease_ttl = 1\n")),
            "fleet.lease_ttl: 1 is out of range 2-300",
        ),
        (
            fleet(&format!("{FLEET_OK}ttl = 3\n")),
            "fleet: unknown field `ttl`",
        ),
    ];
    for (text, want) in cases {
        let e = error(&text);
        assert!(e.contains(want), "want {want:?} in {e:?}");
        assert!(!e.contains('\n'));
    }
    let e = errors(&format!("[fleet]\n{FLEET_OK}"));
    assert!(
        e.iter().any(|l| l.contains("fleet: needs an [interface]")),
        "{e:?}"
    );
}

#[test]
fn a_fleet_lan_side_is_an_interface_and_addresses_with_their_prefix() {
    let lan = "lan_interface = \"eth1\"\nlan_addresses = [\"192.168.10.1/24\", \"fd10::1/64\"]\n";
    let c = ok(&fleet(&format!("{FLEET_OK}{lan}")));
    let side = c.fleet.unwrap().lan.expect("the LAN side");
    assert_eq!(side.interface, "eth1");
    let shown: Vec<String> = side.addresses.iter().map(ToString::to_string).collect();
    assert_eq!(shown, ["192.168.10.1/24", "fd10::1/64"], "host bits kept");
    assert_eq!(ok(&fleet(FLEET_OK)).fleet.unwrap().lan, None);
    let only_v6 = "lan_interface = \"eth1\"\nlan_addresses = [\"fd10::1/128\"]\n";
    assert!(ok(&fleet(&format!("{FLEET_OK}{only_v6}")))
        .fleet
        .unwrap()
        .lan
        .is_some());

    let with = |addresses: &str| {
        fleet(&format!(
            "{FLEET_OK}lan_interface = \"eth1\"\nlan_addresses = {addresses}\n"
        ))
    };
    let cases: Vec<(String, &str)> = vec![
        (
            fleet(&format!("{FLEET_OK}lan_interface = \"eth1\"\n")),
            "fleet: `lan_interface` needs `lan_addresses`",
        ),
        (
            fleet(&format!("{FLEET_OK}lan_addresses = [\"192.168.10.1/24\"]\n")),
            "fleet: `lan_addresses` needs `lan_interface`",
        ),
        (with("[]"), "fleet.lan_addresses: is empty"),
        (
            with("[\"192.168.10.1\"]"),
            "fleet.lan_addresses[0]: `192.168.10.1` has no prefix",
        ),
        (
            with("[\"192.168.10.1/24\", \"192.168.10.0/24\"]"),
            "fleet.lan_addresses[1]: `192.168.10.0/24` is the network's own address, not a host's (e.g. 192.168.10.1/24)",
        ),
        (
            with("[\"192.168.10.255/24\"]"),
            "fleet.lan_addresses[0]: `192.168.10.255/24` is the network's broadcast address",
        ),
        (
            with("[\"fd10::/64\"]"),
            "fleet.lan_addresses[0]: `fd10::/64` is the network's own address, not a host's (e.g. fd10::1/64)",
        ),
        (
            with("[\"224.0.0.18/32\"]"),
            "fleet.lan_addresses[0]: `224.0.0.18/32` is not a unicast address",
        ),
        (
            with("[\"192.168.10.1/33\"]"),
            "fleet.lan_addresses[0]: `192.168.10.1/33` is not a CIDR",
        ),
        (
            with("[\"192.168.10.1/24\", \"192.168.10.1/25\"]"),
            "fleet.lan_addresses[1]: 192.168.10.1 is listed twice",
        ),
        (
            with("\"192.168.10.1/24\""),
            "fleet.lan_addresses: must be a list of strings",
        ),
        (
            fleet(&format!(
                "{FLEET_OK}lan_interface = \"eth 1\"\nlan_addresses = [\"192.168.10.1/24\"]\n"
            )),
            "fleet.lan_interface: `eth 1` contains",
        ),
        (
            fleet(&format!("{FLEET_OK}lan_address = [\"192.168.10.1/24\"]\n")),
            "fleet: unknown field `lan_address` (did you mean `lan_addresses`?)",
        ),
    ];
    for (text, want) in cases {
        let e = error(&text);
        assert!(e.contains(want), "want {want:?} in {e:?}");
        assert!(!e.contains('\n'));
    }
}

#[test]
fn clamp_mss_is_off_auto_or_a_number() {
    let base = format!(
        "[interface]\nname = \"wg0\"\nprivate_key = \"{}\"\n",
        random_private()
    );
    assert_eq!(ok(&base).dataplane.clamp_mss, ClampMss::Off);
    let with = |v: &str| format!("{base}\n[dataplane]\nclamp_mss = {v}\n");
    assert_eq!(ok(&with("\"auto\"")).dataplane.clamp_mss, ClampMss::Auto);
    assert_eq!(ok(&with("1200")).dataplane.clamp_mss, ClampMss::Mss(1200));
    assert_eq!(ok(&with("false")).dataplane.clamp_mss, ClampMss::Off);
    assert_has(
        &errors(&with("100")),
        "dataplane.clamp_mss: must be \"auto\" (from the tunnel MTU), an MSS of 536-65495 or false, not 100",
    );
}
