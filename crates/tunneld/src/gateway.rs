//! The embeddable gateway: settings in, a running interface out, and a handle to change it,
//! read it and shut it down. `tunneld up` is this and a signal loop.

use crate::bring_up::{self, RunningWireGuard, StartOptions};
use crate::error::Error;
use crate::load::{self, Loaded, Resolve};
use crate::netlink::Netlink;
use crate::reload::{ReloadError, ReloadReport, Reloader};
use crate::uapi_server::lock;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};
use tunneld_config::Config;
use tunneld_crypto::{PresharedKey, PublicKey};
use tunneld_dataplane::worker::Workers;
use tunneld_tunnel::uapi::{DeviceSnapshot, PeerSnapshot, PeerUpdate, SetRequest, WorkerStats};
use tunneld_tunnel::PeerSettings;

/// A gateway's settings, validated, with their key files read and endpoints resolved: from
/// a config file ([`Settings::from_file`]) or its text ([`Settings::from_toml`]).
///
/// ```no_run
/// let settings = tunneld::Settings::from_file("site-a.toml")?;
/// # Ok::<(), tunneld::Error>(())
/// ```
#[derive(Debug)]
pub struct Settings {
    loaded: Loaded,
    /// The file they came from, which [`Gateway::reload_file`] reads again.
    file: Option<PathBuf>,
}

impl Settings {
    /// Reads, validates and resolves a config file (the format is in README.md). Relative
    /// key and certificate files are taken from the file's directory. Every problem is in
    /// the error, each naming its field.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Settings, Error> {
        let path = path.as_ref();
        let loaded = load::load(path, Resolve::Everything).map_err(Error::invalid_lines)?;
        Ok(Settings {
            loaded,
            file: Some(path.to_path_buf()),
        })
    }

    /// Validates a config file as [`Settings::from_file`] does, reading its key files but
    /// resolving no host names (no network use): what `tunneld check` runs.
    pub fn check_file(path: impl AsRef<Path>) -> Result<(), Error> {
        load::load(path.as_ref(), Resolve::CheckOnly)
            .map(drop)
            .map_err(Error::invalid_lines)
    }

    /// Settings from a config's text, with relative file names taken from `base_dir`.
    ///
    /// ```
    /// let key = tunneld::PrivateKey::generate().to_base64();
    /// let text = format!("[interface]\nname = \"wg-doc\"\nprivate_key = \"{}\"\n", *key);
    /// let settings = tunneld::Settings::from_toml(&text, ".")?;
    /// assert_eq!(settings.interface_name(), Some("wg-doc"));
    ///
    /// let err = tunneld::Settings::from_toml("[interface]\nname = \"wg-doc\"\nmtu = 1\n", ".")
    ///     .unwrap_err();
    /// assert!(err.problems().unwrap().iter().any(|p| p.field == "interface.mtu"));
    /// # Ok::<(), tunneld::Error>(())
    /// ```
    pub fn from_toml(text: &str, base_dir: impl AsRef<Path>) -> Result<Settings, Error> {
        let loaded = load::load_text(text, base_dir.as_ref(), Resolve::Everything)
            .map_err(Error::invalid_lines)?;
        Ok(Settings { loaded, file: None })
    }

    /// The WireGuard interface's name, if the settings have an `[interface]`.
    pub fn interface_name(&self) -> Option<&str> {
        self.loaded
            .config
            .interface
            .as_ref()
            .map(|i| i.name.as_str())
    }

    /// The validated config these settings were made from.
    pub fn config(&self) -> &Config {
        &self.loaded.config
    }
}

/// Starts a [`Gateway`]; made by [`Gateway::builder`].
#[derive(Debug)]
#[must_use = "a builder does nothing until `start`"]
pub struct GatewayBuilder {
    settings: Settings,
    uapi: bool,
    drop_privileges: bool,
}

impl GatewayBuilder {
    /// Whether to serve `/var/run/wireguard/<name>.sock`, so that `wg show` and `wg set`
    /// work against the interface (default: yes).
    pub fn uapi_socket(mut self, serve: bool) -> Self {
        self.uapi = serve;
        self
    }

    /// Whether to drop every capability but `CAP_NET_ADMIN` (none at all for a gateway with
    /// no interface) once the interface is up, and set `no_new_privs`. Capabilities belong
    /// to threads: this drops them for the thread calling `start` and every thread it
    /// starts afterwards, so it is off by default in a library and on in `tunneld up`.
    pub fn drop_privileges(mut self, drop: bool) -> Self {
        self.drop_privileges = drop;
        self
    }

