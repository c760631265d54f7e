//! The sans-IO WireGuard core of tunneld.
//!
//! Everything here is a deterministic function of (state, input, `now`): no sockets, no threads,
//! no clock reads. The dataplane feeds packets and datagrams in and drains what the core writes
//! into [`sink`] implementations; timers run when the caller calls `Device::tick`.

#![forbid(unsafe_code)]

pub mod packet;
pub mod sink;

pub use sink::{DatagramSink, PacketSink};
