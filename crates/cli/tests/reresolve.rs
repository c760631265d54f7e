//! A peer's endpoint given as a host name is looked up again when its handshakes go
//! unanswered (issue 39), in network namespaces this test creates. Site A knows site B as
//! `b.tunneld.test:51820`, served by a dnsmasq in A's namespace (its
//! `/etc/netns/<ns>/resolv.conf`, which `ip netns exec` puts in place); B knows no endpoint
//! for A, so only A can reach it. B moves from 192.0.2.2 to 192.0.2.3 and restarts (its
//! sessions gone), the name follows; A's traffic comes back once its handshake goes
//! unanswered, and A's log says why. WireGuard's own timers pace it: A notices 15 s after
//! B went silent and starts a handshake, which is unanswered 5 s later.

mod common;

use common::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tunneld_testnet::NetNs;

const NAME: &str = "b.tunneld.test";

/// dnsmasq on 127.0.0.1:53 in a namespace, answering `NAME` from a hosts file with a TTL
/// of one second; the namespace's resolv.conf names it. Both go when dropped.
struct NameServer {
    dnsmasq: Dnsmasq,
    netns_etc: PathBuf,
}

impl NameServer {
    fn start(ns: &NetNs, address: &str) -> NameServer {
        step(&format!("dnsmasq in {}: {NAME} is {address}", ns.name()));
        // Made before the first `ip netns exec` that should see it (tunneld's start).
        let netns_etc = Path::new("/etc/netns").join(ns.name());
        fs::create_dir_all(&netns_etc).unwrap();
        fs::write(netns_etc.join("resolv.conf"), "nameserver 127.0.0.1\n").unwrap();
        let hosts = format!("{address} {NAME}\n");
        NameServer {
            dnsmasq: Dnsmasq::start(ns, "127.0.0.1", &hosts, &["--local-ttl=1"]),
            netns_etc,
        }
    }

    /// Makes `NAME` resolve to `address` from now on.
    fn point_to(&self, address: &str) {
        step(&format!("{NAME} is now {address}"));
        self.dnsmasq.set_hosts(&format!("{address} {NAME}\n"));
    }
}

impl Drop for NameServer {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.netns_etc);
    }
}

/// Pings `addr` from `ns` (one echo, one second to answer) until one is answered, for at
/// most `limit`; the time it took.
fn ping_until_answered(ns: &NetNs, addr: &str, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        let out = ns.output(&["ping", "-c", "1", "-W", "1", addr]);
        if out.status.success() {
            return Some(start.elapsed());
        }
    }
    None
}

fn endpoint_of(ns: &NetNs, ifname: &str, peer: &str) -> String {
    wg_dump(ns, ifname)
        .iter()
        .skip(1)
        .find(|f| f[0] == peer)
        .map(|f| f[2].clone())
        .unwrap_or_default()
}

#[test]
fn a_host_name_endpoint_follows_its_name_when_handshakes_go_unanswered() {
    if !require_netns_and_wg("reresolve") || !require_tool("reresolve", "dnsmasq") {
        return;
    }
    let (a, b) = two_sites();
    let dns = NameServer::start(&a, "192.0.2.2");
    let (ka, kb) = (genkey(), genkey());
    let (ia, ib) = (
        tunneld_testnet::unique_name("wg"),
        tunneld_testnet::unique_name("wg"),
    );
    let body_a = site_body(1, &pubkey(&kb), &format!("{NAME}:51820"));
    // B answers only: no endpoint for A.
    let body_b = site_body(2, &pubkey(&ka), "192.0.2.1:51820")
        .replace("endpoint = \"192.0.2.1:51820\"\n", "");
    let ga = Gateway::start(&a, &ia, &ka, &body_a);
    let mut gb = Gateway::start(&b, &ib, &kb, &body_b);
    ping(&a, "10.77.0.2");
    assert_eq!(endpoint_of(&a, &ia, &gb.public_key), "192.0.2.2:51820");

    step("site B moves to 192.0.2.3 and restarts");
    gb.stop_with("TERM");
    drop(gb);
    let underlay = b
        .run(&["ip", "-o", "-4", "addr", "show", "to", "192.0.2.2"])
        .split_whitespace()
        .nth(1)
        .expect("B's underlay interface")
        .to_string();
    // Removed first: removing a primary address removes the secondaries of its subnet.
    b.run(&["ip", "addr", "del", "192.0.2.2/24", "dev", &underlay]);
    b.run(&["ip", "addr", "add", "192.0.2.3/24", "dev", &underlay]);
    dns.point_to("192.0.2.3");
    let gb = Gateway::start(&b, &ib, &kb, &body_b);

    step("A pings B until its traffic crosses again");
    // A's session is still valid, so nothing happens for 15 s (WireGuard's keepalive and
    // rekey timeouts), then A's handshake goes to the old address and is unanswered for
    // 5 s; the lookup and the new handshake follow at once. 45 s leaves room for a slow
    // machine, not for another way to recover.
    let took = ping_until_answered(&a, "10.77.0.2", Duration::from_secs(45));
    let log = ga.log_text();
    assert!(
        took.is_some(),
        "B unreachable after the move; A's log:\n{log}"
    );
    eprintln!("traffic crossed again after {:?}", took.unwrap());
    assert_eq!(endpoint_of(&a, &ia, &gb.public_key), "192.0.2.3:51820");
    assert!(
        log.contains(&format!(
            "{NAME} now resolves to 192.0.2.3 (was 192.0.2.2:51820)"
        )),
        "A's log does not say the name moved:\n{log}"
    );
    ping(&a, "10.77.0.2");
}
