//! Where the core writes what it produces. The dataplane's batches implement these, so the core
//! writes straight into the buffers that go to the kernel, with no intermediate copy or allocation.

use std::net::SocketAddr;

/// Datagrams bound for the underlay (UDP).
pub trait DatagramSink {
    /// The next free buffer, at least [`crate::packet::MAX_DATAGRAM`] bytes long, or `None` when
    /// the batch is full (the core then counts a drop).
    fn slot(&mut self) -> Option<&mut [u8]>;
    /// Commits the first `len` bytes of the buffer last returned by `slot`, to be sent to `to`.
    fn push(&mut self, len: usize, to: SocketAddr);
}

/// IP packets bound for the overlay (TUN).
pub trait PacketSink {
    /// The next free buffer, at least [`crate::packet::MAX_DATAGRAM`] bytes long, or `None` when full.
    fn slot(&mut self) -> Option<&mut [u8]>;
    /// Commits the first `len` bytes of the buffer last returned by `slot`.
    fn push(&mut self, len: usize);
}
