//! A fleet of tunneld gateways on etcd: a front end that drives a [`tunneld::Gateway`]
//! through its public peer operations, as the bare mode drives one through `wg`.
//!
//! Each gateway claims its name with its record (public key, endpoints, its site's subnets,
//! its role) under a lease it keeps alive, stands in its site's election once the name is
//! its own, lists the fleet's prefix and watches it from the listed revision. A name another
//! live gateway holds is refused (said on both sides, never routed); a record or election
//! key of this gateway that vanishes while it lives is written again. Every other site's active gateway becomes a peer, its
//! subnets the peer's allowed IPs, and the routes follow; a change is applied as a
//! difference, so a peer that did not change keeps its session. A gateway that dies stops
//! renewing its lease and etcd deletes its keys within the lease's TTL; one that stops
//! (SIGTERM) revokes it at once. When the store is silent the gateway keeps the peers it
//! last knew. See [`reconcile`] for the rules, [`store`] for what is asked of etcd.
//!
//! Linux only, like the gateway. The fleet runs on a thread of its own (a single-threaded
//! tokio runtime); [`Fleet`]'s methods do not block but [`Fleet::stop`], which waits at
//! most about two seconds for the store.

mod lan;
pub mod paths;
pub mod probe;
pub mod reconcile;
pub mod record;
pub mod relay;
mod status;
pub mod store;

pub use lan::FENCE_MARGIN;
pub use status::{
    Counters, FleetStatus, GatewayStatus, LanStatus, NameConflict, PathStatus, Refusal,
};

use reconcile::{diff, Fleet as FleetView, PeerOp, View};
use record::{Candidate, Keys, Record, Role};
use status::Shared;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use store::{Claim, Etcd, EtcdOptions, Leadership, Store, StoreError, WatchEvents, Watched};
use tunneld::{Gateway, PeerSettings};
use tunneld_config::{FleetConfig, SiteMode};
use tunneld_crypto::PublicKey;

/// Why the fleet could not start, in one line.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Settings(String),
    #[error("fleet: {0}")]
    Store(#[from] StoreError),
    #[error("fleet: the gateway has no WireGuard interface")]
    NoInterface,
}

/// The `[fleet]` section, its files read.
#[derive(Debug, Clone)]
pub struct FleetSettings {
    pub config: FleetConfig,
    /// This gateway's name: the config's, else the host name.
    pub gateway: String,
    etcd: EtcdOptions,
    /// The packet socket the LAN side announces its addresses through.
    announcer: Option<Arc<tunneld_dataplane::announce::Announcer>>,
    /// The interface's private key: the probes between a site's gateways are authenticated
    /// with its X25519 with each other gateway's public key. Without it, no probes.
    static_key: Option<tunneld_crypto::PrivateKey>,
    /// `transport = "tls"`: the CA of the relays' TLS certificates (resolved).
    relay_ca: Option<std::path::PathBuf>,
}

impl FleetSettings {
    /// Reads the TLS files `config` names (relative to `base_dir`, the config file's
    /// directory) and the host name when the config gives no gateway name.
    pub fn from_config(config: &FleetConfig, base_dir: &Path) -> Result<FleetSettings, Error> {
        let read = |path: &Path, what: &str| {
            let path = base_dir.join(path);
            std::fs::read(&path).map_err(|e| {
                Error::Settings(format!("fleet.{what}: cannot read {}: {e}", path.display()))
            })
        };
        let ca = match &config.ca_file {
            Some(p) => {
                let pem = read(p, "ca_file")?;
                certificates(&pem).map_err(|why| {
                    Error::Settings(format!(
                        "fleet.ca_file: {}: {why}",
                        base_dir.join(p).display()
                    ))
                })?;
                Some(pem)
            }
            None => None,
        };
        let identity = match &config.client_cert {
            Some(c) => {
                let key_path = base_dir.join(&c.key_file);
                // The key lets whoever reads it write the fleet: refused when others may,
                // as WireGuard key files are.
                let key = tunneld_crypto::read_secret_file(&key_path, MAX_KEY_FILE)
                    .map_err(|e| {
                        Error::Settings(format!(
                            "fleet.key_file: {}: {}",
                            key_path.display(),
                            e.reason()
                        ))
                    })?
                    .to_vec();
                let cert = read(&c.cert_file, "cert_file")?;
                certificate_matches_key(&cert, &key).map_err(|why| {
                    Error::Settings(format!(
                        "fleet.cert_file/key_file: {} and {}: {why}",
                        base_dir.join(&c.cert_file).display(),
                        key_path.display()
                    ))
                })?;
                Some((cert, key))
            }
            None => None,
        };
        let relay_ca = match &config.tls_only {
            Some(p) => {
                let pem = read(p, "relay_ca_file")?;
                certificates(&pem).map_err(|why| {
                    Error::Settings(format!(
                        "fleet.relay_ca_file: {}: {why}",
                        base_dir.join(p).display()
                    ))
                })?;
                Some(base_dir.join(p))
            }
            None => None,
        };
        let gateway = match &config.gateway {
            Some(g) => g.clone(),
            None => host_name()?,
        };
        // Requests must fail well within a lease, so that a retry still saves it.
        let request_timeout = Duration::from_millis(u64::from(config.lease_ttl) * 1000 / 2);
        Ok(FleetSettings {
            etcd: EtcdOptions {
                endpoints: config.etcd.clone(),
                ca,
                identity,
                request_timeout,
            },
            gateway,
            config: config.clone(),
            announcer: None,
            static_key: None,
            relay_ca,
        })
    }

    /// The interface's private key, which the liveness probes between a site's gateways
    /// are authenticated with (see [`probe`]). Without it, a dead active gateway is noticed
    /// only when its lease expires.
    pub fn set_static_key(&mut self, key: tunneld_crypto::PrivateKey) {
        self.static_key = Some(key);
    }

    /// Opens what the LAN side needs that takes a privilege (`CAP_NET_RAW`: the packet
    /// socket of its gratuitous ARP and neighbour advertisements), for a gateway that drops
    /// its privileges when it starts: call this before. Without a LAN side, nothing.
    /// [`Fleet::start`] opens it itself when it was not.
    pub fn open_privileged(&mut self) -> Result<(), Error> {
        if self.config.lan.is_none() || self.announcer.is_some() {
            return Ok(());
        }
        let announcer = tunneld_dataplane::announce::Announcer::open().map_err(|e| {
            Error::Settings(format!(
                "fleet.lan_interface: cannot open a packet socket to announce the LAN addresses (gratuitous ARP, neighbour advertisements): {e} (it takes CAP_NET_RAW at start)"
            ))
        })?;
        self.announcer = Some(Arc::new(announcer));
        Ok(())
    }
}

/// The largest client key file read: a PEM key is a few KiB at most.
const MAX_KEY_FILE: u64 = 64 * 1024;

/// The certificates of a PEM file, at least one, or why not.
fn certificates(pem: &[u8]) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not valid PEM ({e:?})"))?;
    if certs.is_empty() {
        return Err("no certificate (PEM) in it".into());
    }
    Ok(certs)
}

/// Whether the key is the certificate's: etcd would refuse the handshake, at every start
/// and retry, with a reason the log shows less plainly.
fn certificate_matches_key(cert: &[u8], key: &[u8]) -> Result<(), String> {
    use rustls::pki_types::{pem::PemObject, PrivateKeyDer};
    let chain = certificates(cert).map_err(|why| format!("the certificate file: {why}"))?;
    let key = PrivateKeyDer::from_pem_slice(key)
        .map_err(|_| "no private key (PEM) in the key file".to_string())?;
    let provider = rustls::crypto::ring::default_provider();
    rustls::sign::CertifiedKey::from_der(chain, key, &provider)
        .map(drop)
        .map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => {
                "the key is not the certificate's (they do not match)".to_string()
            }
            other => format!("unusable: {other}"),
        })
}

fn host_name() -> Result<String, Error> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .map_err(|e| Error::Settings(format!("fleet: cannot read the host name: {e}")))?;
    match tunneld_config::fleet_name_problem(&name) {
        None => Ok(name),
        Some(why) => Err(Error::Settings(format!(
            "fleet: the host name {why}: set fleet.gateway"
        ))),
    }
}

/// A running fleet member. Dropping it stops it as [`Fleet::stop`] does.
#[derive(Debug)]
pub struct Fleet {
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    gateway: Gateway,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "fleet {}/{}", self.site, self.gateway)
    }
}

