//! `cargo xtask demo`: two sites in network namespaces joined by tunneld, with traffic
//! crossing the tunnel and its speed shown. `--compare` adds wireguard-go in the same testbed.
//!
//! Everything it creates (namespaces, veth, tunnel processes, key files) is owned by a
//! `Testbed` and removed when it is dropped: on success, on error, and after Ctrl-C (caught as
//! a flag, checked between steps).

use crate::system::{self, check_interrupted};
use crate::testbed::{Impl, Testbed};
use tunneld_testnet::require_netns;

/// Length of the iperf3 TCP run (iperf3 itself is stopped if it overruns by much).
const IPERF_SECONDS: u32 = 10;

struct Row {
    name: &'static str,
    handshake: bool,
    rtt_us: Option<f64>,
    gbits: f64,
    cpu_s: f64,
}

impl Row {
    /// Gbit carried per CPU-second spent in the two tunnel processes.
    fn per_cpu(&self) -> Option<f64> {
        (self.cpu_s > 0.0).then(|| self.gbits * f64::from(IPERF_SECONDS) / self.cpu_s)
    }
}

pub fn run(compare: bool) -> Result<(), String> {
    system::install_tools()?;
    if !require_netns("cargo xtask demo") {
        return Err("the demo needs root (network namespaces)".into());
    }
    let tunneld = system::build_tunneld()?;
    let mut contenders = vec![("tunneld", Impl::Tunneld(tunneld.clone(), "", ""))];
    if compare {
        match system::which("wireguard-go") {
            Some(bin) => contenders.push(("wireguard-go (Debian)", Impl::WireguardGo(bin))),
            None => eprintln!("wireguard-go is not installed; skipping the comparison"),
        }
    }
    let mut rows = Vec::new();
    for (name, which) in contenders {
        check_interrupted()?;
        rows.push(one(name, &which, &tunneld)?);
    }
    println!();
    println!("| path | handshake | ping RTT | TCP 1 stream ({IPERF_SECONDS} s) | tunnel CPU-s | Gbit per tunnel CPU-s |");
    println!("|---|---|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.2} Gbit/s | {:.2} | {} |",
            r.name,
            if r.handshake { "done" } else { "none" },
            r.rtt_us
                .map(|v| format!("{v:.0} µs"))
                .unwrap_or_else(|| "-".into()),
            r.gbits,
            r.cpu_s,
            r.per_cpu()
                .map(|v| format!("{v:.2}"))
                .unwrap_or_else(|| "-".into()),
        );
    }
    println!();
    println!("Both gateways share this machine's cores, so Gbit/s is not one gateway's capacity;");
    println!("Gbit per tunnel CPU-second is the comparable figure. Everything created is removed.");
    println!("For the full comparison (more implementations, rounds, latency percentiles): cargo xtask bench");
    Ok(())
}

/// Builds the testbed with `which`, measures, and tears it down (also on error).
fn one(name: &'static str, which: &Impl, tunneld: &std::path::Path) -> Result<Row, String> {
    println!("==> {name}: two sites in network namespaces, 192.0.2.0/24 between them");
    let bed = Testbed::new(which, tunneld)?;
    println!(
        "{name}: site A {} (10.77.0.1, fd77::1) <-> site B {} (10.77.0.2, fd77::2)",
        bed.interfaces().first().map(String::as_str).unwrap_or("-"),
        bed.interfaces().get(1).map(String::as_str).unwrap_or("-"),
    );
    check_interrupted()?;

    let ages = bed.handshake_ages();
    let handshake = !ages.is_empty() && ages.iter().all(Option::is_some);
    println!(
        "{name}: handshake {}",
        if handshake {
            "done on both sites"
        } else {
            "NOT seen on both sites"
        }
    );

    let rtt = bed.ping_us(false, 10);
    let rtt6 = bed.ping_us(true, 3);
    println!(
        "{name}: ping 10.77.0.2 across the tunnel: {}; IPv6 fd77::2: {}",
        rtt.map(|v| format!("{v:.0} µs average"))
            .unwrap_or_else(|| "failed".into()),
        rtt6.map(|v| format!("{v:.0} µs average"))
            .unwrap_or_else(|| "failed".into()),
    );
    check_interrupted()?;

    println!("{name}: iperf3 TCP, 1 stream, {IPERF_SECONDS} s ...");
    let (bps, cpu_s, _) = bed
        .iperf_tcp(1, IPERF_SECONDS)
        .map_err(|e| format!("{name}: {e}{}", bed.logs()))?;
    check_interrupted()?;
    let row = Row {
        name,
        handshake,
        rtt_us: rtt,
        gbits: bps / 1e9,
        cpu_s,
    };
    println!(
        "{name}: {:.2} Gbit/s; the two tunnel processes used {:.2} CPU-s; {} Gbit per tunnel CPU-s",
        row.gbits,
        row.cpu_s,
        row.per_cpu()
            .map(|v| format!("{v:.2}"))
            .unwrap_or_else(|| "-".into())
    );
    if !handshake || rtt.is_none() || rtt6.is_none() {
        return Err(format!(
            "{name}: the tunnel is not healthy (handshake {handshake}, ping {}, ping6 {}){}",
            rtt.is_some(),
            rtt6.is_some(),
            bed.logs()
        ));
    }
    Ok(row)
}
