//! tunneld's own WireGuard protocol: the Noise IKpsk2 handshake, cookies, sessions with
//! their replay windows, and the timers that drive them. Data messages are sealed and opened
//! in place by `tunneld_crypto::aead`.

pub mod cookie;
pub mod handshake;
pub mod replay;
pub mod session;
pub mod sessions;

pub use sessions::{Local, Opened, Sent, Sessions, Timer};

use crate::stats::DropReason;
use handshake::HandshakeError;

/// The drop counter a failed handshake message counts under.
pub(crate) fn drop_reason(e: &HandshakeError) -> DropReason {
    match e {
        HandshakeError::BadMac1 => DropReason::InvalidMac,
        HandshakeError::UnknownPeer => DropReason::UnknownPeer,
        HandshakeError::WrongIndex => DropReason::UnknownIndex,
        // A sealed handshake field that does not open: most often, the preshared keys differ.
        HandshakeError::Decryption => DropReason::DecryptFailed,
        HandshakeError::LowOrderKey => DropReason::HandshakeRejected,
        // Handed to the worker that carries the peer, not dropped; counted if it ever is.
        HandshakeError::NotCarriedHere => DropReason::UnknownPeer,
    }
}
