//! `cargo xtask demo`: two sites in network namespaces joined by tunneld, with traffic
//! crossing the tunnel and its speed shown. `--compare` adds wireguard-go in the same testbed.

use crate::system;
use crate::testbed::{Impl, Testbed};
use tunneld_testnet::require_netns;

const IPERF_SECONDS: u32 = 5;

pub fn run(compare: bool) -> Result<(), String> {
    system::install_tools()?;
    if !require_netns("cargo xtask demo") {
        return Err("the demo needs root (network namespaces)".into());
    }
    let tunneld = system::build_tunneld()?;
    let mut rows = vec![("tunneld", Impl::Tunneld(tunneld.clone()))];
    if compare {
        match system::which("wireguard-go") {
            Some(bin) => rows.push(("wireguard-go (Debian)", Impl::WireguardGo(bin))),
            None => eprintln!("wireguard-go is not installed; skipping the comparison"),
        }
    }
    let mut results = Vec::new();
    for (name, which) in rows {
        eprintln!("==> {name}: two sites in network namespaces, 192.0.2.0/24 between them");
        let bed = Testbed::new(&which, &tunneld)?;
        let rtt = bed.ping_us(false, 10);
        let rtt6 = bed.ping_us(true, 3);
        println!(
            "{name}: ping 10.77.0.1 -> 10.77.0.2 across the tunnel: {} µs; IPv6 fd77::2: {}",
            rtt.map(|v| format!("{v:.0}"))
                .unwrap_or_else(|| "failed".into()),
            if rtt6.is_some() { "ok" } else { "failed" }
        );
        let (bps, cpu, _) = bed.iperf_tcp(1, IPERF_SECONDS)?;
        let gbits = bps / 1e9;
        println!(
            "{name}: TCP over the tunnel {gbits:.2} Gbit/s, {cpu:.2} CPU-s in the two gateways"
        );
        results.push((name, gbits, cpu, rtt));
    }
    println!();
    println!("| path | TCP 1 stream | tunnel CPU-s | Gbit per tunnel CPU-s | ping RTT |");
    println!("|---|---:|---:|---:|---:|");
    for (name, gbits, cpu, rtt) in &results {
        let per_cpu = if *cpu > 0.0 {
            gbits * IPERF_SECONDS as f64 / cpu
        } else {
            0.0
        };
        println!(
            "| {name} | {gbits:.2} Gbit/s | {cpu:.2} | {per_cpu:.2} | {} |",
            rtt.map(|v| format!("{v:.0} µs"))
                .unwrap_or_else(|| "-".into())
        );
    }
    println!();
    println!("Both gateways share this machine's cores, so Gbit/s is not one gateway's capacity;");
    println!("Gbit per tunnel CPU-second is the comparable figure. Everything created is removed.");
    println!("For the full comparison (more implementations, rounds, latency percentiles): cargo xtask bench");
    Ok(())
}
