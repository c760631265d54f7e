//! The control handle of a running WireGuard interface: the one object every writer goes
//! through — the UAPI socket (`wg set`), the library's peer operations, reloads (SIGHUP,
//! `Gateway::reload`), the bare mode once it runs, host names resolved again
//! (`reresolve.rs`) and the TLS transport (`tls_peers.rs`: its handshake requests and a
//! `transport = "auto"` peer's move to TLS) — behind one lock
//! ([`ControlHandle`]). Holding it, a writer applies its change to every worker in turn,
//! then makes the kernel's routes and the sockets' mark follow, before the next writer
//! starts: so every worker sees the changes in the same order, and routes always follow the
//! last change. Readers (`get`, stats, snapshots) take it too, so they never see a change
//! half applied. It is never taken on the data path: the workers run each change between
//! their batches.

use crate::front_end::FrontEndSlot;
use crate::netlink::Netlink;
use crate::plan::{self, Plan, Resolve};
use crate::reload::{self, ReloadError, ReloadReport};
use crate::Error;
use ipnet::IpNet;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tunneld_config::{Config, Endpoint, PeerConfig};
use tunneld_crypto::PublicKey;
use tunneld_dataplane::worker::Workers;
use tunneld_wireguard::uapi::{
    self, DeviceSnapshot, PeerUpdate, Request, SetRequest, UapiError, WorkerStats,
};
use tunneld_wireguard::PeerSettings;

/// The one lock on a running interface's control plane, shared by every writer.
pub(crate) type ControlHandle = Arc<Mutex<Control>>;

/// A lock on control-plane state only (never taken on the data path). A thread that
/// panicked holding it left nothing half-done that matters more than stopping cleanly.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// See the module's comment.
pub(crate) struct Control {
    workers: Workers,
    worker_count: usize,
    marks: SocketMarks,
    /// `tunneld up` and the library: the kernel's routes through the link follow the peers'
    /// allowed IPs, and the settings can be reloaded. `None` in the bare mode, where
    /// `wg-quick` makes the routes and there is no file.
    managed: Option<Managed>,
    /// What drives the gateway from outside (the fleet), shown through the UAPI socket.
    front_end: FrontEndSlot,
    /// Peers a program added through the library (`Gateway::add_peer`), by key: a reload
    /// of the file leaves them alone (the file's own peers follow the file).
    added: BTreeMap<PublicKey, PeerSettings>,
    /// The file's UDP peers whose endpoint is a host name, which `reresolve.rs` looks up
    /// again when their handshakes go unanswered. An endpoint set by hand (`wg set`, the
    /// library) takes the peer out until the next reload.
    host_endpoints: HashMap<PublicKey, HostEndpoint>,
}

/// A peer's endpoint as the file names it: a host name and a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostEndpoint {
    pub host: String,
    pub port: u16,
}

/// The file's UDP peers whose endpoint is a host name (a TLS peer's endpoint is its
/// transport's, resolved when it connects).
fn host_endpoints<'a>(
    peers: impl Iterator<Item = &'a PeerConfig>,
) -> HashMap<PublicKey, HostEndpoint> {
    peers
        .filter(|p| p.tls.is_none())
        .filter_map(|p| match &p.endpoint {
            Some(Endpoint::Host { host, port }) => Some((
                p.public_key,
                HostEndpoint {
                    host: host.clone(),
                    port: *port,
                },
            )),
            _ => None,
        })
        .collect()
}

/// What an interface brought up from settings has beyond the bare mode's.
struct Managed {
    netlink: Netlink,
    link: u32,
    /// The config file, for a gateway started from one.
    path: Option<PathBuf>,
    /// The config it started with: what a reload cannot change is compared with it.
    config: Config,
    /// The interface's addresses as tunneld last set them.
    addresses: Vec<IpNet>,
    /// Each running peer as the file said it and as the workers run it (`transport = "tls"`
    /// peers aimed at their loopback bridge).
    running: Vec<(PeerConfig, PeerSettings)>,
}

/// What a reload of an interface brought up from settings starts from.
pub(crate) struct ReloadBase {
    pub path: Option<PathBuf>,
    pub config: Config,
    /// The peers as the workers run them, one per `config.peers`, in order.
    pub peers: Vec<PeerSettings>,
}

