//! Bringing a WireGuard interface up: the TUN queues, the sockets, addresses and routes, the
//! AEAD, the backend, one worker thread per queue, and the UAPI socket (`gateway.rs` calls it).
//!
//! Teardown is by ownership: the TUN device is not persistent, so when the workers (which own
//! its queues) are dropped the kernel removes the interface with its addresses and routes;
//! the UAPI socket file is removed by a guard. Every exit path, error or stop, runs both.

use crate::load;
use crate::netlink::Netlink;
use crate::uapi_server::UapiServer;
use anyhow::Context;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tunneld_config::{self as config, Backend, DataplaneConfig};
use tunneld_dataplane::tun::Tun;
use tunneld_dataplane::udp::UdpSocket;
use tunneld_dataplane::uring::{self, UringTun, UringUdp};
use tunneld_dataplane::worker::{Worker, Workers};
use tunneld_dataplane::{DatagramIo, PacketIo};
use tunneld_tunnel::{Device, DeviceSettings, PeerSettings};

/// A running WireGuard interface: its worker and UAPI threads.
pub(crate) struct RunningWireGuard {
    pub name: String,
    /// The UDP port the interface listens on.
    pub port: u16,
    /// The interface's link index, for route changes.
    pub link: u32,
    pub public_key: tunneld_crypto::PublicKey,
    pub workers: Workers,
    pub threads: Vec<std::thread::JoinHandle<()>>,
    /// Serving the UAPI socket, if asked for (dropping it removes the socket).
    pub uapi: Option<crate::uapi_server::Serving>,
    /// The sockets' `fwmark`, for the UAPI server and reloads.
    pub marks: Arc<Mutex<crate::uapi_server::SocketMarks>>,
    /// `backend = "xdp"`: what keeps the XDP program's view of the interface current (its
    /// program is detached when the last worker's socket and this are dropped).
    pub _xdp: Option<Box<tunneld_dataplane::xdp::Underlay>>,
}

/// The kernel's limit on the queues of one TUN device.
const MAX_WORKERS: usize = 256;

/// How many workers: as configured, or for `auto` one per CPU tunneld may run on (`cpus` if
/// given), except for a config whose only peer is a plain one: one worker carries all of a
/// plain peer's sessions, so more could only add hand-offs (and wake-ups) to its packets.
pub(crate) fn worker_count(
    dataplane: &DataplaneConfig,
    peers: &[tunneld_config::PeerConfig],
) -> usize {
    let one_plain_link = matches!(peers, [peer] if peer.parallel.is_plain());
    match (dataplane.workers, &dataplane.cpus) {
        (config::Workers::Count(n), _) => n,
        (config::Workers::Auto, _) if one_plain_link => 1,
        (config::Workers::Auto, Some(cpus)) => cpus.len(),
        (config::Workers::Auto, None) => {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        }
    }
    .clamp(1, MAX_WORKERS)
}

/// The CPU each worker is pinned to: `cpus` in turn, or else the CPUs this process may use,
/// those on the NUMA node of the network device toward the first peer first, so that
/// workers land on different cores near their packets.
fn worker_cpus(
    dataplane: &DataplaneConfig,
    workers: usize,
    peers: &[tunneld_tunnel::PeerSettings],
) -> Vec<Option<usize>> {
    use crate::topology;
    let cpus = match &dataplane.cpus {
        Some(cpus) => cpus.clone(),
        None => {
            let node = peers
                .iter()
                .find_map(|p| p.endpoint)
                .and_then(topology::underlay_node);
            if let Some(node) = node {
                tracing::info!(node, "workers go on the underlay device's NUMA node first");
            }
            topology::placement(&topology::allowed_cpus(), node, topology::cpu_node)
        }
    };
    (0..workers)
        .map(|i| (!cpus.is_empty()).then(|| cpus[i % cpus.len()]))
        .collect()
}

