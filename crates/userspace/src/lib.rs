//! WireGuard tunnels for tokio programs, with their own user-space TCP/IP stack: no TUN
//! device and no root.
//!
//! A [`Tunnel`] is one WireGuard interface that lives inside the program. It owns a UDP
//! socket (the underlay) and a TCP/IP stack ([smoltcp]) that has the tunnel's addresses;
//! [`Tunnel::tcp_connect`], [`Tunnel::tcp_listen`] and [`Tunnel::udp_bind`] give tokio
//! sockets inside the tunnel.
//!
//! ```no_run
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! use tunneld_userspace::{Tunnel, TunnelSettings};
//! # async fn run(settings: TunnelSettings) -> Result<(), Box<dyn std::error::Error>> {
//! let tunnel = Tunnel::start(settings)?;
//! let mut stream = tunnel.tcp_connect("10.77.0.2:80").await?;
//! stream.write_all(b"GET / HTTP/1.0\r\n\r\n").await?;
//! let mut reply = Vec::new();
//! stream.read_to_end(&mut reply).await?;
//! # Ok(()) }
//! ```
//!
//! # Shape
//!
//! One engine thread per tunnel owns the WireGuard [`Device`](tunneld_wireguard::Device) and the
//! stack, and is driven like the dataplane's worker: it waits in `poll` on the UDP socket and
//! a waker, takes a batch of datagrams (`recvmmsg`, GRO), decrypts them into the stack, lets
//! the stack run with the current time, encrypts what it sends into a batch (`sendmmsg`,
//! GSO), and sleeps until the next datagram, wake-up or timer. Handles never touch the stack:
//! each TCP stream has two bounded single-producer rings of bytes (one per direction), each
//! UDP socket two rings of framed datagrams, and requests (connect, listen, bind) go over a
//! bounded channel. There is no lock around the stack and no task or thread per connection.
//!
//! # With the ecosystem
//!
//! [`TcpStream`] is tokio's `AsyncRead + AsyncWrite`; [`TcpListener`] is a
//! `futures_core::Stream` of connections with [`TcpListener::poll_accept`] and, with the
//! `axum` feature, an `axum::serve::Listener`; with the `hyper` feature, `Connector` is a
//! `tower::Service<Uri>` for hyper-util's pooled client and tonic's channels; with the
//! `tonic` feature, [`TcpStream`] is tonic's `server::Connected`, so a tonic server runs
//! inside the tunnel (`Server::builder()...serve_with_incoming(listener)`, see the
//! `grpc_server` example); [`UdpSocket`] has connected and `poll_*` forms. With the `dns` feature,
//! [`Tunnel::tcp_connect`] and [`Tunnel::resolve`] take names, resolved by DNS servers
//! inside the tunnel ([`TunnelSettings::dns_servers`]) with hickory's resolver over the
//! tunnel's own sockets.
//!
//! # Platform, blocking and cancellation
//!
//! Linux only (the underlay uses `recvmmsg`/`sendmmsg` with UDP GSO/GRO). No root and no
//! capability is needed. Every `async` method waits only on the engine (a request over a
//! bounded channel, a ring with room or bytes): none blocks the runtime's thread, and each
//! says whether it is cancel safe. The few plain methods ([`Tunnel::start`],
//! [`Tunnel::shutdown`], [`Tunnel::stats`], addresses and keys) return at once. Sockets
//! work on any tokio runtime, current-thread or multi-thread; the engine is a thread of
//! its own.
//!
//! [smoltcp]: https://docs.rs/smoltcp

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![deny(missing_docs)]
// Doc examples are code users copy: a `for` over a `Result` or an ignored `Result` there
// compiles and does nothing, a bug in the docs.
#![doc(test(attr(deny(for_loops_over_fallibles, unused_must_use))))]

mod addr;
#[cfg(feature = "hyper")]
mod connector;
#[cfg(feature = "dns")]
mod dns;
mod engine;
mod peers;
mod rings;
mod settings;
mod tcp;
mod udp;

pub use addr::ToTunnelAddr;
#[cfg(feature = "hyper")]
pub use connector::Connector;
pub use ipnet::IpNet;
pub use peers::Events;
pub use settings::{Error, HandshakeFailed, TunnelSettings, DEFAULT_MTU, HANDSHAKE_GIVE_UP};
pub use tcp::{OwnedReadHalf, OwnedWriteHalf, TcpListener, TcpStream};
pub use tunneld_crypto::{KeyError, PresharedKey, PrivateKey, PublicKey};
pub use tunneld_wireguard::event::{Event, HANDSHAKE_FAILED_AFTER};
pub use tunneld_wireguard::uapi::PeerSnapshot;
pub use tunneld_wireguard::{PeerChange, PeerSettings};
pub use udp::UdpSocket;