impl Control {
    /// The control of `workers` (`worker_count` of them) whose sockets' marks are `marks`;
    /// with `routes` (a netlink socket and the link), routes follow the peers.
    pub(crate) fn new(
        workers: Workers,
        worker_count: usize,
        marks: SocketMarks,
        routes: Option<(Netlink, u32, ReloadBase)>,
    ) -> ControlHandle {
        let managed = routes.map(|(netlink, link, base)| Managed {
            netlink,
            link,
            addresses: base
                .config
                .interface
                .as_ref()
                .map(|i| i.addresses.clone())
                .unwrap_or_default(),
            running: base.config.peers.iter().cloned().zip(base.peers).collect(),
            path: base.path,
            config: base.config,
        });
        let host_endpoints = managed
            .as_ref()
            .map(|m| host_endpoints(m.running.iter().map(|(c, _)| c)))
            .unwrap_or_default();
        Arc::new(Mutex::new(Control {
            workers,
            worker_count,
            marks,
            managed,
            front_end: FrontEndSlot::default(),
            added: BTreeMap::new(),
            host_endpoints,
        }))
    }

    /// Where the attached front end is kept (the metrics server reads it too).
    pub(crate) fn front_end_slot(&self) -> FrontEndSlot {
        self.front_end.clone()
    }

    /// The interface as `wg show` sees it (keys included), every worker's part merged.
    pub(crate) fn snapshot(&self) -> Option<DeviceSnapshot> {
        let unix_now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        self.workers
            .run_each(move |device, now| device.snapshot(now, unix_now))
            .map(DeviceSnapshot::merge)
    }

    /// Each worker's own view: which of `keys` it holds, and every allowed IP it routes
    /// (the tests compare them: every worker must hold the same peers).
    #[cfg(test)]
    pub(crate) fn per_worker_view(
        &self,
        keys: Vec<PublicKey>,
    ) -> Option<Vec<(Vec<bool>, Vec<IpNet>)>> {
        self.workers.run_each(move |device, _| {
            let held = keys
                .iter()
                .map(|k| device.peer_traffic(k).is_some())
                .collect();
            let mut routes = device.routes();
            routes.sort();
            (held, routes)
        })
    }

    /// Each worker's counters and the sessions it carries.
    pub(crate) fn worker_stats(&self) -> Option<Vec<WorkerStats>> {
        self.workers.run_each(|device, _| WorkerStats {
            stats: device.stats().clone(),
            carries: device.carried(),
        })
    }

    /// Answers a UAPI request (the text `wg` reads).
    pub(crate) fn answer(&mut self, request: Request) -> String {
        match request {
            Request::Get => match self.snapshot() {
                Some(snapshot) => uapi::format_get(&snapshot),
                None => uapi::format_errno(libc::ESHUTDOWN),
            },
            Request::Stats => match self.worker_stats() {
                Some(stats) => uapi::format_stats(&stats),
                None => uapi::format_errno(libc::ESHUTDOWN),
            },
            Request::Fleet => crate::front_end::uapi_reply(&self.front_end)
                .unwrap_or_else(|| uapi::format_errno(libc::ENOENT)),
            Request::Set(set) => match self.set(set) {
                Ok(()) => uapi::format_errno(0),
                Err(e) => {
                    tracing::warn!("uapi: set failed: {e}");
                    uapi::format_errno(e.errno)
                }
            },
        }
    }

    /// Applies one `set` to every worker (each holds every peer, and they decide alike, so
    /// the first worker's outcome is the interface's), then makes the routes and the
    /// sockets' mark follow. A mark that cannot be put on the sockets is refused before
    /// anything changes.
    pub(crate) fn set(&mut self, set: SetRequest) -> Result<(), UapiError> {
        if let Some(mark) = set.fwmark {
            self.marks.check(mark)?;
        }
        self.follow_added(&set);
        if set.replace_peers {
            self.host_endpoints.clear();
        }
        for update in set
            .peers
            .iter()
            .filter(|u| u.remove || u.endpoint.is_some())
        {
            self.host_endpoints.remove(&update.public_key);
        }
        let outcome = self.workers.run_each(move |device, now| {
            let before = device.routes();
            let result = device.apply(set.clone(), now);
            (result, before, device.routes(), device.fwmark())
        });
        let Some((result, before, after, mark)) = outcome.and_then(|o| o.into_iter().next()) else {
            return Err(stopped());
        };
        self.sync_routes(&before, &after);
        // The sockets follow the mark the devices took (a request refused before its mark
        // leaves it as it was).
        self.marks.set(mark)?;
        result
    }