/// What a start does beyond the interface itself.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StartOptions {
    pub use_uring: bool,
    /// Serve `/var/run/wireguard/<name>.sock` for `wg`.
    pub uapi: bool,
    /// Drop every capability but `CAP_NET_ADMIN` before the worker threads start.
    pub drop_privileges: bool,
}

/// The WireGuard interface with no dataplane yet: its UAPI socket (bound, not served), its
/// TUN queues, its MTU set.
pub(crate) struct Opened {
    pub name: String,
    pub mtu: u16,
    pub uapi: Option<UapiServer>,
    pub tuns: Vec<Tun>,
    pub netlink: Netlink,
    pub index: u32,
}

/// Creates the interface: binds its UAPI socket (when asked), opens one TUN queue per worker
/// and sets the MTU. The socket first: it refuses to start a second tunneld for the same
/// interface before anything else is touched.
pub(crate) fn open_interface(
    name: &str,
    mtu: u16,
    workers: usize,
    dataplane: &DataplaneConfig,
    uapi: bool,
) -> anyhow::Result<Opened> {
    let uapi = if uapi {
        Some(UapiServer::bind(name)?)
    } else {
        None
    };
    let tuns = if workers > 1 {
        Tun::open_queues(name, workers, dataplane.tun_offload)?
    } else if dataplane.tun_offload {
        vec![Tun::open_with_offloads(name)?]
    } else {
        vec![Tun::open(name)?]
    };
    let mut netlink = Netlink::open().context("cannot open a netlink socket")?;
    let index = netlink.link_index(name)?;
    netlink.set_mtu(index, mtu.into())?;
    Ok(Opened {
        name: name.to_string(),
        mtu,
        uapi,
        tuns,
        netlink,
        index,
    })
}

/// The interface's UDP sockets, bound and set up as `dataplane` says (fallible: the port may
/// be taken), before anything is committed to a dataplane.
pub(crate) fn bind_dataplane_sockets(
    port: u16,
    fwmark: u32,
    workers: usize,
    dataplane: &DataplaneConfig,
) -> anyhow::Result<Vec<UdpSocket>> {
    let mut sockets = bind_sockets(port, workers)?;
    for udp in &mut sockets {
        if fwmark != 0 {
            udp.set_mark(fwmark)?;
        }
        udp.set_gso(dataplane.udp_gso);
        udp.set_gro(dataplane.udp_gro);
    }
    Ok(sockets)
}

pub(crate) fn start_wireguard(
    wg: load::WireGuard,
    dataplane: &DataplaneConfig,
    workers: usize,
    options: StartOptions,
) -> anyhow::Result<RunningWireGuard> {
    let mut opened = open_interface(
        &wg.interface.name,
        wg.interface.mtu,
        workers,
        dataplane,
        options.uapi,
    )?;
    let sockets =
        bind_dataplane_sockets(wg.device.listen_port, wg.device.fwmark, workers, dataplane)?;
    for addr in &wg.interface.addresses {
        opened.netlink.add_address(opened.index, *addr)?;
    }
    opened.netlink.set_up(opened.index)?;
    let uapi = opened.uapi.take();
    let mut running = run_dataplane(
        opened, sockets, wg.device, wg.peers, dataplane, options, true,
    )?;
    if let Some(uapi) = uapi {
        let routes = Netlink::open().context("cannot open a netlink socket")?;
        running.uapi = Some(uapi.serve(crate::uapi_server::worker_answers(
            running.workers.clone(),
            Some((routes, running.link)),
            running.marks.clone(),
        ))?);
    }
    Ok(running)
}