impl Fleet {
    /// Joins the fleet `settings` describe with `gateway`, on etcd. Returns at once: the
    /// store is reached in the background (an unreachable one is retried, and logged).
    /// Its state shows in `tunneld show` and `/metrics` from then on.
    pub fn start(gateway: &Gateway, settings: FleetSettings) -> Result<Fleet, Error> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Settings(format!("fleet: cannot start its runtime: {e}")))?;
        let store = runtime.block_on(Etcd::connect(&settings.etcd))?;
        Self::start_on(gateway, settings, store, runtime)
    }

    /// As [`Fleet::start`], on any store.
    pub fn start_on<S: Store + Send + 'static>(
        gateway: &Gateway,
        mut settings: FleetSettings,
        store: S,
        runtime: tokio::runtime::Runtime,
    ) -> Result<Fleet, Error> {
        let public_key = gateway.public_key().ok_or(Error::NoInterface)?;
        settings.open_privileged()?;
        let config = &settings.config;
        let shared = Arc::new(Shared::new(&config.site, &settings.gateway));
        let name = format!("fleet {}/{}", config.site, settings.gateway);
        let lan = match (&config.lan, &settings.announcer) {
            (Some(side), Some(announcer)) => {
                shared.state().lan = Some((side.interface.clone(), side.addresses.clone()));
                let started = lan::LanSide::start(
                    side.interface.clone(),
                    side.addresses.clone(),
                    Duration::from_secs(u64::from(config.lease_ttl)),
                    announcer.clone(),
                    shared.clone(),
                    name,
                )
                .map_err(|e| Error::Settings(format!("fleet: cannot start its LAN side: {e}")))?;
                Some(started)
            }
            _ => None,
        };
        let (deaths_tx, deaths) = tokio::sync::mpsc::unbounded_channel();
        let probe_port = config
            .advertise
            .first()
            .and_then(|e| probe::probe_port(e.port()));
        let probes = match (&settings.static_key, probe_port) {
            (Some(key), Some(port)) => {
                let name = format!("fleet {}/{}", config.site, settings.gateway);
                match probe::Probes::start(key.clone(), port, deaths_tx, name.clone()) {
                    Ok(p) => Some(Arc::new(p)),
                    Err(e) => {
                        tracing::warn!(
                            "{name}: cannot answer liveness probes on UDP port {port}: {e}; this site's failover waits for leases to expire"
                        );
                        None
                    }
                }
            }
            _ => None,
        };
        shared.state().probes = probes.clone();
        let relay_public = config.advertise.first().map(|e| e.ip());
        let relay =
            match (config.relay, &settings.static_key, relay_public) {
                (false, _, _) => None,
                (true, Some(key), Some(public)) => {
                    let relay = Arc::new(Mutex::new(relay::Relay::new(key.clone(), public)));
                    shared.state().relay = Some(relay.clone());
                    // A site that can send only TCP registers through a stream to the TLS
                    // listener: the stream then goes to the pair's port.
                    let serving = Arc::downgrade(&relay);
                    gateway.set_tls_redirect(Some(Arc::new(move |datagram: &[u8]| {
                        let port = relay::registration_port(datagram)?;
                        let relay = serving.upgrade()?;
                        let serves = status::lock_relay(&relay).serves(port);
                        serves.then_some(port)
                    })));
                    Some(relay)
                }
                (true, _, _) => return Err(Error::Settings(
                    "fleet: relay = true needs the gateway's private key and an advertised address"
                        .into(),
                )),
            };
        let registrations = settings
            .static_key
            .as_ref()
            .map(|k| relay::relay_keys(k.clone()));
        let record = Record {
            site: config.site.clone(),
            gateway: settings.gateway.clone(),
            public_key,
            endpoints: config.advertise.clone(),
            subnets: config.subnets.iter().map(|n| n.trunc()).collect(),
            role: Role::Standby,
            mode: config.mode,
            relay: config.relay,
            relay_tls: config.relay_tls.clone(),
            tls_only: config.tls_only.is_some(),
        };
        let member = Member {
            store,
            gateway: gateway.clone(),
            keys: Keys::new(&config.prefix),
            record,
            ttl: config.lease_ttl,
            keepalive: config.persistent_keepalive,
            request_timeout: settings.etcd.request_timeout,
            shared: shared.clone(),
            applied: BTreeMap::new(),
            refused_keys: HashSet::new(),
            lease: None,
            leadership: None,
            logged: HashSet::new(),
            conflicts_logged: HashSet::new(),
            claim_revision: 0,
            refused_by: None,
            refusal_said: None,
            election_seen: false,
            leaders: HashMap::new(),
            modes: HashMap::new(),
            backoff: MIN_BACKOFF,
            unanswered: 0,
            lan,
            probes,
            paths: paths::Paths::default(),
            candidates: HashMap::new(),
            advertised: HashMap::new(),
            told: BTreeMap::new(),
            told_lease: None,
            behind_nat: false,
            relay,
            relaying_told: BTreeMap::new(),
            relay_ports: HashMap::new(),
            wants_told: BTreeMap::new(),
            registrations,
            register_stamp: 0,
            relay_ca: settings.relay_ca.clone(),
            bridges: HashMap::new(),
            tls_registered: HashMap::new(),
            tls_since: HashMap::new(),
            tls_unreachable: HashSet::new(),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("fleet".into())
            .spawn(move || runtime.block_on(member.run(stopped, deaths)))
            .map_err(|e| Error::Settings(format!("fleet: cannot start its thread: {e}")))?;
        gateway
            .attach_front_end(shared.clone())
            .map_err(|_| Error::NoInterface)?;
        Ok(Fleet {
            shared,
            stop: Some(stop),
            thread: Some(thread),
            gateway: gateway.clone(),
        })
    }

    /// The fleet as this gateway sees it now.
    pub fn status(&self) -> FleetStatus {
        self.shared.status()
    }

    /// Leaves the fleet: resigns the site's lead and revokes the lease, so that the other
    /// gateways drop this one (and a standby of its site takes over) at once. The peers the
    /// fleet added stay on the gateway. Waits at most about two seconds for the store.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = self.gateway.detach_front_end();
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.stop();
    }
}

const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF_WITHOUT_LEASE: Duration = Duration::from_secs(5);

/// A number different at each call (the standard library's randomly seeded hasher).
fn jitter_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(1);
    h.finish()
}

/// A number in [0, 1), different at each call (the standard library's randomly seeded
/// hasher; this needs no more than that).
fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}
/// The longest a leave may wait for the store, per request.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(1);

/// Why serving the store stopped.
enum Interruption {
    /// The store failed before the fleet was read (it is down, or refuses us).
    Unreachable(StoreError),
    /// An established connection was lost, or the lease expired: reconnect at once.
    Lost(StoreError),
    /// The watch's revision was compacted: list again.
    Compacted,
}

/// Applies what the watch has already delivered beyond the change just applied, so that
/// one reconcile follows a burst of changes rather than one per change: a reconcile reads
/// the whole fleet (O(N)), and when N sites join at once every gateway is sent about 3N
/// changes; reconciling after each made the mesh's CPU grow as N³ and, at N = 200 on a
/// shared machine, starved the store's keep-alives until leases lapsed (measured with
/// `cargo xtask bench-fleet-scale`). Bounded, so that a flood cannot hold off the
/// keep-alive: at most [`CATCH_UP_LIMIT`] answers.
async fn catch_up<W: WatchEvents>(watch: &mut W, view: &mut View) -> Option<Interruption> {
    for _ in 0..CATCH_UP_LIMIT {
        // Polled once: ready now or left for the loop (the watch's next answer is
        // cancel-safe, as the loop's select! already needs).
        match tokio::time::timeout(Duration::ZERO, watch.next()).await {
            Ok(Ok(Watched::Changes(changes))) => {
                for change in changes {
                    view.apply(change);
                }
            }
            Ok(Ok(Watched::Compacted)) => return Some(Interruption::Compacted),
            Ok(Err(e)) => return Some(Interruption::Lost(e)),
            Err(_) => break,
        }
    }
    None
}

/// The most watch answers one reconcile waits to take in.
const CATCH_UP_LIMIT: usize = 1024;