    /// Whether a peer with this key is configured.
    fn has_peer(&self, key: PublicKey) -> Result<bool, Error> {
        self.workers
            .run_on_first(move |device, _| device.peer_traffic(&key).is_some())
            .ok_or(Error::Stopped)
    }

    /// Adds a plain peer (`parallel = 1`), refused if its key is configured already.
    pub(crate) fn add_peer(&mut self, peer: PeerSettings) -> Result<(), Error> {
        if peer.parallel > 1 {
            return Err(Error::invalid(
                "parallel",
                "a peer added to a running gateway is carried by one session (parallel = 1); put it in the settings to split it",
            ));
        }
        if self.has_peer(peer.public_key)? {
            return Err(Error::PeerExists(peer.public_key));
        }
        let mut update = PeerUpdate::new(peer.public_key);
        update.preshared_key = Some(peer.preshared_key.clone());
        update.endpoint = peer.endpoint;
        update.persistent_keepalive = Some(peer.persistent_keepalive);
        update.replace_allowed_ips = true;
        update.allowed_ips = peer.allowed_ips.clone();
        update.shared_ips = Some(peer.shared_ips.clone());
        self.set_peers(vec![update])?;
        self.added.insert(peer.public_key, peer);
        Ok(())
    }

    /// Changes an existing peer as `update` (with `update_only`) says.
    pub(crate) fn update_peer(&mut self, update: PeerUpdate) -> Result<(), Error> {
        if !self.has_peer(update.public_key)? {
            return Err(Error::UnknownPeer(update.public_key));
        }
        self.set_peers(vec![update])
    }

    /// Keeps the settings of the peers the library added as the workers now run them
    /// (whoever changed them), so that a reload keeps them as they are.
    fn follow_added(&mut self, set: &SetRequest) {
        if set.replace_peers {
            self.added.clear();
        }
        for update in &set.peers {
            if update.remove {
                self.added.remove(&update.public_key);
                continue;
            }
            let Some(peer) = self.added.get_mut(&update.public_key) else {
                continue;
            };
            if let Some(psk) = &update.preshared_key {
                peer.preshared_key.clone_from(psk);
            }
            if let Some(endpoint) = update.endpoint {
                peer.endpoint = Some(endpoint);
            }
            if let Some(keepalive) = update.persistent_keepalive {
                peer.persistent_keepalive = keepalive;
            }
            if update.replace_allowed_ips {
                peer.allowed_ips.clear();
            }
            for net in &update.allowed_ips {
                if !peer.allowed_ips.contains(net) {
                    peer.allowed_ips.push(*net);
                }
            }
            if let Some(shared) = &update.shared_ips {
                peer.shared_ips.clone_from(shared);
            }
        }
    }

    /// Removes a peer, its sessions and its routes.
    pub(crate) fn remove_peer(&mut self, key: PublicKey) -> Result<(), Error> {
        if !self.has_peer(key)? {
            return Err(Error::UnknownPeer(key));
        }
        let mut update = PeerUpdate::new(key);
        update.remove = true;
        self.set_peers(vec![update])
    }

    fn set_peers(&mut self, peers: Vec<PeerUpdate>) -> Result<(), Error> {
        self.set(SetRequest {
            peers,
            ..SetRequest::default()
        })
        .map_err(|e| {
            if e.errno == libc::ESHUTDOWN {
                Error::Stopped
            } else {
                Error::Refused {
                    errno: e.errno,
                    message: e.to_string(),
                }
            }
        })
    }

    /// The host name and port `key`'s endpoint follows, if it does (see `host_endpoints`).
    pub(crate) fn host_endpoint(&self, key: &PublicKey) -> Option<HostEndpoint> {
        self.host_endpoints.get(key).cloned()
    }

