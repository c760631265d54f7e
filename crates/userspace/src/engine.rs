//! The engine: one thread that owns the WireGuard device, the underlay socket and the
//! user-space TCP/IP stack, and moves bytes between the stack's sockets and the handles'
//! rings.
//!
//! A turn: datagrams in (a batch per `recvmmsg`, decrypted into a batch of packets the stack
//! reads), the handles' rings served, the stack polled with the current time (it writes
//! its packets straight into the encryption path, whose datagrams leave in batches; its
//! TCP super-segments are cut to the MTU first, see `TxPath::send`), the rings served
//! again with what arrived, and the send batch flushed. Between turns the
//! thread waits in `poll` for the socket, a handle's wake-up, the stack's next timer or the
//! device's 250 ms tick.

use crate::peers::{self, Hub};
use crate::rings::{self, DatagramShared, StreamShared, DATAGRAM_RING, ERR_RESET, STREAM_RING};
use crate::settings::{invalid, Error, HandshakeFailed, TunnelSettings, HANDSHAKE_GIVE_UP};
use crate::TunnelStats;
use ipnet::IpNet;
use rtrb::{Consumer, Producer, RingBuffer};
use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{self, Checksum, DeviceCapabilities, Medium, PacketMeta};
use smoltcp::socket::{tcp, udp, Socket};
use smoltcp::wire::{HardwareAddress, IpAddress, IpCidr, IpEndpoint, IpListenEndpoint};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::num::{NonZeroU16, NonZeroUsize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tunneld_crypto::PublicKey;
use tunneld_dataplane::offload::{self, VnetHdr};
use tunneld_dataplane::udp::UdpSocket;
use tunneld_dataplane::{Batch, DatagramIo, BATCH_SIZE};
use tunneld_wireguard::event::{Event, Tracker};
use tunneld_wireguard::uapi::{PeerSnapshot, PeerUpdate, SetRequest};
use tunneld_wireguard::{Device, DeviceSettings, PeerChange, PeerSettings};

/// How long after answering an initiation the engine looks at the peers after every
/// receiving turn (the handshake completes at the initiator's first data message).
const RESPONDER_WATCH: Duration = Duration::from_secs(1);
/// The device's timers run this often (as in the dataplane's worker).
const TICK: Duration = Duration::from_millis(250);
/// The largest TCP packet the stack builds (it is cut to the MTU before encryption): an
/// IP packet's largest size.
const MAX_SUPER: usize = 65_535;
/// Each way, the stack's buffer of one TCP connection: its window, and what it keeps for
/// retransmission.
const TCP_BUFFER: usize = 2 << 20;
/// A connection whose peer stays silent this long with data outstanding is aborted (and a
/// connect that gets no answer in this time fails).
const TCP_TIMEOUT: Duration = Duration::from_secs(60);
/// The floor of a connection's retransmission timeout (Linux's).
const MIN_RTO: Duration = Duration::from_millis(200);
/// A connection whose handles are all gone gets this long to close gracefully.
const LINGER: Duration = Duration::from_secs(30);
/// Listen sockets kept ready per listener: connections being set up at once.
const BACKLOG: usize = 8;
/// Datagrams (and payload bytes) each UDP socket of the stack holds per direction.
const UDP_PACKETS: usize = 256;
const UDP_BUFFER: usize = 512 << 10;
/// Requests (connect, listen, bind) waiting for the engine.
const CONTROL_QUEUE: usize = 64;
/// UDP batches received per turn before the rest of the turn runs.
const BATCHES_PER_TURN: usize = 4;
/// Rounds of the stack's egress per turn (each sends at most one packet per socket): a
/// bound on the burst, so acknowledgements are read between bursts.
const EGRESS_ROUNDS: usize = 256;
/// Ephemeral ports for connects and port-0 binds.
const EPHEMERAL: std::ops::RangeInclusive<u16> = 49152..=65535;

const UDP_TOKEN: mio::Token = mio::Token(0);
const WAKE_TOKEN: mio::Token = mio::Token(1);

/// The error every handle returns once the engine has stopped.
pub(crate) fn aborted() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "the tunnel was shut down")
}

/// What the handles share with the engine.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) local_addr: SocketAddr,
    pub(crate) public_key: PublicKey,
    /// The largest UDP payload a datagram in the tunnel can carry (per family).
    pub(crate) max_udp_v4: usize,
    pub(crate) max_udp_v6: usize,
    waker: mio::Waker,
    /// A wake-up is pending (the engine clears it when it wakes), so handles making many
    /// changes during one turn make one system call.
    notified: AtomicBool,
    stopped: AtomicBool,
    control: mpsc::Sender<Control>,
    handshake_done: AtomicBool,
    tx_bytes: AtomicU64,
    rx_bytes: AtomicU64,
    drops: AtomicU64,
    /// Event subscribers and the peers' readiness (see `peers::Hub`).
    pub(crate) hub: Mutex<Hub>,
    /// Where names are resolved, inside the tunnel.
    pub(crate) dns_servers: Vec<IpAddr>,
}

impl Shared {
    /// Wakes the engine (once per turn however often it is called).
    pub(crate) fn notify(&self) {
        if !self.notified.swap(true, Ordering::AcqRel) {
            let _ = self.waker.wake();
        }
    }

    /// Stops the engine; handles fail from now on.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
    }

    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    pub(crate) async fn send_control(&self, control: Control) -> io::Result<()> {
        if self.is_stopped() {
            return Err(aborted());
        }
        self.control.send(control).await.map_err(|_| aborted())?;
        self.notify();
        Ok(())
    }

    pub(crate) fn stats(&self) -> TunnelStats {
        TunnelStats {
            handshake_done: self.handshake_done.load(Ordering::Relaxed),
            tx_bytes: self.tx_bytes.load(Ordering::Relaxed),
            rx_bytes: self.rx_bytes.load(Ordering::Relaxed),
            drops: self.drops.load(Ordering::Relaxed),
        }
    }
}

/// A handle's request.
#[derive(Debug)]
pub(crate) enum Control {
    Connect {
        remote: SocketAddr,
        reply: oneshot::Sender<io::Result<StreamParts>>,
    },
    Listen {
        local: SocketAddr,
        reply: oneshot::Sender<io::Result<ListenerParts>>,
    },
    UdpBind {
        local: SocketAddr,
        reply: oneshot::Sender<io::Result<DatagramParts>>,
    },
    AddPeer {
        peer: PeerSettings,
        reply: oneshot::Sender<Result<(), Error>>,
    },
    UpdatePeer {
        change: PeerChange,
        reply: oneshot::Sender<Result<(), Error>>,
    },
    RemovePeer {
        peer: PublicKey,
        reply: oneshot::Sender<Result<(), Error>>,
    },
    Peers {
        reply: oneshot::Sender<Vec<PeerSnapshot>>,
    },
    /// Handshake with the peer now if it has no session (for `Tunnel::ready`).
    Handshake {
        peer: PublicKey,
        /// Told when the handshake has gone unanswered for `HANDSHAKE_GIVE_UP`.
        give_up: oneshot::Sender<HandshakeFailed>,
    },
}

