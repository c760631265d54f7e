//! Bringing a WireGuard interface up: the TUN queues, the sockets, addresses and routes, the
//! AEAD, the backend, one worker thread per queue, and the UAPI socket (`gateway.rs` calls it).
//!
//! Teardown is by ownership: the TUN device is not persistent, so when the workers (which own
//! its queues) are dropped the kernel removes the interface with its addresses and routes;
//! the UAPI socket file is removed by a guard. Every exit path, error or stop, runs both.

use crate::control::{lock, Control, ControlHandle, ReloadBase, SocketMarks};
use crate::netlink::Netlink;
use crate::plan;
use crate::uapi_server::UapiServer;
use anyhow::Context;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tunneld_config::{Backend, Config, DataplaneConfig};
use tunneld_dataplane::tun::Tun;
use tunneld_dataplane::udp::UdpSocket;
use tunneld_dataplane::uring::{UringTun, UringUdp};
use tunneld_dataplane::worker::{Worker, Workers};
use tunneld_dataplane::{DatagramIo, PacketIo};
use tunneld_wireguard::{Device, DeviceSettings, PeerSettings};

/// A running WireGuard interface: its worker and UAPI threads.
pub(crate) struct RunningWireGuard {
    pub name: String,
    /// The UDP port the interface listens on.
    pub port: u16,
    pub public_key: tunneld_crypto::PublicKey,
    pub workers: Workers,
    pub threads: Vec<std::thread::JoinHandle<()>>,
    /// Serving the UAPI socket, if asked for (dropping it removes the socket).
    pub uapi: Option<crate::uapi_server::Serving>,
    /// The one lock every writer goes through: the UAPI socket, the library, reloads.
    pub control: ControlHandle,
    /// `backend = "xdp"`: what keeps the XDP program's view of the interface current (its
    /// program is detached when the last worker's socket and this are dropped).
    pub _xdp: Option<Box<tunneld_dataplane::xdp::Underlay>>,
}

/// The CPU each worker is pinned to: `cpus` in turn, or else the CPUs this process may use,
/// those on the NUMA node of the network device toward the first peer first, so that
/// workers land on different cores near their packets.
fn worker_cpus(
    dataplane: &DataplaneConfig,
    workers: usize,
    peers: &[tunneld_wireguard::PeerSettings],
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
    plan: &plan::Dataplane,
    uapi: bool,
) -> anyhow::Result<Opened> {
    let (workers, dataplane) = (plan.workers, &plan.config);
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
    plan: &plan::Dataplane,
) -> anyhow::Result<Vec<UdpSocket>> {
    let dataplane = &plan.config;
    let mut sockets = bind_sockets(port, plan.workers)?;
    for udp in &mut sockets {
        if fwmark != 0 {
            udp.set_mark(fwmark)?;
        }
        udp.set_gso(dataplane.udp_gso);
        udp.set_gro(dataplane.udp_gro);
    }
    Ok(sockets)
}

/// Brings up an interface from settings (`tunneld up`, the library): the one start
/// sequence, which the bare mode runs in two parts (the interface at once, the rest when a
/// key arrives): [`open_interface`], [`bind_dataplane_sockets`], [`run_dataplane`].
pub(crate) fn start_wireguard(
    wg: plan::WireGuard,
    options: StartOptions,
    path: Option<PathBuf>,
    config: Config,
) -> anyhow::Result<RunningWireGuard> {
    let dataplane = &wg.dataplane;
    let opened = open_interface(
        &wg.interface.name,
        wg.interface.mtu,
        dataplane,
        options.uapi,
    )?;
    let sockets = bind_dataplane_sockets(wg.device.listen_port, wg.device.fwmark, dataplane)?;
    let from_settings = FromSettings { path, config };
    run_dataplane(
        opened,
        sockets,
        wg.device,
        wg.peers,
        dataplane,
        options,
        Some(from_settings),
    )
}

