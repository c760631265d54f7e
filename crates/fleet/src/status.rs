//! What the fleet shows: its state for `tunneld show` (and the library), its counters for
//! `/metrics`.

use crate::paths::PathState;
use crate::reconcile::Fleet;
use crate::record::Role;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// One gateway of the fleet, as this one sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GatewayStatus {
    pub site: String,
    pub gateway: String,
    /// Elected by its site (it holds the LAN addresses, and in an active-standby site it
    /// alone carries the site's traffic).
    pub active: bool,
    /// Its site is active-active: it carries a share of the site's traffic, elected or not.
    pub sharing: bool,
    pub public_key: tunneld_crypto::PublicKey,
    pub endpoint: Option<std::net::SocketAddr>,
    pub subnets: Vec<ipnet::IpNet>,
    /// Seconds since this gateway first saw the record (it is under a lease its gateway
    /// keeps alive, so an old record is a live gateway).
    pub seen_for_secs: u64,
    /// The path to it, for a gateway that is this one's peer (`None`: not a peer, this one
    /// itself or one of its site).
    pub path: Option<PathStatus>,
}

/// How a peer gateway is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathStatus {
    /// A live session, its datagrams going straight to this address (where the peer or its
    /// NAT is), for so many seconds.
    Direct {
        via: std::net::SocketAddr,
        for_secs: u64,
    },
    /// No session: its addresses are being tried (so many so far), for so many seconds.
    Searching { tries: u32, for_secs: u64 },
    /// A live session through a relay (`site/gateway`), at its port for the pair, for so
    /// many seconds.
    Relayed {
        relay: String,
        via: std::net::SocketAddr,
        for_secs: u64,
    },
}

/// What this gateway relays, when it is a relay (`[fleet] relay = true`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayStatus {
    /// Pairs served (each a UDP port of its own).
    pub pairs: usize,
    /// Bytes and datagrams forwarded, all pairs (ciphertext: a relay has no session key).
    pub bytes: u64,
    pub datagrams: u64,
    /// Datagrams from no registered side, or for a side not registered yet.
    pub dropped: u64,
    /// Each pair served: its sides (`site/gateway`, else the key), its port, bytes
    /// forwarded.
    pub each: Vec<RelayedPair>,
}

/// One pair a relay serves.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayedPair {
    pub sides: [String; 2],
    pub port: u16,
    pub bytes: u64,
}

/// This gateway's name is held by another gateway's record (another lease): the claim was
/// refused, and this gateway stays out of the fleet until the name is free.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Refusal {
    /// The holder's public key (`None`: its record does not parse).
    pub holder: Option<tunneld_crypto::PublicKey>,
    pub endpoint: Option<std::net::SocketAddr>,
}

/// A gateway name claimed by two gateways, as the store shows it (to every gateway).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NameConflict {
    pub site: String,
    pub gateway: String,
    /// The key of the gateway whose record holds the name.
    pub holder: tunneld_crypto::PublicKey,
    /// The gateway refused it.
    pub claimant: tunneld_crypto::PublicKey,
    pub claimant_endpoint: Option<std::net::SocketAddr>,
}

/// The fleet as this gateway sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FleetStatus {
    pub site: String,
    pub gateway: String,
    /// Whether this gateway leads its site.
    pub active: bool,
    /// Its site's mode, as the site runs it (its elected gateway's record says).
    pub mode: tunneld_config::SiteMode,
    /// Whether the store has answered since start (until then the gateway is in no fleet).
    pub joined: bool,
    /// `Some` while another gateway holds this gateway's name.
    pub refused: Option<Refusal>,
    /// Names claimed twice in the fleet.
    pub name_conflicts: Vec<NameConflict>,
    /// `None` while the store answers; else why it does not.
    pub store_error: Option<String>,
    /// Milliseconds since this gateway's lease was last renewed.
    pub lease_renewed_ms_ago: Option<u64>,
    /// When the peers were last made to follow the store (Unix seconds).
    pub last_reconcile_unix: Option<u64>,
    pub gateways: Vec<GatewayStatus>,
    pub counters: Counters,
    /// The site's LAN side, when the config names one.
    pub lan: Option<LanStatus>,
    /// The liveness probes between the site's gateways, when they run.
    pub probes: Option<ProbeStatus>,
    /// What this gateway relays, when it is a relay.
    pub relay: Option<RelayStatus>,
}