/// The application's side of a TCP stream.
#[derive(Debug)]
pub(crate) struct StreamParts {
    pub(crate) shared: Arc<StreamShared>,
    /// Bytes received, from the engine.
    pub(crate) rx: Consumer<u8>,
    /// Bytes to send, to the engine.
    pub(crate) tx: Producer<u8>,
    pub(crate) local: SocketAddr,
    pub(crate) peer: SocketAddr,
}

/// The application's side of a listener.
#[derive(Debug)]
pub(crate) struct ListenerParts {
    pub(crate) accept: mpsc::Receiver<StreamParts>,
    pub(crate) local: SocketAddr,
}

/// The application's side of a UDP socket.
#[derive(Debug)]
pub(crate) struct DatagramParts {
    pub(crate) shared: Arc<DatagramShared>,
    pub(crate) rx: Consumer<u8>,
    pub(crate) tx: Producer<u8>,
    pub(crate) local: SocketAddr,
}

/// The address a socket bound to `endpoint` has, as the handle reports it: the unspecified
/// address of `asked`'s family when it was bound to every address.
fn bound_address(endpoint: IpListenEndpoint, asked: SocketAddr) -> SocketAddr {
    let ip = endpoint
        .addr
        .map(IpAddr::from)
        .unwrap_or(if asked.is_ipv4() {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        } else {
            IpAddr::V6(Ipv6Addr::UNSPECIFIED)
        });
    SocketAddr::new(ip, endpoint.port)
}

/// The one place a [`Device`] is made: with the system's randomness and wall clock.
fn make_device(settings: DeviceSettings, peers: Vec<PeerSettings>, now: Instant) -> Device {
    Device::new(
        settings,
        peers,
        now,
        tunneld_dataplane::system_environment(),
    )
}

/// Checks the settings, binds the underlay, and starts the engine thread.
pub(crate) fn start(settings: TunnelSettings) -> Result<Arc<Shared>, Error> {
    settings.validate()?;
    let udp = UdpSocket::bind_addr(settings.listen).map_err(|source| Error::Bind {
        addr: settings.listen,
        source,
    })?;
    let local_addr = udp.local_addr();
    let poll = mio::Poll::new().map_err(Error::Engine)?;
    let waker = mio::Waker::new(poll.registry(), WAKE_TOKEN).map_err(Error::Engine)?;
    if let Some(fd) = udp.fd() {
        poll.registry()
            .register(
                &mut mio::unix::SourceFd(&fd),
                UDP_TOKEN,
                mio::Interest::READABLE,
            )
            .map_err(Error::Engine)?;
    }
    let (control_tx, control_rx) = mpsc::channel(CONTROL_QUEUE);
    let mtu = usize::from(settings.mtu);
    let shared = Arc::new(Shared {
        local_addr,
        public_key: settings.private_key.public_key(),
        max_udp_v4: mtu.saturating_sub(20 + 8),
        max_udp_v6: mtu.saturating_sub(40 + 8),
        waker,
        notified: AtomicBool::new(false),
        stopped: AtomicBool::new(false),
        control: control_tx,
        handshake_done: AtomicBool::new(false),
        tx_bytes: AtomicU64::new(0),
        rx_bytes: AtomicU64::new(0),
        drops: AtomicU64::new(0),
        hub: Mutex::new(Hub::default()),
        dns_servers: settings.dns_servers.clone(),
    });
    let engine = Engine::new(settings, udp, poll, control_rx, shared.clone());
    std::thread::Builder::new()
        .name("tunneld-userspace".into())
        .spawn(move || engine.run())
        .map_err(Error::Engine)?;
    Ok(shared)
}

/// Decrypted packets waiting for the stack.
struct RxQueue {
    batch: Batch,
    next: usize,
}

/// The stack's way out: packets it sends are encrypted at once into the send batch.
struct TxPath {
    device: Device,
    udp: UdpSocket,
    net_tx: Batch,
    /// One packet from the stack (a TCP super-segment of up to `MAX_SUPER` bytes), with room
    /// behind it for WireGuard's padding.
    packet: Box<[u8]>,
    /// For `offload::segment`: a segment shorter than its headers is built here (never, for
    /// a real MSS, but a peer chooses the MSS).
    scratch: Box<[u8]>,
    now: Instant,
    send_errors: u64,
    offload_errors: u64,
}

impl TxPath {
    /// Sends the stack's packet in `packet[..len]`: a TCP packet is cut into segments of
    /// `segment` payload bytes (the stack's segmentation offload) or, alone, gets its
    /// checksum (the stack leaves TCP checksums to the device, as offload requires); each
    /// packet is encrypted straight into the send batch.
    fn send(&mut self, len: usize, segment: Option<NonZeroU16>) {
        let gso_type = match tcp_version(&self.packet[..len]) {
            Some(false) => offload::GSO_TCPV4,
            Some(true) => offload::GSO_TCPV6,
            None => {
                if self.net_tx.is_full() {
                    self.flush();
                }
                let _ = self
                    .device
                    .encapsulate(&mut self.packet, len, self.now, &mut self.net_tx);
                return;
            }
        };
        let hdr = VnetHdr {
            gso_type,
            // One segment when the stack asked for none: the packet fits the MTU.
            gso_size: segment.map_or(u16::MAX, NonZeroU16::get),
            ..VnetHdr::default()
        };
        let TxPath {
            device,
            udp,
            net_tx,
            packet,
            scratch,
            now,
            send_errors,
            ..
        } = self;
        let result = offload::segment(packet, len, &hdr, scratch, |buf, n| {
            if net_tx.is_full() {
                send_batch(udp, net_tx, send_errors);
            }
            let _ = device.encapsulate(buf, n, *now, net_tx);
        });
        if let Err(e) = result {
            // Only a packet the stack built malformed gets here; TCP resends what it was.
            self.offload_errors += 1;
            if self.offload_errors.is_power_of_two() {
                tracing::warn!(
                    "cutting a packet of the stack: {e} ({} so far)",
                    self.offload_errors
                );
            }
        }
    }

    fn flush(&mut self) {
        send_batch(&mut self.udp, &mut self.net_tx, &mut self.send_errors);
    }
}

