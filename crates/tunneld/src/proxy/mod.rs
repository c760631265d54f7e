//! `tunneld proxy`: a WireGuard interface in user space (the `tunneld-userspace` engine: no
//! TUN, no root, no capability) serving proxies on local addresses: SOCKS5 (RFC 1928) with
//! CONNECT and UDP ASSOCIATE, an HTTP proxy (CONNECT and absolute-URI requests), and port
//! forwards both ways (a local port to an address in the tunnel, a port inside the tunnel to
//! a local address).
//!
//! [`ProxySettings`] come from a config file with a `[proxy]` section (README.md, "No root:
//! tunneld proxy"), checked by the same plan as `tunneld up`'s and `tunneld check`'s;
//! [`Proxy::start`] runs them on the calling tokio runtime.
//!
//! ```no_run
//! # async fn run() -> Result<(), tunneld::Error> {
//! use tunneld::proxy::{Proxy, ProxySettings};
//! let proxy = Proxy::start(ProxySettings::from_file("corp.toml")?).await?;
//! println!("SOCKS5 on {:?}", proxy.socks5_addr());
//! proxy.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Every connection is a task of the listener that took it; a listener's tasks end with it.
//! Buffers are bounded (two of [`RELAY_BUFFER`] bytes per connection), a client gets
//! [`ProxySettings::handshake_timeout`] to finish its handshake or request, and at most
//! [`ProxySettings::max_connections`] connections and UDP sessions are open at once.

mod forward;
mod http;
mod relay;
mod socks;
mod uapi;

use crate::error::Error;
use crate::metrics::{MetricsServer, MetricsServing};
use crate::plan::{self, Plan, Resolve};
use crate::uapi_server::{Serving, UapiServer};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tunneld_config::{Config, Endpoint, ProxyProtocol, ResolveWith};
use tunneld_userspace::{Tunnel, TunnelSettings};