/// The fleet member's state, on its thread.
struct Member<S: Store> {
    store: S,
    gateway: Gateway,
    keys: Keys,
    /// This gateway's record as it writes it.
    record: Record,
    ttl: u16,
    keepalive: u16,
    /// The longest a store request may take (a takeover's revocation included).
    request_timeout: Duration,
    shared: Arc<Shared>,
    /// The peers the fleet has put on the gateway, as it put them.
    applied: BTreeMap<PublicKey, PeerSettings>,
    /// Keys the gateway already had from elsewhere (its file): left to their owner.
    refused_keys: HashSet<PublicKey>,
    lease: Option<i64>,
    leadership: Option<Leadership>,
    /// Rejections already logged (key, create revision): each is logged and counted once.
    logged: HashSet<(String, i64)>,
    /// Gateways refused this gateway's name, already logged (key, create revision).
    conflicts_logged: HashSet<(String, i64)>,
    /// The revision of the last claim of the name: the view says nothing of the record's
    /// fate after the claim until it has reached it.
    claim_revision: i64,
    /// The lease holding this gateway's name when its claim was refused; claimed again
    /// when the view shows another (or none).
    refused_by: Option<i64>,
    /// The lease under which this gateway last said it was refused (a `refused/` key).
    refusal_said: Option<i64>,
    /// Whether this gateway's election key has been in the view (since the lease's last
    /// campaign): if it then goes, it was deleted, and the gateway stands again.
    election_seen: bool,
    /// Each site's active gateway at the last reconcile, to see failovers.
    leaders: HashMap<String, String>,
    /// Each site's mode and the gateways whose record says another, as last logged.
    modes: HashMap<String, (SiteMode, Vec<String>)>,
    backoff: Duration,
    /// Failed attempts in a row with no request answered in between: what says the store
    /// is unreachable. One member gone fails a stream or two while the others answer (a
    /// record put between them), and that is not an outage.
    unanswered: u32,
    /// The site's LAN addresses, held while active (`None`: the config names none).
    lan: Option<lan::LanSide>,
    /// The liveness probes between the site's gateways (`None`: off).
    probes: Option<Arc<probe::Probes>>,
    /// The paths to the fleet's peers (gateways behind NAT).
    paths: paths::Paths,
    /// Each peer's addresses to try, and those it advertises, as the last reconcile read
    /// them.
    candidates: HashMap<PublicKey, Vec<SocketAddr>>,
    advertised: HashMap<PublicKey, Vec<SocketAddr>>,
    /// What this gateway has told the fleet it sees (`seen/` keys), under which lease.
    told: BTreeMap<PublicKey, SocketAddr>,
    told_lease: Option<i64>,
    /// Whether others see this gateway elsewhere than it advertises (its keepalives are
    /// then `NAT_KEEPALIVE`).
    behind_nat: bool,
    /// This gateway's relay, when it is one (`[fleet] relay = true`), and the ports it has
    /// told the fleet it serves pairs on (`relaying/` keys, under `told_lease`).
    relay: Option<Arc<Mutex<relay::Relay>>>,
    relaying_told: BTreeMap<relay::Pair, u16>,
    /// For each peer a relay serves this gateway's pair with: the relay's key and the
    /// pair's port on it, as the last reconcile read them.
    relay_ports: HashMap<PublicKey, (PublicKey, SocketAddr)>,
    /// The relay this gateway asked for each peer (`relay/` keys, under `told_lease`).
    wants_told: BTreeMap<PublicKey, PublicKey>,
    /// Registration keys (from this gateway's static key; `None`: the embedder gave none,
    /// and no relay can be used).
    registrations: Option<probe::PairKeys>,
    /// The last registration's stamp: each one's is higher.
    register_stamp: u64,
    /// `transport = "tls"`: the relays' CA, and each peer's bridge (a TLS stream to a
    /// relay's listener, or to the peer's own when it is a relay).
    relay_ca: Option<std::path::PathBuf>,
    bridges: HashMap<PublicKey, (SocketAddr, tunneld::TlsBridge)>,
    /// When each bridged peer's relay last had a registration, and since when each has
    /// been live (or not).
    tls_registered: HashMap<PublicKey, Instant>,
    tls_since: HashMap<PublicKey, (bool, Instant)>,
    /// Peers no relay with a TLS listener serves (logged once each).
    tls_unreachable: HashSet<PublicKey>,
}

/// The keepalive of a gateway behind NAT toward its peers (seconds): after its NAT forgets
/// its mappings, the other sites reach it again within about this long.
const NAT_KEEPALIVE: u16 = 1;

/// How often the paths to the fleet's peers are looked at.
const PATHS_EVERY: Duration = Duration::from_millis(200);

/// What a relayed side sends toward the other side's direct addresses before that side
/// tries them (no WireGuard message: dropped unread where it lands).
const PUNCH: &[u8] = b"tfh1";

/// Failed attempts in a row, with nothing answered in between, after which the store
/// counts as unreachable.
const DOWN_AFTER: u32 = 3;

impl<S: Store> Member<S> {
    fn name(&self) -> String {
        format!("fleet {}/{}", self.record.site, self.record.gateway)
    }