/// Sends and empties the batch.
fn send_batch(udp: &mut UdpSocket, net_tx: &mut Batch, send_errors: &mut u64) {
    if net_tx.is_empty() {
        return;
    }
    // What the kernel refuses (a full socket buffer) is lost like any datagram; TCP inside
    // the tunnel retransmits it.
    if let Err(e) = udp.send_batch(net_tx) {
        *send_errors += 1;
        if send_errors.is_power_of_two() {
            tracing::warn!("sending on the underlay: {e} ({send_errors} so far)");
        }
    }
    net_tx.clear();
}

/// Whether `packet` is TCP: `Some(false)` over IPv4, `Some(true)` over IPv6 (the stack
/// puts no extension headers in front of TCP).
fn tcp_version(packet: &[u8]) -> Option<bool> {
    const TCP: u8 = 6;
    match packet.first()? >> 4 {
        4 if packet.len() >= 20 && packet[9] == TCP => Some(false),
        6 if packet.len() >= 40 && packet[6] == TCP => Some(true),
        _ => None,
    }
}

/// The stack's device: reads from the decrypted batch, writes into the encryption path.
struct Phy {
    rx: RxQueue,
    tx: TxPath,
    mtu: usize,
}

struct RxToken<'a> {
    packet: &'a [u8],
}

struct TxToken<'a> {
    path: &'a mut TxPath,
    /// Payload bytes per segment, when the stack hands over a super-segment.
    segment: Option<NonZeroU16>,
}

impl<'a> TxToken<'a> {
    fn new(path: &'a mut TxPath) -> TxToken<'a> {
        TxToken {
            path,
            segment: None,
        }
    }
}

impl phy::RxToken for RxToken<'_> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(self.packet)
    }
}

impl phy::TxToken for TxToken<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        // The packet buffer holds the largest packet the stack is told it may send.
        let len = len.min(self.path.packet.len() - PADDING_ROOM);
        let r = f(&mut self.path.packet[..len]);
        self.path.send(len, self.segment);
        r
    }

    fn set_meta(&mut self, meta: PacketMeta) {
        self.segment = meta.segmentation_offload_size;
    }
}

/// Room behind a packet for WireGuard's padding (to a multiple of 16).
const PADDING_ROOM: usize = 16;

impl phy::Device for Phy {
    type RxToken<'a> = RxToken<'a>;
    type TxToken<'a> = TxToken<'a>;

    fn receive(
        &mut self,
        _timestamp: smoltcp::time::Instant,
    ) -> Option<(RxToken<'_>, TxToken<'_>)> {
        let i = self.rx.next;
        if i >= self.rx.batch.len() {
            return None;
        }
        self.rx.next += 1;
        Some((
            RxToken {
                packet: self.rx.batch.payload(i),
            },
            TxToken::new(&mut self.tx),
        ))
    }

    fn transmit(&mut self, _timestamp: smoltcp::time::Instant) -> Option<TxToken<'_>> {
        Some(TxToken::new(&mut self.tx))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ip;
        caps.max_transmission_unit = self.mtu;
        // WireGuard authenticated every packet the stack receives, so checksums are only
        // computed for sending, never verified; TCP's by `TxPath::send`.
        caps.checksum.ipv4 = Checksum::Tx;
        caps.checksum.tcp = Checksum::None;
        caps.checksum.udp = Checksum::Tx;
        // TCP segmentation offload: the stack sends up to MAX_SUPER bytes in one packet and
        // `TxPath::send` cuts it into segments that fit the MTU (the MSS the stack advertises
        // and the segment size it asks for both follow the MTU), one pass through the stack
        // for dozens of packets. IPv4 only: smoltcp 0.14 builds IPv6 super-segments too but
        // then drops every IPv6 packet larger than the MTU (it has no IPv6 fragmentation,
        // and does not look at the offload there), so IPv6 keeps MTU-sized segments.
        caps.segmentation.tcpv4 = NonZeroUsize::new(MAX_SUPER);
        caps
    }
}

/// Where a TCP connection is in its life, from the engine's side.
enum ConnState {
    /// Waiting for the handshake to finish, to answer the connect.
    Connecting {
        reply: oneshot::Sender<io::Result<StreamParts>>,
        parts: Option<StreamParts>,
        started: Instant,
        remote: SocketAddr,
    },
    /// The application has its handles.
    Open,
}

struct Conn {
    handle: SocketHandle,
    shared: Arc<StreamShared>,
    to_app: Producer<u8>,
    from_app: Consumer<u8>,
    state: ConnState,
    /// `close()` was called on the stack's socket (FIN queued).
    fin_queued: bool,
    /// The peer's FIN arrived.
    got_fin: bool,
    /// EOF or an error was told to the application.
    told_end: bool,
    /// When every handle was gone (a deadline for the graceful close).
    abandoned_at: Option<Instant>,
}

struct Listener {
    endpoint: IpListenEndpoint,
    accept: mpsc::Sender<StreamParts>,
    ready: Vec<SocketHandle>,
}

struct Udp {
    handle: SocketHandle,
    shared: Arc<DatagramShared>,
    to_app: Producer<u8>,
    from_app: Consumer<u8>,
}

struct Engine {
    shared: Arc<Shared>,
    control: mpsc::Receiver<Control>,
    poll: mio::Poll,
    events: mio::Events,
    iface: Interface,
    sockets: SocketSet<'static>,
    phy: Phy,
    net_rx: Batch,
    epoch: Instant,
    v4: Option<Ipv4Addr>,
    v6: Option<Ipv6Addr>,
    /// Every peer's allowed IPs: a connect or send elsewhere fails at once.
    allowed: Vec<IpNet>,
    conns: Vec<Conn>,
    listeners: Vec<Listener>,
    udps: Vec<Udp>,
    next_port: u16,
    next_tick: Instant,
    /// Work is left that needs no event (a full batch, a ring with room again).
    more: bool,
    recv_errors: u64,
    /// Turns the peers' states into events.
    tracker: Tracker,
    /// A handshake message arrived this turn: the peers' states may have changed.
    handshake_seen: bool,
    /// `ready()` calls waiting on a peer's handshake, told if it goes unanswered too long.
    ready_waiters: Vec<(PublicKey, Instant, oneshot::Sender<HandshakeFailed>)>,
    /// After an initiation we answered, the handshake completes at the initiator's first
    /// data message: until then every turn looks.
    responding_until: Option<Instant>,
}

fn smol_now(epoch: Instant, now: Instant) -> smoltcp::time::Instant {
    let micros = now.saturating_duration_since(epoch).as_micros();
    smoltcp::time::Instant::from_micros(i64::try_from(micros).unwrap_or(i64::MAX))
}

fn to_socket_addr(ep: IpEndpoint) -> SocketAddr {
    SocketAddr::new(IpAddr::from(ep.addr), ep.port)
}

