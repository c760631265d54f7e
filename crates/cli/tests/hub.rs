//! A hub with thousands of spokes (issue 39), in network namespaces this test creates: a
//! bare tunneld configured by `wg setconf` with 2 000 peers, then a restart storm (every
//! spoke a real WireGuard initiator, all within a second, from 256 source addresses),
//! after a first storm and a `kill -9` of the hub: every session is confirmed and carries
//! an echo both ways.

mod common;
mod spokes;

use common::*;
use spokes::{hub_setconf, Spokes};
use std::fs;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tunneld_testnet::{unique_name, NetNs};

const SPOKES: usize = 2_000;
/// Far more than a storm of 2 000 takes, even with a debug build of tunneld.
const STORM_DEADLINE: Duration = Duration::from_secs(120);

/// Deletes the hub's interface (so a bare tunneld exits) and its socket, even on failure.
struct Cleanup<'a>(&'a NetNs, String);
impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let _ = self.0.output(&["ip", "link", "del", &self.1]);
        let _ = fs::remove_file(socket_path(&self.1));
    }
}

/// A bare tunneld for `ifname` in `hub`, with 10.0.0.1/8 and `conf` set by `wg setconf`.
/// Returns its pid.
fn start_hub(hub: &NetNs, ifname: &str, conf: &std::path::Path) -> u32 {
    let out = output_bounded(hub.command(TUNNELD).arg(ifname));
    assert!(
        out.status.success(),
        "tunneld {ifname}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    hub.run(&["ip", "addr", "add", "10.0.0.1/8", "dev", ifname]);
    hub.run(&["ip", "link", "set", ifname, "up"]);
    let started = Instant::now();
    hub.run(&["wg", "setconf", ifname, &conf.to_string_lossy()]);
    eprintln!("wg setconf of {SPOKES} peers: {:?}", started.elapsed());
    let pids = std::process::Command::new("pgrep")
        .args(["-f", &format!("tunneld.* {ifname}$")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&pids.stdout)
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .expect("the bare tunneld's pid")
}

fn storm(
    spokes_ns: &NetNs,
    spokes: &std::sync::Arc<Spokes>,
    hub_public: tunneld_crypto::PublicKey,
) -> spokes::StormReport {
    let spokes = spokes.clone();
    let report = spokes_ns.in_ns(move || {
        spokes.storm(
            SPOKES,
            hub_public,
            SocketAddr::from(([192, 0, 2, 1], 51820)),
            &tunneld_testnet::spoke_source_addresses(),
            Duration::from_secs(1),
            STORM_DEADLINE,
        )
    });
    assert_eq!(report.error, None, "the storm stopped early");
    eprintln!(
        "storm of {}: {} confirmed in {:?}, {} retransmissions, {} cookie replies, {} responses",
        report.spokes,
        report.confirmed,
        report.took,
        report.retransmissions,
        report.cookie_replies,
        report.responses
    );
    report
}

#[test]
fn a_restarted_hub_brings_every_spoke_back() {
    let test = "a_restarted_hub_brings_every_spoke_back";
    if !require_netns_and_wg(test) {
        return;
    }
    let hub = NetNs::new();
    let spokes_ns = NetNs::new();
    tunneld_testnet::hub_and_spokes(&hub, &spokes_ns);

    step("2 000 spokes' keys and the hub's configuration");
    let spokes = std::sync::Arc::new(Spokes::new(SPOKES));
    let hub_key = tunneld_crypto::PrivateKey::generate();
    let dir = tempfile::tempdir().unwrap();
    let conf = write_private(
        dir.path(),
        "hub.conf",
        &hub_setconf(&hub_key, 51820, &spokes.public_keys()),
    );
    let ifname = unique_name("hub");
    let _cleanup = Cleanup(&hub, ifname.clone());

    step("the hub up, then a first storm");
    let pid = start_hub(&hub, &ifname, &conf);
    let first = storm(&spokes_ns, &spokes, hub_key.public_key());
    assert_eq!(first.confirmed, SPOKES, "the first storm: {first:?}");

    step("kill -9 and restart the hub; every spoke initiates again within a second");
    // SAFETY: kill sends a signal to the hub's pid, which this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    wait_until("the killed hub's interface to go", || {
        !hub.output(&["ip", "link", "show", &ifname])
            .status
            .success()
    });
    let _ = fs::remove_file(socket_path(&ifname));
    start_hub(&hub, &ifname, &conf);
    let report = storm(&spokes_ns, &spokes, hub_key.public_key());
    assert_eq!(
        report.confirmed,
        SPOKES,
        "spokes whose echo never came back after the restart: {:?}",
        report
            .done_at
            .iter()
            .enumerate()
            .filter(|(_, d)| d.is_none())
            .map(|(i, _)| i)
            .take(10)
            .collect::<Vec<_>>()
    );

    step("the hub's own account: every peer has a handshake, and received data");
    let dump = wg_dump(&hub, &ifname);
    let peers: Vec<&Vec<String>> = dump.iter().skip(1).collect();
    assert_eq!(peers.len(), SPOKES);
    let without: Vec<&String> = peers
        .iter()
        .filter(|p| p[4] == "0" || p[5] == "0")
        .map(|p| &p[0])
        .collect();
    assert!(
        without.is_empty(),
        "{} peers with no handshake or nothing received, e.g. {:?}",
        without.len(),
        without.first()
    );
}