/// An interface brought up from settings, not bare: it gets the settings' addresses and a
/// route for each allowed IP, and it can be reloaded.
pub(crate) struct FromSettings {
    /// The config file, for one started from a file.
    pub path: Option<PathBuf>,
    pub config: Config,
}

/// Starts the dataplane of an opened interface on `sockets`: one device and worker per TUN
/// queue, each with `peers`, and the control handle over them; `from_settings`, the
/// addresses, the link set up and a route for each allowed IP. Serves the UAPI socket if the
/// interface was opened with it (the bare mode serves its own from the start).
pub(crate) fn run_dataplane(
    opened: Opened,
    sockets: Vec<UdpSocket>,
    device_settings: DeviceSettings,
    peers: Vec<PeerSettings>,
    plan: &plan::Dataplane,
    options: StartOptions,
    from_settings: Option<FromSettings>,
) -> anyhow::Result<RunningWireGuard> {
    let dataplane = &plan.config;
    let Opened {
        name,
        mtu,
        tuns,
        mut netlink,
        index,
        uapi,
    } = opened;
    if let Some(settings) = &from_settings {
        let addresses = settings.config.interface.iter().flat_map(|i| &i.addresses);
        for addr in addresses {
            netlink.add_address(index, *addr)?;
        }
        netlink.set_up(index)?;
    }
    let workers = tuns.len();
    let mut marks = SocketMarks::new(&sockets, device_settings.fwmark)
        .context("cannot keep the UDP sockets for fwmark changes")?;
    let (tun, udp) = (&tuns[0], &sockets[0]);
    let listen_port = udp.local_port();
    let cpus = worker_cpus(dataplane, workers, &peers);
    let now = Instant::now();
    // One cookie secret for the interface: a cookie any worker gives out is good at all.
    let cookies = tunneld_dataplane::system_cookie_secret();
    let devices: Vec<Device> = (0..workers)
        .map(|i| {
            let mut device = Device::for_worker(
                device_settings.clone(),
                peers.clone(),
                now,
                i,
                workers,
                tunneld_dataplane::system_environment().with_cookie_secret(cookies.clone()),
            );
            device.set_listen_port(listen_port);
            device.set_clamp_mss(match dataplane.clamp_mss {
                tunneld_config::ClampMss::Off => None,
                tunneld_config::ClampMss::Auto => Some(tunneld_wireguard::packet::mss_for_mtu(mtu)),
                tunneld_config::ClampMss::Mss(mss) => Some((mss, mss.saturating_sub(20))),
            });
            device
        })
        .collect();
    let device = &devices[0];
    let public_key = device.public_key();
    if from_settings.is_some() {
        // In batches: a hub's thousands of routes in a few system calls.
        netlink.add_routes(index, &device.routes())?;
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
    } else if plan.use_uring {
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
    let routes = from_settings.map(|settings| {
        let base = ReloadBase {
            path: settings.path,
            config: settings.config,
            peers: peers.clone(),
        };
        (netlink, index, base)
    });
    let control = Control::new(workers.clone(), plan.workers, marks, routes);
    let mut running = RunningWireGuard {
        name,
        port: listen_port,
        public_key,
        workers,
        threads,
        uapi: None,
        control,
        _xdp: xdp,
    };
    if let Some(uapi) = uapi {
        let control = running.control.clone();
        match uapi.serve(move |request| lock(&control).answer(request)) {
            Ok(serving) => running.uapi = Some(serving),
            Err(e) => {
                running.stop();
                return Err(e);
            }
        }
    }
    Ok(running)
}

impl RunningWireGuard {
    /// Stops the workers and waits for them; `false` if one had failed. The interface goes
    /// with the last of its queues, and the UAPI socket with `uapi`.
    pub(crate) fn stop(self) -> bool {
        self.workers.shutdown();
        let failed = self
            .threads
            .into_iter()
            .map(|t| t.join())
            .any(|r| r.is_err());
        drop(self.uapi);
        !failed
    }
}

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
                .ok_or_else(|| anyhow::anyhow!(plan::NO_XDP_INTERFACE))?;
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