/// Starts the dataplane of an opened interface on `sockets`: one device and worker per TUN
/// queue, each with `peers`; with `routes`, a route for each allowed IP. The UAPI socket is
/// the caller's to serve.
pub(crate) fn run_dataplane(
    opened: Opened,
    sockets: Vec<UdpSocket>,
    device_settings: DeviceSettings,
    peers: Vec<PeerSettings>,
    dataplane: &DataplaneConfig,
    options: StartOptions,
    routes: bool,
) -> anyhow::Result<RunningWireGuard> {
    let Opened {
        name,
        mtu,
        tuns,
        mut netlink,
        index,
        ..
    } = opened;
    let workers = tuns.len();
    let mut marks = crate::uapi_server::SocketMarks::new(&sockets, device_settings.fwmark)
        .context("cannot keep the UDP sockets for fwmark changes")?;
    let (tun, udp) = (&tuns[0], &sockets[0]);
    let listen_port = udp.local_port();
    let cpus = worker_cpus(dataplane, workers, &peers);
    let now = Instant::now();
    let devices: Vec<Device> = (0..workers)
        .map(|i| {
            let mut device = Device::for_worker(
                device_settings.clone(),
                peers.clone(),
                now,
                i,
                workers,
                tunneld_dataplane::system_environment(),
            );
            device.set_listen_port(listen_port);
            device
        })
        .collect();
    let device = &devices[0];
    let public_key = device.public_key();
    if routes {
        for route in device.routes() {
            netlink.add_route(index, route)?;
        }
    }
    tracing::info!(
        interface = %name,
        public_key = %device.public_key(),
        listen_port = device.listen_port(),
        peers = device.peer_count(),
        workers,
        udp_gso = udp.gso(),
        // The AF_XDP backend turns GRO off on its kernel socket (it copies datagram by
        // datagram into UMEM chunks).
        udp_gro = udp.gro() && dataplane.backend != Backend::Xdp,
        tun_tso = tun.offloads().tcp,
        tun_uso = tun.offloads().udp,
        "interface up"
    );
    let aead = tunneld_crypto::aead::choose(dataplane.aead);
    tracing::info!(
        "data-message AEAD: ChaCha20-Poly1305 from {} ({})",
        aead.implementation.name(),
        aead.reason
    );
    if dataplane.udp_gso && !udp.gso() {
        tracing::info!("UDP GSO is not available on this kernel; sending datagram by datagram");
    }
    if dataplane.udp_gro && !udp.gro() {
        tracing::info!("UDP GRO is not available on this kernel; receiving datagram by datagram");
    }
    if dataplane.tun_offload && !tun.offloads().tcp {
        tracing::info!("TUN offloads are not available on this kernel; packet by packet");
    }

    let settings = WorkerSettings {
        name: &name,
        busy_poll: Duration::from_micros(dataplane.busy_poll_us.into()),
        cpus,
        mtu: usize::from(mtu),
        drop_privileges: options.drop_privileges,
        keep_bpf: dataplane.backend == Backend::Xdp,
    };
    let mut xdp = None;
    let parts = devices.into_iter().zip(tuns).zip(sockets);
    let (threads, handles) = if dataplane.backend == Backend::Xdp {
        let (underlay_name, ifindex) = xdp_interface(dataplane, &peers, &mut netlink)?;
        let (sockets, parts): (Vec<_>, Vec<_>) = parts
            .map(|((device, tun), udp)| (udp, (device, tun)))
            .unzip();
        let mut underlay =
            tunneld_dataplane::xdp::start(ifindex, sockets, dataplane.xdp_checksum_offload)
                .map_err(|e| anyhow::anyhow!("dataplane.backend = \"xdp\": {e}"))?;
        tracing::info!(
            interface = %underlay_name,
            mode = ?underlay.attach,
            copy = ?underlay.copy,
            queues = underlay.queues,
            udp_checksums = %underlay.tx_checksum,
            "dataplane backend: AF_XDP"
        );
        let parts = parts
            .into_iter()
            .zip(std::mem::take(&mut underlay.sockets))
            .map(|((device, tun), udp)| (device, tun, udp))
            .collect();
        let started = start_workers(parts, &settings)?;
        // After the privileges are dropped: its threads keep only what they need.
        underlay.start_threads()?;
        marks = marks.with_nexthops(underlay.nexthops());
        xdp = Some(Box::new(underlay));
        started
    } else if options.use_uring {
        let mut uring_parts = Vec::new();
        for ((device, tun), udp) in parts {
            // With offloads, TUN reads are up to 64 KiB each: reading them straight into the
            // batch beats a multishot read that lands them in a provided buffer to be copied.
            let tun = if tun.offloads().tcp {
                UringTun::with_single_reads(tun)
            } else {
                UringTun::new(tun)
            }
            .context("cannot read the TUN device through io_uring")?;
            let udp = UringUdp::new(udp).context("cannot use the UDP socket through io_uring")?;
            uring_parts.push((device, tun, udp));
        }
        tracing::info!(
            tun_multishot = uring_parts[0].1.multishot(),
            "dataplane backend: io_uring"
        );
        start_workers(uring_parts, &settings)?
    } else {
        tracing::info!("dataplane backend: recvmmsg/sendmmsg");
        let parts = parts
            .map(|((device, tun), udp)| (device, tun, udp))
            .collect();
        start_workers(parts, &settings)?
    };
    let workers = Workers::new(handles);
    Ok(RunningWireGuard {
        name,
        port: listen_port,
        link: index,
        public_key,
        workers,
        threads,
        uapi: None,
        marks: Arc::new(Mutex::new(marks)),
        _xdp: xdp,
    })
}

