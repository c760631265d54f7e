//! tunneld's TLS tunnels: TCP forwarding over TLS 1.3 (`[[tls.forward]]` accepts plaintext
//! TCP and carries it over TLS to another tunneld, whose `[[tls.listen]]` accepts the TLS and
//! forwards the plaintext on) and WireGuard over TLS (a peer's datagrams on a TLS stream).
//!
//! A thread per listener accepts; a short-lived thread per connection connects and runs the
//! handshake, then hands the connection to the relay workers, one event loop per CPU, which
//! relay both directions with non-blocking sockets (`pool.rs`, `relay.rs`), records sealed and
//! opened in place by tunneld's own record layer ([`records`]) once rustls's handshake is
//! done (`stream.rs`). The TLS settings of each listener sit behind a lock taken once per
//! accepted connection, so SIGHUP can swap in re-read certificates while live connections
//! keep the ones they started with.
//!
//! The crate knows nothing of the gateway that runs it: [`TlsService`] takes the TLS
//! sections of a config (`tunneld-config`), and WireGuard over TLS reaches the WireGuard
//! side only through the [`WireGuardPeers`] a caller passes in.

// Input from the network and from certificate and key files must never panic: no unwrap or
// expect outside tests.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![deny(missing_docs)]

mod datagrams;
use datagrams::ClientStop;
pub use datagrams::{Redirect, RedirectSlot};
pub mod groups;
mod handshake;
mod pool;
pub mod records;
mod relay;
mod stream;

use anyhow::Context;
use handshake::ListenerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tunneld_config::{
    CertKey, Config, Endpoint, PeerTls, TlsConfig, TlsForward, TlsListen, TlsTarget,
};
use tunneld_crypto::PublicKey;

/// Connections one listener relays at once; more are accepted and closed at once, with a
/// warning, so a flood cannot exhaust threads or memory.
const MAX_CONNECTIONS: usize = 4096;
/// Failed connections logged one by one per listener; after these, only every power of two
/// (the rest at debug level).
const FAILURES_LOGGED: u64 = 10;
/// How long a TCP connect or a TLS handshake may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest private key file read (an RSA-8192 key in PEM is about 6 KiB).
const MAX_KEY_FILE: u64 = 64 * 1024;

/// One listener's counters (`[metrics]`), shared by its accept thread and its connections.
#[derive(Debug, Default)]
pub struct ListenerStats {
    /// Connections accepted and taken on (not those closed at once over the limit).
    pub accepted: AtomicU64,
    /// Connections open now.
    pub open: AtomicUsize,
    /// Connections that ended with an error (handshake, connect, a cut stream, ...).
    pub failed: AtomicU64,
    /// Connections closed at once because `MAX_CONNECTIONS` were open.
    pub refused: AtomicU64,
    /// Plaintext bytes that went into TLS.
    pub to_tls_bytes: AtomicU64,
    /// Plaintext bytes that came out of TLS.
    pub from_tls_bytes: AtomicU64,
}

/// Every listener's counters by name (`tls.forward[0]`, `tls.listen[1]`, ...), and the relay
/// workers' loads, for `[metrics]`.
#[derive(Debug, Clone, Default)]
pub struct TlsStats {
    /// Each listener's name and counters, in the config's order (forwards, then listens).
    pub listeners: Vec<(String, Arc<ListenerStats>)>,
}

impl TlsStats {
    /// How many connections each relay worker carries (empty before the first connection).
    pub fn relay_loads(&self) -> Vec<usize> {
        pool::RelayPool::loads().unwrap_or_default()
    }
}

/// The TLS listeners and forwarders: bound by [`TlsService::bind`], accepting once
/// [`TlsService::serve`] has run.
pub struct TlsService {
    forwards: Vec<(TlsForward, Arc<RwLock<Arc<ClientConfig>>>)>,
    listens: Vec<(TlsListen, Arc<RwLock<Arc<ListenerConfig>>>)>,
    base: std::path::PathBuf,
    /// Bound listeners whose accept threads have not started yet.
    unstarted: Vec<(TcpListener, Side, String, Arc<ListenerStats>)>,
    stats: TlsStats,
    /// Set by `stop`: the accept threads end at their next wake-up.
    stopping: Arc<std::sync::atomic::AtomicBool>,
    /// Where the started listeners listen, to wake them for `stop`.
    listening: Vec<SocketAddr>,
    /// How many relay workers to start with the process's first relayed connection.
    relay_workers: usize,
    /// What may move a WireGuard-over-TLS stream to another port (a fleet relay's).
    redirect: Arc<RedirectSlot>,
}