    /// Brings the gateway up: the TUN interface with its addresses and routes, the UDP
    /// sockets and one worker per core, the UAPI socket, the TLS listeners and forwarders
    /// and the metrics listener the settings name. Needs `CAP_NET_ADMIN` (root) for an
    /// interface. On an error nothing is left behind.
    pub fn start(self) -> Result<Gateway, Error> {
        start(self)
    }
}

/// A running gateway. Cheap to clone; every clone is a handle on the same gateway, which
/// runs until [`Gateway::shutdown`] (or until the last handle is dropped).
///
/// ```no_run
/// use tunneld::{Gateway, PeerSettings, PrivateKey, Settings};
///
/// let gateway = Gateway::builder(Settings::from_file("site-a.toml")?).start()?;
/// gateway.add_peer(PeerSettings {
///     public_key: PrivateKey::generate().public_key(),
///     preshared_key: None,
///     endpoint: Some("192.0.2.7:51820".parse().unwrap()),
///     allowed_ips: vec!["10.77.0.7/32".parse().unwrap()],
///     persistent_keepalive: 25,
///     parallel: 1,
/// })?;
/// for peer in gateway.peers()? {
///     println!("{} rx {} tx {}", peer.public_key, peer.rx_bytes, peer.tx_bytes);
/// }
/// gateway.shutdown()?;
/// # Ok::<(), tunneld::Error>(())
/// ```
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("interface", &self.inner.interface.as_ref().map(|i| &i.name))
            .finish_non_exhaustive()
    }
}

struct Inner {
    interface: Option<Interface>,
    /// What runs, until shutdown takes it.
    running: Mutex<Option<Running>>,
}

/// The WireGuard side of a running gateway, fixed for its life.
struct Interface {
    name: String,
    listen_port: u16,
    public_key: PublicKey,
    workers: Workers,
    /// Route changes and reloads, one at a time.
    control: Mutex<Control>,
}

struct Control {
    netlink: Netlink,
    link: u32,
    reloader: Reloader,
}

/// What `shutdown` stops.
struct Running {
    wireguard: Option<RunningWireGuard>,
    tls: Option<tunneld_tls::TlsService>,
    _metrics: Option<crate::metrics::MetricsServing>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let running = self.running.get_mut().map_or(None, Option::take);
        if let Some(running) = running {
            let _ = stop(running);
        }
    }
}

impl Gateway {
    /// A builder that starts a gateway with `settings`.
    pub fn builder(settings: Settings) -> GatewayBuilder {
        GatewayBuilder {
            settings,
            uapi: true,
            drop_privileges: false,
        }
    }

    /// The WireGuard interface's name (`None` for TLS forwarding only).
    pub fn interface_name(&self) -> Option<&str> {
        self.inner.interface.as_ref().map(|i| i.name.as_str())
    }

    /// The UDP port the interface listens on (the one picked, for `listen_port = 0`).
    pub fn listen_port(&self) -> Option<u16> {
        self.inner.interface.as_ref().map(|i| i.listen_port)
    }

    /// The interface's public key, as it started.
    pub fn public_key(&self) -> Option<PublicKey> {
        self.inner.interface.as_ref().map(|i| i.public_key)
    }

    fn interface(&self) -> Result<&Interface, Error> {
        self.inner.interface.as_ref().ok_or(Error::NoInterface)
    }

    /// Every peer: keys, endpoint, allowed IPs, last handshake, bytes each way (as `wg show`
    /// prints them).
    pub fn peers(&self) -> Result<Vec<PeerSnapshot>, Error> {
        Ok(self.snapshot()?.peers)
    }

    /// The interface as `wg show` sees it: its port and mark, and every peer.
    pub fn snapshot(&self) -> Result<DeviceSnapshot, Error> {
        let interface = self.interface()?;
        let unix_now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let parts = interface
            .workers
            .run_each(move |device, now| device.snapshot(now, unix_now))
            .ok_or(Error::Stopped)?;
        let mut snapshot = DeviceSnapshot::merge(parts);
        // Keys stay inside: a caller that wants them has them already.
        snapshot.private_key = None;
        for peer in &mut snapshot.peers {
            peer.preshared_key = None;
        }
        Ok(snapshot)
    }