const NO_XDP_INTERFACE: &str =
    "dataplane.xdp_interface: no peer has an endpoint to find the underlay interface by; name it";

/// The underlay interface for `backend = "xdp"`: as configured, else the one the route to
/// the first peer's endpoint leaves by.
fn xdp_interface(
    dataplane: &DataplaneConfig,
    peers: &[PeerSettings],
    netlink: &mut Netlink,
) -> anyhow::Result<(String, u32)> {
    let name = match &dataplane.xdp_interface {
        Some(name) => name.clone(),
        None => {
            let endpoint = peers
                .iter()
                .find_map(|p| p.endpoint)
                .ok_or_else(|| anyhow::anyhow!(NO_XDP_INTERFACE))?;
            crate::topology::underlay_interface(endpoint).ok_or_else(|| {
                anyhow::anyhow!(
                    "dataplane.xdp_interface: no interface has a route to {endpoint}; name it"
                )
            })?
        }
    };
    let index = netlink
        .link_index(&name)
        .with_context(|| format!("dataplane.xdp_interface: no interface {name}"))?;
    Ok((name, index))
}

/// The interface's UDP socket, or with several workers one socket each in a `SO_REUSEPORT`
/// group with the steering program. The port is first bound alone, so that a port another
/// program (or another tunneld) holds is an error rather than a group shared with it.
fn bind_sockets(port: u16, workers: usize) -> anyhow::Result<Vec<UdpSocket>> {
    let context = || format!("cannot listen on UDP port {port}");
    let alone = UdpSocket::bind(port).with_context(context)?;
    if workers == 1 {
        return Ok(vec![alone]);
    }
    let port = alone.local_port();
    drop(alone);
    let any = std::net::SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port));
    UdpSocket::bind_group(any, workers).with_context(context)
}

/// Refuses, before anything is created, the dataplane settings this build cannot honour, so
/// that a config never silently runs differently from what it says.
pub(crate) fn check_dataplane(
    dataplane: &DataplaneConfig,
    mtu: u16,
    workers: usize,
    peers: &[tunneld_tunnel::PeerSettings],
) -> Result<(), String> {
    if dataplane.backend == Backend::Xdp {
        let max = tunneld_dataplane::xdp::backend::MAX_DATAGRAM - 32 - 15;
        if usize::from(mtu) > max {
            return Err(format!(
                "interface.mtu: {mtu} is more than an AF_XDP frame holds with dataplane.backend = \"xdp\" (at most {max})"
            ));
        }
        if dataplane.xdp_interface.is_none() && !peers.iter().any(|p| p.endpoint.is_some()) {
            return Err(NO_XDP_INTERFACE.into());
        }
    }
    if let config::Workers::Count(n) = dataplane.workers {
        if n > MAX_WORKERS {
            return Err(format!(
                "dataplane.workers: {n} is more than a TUN device has queues ({MAX_WORKERS})"
            ));
        }
    }
    for (i, peer) in peers.iter().enumerate() {
        if usize::from(peer.parallel) > workers {
            return Err(format!(
                "peer[{i}].parallel: {} sub-tunnels need as many workers, and this interface has {workers} (dataplane.workers)",
                peer.parallel
            ));
        }
    }
    Ok(())
}

