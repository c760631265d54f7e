//! `tunneld show [INTERFACE]`: the state `wg show` gives, plus tunneld's per-worker counters,
//! read from the running daemon's UAPI socket.

use anyhow::{bail, Context};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tunneld::UAPI_SOCKET_DIR as SOCKET_DIR;
use tunneld_crypto::{parse_hex_key, PrivateKey, PublicKey};

/// A line of output into a `String`, where writing cannot fail.
macro_rules! say {
    ($out:expr $(, $($arg:tt)*)?) => {{
        let _ = writeln!($out $(, $($arg)*)?);
    }};
}

pub fn run(interface: Option<&str>) -> anyhow::Result<()> {
    let names = match interface {
        Some(name) => vec![name.to_string()],
        None => {
            let mut names: Vec<String> = std::fs::read_dir(SOCKET_DIR)
                .map(|dir| {
                    dir.flatten()
                        .filter_map(|e| {
                            e.file_name()
                                .to_str()
                                .and_then(|n| n.strip_suffix(".sock"))
                                .map(str::to_string)
                        })
                        .collect()
                })
                .unwrap_or_default();
            names.sort();
            if names.is_empty() {
                bail!("no interface is running (nothing in {SOCKET_DIR})");
            }
            names
        }
    };
    for (i, name) in names.iter().enumerate() {
        let (name, path) = locate(name);
        let text = show_one(&name, &path)?;
        crate::print_stdout(&[if i > 0 { "\n" } else { "" }, &text])?;
    }
    Ok(())
}

/// An interface's name and its UAPI socket: `NAME` in /var/run/wireguard, else in
/// `$XDG_RUNTIME_DIR/tunneld` (where an unprivileged `tunneld proxy` puts it); or a socket's
/// path (`PATH.sock`, or any name with a `/`).
fn locate(given: &str) -> (String, String) {
    if given.contains('/') || given.ends_with(".sock") {
        let name = std::path::Path::new(given)
            .file_stem()
            .map_or_else(|| given.to_string(), |s| s.to_string_lossy().into_owned());
        return (name, given.to_string());
    }
    let system = format!("{SOCKET_DIR}/{given}.sock");
    let user = std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|d| !d.is_empty())
        .map(|d| format!("{}/tunneld/{given}.sock", d.to_string_lossy()));
    match user {
        Some(user)
            if !std::path::Path::new(&system).exists() && std::path::Path::new(&user).exists() =>
        {
            (given.to_string(), user)
        }
        _ => (given.to_string(), system),
    }
}