use engine::{Control, Shared};
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// A running WireGuard tunnel with its own TCP/IP stack. Cheap to clone; every clone (and
/// every socket made from it) is a handle on the same engine.
///
/// The engine stops on [`Tunnel::shutdown`], or when the last handle (this and every socket
/// made through it) is dropped.
///
/// ```no_run
/// # use tunneld_userspace::{Tunnel, TunnelSettings};
/// # fn run(settings: TunnelSettings) -> Result<(), tunneld_userspace::Error> {
/// let tunnel = Tunnel::start(settings)?;
/// let other = tunnel.clone(); // the same tunnel, e.g. for another task
/// println!("underlay: {}", other.local_addr());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Tunnel {
    link: Arc<Link>,
    /// Made at the first name to resolve (inside the caller's runtime); held by the
    /// tunnel's handles only, never by its sockets, so it never keeps the engine alive.
    #[cfg(feature = "dns")]
    resolver: Arc<std::sync::OnceLock<dns::TunnelResolver>>,
}

impl std::fmt::Debug for Tunnel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tunnel")
            .field("local_addr", &self.link.shared.local_addr)
            .field("public_key", &self.link.shared.public_key)
            .finish_non_exhaustive()
    }
}

/// Keeps the engine running while any handle holds it; the last one dropped stops it.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) shared: Arc<Shared>,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.shared.stop();
    }
}

/// What a tunnel has done so far, from [`Tunnel::stats`].
///
/// ```no_run
/// # fn run(tunnel: tunneld_userspace::Tunnel) {
/// let stats = tunnel.stats();
/// if stats.handshake_done {
///     println!("{} bytes out, {} in", stats.tx_bytes, stats.rx_bytes);
/// }
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TunnelStats {
    /// Whether a WireGuard handshake with some peer has completed.
    pub handshake_done: bool,
    /// WireGuard bytes sent on the underlay (datagrams, headers included).
    pub tx_bytes: u64,
    /// WireGuard bytes received on the underlay and accepted (authenticated).
    pub rx_bytes: u64,
    /// Datagrams and packets the WireGuard device dropped (no route, bad packets, ...).
    pub drops: u64,
}

impl Tunnel {
    /// Checks `settings`, binds the underlay UDP socket (in the calling thread's network
    /// namespace) and starts the engine thread.
    ///
    /// Errors name the setting that is wrong, e.g. `addresses: no address given`.
    ///
    /// Does not block beyond binding a socket and starting a thread; no handshake happens
    /// yet (see [`Tunnel::ready`]).
    ///
    /// ```no_run
    /// use tunneld_userspace::{PeerSettings, PrivateKey, PublicKey, Tunnel, TunnelSettings};
    /// # fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let peer: PublicKey = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=".parse()?;
    /// let tunnel = Tunnel::start(
    ///     TunnelSettings::new(PrivateKey::generate())
    ///         .address("10.77.0.1/24".parse()?)
    ///         .peer(PeerSettings::new(peer)
    ///             .endpoint("192.0.2.2:51820".parse()?)
    ///             .allowed_ip("10.77.0.0/24".parse()?)
    ///             .persistent_keepalive(25)),
    /// )?;
    /// # Ok(()) }
    /// ```
    pub fn start(settings: TunnelSettings) -> Result<Tunnel, Error> {
        let shared = engine::start(settings)?;
        Ok(Tunnel::from_link(Arc::new(Link { shared })))
    }

    pub(crate) fn from_link(link: Arc<Link>) -> Tunnel {
        Tunnel {
            link,
            #[cfg(feature = "dns")]
            resolver: Arc::default(),
        }
    }

