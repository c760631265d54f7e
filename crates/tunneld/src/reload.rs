//! SIGHUP: the config file read again and its WireGuard peers applied to the running interface
//! without a restart. Peers whose keys did not change keep their sessions, so traffic to them
//! loses nothing; peers gone from the file are removed, new ones added, and routes follow their
//! allowed IPs. What cannot change while running (the interface's name, port, addresses, MTU,
//! mark, the dataplane, the TLS sections' listeners, the metrics listener) is left as it is,
//! with a warning naming it.
//! A file with errors changes nothing.

use crate::load::{self, Resolve};
use crate::netlink::Netlink;
use std::path::PathBuf;
use std::time::Instant;
use tunneld_dataplane::worker::Workers;
use tunneld_tunnel::config::Config;
use tunneld_tunnel::PeerSettings;

/// What a reload needs of the running interface, and what was applied last.
pub struct Reloader {
    path: PathBuf,
    worker_count: usize,
    workers: Workers,
    netlink: Netlink,
    link: u32,
    config: Config,
    /// As the workers run them: `transport = "tls"` peers aimed at their loopback bridge.
    peers: Vec<PeerSettings>,
}

impl Reloader {
    pub fn new(
        path: PathBuf,
        config: Config,
        peers: Vec<PeerSettings>,
        workers: Workers,
        worker_count: usize,
        link: u32,
    ) -> anyhow::Result<Reloader> {
        use anyhow::Context;
        let netlink = Netlink::open().context("cannot open a netlink socket for reloads")?;
        Ok(Reloader {
            path,
            worker_count,
            workers,
            netlink,
            link,
            config,
            peers,
        })
    }

    /// Reads the config again and applies its peers. Everything it does or refuses is logged.
    pub fn reload(&mut self) {
        let loaded = match load::load(&self.path, Resolve::Everything) {
            Ok(loaded) => loaded,
            Err(errors) => {
                tracing::error!(
                    "SIGHUP: {}: {}; the running WireGuard settings stay",
                    self.path.display(),
                    errors.join("; ")
                );
                return;
            }
        };
        let Some(wg) = loaded.wireguard else {
            tracing::error!(
                "SIGHUP: {}: the [interface] section is gone; the running interface stays (stop tunneld to remove it)",
                self.path.display()
            );
            return;
        };
        let not_applied = fixed_changes(&self.config, &loaded.config);
        if !not_applied.is_empty() {
            tracing::warn!(
                "SIGHUP: {} changed; that takes a restart, the rest is applied",
                not_applied.join(", ")
            );
        }
        let wanted = match self.wanted_peers(&loaded.config, wg.peers) {
            Ok(peers) => peers,
            Err(e) => {
                tracing::error!(
                    "SIGHUP: {}: {e}; the running WireGuard settings stay",
                    self.path.display()
                );
                return;
            }
        };

        let private_key = wg.device.private_key;
        let previous = self.peers.clone();
        let applied = wanted.clone();
        let outcome = self.workers.run_each(move |device, now: Instant| {
            let before = device.routes();
            let report = device.sync(private_key.clone(), &applied, &previous, now);
            (report, before, device.routes())
        });
        let Some((report, before, after)) = outcome.and_then(|o| o.into_iter().next()) else {
            tracing::error!("SIGHUP: the workers have stopped; nothing applied");
            return;
        };
        crate::uapi_server::sync_routes(&mut self.netlink, self.link, &before, &after);
        for key in &report.restarted {
            tracing::info!(
                peer = %key,
                "SIGHUP: the peer's preshared key or parallel changed; its session starts over"
            );
        }
        tracing::info!(
            added = report.added,
            removed = report.removed,
            changed = report.changed,
            restarted = report.restarted.len(),
            private_key_changed = report.key_changed,
            "SIGHUP: WireGuard settings reloaded; unchanged peers keep their sessions"
        );
        let mut config = loaded.config;
        // What was not applied stays as it runs, so the next reload compares against it.
        config.interface = self.config.interface.clone();
        config.dataplane = self.config.dataplane.clone();
        config.tls = self.config.tls.clone();
        config.metrics = self.config.metrics.clone();
        self.config = config;
        self.peers = wanted;
    }

    /// The reloaded peers as the workers should run them: `parallel = "auto"` resolved, and
    /// peers over TLS kept on the bridge they run on (a bridge is made at start only).
    fn wanted_peers(
        &self,
        config: &Config,
        mut peers: Vec<PeerSettings>,
    ) -> Result<Vec<PeerSettings>, String> {
        let mut wanted = Vec::with_capacity(peers.len());
        for (i, (settings, peer)) in peers.drain(..).zip(&config.peers).enumerate() {
            let mut settings = settings;
            settings.parallel = peer.parallel.sub_tunnels(self.worker_count);
            if usize::from(settings.parallel) > self.worker_count {
                return Err(format!(
                    "peer[{i}].parallel: {} sub-tunnels need as many workers, and this interface has {}",
                    settings.parallel, self.worker_count
                ));
            }
            let before = self
                .config
                .peers
                .iter()
                .zip(&self.peers)
                .find(|(p, _)| p.public_key == peer.public_key);
            match before {
                // Same transport: a TLS peer stays on its bridge.
                Some((p, running)) if p.tls == peer.tls => {
                    if peer.tls.is_some() {
                        settings.endpoint = running.endpoint;
                    }
                }
                None if peer.tls.is_none() => {}
                // A bridge (and its thread) is made at start only.
                _ => {
                    tracing::warn!(
                        peer = %peer.public_key,
                        "SIGHUP: peer[{i}]'s transport is new or changed; that takes a restart, the peer is left as it runs"
                    );
                    if let Some((_, running)) = before {
                        wanted.push(running.clone());
                    }
                    continue;
                }
            }
            wanted.push(settings);
        }
        Ok(wanted)
    }
}

/// The settings that differ between `old` and `new` and that a running tunneld cannot change.
fn fixed_changes(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut changed = Vec::new();
    match (&old.interface, &new.interface) {
        (Some(a), Some(b)) => {
            for (field, differs) in [
                ("interface.name", a.name != b.name),
                ("interface.listen_port", a.listen_port != b.listen_port),
                ("interface.address", a.addresses != b.addresses),
                ("interface.mtu", a.mtu != b.mtu),
                ("interface.fwmark", a.fwmark != b.fwmark),
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
