//! The gateway's WireGuard side as WireGuard over TLS sees it (`tunneld_tls::WireGuardPeers`):
//! each request goes through the interface's control handle, like every other writer's, so
//! a `transport = "auto"` peer's move to TLS is serialised with `wg set`, the library and
//! reloads, and the control plane's copy of the peer (what a reload starts from) follows it.

use crate::control::{lock, ControlHandle};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use tunneld_crypto::PublicKey;
use tunneld_tls::{PeerTraffic, WireGuardPeers};

/// The interface's control handle, set once it has started (the TLS bridges are prepared
/// before).
pub(crate) struct TlsPeers(pub(crate) Arc<OnceLock<ControlHandle>>);

impl WireGuardPeers for TlsPeers {
    fn request_handshake(&self, peer: &PublicKey) {
        if let Some(control) = self.0.get() {
            lock(control).request_handshake(*peer);
        }
    }

    fn peer_traffic(&self, peer: &PublicKey) -> PeerTraffic {
        let Some(control) = self.0.get() else {
            return PeerTraffic::NotStarted;
        };
        match lock(control).peer_traffic(*peer) {
            Some((sent, received)) => PeerTraffic::Counted { sent, received },
            None => PeerTraffic::Stopped,
        }
    }

    fn move_peer(&self, peer: &PublicKey, endpoint: SocketAddr) {
        if let Some(control) = self.0.get() {
            lock(control).move_to_transport(*peer, endpoint);
        }
    }
}