impl std::fmt::Debug for TlsService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsService")
            .field("forwards", &self.forwards.len())
            .field("listens", &self.listens.len())
            .finish()
    }
}

/// The bridge address of each peer on TLS (by peer index), and what starts their threads.
pub type PeerTransports = (Vec<(usize, SocketAddr)>, Vec<Starter>);

/// Work that starts a thread, held until privileges are dropped: threads inherit the
/// capabilities of the thread that starts them.
pub type Starter = Box<dyn FnOnce() -> anyhow::Result<()> + Send>;

/// What WireGuard over TLS asks of the WireGuard side whose peers it carries (the gateway's
/// workers), passed in so that this crate needs no gateway. Before the WireGuard side has
/// started, requests are dropped and traffic reads [`PeerTraffic::NotStarted`].
pub trait WireGuardPeers: Send + Sync {
    /// Asks for a handshake with `peer` at the next timer tick: its TLS stream has just
    /// (re)connected, and WireGuard should not wait for its own retry.
    fn request_handshake(&self, peer: &PublicKey);
    /// The bytes sent to and received from `peer` so far, over every worker.
    fn peer_traffic(&self, peer: &PublicKey) -> PeerTraffic;
    /// Sends `peer`'s datagrams to `endpoint` from now on (a TLS bridge's loopback socket).
    fn move_peer(&self, peer: &PublicKey, endpoint: SocketAddr);
}

/// One peer's WireGuard byte counters, as [`WireGuardPeers::peer_traffic`] reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerTraffic {
    /// The WireGuard side has not started yet: ask again later.
    NotStarted,
    /// The WireGuard side has stopped: nothing more will move.
    Stopped,
    /// Bytes sent to the peer and received from it (zero for a peer no worker knows).
    Counted {
        /// Bytes sent to the peer.
        sent: u64,
        /// Bytes received from it.
        received: u64,
    },
}

/// The crypto every TLS connection uses: aws-lc-rs, whose default key exchange groups lead
/// with the post-quantum hybrid X25519MLKEM768 (classic X25519 and P-256 stay as fallbacks),
/// except for the record crypto (where the bytes go) on CPUs where ring's is the faster.
///
/// Its key exchange groups are exactly the aws-lc-rs provider's (rustls's default). Those of
/// `groups.rs` (secp521r1, X448, ffdhe2048 to 8192) are offered only by a listener that lists
/// them in `groups` ([`with_groups`]).
fn provider() -> Arc<CryptoProvider> {
    let mut aws_lc = rustls::crypto::aws_lc_rs::default_provider();
    // TLS 1.3 only, whichever rustls features the rest of the binary asks for (tonic, for
    // the fleet's etcd client, compiles TLS 1.2 in).
    aws_lc.cipher_suites.retain(|suite| suite.tls13().is_some());
    if !ring_has_faster_aes_gcm() {
        return Arc::new(aws_lc);
    }
    use rustls::crypto::ring::cipher_suite;
    Arc::new(CryptoProvider {
        // aws-lc-rs's TLS 1.3 suites, in its order.
        cipher_suites: vec![
            cipher_suite::TLS13_AES_256_GCM_SHA384,
            cipher_suite::TLS13_AES_128_GCM_SHA256,
            cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
        ],
        ..aws_lc
    })
}