/// The liveness probes: which gateway this one watches (a standby watches its site's active
/// one) and how it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProbeStatus {
    /// `site/gateway` and its probe address.
    pub watched: Option<(String, std::net::SocketAddr)>,
    /// The last answer's round trip, in microseconds.
    pub rtt_us: Option<u64>,
    /// Milliseconds since the last answer.
    pub last_answer_ms_ago: Option<u64>,
    /// Probes this gateway answered (for the site's other gateways).
    pub answered: u64,
}

/// The site's LAN addresses and whether this gateway holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LanStatus {
    pub interface: String,
    pub addresses: Vec<ipnet::IpNet>,
    /// Whether this gateway holds them now (only while active and its lease surely lives).
    pub held: bool,
}

/// The fleet's counters since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Counters {
    pub reconciles: u64,
    pub store_errors: u64,
    /// A site's active gateway replaced by another one, as this gateway saw it.
    pub failovers: u64,
    pub rejected_records: u64,
    /// Name conflicts this gateway is party to: its name refused, or another gateway
    /// refused its name.
    pub name_conflicts: u64,
    /// Times this gateway took the LAN addresses.
    pub lan_takes: u64,
    /// Times it released them because no keep-alive was answered in time (fencing).
    pub lan_fenced: u64,
    /// Times the probes found the site's active gateway dead and this gateway had etcd
    /// revoke its lease.
    pub takeovers: u64,
}

#[derive(Default)]
pub(crate) struct AtomicCounters {
    pub reconciles: AtomicU64,
    pub store_errors: AtomicU64,
    pub failovers: AtomicU64,
    pub rejected_records: AtomicU64,
    pub name_conflicts: AtomicU64,
    pub lan_takes: AtomicU64,
    pub lan_fenced: AtomicU64,
    pub takeovers: AtomicU64,
}

impl AtomicCounters {
    fn read(&self) -> Counters {
        Counters {
            reconciles: self.reconciles.load(Ordering::Relaxed),
            store_errors: self.store_errors.load(Ordering::Relaxed),
            failovers: self.failovers.load(Ordering::Relaxed),
            rejected_records: self.rejected_records.load(Ordering::Relaxed),
            name_conflicts: self.name_conflicts.load(Ordering::Relaxed),
            lan_takes: self.lan_takes.load(Ordering::Relaxed),
            lan_fenced: self.lan_fenced.load(Ordering::Relaxed),
            takeovers: self.takeovers.load(Ordering::Relaxed),
        }
    }
}

/// Shared between the fleet's thread and whoever reads it.
pub(crate) struct Shared {
    pub site: String,
    pub gateway: String,
    pub counters: AtomicCounters,
    pub state: Mutex<State>,
}

#[derive(Default)]
pub(crate) struct State {
    pub fleet: Fleet,
    pub active: bool,
    /// `Some` once the store has answered or failed; `Some(false)` while it fails.
    pub store_up: Option<bool>,
    pub store_error: Option<String>,
    /// The store has answered since start.
    pub joined: bool,
    pub refused: Option<Refusal>,
    pub lease_renewed: Option<Instant>,
    pub last_reconcile: Option<SystemTime>,
    /// When each record (by site/gateway) was first seen.
    pub first_seen: std::collections::HashMap<(String, String), Instant>,
    /// The LAN side's interface and addresses, when configured.
    pub lan: Option<(String, Vec<ipnet::IpNet>)>,
    /// `Some(held)` once the LAN side's thread has taken or released them.
    pub lan_held: Option<bool>,
    pub probes: Option<std::sync::Arc<crate::probe::Probes>>,
    /// Each peer gateway's path, as the paths' last tick found it.
    pub paths: std::collections::HashMap<tunneld_crypto::PublicKey, crate::paths::PathState>,
    /// The relay of each relayed peer's pair (`site/gateway`).
    pub path_relays: std::collections::HashMap<tunneld_crypto::PublicKey, String>,
    /// This gateway's relay, when it is one.
    pub relay: Option<std::sync::Arc<Mutex<crate::relay::Relay>>>,
}