/// Whether the worker uses io_uring: for `uring` (an error when the kernel cannot), never
/// for `mmsg`. `auto` takes recvmmsg/sendmmsg: side by side (docs/benchmarks.md) it carries
/// bulk TCP at more Gbit per CPU-second and lower RTT than io_uring, which copies each
/// received datagram out of its provided buffer; io_uring wins only on small-packet rate.
pub(crate) fn choose_uring(backend: Backend) -> Result<bool, String> {
    match backend {
        Backend::Uring => uring::probe().map(|()| true).map_err(|e| {
            format!("dataplane.backend = \"uring\": io_uring is not usable here: {e}")
        }),
        Backend::Auto | Backend::Mmsg | Backend::Xdp => Ok(false),
    }
}

/// What the worker threads are started with, whatever their backends.
struct WorkerSettings<'a> {
    name: &'a str,
    busy_poll: Duration,
    /// Per worker.
    cpus: Vec<Option<usize>>,
    mtu: usize,
    drop_privileges: bool,
    /// AF_XDP: keep CAP_BPF too, to update the XDP program's address map.
    keep_bpf: bool,
}

type Started = (
    Vec<std::thread::JoinHandle<()>>,
    Vec<tunneld_dataplane::worker::WorkerHandle>,
);

/// Starts one worker per (device, TUN queue, socket), joined by their hand-off rings, each
/// on its own thread, pinned when it has a CPU. Privileges are dropped first when asked:
/// everything that needs root is done, and the threads inherit what is left.
fn start_workers<P, D>(
    parts: Vec<(Device, P, D)>,
    settings: &WorkerSettings<'_>,
) -> anyhow::Result<Started>
where
    P: PacketIo + Send + 'static,
    D: DatagramIo + Send + 'static,
{
    let mut workers = Vec::new();
    let mut handles = Vec::new();
    for (device, tun, udp) in parts {
        let (mut worker, handle) =
            Worker::new(device, tun, udp).context("cannot start the worker")?;
        worker.set_busy_poll(settings.busy_poll);
        workers.push(worker);
        handles.push(handle);
    }
    Worker::connect(&mut workers, settings.mtu);
    if settings.drop_privileges {
        if settings.keep_bpf {
            crate::privileges::drop_to_net_admin_and_bpf();
        } else {
            crate::privileges::drop_to_net_admin();
        }
    }
    let mut threads = Vec::new();
    for (i, worker) in workers.into_iter().enumerate() {
        let cpu = settings.cpus.get(i).copied().flatten();
        let thread = std::thread::Builder::new()
            .name(format!("worker{i}-{}", settings.name))
            .spawn(move || {
                if let Some(cpu) = cpu {
                    pin_to_cpu(i, cpu);
                }
                drop(worker.run())
            })
            .context("cannot start a worker thread")?;
        threads.push(thread);
    }
    Ok((threads, handles))
}

/// Pins the calling thread to `cpu`; a CPU that does not exist or is not allowed is logged
/// and the thread runs unpinned.
fn pin_to_cpu(worker: usize, cpu: usize) {
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET only write inside it (CPU_SET ignores
    // numbers beyond its size), and sched_setaffinity reads it for the calling thread (pid 0).
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc == 0 {
        tracing::info!(worker, cpu, "worker pinned");
    } else {
        tracing::warn!(
            worker,
            "cannot pin worker {worker} to CPU {cpu}: {}; it runs unpinned",
            std::io::Error::last_os_error()
        );
    }
}
