//! The AF_XDP underlay: WireGuard datagrams to and from the interface's queues without the
//! kernel's UDP stack.
//!
//! - `program.rs`, `bpf.rs` — the XDP program (assembled here, loaded with bpf(2)) that
//!   redirects UDP datagrams to the tunnel's port on the interface's addresses to the
//!   receiving queue's AF_XDP socket, and passes everything else on to the kernel.
//! - `socket.rs` — an AF_XDP socket: UMEM, rings, binding to a queue, TX metadata.
//! - `device.rs` — what the interface's driver offers: its queues, TX checksums.
//! - `frame.rs` — Ethernet, IP and UDP headers: written in front of a sealed datagram,
//!   parsed off a received one.
//! - `nexthop.rs` — next hops from the kernel's routing and neighbour tables, kept current
//!   by their change events.
//! - `backend.rs` — `XdpUdp`, a worker's underlay over both sockets.
//!
//! [`start`] brings it up for all of an interface's workers.

pub mod backend;
pub mod bpf;
pub mod device;
pub mod frame;
pub mod nexthop;
pub mod program;
pub mod socket;

pub use backend::XdpUdp;
pub use device::interface_queues;
pub use program::AttachMode;
pub use socket::{CopyMode, TxChecksum};

use crate::udp::UdpSocket;
use crate::DatagramIo;
use nexthop::NextHops;
use program::XdpProgram;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What [`start`] brought up.
#[derive(Debug)]
pub struct Underlay {
    /// One per socket given, in order.
    pub sockets: Vec<XdpUdp>,
    pub attach: AttachMode,
    /// How the first socket is bound.
    pub copy: CopyMode,
    /// Who computes the first socket's UDP checksums.
    pub tx_checksum: TxChecksum,
    /// The interface's receive queues (the first `queues` workers have AF_XDP sockets).
    pub queues: u32,
    ifindex: u32,
    program: Arc<XdpProgram>,
    nexthops: Arc<NextHops>,
    /// Keeps the XDP program's address map current, once started.
    addresses: Option<AddressKeeper>,
}

impl Underlay {
    /// The interface's next hops, shared with the workers: a new `fwmark` goes there
    /// ([`NextHops::set_mark`]) as well as on the kernel sockets.
    pub fn nexthops(&self) -> Arc<NextHops> {
        self.nexthops.clone()
    }

    /// Starts the threads that follow the kernel's tables: the next-hop monitor and the
    /// keeper of the program's addresses. Call it after dropping privileges (threads keep
    /// the capabilities of the thread that starts them); it needs `CAP_BPF` kept.
    pub fn start_threads(&mut self) -> io::Result<()> {
        self.nexthops.start_monitor()?;
        if self.addresses.is_none() {
            self.addresses = Some(AddressKeeper::start(
                &self.program,
                self.ifindex,
                self.nexthops.clone(),
            )?);
        }
        Ok(())
    }
}

/// Attaches the XDP program to interface `ifindex` and makes one [`XdpUdp`] per kernel
/// socket (bound to the tunnel's port, one per worker): worker `i` gets an AF_XDP socket on
/// queue `i` when the interface has that many. Driver mode first (zero-copy where the driver
/// can), then generic mode; each step down is logged once with its reason. An error says
/// why AF_XDP cannot run here at all.
/// `checksum_offload`: leave UDP checksums to the device where it computes them.
pub fn start(ifindex: u32, kernel: Vec<UdpSocket>, checksum_offload: bool) -> io::Result<Underlay> {
    let port = kernel.first().map(|s| s.local_port()).unwrap_or(0);
    let queues = interface_queues(ifindex).max(1);
    let nexthops = NextHops::new(ifindex)?;
    // Routes are asked as the kernel routes the sockets' own sends (`fwmark`).
    if let Some(socket) = kernel.first() {
        nexthops.set_mark(socket.mark()?);
    }
    let mut program = XdpProgram::load(port, queues)?;
    program.set_addresses(&nexthop::interface_addresses(ifindex)?)?;
    let attach = match program.attach(ifindex, AttachMode::Driver) {
        Ok(()) => AttachMode::Driver,
        Err(e) => {
            tracing::info!("XDP: the driver takes no program ({e}); generic (SKB) mode");
            program.attach(ifindex, AttachMode::Generic)?;
            AttachMode::Generic
        }
    };
    let program = Arc::new(program);
    let zero_copy = attach == AttachMode::Driver;
    let mut sockets = Vec::with_capacity(kernel.len());
    for (i, socket) in kernel.into_iter().enumerate() {
        let queue = u32::try_from(i).ok().filter(|&q| q < queues);
        let xdp = XdpUdp::new(
            socket,
            program.clone(),
            queue,
            zero_copy,
            checksum_offload,
            &nexthops,
        )?;
        sockets.push(xdp);
    }
    let copy = sockets
        .first()
        .and_then(XdpUdp::mode)
        .unwrap_or(CopyMode::Copy);
    let tx_checksum = sockets
        .first()
        .and_then(XdpUdp::tx_checksum)
        .unwrap_or(TxChecksum::Software("no AF_XDP socket"));
    if zero_copy && copy == CopyMode::Copy {
        tracing::info!("AF_XDP: the driver has no zero-copy mode; copy mode");
    }
    if sockets.len() > queues as usize {
        tracing::info!(
            "AF_XDP: the interface has {queues} queue(s) for {} workers; workers past the queues send and receive through the kernel's UDP socket",
            sockets.len()
        );
    }
    Ok(Underlay {
        sockets,
        attach,
        copy,
        tx_checksum,
        queues,
        ifindex,
        program,
        nexthops,
        addresses: None,
    })
}

/// Keeps the XDP program's address map equal to the interface's addresses: a thread that
/// re-reads them when the kernel's tables change (at most every 200 ms), stopped on drop.
#[derive(Debug)]
pub struct AddressKeeper {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AddressKeeper {
    fn start(
        program: &Arc<XdpProgram>,
        ifindex: u32,
        nexthops: Arc<NextHops>,
    ) -> io::Result<AddressKeeper> {
        let mut current: Vec<IpAddr> = nexthop::interface_addresses(ifindex)?;
        program.set_addresses(&current)?;
        let map = program.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("xdp-addresses".into())
            .spawn(move || {
                let mut seen = nexthops.generation();
                while !stopped.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(200));
                    let now = nexthops.generation();
                    if now == seen {
                        continue;
                    }
                    seen = now;
                    match nexthop::interface_addresses(ifindex) {
                        Ok(addrs) if addrs != current => match map.set_addresses(&addrs) {
                            Ok(()) => current = addrs,
                            Err(e) => {
                                tracing::warn!("XDP: cannot update the program's addresses: {e}")
                            }
                        },
                        Ok(_) => {}
                        Err(e) => tracing::debug!("XDP: reading the interface's addresses: {e}"),
                    }
                }
            })?;
        Ok(AddressKeeper {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for AddressKeeper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