pub(crate) fn lock_relay(
    m: &Mutex<crate::relay::Relay>,
) -> std::sync::MutexGuard<'_, crate::relay::Relay> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    pub fn new(site: &str, gateway: &str) -> Shared {
        Shared {
            site: site.into(),
            gateway: gateway.into(),
            counters: AtomicCounters::default(),
            state: Mutex::new(State::default()),
        }
    }

    pub fn state(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }

    pub fn status(&self) -> FleetStatus {
        let state = self.state();
        let now = Instant::now();
        let mut gateways = Vec::new();
        for (site_name, site) in &state.fleet.sites {
            for member in &site.gateways {
                let r = &member.record;
                let seen = state
                    .first_seen
                    .get(&(r.site.clone(), r.gateway.clone()))
                    .map_or(0, |t| now.duration_since(*t).as_secs());
                let path = state.paths.get(&r.public_key).map(|p| match p {
                    PathState::Up { via, since } => PathStatus::Direct {
                        via: *via,
                        for_secs: now.duration_since(*since).as_secs(),
                    },
                    PathState::Searching { since, tried } => PathStatus::Searching {
                        tries: *tried,
                        for_secs: now.duration_since(*since).as_secs(),
                    },
                    PathState::Relayed { via, since } => PathStatus::Relayed {
                        relay: state
                            .path_relays
                            .get(&r.public_key)
                            .cloned()
                            .unwrap_or_else(|| "a relay".into()),
                        via: *via,
                        for_secs: now.duration_since(*since).as_secs(),
                    },
                });
                gateways.push(GatewayStatus {
                    site: site_name.clone(),
                    gateway: r.gateway.clone(),
                    active: site.active.as_deref() == Some(r.gateway.as_str()),
                    sharing: site.mode == tunneld_config::SiteMode::ActiveActive,
                    public_key: r.public_key,
                    endpoint: r.endpoints.first().copied(),
                    subnets: r.subnets.clone(),
                    seen_for_secs: seen,
                    path,
                });
            }
        }
        let name_conflicts = state
            .fleet
            .conflicts
            .iter()
            .map(|c| NameConflict {
                site: c.site.clone(),
                gateway: c.gateway.clone(),
                holder: c.holder,
                claimant: c.claimant.public_key,
                claimant_endpoint: c.claimant.endpoints.first().copied(),
            })
            .collect();
        FleetStatus {
            site: self.site.clone(),
            gateway: self.gateway.clone(),
            active: state.active,
            mode: state
                .fleet
                .sites
                .get(&self.site)
                .map(|s| s.mode)
                .unwrap_or_default(),
            joined: state.joined,
            refused: state.refused.clone(),
            name_conflicts,
            store_error: match (state.store_up, state.joined) {
                (Some(true), _) => None,
                (Some(false), true) => state.store_error.clone(),
                (Some(false), false) => Some(format!(
                    "not reached since start: {}",
                    state.store_error.as_deref().unwrap_or("")
                )),
                (None, _) => Some("not reached yet".into()),
            },
            lease_renewed_ms_ago: state
                .lease_renewed
                .map(|t| now.duration_since(t).as_millis() as u64),
            last_reconcile_unix: state
                .last_reconcile
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map(|d| d.as_secs()),
            gateways,
            counters: self.counters.read(),
            lan: state.lan.as_ref().map(|(interface, addresses)| LanStatus {
                interface: interface.clone(),
                addresses: addresses.clone(),
                held: state.lan_held == Some(true),
            }),
            probes: state.probes.as_ref().map(|p| {
                let view = p.view();
                ProbeStatus {
                    watched: view.watched,
                    rtt_us: view.rtt.map(|d| d.as_micros() as u64),
                    last_answer_ms_ago: view
                        .last_answer
                        .map(|t| now.saturating_duration_since(t).as_millis() as u64),
                    answered: view.answered,
                }
            }),
            relay: state.relay.as_ref().map(|relay| {
                let pairs = lock_relay(relay).view();
                RelayStatus {
                    pairs: pairs.len(),
                    bytes: pairs.iter().map(|p| p.bytes).sum(),
                    datagrams: pairs.iter().map(|p| p.datagrams).sum(),
                    dropped: pairs.iter().map(|p| p.dropped).sum(),
                    each: pairs
                        .iter()
                        .map(|p| RelayedPair {
                            sides: [
                                state.fleet.name_of(&p.pair.0),
                                state.fleet.name_of(&p.pair.1),
                            ],
                            port: p.port,
                            bytes: p.bytes,
                        })
                        .collect(),
                }
            }),
        }
    }
}

