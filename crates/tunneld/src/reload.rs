//! Reloads (SIGHUP, `Gateway::reload`): the config read again and its WireGuard peers applied to the running interface
//! without a restart. Peers whose keys did not change keep their sessions, so traffic to them
//! loses nothing; peers gone from the file are removed, new ones added, and routes follow their
//! allowed IPs, and the interface's addresses and fwmark follow the file. What cannot change
//! while running (the interface's name, port, MTU, the dataplane, the TLS sections'
//! listeners, the metrics listener) is left as it is, with a warning naming it.
//! A file with errors changes nothing. The rules are here; `control.rs` applies them
//! under the interface's one control lock.

use crate::plan;
use tunneld_config::{Config, PeerConfig};
use tunneld_wireguard::{PeerSettings, SyncReport};

/// The reloaded peers as the workers should run them, each with its config: `parallel =
/// "auto"` resolved for the running workers, peers over TLS kept on the bridge they run on,
/// and a peer whose transport is new or changed left as it runs (a bridge is made at start
/// only).
pub(crate) fn wanted_peers(
    running_peers: &[(PeerConfig, PeerSettings)],
    config: &Config,
    peers: Vec<PeerSettings>,
    worker_count: usize,
    label: &str,
) -> Result<Vec<(PeerConfig, PeerSettings)>, String> {
    let mut wanted = Vec::with_capacity(peers.len());
    for (i, (mut settings, peer)) in peers.into_iter().zip(&config.peers).enumerate() {
        // Against the workers that run, which a changed [dataplane] does not change.
        settings.parallel = peer.parallel.sub_tunnels(worker_count);
        plan::check_sub_tunnels(i, settings.parallel, worker_count)?;
        let running = running_peers
            .iter()
            .find(|(p, _)| p.public_key == peer.public_key);
        match running {
            Some((was, runs)) if was.tls == peer.tls => {
                if peer.tls.is_some() {
                    settings.endpoint = runs.endpoint;
                }
            }
            None if peer.tls.is_none() => {}
            _ => {
                tracing::warn!(
                    peer = %peer.public_key,
                    "{label}: peer[{i}]'s transport is new or changed; that takes a restart, the peer is left as it runs"
                );
                wanted.extend(running.cloned());
                continue;
            }
        }
        wanted.push((peer.clone(), settings));
    }
    Ok(wanted)
}

/// What a reload changed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReloadReport {
    /// The peers added, removed, changed in place and restarted, and whether the private key
    /// changed.
    pub peers: SyncReport,
    /// Settings that differ from the running ones and take a restart (`interface.mtu`,
    /// `[dataplane]`, …): left as they run.
    pub needs_restart: Vec<&'static str>,
}

/// Why a reload changed nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReloadError {
    /// The settings have problems, one line each naming the field.
    Invalid(Vec<String>),
    /// The gateway was not started from a file.
    NoFile,
    /// The workers have stopped.
    Stopped,
}

/// The settings that differ between `old` and `new` and that a running tunneld cannot change.
pub(crate) fn fixed_changes(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut changed = Vec::new();
    match (&old.interface, &new.interface) {
        (Some(a), Some(b)) => {
            for (field, differs) in [
                ("interface.name", a.name != b.name),
                ("interface.listen_port", a.listen_port != b.listen_port),
                ("interface.mtu", a.mtu != b.mtu),
            ] {
                if differs {
                    changed.push(field);
                }
            }
        }
        (a, b) if a.is_some() != b.is_some() => changed.push("[interface]"),
        _ => {}
    }
    if old.dataplane != new.dataplane {
        changed.push("[dataplane]");
    }
    if old.metrics != new.metrics {
        changed.push("[metrics]");
    }
    if old.tls != new.tls {
        changed.push("[[tls.forward]]/[[tls.listen]] (their certificates do reload)");
    }
    if old.fleet != new.fleet {
        changed.push("[fleet]");
    }
    changed
}