    /// Whether any peer's endpoint follows a host name.
    pub(crate) fn has_host_endpoints(&self) -> bool {
        !self.host_endpoints.is_empty()
    }

    /// Where `key`'s datagrams go now (a roaming peer's latest address included).
    pub(crate) fn current_endpoint(&self, key: PublicKey) -> Option<SocketAddr> {
        self.workers
            .run_each(move |device, _| device.carried_peer_endpoint(&key))?
            .into_iter()
            .flatten()
            .next()
    }

    /// Sends `key`'s datagrams to `endpoint`, a new answer for its host name, and
    /// handshakes there at once. False when the peer no longer follows a host name (removed,
    /// or its endpoint set by hand meanwhile) or the workers have stopped.
    pub(crate) fn follow_resolved(&mut self, key: PublicKey, endpoint: SocketAddr) -> bool {
        if !self.host_endpoints.contains_key(&key) {
            return false;
        }
        self.move_peer(key, endpoint)
    }

    /// Sends `key`'s datagrams to `endpoint`, its transport's new address (a `transport =
    /// "auto"` peer moved to its TLS bridge), and handshakes there at once. False for an
    /// unknown peer or stopped workers.
    pub(crate) fn move_to_transport(&mut self, key: PublicKey, endpoint: SocketAddr) -> bool {
        self.move_peer(key, endpoint)
    }

    /// Sends `key`'s datagrams to `endpoint` and handshakes there at once: a path to try
    /// (`Gateway::move_peer`). `UnknownPeer` for a key the interface does not have.
    pub(crate) fn try_endpoint(
        &mut self,
        key: PublicKey,
        endpoint: SocketAddr,
    ) -> Result<(), Error> {
        if !self.has_peer(key)? {
            return Err(Error::UnknownPeer(key));
        }
        if self.move_peer(key, endpoint) {
            Ok(())
        } else {
            Err(Error::Stopped)
        }
    }

    /// Sends `key` a handshake initiation at `to`, its endpoint left where it is
    /// (`Device::try_path`): if it answers from there, roaming moves it.
    pub(crate) fn try_path(&mut self, key: PublicKey, to: SocketAddr) -> Result<(), Error> {
        if !self.has_peer(key)? {
            return Err(Error::UnknownPeer(key));
        }
        let sent = self
            .workers
            .run_each(move |device, _| device.try_path(&key, to))
            .is_some_and(|sent| sent.into_iter().any(|s| s));
        if sent {
            Ok(())
        } else {
            Err(Error::Stopped)
        }
    }

    /// Moves `key` to `endpoint` on every worker and in the control plane's own copy of the
    /// peers: a reload starts from that copy, so a peer it adds again (removed by hand, or
    /// its `parallel` changed) comes back where it runs, not where it was first.
    fn move_peer(&mut self, key: PublicKey, endpoint: SocketAddr) -> bool {
        let moved = self
            .workers
            .run_each(move |device, _| device.move_peer(&key, endpoint))
            .is_some_and(|moved| moved.into_iter().any(|m| m));
        if let Some(managed) = &mut self.managed {
            for (_, running) in managed.running.iter_mut() {
                if running.public_key == key {
                    running.endpoint = Some(endpoint);
                }
            }
        }
        if let Some(added) = self.added.get_mut(&key) {
            added.endpoint = Some(endpoint);
        }
        moved
    }

    /// Asks for a handshake with `key` at the workers' next tick (a TLS transport that has
    /// just connected, `wait_ready`). False when the workers have stopped.
    pub(crate) fn request_handshake(&self, key: PublicKey) -> bool {
        self.workers
            .run_each(move |device, _| device.request_handshake(&key))
            .is_some()
    }

    /// The bytes sent to `key` and received from it, summed over the workers (only those
    /// carrying its sessions count any; 0 for an unknown peer); `None` once they stopped.
    pub(crate) fn peer_traffic(&self, key: PublicKey) -> Option<(u64, u64)> {
        let traffic = self
            .workers
            .run_each(move |device, _| device.peer_traffic(&key))?;
        Some(
            traffic
                .into_iter()
                .flatten()
                .fold((0, 0), |(tx, rx), (t, r)| (tx + t, rx + r)),
        )
    }