/// `provider` offering only the groups `names` (spelled as in `LISTEN_GROUPS`), in that order:
/// its own groups and the opt-in ones of `groups.rs`.
fn with_groups(provider: &CryptoProvider, names: &[&str]) -> anyhow::Result<CryptoProvider> {
    let kx_groups = names
        .iter()
        .map(|name| {
            provider
                .kx_groups
                .iter()
                .chain(groups::OPT_IN.iter())
                .find(|group| group_name(**group).eq_ignore_ascii_case(name))
                .copied()
                .ok_or_else(|| anyhow::anyhow!("groups: {name} is not offered by this build"))
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(CryptoProvider {
        kx_groups,
        ..provider.clone()
    })
}

/// A group's IANA name, as rustls spells it (`X25519`, `secp256r1`, `FFDHE2048`).
fn group_name(group: &dyn rustls::crypto::SupportedKxGroup) -> String {
    format!("{:?}", group.name())
}

/// Whether this CPU runs ring's AES-GCM code for 256-bit VAES with AVX2, which aws-lc lacks:
/// aws-lc has AES-NI code, and AVX-512 code for CPUs that also have AVX-512 (its test, in
/// its `gcm.c`, is repeated here). On such a CPU ring seals a 16 KiB record 1.8× as fast
/// (`cargo bench --bench aead`, docs/benchmarks.md).
fn ring_has_faster_aes_gcm() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let vaes = is_x86_feature_detected!("vaes")
            && is_x86_feature_detected!("vpclmulqdq")
            && is_x86_feature_detected!("avx2");
        let aws_lc_avx512 = is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512ifma");
        vaes && !aws_lc_avx512
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Every problem with the certificate, key and CA files `tls` names, one line each; used by
/// `tunneld check` and before `up` touches anything.
pub fn check_files(config: &Config, base: &Path) -> Vec<String> {
    let tls = &config.tls;
    let mut errors = Vec::new();
    for (i, p) in config.peers.iter().enumerate() {
        if let Some(t) = &p.tls {
            if let Err(e) = client_config(&t.ca_file, t.client_cert.as_ref(), base) {
                errors.push(format!("peer[{i}]: tls_{e:#}"));
            }
        }
    }
    for (i, f) in tls.forwards.iter().enumerate() {
        if let Err(e) = client_config(&f.ca_file, f.client_cert.as_ref(), base) {
            errors.push(format!("tls.forward[{i}]: {e:#}"));
        }
    }
    for (i, l) in tls.listens.iter().enumerate() {
        if let Err(e) = server_config(l, base) {
            errors.push(format!("tls.listen[{i}]: {e:#}"));
        }
    }
    errors
}

fn certificates(
    base: &Path,
    file: &Path,
    field: &str,
) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let path = base.join(file);
    let certs = CertificateDer::pem_file_iter(&path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| anyhow::anyhow!("{field}: {}: {}", path.display(), pem_error(e)))?;
    if certs.is_empty() {
        anyhow::bail!("{field}: {}: no certificate (PEM) in it", path.display());
    }
    Ok(certs)
}

fn pem_error(e: rustls::pki_types::pem::Error) -> String {
    match e {
        rustls::pki_types::pem::Error::Io(io) => io.to_string(),
        other => format!("not valid PEM ({other:?})"),
    }
}

fn roots(base: &Path, file: &Path, field: &str) -> anyhow::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for (n, cert) in certificates(base, file, field)?.into_iter().enumerate() {
        roots.add(cert).map_err(|e| {
            anyhow::anyhow!(
                "{field}: {}: certificate {} is not a usable CA: {e}",
                base.join(file).display(),
                n + 1
            )
        })?;
    }
    Ok(roots)
}

/// A private key from a PEM file that only its owner can read (like WireGuard key files).
fn private_key(base: &Path, file: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    let path = base.join(file);
    let shown = path.display();
    let pem = tunneld_crypto::read_secret_file(&path, MAX_KEY_FILE)
        .map_err(|e| anyhow::anyhow!("key_file: {shown}: {}", e.reason()))?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        anyhow::anyhow!(
            "key_file: {shown}: no private key (PEM) in it ({})",
            pem_error(e)
        )
    })
}

fn cert_and_key(
    base: &Path,
    ck: &CertKey,
) -> anyhow::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    Ok((
        certificates(base, &ck.cert_file, "cert_file")?,
        private_key(base, &ck.key_file)?,
    ))
}

fn client_config(
    ca_file: &Path,
    client_cert: Option<&CertKey>,
    base: &Path,
) -> anyhow::Result<Arc<ClientConfig>> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3")?
        .with_root_certificates(roots(base, ca_file, "ca_file")?);
    let mut config = match client_cert {
        None => builder.with_no_client_auth(),
        Some(ck) => {
            let (chain, key) = cert_and_key(base, ck)?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| anyhow::anyhow!("cert_file/key_file: {e}"))?
        }
    };
    // Forwarded connections hand their secrets to tunneld's record layer (`records.rs`).
    config.enable_secret_extraction = true;
    Ok(Arc::new(config))
}

fn server_config(l: &TlsListen, base: &Path) -> anyhow::Result<Arc<ListenerConfig>> {
    let verifier = match &l.client_ca_file {
        None => None,
        Some(file) => Some(
            WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots(base, file, "client_ca_file")?),
                provider(),
            )
            .build()
            .map_err(|e| anyhow::anyhow!("client_ca_file: {e}"))?,
        ),
    };
    let (chain, key) = cert_and_key(base, &l.cert)?;
    let provider = match &l.groups {
        None => provider(),
        Some(names) => Arc::new(with_groups(&provider(), names)?),
    };
    let config = ListenerConfig::new(provider, |provider| -> anyhow::Result<_> {
        let builder = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .context("TLS 1.3")?;
        let builder = match &verifier {
            None => builder.with_no_client_auth(),
            Some(verifier) => builder.with_client_cert_verifier(verifier.clone()),
        };
        let mut config = builder
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| anyhow::anyhow!("cert_file/key_file: {e}"))?;
        config.enable_secret_extraction = true;
        Ok(config)
    })?;
    Ok(Arc::new(config))
}

