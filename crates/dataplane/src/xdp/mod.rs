//! The AF_XDP underlay: WireGuard datagrams to and from the interface's queues without the
//! kernel's UDP stack.
//!
//! - `program.rs`, `bpf.rs` — the XDP program (assembled here, loaded with bpf(2)) that
//!   redirects UDP datagrams to the tunnel's port on the interface's addresses to the
//!   receiving queue's AF_XDP socket, and passes everything else on to the kernel.
//! - `socket.rs` — an AF_XDP socket: UMEM, rings, binding to a queue.
//! - `frame.rs` — Ethernet, IP and UDP headers: written in front of a sealed datagram,
//!   parsed off a received one.
//! - `nexthop.rs` — next hops from the kernel's routing and neighbour tables, kept current
//!   by their change events.
//! - `backend.rs` — `XdpUdp`, a worker's underlay over both sockets.
//!
//! [`start`] brings it up for all of an interface's workers.

pub mod backend;
pub mod bpf;
pub mod frame;
pub mod nexthop;
pub mod program;
pub mod socket;

pub use backend::XdpUdp;
pub use program::AttachMode;
pub use socket::CopyMode;

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
    /// The interface's receive queues (the first `queues` workers have AF_XDP sockets).
    pub queues: u32,
    ifindex: u32,
    program: Arc<XdpProgram>,
    nexthops: Arc<NextHops>,
    /// Keeps the XDP program's address map current, once started.
    addresses: Option<AddressKeeper>,
}

impl Underlay {
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
pub fn start(ifindex: u32, kernel: Vec<UdpSocket>) -> io::Result<Underlay> {
    let port = kernel.first().map(|s| s.local_port()).unwrap_or(0);
    let queues = interface_queues(ifindex).max(1);
    let nexthops = NextHops::new(ifindex)?;
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
        let xdp = XdpUdp::new(socket, program.clone(), queue, zero_copy, &nexthops)?;
        sockets.push(xdp);
    }
    let copy = sockets
        .first()
        .and_then(XdpUdp::mode)
        .unwrap_or(CopyMode::Copy);
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
        queues,
        ifindex,
        program,
        nexthops,
        addresses: None,
    })
}

/// The receive queues of interface `ifindex` (ETHTOOL_GCHANNELS in this thread's network
/// namespace), or 1 when the driver does not say.
pub fn interface_queues(ifindex: u32) -> u32 {
    let Ok(name) = interface_name(ifindex) else {
        return 1;
    };
    #[repr(C)]
    #[derive(Default)]
    struct Channels {
        cmd: u32,
        max_rx: u32,
        max_tx: u32,
        max_other: u32,
        max_combined: u32,
        rx_count: u32,
        tx_count: u32,
        other_count: u32,
        combined_count: u32,
    }
    const ETHTOOL_GCHANNELS: u32 = 0x3c;
    let mut channels = Channels {
        cmd: ETHTOOL_GCHANNELS,
        ..Channels::default()
    };
    // SAFETY: all-zero is a valid ifreq.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(name.as_bytes()) {
        *dst = *src as libc::c_char;
    }
    ifr.ifr_ifru.ifru_data = (&mut channels as *mut Channels).cast();
    // SAFETY: a plain datagram socket for the ioctl, closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return 1;
    }
    // SAFETY: SIOCETHTOOL with an ifreq whose data points at a live ethtool_channels.
    let rc = unsafe { libc::ioctl(fd, libc::SIOCETHTOOL, &mut ifr) };
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
    if rc < 0 {
        return 1;
    }
    channels.rx_count.max(channels.combined_count).max(1)
}

fn interface_name(ifindex: u32) -> io::Result<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` has IF_NAMESIZE bytes, as if_indextoname needs.
    let name = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if name.is_null() {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name into `buf`.
    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Ok(name.to_string_lossy().into_owned())
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
