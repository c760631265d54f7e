//! The tunnel's typed settings and the errors that name what is wrong with them.

use ipnet::IpNet;
use std::collections::{HashMap, HashSet};
use std::io;
use std::net::SocketAddr;
use tunneld_crypto::{PrivateKey, PublicKey};
use tunneld_wireguard::PeerSettings;

/// Smallest tunnel MTU: the IPv4 minimum (RFC 791); with an IPv6 address, 1280 (RFC 8200).
const MIN_MTU: u16 = 576;
const MIN_MTU_V6: u16 = 1280;
/// Largest tunnel MTU: an IP packet plus WireGuard's 32 bytes must fit one UDP datagram.
const MAX_MTU: u16 = 65_535 - 32 - 48;

/// The MTU a tunnel has unless told otherwise: WireGuard's usual 1420 (a 1500-byte
/// underlay, IPv6 headers and WireGuard's 80 bytes).
pub const DEFAULT_MTU: u16 = 1420;

/// Everything a [`Tunnel`](crate::Tunnel) needs: made by [`TunnelSettings::new`] with
/// defaults and changed with its methods (or its fields).
///
/// ```
/// use tunneld_userspace::{PeerSettings, PrivateKey, TunnelSettings};
/// # let peer_key = PrivateKey::generate().public_key();
/// let settings = TunnelSettings::new(PrivateKey::generate())
///     .address("10.77.0.1/24".parse().unwrap())
///     .address("fd77::1/64".parse().unwrap())
///     .peer(PeerSettings::new(peer_key)
///         .endpoint("192.0.2.2:51820".parse().unwrap())
///         .allowed_ip("10.77.0.0/24".parse().unwrap()));
/// assert_eq!(settings.addresses.len(), 2);
/// assert_eq!(settings.mtu, 1420);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TunnelSettings {
    /// The interface's WireGuard private key.
    pub private_key: PrivateKey,
    /// Where the underlay UDP socket binds (port 0: any free port). `[::]:port` also takes
    /// IPv4 peers; `0.0.0.0:port` only IPv4 ones. Default `0.0.0.0:0`.
    pub listen: SocketAddr,
    /// The tunnel's own addresses with their prefixes (at most one IPv4 and one IPv6),
    /// e.g. `10.77.0.1/24`: the prefix says which destinations are on the tunnel's link.
    /// Other destinations are reached all the same, routed by the peers' allowed IPs.
    /// Default none; at least one is needed.
    pub addresses: Vec<IpNet>,
    /// The tunnel's MTU: the largest IP packet sent through it. Default [`DEFAULT_MTU`].
    pub mtu: u16,
    /// The peers, as for a tunneld gateway (`parallel` must be 1; no prefix claimed by two
    /// peers, as `tunneld check` refuses it). Default none (add them
    /// later with [`Tunnel::add_peer`](crate::Tunnel::add_peer)).
    pub peers: Vec<PeerSettings>,
    /// DNS servers inside the tunnel (port 53), asked in order for the names given to
    /// [`Tunnel::tcp_connect`](crate::Tunnel::tcp_connect) and
    /// [`Tunnel::resolve`](crate::Tunnel::resolve) (the `dns` feature). Default none: only
    /// addresses are taken.
    pub dns_servers: Vec<std::net::IpAddr>,
}

impl TunnelSettings {
    /// Settings with `private_key` and the defaults: listen on `0.0.0.0:0`, no address,
    /// MTU [`DEFAULT_MTU`], no peers, no DNS server.
    pub fn new(private_key: PrivateKey) -> TunnelSettings {
        TunnelSettings {
            private_key,
            listen: SocketAddr::from(([0, 0, 0, 0], 0)),
            addresses: Vec::new(),
            mtu: DEFAULT_MTU,
            peers: Vec::new(),
            dns_servers: Vec::new(),
        }
    }

    /// Adds a DNS server inside the tunnel.
    pub fn dns_server(mut self, server: std::net::IpAddr) -> TunnelSettings {
        self.dns_servers.push(server);
        self
    }