impl TlsService {
    /// Binds every listener (all or none: an address in use fails the start); `serve` starts
    /// accepting. `wg_port` is this tunneld's WireGuard port, for `forward_to = "wireguard"` (set once
    /// the interface is up; streams that arrive before wait for nothing: their datagrams
    /// are dropped, and WireGuard retries). `relay_workers` is how many relay event loops
    /// to start with the process's first forwarded connection (one per CPU it may use).
    pub fn bind(
        tls: &TlsConfig,
        base: &Path,
        wg_port: Arc<OnceLock<u16>>,
        relay_workers: usize,
    ) -> anyhow::Result<TlsService> {
        let mut forwards = Vec::new();
        let mut bound = Vec::new();
        let mut listener_stats = Vec::new();
        for (i, f) in tls.forwards.iter().enumerate() {
            let config = Arc::new(RwLock::new(
                client_config(&f.ca_file, f.client_cert.as_ref(), base)
                    .with_context(|| format!("tls.forward[{i}]"))?,
            ));
            let listener = TcpListener::bind(f.listen)
                .with_context(|| format!("tls.forward[{i}]: cannot listen on {}", f.listen))?;
            let name = format!("tls.forward[{i}]");
            let stats = Arc::new(ListenerStats::default());
            listener_stats.push((name.clone(), stats.clone()));
            bound.push((
                listener,
                Side::Client {
                    forward: f.clone(),
                    config: config.clone(),
                },
                name,
                stats,
            ));
            forwards.push((f.clone(), config));
        }
        let mut listens = Vec::new();
        let redirect = Arc::new(RedirectSlot::default());
        for (i, l) in tls.listens.iter().enumerate() {
            let config = Arc::new(RwLock::new(
                server_config(l, base).with_context(|| format!("tls.listen[{i}]"))?,
            ));
            let listener = TcpListener::bind(l.listen)
                .with_context(|| format!("tls.listen[{i}]: cannot listen on {}", l.listen))?;
            let name = format!("tls.listen[{i}]");
            let stats = Arc::new(ListenerStats::default());
            listener_stats.push((name.clone(), stats.clone()));
            bound.push((
                listener,
                Side::Server {
                    listen: l.clone(),
                    config: config.clone(),
                    wg_port: wg_port.clone(),
                    redirect: redirect.clone(),
                },
                name,
                stats,
            ));
            listens.push((l.clone(), config));
        }
        Ok(TlsService {
            forwards,
            listens,
            base: base.to_path_buf(),
            unstarted: bound,
            stats: TlsStats {
                listeners: listener_stats,
            },
            stopping: Arc::default(),
            listening: Vec::new(),
            relay_workers,
            redirect,
        })
    }

    /// Where a gateway puts what may move a WireGuard-over-TLS stream's datagrams to another
    /// port on loopback (a fleet relay's, on a side's registration).
    pub fn redirect_slot(&self) -> Arc<RedirectSlot> {
        self.redirect.clone()
    }

