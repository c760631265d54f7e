//! One WireGuard peer: its protocol state (`noise::Sessions`) plus what the device keeps
//! around it.

use crate::noise::Sessions;
use ipnet::IpNet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tunneld_crypto::{PresharedKey, PublicKey};

pub(crate) struct Peer {
    pub public_key: PublicKey,
    pub preshared_key: Option<PresharedKey>,
    pub sessions: Sessions,
    pub endpoint: Option<SocketAddr>,
    /// The prefixes routed to this peer alone (WireGuard's allowed IPs).
    pub allowed_ips: Vec<IpNet>,
    /// The prefixes it shares with other peers (`PeerSettings::shared_ips`): each is a
    /// `Group` of the device's.
    pub shared_ips: Vec<IpNet>,
    /// Seconds; 0 = off.
    pub persistent_keepalive: u16,
    pub last_sent: Option<Instant>,
    /// Bytes of datagrams sent to / authenticated from this peer, as `wg show` reports them.
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    /// The sessions may hold packets queued while a handshake was in progress.
    pub maybe_queued: bool,
    /// A handshake initiation goes out at the next tick (see `Device::request_handshake`).
    pub handshake_requested: bool,
    /// ... even if one is under way: the peer moved to a new address, and the initiation
    /// sent to the old one may never be answered (see `Device::move_peer`).
    pub handshake_forced: bool,
    /// ... sent there, not to the endpoint, which stays (see `Device::try_path`).
    pub path_to_try: Option<SocketAddr>,
    /// Whether a session is up, for logging its start and end once (not every rekey).
    pub connected: bool,
    /// Sub-tunnels the peer is split into (`parallel`), and which one this copy carries.
    pub parallel: u8,
    pub sub: u8,
    /// Whether this worker carries the session; other workers keep the peer only to route
    /// to it and recognise it (`owner_of` says which worker does).
    pub owned: bool,
    /// Whether a sub-tunnel's failed handshake was logged (see `Device::decapsulate`).
    pub warned_sub_tunnel: bool,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("public_key", &self.public_key)
            .field("endpoint", &self.endpoint)
            .field("allowed_ips", &self.allowed_ips)
            .field("shared_ips", &self.shared_ips)
            .finish_non_exhaustive()
    }
}

impl Peer {
    pub fn new(public_key: PublicKey, sessions: Sessions) -> Self {
        Self {
            public_key,
            preshared_key: None,
            sessions,
            endpoint: None,
            allowed_ips: Vec::new(),
            shared_ips: Vec::new(),
            persistent_keepalive: 0,
            last_sent: None,
            tx_bytes: 0,
            rx_bytes: 0,
            maybe_queued: false,
            handshake_requested: false,
            handshake_forced: false,
            path_to_try: None,
            connected: false,
            parallel: 1,
            sub: 0,
            owned: true,
            warned_sub_tunnel: false,
        }
    }

    /// Whether a persistent keepalive is due at `now`.
    pub fn keepalive_due(&self, now: Instant) -> bool {
        if self.persistent_keepalive == 0 || self.endpoint.is_none() {
            return false;
        }
        let interval = Duration::from_secs(self.persistent_keepalive.into());
        self.last_sent
            .is_none_or(|t| now.saturating_duration_since(t) >= interval)
    }
}