    async fn run(
        mut self,
        mut stop: tokio::sync::oneshot::Receiver<()>,
        mut deaths: tokio::sync::mpsc::UnboundedReceiver<probe::Death>,
    ) {
        loop {
            let interruption = tokio::select! {
                biased;
                _ = &mut stop => break,
                i = self.serve(&mut deaths) => i,
            };
            match interruption {
                Interruption::Compacted => {
                    tracing::info!(
                        "{}: the watched revision was compacted; listing again",
                        self.name()
                    );
                }
                Interruption::Lost(e) => {
                    tracing::info!("{}: {e}; reconnecting", self.name());
                }
                Interruption::Unreachable(e) => {
                    self.unanswered += 1;
                    self.store_failed(&e);
                    // Fresh connections after each failure: what fails may be one
                    // connection (to a member that went away, or a stream stuck), not the
                    // store, and the new client leaves out members that do not answer.
                    if let Err(e) = self.store.reconnect().await {
                        tracing::debug!("{}: reconnecting: {e}", self.name());
                    }
                    // Between half and all of the backoff, so that gateways that failed
                    // together do not all come back at the same moment.
                    let wait = self.backoff.mul_f64(0.5 + 0.5 * jitter());
                    // With a lease that may still live, never so long that it expires
                    // unseen; with none to save, longer, to spare a struggling store.
                    let most = if self.lease.is_some() {
                        Duration::from_millis(u64::from(self.ttl) * 1000 / 3)
                    } else {
                        MAX_BACKOFF_WITHOUT_LEASE
                    };
                    self.backoff = (self.backoff * 2).min(most.max(MIN_BACKOFF));
                    tokio::select! {
                        biased;
                        _ = &mut stop => break,
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
        self.leave().await;
    }

    /// Registers, lists, watches and keeps the lease alive until something interrupts it.
    async fn serve(
        &mut self,
        deaths: &mut tokio::sync::mpsc::UnboundedReceiver<probe::Death>,
    ) -> Interruption {
        tracing::debug!("{}: registering", self.name());
        let lease = match self.register().await {
            Ok(lease) => lease,
            Err(e) => return Interruption::Unreachable(e),
        };
        tracing::debug!("{}: registered under lease {lease:x}; listing", self.name());
        // The store answered, whatever fails next.
        self.unanswered = 0;
        let listing = match self.store.list(self.keys.prefix()).await {
            Ok(l) => l,
            Err(e) => return Interruption::Unreachable(e),
        };
        let mut watch = match self
            .store
            .watch(self.keys.prefix(), listing.revision + 1)
            .await
        {
            Ok(w) => w,
            Err(e) => return Interruption::Unreachable(e),
        };
        self.store_answered();
        let mut view = View::from_entries(listing.entries, listing.revision);
        self.reconcile(&view);
        self.election_seen = false;
        if let Err(e) = self.heal(&view, lease).await {
            return Interruption::Lost(e);
        }

        let mut candidate = self.store.clone();
        let election = self.keys.election(&self.record.site);
        let standing = Candidate {
            gateway: self.record.gateway.clone(),
            public_key: self.record.public_key,
        }
        .to_value();
        let campaign = candidate.campaign(&election, &standing, lease);
        tokio::pin!(campaign);
        // Stands only while the name is its own (a refused gateway leads nothing).
        let mut campaigning = self.leadership.is_none();
        let period = Duration::from_millis((u64::from(self.ttl) * 1000 / 3).max(500));
        let mut renew = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut tend = tokio::time::interval(PATHS_EVERY);
        tend.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                won = &mut campaign, if campaigning && self.refused_by.is_none() => {
                    campaigning = false;
                    match won {
                        // What routes is the reconcile's reading of the election (the first
                        // candidate with its record), which this normally agrees with.
                        Ok(leadership) => {
                            self.leadership = Some(leadership);
                            tracing::debug!("{}: elected in site {}", self.name(), self.record.site);
                        }
                        Err(e) => return Interruption::Lost(e),
                    }
                }
                _ = renew.tick() => {
                    // Before the request: etcd renews the lease after this instant.
                    let sent = Instant::now();
                    match self.store.keep_alive(lease).await {
                        Ok(true) => {
                            self.shared.state().lease_renewed = Some(Instant::now());
                            if let Some(lan) = &self.lan {
                                lan.renewed(sent);
                            }
                        }
                        Ok(false) => {
                            if let Some(lan) = &self.lan {
                                lan.lease_lost();
                            }
                            self.lease = None;
                            self.leadership = None;
                            return Interruption::Lost(StoreError("the lease expired in the store".into()));
                        }
                        Err(e) => return Interruption::Lost(e),
                    }
                }
                Some(death) = deaths.recv() => {
                    self.take_over(death).await;
                }
                _ = tend.tick() => {
                    if let Err(e) = self.tend_paths(lease).await {
                        return Interruption::Lost(e);
                    }
                }
                next = watch.next() => match next {
                    Ok(Watched::Changes(changes)) => {
                        for change in changes {
                            view.apply(change);
                        }
                        if let Some(interruption) = catch_up(&mut watch, &mut view).await {
                            return interruption;
                        }
                        self.reconcile(&view);
                        if let Err(e) = self.heal(&view, lease).await {
                            return Interruption::Lost(e);
                        }
                    }
                    Ok(Watched::Compacted) => return Interruption::Compacted,
                    Err(e) => return Interruption::Lost(e),
                }
            }
        }
    }

    /// Keeps the lease if it still lives, else takes a new one; writes the record under it.
    async fn register(&mut self) -> Result<i64, StoreError> {
        let sent = Instant::now();
        let lease = match self.lease {
            Some(lease) if self.store.keep_alive(lease).await? => lease,
            _ => {
                if let Some(lan) = &self.lan {
                    lan.lease_lost();
                }
                if self.lease.is_some() {
                    tracing::warn!(
                        "{}: the lease expired in the store; joining again",
                        self.name()
                    );
                }
                self.leadership = None;
                self.record.role = Role::Standby;
                tracing::debug!("{}: asking for a lease", self.name());
                let sent = Instant::now();
                let lease = self.store.grant(i64::from(self.ttl)).await?;
                if let Some(lan) = &self.lan {
                    lan.renewed(sent);
                }
                self.lease = Some(lease);
                lease
            }
        };
        if let Some(lan) = &self.lan {
            lan.renewed(sent);
        }
        self.shared.state().lease_renewed = Some(Instant::now());
        self.claim_name(lease).await?;
        Ok(lease)
    }

    /// Writes this gateway's record where its name is free or its own; where another lease
    /// holds it, leaves it, says so once (log, counter, `show`) and tells the holder with a
    /// `refused/` key under this gateway's lease.
    async fn claim_name(&mut self, lease: i64) -> Result<(), StoreError> {
        let (site, gateway) = (self.record.site.clone(), self.record.gateway.clone());
        let key = self.keys.record(&site, &gateway);
        match self.store.claim(&key, self.record.to_json(), lease).await? {
            Claim::Written { revision } => {
                self.claim_revision = revision;
                if self.refused_by.take().is_some() {
                    tracing::info!(
                        "{}: the name {site}/{gateway} is free again: joined the fleet as it",
                        self.name()
                    );
                }
                self.shared.state().refused = None;
            }
            Claim::Held { entry, revision } => {
                self.claim_revision = revision;
                self.record.role = Role::Standby;
                let holder = Record::parse(&site, &gateway, &entry.value).ok();
                if self.refused_by != Some(entry.lease) {
                    self.refused_by = Some(entry.lease);
                    self.shared
                        .counters
                        .name_conflicts
                        .fetch_add(1, Ordering::Relaxed);
                    let at = holder
                        .as_ref()
                        .and_then(|h| h.endpoints.first())
                        .map_or(String::new(), |e| format!(" at {e}"));
                    match &holder {
                        Some(h) if h.public_key == self.record.public_key => tracing::warn!(
                            "{}: the name {site}/{gateway} is held under another lease by this gateway's own public key{at}: an earlier run of this gateway (its record goes within {} s) or a copy of it elsewhere; waiting for the name",
                            self.name(),
                            self.ttl
                        ),
                        _ => tracing::warn!(
                            "{}: the name {site}/{gateway} is held by another gateway (public key {}{at}): this one stays out of the fleet and routes nothing until the name is free; give each gateway of a site a name of its own (fleet.gateway, the host name by default)",
                            self.name(),
                            holder.as_ref().map_or("unreadable".to_string(), |h| h.public_key.to_base64())
                        ),
                    }
                }
                self.shared.state().refused = Some(status::Refusal {
                    holder: holder.as_ref().map(|h| h.public_key),
                    endpoint: holder.as_ref().and_then(|h| h.endpoints.first().copied()),
                });
                if self.refusal_said != Some(lease) {
                    let said = self.keys.refused(&site, &gateway, lease);
                    self.store.put(&said, self.record.to_json(), lease).await?;
                    self.refusal_said = Some(lease);
                }
            }
        }
        Ok(())
    }

    /// Keeps this gateway's keys as they should be: its record (written again if it
    /// vanished, was overwritten, or its role changed; claimed again if the gateway that
    /// held the name let it go) and its election key (if deleted, the gateway stands
    /// again: the error makes the loop register, list and campaign anew).
    async fn heal(&mut self, view: &View, lease: i64) -> Result<(), StoreError> {
        // Until the view has reached the last claim, it cannot tell its fate.
        if view.revision() >= self.claim_revision {
            let key = self.keys.record(&self.record.site, &self.record.gateway);
            let value = self.record.to_json();
            match view.get(&key) {
                Some(e) if e.lease == lease && e.value == value => {}
                Some(e) if e.lease != 0 && self.refused_by == Some(e.lease) => {}
                found => {
                    if self.refused_by.is_none() {
                        match found {
                            None => tracing::warn!(
                                "{}: this gateway's record vanished from the store while it lives; writing it again",
                                self.name()
                            ),
                            Some(e) if e.lease != lease => tracing::warn!(
                                "{}: this gateway's record was overwritten (lease {:x}); writing it again",
                                self.name(),
                                e.lease
                            ),
                            Some(_) => {}
                        }
                    }
                    self.claim_name(lease).await?;
                }
            }
        }
        let election_key = self.keys.candidate(&self.record.site, lease);
        if view.get(&election_key).is_some() {
            self.election_seen = true;
        } else if self.election_seen {
            self.election_seen = false;
            self.leadership = None;
            return Err(StoreError(
                "this gateway's election key vanished from the store; standing again".into(),
            ));
        }
        Ok(())
    }

    fn store_failed(&mut self, e: &StoreError) {
        self.shared
            .counters
            .store_errors
            .fetch_add(1, Ordering::Relaxed);
        if self.unanswered < DOWN_AFTER && self.shared.state().store_up.is_some() {
            tracing::debug!("{}: the store did not answer ({e}); retrying", self.name());
            return;
        }
        let mut state = self.shared.state();
        if !state.joined && state.store_up.is_none() {
            tracing::warn!(
                "{}: the store does not answer since start ({e}): this gateway is not in the fleet and has no peers from it until the store answers; retrying",
                self.name()
            );
        } else if state.store_up != Some(false) {
            tracing::warn!(
                "{}: the store is unreachable ({e}); forwarding with the {} peers last known, retrying",
                self.name(),
                self.applied.len()
            );
        } else {
            tracing::debug!("{}: the store is still unreachable: {e}", self.name());
        }
        state.store_up = Some(false);
        state.store_error = Some(e.to_string());
    }

    fn store_answered(&mut self) {
        self.backoff = MIN_BACKOFF;
        self.unanswered = 0;
        let mut state = self.shared.state();
        match state.store_up {
            None => tracing::info!(
                "{}: joined the fleet {}",
                self.name(),
                self.keys.prefix().trim_end_matches('/')
            ),
            Some(false) => tracing::info!("{}: the store answers again; reconciling", self.name()),
            Some(true) => {}
        }
        state.store_up = Some(true);
        state.store_error = None;
        state.joined = true;
    }

    /// Makes the gateway's peers follow the store's state.
    fn reconcile(&mut self, view: &View) {
        let own = (
            self.record.site.as_str(),
            self.record.gateway.as_str(),
            &self.record.public_key,
        );
        let fleet = FleetView::resolve(view, &self.keys, own);
        for r in &fleet.rejected {
            if self.logged.insert((r.key.clone(), r.create_revision)) {
                self.shared
                    .counters
                    .rejected_records
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    "{}: ignoring the record {}: {}",
                    self.name(),
                    r.key,
                    r.reason
                );
            }
        }
        self.logged.retain(|(key, rev)| {
            fleet
                .rejected
                .iter()
                .any(|r| r.key == *key && r.create_revision == *rev)
        });
        // The other side of a refused name: the holder hears of it.
        for c in &fleet.conflicts {
            let own = c.site == self.record.site
                && c.gateway == self.record.gateway
                && c.holder == self.record.public_key;
            if own
                && self
                    .conflicts_logged
                    .insert((c.key.clone(), c.create_revision))
            {
                self.shared
                    .counters
                    .name_conflicts
                    .fetch_add(1, Ordering::Relaxed);
                let at = c
                    .claimant
                    .endpoints
                    .first()
                    .map_or(String::new(), |e| format!(" at {e}"));
                tracing::warn!(
                    "{}: another gateway (public key {}{at}) claims this gateway's name; it was refused and routes nothing: give it a name of its own",
                    self.name(),
                    c.claimant.public_key.to_base64()
                );
            }
        }
        self.conflicts_logged.retain(|(key, rev)| {
            fleet
                .conflicts
                .iter()
                .any(|c| c.key == *key && c.create_revision == *rev)
        });
        for (name, site) in &fleet.sites {
            let Some(active) = &site.active else {
                continue;
            };
            match self.leaders.insert(name.clone(), active.clone()) {
                Some(before) if before != *active => {
                    self.shared
                        .counters
                        .failovers
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        "{}: site {name} is served by {active} now (was {before})",
                        self.name()
                    );
                }
                _ => {}
            }
        }
        for (name, site) in &fleet.sites {
            let now = (site.mode, site.dissenters.clone());
            if self.modes.get(name) == Some(&now) {
                continue;
            }
            if !site.dissenters.is_empty() {
                let decides = site
                    .active
                    .as_deref()
                    .map_or("its earliest record".to_string(), |a| {
                        format!("its elected gateway {a}")
                    });
                tracing::warn!(
                    "{}: site {name} runs {} as {decides} says; the record of {} says otherwise (give every gateway of a site the same `mode`)",
                    self.name(),
                    site.mode,
                    site.dissenters.join(", ")
                );
            } else if self
                .modes
                .get(name)
                .is_some_and(|(mode, _)| *mode != site.mode)
            {
                tracing::info!("{}: site {name} runs {} now", self.name(), site.mode);
            }
            self.modes.insert(name.clone(), now);
        }
        self.modes.retain(|name, _| fleet.sites.contains_key(name));
        let own_active = fleet.active_key(&self.record.site) == Some(self.record.public_key);
        // An active-active site's every gateway carries traffic to the other sites; its
        // elected one alone holds the LAN addresses.
        let own_carries = self.refused_by.is_none()
            && (own_active || fleet.carries(&self.record.site, &self.record.public_key));
        if self.refused_by.is_none() {
            // What the record says of it; `heal` writes it when it changes.
            self.record.role = if own_active {
                Role::Active
            } else {
                Role::Standby
            };
        }
        if let Some(lan) = &self.lan {
            lan.set_active(own_active);
        }
        if let Some(probes) = &self.probes {
            let site = fleet.sites.get(&self.record.site);
            let others = site
                .into_iter()
                .flat_map(|s| &s.gateways)
                .map(|m| m.record.public_key)
                .filter(|k| *k != self.record.public_key);
            // A standby watches its site's active gateway; a refused gateway watches nothing.
            // In an active-active site each gateway watches the next one in the order of
            // their keys, so that with two they watch each other and with more every one is
            // watched by one.
            let own_key = self.record.public_key;
            fn next_of<'a>(
                s: &'a reconcile::Site,
                own: &PublicKey,
            ) -> Option<&'a reconcile::Member> {
                let mut keys: Vec<&reconcile::Member> = s.gateways.iter().collect();
                keys.sort_by_key(|m| m.record.public_key.to_base64());
                let at = keys.iter().position(|m| m.record.public_key == *own)?;
                Some(keys[(at + 1) % keys.len()])
            }
            let watched = site
                .and_then(|s| match s.mode {
                    SiteMode::ActiveActive => next_of(s, &own_key),
                    SiteMode::ActiveStandby => s.active_member(),
                })
                .filter(|m| m.record.public_key != self.record.public_key)
                .filter(|_| self.refused_by.is_none())
                .and_then(|m| {
                    let endpoint = m.record.endpoints.first()?;
                    let port = probe::probe_port(endpoint.port())?;
                    Some(probe::Watched {
                        public_key: m.record.public_key,
                        address: SocketAddr::new(endpoint.ip(), port),
                        name: format!("{}/{}", m.record.site, m.record.gateway),
                    })
                });
            probes.set(others, watched);
        }
        // Every gateway keeps every path to the other sites handshaken, standbys included,
        // so that a failover moves allowed IPs and needs no handshake. Both ends add each
        // other with keepalives on and may initiate at once; the handshake settles that
        // (each answers the other's initiation) when nobody waits on it yet.
        // Behind a NAT (others see this gateway elsewhere than it advertises), keepalives
        // every second: a NAT that forgot its mapping (rebooted, flushed) drops what the
        // other sites send until this side sends again.
        let behind_nat = fleet
            .seen
            .get(&self.record.public_key)
            .is_some_and(|seen| seen.iter().any(|a| !self.record.endpoints.contains(a)));
        if behind_nat != self.behind_nat {
            self.behind_nat = behind_nat;
            let seen: Vec<String> = fleet
                .seen
                .get(&self.record.public_key)
                .into_iter()
                .flatten()
                .map(ToString::to_string)
                .collect();
            if behind_nat {
                tracing::info!(
                    "{}: behind a NAT (the fleet sees it at {}): keepalives every {NAT_KEEPALIVE} s",
                    self.name(),
                    seen.join(", ")
                );
            } else {
                tracing::info!("{}: no longer seen behind a NAT", self.name());
            }
        }
        let keepalive = if behind_nat && self.keepalive > 0 {
            NAT_KEEPALIVE.min(self.keepalive)
        } else {
            self.keepalive
        };
        let mut wanted = fleet.wanted_peers(&self.record.site, own_carries, keepalive);
        wanted.retain(|k, _| !self.refused_keys.contains(k));
        if self.relay_ca.is_some() {
            self.bridge_peers(&fleet, &mut wanted);
        }
        self.candidates = wanted.keys().map(|k| (*k, fleet.candidates(k))).collect();
        let own_key = self.record.public_key;
        self.relay_ports = fleet
            .relayed
            .iter()
            .filter_map(|(pair, at)| Some((pair.other(&own_key)?, *at)))
            .filter(|(peer, _)| wanted.contains_key(peer))
            .collect();
        self.advertised = fleet
            .sites
            .values()
            .flat_map(|s| &s.gateways)
            .filter(|m| wanted.contains_key(&m.record.public_key))
            .map(|m| (m.record.public_key, m.record.endpoints.clone()))
            .collect();
        for op in diff(&self.applied, &wanted) {
            self.apply(op);
        }
        let mut state = self.shared.state();
        if state.active != own_active && state.store_up.is_some() {
            tracing::info!(
                "{}: {} site {}",
                self.name(),
                if own_active {
                    "now active for"
                } else {
                    "standing by for"
                },
                self.record.site
            );
        }
        state.active = own_active;
        let now = Instant::now();
        let seen: HashSet<(String, String)> = fleet
            .sites
            .values()
            .flat_map(|s| &s.gateways)
            .map(|m| (m.record.site.clone(), m.record.gateway.clone()))
            .collect();
        state.first_seen.retain(|k, _| seen.contains(k));
        for k in seen {
            state.first_seen.entry(k).or_insert(now);
        }
        state.fleet = fleet;
        state.last_reconcile = Some(SystemTime::now());
        self.shared
            .counters
            .reconciles
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Tries the addresses of peers that have no session (`paths`), and tells the fleet
    /// where this gateway sees peers whose datagrams come from an address they do not
    /// advertise (a NAT's), under its lease: a write only when that changes.
    async fn tend_paths(&mut self, lease: i64) -> Result<(), StoreError> {
        let Ok(snapshot) = self.gateway.peers() else {
            return Ok(());
        };
        let wall = SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let peers: Vec<paths::PeerNow> = snapshot
            .into_iter()
            .filter(|p| self.applied.contains_key(&p.public_key))
            .map(|p| paths::PeerNow {
                public_key: p.public_key,
                endpoint: p.endpoint,
                since_handshake: p.last_handshake.map(|t| wall.saturating_sub(t)),
                rx_bytes: p.rx_bytes,
                tx_bytes: p.tx_bytes,
            })
            .collect();
        let now = Instant::now();
        let before: HashMap<PublicKey, paths::PathState> = peers
            .iter()
            .filter_map(|p| Some((p.public_key, self.paths.state(&p.public_key)?)))
            .collect();
        let tick = if self.relay_ca.is_some() {
            self.tls_tick(now, &peers)
        } else {
            let candidates = &self.candidates;
            let relay_ports = &self.relay_ports;
            self.paths.tick_relayed(
                now,
                wall,
                &self.record.public_key,
                &peers,
                |k| candidates.get(k).cloned().unwrap_or_default(),
                |k| relay_ports.get(k).map(|(_, at)| *at),
            )
        };
        for key in &tick.register {
            self.register_with_relay(key);
        }
        for (key, at) in &tick.tries {
            match self.gateway.try_path(key, *at) {
                Ok(()) => tracing::debug!(
                    "{}: trying a direct path to {} at {at}",
                    self.name(),
                    self.peer_name(key)
                ),
                Err(e) => tracing::debug!("{}: cannot try {at}: {e}", self.name()),
            }
        }
        for to in &tick.punches {
            // Opens this side's NAT toward the other side's try of a direct path; the other
            // side's worker drops it unread (no WireGuard message).
            let _ = self.gateway.send_datagram(*to, PUNCH.to_vec());
        }
        for (key, at) in tick.moves {
            match self.gateway.move_peer(&key, at) {
                Ok(()) => {
                    tracing::debug!("{}: trying {at} for {}", self.name(), self.peer_name(&key))
                }
                Err(e) => tracing::debug!("{}: cannot try {at}: {e}", self.name()),
            }
        }
        let mut states = HashMap::new();
        for p in &peers {
            let state = if self.relay_ca.is_some() {
                self.tls_state(p, now)
            } else {
                self.paths.state(&p.public_key)
            };
            let Some(state) = state else {
                continue;
            };
            match (before.get(&p.public_key), &state) {
                (
                    Some(paths::PathState::Searching { tried, .. }),
                    paths::PathState::Up { via, .. },
                ) if *tried > 0 => tracing::info!(
                    "{}: {} reached at {via} ({tried} addresses tried)",
                    self.name(),
                    self.peer_name(&p.public_key)
                ),
                (Some(paths::PathState::Relayed { .. }), paths::PathState::Up { via, .. }) => {
                    tracing::info!(
                        "{}: {} reached directly at {via}, no longer through its relay",
                        self.name(),
                        self.peer_name(&p.public_key)
                    )
                }
                (Some(before), paths::PathState::Relayed { via, .. })
                    if !matches!(before, paths::PathState::Relayed { .. }) =>
                {
                    tracing::info!(
                        "{}: {} reached through the relay at {via} (no direct path)",
                        self.name(),
                        self.peer_name(&p.public_key)
                    )
                }
                _ => {}
            }
            states.insert(p.public_key, state);
        }
        let path_relays: HashMap<PublicKey, String> = states
            .iter()
            .filter(|(_, s)| matches!(s, paths::PathState::Relayed { .. }))
            .filter_map(|(k, _)| Some((*k, self.peer_name(&self.relay_ports.get(k)?.0))))
            .collect();
        {
            let mut state = self.shared.state();
            state.paths = states;
            state.path_relays = path_relays;
        }

        if self.told_lease != Some(lease) {
            // Keys under another lease went with it.
            self.told.clear();
            self.wants_told.clear();
            self.relaying_told.clear();
            self.told_lease = Some(lease);
        }
        self.tell_wants(&tick.want_relay, lease).await?;
        self.tend_relay(lease).await?;
        let advertised = &self.advertised;
        // A peer met through a relay is at the relay's port: nothing to tell of where it is.
        let relay_ports = &self.relay_ports;
        let told = paths::observations(&peers, |k| {
            let mut not_its_own = advertised.get(k).cloned().unwrap_or_default();
            not_its_own.extend(relay_ports.get(k).map(|(_, at)| *at));
            not_its_own
        });
        let (site, gateway) = (self.record.site.clone(), self.record.gateway.clone());
        for (key, at) in &told {
            if self.told.get(key) == Some(at) {
                continue;
            }
            let seen = self.keys.seen(&site, &gateway, key);
            tokio::time::timeout(
                self.request_timeout,
                self.store.put(&seen, at.to_string().into_bytes(), lease),
            )
            .await
            .map_err(|_| StoreError("etcd did not answer in time".into()))??;
            tracing::debug!(
                "{}: told the fleet {} is at {at}",
                self.name(),
                self.peer_name(key)
            );
            self.told.insert(*key, *at);
        }
        let gone: Vec<PublicKey> = self
            .told
            .keys()
            .filter(|k| !told.contains_key(k))
            .copied()
            .collect();
        for key in gone {
            let seen = self.keys.seen(&site, &gateway, &key);
            tokio::time::timeout(self.request_timeout, self.store.delete(&seen))
                .await
                .map_err(|_| StoreError("etcd did not answer in time".into()))??;
            self.told.remove(&key);
        }
        Ok(())
    }

    /// `transport = "tls"`: every peer is reached over TLS, through a bridge to the TLS
    /// listener of the relay the pair agrees on, or of the peer itself when it is a relay;
    /// `wanted`'s endpoints become the bridges. Bridges of peers gone, or whose relay
    /// changed, are closed.
    fn bridge_peers(&mut self, fleet: &FleetView, wanted: &mut BTreeMap<PublicKey, PeerSettings>) {
        let Some(ca) = self.relay_ca.clone() else {
            return;
        };
        let own = self.record.public_key;
        let record_of = |key: &PublicKey| {
            fleet
                .sites
                .values()
                .flat_map(|s| &s.gateways)
                .find(|m| m.record.public_key == *key)
                .map(|m| &m.record)
        };
        let mut keep = HashSet::new();
        for (peer, settings) in wanted.iter_mut() {
            let target = match record_of(peer).and_then(|r| r.relay_tls.clone()) {
                Some(its_own) => Some(its_own),
                None => fleet
                    .relay_for(&relay::Pair::new(own, *peer))
                    .and_then(|r| record_of(&r)?.relay_tls.clone()),
            };
            let Some((remote, server_name)) = target else {
                if self.tls_unreachable.insert(*peer) {
                    tracing::warn!(
                        "{}: no relay with a TLS listener for {}: it cannot be reached over TCP",
                        self.name(),
                        self.peer_name(peer)
                    );
                }
                continue;
            };
            self.tls_unreachable.remove(peer);
            if self.bridges.get(peer).is_none_or(|(r, _)| *r != remote) {
                match self
                    .gateway
                    .open_tls_bridge(*peer, remote, &server_name, &ca)
                {
                    Ok(bridge) => {
                        tracing::info!(
                            "{}: {} over TLS through {remote} ({server_name})",
                            self.name(),
                            self.peer_name(peer)
                        );
                        self.bridges.insert(*peer, (remote, bridge));
                    }
                    Err(e) => {
                        tracing::warn!("{}: {e}", self.name());
                        continue;
                    }
                }
            }
            if let Some((_, bridge)) = self.bridges.get(peer) {
                settings.endpoint = Some(bridge.address);
                keep.insert(*peer);
            }
        }
        self.bridges.retain(|k, _| keep.contains(k));
    }

    /// `transport = "tls"`'s tick: each peer a relay serves the pair with gets a
    /// registration through its bridge every `REGISTER_EVERY` (a relay restarted, or a
    /// stream reconnected, learns it again), and its relay asked for; a relay peer is
    /// reached through its own listener and needs none.
    fn tls_tick(&mut self, now: Instant, peers: &[paths::PeerNow]) -> paths::Tick {
        let mut tick = paths::Tick::default();
        let relays: HashSet<PublicKey> = self
            .shared
            .state()
            .fleet
            .sites
            .values()
            .flat_map(|s| &s.gateways)
            .filter(|m| m.record.relay_tls.is_some())
            .map(|m| m.record.public_key)
            .collect();
        for p in peers {
            let key = p.public_key;
            if relays.contains(&key) || !self.bridges.contains_key(&key) {
                continue;
            }
            tick.want_relay.insert(key);
            let due = self
                .tls_registered
                .get(&key)
                .is_none_or(|t| now.saturating_duration_since(*t) >= paths::REGISTER_EVERY);
            if self.relay_ports.contains_key(&key) && due {
                tick.register.push(key);
                self.tls_registered.insert(key, now);
            }
        }
        let bridges = &self.bridges;
        self.tls_registered.retain(|k, _| bridges.contains_key(k));
        self.tls_since.retain(|k, _| bridges.contains_key(k));
        tick
    }

    /// A peer's path for `transport = "tls"`: through the TLS listener of its relay (or its
    /// own), live or not yet.
    fn tls_state(&mut self, p: &paths::PeerNow, now: Instant) -> Option<paths::PathState> {
        let (remote, _) = self.bridges.get(&p.public_key)?;
        let live = p
            .since_handshake
            .is_some_and(|d| d < Duration::from_secs(180));
        let (was_live, since) = *self.tls_since.entry(p.public_key).or_insert((live, now));
        let since = if was_live == live {
            since
        } else {
            self.tls_since.insert(p.public_key, (live, now));
            now
        };
        if !live {
            return Some(paths::PathState::Searching { since, tried: 0 });
        }
        Some(if self.relay_ports.contains_key(&p.public_key) {
            paths::PathState::Relayed {
                via: *remote,
                since,
            }
        } else {
            paths::PathState::Up {
                via: *remote,
                since,
            }
        })
    }

    /// Sends this gateway's registration for its pair with `peer` to the relay serving it,
    /// from the WireGuard socket (so the relay learns where this gateway's NAT maps it).
    fn register_with_relay(&mut self, peer: &PublicKey) {
        let (Some((relay, at)), Some(keys)) = (self.relay_ports.get(peer), &mut self.registrations)
        else {
            return;
        };
        let wall = SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        self.register_stamp = wall.max(self.register_stamp + 1);
        let datagram = relay::registration(
            keys,
            &self.record.public_key,
            peer,
            relay,
            at.port(),
            self.register_stamp,
        );
        // A site that sends only TCP registers through its stream to the relay.
        let to = self.bridges.get(peer).map_or(*at, |(_, b)| b.address);
        if let Err(e) = self.gateway.send_datagram(to, datagram) {
            tracing::debug!(
                "{}: cannot register with the relay at {at}: {e}",
                self.name()
            );
        }
    }

    /// Asks the fleet for a relay to each peer in `wanted` (the relay every side agrees on,
    /// `Fleet::relay_for`), under the lease; takes back what is no longer wanted.
    async fn tell_wants(
        &mut self,
        wanted: &std::collections::BTreeSet<PublicKey>,
        lease: i64,
    ) -> Result<(), StoreError> {
        let own = self.record.public_key;
        let choice: BTreeMap<PublicKey, PublicKey> = {
            let state = self.shared.state();
            wanted
                .iter()
                .filter_map(|peer| {
                    Some((*peer, state.fleet.relay_for(&relay::Pair::new(own, *peer))?))
                })
                .collect()
        };
        let (site, gateway) = (self.record.site.clone(), self.record.gateway.clone());
        for (peer, relay) in &choice {
            if self.wants_told.get(peer) == Some(relay) {
                continue;
            }
            let key = self.keys.relay_wanted(&site, &gateway, peer);
            tokio::time::timeout(
                self.request_timeout,
                self.store.put(&key, relay.to_base64().into_bytes(), lease),
            )
            .await
            .map_err(|_| StoreError("etcd did not answer in time".into()))??;
            tracing::info!(
                "{}: no direct path to {}: asking the relay {}",
                self.name(),
                self.peer_name(peer),
                self.peer_name(relay)
            );
            self.wants_told.insert(*peer, *relay);
        }
        let gone: Vec<PublicKey> = self
            .wants_told
            .keys()
            .filter(|k| !choice.contains_key(k))
            .copied()
            .collect();
        for peer in gone {
            let key = self.keys.relay_wanted(&site, &gateway, &peer);
            tokio::time::timeout(self.request_timeout, self.store.delete(&key))
                .await
                .map_err(|_| StoreError("etcd did not answer in time".into()))??;
            self.wants_told.remove(&peer);
        }
        Ok(())
    }

    /// A relay's part: a port for each pair some side of which asks this relay (both sides
    /// in the fleet), closed when none does; the ports told the fleet under the lease.
    async fn tend_relay(&mut self, lease: i64) -> Result<(), StoreError> {
        let Some(relay) = self.relay.clone() else {
            return Ok(());
        };
        let own = self.record.public_key;
        let pairs: BTreeSet<relay::Pair> = {
            let state = self.shared.state();
            let live: HashSet<PublicKey> = state
                .fleet
                .sites
                .values()
                .flat_map(|s| &s.gateways)
                .map(|m| m.record.public_key)
                .collect();
            state
                .fleet
                .relay_wanted
                .iter()
                .filter(|(asker, subject, r)| {
                    *r == own && live.contains(asker) && live.contains(subject)
                })
                .filter(|(asker, subject, _)| asker != subject && *asker != own && *subject != own)
                .map(|(asker, subject, _)| relay::Pair::new(*asker, *subject))
                .collect()
        };
        let ports = {
            let mut relay = status::lock_relay(&relay);
            relay.retain(|p| pairs.contains(p));
            for pair in &pairs {
                if let Err(e) = relay.allocate(*pair) {
                    tracing::warn!("{}: cannot open a relay port: {e}", self.name());
                }
            }
            relay.ports()
        };
        let (site, gateway) = (self.record.site.clone(), self.record.gateway.clone());
        for (pair, port) in &ports {
            if self.relaying_told.get(pair) == Some(port) {
                continue;
            }
            let key = self.keys.relaying(&site, &gateway, &pair.to_hex());
            tokio::time::timeout(
                self.request_timeout,
                self.store.put(&key, port.to_string().into_bytes(), lease),
            )
            .await
            .map_err(|_| StoreError("etcd did not answer in time".into()))??;
            tracing::info!(
                "{}: relaying between {} and {} on UDP port {port}",
                self.name(),
                self.peer_name(&pair.0),
                self.peer_name(&pair.1)
            );
            self.relaying_told.insert(*pair, *port);
        }
        let gone: Vec<relay::Pair> = self
            .relaying_told
            .keys()
            .filter(|p| !ports.contains_key(p))
            .copied()
            .collect();
        for pair in gone {
            let key = self.keys.relaying(&site, &gateway, &pair.to_hex());
            tokio::time::timeout(self.request_timeout, self.store.delete(&key))
                .await
                .map_err(|_| StoreError("etcd did not answer in time".into()))??;
            tracing::info!(
                "{}: no longer relaying between {} and {}",
                self.name(),
                self.peer_name(&pair.0),
                self.peer_name(&pair.1)
            );
            self.relaying_told.remove(&pair);
        }
        Ok(())
    }

    /// `site/gateway` of a peer, or its key.
    fn peer_name(&self, key: &PublicKey) -> String {
        self.shared.state().fleet.name_of(key)
    }

    fn apply(&mut self, op: PeerOp) {
        let name = self.name();
        match op {
            PeerOp::Remove(key) => {
                match self.gateway.remove_peer(&key) {
                    Ok(()) | Err(tunneld::Error::UnknownPeer(_)) => {
                        tracing::info!(peer = %key, "{name}: peer removed");
                    }
                    Err(e) => tracing::warn!(peer = %key, "{name}: cannot remove the peer: {e}"),
                }
                self.applied.remove(&key);
            }
            PeerOp::Update(change) => {
                let key = change.public_key;
                let Some(mut settings) = self.applied.get(&key).cloned() else {
                    return;
                };
                if let Some(e) = change.endpoint {
                    settings.endpoint = Some(e);
                }
                if let Some(a) = &change.allowed_ips {
                    settings.allowed_ips.clone_from(a);
                }
                if let Some(a) = &change.shared_ips {
                    settings.shared_ips.clone_from(a);
                }
                if let Some(k) = change.persistent_keepalive {
                    settings.persistent_keepalive = k;
                }
                match self.gateway.update_peer(change) {
                    Ok(()) => {
                        tracing::info!(peer = %key, "{name}: peer changed; its session is kept");
                        self.applied.insert(key, settings);
                    }
                    // Removed behind the fleet's back (`wg set … remove`): put it back.
                    Err(tunneld::Error::UnknownPeer(_)) => {
                        self.applied.remove(&key);
                        self.apply(PeerOp::Add(settings));
                    }
                    Err(e) => tracing::warn!(peer = %key, "{name}: cannot change the peer: {e}"),
                }
            }
            PeerOp::Add(settings) => {
                let key = settings.public_key;
                let shown: Vec<String> = settings
                    .allowed_ips
                    .iter()
                    .map(ToString::to_string)
                    .chain(settings.shared_ips.iter().map(|n| format!("{n} (shared)")))
                    .collect();
                match self.gateway.add_peer(settings.clone()) {
                    Ok(()) => {
                        tracing::info!(
                            peer = %key,
                            endpoint = ?settings.endpoint,
                            "{name}: peer added for {}",
                            shown.join(", ")
                        );
                        self.applied.insert(key, settings);
                    }
                    Err(tunneld::Error::PeerExists(_)) => {
                        tracing::warn!(peer = %key, "{name}: the gateway has this peer from its file already; the fleet leaves it alone");
                        self.refused_keys.insert(key);
                    }
                    Err(e) => tracing::warn!(peer = %key, "{name}: cannot add the peer: {e}"),
                }
            }
        }
    }

    /// The probes say the site's active gateway died: asks etcd to end its lease, which
    /// deletes its record and election key, so that etcd's election makes the next candidate
    /// (normally this one) active and every gateway's watch follows. etcd stays the authority:
    /// a gateway that cannot reach it takes nothing over (the lease then expires as before),
    /// and a gateway wrongly judged dead (the probe path cut, etcd reachable) sees its keys
    /// deleted in its watch and stands by at once.
    async fn take_over(&mut self, death: probe::Death) {
        let (lease, held_lan) = {
            let state = self.shared.state();
            let site = state.fleet.sites.get(&self.record.site);
            let active = site
                .and_then(reconcile::Site::active_member)
                .is_some_and(|m| m.record.public_key == death.public_key);
            // Any gateway of an active-active site: each carries flows of its own.
            let member = site
                .filter(|s| active || s.mode == SiteMode::ActiveActive)
                .and_then(|s| {
                    s.gateways
                        .iter()
                        .find(|m| m.record.public_key == death.public_key)
                })
                .filter(|m| m.record.public_key != self.record.public_key)
                .map(|m| m.lease);
            (member, active)
        };
        let Some(lease) = lease.filter(|l| *l != 0) else {
            tracing::debug!(
                "{}: {} looked dead but no longer carries the site's traffic",
                self.name(),
                death.name
            );
            return;
        };
        let asked = Instant::now();
        match tokio::time::timeout(self.request_timeout, self.store.revoke(lease)).await {
            Ok(Ok(())) => {
                self.shared
                    .counters
                    .takeovers
                    .fetch_add(1, Ordering::Relaxed);
                // The dead gateway's LAN addresses can outlive it in its kernel until their
                // lifetime ends: at the latest its fence (its last keep-alive answered, sent
                // before now, plus lease_ttl - FENCE_MARGIN) and the kernel's lateness. This
                // one takes them a whole lease_ttl after the revocation, so that two gateways
                // never hold them at once, even when the dead one was only cut off.
                if let Some(lan) = self.lan.as_ref().filter(|_| held_lan) {
                    lan.hold_off(Instant::now() + Duration::from_secs(u64::from(self.ttl)));
                }
                tracing::info!(
                    "{}: {} is dead ({}): its lease revoked in etcd in {} ms, so that the site fails over now",
                    self.name(),
                    death.name,
                    death.reason,
                    asked.elapsed().as_millis()
                );
            }
            Ok(Err(e)) => tracing::warn!(
                "{}: {} looks dead ({}), but etcd did not revoke its lease ({e}): nothing is taken over until etcd says so",
                self.name(),
                death.name,
                death.reason
            ),
            Err(_) => tracing::warn!(
                "{}: {} looks dead ({}), but etcd did not answer within {} ms: nothing is taken over until it does",
                self.name(),
                death.name,
                death.reason,
                self.request_timeout.as_millis()
            ),
        }
    }

    /// Resigns and revokes the lease (its keys go with it), each bounded in time.
    async fn leave(&mut self) {
        // First, so that the next gateway can take the addresses as soon as it is elected.
        if let Some(lan) = &self.lan {
            lan.release_now();
        }
        if let Some(leadership) = self.leadership.take() {
            let _ = tokio::time::timeout(LEAVE_TIMEOUT, self.store.resign(leadership)).await;
        }
        if let Some(lease) = self.lease.take() {
            match tokio::time::timeout(LEAVE_TIMEOUT, self.store.revoke(lease)).await {
                Ok(Ok(())) => tracing::info!("{}: left the fleet (lease revoked)", self.name()),
                Ok(Err(e)) => tracing::warn!(
                    "{}: leaving: {e}; the record goes when its lease expires",
                    self.name()
                ),
                Err(_) => tracing::warn!(
                    "{}: leaving: the store did not answer; the record goes when its lease expires",
                    self.name()
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn config(with_client_cert: bool) -> FleetConfig {
        FleetConfig {
            etcd: vec!["https://192.0.2.11:2379".into()],
            ca_file: Some("ca.pem".into()),
            client_cert: with_client_cert.then(|| tunneld_config::CertKey {
                cert_file: "gw.pem".into(),
                key_file: "gw.key".into(),
            }),
            insecure: false,
            prefix: "/f".into(),
            site: "b".into(),
            gateway: Some("b1".into()),
            advertise: vec!["192.0.2.22:51820".parse().unwrap()],
            subnets: vec!["10.2.0.0/24".parse().unwrap()],
            lease_ttl: 3,
            persistent_keepalive: 25,
            lan: None,
            mode: tunneld_config::SiteMode::default(),
            relay: false,
            relay_tls: None,
            tls_only: None,
        }
    }

    fn write(dir: &Path, name: &str, text: &str, mode: u32) {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    fn settings_error(dir: &Path, with_client_cert: bool) -> String {
        FleetSettings::from_config(&config(with_client_cert), dir)
            .map(|_| ())
            .unwrap_err()
            .to_string()
    }

    /// `tunneld check` and `up` read the files through this: a key that is not the
    /// certificate's, a key others may read, and a CA file without a certificate are
    /// refused, in one line that names the field.
    #[test]
    fn the_etcd_client_files_are_checked_before_etcd_is_asked() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        let gateway = rcgen::generate_simple_self_signed(vec!["b1".into()]).unwrap();
        let other = rcgen::generate_simple_self_signed(vec!["x".into()]).unwrap();
        write(dir, "ca.pem", &gateway.cert.pem(), 0o644);
        write(dir, "gw.pem", &gateway.cert.pem(), 0o644);
        write(dir, "gw.key", &gateway.signing_key.serialize_pem(), 0o600);
        FleetSettings::from_config(&config(true), dir).expect("a matching pair");

        write(dir, "gw.key", &other.signing_key.serialize_pem(), 0o600);
        let e = settings_error(dir, true);
        assert!(e.contains("fleet.cert_file/key_file: "), "{e}");
        assert!(e.contains("the key is not the certificate's"), "{e}");

        write(dir, "gw.key", &gateway.signing_key.serialize_pem(), 0o644);
        let e = settings_error(dir, true);
        assert!(e.contains("fleet.key_file: "), "{e}");
        assert!(e.contains("readable by group or others (mode 644)"), "{e}");

        write(dir, "ca.pem", "not a certificate\n", 0o644);
        let e = settings_error(dir, false);
        assert!(e.contains("fleet.ca_file: "), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}