    /// Makes the kernel's routes through the interface follow the peers' allowed IPs (in
    /// the bare mode, `wg-quick` makes them).
    fn sync_routes(&mut self, before: &[IpNet], after: &[IpNet]) {
        if let Some(managed) = &mut self.managed {
            sync_routes(&mut managed.netlink, managed.link, before, after);
        }
    }

    /// Reads the config file the interface was started from again and applies it.
    pub(crate) fn reload_file(&mut self, label: &str) -> Result<ReloadReport, ReloadError> {
        let Some(path) = self.managed.as_ref().and_then(|m| m.path.clone()) else {
            return Err(ReloadError::NoFile);
        };
        match plan::load(&path, Resolve::Everything) {
            Ok(plan) => self.reload(plan, label),
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

    /// Applies new settings to the running interface: peers gone are removed, new ones
    /// added, changed ones updated in place (their sessions kept), the addresses and the
    /// fwmark follow. What cannot change while running is left as it runs and named in the
    /// report. Everything it does or refuses is logged, each line starting with `label`.
    pub(crate) fn reload(&mut self, plan: Plan, label: &str) -> Result<ReloadReport, ReloadError> {
        let worker_count = self.worker_count;
        let Some(managed) = &mut self.managed else {
            return Err(ReloadError::NoFile);
        };
        let shown = managed.path.as_ref().map_or_else(
            || "the new settings".to_string(),
            |p| p.display().to_string(),
        );
        let Some(wg) = plan.wireguard else {
            tracing::error!(
                "{label}: {shown}: the [interface] section is gone; the running interface stays (stop tunneld to remove it)",
            );
            return Err(ReloadError::Invalid(vec![
                "[interface]: is gone; the running interface stays (stop the gateway to remove it)"
                    .into(),
            ]));
        };
        let not_applied = reload::fixed_changes(&managed.config, &plan.config);
        if !not_applied.is_empty() {
            tracing::warn!(
                "{label}: {} changed; that takes a restart, the rest is applied",
                not_applied.join(", ")
            );
        }
        let wanted = match reload::wanted_peers(
            &managed.running,
            &plan.config,
            wg.peers,
            worker_count,
            label,
        ) {
            Ok(peers) => peers,
            Err(e) => {
                tracing::error!("{label}: {shown}: {e}; the running WireGuard settings stay");
                return Err(ReloadError::Invalid(vec![e]));
            }
        };
        if let Some(interface) = &plan.config.interface {
            managed.sync_addresses(&interface.addresses, label);
        }
        self.sync_fwmark(wg.device.fwmark, label);

        let Some(managed) = &mut self.managed else {
            return Err(ReloadError::NoFile);
        };
        let private_key = wg.device.private_key;
        // The peers the library added stay as they run; a key the file now names is the
        // file's again.
        self.added
            .retain(|key, _| !wanted.iter().any(|(_, s)| s.public_key == *key));
        let added = self.added.values().cloned();
        let previous: Vec<PeerSettings> = managed
            .running
            .iter()
            .map(|(_, s)| s.clone())
            .chain(added.clone())
            .collect();
        let applied: Vec<PeerSettings> =
            wanted.iter().map(|(_, s)| s.clone()).chain(added).collect();
        let outcome = self.workers.run_each(move |device, now: Instant| {
            let before = device.routes();
            let report = device.sync(private_key.clone(), &applied, &previous, now);
            (report, before, device.routes())
        });
        let Some((report, before, after)) = outcome.and_then(|o| o.into_iter().next()) else {
            tracing::error!("{label}: the workers have stopped; nothing applied");
            return Err(ReloadError::Stopped);
        };
        sync_routes(&mut managed.netlink, managed.link, &before, &after);
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
        managed.running = wanted;
        self.host_endpoints = host_endpoints(managed.running.iter().map(|(c, _)| c));
        Ok(ReloadReport {
            peers: report,
            needs_restart: not_applied,
        })
    }

    /// Puts the file's fwmark on the interface when it differs from the one it carries
    /// (which `wg set` may have changed since), as a `set` of the mark alone.
    fn sync_fwmark(&mut self, mark: u32, label: &str) {
        if self.marks.current() == mark {
            return;
        }
        let request = SetRequest {
            fwmark: Some(mark),
            ..SetRequest::default()
        };
        if let Err(e) = self.set(request) {
            tracing::error!("{label}: {e}");
        }
    }
}

impl Managed {
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
}

fn stopped() -> UapiError {
    UapiError {
        errno: libc::ESHUTDOWN,
        message: "the interface's workers have stopped".into(),
    }
}

/// Makes the kernel's routes through the interface follow the peers' allowed IPs.
fn sync_routes(netlink: &mut Netlink, link: u32, before: &[IpNet], after: &[IpNet]) {
    let (before_set, after_set): (HashSet<&IpNet>, HashSet<&IpNet>) =
        (before.iter().collect(), after.iter().collect());
    let added: Vec<IpNet> = after
        .iter()
        .filter(|n| !before_set.contains(n))
        .copied()
        .collect();
    if let Err(e) = netlink.add_routes(link, &added) {
        tracing::warn!("{e}");
    }
    for net in before.iter().filter(|n| !after_set.contains(n)) {
        if let Err(e) = netlink.del_route(link, *net) {
            tracing::warn!("{e}");
        }
    }
}

/// The interface's UDP sockets, for the `fwmark`: the workers own the sockets, so the control
/// side keeps its own descriptors of them (the same sockets) to put a new mark on. `wg-quick`
/// sets a mark on a running interface whose peer takes the default route, so its own
/// datagrams can be routed around the tunnel.
#[derive(Debug)]
pub(crate) struct SocketMarks {
    sockets: Vec<std::os::fd::OwnedFd>,
    current: u32,
    /// `backend = "xdp"`: its next-hop lookups ask for routes with the mark too.
    nexthops: Option<Arc<tunneld_dataplane::xdp::nexthop::NextHops>>,
}

impl SocketMarks {
    /// Descriptors of `sockets`, which carry `current`.
    pub(crate) fn new(
        sockets: &[tunneld_dataplane::udp::UdpSocket],
        current: u32,
    ) -> io::Result<SocketMarks> {
        use tunneld_dataplane::DatagramIo;
        let sockets = sockets
            .iter()
            .filter_map(|s| s.fd())
            .map(|fd| {
                // SAFETY: the socket is open for the duration of this call (borrowed above).
                unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()
            })
            .collect::<io::Result<_>>()?;
        Ok(SocketMarks {
            sockets,
            current,
            nexthops: None,
        })
    }

    /// The AF_XDP path's next hops follow the mark too.
    pub(crate) fn with_nexthops(
        mut self,
        nexthops: Arc<tunneld_dataplane::xdp::nexthop::NextHops>,
    ) -> SocketMarks {
        self.nexthops = Some(nexthops);
        self
    }

    /// The mark the sockets carry.
    fn current(&self) -> u32 {
        self.current
    }

    /// Whether `mark` can be put on the sockets: setting the current one again asks the
    /// kernel the same question (`CAP_NET_ADMIN`) and changes nothing.
    fn check(&self, mark: u32) -> Result<(), UapiError> {
        match self.sockets.first() {
            Some(fd) if mark != self.current => set_mark(fd, self.current),
            _ => Ok(()),
        }
    }

    /// Puts `mark` on every socket.
    fn set(&mut self, mark: u32) -> Result<(), UapiError> {
        if mark == self.current {
            return Ok(());
        }
        for fd in &self.sockets {
            set_mark(fd, mark)?;
        }
        if let Some(nexthops) = &self.nexthops {
            nexthops.set_mark(mark);
        }
        tracing::info!(fwmark = mark, "the interface's sockets carry a new mark");
        self.current = mark;
        Ok(())
    }
}

fn set_mark(fd: &std::os::fd::OwnedFd, mark: u32) -> Result<(), UapiError> {
    use std::os::fd::AsRawFd;
    let value = mark as libc::c_int;
    // SAFETY: SO_MARK reads an int of the size passed from a live value.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MARK,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return Err(UapiError {
            errno: e.raw_os_error().unwrap_or(libc::EPERM),
            message: format!("fwmark: cannot put mark {mark} on the interface's sockets: {e}"),
        });
    }
    Ok(())
}
