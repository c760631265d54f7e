//! Reloads (SIGHUP, `Gateway::reload`): the config read again and its WireGuard peers applied to the running interface
//! without a restart. Peers whose keys did not change keep their sessions, so traffic to them
//! loses nothing; peers gone from the file are removed, new ones added, and routes follow their
//! allowed IPs, and the interface's addresses and fwmark follow the file. What cannot change
//! while running (the interface's name, port, MTU, the dataplane, the TLS sections'
//! listeners, the metrics listener) is left as it is, with a warning naming it.
//! A file with errors changes nothing.

use crate::load::{self, Loaded, Resolve};
use crate::netlink::Netlink;
use crate::uapi_server::lock;
use crate::uapi_server::SocketMarks;
use ipnet::IpNet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tunneld_config::{Config, PeerConfig};
use tunneld_dataplane::worker::Workers;
use tunneld_tunnel::uapi::SetRequest;
use tunneld_tunnel::{PeerSettings, SyncReport};

/// What a reload needs of the running interface, and what was applied last.
pub struct Reloader {
    /// The config file, for a gateway started from one.
    path: Option<PathBuf>,
    worker_count: usize,
    workers: Workers,
    netlink: Netlink,
    link: u32,
    /// The config tunneld started with: what a reload cannot change is compared with it.
    config: Config,
    /// The interface's addresses as tunneld last set them.
    addresses: Vec<IpNet>,
    /// The sockets' `fwmark`, shared with the UAPI server.
    marks: Arc<Mutex<SocketMarks>>,
    /// Each running peer as the file said it and as the workers run it (`transport = "tls"`
    /// peers aimed at their loopback bridge).
    running: Vec<(PeerConfig, PeerSettings)>,
}

impl Reloader {
    pub fn new(
        path: Option<PathBuf>,
        config: Config,
        peers: Vec<PeerSettings>,
        workers: Workers,
        worker_count: usize,
        link: u32,
        marks: Arc<Mutex<SocketMarks>>,
    ) -> anyhow::Result<Reloader> {
        use anyhow::Context;
        let netlink = Netlink::open().context("cannot open a netlink socket for reloads")?;
        let running = config.peers.iter().cloned().zip(peers).collect();
        let addresses = config
            .interface
            .as_ref()
            .map(|i| i.addresses.clone())
            .unwrap_or_default();
        Ok(Reloader {
            addresses,
            marks,
            path,
            worker_count,
            workers,
            netlink,
            link,
            config,
            running,
        })
    }

    /// Reads the config file again and applies it (`SIGHUP`, `Gateway::reload_file`).
    /// Everything it does or refuses is logged, each line starting with `label`.
    pub fn reload(&mut self, label: &str) -> Result<ReloadReport, ReloadError> {
        let Some(path) = self.path.clone() else {
            return Err(ReloadError::NoFile);
        };
        match load::load(&path, Resolve::Everything) {
            Ok(loaded) => self.apply(loaded, label),
            Err(errors) => {
                tracing::error!(
                    "{label}: {}: {}; the running WireGuard settings stay",
                    path.display(),
                    errors.join("; ")
                );
                Err(ReloadError::Invalid(errors))
            }
        }
    }