fn new_tcp_socket() -> tcp::Socket<'static> {
    let mut socket = tcp::Socket::new(
        tcp::SocketBuffer::new(vec![0u8; TCP_BUFFER]),
        tcp::SocketBuffer::new(vec![0u8; TCP_BUFFER]),
    );
    socket.set_congestion_control(tcp::CongestionControl::Cubic);
    // Linux's floor rather than RFC 6298's 1 s: a lost retransmission or a lost tail costs
    // 200 ms, not a second (the vendored smoltcp's patch; SACK, which it offers and accepts
    // on every connection, and window scaling, from the 2 MiB buffers, are on by default).
    socket.set_min_rto(MIN_RTO.into());
    socket.set_nagle_enabled(false);
    socket.set_timeout(Some(TCP_TIMEOUT.into()));
    socket
}

fn stream_rings(
    local: SocketAddr,
    peer: SocketAddr,
) -> (Arc<StreamShared>, Producer<u8>, Consumer<u8>, StreamParts) {
    let shared = Arc::new(StreamShared::new());
    let (to_app, app_rx) = RingBuffer::new(STREAM_RING);
    let (app_tx, from_app) = RingBuffer::new(STREAM_RING);
    let parts = StreamParts {
        shared: shared.clone(),
        rx: app_rx,
        tx: app_tx,
        local,
        peer,
    };
    (shared, to_app, from_app, parts)
}