    /// Starts accepting on every bound listener: a thread each. Call it once privileges are
    /// dropped.
    pub fn serve(&mut self) -> anyhow::Result<()> {
        for (listener, side, name, stats) in self.unstarted.drain(..) {
            if let Ok(addr) = listener.local_addr() {
                self.listening.push(addr);
            }
            let stopping = self.stopping.clone();
            let relay_workers = self.relay_workers;
            match &side {
                Side::Client { forward, .. } => tracing::info!(
                    "{name}: accepting plaintext on {} for TLS to {} ({})",
                    forward.listen,
                    forward.connect,
                    forward.server_name
                ),
                Side::Server { listen, .. } => tracing::info!(
                    "{name}: accepting TLS on {}{} for {}",
                    listen.listen,
                    if listen.client_ca_file.is_some() {
                        " (client certificates required)"
                    } else {
                        ""
                    },
                    listen.forward_to
                ),
            }
            std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || accept_loop(listener, side, name, stats, stopping, relay_workers))
                .context("cannot start a TLS listener thread")?;
        }
        Ok(())
    }

    /// Stops accepting: each listener's thread ends and its socket closes. Connections
    /// already forwarding carry on until they end.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        for addr in &self.listening {
            wake_listener(*addr);
        }
    }

    /// The listeners' counters, for `[metrics]`.
    pub fn stats(&self) -> TlsStats {
        self.stats.clone()
    }

    /// Reads every certificate, key and CA file again; new connections use them, live ones
    /// keep theirs. All or nothing: on any error the old settings stay and the error is
    /// returned (one line per problem).
    pub fn reload(&self) -> Result<(), String> {
        let mut errors = Vec::new();
        let mut clients = Vec::new();
        for (i, (f, _)) in self.forwards.iter().enumerate() {
            match client_config(&f.ca_file, f.client_cert.as_ref(), &self.base) {
                Ok(c) => clients.push(c),
                Err(e) => errors.push(format!("tls.forward[{i}]: {e:#}")),
            }
        }
        let mut servers = Vec::new();
        for (i, (l, _)) in self.listens.iter().enumerate() {
            match server_config(l, &self.base) {
                Ok(c) => servers.push(c),
                Err(e) => errors.push(format!("tls.listen[{i}]: {e:#}")),
            }
        }
        if !errors.is_empty() {
            return Err(errors.join("\n"));
        }
        for ((_, slot), new) in self.forwards.iter().zip(clients) {
            *slot.write().unwrap_or_else(|p| p.into_inner()) = new;
        }
        for ((_, slot), new) in self.listens.iter().zip(servers) {
            *slot.write().unwrap_or_else(|p| p.into_inner()) = new;
        }
        Ok(())
    }
}

enum Side {
    Client {
        forward: TlsForward,
        config: Arc<RwLock<Arc<ClientConfig>>>,
    },
    Server {
        listen: TlsListen,
        config: Arc<RwLock<Arc<ListenerConfig>>>,
        wg_port: Arc<OnceLock<u16>>,
        redirect: Arc<RedirectSlot>,
    },
}

