//! The batch I/O traits every backend implements.
//!
//! Calls never block: they move as much as is ready (up to a batch) and return. The worker
//! waits for readiness on [`PacketIo::fd`]/[`DatagramIo::fd`] between turns.

use crate::Batch;
use std::io;
use std::os::fd::RawFd;

/// The overlay side: IP packets to and from the TUN device (or a simulated one).
pub trait PacketIo {
    /// Appends received packets to `batch` until it is full or nothing is ready.
    /// Returns how many were appended.
    fn recv_batch(&mut self, batch: &mut Batch) -> io::Result<usize>;
    /// Writes every packet in `batch`; packets the device refuses are dropped and counted by
    /// the caller from the return value (packets written). The batch is `mut` because a
    /// backend may rewrite headers in place (coalescing packets into a super-packet).
    fn send_batch(&mut self, batch: &mut Batch) -> io::Result<usize>;
    /// A descriptor that polls readable when packets are ready, if the backend has one.
    fn fd(&self) -> Option<RawFd>;
}

/// The underlay side: UDP datagrams to and from peers.
pub trait DatagramIo {
    /// Appends received datagrams (with their source address) to `batch`.
    fn recv_batch(&mut self, batch: &mut Batch) -> io::Result<usize>;
    /// Sends every datagram in `batch` to its address. Returns how many were sent. The batch
    /// is `mut` because a backend may write headers into the frames' headroom, or (over
    /// shared memory) give the frames to the kernel and put fresh ones in their place.
    fn send_batch(&mut self, batch: &mut Batch) -> io::Result<usize>;
    fn fd(&self) -> Option<RawFd>;
    /// The local port the socket is bound to.
    fn local_port(&self) -> u16;
    /// The worker's receive and send batches, for a backend whose frames are memory the
    /// kernel reads and writes directly (AF_XDP's UMEM), so that datagrams are opened where
    /// they were received and sealed where they are sent from. `None` (the default): the
    /// worker allocates its own.
    fn batches(&mut self) -> Option<(Batch, Batch)> {
        None
    }
    /// How many bytes wait in the kernel's receive queue and how many it holds, for a
    /// backend that can tell (a socket's `SO_MEMINFO`): the backlog that decides whether the
    /// device is under load (`Device::note_backlog`). `None` (the default): it cannot tell.
    fn backlog(&self) -> Option<(usize, usize)> {
        None
    }
}
