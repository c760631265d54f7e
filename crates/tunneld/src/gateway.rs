//! The embeddable gateway: settings in, a running interface out, and a handle to change it,
//! read it and shut it down. `tunneld up` is this and a signal loop.

use crate::bring_up::{self, RunningWireGuard, StartOptions};
use crate::control::{lock, ControlHandle};
use crate::error::Error;
use crate::events::{GatewayEvents, Monitor};
use crate::plan::{self, Plan, Resolve};
use crate::reload::{ReloadError, ReloadReport};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tunneld_config::Config;
use tunneld_crypto::PublicKey;
use tunneld_wireguard::event::Event;
use tunneld_wireguard::uapi::{DeviceSnapshot, PeerSnapshot, PeerUpdate, WorkerStats};
use tunneld_wireguard::{PeerChange, PeerSettings};

/// A gateway's settings, validated, with their key files read, endpoints resolved and the
/// dataplane decided (everything a start would refuse is refused here): from a config file
/// ([`Settings::from_file`]) or its text ([`Settings::from_toml`]).
///
/// ```no_run
/// let settings = tunneld::Settings::from_file("site-a.toml")?;
/// let gateway = tunneld::Gateway::builder(settings).start()?;
/// # drop(gateway);
/// # Ok::<(), tunneld::Error>(())
/// ```
#[derive(Debug)]
pub struct Settings {
    plan: Plan,
    /// The file they came from, which [`Gateway::reload_file`] reads again.
    file: Option<PathBuf>,
}

impl Settings {
    /// Reads, validates and resolves a config file (the format is in README.md). Relative
    /// key and certificate files are taken from the file's directory. Every problem is in
    /// the error, each naming its field.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Settings, Error> {
        let path = path.as_ref();
        let plan = plan::load(path, Resolve::Everything).map_err(Error::invalid_lines)?;
        Ok(Settings {
            plan: not_a_proxy(plan)?,
            file: Some(path.to_path_buf()),
        })
    }

    /// Validates a config file as [`Settings::from_file`] does — the same checks, including
    /// the dataplane's (workers, sub-tunnels, AF_XDP's limits, io_uring and the AEAD on this
    /// machine) — reading its key files but resolving no host names: what `tunneld check`
    /// runs. What only a start can find out (it needs the network or privileges) is
    /// [`Settings::NOT_CHECKED`].
    pub fn check_file(path: impl AsRef<Path>) -> Result<(), Error> {
        plan::load(path.as_ref(), Resolve::CheckOnly)
            .map(drop)
            .map_err(Error::invalid_lines)
    }

    /// What [`Settings::check_file`] cannot check, since it needs the network or privileges,
    /// as a sentence: a start may still refuse these.
    pub const NOT_CHECKED: &'static str = plan::NOT_CHECKED;

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
        let plan = plan::load_text(text, base_dir.as_ref(), Resolve::Everything)
            .map_err(Error::invalid_lines)?;
        Ok(Settings {
            plan: not_a_proxy(plan)?,
            file: None,
        })
    }

    /// A builder of settings from typed values: the interface `name` and its
    /// `private_key`, the rest defaulted (see [`SettingsBuilder`]).
    pub fn builder(
        name: impl Into<String>,
        private_key: tunneld_crypto::PrivateKey,
    ) -> SettingsBuilder {
        SettingsBuilder {
            name: name.into(),
            private_key,
            listen_port: 0,
            addresses: Vec::new(),
            mtu: None,
            fwmark: 0,
            peers: Vec::new(),
            backend: None,
            workers: None,
        }
    }

    /// The interface's private key, if the settings have an `[interface]`: for a front end
    /// that authenticates with it (the fleet's liveness probes between a site's gateways).
    pub fn private_key(&self) -> Option<&tunneld_crypto::PrivateKey> {
        self.plan.wireguard.as_ref().map(|w| &w.device.private_key)
    }

    /// The WireGuard interface's name, if the settings have an `[interface]`.
    pub fn interface_name(&self) -> Option<&str> {
        self.plan.config.interface.as_ref().map(|i| i.name.as_str())
    }

    /// The validated config these settings were made from.
    pub fn config(&self) -> &Config {
        &self.plan.config
    }
}

/// A gateway runs no `[proxy]`: that config is `tunneld proxy`'s (`tunneld::proxy`).
fn not_a_proxy(plan: Plan) -> Result<Plan, Error> {
    if plan.config.proxy.is_some() {
        return Err(Error::invalid_lines(vec![
            "[proxy]: this is a proxy config; run `tunneld proxy FILE`".to_string(),
        ]));
    }
    Ok(plan)
}