    /// Each worker's counters (packets, drops by reason, hand-offs) and the peers it carries,
    /// as `tunneld show` prints them.
    pub fn worker_stats(&self) -> Result<Vec<WorkerStats>, Error> {
        self.interface()?
            .workers
            .run_each(|device, _| WorkerStats {
                stats: device.stats().clone(),
                carries: device.carried(),
            })
            .ok_or(Error::Stopped)
    }

    /// Adds a peer, with a route for each of its allowed IPs. A peer added this way is a
    /// plain one (`parallel` must be 1: sub-tunnels are set up at start).
    pub fn add_peer(&self, peer: PeerSettings) -> Result<(), Error> {
        if peer.parallel > 1 {
            return Err(Error::invalid(
                "parallel",
                "a peer added to a running gateway is carried by one session (parallel = 1); put it in the settings to split it",
            ));
        }
        if self.has_peer(&peer.public_key)? {
            return Err(Error::PeerExists(peer.public_key));
        }
        let mut update = PeerUpdate::new(peer.public_key);
        update.preshared_key = Some(peer.preshared_key);
        update.endpoint = peer.endpoint;
        update.persistent_keepalive = Some(peer.persistent_keepalive);
        update.replace_allowed_ips = true;
        update.allowed_ips = peer.allowed_ips;
        self.set(vec![update])
    }

    /// Changes what `change` names of an existing peer; its session is kept (a new preshared
    /// key starts a new one).
    pub fn update_peer(&self, change: PeerChange) -> Result<(), Error> {
        if !self.has_peer(&change.public_key)? {
            return Err(Error::UnknownPeer(change.public_key));
        }
        let mut update = PeerUpdate::new(change.public_key);
        update.update_only = true;
        update.preshared_key = change.preshared_key;
        update.endpoint = change.endpoint;
        update.persistent_keepalive = change.persistent_keepalive;
        if let Some(allowed_ips) = change.allowed_ips {
            update.replace_allowed_ips = true;
            update.allowed_ips = allowed_ips;
        }
        self.set(vec![update])
    }

    /// Removes a peer, its sessions and its routes.
    pub fn remove_peer(&self, public_key: &PublicKey) -> Result<(), Error> {
        if !self.has_peer(public_key)? {
            return Err(Error::UnknownPeer(*public_key));
        }
        let mut update = PeerUpdate::new(*public_key);
        update.remove = true;
        self.set(vec![update])
    }

    fn has_peer(&self, key: &PublicKey) -> Result<bool, Error> {
        Ok(self.snapshot()?.peers.iter().any(|p| p.public_key == *key))
    }

    /// Applies one change to every worker (each holds every peer, and they decide alike),
    /// then makes the kernel's routes follow.
    fn set(&self, peers: Vec<PeerUpdate>) -> Result<(), Error> {
        let interface = self.interface()?;
        let request = SetRequest {
            private_key: None,
            listen_port: None,
            fwmark: None,
            replace_peers: false,
            peers,
        };
        let mut control = lock(&interface.control);
        let outcome = interface.workers.run_each(move |device, now| {
            let before = device.routes();
            let result = device.apply(request.clone(), now);
            (result, before, device.routes())
        });
        let (result, before, after) = outcome
            .and_then(|o| o.into_iter().next())
            .ok_or(Error::Stopped)?;
        let link = control.link;
        crate::uapi_server::sync_routes(&mut control.netlink, link, &before, &after);
        result.map_err(|e| Error::Refused {
            errno: e.errno,
            message: e.to_string(),
        })
    }

    /// Applies new settings to the running gateway as a reload does (`SIGHUP`): peers gone
    /// are removed, new ones added, changed ones updated in place (their sessions kept), the
    /// interface's addresses follow. What cannot change while running (the interface's name,
    /// port, MTU, `[dataplane]`, …) is left as it runs and named in the report.
    pub fn reload(&self, settings: Settings) -> Result<ReloadReport, Error> {
        let interface = self.interface()?;
        let mut control = lock(&interface.control);
        control
            .reloader
            .apply(settings.loaded, "reload")
            .map_err(reload_error)
    }