fn accept_loop(
    listener: TcpListener,
    side: Side,
    name: String,
    stats: Arc<ListenerStats>,
    stopping: Arc<std::sync::atomic::AtomicBool>,
    relay_workers: usize,
) {
    let side = Arc::new(side);
    loop {
        let accepted = listener.accept();
        if stopping.load(Ordering::SeqCst) {
            tracing::debug!("{name}: stopped accepting");
            return;
        }
        let (stream, peer) = match accepted {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and the like: wait a little rather than spin.
                tracing::warn!("{name}: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        if stats.open.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
            let refused = stats.refused.fetch_add(1, Ordering::Relaxed) + 1;
            if refused.is_power_of_two() {
                tracing::warn!(
                    "{name}: {MAX_CONNECTIONS} connections already open; closed {refused} new one(s)"
                );
            }
            continue;
        }
        stats.open.fetch_add(1, Ordering::Relaxed);
        stats.accepted.fetch_add(1, Ordering::Relaxed);
        let (side, name2, counters) = (side.clone(), name.clone(), stats.clone());
        let relay_stats = stats.clone();
        let end = move |result: anyhow::Result<()>| {
            match result {
                Ok(()) => {}
                Err(e) if e.downcast_ref::<handshake::ClosedEarly>().is_some() => {
                    tracing::debug!("{name2}: connection from {peer}: {e:#}")
                }
                Err(e) => {
                    // The first few, then every power of two: a flood of bad connections
                    // (scanners, an attack) must not become a flood of log lines.
                    let n = counters.failed.fetch_add(1, Ordering::Relaxed) + 1;
                    if n <= FAILURES_LOGGED || n.is_power_of_two() {
                        tracing::warn!(
                            "{name2}: connection from {peer}: {e:#} ({n} failed so far)"
                        );
                    } else {
                        tracing::debug!("{name2}: connection from {peer}: {e:#}");
                    }
                }
            }
            counters.open.fetch_sub(1, Ordering::Relaxed);
        };
        // The set-up (connect, handshake) blocks, with deadlines, on a thread of its own;
        // the relay then moves to the relay workers.
        let spawned = std::thread::Builder::new()
            .name(format!("{name}-conn"))
            .spawn(move || match connection(&side, stream, peer, relay_stats) {
                Ok(Some((relay, what))) => match pool::RelayPool::get(relay_workers) {
                    Ok(pool) => pool.relay(relay, Box::new(move |r| end(r.context(what)))),
                    Err(e) => end(Err(e)),
                },
                Ok(None) => end(Ok(())),
                Err(e) => end(Err(e)),
            });
        if let Err(e) = spawned {
            stats.open.fetch_sub(1, Ordering::Relaxed);
            tracing::warn!("{name}: cannot start a connection thread: {e}");
        }
    }
}

/// Sets up one accepted connection: for forwarding, the TCP connect and TLS handshake,
/// returning the relay to run (and what to call it in errors); a WireGuard-over-TLS stream
/// is bridged here, to its end (`None`).
fn connection(
    side: &Side,
    accepted: TcpStream,
    peer: SocketAddr,
    stats: Arc<ListenerStats>,
) -> anyhow::Result<Option<(relay::Relay, String)>> {
    accepted.set_nodelay(true)?;
    match side {
        Side::Client { forward, config } => {
            let config = config.read().unwrap_or_else(|p| p.into_inner()).clone();
            let remote = connect(&forward.connect)?;
            let name = ServerName::try_from(forward.server_name.clone())
                .map_err(|e| anyhow::anyhow!("server_name: {e}"))?;
            let conn = rustls::client::UnbufferedClientConnection::new(config, name)
                .map_err(|e| anyhow::anyhow!("TLS set-up: {e}"))?;
            let established = handshake::handshake_for_records(
                handshake::Unbuffered::Client(conn),
                &remote,
                ring_has_faster_aes_gcm(),
            )
            .with_context(|| {
                format!(
                    "TLS handshake with {} ({}) failed",
                    forward.connect, forward.server_name
                )
            })?;
            tracing::debug!(%peer, remote = %forward.connect, "TLS connection up");
            let relay = relay::Relay::new(accepted, remote, established, stats)?;
            Ok(Some((relay, format!("TLS to {}", forward.connect))))
        }
        Side::Server {
            listen,
            config,
            wg_port,
            redirect,
        } => {
            let config = config.read().unwrap_or_else(|p| p.into_inner()).clone();
            let conn = handshake::Unbuffered::server(&config);
            let established =
                handshake::handshake_for_records(conn, &accepted, ring_has_faster_aes_gcm())
                    .context("TLS handshake failed")?;
            match &listen.forward_to {
                TlsTarget::Tcp(to) => {
                    let target = connect(to)?;
                    tracing::debug!(%peer, target = %to, "TLS connection up");
                    let relay = relay::Relay::new(target, accepted, established, stats)?;
                    Ok(Some((relay, format!("forwarding to {to}"))))
                }
                TlsTarget::WireGuard => {
                    let mut udp = datagrams::bridge_socket().context("bridge socket")?;
                    tracing::info!(%peer, "WireGuard over TLS: stream accepted");
                    let target = datagrams::UdpPeer::Port(wg_port.clone(), redirect.clone());
                    datagrams::bridge(&mut udp, &target, &mut None, accepted, established)
                        .context("WireGuard over TLS")?;
                    Ok(None)
                }
            }
        }
    }
}

/// Prepares the client side of every peer with `transport = "tls"`: a loopback bridge
/// socket each, whose address becomes the peer's endpoint (returned by peer index), and a
/// starter for the thread that keeps a TLS stream to the peer's `endpoint` up. Peers with
/// `transport = "auto"` get a watcher instead, which moves them to TLS if UDP goes
/// unanswered (see `watch_udp`). The starters run once privileges are dropped.
pub fn prepare_peer_transports(
    config: &Config,
    base: &Path,
    peers: Arc<dyn WireGuardPeers>,
) -> anyhow::Result<PeerTransports> {
    let mut endpoints = Vec::new();
    let mut starters: Vec<Starter> = Vec::new();
    for (i, peer) in config.peers.iter().enumerate() {
        let (Some(tls), Some(endpoint)) = (&peer.tls, &peer.endpoint) else {
            continue;
        };
        let name = format!("peer[{i}]");
        let client = client_config(&tls.ca_file, tls.client_cert.as_ref(), base)
            .with_context(|| format!("{name}: tls"))?;
        let transport = TlsTransport {
            name: name.clone(),
            remote: tls.fallback.clone().unwrap_or_else(|| endpoint.clone()),
            tls: tls.clone(),
            client,
            key: peer.public_key,
            peers: peers.clone(),
        };
        if tls.fallback.is_some() {
            tracing::info!(
                "{name}: UDP to {endpoint}; WireGuard over TLS to {} if UDP goes unanswered for {FALLBACK_AFTER:?}",
                transport.remote
            );
            starters.push(Box::new(move || {
                std::thread::Builder::new()
                    .name(format!("{name}-watch"))
                    .spawn(move || watch_udp(transport))
                    .context("cannot start a transport watcher thread")?;
                Ok(())
            }));
            continue;
        }
        let udp = datagrams::bridge_socket().context("cannot make a bridge socket")?;
        endpoints.push((i, udp.local_addr()));
        tracing::info!(
            "{name}: WireGuard over TLS to {} ({}) through {}",
            transport.remote,
            tls.server_name,
            udp.local_addr()
        );
        starters.push(Box::new(move || {
            transport.start(udp, Arc::new(ClientStop::default()))
        }));
    }
    Ok((endpoints, starters))
}

/// How long a `transport = "auto"` peer may go without a byte back over UDP, while
/// WireGuard keeps sending to it, before it moves to TLS (three handshake attempts).
const FALLBACK_AFTER: Duration = Duration::from_secs(15);
/// Bytes sent without an answer that show WireGuard was trying (two handshake initiations),
/// so that an idle peer is not taken for an unreachable one.
const UNANSWERED_BYTES: u64 = 2 * 148;

/// One peer's WireGuard-over-TLS client side, ready to start.
struct TlsTransport {
    name: String,
    remote: Endpoint,
    tls: PeerTls,
    client: Arc<ClientConfig>,
    key: PublicKey,
    peers: Arc<dyn WireGuardPeers>,
}

impl TlsTransport {
    /// Starts the thread that keeps the stream up and bridges it to `udp`, until `stop`.
    fn start(
        self,
        udp: tunneld_dataplane::udp::UdpSocket,
        stop: Arc<ClientStop>,
    ) -> anyhow::Result<()> {
        let TlsTransport {
            name,
            remote,
            tls,
            client,
            key,
            peers,
        } = self;
        let connected = move || peers.request_handshake(&key);
        let connect = move || -> anyhow::Result<(TcpStream, handshake::Established)> {
            let stream = connect(&remote)?;
            let server = ServerName::try_from(tls.server_name.clone())
                .map_err(|e| anyhow::anyhow!("tls_server_name: {e}"))?;
            let conn = rustls::client::UnbufferedClientConnection::new(client.clone(), server)
                .map_err(|e| anyhow::anyhow!("TLS set-up: {e}"))?;
            let established = handshake::handshake_for_records(
                handshake::Unbuffered::Client(conn),
                &stream,
                ring_has_faster_aes_gcm(),
            )
            .with_context(|| format!("TLS handshake with {remote} ({}) failed", tls.server_name))?;
            Ok((stream, established))
        };
        std::thread::Builder::new()
            .name(format!("{name}-tls"))
            .spawn(move || datagrams::run_client(name, udp, connect, connected, &stop))
            .context("cannot start a TLS transport thread")?;
        Ok(())
    }
}

/// Watches a `transport = "auto"` peer once a second. When nothing has come back from it for
/// `FALLBACK_AFTER` while WireGuard sent it at least `UNANSWERED_BYTES`, UDP is taken to be
/// blocked: the peer moves to a TLS bridge for good (until tunneld restarts) and handshakes
/// there at once. Ends with the worker.
fn watch_udp(transport: TlsTransport) {
    let key = transport.key;
    let mut answered_at = std::time::Instant::now();
    let mut last: Option<(u64, u64)> = None;
    let mut sent_since_answer = 0u64;
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let (tx, rx) = match transport.peers.peer_traffic(&key) {
            PeerTraffic::NotStarted => continue,
            PeerTraffic::Stopped => return,
            PeerTraffic::Counted { sent, received } => (sent, received),
        };
        match last {
            Some((_, last_rx)) if rx != last_rx => {
                answered_at = std::time::Instant::now();
                sent_since_answer = 0;
            }
            Some((last_tx, _)) => sent_since_answer += tx.saturating_sub(last_tx),
            None => {}
        }
        last = Some((tx, rx));
        if answered_at.elapsed() < FALLBACK_AFTER || sent_since_answer < UNANSWERED_BYTES {
            continue;
        }
        let name = transport.name.clone();
        let bridge = match datagrams::bridge_socket().map(|u| (u.local_addr(), u)) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!("{name}: cannot make a bridge socket for the TLS fallback: {e}");
                return;
            }
        };
        tracing::warn!(
            "{name}: no answer over UDP for {:?}; falling back to WireGuard over TLS to {}",
            answered_at.elapsed(),
            transport.remote
        );
        let (addr, udp) = bridge;
        let peers = transport.peers.clone();
        if let Err(e) = transport.start(udp, Arc::new(ClientStop::default())) {
            tracing::error!("{name}: {e:#}");
            return;
        }
        peers.move_peer(&key, addr);
        return;
    }
}