impl Engine {
    fn new(
        settings: TunnelSettings,
        udp: UdpSocket,
        poll: mio::Poll,
        control: mpsc::Receiver<Control>,
        shared: Arc<Shared>,
    ) -> Engine {
        let now = Instant::now();
        let allowed = settings
            .peers
            .iter()
            .flat_map(|p| p.allowed_ips.iter().copied())
            .collect();
        let device = make_device(
            DeviceSettings {
                private_key: settings.private_key.clone(),
                listen_port: udp.local_port(),
                mtu: settings.mtu,
                fwmark: 0,
            },
            settings.peers.clone(),
            now,
        );
        let mtu = usize::from(settings.mtu);
        let mut phy = Phy {
            rx: RxQueue {
                batch: Batch::new(),
                next: 0,
            },
            tx: TxPath {
                device,
                udp,
                net_tx: Batch::new(),
                packet: vec![0u8; MAX_SUPER + PADDING_ROOM].into_boxed_slice(),
                scratch: vec![0u8; mtu + PADDING_ROOM].into_boxed_slice(),
                now,
                send_errors: 0,
                offload_errors: 0,
            },
            mtu,
        };
        let epoch = now;
        let mut config = Config::new(HardwareAddress::Ip);
        let mut seed = [0u8; 8];
        rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut seed);
        config.random_seed = u64::from_le_bytes(seed);
        let mut iface = Interface::new(config, &mut phy, smol_now(epoch, now));
        let (mut v4, mut v6) = (None, None);
        iface.update_ip_addrs(|addrs| {
            for net in &settings.addresses {
                let cidr = IpCidr::new(IpAddress::from(net.addr()), net.prefix_len());
                // Validated: at most one address per family, within smoltcp's limit.
                let _ = addrs.push(cidr);
                match net.addr() {
                    IpAddr::V4(a) => v4 = Some(a),
                    IpAddr::V6(a) => v6 = Some(a),
                }
            }
        });
        // Destinations beyond the tunnel's own prefixes go out too (the device routes them
        // by allowed IPs); on an IP medium the gateway named here is never used.
        if let Some(a) = v4 {
            let _ = iface.routes_mut().add_default_ipv4_route(a);
        }
        if let Some(a) = v6 {
            let _ = iface.routes_mut().add_default_ipv6_route(a);
        }
        let mut tracker = Tracker::default();
        let events = tracker.observe(phy.tx.device.observe_peers(now), now);
        peers::lock(&shared.hub).publish(&events);
        Engine {
            shared,
            control,
            poll,
            events: mio::Events::with_capacity(8),
            iface,
            sockets: SocketSet::new(Vec::new()),
            phy,
            net_rx: Batch::new(),
            epoch,
            v4,
            v6,
            allowed,
            conns: Vec::new(),
            listeners: Vec::new(),
            udps: Vec::new(),
            next_port: *EPHEMERAL.start(),
            next_tick: now + TICK,
            more: false,
            recv_errors: 0,
            tracker,
            handshake_seen: false,
            ready_waiters: Vec::new(),
            responding_until: None,
        }
    }

    fn run(mut self) {
        loop {
            let now = Instant::now();
            let timeout = if self.more {
                Duration::ZERO
            } else {
                let tick = self.next_tick.saturating_duration_since(now);
                match self
                    .iface
                    .poll_delay(smol_now(self.epoch, now), &self.sockets)
                {
                    Some(d) => tick.min(Duration::from_micros(d.total_micros())),
                    None => tick,
                }
            };
            self.more = false;
            if let Err(e) = self.poll.poll(&mut self.events, Some(timeout)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!("the user-space tunnel's poll failed: {e}");
                    break;
                }
            }
            // Cleared before the turn: a handle's change made during it wakes the next.
            self.shared.notified.store(false, Ordering::SeqCst);
            if self.shared.is_stopped() {
                break;
            }
            self.serve_control();
            let now = Instant::now();
            self.turn(now);
            if now >= self.next_tick {
                self.tick(now);
                self.next_tick = now + TICK;
            } else if std::mem::take(&mut self.handshake_seen)
                || self.responding_until.is_some_and(|until| now < until)
            {
                self.observe(now);
            }
        }
        self.finish();
    }

    /// Tells every handle that the engine is gone.
    fn finish(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        for conn in &self.conns {
            conn.shared.read_waker.wake();
            conn.shared.write_waker.wake();
        }
        for udp in &self.udps {
            udp.shared.recv_waker.wake();
            udp.shared.send_waker.wake();
        }
        // Pending connects and accepts see their channels closed when these drop.
        self.conns.clear();
        self.listeners.clear();
        self.control.close();
        peers::lock(&self.shared.hub).stop();
    }

    /// Compares the peers' states with the last look and publishes what changed.
    fn observe(&mut self, now: Instant) {
        self.handshake_seen = false;
        let events = self
            .tracker
            .observe(self.phy.tx.device.observe_peers(now), now);
        // Before the event is published: whoever `ready()` returned to sees it in `stats()`
        // (the tick's look would be up to 250 ms later).
        if events
            .iter()
            .any(|e| matches!(e, Event::HandshakeCompleted { .. }))
        {
            self.shared.handshake_done.store(true, Ordering::Relaxed);
        }
        if !events.is_empty() {
            peers::lock(&self.shared.hub).publish(&events);
        }
    }

    /// Gives up where a peer's handshake has gone unanswered for `HANDSHAKE_GIVE_UP` of a
    /// waiter's own time (since its call, or since the attempt began if that was later):
    /// the `ready()` calls waiting on it and the connects routed to it fail with
    /// `HandshakeFailed` (the reason is the handshake, not the far host).
    fn give_up_on_silent_peers(&mut self, now: Instant) {
        let device = &self.phy.tx.device;
        // Peers with an attempt under way and no answer since it began: when it began.
        let unanswered: Vec<(PublicKey, Instant)> = device
            .observe_peers(now)
            .filter_map(|p| {
                let started = p.attempt_started?;
                let answered = p.last_handshake.is_some_and(|at| at >= started);
                (!answered).then_some((p.public_key, started))
            })
            .collect();
        // How long `peer` has been silent to a waiter that began at `since`, if too long.
        let gave_up = |peer: &PublicKey, since: Instant| {
            let (_, started) = unanswered.iter().find(|(p, _)| p == peer)?;
            let waited = now.saturating_duration_since((*started).max(since));
            (waited >= HANDSHAKE_GIVE_UP).then_some(waited)
        };
        // Waiters whose `ready()` is gone go quietly.
        self.ready_waiters.retain(|(_, _, tx)| !tx.is_closed());
        for (peer, since, tx) in std::mem::take(&mut self.ready_waiters) {
            match gave_up(&peer, since) {
                Some(waited) => {
                    let _ = tx.send(HandshakeFailed { peer, waited });
                }
                None => self.ready_waiters.push((peer, since, tx)),
            }
        }
        if unanswered.is_empty() {
            return;
        }
        for conn in &mut self.conns {
            let ConnState::Connecting {
                remote, started, ..
            } = conn.state
            else {
                continue;
            };
            let Some(peer) = device.peer_for(remote.ip()) else {
                continue;
            };
            let Some(waited) = gave_up(&peer, started) else {
                continue;
            };
            if let ConnState::Connecting { reply, .. } =
                std::mem::replace(&mut conn.state, ConnState::Open)
            {
                let _ = reply.send(Err(HandshakeFailed { peer, waited }.into()));
            }
            // Nobody holds the stream: the socket goes at the connection's next turn.
            self.sockets.get_mut::<tcp::Socket>(conn.handle).abort();
        }
    }

    fn tick(&mut self, now: Instant) {
        let tx = &mut self.phy.tx;
        tx.now = now;
        tx.flush();
        tx.device.tick(now, &mut tx.net_tx);
        tx.flush();
        if !self.shared.handshake_done.load(Ordering::Relaxed) {
            let done = tx
                .device
                .snapshot(now, Duration::ZERO)
                .peers
                .iter()
                .any(|p| p.last_handshake.is_some());
            self.shared.handshake_done.store(done, Ordering::Relaxed);
        }
        self.publish_stats();
        self.observe(now);
        self.give_up_on_silent_peers(now);
    }

    fn publish_stats(&self) {
        let stats = self.phy.tx.device.stats();
        self.shared
            .tx_bytes
            .store(stats.tx_bytes, Ordering::Relaxed);
        self.shared
            .rx_bytes
            .store(stats.rx_bytes, Ordering::Relaxed);
        self.shared
            .drops
            .store(stats.total_drops(), Ordering::Relaxed);
    }

    fn turn(&mut self, now: Instant) {
        self.phy.tx.now = now;
        let ts = smol_now(self.epoch, now);
        for round in 0..BATCHES_PER_TURN {
            if self.receive(now, ts) < BATCH_SIZE {
                break;
            }
            if round + 1 == BATCHES_PER_TURN {
                self.more = true;
            }
        }
        self.serve_sockets(now);
        pump(&mut self.iface, &mut self.phy, &mut self.sockets, ts);
        self.serve_sockets(now);
        if egress(&mut self.iface, &mut self.phy, &mut self.sockets, ts) {
            self.more = true;
        }
        self.phy.tx.flush();
        self.publish_stats();
    }

    /// One batch from the underlay, decrypted and handed to the stack. Returns how many
    /// frames the batch had.
    fn receive(&mut self, now: Instant, ts: smoltcp::time::Instant) -> usize {
        self.net_rx.clear();
        let frames = match self.phy.tx.udp.recv_batch(&mut self.net_rx) {
            Ok(n) => n,
            Err(e) => {
                self.recv_errors += 1;
                if self.recv_errors.is_power_of_two() {
                    tracing::warn!(
                        "receiving on the underlay: {e} ({} so far)",
                        self.recv_errors
                    );
                }
                return 0;
            }
        };
        for i in 0..self.net_rx.len() {
            let from = self.net_rx.addr(i);
            for datagram in self.net_rx.datagrams(i) {
                // Anything but a data message (type 4) is a handshake's: look at the peers
                // after this turn.
                match datagram.first() {
                    Some(4) | None => {}
                    Some(t) => {
                        self.handshake_seen = true;
                        if *t == 1 {
                            self.responding_until = Some(now + RESPONDER_WATCH);
                        }
                    }
                }
                if self.phy.rx.batch.is_full() {
                    pump(&mut self.iface, &mut self.phy, &mut self.sockets, ts);
                }
                let tx = &mut self.phy.tx;
                if tx.net_tx.is_full() {
                    tx.flush();
                }
                let _ = tx.device.decapsulate(
                    from,
                    datagram,
                    now,
                    &mut self.phy.rx.batch,
                    &mut tx.net_tx,
                );
            }
        }
        pump(&mut self.iface, &mut self.phy, &mut self.sockets, ts);
        frames
    }

    fn serve_control(&mut self) {
        while let Ok(request) = self.control.try_recv() {
            match request {
                Control::Connect { remote, reply } => self.connect(remote, reply),
                Control::Listen { local, reply } => {
                    let result = self.listen(local);
                    let _ = reply.send(result);
                }
                Control::UdpBind { local, reply } => {
                    let result = self.udp_bind(local);
                    let _ = reply.send(result);
                }
                Control::AddPeer { peer, reply } => {
                    let result = self.add_peer(peer);
                    let _ = reply.send(result);
                }
                Control::UpdatePeer { change, reply } => {
                    let result = self.update_peer(change);
                    let _ = reply.send(result);
                }
                Control::RemovePeer { peer, reply } => {
                    let result = self.remove_peer(peer);
                    let _ = reply.send(result);
                }
                Control::Peers { reply } => {
                    let _ = reply.send(self.peers());
                }
                Control::Handshake { peer, give_up } => {
                    self.ready_waiters.push((peer, Instant::now(), give_up));
                    let device = &mut self.phy.tx.device;
                    let now = Instant::now();
                    let has_session = device
                        .observe_peers(now)
                        .any(|p| p.public_key == peer && p.last_handshake.is_some());
                    if !has_session && device.request_handshake(&peer) {
                        // The initiation goes out at the tick: make it this turn's.
                        self.next_tick = now;
                    }
                }
            }
        }
    }

    fn has_peer(&self, peer: &PublicKey) -> bool {
        self.phy.tx.device.peer_traffic(peer).is_some()
    }

    fn add_peer(&mut self, peer: PeerSettings) -> Result<(), Error> {
        if peer.public_key == self.shared.public_key {
            return Err(invalid(
                "peer",
                "a peer cannot have the tunnel's own public key",
            ));
        }
        if peer.parallel != 1 {
            return Err(invalid(
                "peer",
                format!(
                    "parallel = {} (a user-space tunnel has one engine; use 1)",
                    peer.parallel
                ),
            ));
        }
        if self.has_peer(&peer.public_key) {
            return Err(Error::PeerExists(peer.public_key));
        }
        let mut update = PeerUpdate::new(peer.public_key);
        update.preshared_key = Some(peer.preshared_key);
        update.endpoint = peer.endpoint;
        update.persistent_keepalive = Some(peer.persistent_keepalive);
        update.replace_allowed_ips = true;
        update.allowed_ips = peer.allowed_ips;
        self.apply(update)
    }

    fn update_peer(&mut self, change: PeerChange) -> Result<(), Error> {
        if !self.has_peer(&change.public_key) {
            return Err(Error::UnknownPeer(change.public_key));
        }
        self.apply(PeerUpdate::from(change))
    }

    fn remove_peer(&mut self, peer: PublicKey) -> Result<(), Error> {
        if !self.has_peer(&peer) {
            return Err(Error::UnknownPeer(peer));
        }
        let mut update = PeerUpdate::new(peer);
        update.remove = true;
        self.apply(update)
    }

    /// Applies one peer's change to the device; connections to addresses no peer is
    /// allowed any more are reset, and what changed is published as events.
    fn apply(&mut self, update: PeerUpdate) -> Result<(), Error> {
        let now = Instant::now();
        let device = &mut self.phy.tx.device;
        device
            .apply(
                SetRequest {
                    peers: vec![update],
                    ..SetRequest::default()
                },
                now,
            )
            .map_err(|e| invalid("peer", e.message))?;
        self.allowed = device.routes();
        for conn in &self.conns {
            let socket = self.sockets.get_mut::<tcp::Socket>(conn.handle);
            let routed = socket.remote_endpoint().is_some_and(|ep| {
                self.allowed
                    .iter()
                    .any(|n| n.contains(&IpAddr::from(ep.addr)))
            });
            if !routed && socket.state() != tcp::State::Closed {
                socket.abort();
            }
        }
        self.more = true;
        // A newly enabled keepalive (or a new peer with one) handshakes at the tick.
        self.next_tick = now;
        self.observe(now);
        Ok(())
    }

    /// Every peer's state, as `wg show` has it (no preshared key).
    fn peers(&self) -> Vec<PeerSnapshot> {
        let unix_now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let mut peers = self.phy.tx.device.snapshot(Instant::now(), unix_now).peers;
        for peer in &mut peers {
            peer.preshared_key = None;
        }
        peers
    }

    fn routed(&self, ip: IpAddr) -> bool {
        self.allowed.iter().any(|net| net.contains(&ip))
    }

    fn own_address(&self, family_of: IpAddr) -> Option<IpAddr> {
        match family_of {
            IpAddr::V4(_) => self.v4.map(IpAddr::V4),
            IpAddr::V6(_) => self.v6.map(IpAddr::V6),
        }
    }

    /// Whether `port` is taken by a TCP (`tcp`) or UDP socket of the stack.
    fn port_in_use(&self, port: u16, tcp: bool) -> bool {
        self.sockets.iter().any(|(_, socket)| match socket {
            Socket::Tcp(s) if tcp => {
                s.listen_endpoint().port == port
                    || s.local_endpoint().is_some_and(|e| e.port == port)
            }
            Socket::Udp(s) if !tcp => s.endpoint().port == port,
            _ => false,
        })
    }

    /// Whether a listener has `port` (a connection that uses it, e.g. one accepted from an
    /// earlier listener, does not keep a new listener off it).
    fn listening_on(&self, port: u16) -> bool {
        self.listeners.iter().any(|l| l.endpoint.port == port)
    }

    fn free_port(&mut self, tcp: bool) -> io::Result<u16> {
        let span = usize::from(EPHEMERAL.end() - EPHEMERAL.start()) + 1;
        for _ in 0..span {
            let port = self.next_port;
            self.next_port = if port == *EPHEMERAL.end() {
                *EPHEMERAL.start()
            } else {
                port + 1
            };
            if !self.port_in_use(port, tcp) {
                return Ok(port);
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            "no free port in the tunnel",
        ))
    }

    /// The local endpoint a listener or UDP socket binds: an address of ours (or any).
    fn bind_endpoint(&mut self, local: SocketAddr, tcp: bool) -> io::Result<IpListenEndpoint> {
        let addr = if local.ip().is_unspecified() {
            None
        } else if self.own_address(local.ip()) == Some(local.ip()) {
            Some(IpAddress::from(local.ip()))
        } else {
            return Err(io::Error::new(
                io::ErrorKind::AddrNotAvailable,
                format!("{} is not an address of the tunnel", local.ip()),
            ));
        };
        let port = match local.port() {
            0 => self.free_port(tcp)?,
            p if self.port_in_use(p, tcp) && (!tcp || self.listening_on(p)) => {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("port {p} is in use in the tunnel"),
                ))
            }
            p => p,
        };
        Ok(IpListenEndpoint { addr, port })
    }

    fn connect(&mut self, remote: SocketAddr, reply: oneshot::Sender<io::Result<StreamParts>>) {
        let result = (|| {
            let Some(ip) = self.own_address(remote.ip()) else {
                return Err(io::Error::new(
                    io::ErrorKind::AddrNotAvailable,
                    format!("the tunnel has no address of {remote}'s family"),
                ));
            };
            if !self.routed(remote.ip()) || remote.port() == 0 || remote.ip().is_unspecified() {
                return Err(io::Error::new(
                    io::ErrorKind::HostUnreachable,
                    format!("no peer of the tunnel is allowed {}", remote.ip()),
                ));
            }
            let port = self.free_port(true)?;
            let mut socket = new_tcp_socket();
            let local = IpListenEndpoint {
                addr: Some(IpAddress::from(ip)),
                port,
            };
            socket
                .connect(self.iface.context(), IpEndpoint::from(remote), local)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
            Ok((socket, SocketAddr::new(ip, port)))
        })();
        match result {
            Err(e) => {
                let _ = reply.send(Err(e));
            }
            Ok((socket, local)) => {
                let handle = self.sockets.add(socket);
                let (shared, to_app, from_app, parts) = stream_rings(local, remote);
                self.conns.push(Conn {
                    handle,
                    shared,
                    to_app,
                    from_app,
                    state: ConnState::Connecting {
                        reply,
                        parts: Some(parts),
                        started: Instant::now(),
                        remote,
                    },
                    fin_queued: false,
                    got_fin: false,
                    told_end: false,
                    abandoned_at: None,
                });
            }
        }
    }

    fn listen(&mut self, local: SocketAddr) -> io::Result<ListenerParts> {
        let endpoint = self.bind_endpoint(local, true)?;
        let (accept_tx, accept_rx) = mpsc::channel(BACKLOG);
        let mut listener = Listener {
            endpoint,
            accept: accept_tx,
            ready: Vec::with_capacity(BACKLOG),
        };
        for _ in 0..BACKLOG {
            let mut socket = new_tcp_socket();
            socket
                .listen(endpoint)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
            listener.ready.push(self.sockets.add(socket));
        }
        self.listeners.push(listener);
        Ok(ListenerParts {
            accept: accept_rx,
            local: bound_address(endpoint, local),
        })
    }

    fn udp_bind(&mut self, local: SocketAddr) -> io::Result<DatagramParts> {
        let endpoint = self.bind_endpoint(local, false)?;
        let buffer = || {
            udp::PacketBuffer::new(
                vec![udp::PacketMetadata::EMPTY; UDP_PACKETS],
                vec![0u8; UDP_BUFFER],
            )
        };
        let mut socket = udp::Socket::new(buffer(), buffer());
        socket
            .bind(endpoint)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let handle = self.sockets.add(socket);
        let shared = Arc::new(DatagramShared::default());
        let (to_app, app_rx) = RingBuffer::new(DATAGRAM_RING);
        let (app_tx, from_app) = RingBuffer::new(DATAGRAM_RING);
        self.udps.push(Udp {
            handle,
            shared: shared.clone(),
            to_app,
            from_app,
        });
        Ok(DatagramParts {
            shared,
            rx: app_rx,
            tx: app_tx,
            local: bound_address(endpoint, local),
        })
    }

    /// Moves bytes between every socket and its handle's rings, and follows connections'
    /// states (established, closed, accepted).
    fn serve_sockets(&mut self, now: Instant) {
        self.serve_listeners();
        let mut i = 0;
        while i < self.conns.len() {
            if serve_conn(&mut self.conns[i], &mut self.sockets, now, &mut self.more) {
                i += 1;
            } else {
                let conn = self.conns.swap_remove(i);
                self.sockets.remove(conn.handle);
            }
        }
        let mut i = 0;
        while i < self.udps.len() {
            if serve_udp(&mut self.udps[i], &mut self.sockets, &mut self.more) {
                i += 1;
            } else {
                let udp = self.udps.swap_remove(i);
                self.sockets.remove(udp.handle);
            }
        }
    }

    /// Listen sockets that got a connection become streams (queued for `accept`) and are
    /// replaced; a listener whose handle is gone is removed.
    fn serve_listeners(&mut self) {
        let mut l = 0;
        while l < self.listeners.len() {
            if self.listeners[l].accept.is_closed() {
                let listener = self.listeners.swap_remove(l);
                for handle in listener.ready {
                    self.sockets.remove(handle);
                }
                continue;
            }
            for k in 0..self.listeners[l].ready.len() {
                let handle = self.listeners[l].ready[k];
                let socket = self.sockets.get_mut::<tcp::Socket>(handle);
                match socket.state() {
                    tcp::State::Listen | tcp::State::SynReceived => continue,
                    tcp::State::Closed => {
                        // A reset during the handshake: listen again.
                        let _ = socket.listen(self.listeners[l].endpoint);
                        continue;
                    }
                    _ => {}
                }
                let (Some(local), Some(peer)) = (socket.local_endpoint(), socket.remote_endpoint())
                else {
                    socket.abort();
                    continue;
                };
                let (shared, to_app, from_app, parts) =
                    stream_rings(to_socket_addr(local), to_socket_addr(peer));
                if self.listeners[l].accept.try_send(parts).is_err() {
                    // The application is not accepting fast enough: refuse this one.
                    socket.abort();
                    continue;
                }
                self.conns.push(Conn {
                    handle,
                    shared,
                    to_app,
                    from_app,
                    state: ConnState::Open,
                    fin_queued: false,
                    got_fin: false,
                    told_end: false,
                    abandoned_at: None,
                });
                let mut fresh = new_tcp_socket();
                let _ = fresh.listen(self.listeners[l].endpoint);
                self.listeners[l].ready[k] = self.sockets.add(fresh);
            }
            l += 1;
        }
    }
}