    /// Reads the config file the gateway was started from again and applies it, as
    /// [`Gateway::reload`] does; TLS certificates and keys are read again too (new
    /// connections use them). `label` starts each log line (`tunneld up` passes "SIGHUP").
    pub fn reload_file(&self, label: &str) -> Result<ReloadReport, Error> {
        self.reload_tls_certificates(label);
        let interface = self.interface()?;
        let mut control = lock(&interface.control);
        control.reloader.reload(label).map_err(reload_error)
    }

    /// Reads the TLS sections' certificates, keys and CAs again (all or none), logged.
    fn reload_tls_certificates(&self, label: &str) {
        let running = lock(&self.inner.running);
        if let Some(tls) = running.as_ref().and_then(|r| r.tls.as_ref()) {
            match tls.reload() {
                Ok(()) => tracing::info!(
                    "{label}: TLS certificates and keys reloaded; new connections use them"
                ),
                Err(e) => tracing::error!(
                    "{label}: TLS reload failed, the old certificates stay in use: {}",
                    e.replace('\n', "; ")
                ),
            }
        }
    }

    /// Whether a worker has stopped on its own (a failure: the interface is gone).
    pub fn has_failed(&self) -> bool {
        let running = lock(&self.inner.running);
        running
            .as_ref()
            .and_then(|r| r.wireguard.as_ref())
            .is_some_and(|wg| wg.threads.iter().any(|t| t.is_finished()))
    }

    /// Stops the gateway: the workers stop and the interface goes with its addresses and
    /// routes, the UAPI socket is removed, the TLS and metrics listeners close. Calling it
    /// again, from any handle, does nothing. An error says a worker had failed.
    pub fn shutdown(&self) -> Result<(), Error> {
        let running = lock(&self.inner.running).take();
        match running {
            Some(running) => stop(running),
            None => Ok(()),
        }
    }
}

/// What [`Gateway::update_peer`] changes; `None` leaves a setting as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerChange {
    /// The peer to change.
    pub public_key: PublicKey,
    /// Where to send its datagrams from now on.
    pub endpoint: Option<std::net::SocketAddr>,
    /// Replaces every allowed IP (and the routes follow).
    pub allowed_ips: Option<Vec<ipnet::IpNet>>,
    /// Seconds; 0 turns it off.
    pub persistent_keepalive: Option<u16>,
    /// `Some(None)` removes the preshared key. A new key starts a new session.
    pub preshared_key: Option<Option<PresharedKey>>,
}

impl PeerChange {
    /// A change to the peer `public_key` that changes nothing yet.
    ///
    /// ```
    /// # let key = tunneld::PrivateKey::generate().public_key();
    /// let mut change = tunneld::PeerChange::new(key);
    /// change.endpoint = Some("192.0.2.9:51820".parse().unwrap());
    /// ```
    pub fn new(public_key: PublicKey) -> Self {
        PeerChange {
            public_key,
            endpoint: None,
            allowed_ips: None,
            persistent_keepalive: None,
            preshared_key: None,
        }
    }
}

fn reload_error(e: ReloadError) -> Error {
    match e {
        ReloadError::Invalid(lines) => Error::invalid_lines(lines),
        ReloadError::NoFile => Error::NoConfigFile,
        ReloadError::Stopped => Error::Stopped,
    }
}

fn stop(running: Running) -> Result<(), Error> {
    let Running { wireguard, tls, .. } = running;
    if let Some(tls) = &tls {
        tls.stop();
    }
    let Some(wg) = wireguard else {
        return Ok(());
    };
    wg.workers.shutdown();
    let failed = wg.threads.into_iter().map(|t| t.join()).any(|r| r.is_err());
    drop(wg.uapi);
    if failed {
        return Err(Error::System(
            "a worker thread failed; the interface has been removed".into(),
        ));
    }
    Ok(())
}