/// A WireGuard-over-TLS client side opened at run time (the fleet's, for a site that can
/// send only TCP): a loopback bridge socket, the peer's endpoint, and a thread that keeps a
/// TLS stream to `remote` up. Dropping it stops the thread.
pub struct Bridge {
    /// The bridge socket's address: what the peer's endpoint is set to.
    pub address: SocketAddr,
    stop: Arc<ClientStop>,
}

impl std::fmt::Debug for Bridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bridge")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.stop.stop();
    }
}

/// Opens a [`Bridge`] for the peer of `key` to the `[[tls.listen]]` at `remote`, whose
/// certificate must name `server_name` and lead to the CA in `ca_file`.
pub fn open_bridge(
    name: String,
    remote: SocketAddr,
    server_name: &str,
    ca_file: &Path,
    key: PublicKey,
    peers: Arc<dyn WireGuardPeers>,
) -> anyhow::Result<Bridge> {
    let client = client_config(ca_file, None, Path::new(""))?;
    let udp = datagrams::bridge_socket().context("cannot make a bridge socket")?;
    let address = udp.local_addr();
    let transport = TlsTransport {
        name,
        remote: Endpoint::Addr(remote),
        tls: PeerTls {
            server_name: server_name.to_string(),
            ca_file: ca_file.to_path_buf(),
            client_cert: None,
            fallback: None,
        },
        client,
        key,
        peers,
    };
    let stop = Arc::new(ClientStop::default());
    transport.start(udp, stop.clone())?;
    Ok(Bridge { address, stop })
}