impl tunneld::FrontEnd for Shared {
    fn uapi_status(&self) -> String {
        let s = self.status();
        let mut out = String::new();
        let role = if s.refused.is_some() {
            "refused".to_string()
        } else if !s.joined {
            "not joined".to_string()
        } else if s.active {
            Role::Active.to_string()
        } else if s
            .gateways
            .iter()
            .any(|g| g.site == s.site && g.gateway == s.gateway && g.sharing)
        {
            "sharing".to_string()
        } else {
            Role::Standby.to_string()
        };
        let _ = writeln!(out, "fleet_site={}", s.site);
        let _ = writeln!(out, "fleet_gateway={}", s.gateway);
        let _ = writeln!(out, "fleet_role={role}");
        let _ = writeln!(out, "fleet_mode={}", s.mode);
        if let Some(r) = &s.refused {
            let holder = r.holder.map_or("unreadable".into(), |k| k.to_base64());
            let at = r.endpoint.map_or(String::new(), |e| format!(" at {e}"));
            let _ = writeln!(out, "fleet_name_held_by={holder}{at}");
        }
        let store = match &s.store_error {
            None => "up".to_string(),
            Some(e) => format!("down: {}", e.replace('\n', " ")),
        };
        let _ = writeln!(out, "fleet_store={store}");
        if let Some(ms) = s.lease_renewed_ms_ago {
            let _ = writeln!(out, "fleet_lease_renewed_ms={ms}");
        }
        if let Some(t) = s.last_reconcile_unix {
            let _ = writeln!(out, "fleet_last_reconcile={t}");
        }
        if let Some(lan) = &s.lan {
            let addresses: Vec<String> = lan.addresses.iter().map(ToString::to_string).collect();
            let _ = writeln!(
                out,
                "fleet_lan={} {} on {}",
                if lan.held { "held" } else { "released" },
                addresses.join(","),
                lan.interface
            );
        }
        if let Some(p) = &s.probes {
            // `b/b1 192.0.2.22:51821 rtt_us=310 last_ms=12`, or `none`; then answered.
            let mut line = match &p.watched {
                Some((name, at)) => format!("{name} {at}"),
                None => "none".into(),
            };
            if let Some(rtt) = p.rtt_us {
                line.push_str(&format!(" rtt_us={rtt}"));
            }
            if let Some(ms) = p.last_answer_ms_ago {
                line.push_str(&format!(" last_ms={ms}"));
            }
            let _ = writeln!(out, "fleet_probe={line}");
            let _ = writeln!(out, "fleet_probes_answered={}", p.answered);
        }
        if let Some(r) = &s.relay {
            let _ = writeln!(
                out,
                "fleet_relay={} {} {} {}",
                r.pairs, r.bytes, r.datagrams, r.dropped
            );
            for p in &r.each {
                let _ = writeln!(
                    out,
                    "fleet_relay_pair={} {} {} {}",
                    p.sides[0], p.sides[1], p.port, p.bytes
                );
            }
        }
        let c = s.counters;
        let _ = writeln!(out, "fleet_reconciles={}", c.reconciles);
        let _ = writeln!(out, "fleet_takeovers={}", c.takeovers);
        let _ = writeln!(out, "fleet_failovers={}", c.failovers);
        let _ = writeln!(out, "fleet_store_errors={}", c.store_errors);
        let _ = writeln!(out, "fleet_rejected_records={}", c.rejected_records);
        let _ = writeln!(out, "fleet_name_conflicts={}", c.name_conflicts);
        if s.lan.is_some() {
            let _ = writeln!(out, "fleet_lan_takes={}", c.lan_takes);
            let _ = writeln!(out, "fleet_lan_fenced={}", c.lan_fenced);
        }
        for g in &s.gateways {
            let _ = writeln!(out, "gateway={}/{}", g.site, g.gateway);
            // An active-active site's gateway that is not elected carries its share: "sharing".
            let role = match (g.active, g.sharing) {
                (true, _) => "active",
                (false, true) => "sharing",
                (false, false) => "standby",
            };
            let _ = writeln!(out, "role={role}");
            let _ = writeln!(out, "public_key={}", g.public_key.to_base64());
            if let Some(e) = g.endpoint {
                let _ = writeln!(out, "endpoint={e}");
            }
            let subnets: Vec<String> = g.subnets.iter().map(ToString::to_string).collect();
            let _ = writeln!(out, "subnets={}", subnets.join(","));
            match &g.path {
                Some(PathStatus::Direct { via, for_secs }) => {
                    let _ = writeln!(out, "path=direct via {via} for {for_secs} s");
                }
                Some(PathStatus::Searching { tries, for_secs }) => {
                    let _ = writeln!(
                        out,
                        "path=searching for {for_secs} s ({tries} addresses tried)"
                    );
                }
                Some(PathStatus::Relayed {
                    relay,
                    via,
                    for_secs,
                }) => {
                    let _ = writeln!(out, "path=relayed via {relay} ({via}) for {for_secs} s");
                }
                None => {}
            }
            let _ = writeln!(out, "seen_for={}", g.seen_for_secs);
        }
        for c in &s.name_conflicts {
            let at = c
                .claimant_endpoint
                .map_or(String::new(), |e| format!(" at {e}"));
            let _ = writeln!(
                out,
                "name_conflict={}/{} held by {}, refused to {}{at}",
                c.site,
                c.gateway,
                c.holder.to_base64(),
                c.claimant.to_base64()
            );
        }
        out
    }