    /// Opens a TCP connection through the tunnel to `addr`: a `SocketAddr`, `"ip:port"`,
    /// `(ip, port)`, or with the `dns` feature a name, `("db.internal", 5432)` or
    /// `"db.internal:5432"`, resolved through the tunnel's DNS servers
    /// ([`TunnelSettings::dns_servers`]), each address tried in turn. IPv4 or IPv6, routed
    /// to a peer by its allowed IPs. Fails with `TimedOut` when no answer comes within 60 s
    /// (the stack's retransmission timeout, the same that aborts an established connection
    /// whose peer stays silent), or sooner when the WireGuard handshake with the peer has
    /// gone unanswered for [`HANDSHAKE_GIVE_UP`] (its inner error is a [`HandshakeFailed`]
    /// naming the peer), with
    /// `ConnectionRefused` when the far side resets, at once
    /// with `HostUnreachable` when no peer is allowed the address, and with `Unsupported`
    /// for a name without the `dns` feature or DNS servers.
    ///
    /// Cancel safe: a connect dropped before it completes leaves nothing behind (the
    /// half-open connection is aborted).
    ///
    /// ```no_run
    /// # async fn run(tunnel: tunneld_userspace::Tunnel) -> std::io::Result<()> {
    /// use tokio::io::AsyncWriteExt;
    /// let mut stream = tunnel.tcp_connect("[fd77::2]:7").await?;
    /// stream.write_all(b"hello").await?;
    /// # Ok(()) }
    /// ```
    pub async fn tcp_connect(&self, addr: impl ToTunnelAddr) -> io::Result<TcpStream> {
        let (host, port) = addr.host_port()?;
        let mut last = None;
        for ip in self.addresses_of(&host).await? {
            match self.connect_to(SocketAddr::new(ip, port)).await {
                Ok(stream) => return Ok(stream),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address"))
        }))
    }

    /// The addresses of `host`: itself if it is one, else what the tunnel's DNS servers
    /// answer.
    async fn addresses_of(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(vec![ip]);
        }
        self.resolve(host).await
    }

    /// Every address of `name`, asked of the tunnel's DNS servers
    /// ([`TunnelSettings::dns_servers`]) through the tunnel itself (UDP, and TCP for long
    /// answers), with hickory's resolver and its cache. `NotFound` when the name has no
    /// address; `Unsupported` without DNS servers (or without the `dns` feature).
    ///
    /// Cancel safe.
    ///
    /// ```no_run
    /// # async fn run(tunnel: tunneld_userspace::Tunnel) -> std::io::Result<()> {
    /// for ip in tunnel.resolve("db.internal").await? {
    ///     println!("db.internal is {ip}");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn resolve(&self, name: &str) -> io::Result<Vec<IpAddr>> {
        let servers = &self.link.shared.dns_servers;
        if servers.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("cannot resolve {name}: the tunnel has no DNS server (TunnelSettings::dns_server)"),
            ));
        }
        #[cfg(feature = "dns")]
        {
            let resolver = self
                .resolver
                .get_or_init(|| dns::resolver(self.link.clone(), servers));
            dns::lookup(resolver, name).await
        }
        #[cfg(not(feature = "dns"))]
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("cannot resolve {name}: names need tunneld-userspace's `dns` feature"),
        ))
    }

    async fn connect_to(&self, addr: SocketAddr) -> io::Result<TcpStream> {
        let parts = self
            .request(|reply| Control::Connect {
                remote: addr,
                reply,
            })
            .await?;
        Ok(TcpStream::new(self.link.clone(), parts))
    }

    /// Listens for TCP connections arriving through the tunnel on `addr` (an address of the
    /// tunnel, or the unspecified address for all of them; port 0 picks a free port).
    ///
    /// ```no_run
    /// # async fn run(tunnel: tunneld_userspace::Tunnel) -> std::io::Result<()> {
    /// let listener = tunnel.tcp_listen("0.0.0.0:8080".parse().unwrap()).await?;
    /// loop {
    ///     let (stream, from) = listener.accept().await?;
    ///     println!("connection from {from}");
    ///     # drop(stream);
    /// }
    /// # }
    /// ```
    ///
    /// Cancel safe.
    pub async fn tcp_listen(&self, addr: SocketAddr) -> io::Result<TcpListener> {
        let parts = self
            .request(|reply| Control::Listen { local: addr, reply })
            .await?;
        Ok(TcpListener::new(self.link.clone(), parts))
    }

    /// Binds a UDP socket inside the tunnel at `addr` (an address of the tunnel or the
    /// unspecified address; port 0 picks a free port).
    ///
    /// ```no_run
    /// # async fn run(tunnel: tunneld_userspace::Tunnel) -> std::io::Result<()> {
    /// let socket = tunnel.udp_bind("0.0.0.0:0".parse().unwrap()).await?;
    /// socket.send_to(b"ping", "10.77.0.2:7".parse().unwrap()).await?;
    /// let mut buf = [0u8; 1500];
    /// let (n, from) = socket.recv_from(&mut buf).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// Cancel safe.
    pub async fn udp_bind(&self, addr: SocketAddr) -> io::Result<UdpSocket> {
        let parts = self
            .request(|reply| Control::UdpBind { local: addr, reply })
            .await?;
        Ok(UdpSocket::new(self.link.clone(), parts))
    }

    /// Stops the engine: open sockets' reads and writes, pending accepts and receives, and
    /// later calls on this tunnel all fail with `ConnectionAborted`. Connections are not
    /// closed gracefully (the far side sees them go silent). Idempotent.
    ///
    /// ```no_run
    /// # fn run(tunnel: tunneld_userspace::Tunnel) {
    /// tunnel.shutdown();
    /// # }
    /// ```
    pub fn shutdown(&self) {
        self.link.shared.stop();
    }

    /// The underlay UDP socket's local address (its port is the WireGuard listen port).
    ///
    /// ```no_run
    /// # fn run(tunnel: tunneld_userspace::Tunnel) {
    /// println!("peers reach this tunnel on UDP port {}", tunnel.local_addr().port());
    /// # }
    /// ```
    pub fn local_addr(&self) -> SocketAddr {
        self.link.shared.local_addr
    }

    /// The tunnel's public key, to configure peers with.
    ///
    /// ```no_run
    /// # fn run(tunnel: tunneld_userspace::Tunnel) {
    /// println!("public key: {}", tunnel.public_key().to_base64());
    /// # }
    /// ```
    pub fn public_key(&self) -> PublicKey {
        self.link.shared.public_key
    }

    /// Counters of the tunnel (updated by the engine as it runs).
    ///
    /// ```no_run
    /// # fn run(tunnel: tunneld_userspace::Tunnel) {
    /// println!("{:?}", tunnel.stats());
    /// # }
    /// ```
    pub fn stats(&self) -> TunnelStats {
        self.link.shared.stats()
    }

    /// Adds a peer to the running tunnel; connections through the other peers are not
    /// disturbed. A peer with a keepalive (and an endpoint) is handshaken at once, as at
    /// start; otherwise at its first packet, or at [`Tunnel::ready`].
    ///
    /// Errors: [`Error::PeerExists`], [`Error::Invalid`] (field `peer`: the tunnel's own
    /// key, `parallel` other than 1), [`Error::Stopped`]. Cancel safe in that dropping the
    /// future before it is done may or may not have added the peer (ask [`Tunnel::peers`]).
    ///
    /// ```no_run
    /// # async fn run(tunnel: tunneld_userspace::Tunnel) -> Result<(), Box<dyn std::error::Error>> {
    /// use tunneld_userspace::{PeerSettings, PublicKey};
    /// let key: PublicKey = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=".parse()?;
    /// tunnel
    ///     .add_peer(
    ///         PeerSettings::new(key)
    ///             .endpoint("192.0.2.3:51820".parse()?)
    ///             .allowed_ip("10.78.0.0/24".parse()?)
    ///             .persistent_keepalive(25),
    ///     )
    ///     .await?;
    /// tunnel.ready(&key).await?; // handshake done: traffic flows
    /// # Ok(()) }
    /// ```
    pub async fn add_peer(&self, peer: PeerSettings) -> Result<(), Error> {
        self.peer_request(|reply| Control::AddPeer { peer, reply })
            .await?
    }

    /// Changes what `change` names of a peer. Its session is kept (a new preshared key
    /// starts a new one), so its connections keep flowing; connections to addresses no
    /// peer is allowed any more are reset.
    ///
    /// Errors: [`Error::UnknownPeer`], [`Error::Stopped`]. Cancel safe as
    /// [`Tunnel::add_peer`] is.
    ///
    /// ```no_run
    /// # async fn run(tunnel: tunneld_userspace::Tunnel, key: tunneld_userspace::PublicKey) -> Result<(), tunneld_userspace::Error> {
    /// use tunneld_userspace::PeerChange;
    /// tunnel
    ///     .update_peer(PeerChange::new(key).endpoint("198.51.100.7:51820".parse().unwrap()))
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn update_peer(&self, change: PeerChange) -> Result<(), Error> {
        self.peer_request(|reply| Control::UpdatePeer { change, reply })
            .await?
    }

    /// Removes a peer and its sessions; connections through it are reset.
    ///
    /// Errors: [`Error::UnknownPeer`], [`Error::Stopped`].
    ///
    /// ```no_run
    /// # async fn run(tunnel: tunneld_userspace::Tunnel, key: tunneld_userspace::PublicKey) -> Result<(), tunneld_userspace::Error> {
    /// tunnel.remove_peer(&key).await?;
    /// # Ok(()) }
    /// ```
    pub async fn remove_peer(&self, peer: &PublicKey) -> Result<(), Error> {
        let peer = *peer;
        self.peer_request(|reply| Control::RemovePeer { peer, reply })
            .await?
    }

    /// Every peer's state, as a tunneld gateway's `peers()` and `wg show` give it:
    /// endpoint, allowed IPs, last handshake, bytes each way, keepalive (never the
    /// preshared key).
    ///
    /// ```no_run
    /// # async fn run(tunnel: tunneld_userspace::Tunnel) -> Result<(), tunneld_userspace::Error> {
    /// for peer in tunnel.peers().await? {
    ///     println!("{}: {:?}, {} B in", peer.public_key, peer.endpoint, peer.rx_bytes);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn peers(&self) -> Result<Vec<PeerSnapshot>, Error> {
        self.peer_request(|reply| Control::Peers { reply }).await
    }

    /// The tunnel's events from now on: handshakes completed or unanswered, endpoints
    /// changed, peers added and removed, and finally [`Event::Stopped`]. Each call is a
    /// subscriber of its own that sees every event.
    ///
    /// ```no_run
    /// # async fn run(tunnel: tunneld_userspace::Tunnel) {
    /// let mut events = tunnel.events();
    /// tokio::spawn(async move {
    ///     while let Some(event) = events.recv().await {
    ///         println!("{event:?}");
    ///     }
    /// });
    /// # }
    /// ```
    pub fn events(&self) -> Events {
        peers::subscribe(&mut peers::lock(&self.link.shared.hub))
    }

    /// Waits until a handshake with `peer` has completed since it was added (at once if
    /// one has), asking for one now if it has no session: once this returns, traffic to
    /// the peer flows, and [`Tunnel::stats`] says `handshake_done`.
    ///
    /// Errors: [`Error::HandshakeFailed`] when the handshake goes unanswered for
    /// [`HANDSHAKE_GIVE_UP`] (15 s, three of WireGuard's attempts: a wrong key or endpoint,
    /// or a peer that is down; WireGuard keeps trying, so a later call may succeed),
    /// [`Error::UnknownPeer`] (also when the peer is removed meanwhile), [`Error::Stopped`].
    /// Cancel safe.
    ///
    /// ```no_run
    /// # async fn run(tunnel: tunneld_userspace::Tunnel, peer: tunneld_userspace::PublicKey) -> Result<(), Box<dyn std::error::Error>> {
    /// tokio::time::timeout(std::time::Duration::from_secs(10), tunnel.ready(&peer)).await??;
    /// # Ok(()) }
    /// ```
    pub async fn ready(&self, peer: &PublicKey) -> Result<(), Error> {
        let Some(mut events) = peers::wait_for(&self.link.shared.hub, peer)? else {
            return Ok(());
        };
        let (give_up_tx, give_up_rx) = tokio::sync::oneshot::channel();
        self.link
            .shared
            .send_control(Control::Handshake {
                peer: *peer,
                give_up: give_up_tx,
            })
            .await
            .map_err(|_| Error::Stopped)?;
        // The engine says when the handshake has gone unanswered too long; until then, the
        // events say whether it completed.
        let mut give_up = Some(give_up_rx);
        loop {
            let next = std::future::poll_fn(|cx| {
                if let Some(rx) = give_up.as_mut() {
                    if let std::task::Poll::Ready(told) = std::pin::Pin::new(rx).poll(cx) {
                        give_up = None;
                        if let Ok(failed) = told {
                            return std::task::Poll::Ready(Err(failed));
                        }
                    }
                }
                events.poll_recv(cx).map(Ok)
            })
            .await;
            match next {
                Err(failed) => return Err(Error::HandshakeFailed(failed)),
                Ok(None) => return Err(Error::Stopped),
                Ok(Some(Event::HandshakeCompleted { peer: p, .. })) if p == *peer => return Ok(()),
                Ok(Some(Event::PeerRemoved { peer: p })) if p == *peer => {
                    return Err(Error::UnknownPeer(*peer))
                }
                Ok(Some(_)) => {}
            }
        }
    }

    async fn peer_request<T>(
        &self,
        make: impl FnOnce(tokio::sync::oneshot::Sender<T>) -> Control,
    ) -> Result<T, Error> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.link
            .shared
            .send_control(make(tx))
            .await
            .map_err(|_| Error::Stopped)?;
        rx.await.map_err(|_| Error::Stopped)
    }

    async fn request<T>(
        &self,
        make: impl FnOnce(tokio::sync::oneshot::Sender<io::Result<T>>) -> Control,
    ) -> io::Result<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.link.shared.send_control(make(tx)).await?;
        rx.await.unwrap_or_else(|_| Err(engine::aborted()))
    }
}