fn request(interface: &str, path: &str, message: &str) -> anyhow::Result<Vec<(String, String)>> {
    let mut stream = UnixStream::connect(path)
        .with_context(|| format!("interface {interface} is not running ({path})"))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(message.as_bytes())?;
    let mut reply = String::new();
    let mut buf = [0u8; 8192];
    while !reply.ends_with("\n\n") {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        reply.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let pairs: Vec<(String, String)> = reply
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    match pairs.iter().find(|(k, _)| k == "errno") {
        Some((_, e)) if e == "0" => Ok(pairs),
        Some((_, e)) => bail!("{interface}: the daemon answered errno {e}"),
        None => bail!("{interface}: incomplete reply from {path}"),
    }
}

/// One interface's state as text, written out whole so a failed request prints nothing half.
fn show_one(interface: &str, path: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    let device = request(interface, path, "get=1\n\n")?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    say!(out, "interface: {interface}");
    let mut in_peer = false;
    let (mut handshake, mut rx, mut tx, mut allowed) = (0u64, 0u64, 0u64, Vec::new());
    let finish_peer =
        |out: &mut String, handshake: u64, rx: u64, tx: u64, allowed: &mut Vec<String>| {
            if !allowed.is_empty() {
                say!(out, "  allowed ips: {}", allowed.join(", "));
            }
            allowed.clear();
            if handshake > 0 {
                let age = now.as_secs().saturating_sub(handshake);
                say!(out, "  latest handshake: {age} seconds ago");
            } else {
                say!(out, "  latest handshake: never");
            }
            say!(
                out,
                "  transfer: {} received, {} sent",
                bytes(rx),
                bytes(tx)
            );
        };
    for (key, value) in &device {
        match key.as_str() {
            "private_key" => {
                if let Some(k) = parse_hex_key(value) {
                    say!(
                        out,
                        "  public key: {}",
                        PrivateKey::from_bytes(k).public_key()
                    );
                }
            }
            "listen_port" => say!(out, "  listening port: {value}"),
            "fwmark" => say!(out, "  fwmark: {value}"),
            "public_key" => {
                if in_peer {
                    finish_peer(&mut out, handshake, rx, tx, &mut allowed);
                }
                in_peer = true;
                (handshake, rx, tx) = (0, 0, 0);
                let shown = parse_hex_key(value)
                    .map(|k| PublicKey::from_bytes(k).to_base64())
                    .unwrap_or_else(|| value.clone());
                say!(out, "\npeer: {shown}");
            }
            "endpoint" => say!(out, "  endpoint: {value}"),
            "allowed_ip" => allowed.push(value.clone()),
            "last_handshake_time_sec" => handshake = value.parse().unwrap_or(0),
            "rx_bytes" => rx = value.parse().unwrap_or(0),
            "tx_bytes" => tx = value.parse().unwrap_or(0),
            "persistent_keepalive_interval" if value != "0" => {
                say!(out, "  persistent keepalive: every {value} seconds")
            }
            _ => {}
        }
    }
    if in_peer {
        finish_peer(&mut out, handshake, rx, tx, &mut allowed);
    }

    // Counters are tunneld's own; another implementation's socket does not have them.
    if let Ok(stats) = request(interface, path, "stats=1\n\n") {
        let mut line = String::new();
        let mut drops = Vec::new();
        let mut carries = Vec::new();
        let flush = |out: &mut String,
                     line: &mut String,
                     drops: &mut Vec<String>,
                     carries: &mut Vec<String>| {
            if !line.is_empty() {
                let drops = if drops.is_empty() {
                    "none".to_string()
                } else {
                    drops.join(" ")
                };
                say!(out, "{line}; drops: {drops}");
                if !carries.is_empty() {
                    say!(out, "  carries: {}", carries.join(", "));
                }
            }
            line.clear();
            drops.clear();
            carries.clear();
        };
        say!(out);
        let (mut txp, mut rxp) = (0u64, 0u64);
        for (key, value) in &stats {
            match key.as_str() {
                "worker" => {
                    flush(&mut out, &mut line, &mut drops, &mut carries);
                    line = format!("worker {value}:");
                }
                "tx_packets" => txp = value.parse().unwrap_or(0),
                "rx_packets" => rxp = value.parse().unwrap_or(0),
                "tx_bytes" => line.push_str(&format!(
                    " sent {txp} packets ({})",
                    bytes(value.parse().unwrap_or(0))
                )),
                "rx_bytes" => line.push_str(&format!(
                    ", received {rxp} packets ({})",
                    bytes(value.parse().unwrap_or(0))
                )),
                "handshakes_sent" => line.push_str(&format!(", handshakes sent {value}")),
                // Only with several workers: how much crossed between cores.
                "handoffs_out" if value != "0" => {
                    line.push_str(&format!(", handed to other workers {value}"))
                }
                "handoffs_in" if value != "0" => {
                    line.push_str(&format!(", taken from other workers {value}"))
                }
                // Non-zero only while under load (a handshake flood, say): worth a look.
                "cookie_replies_sent" if value != "0" => {
                    line.push_str(&format!(", cookie replies {value}"))
                }
                k if k.starts_with("drop_") && value != "0" => {
                    drops.push(format!("{}={value}", &k[5..]))
                }
                // A peer by the start of its base64 key, with its sub-tunnel if it is split.
                "carries" => {
                    let (hex, sub) = match value.split_once('/') {
                        Some((hex, sub)) => (hex, format!(" (sub-tunnel {sub})")),
                        None => (value.as_str(), String::new()),
                    };
                    let key = parse_hex_key(hex)
                        .map(|k| PublicKey::from_bytes(k).to_base64())
                        .unwrap_or_else(|| hex.to_string());
                    let short: String = key.chars().take(8).collect();
                    carries.push(format!("{short}…{sub}"));
                }
                _ => {}
            }
        }
        flush(&mut out, &mut line, &mut drops, &mut carries);
    }
    // Only for an interface in a fleet (errno 2 otherwise).
    if let Ok(fleet) = request(interface, path, "fleet=1\n\n") {
        show_fleet(&mut out, &fleet);
    }
    Ok(out)
}

/// The fleet as this gateway sees it: its own role and the store's state, then every
/// gateway by site.
fn show_fleet(out: &mut String, fleet: &[(String, String)]) {
    let get = |key: &str| {
        fleet
            .iter()
            .find(|(k, _)| k == key)
            .map_or("", |(_, v)| v.as_str())
    };
    say!(out);
    say!(
        out,
        "fleet: site {}, gateway {} ({})",
        get("fleet_site"),
        get("fleet_gateway"),
        get("fleet_role")
    );
    if get("fleet_mode") == "active-active" {
        say!(
            out,
            "  mode: active-active (every gateway of the site carries a share of its flows; the elected one holds the LAN addresses)"
        );
    }
    let held_by = get("fleet_name_held_by");
    if !held_by.is_empty() {
        say!(
            out,
            "  name refused: held by another gateway ({held_by}); this one routes nothing until the name is free: give it a name of its own"
        );
    }
    say!(out, "  store: {}", get("fleet_store"));
    let lease = get("fleet_lease_renewed_ms");
    if !lease.is_empty() {
        say!(out, "  lease renewed: {lease} ms ago");
    }
    let reconciled = get("fleet_last_reconcile");
    if let Ok(at) = reconciled.parse::<u64>() {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        say!(
            out,
            "  last reconcile: {} seconds ago ({} in all)",
            now.saturating_sub(at),
            get("fleet_reconciles")
        );
    }
    // `held 10.2.0.1/24,fd00:2::1/64 on eth1`, or `released …`.
    if let Some((state, rest)) = get("fleet_lan").split_once(' ') {
        let (addresses, interface) = rest.rsplit_once(" on ").unwrap_or((rest, "?"));
        let addresses = addresses.replace(',', ", ");
        let state = if state == "held" { "held" } else { "not held" };
        say!(
            out,
            "  LAN addresses: {state} ({addresses} on {interface}); taken {} times, fenced {}",
            get("fleet_lan_takes"),
            get("fleet_lan_fenced")
        );
    }
    // `b/b1 192.0.2.22:51821 rtt_us=310 last_ms=12`, or `none`.
    let probe = get("fleet_probe");
    if !probe.is_empty() {
        let mut words = probe.split(' ');
        let watched = match (words.next(), words.next()) {
            (Some("none") | None, _) => "watching none".to_string(),
            (Some(name), at) => format!("watching {name} at {}", at.unwrap_or("?")),
        };
        let mut said = vec![watched];
        for word in words {
            match word.split_once('=') {
                Some(("rtt_us", us)) => {
                    let us: f64 = us.parse().unwrap_or(0.0);
                    said.push(format!("rtt {:.2} ms", us / 1000.0));
                }
                Some(("last_ms", ms)) => said.push(format!("last answer {ms} ms ago")),
                _ => {}
            }
        }
        say!(
            out,
            "  probes: {}; answered {}, takeovers {}",
            said.join(", "),
            get("fleet_probes_answered"),
            get("fleet_takeovers")
        );
    }
    // `pairs bytes datagrams dropped`.
    let relay = get("fleet_relay");
    if !relay.is_empty() {
        let n: Vec<u64> = relay.split(' ').map(|w| w.parse().unwrap_or(0)).collect();
        let at = |i: usize| n.get(i).copied().unwrap_or(0);
        say!(
            out,
            "  relay: serving {} pairs; forwarded {} in {} datagrams (ciphertext), dropped {}",
            at(0),
            bytes(at(1)),
            at(2),
            at(3)
        );
        // `site/gw site/gw port bytes`, one line per pair.
        for (key, value) in fleet {
            if key != "fleet_relay_pair" {
                continue;
            }
            let words: Vec<&str> = value.split(' ').collect();
            if let [a, b, port, sent] = words[..] {
                say!(
                    out,
                    "    {a} <-> {b} on UDP port {port}: {}",
                    bytes(sent.parse().unwrap_or(0))
                );
            }
        }
    }
    say!(
        out,
        "  failovers seen: {}, records rejected: {}, name conflicts: {}, store errors: {}",
        get("fleet_failovers"),
        get("fleet_rejected_records"),
        get("fleet_name_conflicts"),
        get("fleet_store_errors")
    );
    let mut gateway = String::new();
    for (key, value) in fleet {
        match key.as_str() {
            "gateway" => gateway = format!("  {value}"),
            "role" => gateway.push_str(&format!(" ({value})")),
            "endpoint" => gateway.push_str(&format!(" at {value}")),
            "subnets" if !value.is_empty() => gateway.push_str(&format!(", serves {value}")),
            "path" => gateway.push_str(&format!(", path {value}")),
            "seen_for" => {
                gateway.push_str(&format!(", seen for {value} s"));
                say!(out, "{gateway}");
            }
            "name_conflict" => say!(out, "  name conflict: {value}"),
            _ => {}
        }
    }
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}