    /// Applies new settings to the running interface: its peers and addresses (see the
    /// module's comment). Logged as `reload` does.
    pub fn apply(&mut self, loaded: Loaded, label: &str) -> Result<ReloadReport, ReloadError> {
        let shown = self.path.as_ref().map_or_else(
            || "the new settings".to_string(),
            |p| p.display().to_string(),
        );
        let Some(wg) = loaded.wireguard else {
            tracing::error!(
                "{label}: {shown}: the [interface] section is gone; the running interface stays (stop tunneld to remove it)",
            );
            return Err(ReloadError::Invalid(vec![
                "[interface]: is gone; the running interface stays (stop the gateway to remove it)"
                    .into(),
            ]));
        };
        let not_applied = fixed_changes(&self.config, &loaded.config);
        if !not_applied.is_empty() {
            tracing::warn!(
                "{label}: {} changed; that takes a restart, the rest is applied",
                not_applied.join(", ")
            );
        }
        if let Some(interface) = &loaded.config.interface {
            self.sync_addresses(&interface.addresses, label);
        }
        let wanted = match self.wanted_peers(&loaded.config, wg.peers, label) {
            Ok(peers) => peers,
            Err(e) => {
                tracing::error!("{label}: {shown}: {e}; the running WireGuard settings stay");
                return Err(ReloadError::Invalid(vec![e]));
            }
        };

        self.sync_fwmark(wg.device.fwmark, label);
        let private_key = wg.device.private_key;
        let previous: Vec<PeerSettings> = self.running.iter().map(|(_, s)| s.clone()).collect();
        let applied: Vec<PeerSettings> = wanted.iter().map(|(_, s)| s.clone()).collect();
        let outcome = self.workers.run_each(move |device, now: Instant| {
            let before = device.routes();
            let report = device.sync(private_key.clone(), &applied, &previous, now);
            (report, before, device.routes())
        });
        let Some((report, before, after)) = outcome.and_then(|o| o.into_iter().next()) else {
            tracing::error!("{label}: the workers have stopped; nothing applied");
            return Err(ReloadError::Stopped);
        };
        crate::uapi_server::sync_routes(&mut self.netlink, self.link, &before, &after);
        for key in &report.restarted {
            tracing::info!(
                peer = %key,
                "{label}: the peer's preshared key or parallel changed; its session starts over"
            );
        }
        tracing::info!(
            added = report.added,
            removed = report.removed,
            changed = report.changed,
            restarted = report.restarted.len(),
            private_key_changed = report.key_changed,
            "{label}: WireGuard settings reloaded; unchanged peers keep their sessions"
        );
        self.running = wanted;
        Ok(ReloadReport {
            peers: report,
            needs_restart: not_applied,
        })
    }

    /// Puts the file's fwmark on the interface's sockets and devices when it differs from the
    /// one they carry (which `wg set` may have changed since).
    fn sync_fwmark(&mut self, mark: u32, label: &str) {
        let mut marks = lock(&self.marks);
        if marks.current() == mark {
            return;
        }
        if let Err(e) = marks.check(mark) {
            tracing::error!("{label}: {e}");
            return;
        }
        let request = SetRequest {
            fwmark: Some(mark),
            ..SetRequest::default()
        };
        let applied = self
            .workers
            .run_each(move |device, now| device.apply(request.clone(), now));
        match applied.and_then(|outcomes| outcomes.into_iter().next()) {
            Some(Ok(())) => {
                if let Err(e) = marks.set(mark) {
                    tracing::error!("{label}: {e}");
                }
            }
            Some(Err(e)) => tracing::error!("{label}: {e}"),
            None => tracing::error!("{label}: the workers have stopped; fwmark not applied"),
        }
    }

    /// Adds the addresses the file has and the interface does not, then removes those it no
    /// longer has (adding first, so an address that moves within a subnet keeps its route).
    fn sync_addresses(&mut self, wanted: &[IpNet], label: &str) {
        let mut now = Vec::with_capacity(wanted.len());
        for &addr in wanted {
            if self.addresses.contains(&addr) {
                now.push(addr);
                continue;
            }
            match self.netlink.add_address(self.link, addr) {
                Ok(()) => {
                    tracing::info!("{label}: address {addr} added");
                    now.push(addr);
                }
                Err(e) => tracing::error!("{label}: {e}"),
            }
        }
        for &addr in self.addresses.iter().filter(|a| !wanted.contains(a)) {
            match self.netlink.del_address(self.link, addr) {
                Ok(()) => tracing::info!("{label}: address {addr} removed"),
                Err(e) => {
                    tracing::error!("{label}: {e}");
                    now.push(addr);
                }
            }
        }
        self.addresses = now;
    }

    /// The reloaded peers as the workers should run them, each with its config: `parallel =
    /// "auto"` resolved, peers over TLS kept on the bridge they run on, and a peer whose
    /// transport is new or changed left as it runs (a bridge is made at start only).
    fn wanted_peers(
        &self,
        config: &Config,
        peers: Vec<PeerSettings>,
        label: &str,
    ) -> Result<Vec<(PeerConfig, PeerSettings)>, String> {
        let mut wanted = Vec::with_capacity(peers.len());
        for (i, (mut settings, peer)) in peers.into_iter().zip(&config.peers).enumerate() {
            settings.parallel = peer.parallel.sub_tunnels(self.worker_count);
            if usize::from(settings.parallel) > self.worker_count {
                return Err(format!(
                    "peer[{i}].parallel: {} sub-tunnels need as many workers, and this interface has {}",
                    settings.parallel, self.worker_count
                ));
            }
            let running = self
                .running
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
fn fixed_changes(old: &Config, new: &Config) -> Vec<&'static str> {
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
    changed
}
