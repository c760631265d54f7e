//! The gateway's workers as WireGuard over TLS sees them (`tunneld_tls::WireGuardPeers`):
//! each request runs on every worker between batches (`Workers::run_each`).

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use tunneld_crypto::PublicKey;
use tunneld_dataplane::worker::Workers;
use tunneld_tls::{PeerTraffic, WireGuardPeers};

/// The workers, set once they have started (the TLS bridges are prepared before).
pub struct TlsPeers(pub Arc<OnceLock<Workers>>);

impl WireGuardPeers for TlsPeers {
    fn request_handshake(&self, peer: &PublicKey) {
        if let Some(workers) = self.0.get() {
            let peer = *peer;
            workers.run_each(move |device, _| device.request_handshake(&peer));
        }
    }

    fn peer_traffic(&self, peer: &PublicKey) -> PeerTraffic {
        let Some(workers) = self.0.get() else {
            return PeerTraffic::NotStarted;
        };
        let peer = *peer;
        let Some(traffic) = workers.run_each(move |device, _| device.peer_traffic(&peer)) else {
            return PeerTraffic::Stopped;
        };
        // Summed over the workers: only those carrying the peer's sessions count anything.
        let (sent, received) = traffic
            .into_iter()
            .flatten()
            .fold((0, 0), |(tx, rx), (t, r)| (tx + t, rx + r));
        PeerTraffic::Counted { sent, received }
    }

    fn move_peer(&self, peer: &PublicKey, endpoint: SocketAddr) {
        if let Some(workers) = self.0.get() {
            let peer = *peer;
            workers.run_each(move |device, _| device.move_peer(&peer, endpoint));
        }
    }
}