/// Runs the stack: everything received, then one round of what it has to send (replies
/// and acknowledgements go out between batches; the rest of the burst is `egress`'s).
fn pump(
    iface: &mut Interface,
    phy: &mut Phy,
    sockets: &mut SocketSet<'_>,
    ts: smoltcp::time::Instant,
) {
    while iface.poll_ingress_single(ts, phy, sockets)
        != smoltcp::iface::PollIngressSingleResult::None
    {}
    let _ = iface.poll_egress(ts, phy, sockets);
    phy.rx.batch.clear();
    phy.rx.next = 0;
}

/// Lets every socket send all it may now (each round sends at most one packet per socket).
/// Returns whether it stopped with more to send.
fn egress(
    iface: &mut Interface,
    phy: &mut Phy,
    sockets: &mut SocketSet<'_>,
    ts: smoltcp::time::Instant,
) -> bool {
    for _ in 0..EGRESS_ROUNDS {
        if iface.poll_egress(ts, phy, sockets) == smoltcp::iface::PollResult::None {
            return false;
        }
    }
    true
}

/// One connection's turn. Returns `false` when it is over and its socket can go.
fn serve_conn(conn: &mut Conn, sockets: &mut SocketSet<'_>, now: Instant, more: &mut bool) -> bool {
    let socket = sockets.get_mut::<tcp::Socket>(conn.handle);
    if let ConnState::Connecting { started, .. } = &conn.state {
        let started = *started;
        match socket.state() {
            tcp::State::SynSent | tcp::State::SynReceived => return true,
            tcp::State::Closed | tcp::State::TimeWait => {
                let error = if now.saturating_duration_since(started) >= TCP_TIMEOUT {
                    io::Error::new(io::ErrorKind::TimedOut, "connect timed out")
                } else {
                    io::Error::new(io::ErrorKind::ConnectionRefused, "connection refused")
                };
                if let ConnState::Connecting { reply, .. } =
                    std::mem::replace(&mut conn.state, ConnState::Open)
                {
                    let _ = reply.send(Err(error));
                }
                return false;
            }
            _ => {
                if let ConnState::Connecting {
                    reply,
                    parts: Some(parts),
                    ..
                } = std::mem::replace(&mut conn.state, ConnState::Open)
                {
                    if reply.send(Ok(parts)).is_err() {
                        // The connect was given up on: nobody holds the stream.
                        socket.abort();
                        return false;
                    }
                }
            }
        }
    }

    // Application to stack.
    let mut sent = 0;
    while socket.can_send() {
        let avail = conn.from_app.slots();
        if avail == 0 {
            break;
        }
        let Ok(chunk) = conn.from_app.read_chunk(avail) else {
            break;
        };
        let (a, b) = chunk.as_slices();
        let src = if a.is_empty() { b } else { a };
        let n = socket.send_slice(src).unwrap_or(0);
        chunk.commit(n);
        if n == 0 {
            break;
        }
        sent += n;
    }
    if sent > 0 {
        conn.shared.write_waker.wake();
    }
    let writer_gone = conn.from_app.is_abandoned();
    if conn.from_app.is_empty() {
        if conn.shared.write_shut.load(Ordering::Acquire) || writer_gone {
            if !conn.fin_queued {
                socket.close();
                conn.fin_queued = true;
            }
        } else {
            StreamShared::engine_waits(&conn.shared.tx_idle);
            if !conn.from_app.is_empty() {
                *more = true;
            }
        }
    }

    // Stack to application.
    let reader_gone = conn.to_app.is_abandoned() || conn.shared.read_closed.load(Ordering::Acquire);
    let mut received = 0;
    while socket.can_recv() {
        let to_app = &mut conn.to_app;
        let n = if reader_gone {
            socket.recv(|data| (data.len(), data.len())).unwrap_or(0)
        } else {
            socket
                .recv(|data| {
                    let (pushed, _) = to_app.push_partial_slice(data);
                    (pushed.len(), pushed.len())
                })
                .unwrap_or(0)
        };
        if n == 0 {
            break;
        }
        received += n;
    }
    if received > 0 {
        conn.shared.read_waker.wake();
    }
    if socket.can_recv() && !reader_gone {
        StreamShared::engine_waits(&conn.shared.rx_blocked);
        if conn.to_app.slots() > 0 {
            *more = true;
        }
    }

    let state = socket.state();
    if matches!(
        state,
        tcp::State::CloseWait | tcp::State::LastAck | tcp::State::Closing | tcp::State::TimeWait
    ) {
        conn.got_fin = true;
    }
    if !conn.told_end && !socket.can_recv() {
        if conn.got_fin {
            conn.shared.eof.store(true, Ordering::Release);
            conn.told_end = true;
        } else if state == tcp::State::Closed {
            // Closed with no FIN state seen. The FIN may still have come first: a peer that
            // already closed answers a late ACK with a reset, and both can arrive within
            // one turn, before this ever saw TIME-WAIT. smoltcp remembers a FIN it took in
            // order (everything before it was received), and a receive says so.
            if matches!(socket.recv(|_| (0, ())), Err(tcp::RecvError::Finished)) {
                conn.shared.eof.store(true, Ordering::Release);
            } else {
                // A reset, or given up on (TCP_TIMEOUT).
                conn.shared.error.store(ERR_RESET, Ordering::Release);
            }
            conn.told_end = true;
        }
        if conn.told_end {
            conn.shared.read_waker.wake();
            conn.shared.write_waker.wake();
        }
    }
    keep(conn, socket, now, writer_gone, reader_gone)
}

