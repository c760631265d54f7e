//! The sans-IO WireGuard core of tunneld.
//!
//! Everything here is a deterministic function of (state, input, `now`): no sockets, no threads,
//! no clock reads. The dataplane feeds packets and datagrams in and drains what the core writes
//! into [`sink`] implementations; timers run when the caller calls `Device::tick`.

#![forbid(unsafe_code)]
// Input from the network, config files and the UAPI socket must never panic: no unwrap or
// expect outside tests (an invariant that cannot fail says so with an `allow` and a reason).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod allowed_ips;
pub mod device;
pub mod event;
pub mod framing;
pub mod noise;
pub mod packet;
mod peer;
pub mod ratelimit;
pub mod sink;
pub mod stats;
pub mod uapi;
pub mod wire;

pub use device::{
    owner_of, worker_of_index, Device, DeviceSettings, Disposition, Environment, PeerChange,
    PeerSettings, SyncReport,
};
pub use noise::cookie::CookieSecret;
pub use sink::{DatagramSink, PacketSink};
pub use stats::{DropReason, Stats};