    fn metrics(&self) -> String {
        let s = self.status();
        let labels = format!("site=\"{}\",gateway=\"{}\"", s.site, s.gateway);
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: u64| {
            let _ = writeln!(out, "# HELP tunneld_fleet_{name} {help}");
            let _ = writeln!(out, "# TYPE tunneld_fleet_{name} {kind}");
            let _ = writeln!(out, "tunneld_fleet_{name}{{{labels}}} {value}");
        };
        metric(
            "members",
            "gauge",
            "Gateways with a valid record in the fleet, this one included.",
            s.gateways.len() as u64,
        );
        metric(
            "active",
            "gauge",
            "1 while this gateway leads its site.",
            u64::from(s.active),
        );
        metric(
            "joined",
            "gauge",
            "1 once the store has answered since start; 0 until then (no peers from the fleet).",
            u64::from(s.joined),
        );
        metric(
            "name_refused",
            "gauge",
            "1 while another gateway holds this gateway's name (it stays out of the fleet).",
            u64::from(s.refused.is_some()),
        );
        metric(
            "store_up",
            "gauge",
            "1 while the store answers; 0 while the gateway forwards with the peers it last knew.",
            u64::from(s.store_error.is_none()),
        );
        let c = s.counters;
        if let Some(lan) = &s.lan {
            metric(
                "lan_held",
                "gauge",
                "1 while this gateway holds its site's LAN addresses (active, its lease surely alive).",
                u64::from(lan.held),
            );
            metric(
                "lan_takes_total",
                "counter",
                "Times this gateway took its site's LAN addresses.",
                c.lan_takes,
            );
            metric(
                "lan_fenced_total",
                "counter",
                "Times it gave them up because no lease keep-alive was answered in time.",
                c.lan_fenced,
            );
        }
        if let Some(p) = &s.probes {
            metric(
                "probes_answered_total",
                "counter",
                "Probes this gateway answered for its site's other gateways.",
                p.answered,
            );
        }
        let direct = s
            .gateways
            .iter()
            .filter(|g| matches!(g.path, Some(PathStatus::Direct { .. })))
            .count();
        let searching = s
            .gateways
            .iter()
            .filter(|g| matches!(g.path, Some(PathStatus::Searching { .. })))
            .count();
        metric(
            "paths_direct",
            "gauge",
            "Peer gateways reached directly (a live session), behind NAT or not.",
            direct as u64,
        );
        metric(
            "paths_searching",
            "gauge",
            "Peer gateways with no live session, whose addresses are being tried.",
            searching as u64,
        );
        let relayed = s
            .gateways
            .iter()
            .filter(|g| matches!(g.path, Some(PathStatus::Relayed { .. })))
            .count();
        metric(
            "paths_relayed",
            "gauge",
            "Peer gateways reached through a relay (no direct path found).",
            relayed as u64,
        );
        if let Some(r) = &s.relay {
            metric(
                "relay_pairs",
                "gauge",
                "Pairs of gateways this relay serves (a UDP port each).",
                r.pairs as u64,
            );
            metric(
                "relay_bytes_total",
                "counter",
                "Bytes this relay forwarded (WireGuard ciphertext; it holds no session key).",
                r.bytes,
            );
            metric(
                "relay_datagrams_total",
                "counter",
                "Datagrams this relay forwarded.",
                r.datagrams,
            );
            metric(
                "relay_dropped_total",
                "counter",
                "Datagrams this relay dropped: from no registered side, or for a side not registered yet.",
                r.dropped,
            );
        }
        metric(
            "takeovers_total",
            "counter",
            "Times this gateway found its site's active gateway dead by its probes and had etcd revoke its lease.",
            c.takeovers,
        );
        metric(
            "reconciles_total",
            "counter",
            "Times the peers were made to follow the store.",
            c.reconciles,
        );
        metric(
            "store_errors_total",
            "counter",
            "Failed attempts to reach the store.",
            c.store_errors,
        );
        metric(
            "failovers_total",
            "counter",
            "A site's active gateway replaced by another, as seen here.",
            c.failovers,
        );
        metric(
            "rejected_records_total",
            "counter",
            "Records refused (invalid, or claiming another site's subnet or key).",
            c.rejected_records,
        );
        metric(
            "name_conflicts_total",
            "counter",
            "Times this gateway's name was refused to it, or to another gateway claiming it.",
            c.name_conflicts,
        );
        if let Some(p) = &s.probes {
            // In seconds, Prometheus's base unit (fractions).
            for (name, help, value) in [
                (
                    "probe_rtt_seconds",
                    "Round trip of the last answered probe to the site's active gateway (a standby's; 0: none).",
                    p.rtt_us.unwrap_or(0) as f64 / 1e6,
                ),
                (
                    "probe_last_answer_seconds",
                    "Time since the site's active gateway last answered a probe (a standby's; 0: none).",
                    p.last_answer_ms_ago.unwrap_or(0) as f64 / 1e3,
                ),
            ] {
                let _ = writeln!(out, "# HELP tunneld_fleet_{name} {help}");
                let _ = writeln!(out, "# TYPE tunneld_fleet_{name} gauge");
                let _ = writeln!(out, "tunneld_fleet_{name}{{{labels}}} {value}");
            }
        }
        // Each peer gateway's path: one series per peer, its kind and where it goes in the
        // labels, how long it has been so as the value.
        let paths: Vec<(&GatewayStatus, &PathStatus)> = s
            .gateways
            .iter()
            .filter_map(|g| Some((g, g.path.as_ref()?)))
            .collect();
        if !paths.is_empty() {
            let _ = writeln!(
                out,
                "# HELP tunneld_fleet_path_seconds How long the path to each peer gateway has been as its labels say: path (direct, relayed or searching), via (where its datagrams go), relay (the relay's site/gateway)."
            );
            let _ = writeln!(out, "# TYPE tunneld_fleet_path_seconds gauge");
        }
        for (g, path) in paths {
            let (kind, via, relay, secs) = match path {
                PathStatus::Direct { via, for_secs } => ("direct", via.to_string(), "", *for_secs),
                PathStatus::Relayed {
                    relay,
                    via,
                    for_secs,
                } => ("relayed", via.to_string(), relay.as_str(), *for_secs),
                PathStatus::Searching { for_secs, .. } => {
                    ("searching", String::new(), "", *for_secs)
                }
            };
            let _ = writeln!(
                out,
                "tunneld_fleet_path_seconds{{{labels},peer=\"{}/{}\",path=\"{kind}\",via=\"{via}\",relay=\"{relay}\"}} {secs}",
                g.site, g.gateway
            );
        }
        out
    }
}