/// Connects to `to` (resolving a host name each time), trying each address it has.
fn connect(to: &Endpoint) -> anyhow::Result<TcpStream> {
    let addrs: Vec<SocketAddr> = match to {
        Endpoint::Addr(a) => vec![*a],
        Endpoint::Host { host, port } => (host.as_str(), *port)
            .to_socket_addrs()
            .with_context(|| format!("cannot resolve {host}"))?
            .collect(),
    };
    let mut last = None;
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) => last = Some(e),
        }
    }
    match last {
        Some(e) => Err(anyhow::anyhow!("cannot connect to {to}: {e}")),
        None => Err(anyhow::anyhow!("cannot connect to {to}: no address")),
    }
}

/// Wakes a thread blocked in `accept` on `addr` (one listening on every address is reached
/// through loopback) by connecting once; the connection is closed at once.
pub fn wake_listener(addr: SocketAddr) {
    let mut target = addr;
    if target.ip().is_unspecified() {
        target.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let _ = std::net::TcpStream::connect_timeout(&target, Duration::from_secs(1));
}

/// Reads and drops what `sock` holds now (at most a few buffers' worth), so that closing it
/// sends a FIN, not a reset. (Here, not in `stream.rs`: the handshake uses it too.)
fn drain(mut sock: &TcpStream, buf: &mut [u8]) {
    for _ in 0..16 {
        match std::io::Read::read(&mut sock, buf) {
            Ok(1..) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener without `groups` offers exactly rustls's default provider's groups, which
    /// are the config's defaults; every name `groups` accepts resolves to its group, the
    /// opt-in ones included, in the config's order.
    #[test]
    fn the_configs_group_names_are_the_providers_groups() {
        let provider = provider();
        let names = |p: &CryptoProvider| -> Vec<String> {
            p.kx_groups.iter().map(|g| group_name(*g)).collect()
        };
        let offered = names(&provider);
        assert_eq!(
            offered,
            names(&rustls::crypto::aws_lc_rs::default_provider())
        );
        assert_eq!(
            offered,
            ["X25519MLKEM768", "X25519", "secp256r1", "secp384r1"]
        );
        let defaults = tunneld_config::DEFAULT_LISTEN_GROUPS;
        assert!(
            offered
                .iter()
                .zip(defaults)
                .all(|(o, d)| o.eq_ignore_ascii_case(d))
                && offered.len() == defaults.len(),
            "{offered:?} against {defaults:?}"
        );
        let known = tunneld_config::LISTEN_GROUPS;
        let every = names(&with_groups(&provider, known).unwrap());
        assert_eq!(every.len(), known.len());
        for (offered, known) in every.iter().zip(known) {
            assert!(
                offered.eq_ignore_ascii_case(known),
                "{offered} against {known}"
            );
        }
        let picked = with_groups(&provider, &["ffdhe2048", "X25519"]).unwrap();
        let names: Vec<String> = picked.kx_groups.iter().map(|g| group_name(*g)).collect();
        assert_eq!(names, ["FFDHE2048", "X25519"]);
    }
}
