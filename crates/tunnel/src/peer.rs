//! One WireGuard peer: boringtun's `Tunn` plus what the core keeps around it.

use boringtun::noise::rate_limiter::RateLimiter;
use boringtun::noise::Tunn;
use ipnet::IpNet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tunneld_crypto::{PresharedKey, PrivateKey, PublicKey};

pub(crate) struct Peer {
    pub public_key: PublicKey,
    pub preshared_key: Option<PresharedKey>,
    pub tunn: Tunn,
    pub endpoint: Option<SocketAddr>,
    pub allowed_ips: Vec<IpNet>,
    /// Seconds; 0 = off. Kept here rather than in `Tunn` so it can change without a new session.
    pub persistent_keepalive: u16,
    pub last_sent: Option<Instant>,
    /// Bytes of datagrams sent to / authenticated from this peer, as `wg show` reports them.
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    /// `Tunn` may hold packets queued while a handshake was in progress.
    pub maybe_queued: bool,
    /// A handshake initiation goes out at the next tick (see `Device::request_handshake`).
    pub handshake_requested: bool,
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
            .finish_non_exhaustive()
    }
}

impl Peer {
    pub fn new(
        private_key: &PrivateKey,
        public_key: PublicKey,
        preshared_key: Option<PresharedKey>,
        slot: u32,
        rate_limiter: Arc<RateLimiter>,
    ) -> Self {
        let tunn = new_tunn(
            private_key,
            &public_key,
            preshared_key.as_ref(),
            slot,
            rate_limiter,
        );
        Self {
            public_key,
            preshared_key,
            tunn,
            endpoint: None,
            allowed_ips: Vec::new(),
            persistent_keepalive: 0,
            last_sent: None,
            tx_bytes: 0,
            rx_bytes: 0,
            maybe_queued: false,
            handshake_requested: false,
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

pub(crate) fn new_tunn(
    private_key: &PrivateKey,
    public_key: &PublicKey,
    preshared_key: Option<&PresharedKey>,
    slot: u32,
    rate_limiter: Arc<RateLimiter>,
) -> Tunn {
    Tunn::new(
        private_key.to_static_secret(),
        public_key.to_x25519(),
        preshared_key.map(|k| *k.as_bytes()),
        // Persistent keepalive is run by the core (see `Peer::persistent_keepalive`).
        None,
        slot,
        Some(rate_limiter),
    )
}
