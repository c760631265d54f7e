//! The dataplane of tunneld: batches, batch I/O backends and the worker loop.

pub mod batch;
pub mod io;
pub mod offload;
pub mod sim;
pub mod tun;
pub mod udp;
pub mod worker;

pub use batch::{Batch, BATCH_SIZE, FRAME_PAYLOAD, HEADROOM};
pub use io::{DatagramIo, PacketIo};