fn start(builder: GatewayBuilder) -> Result<Gateway, Error> {
    let GatewayBuilder {
        settings,
        uapi,
        drop_privileges,
    } = builder;
    let Settings { mut loaded, file } = settings;
    if let Some(aead) = loaded.config.dataplane.aead {
        if !aead.is_available() {
            return Err(Error::invalid(
                "dataplane.aead",
                format!(
                    "\"{}\": this CPU does not run it (it needs AVX-512 F, BW and VL); use \"auto\", \"ring\" or \"aws-lc\"",
                    aead.name()
                ),
            ));
        }
    }
    let workers = bring_up::worker_count(&loaded.config.dataplane, &loaded.config.peers);
    if let Some(wg) = &mut loaded.wireguard {
        // `load` keeps the config's peers in order, one settings entry each.
        for (settings, peer) in wg.peers.iter_mut().zip(&loaded.config.peers) {
            settings.parallel = peer.parallel.sub_tunnels(workers);
        }
    }
    let use_uring = match &loaded.wireguard {
        Some(wg) => {
            bring_up::check_dataplane(
                &loaded.config.dataplane,
                wg.interface.mtu,
                workers,
                &wg.peers,
            )
            .map_err(|e| Error::invalid_lines(vec![e]))?;
            bring_up::choose_uring(loaded.config.dataplane.backend)
                .map_err(|e| Error::invalid_lines(vec![e]))?
        }
        None => false,
    };
    let wg_port = Arc::new(OnceLock::new());
    // Sockets are bound while tunneld still has its privileges; threads start only once
    // they are dropped, since a thread keeps the capabilities of the one that started it.
    let mut tls = if loaded.config.tls.is_empty() {
        None
    } else {
        Some(
            tunneld_tls::TlsService::bind(
                &loaded.config.tls,
                &loaded.base,
                wg_port.clone(),
                crate::topology::allowed_cpus().len(),
            )
            .map_err(Error::system)?,
        )
    };
    let metrics = match &loaded.config.metrics {
        Some(m) => Some(crate::metrics::MetricsServer::bind(m.listen).map_err(Error::system)?),
        None => None,
    };
    let (wireguard, interface, starters) = match loaded.wireguard {
        Some(mut wg) => {
            // Peers with transport = "tls" are reached through a loopback bridge each.
            let worker = Arc::new(OnceLock::new());
            let tls_peers = Arc::new(crate::tls_peers::TlsPeers(worker.clone()));
            let (bridges, starters) =
                tunneld_tls::prepare_peer_transports(&loaded.config, &loaded.base, tls_peers)
                    .map_err(Error::system)?;
            for (i, bridge) in bridges {
                if let Some(peer) = wg.peers.get_mut(i) {
                    peer.endpoint = Some(bridge);
                }
            }
            let peers_as_run = wg.peers.clone();
            let options = StartOptions {
                use_uring,
                uapi,
                drop_privileges,
            };
            let running = bring_up::start_wireguard(wg, &loaded.config.dataplane, workers, options)
                .map_err(Error::system)?;
            let _ = wg_port.set(running.port);
            let _ = worker.set(running.workers.clone());
            let control = (|| {
                let netlink = Netlink::open()?;
                let reloader = Reloader::new(
                    file.clone(),
                    loaded.config.clone(),
                    peers_as_run,
                    running.workers.clone(),
                    workers,
                    running.link,
                    running.marks.clone(),
                )?;
                anyhow::Ok(Control {
                    netlink,
                    link: running.link,
                    reloader,
                })
            })();
            let control = match control {
                Ok(control) => control,
                Err(e) => {
                    let _ = stop(Running {
                        wireguard: Some(running),
                        tls,
                        _metrics: None,
                    });
                    return Err(Error::System(format!(
                        "cannot open a netlink socket: {e:#}"
                    )));
                }
            };
            let interface = Interface {
                name: running.name.clone(),
                listen_port: running.port,
                public_key: running.public_key,
                workers: running.workers.clone(),
                control: Mutex::new(control),
            };
            (Some(running), Some(interface), starters)
        }
        None => {
            if drop_privileges {
                crate::privileges::drop_all();
            }
            (None, None, Vec::new())
        }
    };
    let mut running = Running {
        wireguard,
        tls: None,
        _metrics: None,
    };
    // From here on, an error stops what runs (dropping `running` alone would not join the
    // workers).
    let serve = (|| {
        if let Some(metrics) = metrics {
            let wg = interface
                .as_ref()
                .map(|i| (i.name.clone(), i.workers.clone()));
            running._metrics = Some(metrics.serve(wg, tls.as_ref().map(|t| t.stats()))?);
        }
        if let Some(tls) = tls.as_mut() {
            tls.serve()?;
        }
        running.tls = tls;
        for start in starters {
            start()?;
        }
        anyhow::Ok(())
    })();
    if let Err(e) = serve {
        let _ = stop(running);
        return Err(Error::system(e));
    }
    Ok(Gateway {
        inner: Arc::new(Inner {
            interface,
            running: Mutex::new(Some(running)),
        }),
    })
}