    /// Sets where the underlay UDP socket binds.
    pub fn listen(mut self, listen: SocketAddr) -> TunnelSettings {
        self.listen = listen;
        self
    }

    /// Adds an address of the tunnel (with its prefix).
    pub fn address(mut self, address: IpNet) -> TunnelSettings {
        self.addresses.push(address);
        self
    }

    /// Sets the MTU.
    pub fn mtu(mut self, mtu: u16) -> TunnelSettings {
        self.mtu = mtu;
        self
    }

    /// Adds a peer.
    pub fn peer(mut self, peer: PeerSettings) -> TunnelSettings {
        self.peers.push(peer);
        self
    }
}

/// Why a tunnel could not start. Displayed as one line that starts with the setting at
/// fault, e.g. `addresses: no address given`.
///
/// ```
/// use tunneld_userspace::{Error, PrivateKey, Tunnel, TunnelSettings};
/// let err = Tunnel::start(TunnelSettings::new(PrivateKey::generate())).unwrap_err();
/// assert_eq!(err.field(), "addresses");
/// assert!(err.to_string().starts_with("addresses: "));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting has a value the tunnel cannot use.
    #[error("{field}: {reason}")]
    Invalid {
        /// The setting: `addresses`, `mtu`, `peers`, `listen`.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The underlay socket could not be bound.
    #[error("listen: cannot bind {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The system's error.
        source: io::Error,
    },
    /// The engine's thread or poller could not be made.
    #[error("engine: {0}")]
    Engine(io::Error),
    /// No peer of the tunnel has this public key.
    #[error("peer: no peer has the public key {0}")]
    UnknownPeer(PublicKey),
    /// A peer with this public key is already configured.
    #[error("peer: a peer with the public key {0} is already configured")]
    PeerExists(PublicKey),
    /// The tunnel has stopped ([`Tunnel::shutdown`](crate::Tunnel::shutdown), or every
    /// handle dropped).
    #[error("engine: the tunnel has stopped")]
    Stopped,
    /// [`Tunnel::ready`](crate::Tunnel::ready) gave up: the handshake with the peer went
    /// unanswered.
    #[error("peer: {0}")]
    HandshakeFailed(HandshakeFailed),
}

/// How long a handshake may go unanswered (three of WireGuard's 5 s attempts), counted from
/// the call, before [`Tunnel::ready`](crate::Tunnel::ready) and a
/// [`Tunnel::tcp_connect`](crate::Tunnel::tcp_connect) routed to that peer give up with
/// [`HandshakeFailed`]: long enough for a peer that is still starting to answer a retry,
/// short of the stack's 60 s connect timeout.
pub const HANDSHAKE_GIVE_UP: std::time::Duration = std::time::Duration::from_secs(15);

/// A handshake with a peer went unanswered for [`HANDSHAKE_GIVE_UP`]: what
/// [`Tunnel::ready`](crate::Tunnel::ready) fails with, and the inner error of a
/// [`Tunnel::tcp_connect`](crate::Tunnel::tcp_connect) that waited on it (kind
/// `TimedOut`), so a wrong key or endpoint shows by name, and sooner than the stack's
/// 60 s.
///
/// ```no_run
/// # async fn run(tunnel: tunneld_userspace::Tunnel) {
/// use tunneld_userspace::HandshakeFailed;
/// if let Err(e) = tunnel.tcp_connect("10.77.0.2:80").await {
///     if let Some(failed) = e.get_ref().and_then(|e| e.downcast_ref::<HandshakeFailed>()) {
///         eprintln!("check peer {}: {failed}", failed.peer);
///     }
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "no handshake with {peer}: unanswered for {} s (check that peer's public key and \
     endpoint, and that it has this tunnel's public key as a peer)",
    waited.as_secs()
)]
#[non_exhaustive]
pub struct HandshakeFailed {
    /// The peer that did not answer.
    pub peer: PublicKey,
    /// How long the handshake went unanswered.
    pub waited: std::time::Duration,
}

impl From<HandshakeFailed> for io::Error {
    fn from(failed: HandshakeFailed) -> io::Error {
        io::Error::new(io::ErrorKind::TimedOut, failed)
    }
}