/// Whether a connection stays: until its socket is finished and nothing more can be told,
/// or, with its handles gone, until it closed (or lingered too long).
fn keep(
    conn: &mut Conn,
    socket: &mut tcp::Socket<'_>,
    now: Instant,
    writer_gone: bool,
    reader_gone: bool,
) -> bool {
    let finished = matches!(socket.state(), tcp::State::Closed | tcp::State::TimeWait);
    if finished && conn.told_end {
        // Writes from here on find the ring abandoned and fail.
        return false;
    }
    if writer_gone && reader_gone {
        let since = *conn.abandoned_at.get_or_insert(now);
        if finished || now.saturating_duration_since(since) >= LINGER {
            socket.abort();
            return false;
        }
    }
    true
}

/// One UDP socket's turn. Returns `false` when its handle is gone and what it sent is out.
fn serve_udp(udp: &mut Udp, sockets: &mut SocketSet<'_>, more: &mut bool) -> bool {
    let closed = udp.shared.closed.load(Ordering::Acquire);
    let socket = sockets.get_mut::<udp::Socket>(udp.handle);
    let mut sent = false;
    while let Some((to, len)) = rings::peek_datagram(&mut udp.from_app) {
        match socket.send(len, IpEndpoint::from(to)) {
            Ok(buf) => {
                rings::take_datagram(&mut udp.from_app, len, buf);
            }
            Err(udp::SendError::BufferFull) => break,
            Err(udp::SendError::Unaddressable) => {
                rings::take_datagram(&mut udp.from_app, len, &mut []);
            }
        }
        sent = true;
    }
    if sent {
        udp.shared.send_waker.wake();
    }
    if udp.from_app.is_empty() {
        StreamShared::engine_waits(&udp.shared.tx_idle);
        if !udp.from_app.is_empty() {
            *more = true;
        }
    }
    if closed {
        // Datagrams sent just before the handle was dropped still go out.
        return !(udp.from_app.is_empty() && socket.send_queue() == 0);
    }
    let mut received = false;
    while let Ok((data, meta)) = socket.peek() {
        if udp.to_app.is_abandoned() {
            let _ = socket.recv();
            continue;
        }
        if !rings::push_datagram(&mut udp.to_app, to_socket_addr(meta.endpoint), data) {
            StreamShared::engine_waits(&udp.shared.rx_blocked);
            if udp.to_app.slots() >= rings::HEADER + data.len() {
                *more = true;
            }
            break;
        }
        let _ = socket.recv();
        received = true;
    }
    if received {
        udp.shared.recv_waker.wake();
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_sockets_get_linux_s_rto_floor() {
        let socket = new_tcp_socket();
        assert_eq!(socket.min_rto(), smoltcp::time::Duration::from_millis(200));
        assert_eq!(socket.min_rto(), MIN_RTO.into());
    }
}