/// Builds [`Settings`] from typed values, for a program that has its keys and peers as
/// values rather than a file: made by [`Settings::builder`]. [`SettingsBuilder::build`]
/// checks them exactly as a config file is checked (the same rules, and errors naming the
/// same fields: `interface.mtu`, `peer[0].allowed_ips[0]`).
///
/// Defaults, as in a config file: `listen_port` 0 (any free port), no address, MTU 1420,
/// no fwmark, no peers, `[dataplane]`'s defaults (`backend = "auto"`, a worker per CPU).
///
/// ```
/// use tunneld::{PeerSettings, PrivateKey, Settings};
/// let peer = PrivateKey::generate().public_key();
/// let settings = Settings::builder("wg-doc", PrivateKey::generate())
///     .listen_port(51820)
///     .address("10.77.0.1/24".parse().unwrap())
///     .peer(PeerSettings::new(peer)
///         .endpoint("192.0.2.2:51820".parse().unwrap())
///         .allowed_ip("10.77.0.2/32".parse().unwrap())
///         .persistent_keepalive(25))
///     .build()?;
/// assert_eq!(settings.interface_name(), Some("wg-doc"));
///
/// let err = Settings::builder("wg-doc", PrivateKey::generate()).mtu(1).build().unwrap_err();
/// assert_eq!(err.problems().unwrap()[0].field, "interface.mtu");
/// # Ok::<(), tunneld::Error>(())
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until `build`"]
pub struct SettingsBuilder {
    name: String,
    private_key: tunneld_crypto::PrivateKey,
    listen_port: u16,
    addresses: Vec<ipnet::IpNet>,
    mtu: Option<u16>,
    fwmark: u32,
    peers: Vec<PeerSettings>,
    backend: Option<tunneld_config::Backend>,
    workers: Option<usize>,
}

impl SettingsBuilder {
    /// The UDP port to listen on (0: any free port, the default).
    pub fn listen_port(mut self, port: u16) -> Self {
        self.listen_port = port;
        self
    }

    /// Adds an address of the interface, with its prefix (`10.77.0.1/24`).
    pub fn address(mut self, address: ipnet::IpNet) -> Self {
        self.addresses.push(address);
        self
    }

    /// The interface's MTU (default 1420).
    pub fn mtu(mut self, mtu: u16) -> Self {
        self.mtu = Some(mtu);
        self
    }

    /// The mark put on the interface's own datagrams (default 0: none).
    pub fn fwmark(mut self, mark: u32) -> Self {
        self.fwmark = mark;
        self
    }

    /// Adds a peer.
    pub fn peer(mut self, peer: PeerSettings) -> Self {
        self.peers.push(peer);
        self
    }

    /// The dataplane's I/O backend (default `Auto`).
    pub fn backend(mut self, backend: tunneld_config::Backend) -> Self {
        self.backend = Some(backend);
        self
    }

    /// How many workers (default: one per CPU, one for a lone plain peer).
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = Some(workers);
        self
    }

    /// Checks the settings as a config file's are checked (every problem, each naming its
    /// field) and resolves them as [`Settings::from_toml`] does.
    pub fn build(self) -> Result<Settings, Error> {
        use toml::{Table, Value};
        let strings =
            |items: Vec<String>| Value::Array(items.into_iter().map(Value::String).collect());
        let mut interface = Table::new();
        interface.insert("name".into(), Value::String(self.name));
        interface.insert(
            "private_key".into(),
            Value::String(self.private_key.to_base64().to_string()),
        );
        interface.insert(
            "listen_port".into(),
            Value::Integer(self.listen_port.into()),
        );
        if !self.addresses.is_empty() {
            interface.insert(
                "address".into(),
                strings(self.addresses.iter().map(ToString::to_string).collect()),
            );
        }
        if let Some(mtu) = self.mtu {
            interface.insert("mtu".into(), Value::Integer(mtu.into()));
        }
        if self.fwmark != 0 {
            interface.insert("fwmark".into(), Value::Integer(self.fwmark.into()));
        }
        let mut root = Table::new();
        root.insert("interface".into(), Value::Table(interface));
        let mut dataplane = Table::new();
        if let Some(backend) = self.backend {
            dataplane.insert("backend".into(), Value::String(backend.name().into()));
        }
        if let Some(workers) = self.workers {
            dataplane.insert(
                "workers".into(),
                Value::Integer(i64::try_from(workers).unwrap_or(i64::MAX)),
            );
        }
        if !dataplane.is_empty() {
            root.insert("dataplane".into(), Value::Table(dataplane));
        }
        let peers: Vec<Value> = self
            .peers
            .iter()
            .map(|p| {
                let mut t = Table::new();
                t.insert("public_key".into(), Value::String(p.public_key.to_base64()));
                if let Some(psk) = &p.preshared_key {
                    t.insert(
                        "preshared_key".into(),
                        Value::String(psk.to_base64().to_string()),
                    );
                }
                if let Some(endpoint) = p.endpoint {
                    t.insert("endpoint".into(), Value::String(endpoint.to_string()));
                }
                t.insert(
                    "allowed_ips".into(),
                    strings(p.allowed_ips.iter().map(ToString::to_string).collect()),
                );
                t.insert(
                    "persistent_keepalive".into(),
                    Value::Integer(p.persistent_keepalive.into()),
                );
                t.insert("parallel".into(), Value::Integer(p.parallel.into()));
                Value::Table(t)
            })
            .collect();
        if !peers.is_empty() {
            root.insert("peer".into(), Value::Array(peers));
        }
        // The same checks as a file's, on the text a file would have. It holds keys: it
        // and the table's copies are wiped when done.
        let encoded = toml::to_string(&root)
            .map_err(|e| Error::invalid("interface", format!("cannot encode the settings: {e}")));
        let mut root = toml::Value::Table(root);
        wipe_keys(&mut root);
        let text = zeroize::Zeroizing::new(encoded?);
        Settings::from_toml(&text, ".")
    }
}