impl Error {
    /// The kind of the system's error, where the system refused (binding the underlay,
    /// making the engine's thread or poller): match it rather than the text.
    ///
    /// ```
    /// # use tunneld_userspace::{PrivateKey, Tunnel, TunnelSettings};
    /// let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// let settings = TunnelSettings::new(PrivateKey::generate())
    ///     .address("10.77.0.1/24".parse().unwrap())
    ///     .listen(taken.local_addr().unwrap());
    /// let err = Tunnel::start(settings).unwrap_err();
    /// assert_eq!(err.io_kind(), Some(std::io::ErrorKind::AddrInUse));
    /// ```
    pub fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            Error::Bind { source, .. } | Error::Engine(source) => Some(source.kind()),
            _ => None,
        }
    }

    /// The setting the error is about (`engine` for a failure that is no setting's fault,
    /// `peer` for a peer operation's).
    ///
    /// ```
    /// # use tunneld_userspace::Error;
    /// fn report(e: &Error) -> String {
    ///     format!("check the `{}` setting", e.field())
    /// }
    /// ```
    pub fn field(&self) -> &'static str {
        match self {
            Error::Invalid { field, .. } => field,
            Error::Bind { .. } => "listen",
            Error::Engine(_) | Error::Stopped => "engine",
            Error::UnknownPeer(_) | Error::PeerExists(_) | Error::HandshakeFailed(_) => "peer",
        }
    }
}

pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
    Error::Invalid {
        field,
        reason: reason.into(),
    }
}

impl TunnelSettings {
    /// Checks what the engine relies on; the first problem found is returned.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        if self.addresses.is_empty() {
            return Err(invalid("addresses", "no address given"));
        }
        let v4 = self.addresses.iter().filter(|a| a.addr().is_ipv4()).count();
        let v6 = self.addresses.len() - v4;
        if v4 > 1 || v6 > 1 {
            return Err(invalid(
                "addresses",
                "at most one IPv4 and one IPv6 address",
            ));
        }
        for a in &self.addresses {
            let ip = a.addr();
            if ip.is_unspecified() || ip.is_multicast() || ip.is_loopback() {
                return Err(invalid(
                    "addresses",
                    format!("{a} cannot be an interface address"),
                ));
            }
        }
        let min = if v6 > 0 { MIN_MTU_V6 } else { MIN_MTU };
        if !(min..=MAX_MTU).contains(&self.mtu) {
            return Err(invalid(
                "mtu",
                format!("{} is outside {min}..={MAX_MTU}", self.mtu),
            ));
        }
        if self.listen.ip().is_multicast() {
            return Err(invalid("listen", "a multicast address cannot be bound"));
        }
        let own = self.private_key.public_key();
        let mut seen = HashSet::new();
        // A prefix has one owner, as `tunneld check` and a gateway's settings require: two
        // peers claiming it would leave which one gets its traffic to the order given.
        let mut owners: HashMap<IpNet, usize> = HashMap::new();
        for (i, peer) in self.peers.iter().enumerate() {
            for net in &peer.allowed_ips {
                let net = net.trunc();
                match owners.get(&net) {
                    Some(&first) if first != i => {
                        return Err(invalid(
                            "peers",
                            format!("peer {i}: allowed IP {net} is also claimed by peer {first}"),
                        ))
                    }
                    _ => {
                        owners.insert(net, i);
                    }
                }
            }
            if peer.public_key == own {
                return Err(invalid(
                    "peers",
                    format!("peer {i} has the tunnel's own public key"),
                ));
            }
            if !seen.insert(peer.public_key) {
                return Err(invalid(
                    "peers",
                    format!("peer {i}: public key {} given twice", peer.public_key),
                ));
            }
            if peer.parallel != 1 {
                return Err(invalid(
                    "peers",
                    format!(
                        "peer {i}: parallel = {} (a user-space tunnel has one engine; use 1)",
                        peer.parallel
                    ),
                ));
            }
        }
        Ok(())
    }
}