/// The bytes a connection's relay holds in each direction.
pub const RELAY_BUFFER: usize = 32 * 1024;
/// The default for [`ProxySettings::handshake_timeout`].
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The default for [`ProxySettings::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// A proxy's settings: a config with a `[proxy]` section, validated, its key and users files
/// read and its endpoints resolved.
#[derive(Debug)]
pub struct ProxySettings {
    plan: Plan,
    handshake_timeout: Duration,
    max_connections: usize,
}

impl ProxySettings {
    /// Reads, validates and resolves a proxy config file. Relative file names are taken from
    /// its directory. Every problem is in the error, each naming its field.
    pub fn from_file(path: impl AsRef<Path>) -> Result<ProxySettings, Error> {
        let plan = plan::load(path.as_ref(), Resolve::Everything).map_err(Error::invalid_lines)?;
        ProxySettings::from_plan(plan)
    }

    /// Settings from a proxy config's text, with relative file names taken from `base_dir`.
    pub fn from_toml(text: &str, base_dir: impl AsRef<Path>) -> Result<ProxySettings, Error> {
        let plan = plan::load_text(text, base_dir.as_ref(), Resolve::Everything)
            .map_err(Error::invalid_lines)?;
        ProxySettings::from_plan(plan)
    }

    fn from_plan(plan: Plan) -> Result<ProxySettings, Error> {
        if plan.config.proxy.is_none() {
            return Err(Error::invalid(
                "proxy",
                "missing [proxy] section (what the proxy serves); a config without one is `tunneld up`'s",
            ));
        }
        if plan.wireguard.is_none() {
            return Err(Error::invalid("interface", "missing [interface] section"));
        }
        Ok(ProxySettings {
            plan,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        })
    }

    /// How long a client has to finish its SOCKS5 negotiation or send its HTTP request's
    /// head before it is disconnected. Default [`DEFAULT_HANDSHAKE_TIMEOUT`].
    pub fn handshake_timeout(mut self, timeout: Duration) -> ProxySettings {
        self.handshake_timeout = timeout;
        self
    }

    /// The most connections (and UDP sessions) open at once; more are closed as they come,
    /// with a log line. Default [`DEFAULT_MAX_CONNECTIONS`].
    pub fn max_connections(mut self, max: usize) -> ProxySettings {
        self.max_connections = max.max(1);
        self
    }

    /// The interface's name (it names the UAPI socket and the metrics' label).
    pub fn interface_name(&self) -> &str {
        self.plan
            .wireguard
            .as_ref()
            .map_or("", |w| w.interface.name.as_str())
    }

    /// The validated config.
    pub fn config(&self) -> &Config {
        &self.plan.config
    }
}

/// Which kind of listener took a connection (the metrics' `listener` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Socks5,
    Http,
    Forward,
    Reverse,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::Socks5, Kind::Http, Kind::Forward, Kind::Reverse];

    fn name(self) -> &'static str {
        match self {
            Kind::Socks5 => "socks5",
            Kind::Http => "http",
            Kind::Forward => "forward",
            Kind::Reverse => "reverse",
        }
    }
}

#[derive(Default)]
struct KindCounters {
    accepted: AtomicU64,
    active: AtomicU64,
    refused: AtomicU64,
}

#[derive(Default)]
struct Counters {
    kinds: [KindCounters; 4],
    /// Bytes from local clients into the tunnel, and back.
    to_tunnel: AtomicU64,
    from_tunnel: AtomicU64,
    udp_associations: AtomicU64,
    udp_associations_active: AtomicU64,
}

impl Counters {
    fn of(&self, kind: Kind) -> &KindCounters {
        &self.kinds[kind as usize]
    }
}

/// What every connection's task shares.
struct Shared {
    tunnel: Tunnel,
    resolve: ResolveWith,
    users: plan::ProxyUsers,
    handshake_timeout: Duration,
    slots: Arc<Semaphore>,
    max_connections: usize,
    counters: Counters,
    /// When the limit was last said to be reached (said at most every 10 s).
    limit_said: Mutex<Option<Instant>>,
}

/// A connection's place among the open ones; dropping it (however the task ends) frees it.
struct Slot {
    shared: Arc<Shared>,
    kind: Kind,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.shared
            .counters
            .of(self.kind)
            .active
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// Why a connection to a destination failed: its name, or the connection.
enum ConnectError {
    Resolve(io::Error),
    Connect(io::Error),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnectError::Resolve(e) => write!(f, "cannot resolve: {e}"),
            ConnectError::Connect(e) => write!(f, "cannot connect: {e}"),
        }
    }
}

impl Shared {
    /// A slot for a new connection of `kind`, or `None` at the limit (counted and said).
    fn admit(self: &Arc<Self>, kind: Kind) -> Option<Slot> {
        let counters = self.counters.of(kind);
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            counters.refused.fetch_add(1, Ordering::Relaxed);
            let mut said = self
                .limit_said
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if said.is_none_or(|at| at.elapsed() >= Duration::from_secs(10)) {
                *said = Some(Instant::now());
                tracing::warn!(
                    "proxy: {} connections open, the limit: new {} connections are closed until some end",
                    self.max_connections,
                    kind.name()
                );
            }
            return None;
        };
        counters.accepted.fetch_add(1, Ordering::Relaxed);
        counters.active.fetch_add(1, Ordering::Relaxed);
        Some(Slot {
            shared: self.clone(),
            kind,
            _permit: permit,
        })
    }

    /// The addresses of `host` (an IP address or a name, resolved as the config says).
    async fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        let found: Vec<SocketAddr> = match self.resolve {
            ResolveWith::Tunnel => self
                .tunnel
                .resolve(host)
                .await?
                .into_iter()
                .map(|ip| SocketAddr::new(ip, port))
                .collect(),
            ResolveWith::Local => tokio::net::lookup_host((host, port)).await?.collect(),
        };
        if found.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{host} has no address"),
            ));
        }
        Ok(found)
    }

    async fn resolve_endpoint(&self, to: &Endpoint) -> io::Result<Vec<SocketAddr>> {
        match to {
            Endpoint::Addr(addr) => Ok(vec![*addr]),
            Endpoint::Host { host, port } => self.resolve(host, *port).await,
        }
    }

    /// A TCP connection through the tunnel to `host:port`, each address tried in turn.
    async fn connect(
        &self,
        host: &str,
        port: u16,
    ) -> Result<tunneld_userspace::TcpStream, ConnectError> {
        let addrs = self
            .resolve(host, port)
            .await
            .map_err(ConnectError::Resolve)?;
        self.connect_any(&addrs).await
    }

    async fn connect_any(
        &self,
        addrs: &[SocketAddr],
    ) -> Result<tunneld_userspace::TcpStream, ConnectError> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
        for addr in addrs {
            match self.tunnel.tcp_connect(*addr).await {
                Ok(stream) => return Ok(stream),
                Err(e) => last = e,
            }
        }
        Err(ConnectError::Connect(last))
    }

    /// Whether `user`/`password` is an account of the users file (compared in constant
    /// time for the password).
    fn authenticates(&self, user: &[u8], password: &[u8]) -> bool {
        self.users
            .0
            .iter()
            .any(|(u, p)| u.as_bytes() == user && constant_time_eq(p.as_bytes(), password))
    }

    fn needs_auth(&self) -> bool {
        !self.users.0.is_empty()
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A task that stops when its handle is dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A running proxy: its tunnel, its listeners, the UAPI socket and the metrics. Stops on
/// [`Proxy::shutdown`] or when dropped.
pub struct Proxy {
    shared: Arc<Shared>,
    name: String,
    tasks: Vec<AbortOnDrop>,
    socks5: Option<SocketAddr>,
    http: Option<SocketAddr>,
    forwards: Vec<SocketAddr>,
    reverses: Vec<SocketAddr>,
    uapi: Option<(PathBuf, Serving)>,
    metrics: Option<(SocketAddr, MetricsServing)>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("interface", &self.name)
            .field("socks5", &self.socks5)
            .field("http", &self.http)
            .finish_non_exhaustive()
    }
}

/// A local address's listener failed to bind: the error names the config's field.
fn bind_error(field: &str, addr: SocketAddr, e: io::Error) -> Error {
    Error::Io {
        message: format!("{field}: cannot listen on {addr}: {e}"),
        source: e,
    }
}

impl Proxy {
    /// Starts the tunnel (binding its UDP port), the local listeners and, inside the
    /// tunnel, the reverse forwards' listeners, on the current tokio runtime (which must
    /// have I/O and time enabled); then the UAPI socket and the metrics, each on a thread.
    /// On an error nothing is left running.
    pub async fn start(settings: ProxySettings) -> Result<Proxy, Error> {
        let ProxySettings {
            plan,
            handshake_timeout,
            max_connections,
        } = settings;
        let (Some(proxy), Some(wireguard)) = (plan.config.proxy.clone(), plan.wireguard) else {
            return Err(Error::invalid("proxy", "missing [proxy] section"));
        };
        let name = wireguard.interface.name.clone();

        // Local listeners first: a port taken fails the start before anything runs.
        let mut tcp_listeners: Vec<(Kind, tokio::net::TcpListener, Option<Endpoint>)> = Vec::new();
        let mut udp_forwards: Vec<(tokio::net::UdpSocket, Endpoint)> = Vec::new();
        for (field, addr, kind) in [
            ("proxy.socks5", proxy.socks5, Kind::Socks5),
            ("proxy.http", proxy.http, Kind::Http),
        ] {
            if let Some(addr) = addr {
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|e| bind_error(field, addr, e))?;
                tcp_listeners.push((kind, listener, None));
            }
        }
        for (i, forward) in proxy.forwards.iter().enumerate() {
            let field = format!("proxy.forward[{i}].listen");
            match forward.protocol {
                ProxyProtocol::Tcp => {
                    let listener = tokio::net::TcpListener::bind(forward.listen)
                        .await
                        .map_err(|e| bind_error(&field, forward.listen, e))?;
                    tcp_listeners.push((Kind::Forward, listener, Some(forward.to.clone())));
                }
                ProxyProtocol::Udp => {
                    let socket = tokio::net::UdpSocket::bind(forward.listen)
                        .await
                        .map_err(|e| bind_error(&field, forward.listen, e))?;
                    udp_forwards.push((socket, forward.to.clone()));
                }
            }
        }

        let mut tunnel_settings =
            TunnelSettings::new(wireguard.device.private_key.clone()).mtu(wireguard.device.mtu);
        for address in &wireguard.interface.addresses {
            tunnel_settings = tunnel_settings.address(*address);
        }
        for peer in &wireguard.peers {
            tunnel_settings = tunnel_settings.peer(peer.clone());
        }
        for server in &proxy.dns {
            tunnel_settings = tunnel_settings.dns_server(*server);
        }
        let port = wireguard.device.listen_port;
        // Both families where the host has IPv6; IPv4 alone where it has not.
        let tunnel = match Tunnel::start(
            tunnel_settings
                .clone()
                .listen(SocketAddr::from(([0u16; 8], port))),
        ) {
            Ok(tunnel) => tunnel,
            Err(tunneld_userspace::Error::Bind { .. }) => {
                Tunnel::start(tunnel_settings.listen(SocketAddr::from(([0, 0, 0, 0], port))))
                    .map_err(|e| tunnel_error(&e))?
            }
            Err(e) => return Err(tunnel_error(&e)),
        };
        let listen_port = tunnel.local_addr().port();
        let shared = Arc::new(Shared {
            tunnel: tunnel.clone(),
            resolve: proxy.resolve,
            users: plan.proxy_users,
            handshake_timeout,
            slots: Arc::new(Semaphore::new(max_connections)),
            max_connections,
            counters: Counters::default(),
            limit_said: Mutex::new(None),
        });
        let mut running = Proxy {
            shared: shared.clone(),
            name: name.clone(),
            tasks: Vec::new(),
            socks5: None,
            http: None,
            forwards: Vec::new(),
            reverses: Vec::new(),
            uapi: None,
            metrics: None,
        };
        // From here, dropping `running` on an error stops what was started.
        for (kind, listener, to) in tcp_listeners {
            let addr = listener.local_addr().map_err(|e| Error::Io {
                message: format!("proxy: the listener has no address: {e}"),
                source: e,
            })?;
            match kind {
                Kind::Socks5 => running.socks5 = Some(addr),
                Kind::Http => running.http = Some(addr),
                _ => running.forwards.push(addr),
            }
            let shared = shared.clone();
            let task = match (kind, to) {
                (Kind::Socks5, _) => {
                    tracing::info!(interface = %name, "proxy: SOCKS5 on {addr}");
                    tokio::spawn(serve_tcp(listener, shared, kind, socks::serve))
                }
                (Kind::Http, _) => {
                    tracing::info!(interface = %name, "proxy: HTTP proxy on {addr}");
                    tokio::spawn(serve_tcp(listener, shared, kind, http::serve))
                }
                (_, to) => {
                    let Some(to) = to else { continue };
                    tracing::info!(interface = %name, "proxy: forwarding tcp {addr} to {to} in the tunnel");
                    let to = Arc::new(to);
                    tokio::spawn(serve_tcp(
                        listener,
                        shared,
                        kind,
                        move |shared, stream, from| forward::tcp(shared, stream, from, to.clone()),
                    ))
                }
            };
            running.tasks.push(AbortOnDrop(task));
        }
        for (socket, to) in udp_forwards {
            if let Ok(addr) = socket.local_addr() {
                running.forwards.push(addr);
                tracing::info!(interface = %name, "proxy: forwarding udp {addr} to {to} in the tunnel");
            }
            let task = tokio::spawn(forward::udp(shared.clone(), socket, to));
            running.tasks.push(AbortOnDrop(task));
        }
        for (i, reverse) in proxy.reverses.iter().enumerate() {
            let field = format!("proxy.reverse[{i}].listen");
            let task = match reverse.protocol {
                ProxyProtocol::Tcp => {
                    let listener = tunnel
                        .tcp_listen(reverse.listen)
                        .await
                        .map_err(|e| bind_error(&field, reverse.listen, e))?;
                    tokio::spawn(forward::reverse_tcp(shared.clone(), listener, reverse.to))
                }
                ProxyProtocol::Udp => {
                    let socket = tunnel
                        .udp_bind(reverse.listen)
                        .await
                        .map_err(|e| bind_error(&field, reverse.listen, e))?;
                    tokio::spawn(forward::reverse_udp(shared.clone(), socket, reverse.to))
                }
            };
            tracing::info!(interface = %name, "proxy: forwarding {} {} in the tunnel to {}", reverse.protocol.name(), reverse.listen, reverse.to);
            running.reverses.push(reverse.listen);
            running.tasks.push(AbortOnDrop(task));
        }

        let handle = tokio::runtime::Handle::current();
        let private_key = wireguard.device.private_key.clone();
        match uapi::socket_path(&name) {
            Ok(path) => {
                let server = UapiServer::bind_at(path.clone()).map_err(Error::system)?;
                let serving = server
                    .serve(uapi::answer(
                        handle.clone(),
                        tunnel.clone(),
                        private_key,
                        listen_port,
                    ))
                    .map_err(Error::system)?;
                tracing::info!(interface = %name, "proxy: UAPI socket at {}", path.display());
                running.uapi = Some((path, serving));
            }
            Err(why) => {
                tracing::warn!(interface = %name, "proxy: no UAPI socket (`wg` and `tunneld show` will not see it): {why}")
            }
        }
        if let Some(metrics) = &plan.config.metrics {
            let server = MetricsServer::bind(metrics.listen).map_err(Error::system)?;
            let addr = server.local_addr().unwrap_or(metrics.listen);
            let (shared, name, handle) = (shared.clone(), name.clone(), handle.clone());
            let serving = server
                .serve_with(move || render_metrics(&handle, &shared, &name, listen_port))
                .map_err(Error::system)?;
            running.metrics = Some((addr, serving));
        }

        let hosts: HashMap<_, _> = plan
            .config
            .peers
            .iter()
            .filter_map(|peer| match &peer.endpoint {
                Some(Endpoint::Host { host, port }) => {
                    Some((peer.public_key, (host.clone(), *port)))
                }
                _ => None,
            })
            .collect();
        if !hosts.is_empty() {
            crate::reresolve::start_for_tunnel(tunnel.clone(), hosts).map_err(|e| Error::Io {
                message: format!("cannot start the thread that re-resolves endpoints: {e}"),
                source: e,
            })?;
        }
        tracing::info!(interface = %name, "proxy: tunnel {} on UDP port {listen_port}", tunnel.public_key());
        Ok(running)
    }

    /// The SOCKS5 listener's address, if the config has one.
    pub fn socks5_addr(&self) -> Option<SocketAddr> {
        self.socks5
    }

    /// The HTTP proxy's address, if the config has one.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http
    }

    /// The local addresses of the `[[proxy.forward]]` listeners (TCP ones first, then UDP).
    pub fn forward_addrs(&self) -> &[SocketAddr] {
        &self.forwards
    }

    /// The addresses inside the tunnel of the `[[proxy.reverse]]` listeners.
    pub fn reverse_addrs(&self) -> &[SocketAddr] {
        &self.reverses
    }

    /// Where the UAPI socket is (`wg`, `tunneld show`), if one could be made.
    pub fn uapi_socket(&self) -> Option<&Path> {
        self.uapi.as_ref().map(|(path, _)| path.as_path())
    }

    /// The metrics listener's address, if the config has `[metrics]`.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|(addr, _)| *addr)
    }

    /// The WireGuard listen port (UDP).
    pub fn listen_port(&self) -> u16 {
        self.shared.tunnel.local_addr().port()
    }

    /// The interface's name.
    pub fn interface_name(&self) -> &str {
        &self.name
    }

    /// The tunnel the proxy runs (its peers can be changed through it).
    pub fn tunnel(&self) -> &Tunnel {
        &self.shared.tunnel
    }

    /// Connections (and UDP sessions) open now.
    pub fn active_connections(&self) -> u64 {
        Kind::ALL
            .iter()
            .map(|k| self.shared.counters.of(*k).active.load(Ordering::Relaxed))
            .sum()
    }

    /// Stops the listeners and every connection (closed, not drained), the tunnel, the
    /// UAPI socket and the metrics.
    pub async fn shutdown(mut self) {
        for mut task in std::mem::take(&mut self.tasks) {
            task.0.abort();
            let _ = (&mut task.0).await;
        }
        self.shared.tunnel.shutdown();
        tracing::info!(interface = %self.name, "proxy: stopped");
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.tasks.clear();
        self.shared.tunnel.shutdown();
    }
}

fn tunnel_error(e: &tunneld_userspace::Error) -> Error {
    match e.io_kind() {
        Some(kind) => Error::Io {
            message: format!("cannot start the tunnel: {e}"),
            source: io::Error::new(kind, e.to_string()),
        },
        None => Error::System(format!("cannot start the tunnel: {e}")),
    }
}

/// Accepts on `listener` until the task is aborted; each connection runs `handle` as a task
/// of this one (aborted with it), within a slot.
async fn serve_tcp<F, Fut>(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    kind: Kind,
    handle: F,
) where
    F: Fn(Arc<Shared>, tokio::net::TcpStream, SocketAddr) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, from)) => {
                    let Some(slot) = shared.admit(kind) else {
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let work = handle(shared.clone(), stream, from);
                    connections.spawn(async move {
                        work.await;
                        drop(slot);
                    });
                }
                Err(e) => {
                    // Out of descriptors or memory: wait rather than spin.
                    tracing::warn!("proxy: {} accept: {e}", kind.name());
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// `GET /metrics`: the interface's peers (as `tunneld up` renders them) and the proxy's own
/// counters.
fn render_metrics(
    handle: &tokio::runtime::Handle,
    shared: &Shared,
    name: &str,
    listen_port: u16,
) -> Option<String> {
    use std::fmt::Write as _;
    let peers = handle.block_on(shared.tunnel.peers()).ok()?;
    let snapshot = tunneld_wireguard::uapi::DeviceSnapshot {
        private_key: None,
        listen_port,
        fwmark: 0,
        peers,
    };
    let mut out = crate::metrics::render(name, &[], &snapshot);
    let c = &shared.counters;
    let mut family = |metric: &str, kind: &str, help: &str, samples: Vec<(String, u64)>| {
        let _ = writeln!(out, "# HELP {metric} {help}");
        let _ = writeln!(out, "# TYPE {metric} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(out, "{metric}{{interface=\"{name}\"{labels}}} {value}");
        }
    };
    let per_kind = |pick: fn(&KindCounters) -> &AtomicU64| {
        Kind::ALL
            .iter()
            .map(|k| {
                (
                    format!(",listener=\"{}\"", k.name()),
                    pick(c.of(*k)).load(Ordering::Relaxed),
                )
            })
            .collect::<Vec<_>>()
    };
    family(
        "tunneld_proxy_connections_accepted_total",
        "counter",
        "Connections (and UDP forward sessions) the proxy took, by listener kind.",
        per_kind(|k| &k.accepted),
    );
    family(
        "tunneld_proxy_connections_active",
        "gauge",
        "Connections (and UDP forward sessions) open now.",
        per_kind(|k| &k.active),
    );
    family(
        "tunneld_proxy_connections_refused_total",
        "counter",
        "Connections closed at once because the limit of open ones was reached.",
        per_kind(|k| &k.refused),
    );
    family(
        "tunneld_proxy_bytes_total",
        "counter",
        "Bytes relayed into the tunnel (to_tunnel) and out of it (from_tunnel).",
        vec![
            (
                ",direction=\"to_tunnel\"".into(),
                c.to_tunnel.load(Ordering::Relaxed),
            ),
            (
                ",direction=\"from_tunnel\"".into(),
                c.from_tunnel.load(Ordering::Relaxed),
            ),
        ],
    );
    family(
        "tunneld_proxy_udp_associations_total",
        "counter",
        "SOCKS5 UDP associations made.",
        vec![(String::new(), c.udp_associations.load(Ordering::Relaxed))],
    );
    family(
        "tunneld_proxy_udp_associations_active",
        "gauge",
        "SOCKS5 UDP associations open now.",
        vec![(
            String::new(),
            c.udp_associations_active.load(Ordering::Relaxed),
        )],
    );
    Some(out)
}