/// Overwrites the key strings of a settings table.
fn wipe_keys(value: &mut toml::Value) {
    match value {
        toml::Value::Table(table) => {
            for (name, v) in table.iter_mut() {
                if name == "private_key" || name == "preshared_key" {
                    if let toml::Value::String(key) = v {
                        zeroize::Zeroize::zeroize(key);
                    }
                } else {
                    wipe_keys(v);
                }
            }
        }
        toml::Value::Array(items) => items.iter_mut().for_each(wipe_keys),
        _ => {}
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
/// runs until [`Gateway::shutdown`] (or until the last handle is dropped). Linux only.
///
/// Every method blocks the calling thread (see the crate's "Platform and blocking"): the
/// accessors of fixed facts (`interface_name`, `listen_port`, `public_key`) return at once;
/// the rest wait for the workers, each between two of its batches.
///
/// ```no_run
/// use tunneld::{Gateway, PeerSettings, PrivateKey, Settings};
///
/// let gateway = Gateway::builder(Settings::from_file("site-a.toml")?).start()?;
/// gateway.add_peer(
///     PeerSettings::new(PrivateKey::generate().public_key())
///         .endpoint("192.0.2.7:51820".parse().unwrap())
///         .allowed_ip("10.77.0.7/32".parse().unwrap())
///         .persistent_keepalive(25),
/// )?;
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
    /// Events and readiness, started by the first subscriber (`events.rs`).
    monitor: Mutex<Option<Arc<Monitor>>>,
    /// Whether the thread that looks host-name endpoints up again runs (`reresolve.rs`),
    /// started with the first such peer.
    reresolving: Mutex<bool>,
    /// What may move the TLS listeners' WireGuard streams (`set_tls_redirect`).
    tls_redirect: Option<Arc<tunneld_tls::RedirectSlot>>,
}

/// A WireGuard-over-TLS bridge opened at run time ([`Gateway::open_tls_bridge`]).
pub type TlsBridge = tunneld_tls::Bridge;
/// What moves a WireGuard-over-TLS stream to another local port ([`Gateway::set_tls_redirect`]).
pub type TlsRedirect = tunneld_tls::Redirect;

/// The WireGuard side of a running gateway, fixed for its life.
struct Interface {
    name: String,
    listen_port: u16,
    public_key: PublicKey,
    /// The one lock every writer takes (shared with the UAPI socket).
    control: ControlHandle,
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
        let mut snapshot = lock(&self.interface()?.control)
            .snapshot()
            .ok_or(Error::Stopped)?;
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
        lock(&self.interface()?.control)
            .worker_stats()
            .ok_or(Error::Stopped)
    }

    /// Adds a peer, with a route for each of its allowed IPs. A peer added this way is a
    /// plain one (`parallel` must be 1: sub-tunnels are set up at start). It is the
    /// program's, not the file's: a reload of the file leaves it (as `update_peer` last
    /// left it), unless the file names the same key, which makes it the file's.
    pub fn add_peer(&self, peer: PeerSettings) -> Result<(), Error> {
        lock(&self.interface()?.control).add_peer(peer)
    }

    /// Changes what `change` names of an existing peer; its session is kept (a new preshared
    /// key starts a new one).
    pub fn update_peer(&self, change: PeerChange) -> Result<(), Error> {
        lock(&self.interface()?.control).update_peer(PeerUpdate::from(change))
    }

    /// Sends `peer`'s datagrams to `endpoint` from now on, and a handshake initiation there
    /// at once even if one to its old address is under way: for trying the paths to a peer
    /// behind NAT (the fleet does). The peer's settings and session stay; roaming moves it
    /// again, as it moves any endpoint, when the peer's packets come from elsewhere.
    pub fn move_peer(&self, peer: &PublicKey, endpoint: std::net::SocketAddr) -> Result<(), Error> {
        lock(&self.interface()?.control).try_endpoint(*peer, endpoint)
    }

    /// Sends one datagram from the gateway's WireGuard socket (not through the tunnel): a NAT
    /// maps it as it maps the WireGuard datagrams, which is what a relay's registration
    /// needs (the fleet sends those). Nothing answers it here: what comes back to the
    /// socket is read as WireGuard.
    pub fn send_datagram(&self, to: std::net::SocketAddr, datagram: Vec<u8>) -> Result<(), Error> {
        self.interface()?;
        if self.workers()?.send_datagram(to, datagram) {
            Ok(())
        } else {
            Err(Error::Stopped)
        }
    }

    /// Carries the peer of `key`'s datagrams over a TLS stream to the `[[tls.listen]]` at
    /// `remote` (certificate for `server_name`, leading to the CA in `ca_file`) from now on:
    /// a loopback bridge whose address the caller makes the peer's endpoint
    /// ([`Gateway::move_peer`]); WireGuard over TLS as a `transport = "tls"` peer has it, set
    /// up at run time (the fleet does, for a site that can send only TCP). Dropping the
    /// bridge ends its stream.
    pub fn open_tls_bridge(
        &self,
        key: PublicKey,
        remote: std::net::SocketAddr,
        server_name: &str,
        ca_file: &std::path::Path,
    ) -> Result<TlsBridge, Error> {
        let control = self.interface()?.control.clone();
        let peers = Arc::new(crate::tls_peers::TlsPeers(Arc::new(OnceLock::from(
            control,
        ))));
        tunneld_tls::open_bridge(
            format!("peer {}", key.to_base64()),
            remote,
            server_name,
            ca_file,
            key,
            peers,
        )
        .map_err(|e| Error::System(format!("WireGuard over TLS to {remote}: {e:#}")))
    }

    /// Lets `redirect` move a WireGuard-over-TLS stream accepted by this gateway's
    /// `[[tls.listen]]` (`forward_to = "wireguard"`) to another UDP port on loopback: a fleet
    /// relay's port for a pair, on a side's registration. `None` takes it back. Without a
    /// listener, nothing to do.
    pub fn set_tls_redirect(&self, redirect: Option<TlsRedirect>) {
        if let Some(slot) = &self.inner.tls_redirect {
            slot.set(redirect);
        }
    }

    /// Sends the peer a handshake initiation at `to` without moving it: a path to try
    /// beside the one in use (the fleet tries a relayed peer's direct address so). If the
    /// peer answers from `to`, its authenticated answer moves it there, as roaming moves any
    /// peer; if not, nothing changed.
    pub fn try_path(&self, peer: &PublicKey, to: std::net::SocketAddr) -> Result<(), Error> {
        lock(&self.interface()?.control).try_path(*peer, to)
    }

    /// Removes a peer, its sessions and its routes.
    pub fn remove_peer(&self, public_key: &PublicKey) -> Result<(), Error> {
        lock(&self.interface()?.control).remove_peer(*public_key)
    }

    /// Applies new settings to the running gateway as a reload does (`SIGHUP`): peers gone
    /// are removed, new ones added, changed ones updated in place (their sessions kept), the
    /// interface's addresses follow. What cannot change while running (the interface's name,
    /// port, MTU, `[dataplane]`, …) is left as it runs and named in the report.
    pub fn reload(&self, settings: Settings) -> Result<ReloadReport, Error> {
        let report = lock(&self.interface()?.control)
            .reload(settings.plan, "reload")
            .map_err(reload_error)?;
        self.follow_host_names();
        Ok(report)
    }

    /// Reads the config file the gateway was started from again and applies it, as
    /// [`Gateway::reload`] does; TLS certificates and keys are read again too (new
    /// connections use them). `label` starts each log line (`tunneld up` passes "SIGHUP").
    pub fn reload_file(&self, label: &str) -> Result<ReloadReport, Error> {
        self.reload_tls_certificates(label);
        let report = lock(&self.interface()?.control)
            .reload_file(label)
            .map_err(reload_error)?;
        self.follow_host_names();
        Ok(report)
    }

    /// Starts looking host-name endpoints up again (`reresolve.rs`) once a peer has one.
    /// A gateway that cannot start the thread runs on, with the endpoints as first
    /// resolved, and says so.
    fn follow_host_names(&self) {
        let Ok(interface) = self.interface() else {
            return;
        };
        let mut reresolving = lock(&self.inner.reresolving);
        if *reresolving || !lock(&interface.control).has_host_endpoints() {
            return;
        }
        let started = self.events().and_then(|events| {
            crate::reresolve::start(interface.control.clone(), events).map_err(|e| Error::Io {
                message: format!("starting the thread that resolves host names again: {e}"),
                source: e,
            })
        });
        match started {
            Ok(()) => *reresolving = true,
            Err(e) => {
                tracing::error!("{e}; host-name endpoints keep the address they first resolved to")
            }
        }
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

    /// Attaches what drives this gateway from outside (the fleet): its state is shown by
    /// `tunneld show` (the UAPI socket's `fleet=1`) and in `GET /metrics` from then on,
    /// until [`Gateway::detach_front_end`]. One at a time: a second replaces the first.
    pub fn attach_front_end(&self, front_end: Arc<dyn crate::FrontEnd>) -> Result<(), Error> {
        let slot = lock(&self.interface()?.control).front_end_slot();
        *lock(&slot) = Some(front_end);
        Ok(())
    }

    /// Detaches the front end, if one is attached.
    pub fn detach_front_end(&self) -> Result<(), Error> {
        let slot = lock(&self.interface()?.control).front_end_slot();
        lock(&slot).take();
        Ok(())
    }

    /// The gateway's events from now on: handshakes completed or unanswered, endpoints
    /// changed (set, or learnt from a roaming peer), peers added and removed, and finally
    /// [`Event::Stopped`] (a shutdown, or a worker that failed). Each call is a subscriber
    /// of its own that sees every event, at most 250 ms after it happened (the workers'
    /// timer tick: a thread reads the peers' state between batches, as
    /// [`Gateway::peers`] does, once anything subscribed).
    ///
    /// Does not block (the first call waits for the first look at the peers).
    ///
    /// ```no_run
    /// # fn run(gateway: tunneld::Gateway) -> Result<(), tunneld::Error> {
    /// let events = gateway.events()?;
    /// std::thread::spawn(move || {
    ///     for event in events {
    ///         println!("{event:?}");
    ///     }
    /// });
    /// # Ok(()) }
    /// ```
    pub fn events(&self) -> Result<GatewayEvents, Error> {
        Ok(self.monitor()?.subscribe())
    }

    /// Blocks until a handshake with `peer` has completed since it was added (at once if
    /// one has, or within 250 ms of it), asking for one now if it has none, for at most
    /// `timeout`. Once this returns `Ok`, traffic to the peer flows.
    ///
    /// Errors: [`Error::UnknownPeer`] (also when it is removed meanwhile),
    /// [`Error::TimedOut`], [`Error::Stopped`], [`Error::NoInterface`].
    ///
    /// ```no_run
    /// # fn run(gateway: tunneld::Gateway, peer: tunneld::PublicKey) -> Result<(), tunneld::Error> {
    /// gateway.wait_ready(&peer, std::time::Duration::from_secs(10))?;
    /// # Ok(()) }
    /// ```
    pub fn wait_ready(&self, peer: &PublicKey, timeout: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        let Some(events) = self.monitor()?.wait_for(peer)? else {
            return Ok(());
        };
        let key = *peer;
        if !lock(&self.interface()?.control).request_handshake(key) {
            return Err(Error::Stopped);
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match events.recv_timeout(left) {
                Ok(Some(Event::HandshakeCompleted { peer: p, .. })) if p == key => return Ok(()),
                Ok(Some(Event::PeerRemoved { peer: p })) if p == key => {
                    return Err(Error::UnknownPeer(key))
                }
                Ok(Some(_)) => {}
                Ok(None) => return Err(Error::Stopped),
                Err(()) => {
                    return Err(Error::TimedOut(format!(
                        "no handshake with {key} in {timeout:?}"
                    )))
                }
            }
        }
    }

    fn workers(&self) -> Result<tunneld_dataplane::worker::Workers, Error> {
        lock(&self.inner.running)
            .as_ref()
            .and_then(|r| r.wireguard.as_ref())
            .map(|wg| wg.workers.clone())
            .ok_or(Error::Stopped)
    }

    fn monitor(&self) -> Result<Arc<Monitor>, Error> {
        self.interface()?;
        let mut slot = lock(&self.inner.monitor);
        if let Some(monitor) = slot.as_ref() {
            return Ok(monitor.clone());
        }
        let monitor = Arc::new(Monitor::start(self.workers()?).map_err(|e| Error::Io {
            message: format!("starting the gateway's events thread: {e}"),
            source: e,
        })?);
        *slot = Some(monitor.clone());
        Ok(monitor)
    }

    /// How far each WireGuard worker has got: a count that rises every 250 ms while the
    /// worker runs, busy or idle, and stops when it is stuck (what `tunneld up` feeds
    /// systemd's watchdog from). `None` without a WireGuard interface.
    pub fn worker_progress(&self) -> Option<Vec<u64>> {
        let running = lock(&self.inner.running);
        running
            .as_ref()
            .and_then(|r| r.wireguard.as_ref())
            .map(|wg| wg.workers.progress())
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
    if !wg.stop() {
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
    let Settings { plan, file } = settings;
    let wg_port = Arc::new(OnceLock::new());
    // Sockets are bound while tunneld still has its privileges; threads start only once
    // they are dropped, since a thread keeps the capabilities of the one that started it.
    let mut tls = if plan.config.tls.is_empty() {
        None
    } else {
        Some(
            tunneld_tls::TlsService::bind(
                &plan.config.tls,
                &plan.base,
                wg_port.clone(),
                crate::topology::allowed_cpus().len(),
            )
            .map_err(Error::system)?,
        )
    };
    let tls_redirect = tls.as_ref().map(tunneld_tls::TlsService::redirect_slot);
    let metrics = match &plan.config.metrics {
        Some(m) => Some(crate::metrics::MetricsServer::bind(m.listen).map_err(Error::system)?),
        None => None,
    };
    let (wireguard, interface, starters) = match plan.wireguard {
        Some(mut wg) => {
            // Peers with transport = "tls" are reached through a loopback bridge each.
            let control = Arc::new(OnceLock::new());
            let tls_peers = Arc::new(crate::tls_peers::TlsPeers(control.clone()));
            let (bridges, starters) =
                tunneld_tls::prepare_peer_transports(&plan.config, &plan.base, tls_peers)
                    .map_err(Error::system)?;
            for (i, bridge) in bridges {
                if let Some(peer) = wg.peers.get_mut(i) {
                    peer.endpoint = Some(bridge);
                }
            }
            let options = StartOptions {
                uapi,
                drop_privileges,
            };
            let running = bring_up::start_wireguard(wg, options, file.clone(), plan.config.clone())
                .map_err(Error::system)?;
            let _ = wg_port.set(running.port);
            let _ = control.set(running.control.clone());
            let interface = Interface {
                name: running.name.clone(),
                listen_port: running.port,
                public_key: running.public_key,
                control: running.control.clone(),
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
            let wg = running
                .wireguard
                .as_ref()
                .map(|wg| (wg.name.clone(), wg.workers.clone()));
            let front_end = running
                .wireguard
                .as_ref()
                .map(|wg| lock(&wg.control).front_end_slot());
            running._metrics =
                Some(metrics.serve(wg, tls.as_ref().map(|t| t.stats()), front_end)?);
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
    let gateway = Gateway {
        inner: Arc::new(Inner {
            interface,
            running: Mutex::new(Some(running)),
            monitor: Mutex::new(None),
            reresolving: Mutex::new(false),
            tls_redirect,
        }),
    };
    gateway.follow_host_names();
    Ok(gateway)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::io::{Read, Write};
    use tunneld_crypto::PrivateKey;
    use tunneld_testnet::{require_netns, unique_name, NetNs};

    /// What an operation leaves a peer with: its one allowed IP, or nothing (removed).
    type Effect = Option<ipnet::IpNet>;

    /// A small deterministic generator, so a failure replays.
    struct Draw(u64);
    impl Draw {
        fn next(&mut self, below: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % below
        }
    }

    fn uapi_set(stream: &mut std::os::unix::net::UnixStream, text: &str) {
        stream.write_all(text.as_bytes()).unwrap();
        let mut reply = Vec::new();
        let mut byte = [0u8; 1];
        while !reply.ends_with(b"\n\n") {
            assert_eq!(stream.read(&mut byte).unwrap(), 1, "the UAPI socket closed");
            reply.push(byte[0]);
        }
        assert_eq!(String::from_utf8_lossy(&reply), "errno=0\n\n", "{text}");
    }

    /// The UAPI socket (`wg set`) and the library's peer operations, from two threads at
    /// once on the same peers: afterwards every worker holds the same peers, each peer is as
    /// the last operation on it left it (the last of one thread or the other: a serial
    /// order), and the kernel's routes are exactly the peers' allowed IPs.
    #[test]
    fn concurrent_writers_end_as_a_serial_order_would() {
        if !require_netns("concurrent_writers_end_as_a_serial_order_would") {
            return;
        }
        let ns = NetNs::new();
        let name = unique_name("wg");
        let text = format!(
            "[interface]\nname = \"{name}\"\nprivate_key = \"{}\"\nlisten_port = 0\n\
             address = [\"10.9.255.1/32\"]\n[dataplane]\nworkers = 2\n",
            *PrivateKey::generate().to_base64()
        );
        let gateway = ns
            .in_ns(move || Gateway::builder(Settings::from_toml(&text, ".")?).start())
            .unwrap();
        const KEYS: u8 = 12;
        const OPS: usize = 300;
        let keys: Vec<PublicKey> = (0..KEYS)
            .map(|_| PrivateKey::generate().public_key())
            .collect();
        let effect_of = |draw: &mut Draw, k: usize| -> Effect {
            (draw.next(4) != 0).then(|| format!("10.9.{k}.{}/32", draw.next(250)).parse().unwrap())
        };

        // Each thread returns the effect of its last operation on each key.
        let socket = format!("{}/{name}.sock", crate::uapi_server::SOCKET_DIR);
        let uapi_keys = keys.clone();
        let uapi = std::thread::spawn(move || {
            let mut stream = std::os::unix::net::UnixStream::connect(socket).unwrap();
            let mut draw = Draw(0x9e37_79b9_7f4a_7c15);
            let mut last: HashMap<usize, Effect> = HashMap::new();
            for _ in 0..OPS {
                let k = draw.next(u64::from(KEYS)) as usize;
                let effect = effect_of(&mut draw, k);
                let key = uapi_keys[k].to_hex();
                match effect {
                    Some(ip) => uapi_set(
                        &mut stream,
                        &format!("set=1\npublic_key={key}\nreplace_allowed_ips=true\nallowed_ip={ip}\n\n"),
                    ),
                    None => uapi_set(&mut stream, &format!("set=1\npublic_key={key}\nremove=true\n\n")),
                }
                last.insert(k, effect);
            }
            last
        });
        let library = {
            let gateway = gateway.clone();
            let keys = keys.clone();
            std::thread::spawn(move || {
                let mut draw = Draw(0x2545_f491_4f6c_dd1d);
                let mut last: HashMap<usize, Effect> = HashMap::new();
                for _ in 0..OPS {
                    let k = draw.next(u64::from(KEYS)) as usize;
                    let effect = effect_of(&mut draw, k);
                    match effect {
                        // Add, or change if it exists: the other thread may add or remove it
                        // between the two, so try until one of them takes.
                        Some(ip) => loop {
                            let added = gateway.add_peer(PeerSettings::new(keys[k]).allowed_ip(ip));
                            match added {
                                Ok(()) => break,
                                Err(Error::PeerExists(_)) => {}
                                Err(e) => panic!("add_peer: {e}"),
                            }
                            let mut change = PeerChange::new(keys[k]);
                            change.allowed_ips = Some(vec![ip]);
                            match gateway.update_peer(change) {
                                Ok(()) => break,
                                Err(Error::UnknownPeer(_)) => {}
                                Err(e) => panic!("update_peer: {e}"),
                            }
                        },
                        None => match gateway.remove_peer(&keys[k]) {
                            Ok(()) | Err(Error::UnknownPeer(_)) => {}
                            Err(e) => panic!("remove_peer: {e}"),
                        },
                    }
                    last.insert(k, effect);
                }
                last
            })
        };
        let (by_uapi, by_library) = (uapi.join().unwrap(), library.join().unwrap());

        let interface = gateway.inner.interface.as_ref().unwrap();
        let workers = lock(&interface.control)
            .per_worker_view(keys.clone())
            .unwrap();
        assert_eq!(workers.len(), 2);
        assert_eq!(workers[0], workers[1], "the workers hold different peers");
        let held: HashMap<PublicKey, Vec<ipnet::IpNet>> = gateway
            .peers()
            .unwrap()
            .into_iter()
            .map(|p| (p.public_key, p.allowed_ips))
            .collect();
        let (present, mut routed) = workers[0].clone();
        for (k, key) in keys.iter().enumerate() {
            assert_eq!(present[k], held.contains_key(key), "peer {k}");
        }
        let mut allowed: Vec<ipnet::IpNet> = held.values().flatten().copied().collect();
        allowed.sort();
        routed.sort();
        assert_eq!(
            routed, allowed,
            "the workers route other IPs than their peers allow"
        );
        for (k, key) in keys.iter().enumerate() {
            let now: Effect = held.get(key).map(|ips| {
                assert_eq!(ips.len(), 1, "peer {k}: {ips:?}");
                ips[0]
            });
            // A key no thread touched stays absent; else it is as one thread's last
            // operation on it left it.
            let candidates: Vec<Effect> = [by_uapi.get(&k), by_library.get(&k)]
                .into_iter()
                .flatten()
                .copied()
                .collect();
            if candidates.is_empty() {
                assert_eq!(now, None, "peer {k} was never added");
            } else {
                assert!(
                    candidates.contains(&now),
                    "peer {k} is {now:?}, which neither thread's last operation ({candidates:?}) left"
                );
            }
        }
        let mut routes: Vec<String> = ns
            .run(&["ip", "-4", "route", "show", "dev", &name, "proto", "static"])
            .lines()
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect();
        routes.sort();
        let mut wanted: Vec<String> = held
            .values()
            .flatten()
            .map(|ip| ip.to_string().trim_end_matches("/32").to_string())
            .collect();
        wanted.sort();
        assert_eq!(
            routes, wanted,
            "the kernel's routes are not the peers' allowed IPs"
        );
        gateway.shutdown().unwrap();
    }

    /// The TLS transport's fallback (a `transport = "auto"` peer whose UDP went unanswered)
    /// moves the peer to its bridge through the same door as every other writer: `peers()`
    /// shows the bridge, an `EndpointChanged` says so, and the control plane's own copy
    /// follows, so a reload that adds the peer again (here after `wg set` removed it) puts
    /// it back on the bridge rather than on the blocked UDP address it left, where no
    /// watcher would move it again.
    #[test]
    fn a_tls_fallback_is_what_show_events_and_reloads_see() {
        if !require_netns("a_tls_fallback_is_what_show_events_and_reloads_see") {
            return;
        }
        let ns = NetNs::new();
        let dir = tempfile::tempdir().unwrap();
        let ca = rcgen::generate_simple_self_signed(vec!["peer.test".into()]).unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.cert.pem()).unwrap();
        let name = unique_name("wg");
        let peer = PrivateKey::generate().public_key();
        // No route to 192.0.2.2 and no traffic: UDP stays silent, so the real watcher
        // never falls back on its own; the test makes the move it would make.
        let file = dir.path().join("gateway.toml");
        std::fs::write(
            &file,
            format!(
                "[interface]\nname = \"{name}\"\nprivate_key = \"{}\"\nlisten_port = 0\n\
                 address = [\"10.9.255.1/32\"]\n\n\
                 [[peer]]\npublic_key = \"{}\"\nallowed_ips = [\"10.9.0.2/32\"]\n\
                 transport = \"auto\"\nendpoint = \"192.0.2.2:51820\"\n\
                 tls_endpoint = \"192.0.2.2:8443\"\ntls_server_name = \"peer.test\"\n\
                 tls_ca_file = \"ca.pem\"\n",
                *PrivateKey::generate().to_base64(),
                peer.to_base64()
            ),
        )
        .unwrap();
        let gateway = ns
            .in_ns(move || Gateway::builder(Settings::from_file(&file)?).start())
            .unwrap();
        let endpoint = |gateway: &Gateway| {
            gateway
                .peers()
                .unwrap()
                .into_iter()
                .find(|p| p.public_key == peer)
                .and_then(|p| p.endpoint)
        };
        assert_eq!(endpoint(&gateway), Some("192.0.2.2:51820".parse().unwrap()));
        let events = gateway.events().unwrap();

        let bridge: std::net::SocketAddr = "127.0.0.1:40999".parse().unwrap();
        let control = gateway.interface().unwrap().control.clone();
        let transport = crate::tls_peers::TlsPeers(Arc::new(OnceLock::from(control)));
        tunneld_tls::WireGuardPeers::move_peer(&transport, &peer, bridge);
        assert_eq!(endpoint(&gateway), Some(bridge), "show after the fallback");
        loop {
            match events.recv_timeout(Duration::from_secs(5)) {
                Ok(Some(Event::EndpointChanged { peer: p, endpoint })) if p == peer => {
                    assert_eq!(endpoint, bridge);
                    break;
                }
                Ok(Some(_)) => {}
                other => panic!("no EndpointChanged for the fallback: {other:?}"),
            }
        }

        let socket = format!("{}/{name}.sock", crate::uapi_server::SOCKET_DIR);
        let mut stream = std::os::unix::net::UnixStream::connect(socket).unwrap();
        uapi_set(
            &mut stream,
            &format!("set=1\npublic_key={}\nremove=true\n\n", peer.to_hex()),
        );
        assert_eq!(endpoint(&gateway), None, "wg set removed the peer");
        gateway.reload_file("test").unwrap();
        assert_eq!(
            endpoint(&gateway),
            Some(bridge),
            "the reload put the peer back on the UDP address it had left"
        );
        gateway.shutdown().unwrap();
    }
}
