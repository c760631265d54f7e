//! The dataplane of tunneld: batches, batch I/O backends and the worker loop.

pub mod batch;
pub mod io;

pub use batch::{Batch, BATCH_SIZE, FRAME_PAYLOAD, HEADROOM};
pub use io::{DatagramIo, PacketIo};
