//! Next hops for the AF_XDP path: the kernel's routes and neighbours (ARP/NDP), read over
//! rtnetlink and kept current as they change.
//!
//! The AF_XDP backend writes whole Ethernet frames, so for every destination it needs what
//! the kernel's UDP stack would have found: the route (interface, source address, gateway)
//! and the gateway's (or on-link destination's) MAC address. The kernel stays the authority:
//! nothing here resolves anything itself.
//!
//! - [`NextHops`] (one per interface, shared by the workers): a thread that listens to the
//!   kernel's link, address, route, rule, next-hop and neighbour events and moves a
//!   generation counter on each batch of them (and when events were lost: ENOBUFS).
//!   Neighbour events for other interfaces are ignored (they cannot change a next hop on
//!   ours); everything else counts, since e.g. a link going down on another interface
//!   removes IPv4 routes without a route event.
//! - [`Resolver`] (one per worker, not shared): a cache of destination → [`Resolution`],
//!   emptied when the generation moves, filled by asking the kernel (RTM_GETROUTE for the
//!   destination, which applies policy routing like a send; RTM_GETNEIGH for the next hop;
//!   RTM_GETLINK for our MAC). A hit costs a hash lookup and one atomic load, and allocates
//!   nothing.
//! - A next hop the kernel has not resolved is [`Resolution::Unresolved`]: the backend sends
//!   that datagram through the kernel's UDP socket, which makes the kernel resolve it; the
//!   neighbour event that follows moves the generation and the next lookup finds it. A
//!   negative answer is re-asked at most every [`RETRY`] (100 ms), so a missed event cannot
//!   keep a destination on the slow path.
//! - **Freshness** ([`Resolver::confirm_due`]): the kernel never sees the traffic tunneld
//!   sends past it, so it never re-confirms a neighbour, whose entry goes STALE after its
//!   reachable time (15-45 s) and stays there. Once a second per neighbour while its entry
//!   is STALE, one datagram goes through the kernel's socket instead: the kernel moves the
//!   entry to DELAY, then PROBE (a unicast ARP/NS), and back to REACHABLE when the peer
//!   answers, or re-resolves it from scratch when it does not (the peer is gone or has a new
//!   MAC), and the events that follow refresh our cache.
//! - **A peer that changes its MAC** and announces it (a gratuitous ARP or unsolicited
//!   neighbour advertisement: `net.ipv4.conf.X.arp_notify=1`, `net.ipv6.conf.X.ndisc_notify=1`
//!   on the peer, or what failover software sends) is followed at once: the kernel updates
//!   its entry, the event moves the generation, and the next datagram goes to the new MAC.
//!   One that changes silently is found when its entry next goes STALE and the confirming
//!   probe to the old MAC fails (at most the reachable time plus the probes: tens of seconds).
//!
//! Like `tunneld::netlink`, requests are a few fixed bytes and replies are read with the
//! low-level buffers only (header, then attributes by number): nothing the kernel sends can
//! make this panic, and a query allocates nothing. Sockets belong to the network namespace of
//! the thread that opens them: call [`NextHops::start`] and [`Resolver::new`] from threads in
//! the interface's namespace.

use super::frame::Hop;
use crate::waker::Waker;
use netlink_packet_core::{
    NetlinkBuffer, NlasIterator, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST,
};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr as NetlinkAddr};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a negative answer (not resolved, or a failed query) is kept before the kernel is
/// asked again even though no event said anything changed.
pub const RETRY: Duration = Duration::from_millis(100);
/// How often a STALE neighbour is confirmed through the kernel ([`Resolver::confirm_due`]).
pub const CONFIRM_EVERY: Duration = Duration::from_secs(1);
/// Destinations (and neighbours) a resolver keeps; past this the cache starts over, so it
/// never grows (allocates) in steady state.
pub const CACHE_CAPACITY: usize = 1024;
/// How long a query waits for the kernel's answer before it fails (never in practice: the
/// kernel answers a get request before the send returns).
const QUERY_TIMEOUT: Duration = Duration::from_secs(1);
/// Room for any single reply and for a datagram of a dump.
const RECEIVE_BUFFER: usize = 64 * 1024;
/// Requests are a header, a family header and at most three small attributes.
const REQUEST_MAX: usize = 128;
/// How often a dump cut short by a concurrent change is tried again.
const DUMP_TRIES: usize = 4;

// Netlink and rtnetlink ABI numbers (linux/netlink.h, rtnetlink.h, neighbour.h, if_link.h,
// if_addr.h, if_arp.h), spelled out here so the parsing below reads as the kernel's layout.
const NLMSG_NOOP: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_OVERRUN: u16 = 4;
const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_GETADDR: u16 = 22;
const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const RTM_NEWNEIGH: u16 = 28;
const RTM_DELNEIGH: u16 = 29;
const RTM_GETNEIGH: u16 = 30;
const RTNLGRP_LINK: u32 = 1;
const RTNLGRP_NEIGH: u32 = 3;
const RTNLGRP_IPV4_IFADDR: u32 = 5;
const RTNLGRP_IPV4_ROUTE: u32 = 7;
const RTNLGRP_IPV4_RULE: u32 = 8;
const RTNLGRP_IPV6_IFADDR: u32 = 9;
const RTNLGRP_IPV6_ROUTE: u32 = 11;
const RTNLGRP_IPV6_RULE: u32 = 19;
const RTNLGRP_NEXTHOP: u32 = 32;
const AF_INET: u8 = libc::AF_INET as u8;
const AF_INET6: u8 = libc::AF_INET6 as u8;
/// `struct rtmsg`, `struct ndmsg`, `struct ifinfomsg`, `struct ifaddrmsg`.
const RTMSG_LEN: usize = 12;
const NDMSG_LEN: usize = 12;
const IFINFOMSG_LEN: usize = 16;
const IFADDRMSG_LEN: usize = 8;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PREFSRC: u16 = 7;
const RTA_MARK: u16 = 16;
const RTA_VIA: u16 = 18;
const RTN_UNICAST: u8 = 1;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
const NUD_REACHABLE: u16 = 0x02;
const NUD_STALE: u16 = 0x04;
const NUD_DELAY: u16 = 0x08;
const NUD_PROBE: u16 = 0x10;
const NUD_NOARP: u16 = 0x40;
const NUD_PERMANENT: u16 = 0x80;
/// The states in which the kernel itself sends to the entry's address.
const NUD_USABLE: u16 =
    NUD_REACHABLE | NUD_STALE | NUD_DELAY | NUD_PROBE | NUD_NOARP | NUD_PERMANENT;
const IFLA_ADDRESS: u16 = 1;
const ARPHRD_ETHER: u16 = 1;
const IFF_NOARP: u32 = 0x80;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFA_FLAGS: u16 = 8;
const IFA_F_DADFAILED: u32 = 0x08;
const IFA_F_TENTATIVE: u32 = 0x40;

/// Where a datagram to a destination goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// Out of the XDP interface, with these headers.
    Ready(Hop),
    /// Out of the XDP interface, but the kernel has no usable neighbour entry yet: send this
    /// datagram through the kernel's socket (which makes the kernel resolve it).
    Unresolved,
    /// Not out of the XDP interface (another interface, loopback, a local or unreachable
    /// destination, an interface without Ethernet addresses), or the kernel could not be
    /// asked: the kernel's socket sends it.
    Elsewhere,
}

/// The generation counter and the thread that moves it, for one interface. Shared by the
/// workers (`Arc`); dropping the last reference stops the thread.
#[derive(Debug)]
pub struct NextHops {
    ifindex: u32,
    generation: Arc<AtomicU64>,
    /// The `SO_MARK` the tunnel's sockets carry (`fwmark`): routes are asked as for them.
    mark: AtomicU32,
    stop: Arc<Waker>,
    /// The subscribed socket until the thread takes it, then the thread.
    socket: std::sync::Mutex<Option<Netlink>>,
    thread: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl NextHops {
    /// Subscribes to the kernel's events (in the calling thread's network namespace) and
    /// starts the thread that follows them for interface `ifindex`.
    pub fn start(ifindex: u32) -> io::Result<Arc<NextHops>> {
        let nexthops = NextHops::new(ifindex)?;
        nexthops.start_monitor()?;
        Ok(nexthops)
    }

    /// Starts the thread that follows the events subscribed to by [`NextHops::new`] (once;
    /// later calls do nothing). Events that came in between are queued on the socket, so
    /// none is missed. A thread keeps the capabilities of the thread that starts it: start
    /// it after dropping them.
    pub fn start_monitor(&self) -> io::Result<()> {
        let Some(socket) = self.socket.lock().ok().and_then(|mut s| s.take()) else {
            return Ok(());
        };
        let ifindex = self.ifindex;
        let generation = Arc::clone(&self.generation);
        let stop = Arc::clone(&self.stop);
        let thread = std::thread::Builder::new()
            .name(format!("nexthop-{ifindex}"))
            .spawn(move || watch(socket, ifindex, &generation, &stop))
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot watch the kernel's routes and neighbours: {e}"),
                )
            })?;
        if let Ok(mut slot) = self.thread.lock() {
            *slot = Some(thread);
        }
        Ok(())
    }

    /// Subscribes to the kernel's events for interface `ifindex`, in the calling thread's
    /// network namespace; nothing follows them until [`NextHops::start_monitor`].
    pub fn new(ifindex: u32) -> io::Result<Arc<NextHops>> {
        let context = |e: io::Error| {
            io::Error::new(
                e.kind(),
                format!("cannot watch the kernel's routes and neighbours: {e}"),
            )
        };
        let socket = Netlink::open(NETLINK_ROUTE, false).map_err(context)?;
        for group in [
            RTNLGRP_LINK,
            RTNLGRP_NEIGH,
            RTNLGRP_IPV4_IFADDR,
            RTNLGRP_IPV6_IFADDR,
            RTNLGRP_IPV4_ROUTE,
            RTNLGRP_IPV6_ROUTE,
            RTNLGRP_IPV4_RULE,
            RTNLGRP_IPV6_RULE,
        ] {
            socket.socket.add_membership(group).map_err(context)?;
        }
        // Next-hop objects (`ip nexthop`) are newer (5.3); without them nothing uses them.
        let _ = socket.socket.add_membership(RTNLGRP_NEXTHOP);
        socket.socket.set_non_blocking(true).map_err(context)?;
        // A deep queue, so bursts (a link flap removes many routes) rarely overrun it; an
        // overrun is noticed (ENOBUFS) and handled, only slower.
        let _ = socket.socket.set_rx_buf_sz(4 * 1024 * 1024);
        Ok(Arc::new(NextHops {
            ifindex,
            generation: Arc::new(AtomicU64::new(0)),
            mark: AtomicU32::new(0),
            stop: Arc::new(Waker::new().map_err(context)?),
            socket: std::sync::Mutex::new(Some(socket)),
            thread: std::sync::Mutex::new(None),
        }))
    }

    /// The interface whose next hops these are.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Moves (by at least one) after every change of a route, rule, link, address or of a
    /// neighbour on the interface, and after events were lost.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Routes are asked as for a socket with this `SO_MARK` (the tunnel's `fwmark`, for
    /// policy routing on it; 0: none) from now on: the generation moves, so every resolver
    /// asks again.
    pub fn set_mark(&self, mark: u32) {
        if self.mark.swap(mark, Ordering::AcqRel) != mark {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// The mark routes are asked with.
    pub fn mark(&self) -> u32 {
        self.mark.load(Ordering::Acquire)
    }
}

impl Drop for NextHops {
    fn drop(&mut self) {
        self.stop.wake();
        if let Some(thread) = self.thread.get_mut().ok().and_then(Option::take) {
            let _ = thread.join();
        }
    }
}

/// The event thread: waits for events or the stop signal, drains every queued event, and
/// moves the generation once per drain that saw one that matters.
fn watch(mut rtnl: Netlink, ifindex: u32, generation: &AtomicU64, stop: &Waker) {
    let mut errors = 0u64;
    loop {
        let mut fds = [
            libc::pollfd {
                fd: rtnl.socket.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfd for the duration of the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                tracing::warn!("next hops: poll failed: {e}");
                std::thread::sleep(RETRY);
            }
            continue;
        }
        if fds[1].revents != 0 {
            return;
        }
        let mut changed = false;
        loop {
            match rtnl.receive(libc::MSG_DONTWAIT) {
                Ok(datagram) => changed |= matters(datagram, ifindex),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // ENOBUFS: the queue overran and events were lost; anything may have
                    // changed. Anything else: the same, and do not spin on it.
                    changed = true;
                    if e.raw_os_error() != Some(libc::ENOBUFS) {
                        errors += 1;
                        if errors == 1 {
                            tracing::warn!("next hops: reading the kernel's events failed: {e}");
                        }
                        std::thread::sleep(RETRY);
                    }
                    break;
                }
            }
        }
        if changed {
            generation.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// Whether a datagram of events can change a next hop on `ifindex`: everything but
/// neighbour events for other interfaces (and what cannot be read counts).
fn matters(datagram: &[u8], ifindex: u32) -> bool {
    let mut rest = datagram;
    let mut any = datagram.is_empty();
    while !rest.is_empty() {
        let Ok(message) = NetlinkBuffer::new_checked(rest) else {
            return true;
        };
        let len = message.length() as usize;
        any |= match message.message_type() {
            RTM_NEWNEIGH | RTM_DELNEIGH => {
                neighbour_ifindex(message.payload()).is_none_or(|index| index == ifindex)
            }
            NLMSG_NOOP | NLMSG_DONE => false,
            _ => true,
        };
        rest = rest.get(align4(len)..).unwrap_or(&[]);
    }
    any
}

fn neighbour_ifindex(payload: &[u8]) -> Option<u32> {
    payload.get(4..8)?.try_into().ok().map(u32::from_ne_bytes)
}

/// The addresses of interface `ifindex` (asked in the calling thread's network namespace):
/// IPv4 local addresses and IPv6 addresses, without those still tentative (duplicate
/// address detection not done) or whose detection failed: those the kernel accepts
/// datagrams for. Ask again when [`NextHops::generation`] moves.
pub fn interface_addresses(ifindex: u32) -> io::Result<Vec<IpAddr>> {
    let context = |e: Failure| e.named(&format!("cannot list the addresses of link {ifindex}"));
    let mut rtnl = Netlink::open(NETLINK_ROUTE, true).map_err(|e| context(Failure::Io(e)))?;
    let mut tries = 0;
    loop {
        let mut addresses = Vec::new();
        let request = Request::new(RTM_GETADDR, NLM_F_DUMP, &[0; IFADDRMSG_LEN]);
        let result = rtnl.exchange(request, true, |kind, payload| {
            if kind == RTM_NEWADDR {
                if let Some(addr) = parse_address(payload, ifindex) {
                    if !addresses.contains(&addr) {
                        addresses.push(addr);
                    }
                }
            }
        });
        tries += 1;
        match result {
            Ok(()) => return Ok(addresses),
            Err(Failure::Interrupted) if tries < DUMP_TRIES => {}
            Err(e) => return Err(context(e)),
        }
    }
}

/// The usable address of one RTM_NEWADDR payload, if it is on `ifindex`.
fn parse_address(payload: &[u8], ifindex: u32) -> Option<IpAddr> {
    let family = *payload.first()?;
    let mut flags = u32::from(*payload.get(2)?);
    let index = u32::from_ne_bytes(payload.get(4..8)?.try_into().ok()?);
    if index != ifindex {
        return None;
    }
    let (mut local, mut address) = (None, None);
    for attribute in NlasIterator::new(payload.get(IFADDRMSG_LEN..)?) {
        let attribute = attribute.ok()?;
        let value = attribute.value();
        match attribute.kind() {
            IFA_LOCAL => local = ip_from(family, value),
            IFA_ADDRESS => address = ip_from(family, value),
            IFA_FLAGS => flags = u32::from_ne_bytes(value.try_into().ok()?),
            _ => {}
        }
    }
    if flags & (IFA_F_TENTATIVE | IFA_F_DADFAILED) != 0 {
        return None;
    }
    // IFA_LOCAL is the interface's own address (IFA_ADDRESS is the peer's on a
    // point-to-point link); IPv6 normally has only IFA_ADDRESS.
    local.or(address)
}

/// A neighbour entry's state and link-layer address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Neighbour {
    state: u16,
    mac: Option<[u8; 6]>,
}

/// What the kernel's route lookup said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Route {
    kind: u8,
    oif: Option<u32>,
    source: Option<IpAddr>,
    gateway: Option<IpAddr>,
}

/// What we know of the XDP interface itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    /// An Ethernet interface that resolves neighbours: our MAC.
    Ethernet([u8; 6]),
    /// No MAC or no ARP/NDP (tun, wireguard, NOARP): nothing can be sent past the kernel.
    NotEthernet,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    resolution: Resolution,
    /// The address whose neighbour entry the answer came from (gateway or destination).
    neighbour: Option<IpAddr>,
    state: u16,
    /// When the kernel was asked; a negative answer is asked again after [`RETRY`].
    asked: Option<Instant>,
}

/// Cache key: the destination and, for IPv6, its scope (a link-local address names a
/// different host on each interface).
type Key = (IpAddr, u32);

fn key_of(dst: SocketAddr) -> Key {
    match dst {
        SocketAddr::V4(a) => (IpAddr::V4(*a.ip()), 0),
        SocketAddr::V6(a) => (IpAddr::V6(*a.ip()), a.scope_id()),
    }
}

/// One worker's next-hop cache and its own netlink socket for questions.
#[derive(Debug)]
pub struct Resolver {
    nexthops: Arc<NextHops>,
    rtnl: Netlink,
    generation: u64,
    link: Option<Link>,
    /// The mark of `generation` (read when it moved).
    mark: u32,
    cache: HashMap<Key, Entry>,
    /// When each neighbour was last confirmed through the kernel.
    confirmed: HashMap<IpAddr, Instant>,
    errors: u64,
}

impl Resolver {
    /// A resolver for the interface of `nexthops`, with a netlink socket in the calling
    /// thread's network namespace (which must be the interface's).
    pub fn new(nexthops: Arc<NextHops>) -> io::Result<Resolver> {
        let rtnl = Netlink::open(NETLINK_ROUTE, true).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot open a netlink socket for next-hop queries: {e}"),
            )
        })?;
        Ok(Resolver {
            generation: nexthops.generation(),
            mark: nexthops.mark(),
            nexthops,
            rtnl,
            link: None,
            cache: HashMap::with_capacity(CACHE_CAPACITY),
            confirmed: HashMap::with_capacity(CACHE_CAPACITY),
            errors: 0,
        })
    }

    /// Queries to the kernel that failed (each answered as [`Resolution::Elsewhere`]).
    pub fn errors(&self) -> u64 {
        self.errors
    }

    /// Where a datagram to `dst` goes. From the cache when nothing changed since it was
    /// asked; otherwise the kernel is asked (a few system calls).
    pub fn resolve(&mut self, dst: SocketAddr) -> Resolution {
        let generation = self.nexthops.generation();
        if generation != self.generation {
            // `confirmed` stays: it paces the kernel sends, whatever else changed.
            self.cache.clear();
            self.link = None;
            self.generation = generation;
            self.mark = self.nexthops.mark();
        }
        let key = key_of(dst);
        if let Some(entry) = self.cache.get(&key) {
            match entry.asked {
                None => return entry.resolution,
                Some(asked) if asked.elapsed() < RETRY => return entry.resolution,
                Some(_) => {}
            }
        }
        let entry = match self.ask(dst) {
            Ok(entry) => entry,
            Err(e) => {
                self.errors += 1;
                if self.errors == 1 {
                    tracing::warn!("next hops: {e}; sending through the kernel instead");
                } else {
                    tracing::debug!("next hops: {e}");
                }
                Entry {
                    resolution: Resolution::Elsewhere,
                    neighbour: None,
                    state: 0,
                    asked: Some(Instant::now()),
                }
            }
        };
        if self.cache.len() >= self.cache.capacity() && !self.cache.contains_key(&key) {
            self.cache.clear();
        }
        self.cache.insert(key, entry);
        entry.resolution
    }

    /// Whether the datagram to `dst` should go through the kernel's socket this time, to
    /// keep the kernel's neighbour entry fresh: true at most once per [`CONFIRM_EVERY`] per
    /// neighbour (gateway or on-link destination), and only while the entry was STALE when
    /// last asked. Call it for destinations [`Resolver::resolve`] found `Ready`.
    pub fn confirm_due(&mut self, dst: SocketAddr, now: Instant) -> bool {
        let Some(entry) = self.cache.get(&key_of(dst)) else {
            return false;
        };
        let (Resolution::Ready(_), Some(neighbour), NUD_STALE) =
            (entry.resolution, entry.neighbour, entry.state)
        else {
            return false;
        };
        match self.confirmed.get_mut(&neighbour) {
            Some(last) if now.saturating_duration_since(*last) < CONFIRM_EVERY => false,
            Some(last) => {
                *last = now;
                true
            }
            None => {
                if self.confirmed.len() >= self.confirmed.capacity() {
                    self.confirmed.clear();
                }
                self.confirmed.insert(neighbour, now);
                true
            }
        }
    }

    /// Asks the kernel where `dst` goes.
    fn ask(&mut self, dst: SocketAddr) -> io::Result<Entry> {
        let ifindex = self.nexthops.ifindex;
        let elsewhere = Entry {
            resolution: Resolution::Elsewhere,
            neighbour: None,
            state: 0,
            asked: None,
        };
        let src_mac = match self.link {
            Some(link) => link,
            None => {
                let link = self
                    .rtnl
                    .link(ifindex)
                    .map_err(|e| e.named(&format!("cannot ask the kernel about link {ifindex}")))?;
                self.link = Some(link);
                link
            }
        };
        let Link::Ethernet(src_mac) = src_mac else {
            return Ok(elsewhere);
        };
        let route = match self.rtnl.route(dst, self.mark) {
            Ok(route) => route,
            // No route, a prohibit/blackhole/unreachable route, or a refused question: the
            // kernel's socket sends it (and reports the error the kernel's way).
            Err(Failure::Refused { .. }) => return Ok(elsewhere),
            Err(e) => return Err(e.named(&format!("cannot ask the kernel for the route to {dst}"))),
        };
        let (RTN_UNICAST, Some(oif), Some(source)) = (route.kind, route.oif, route.source) else {
            return Ok(elsewhere);
        };
        if oif != ifindex || source.is_ipv4() != dst.is_ipv4() {
            return Ok(elsewhere);
        }
        let neighbour = route.gateway.unwrap_or(dst.ip());
        let found = match self.rtnl.neighbour(ifindex, neighbour) {
            Ok(found) => found,
            Err(Failure::Refused { errno, .. }) if errno == libc::ENOENT => None,
            Err(e) => {
                return Err(e.named(&format!(
                    "cannot ask the kernel for the neighbour {neighbour} (next hop to {dst})"
                )))
            }
        };
        Ok(match found {
            Some(Neighbour {
                state,
                mac: Some(dst_mac),
            }) if state & NUD_USABLE != 0 => Entry {
                resolution: Resolution::Ready(Hop {
                    src_mac,
                    dst_mac,
                    src_ip: source,
                    ifindex,
                }),
                neighbour: Some(neighbour),
                state,
                asked: None,
            },
            other => Entry {
                resolution: Resolution::Unresolved,
                neighbour: Some(neighbour),
                state: other.map_or(0, |n| n.state),
                asked: Some(Instant::now()),
            },
        })
    }
}

/// Why a question failed, before it is named in an `io::Error`.
#[derive(Debug)]
pub(super) enum Failure {
    /// The kernel answered with this errno.
    Refused { errno: i32 },
    /// A dump was cut short by a concurrent change: ask again.
    Interrupted,
    /// The socket failed, or the reply could not be read.
    Io(io::Error),
}

impl Failure {
    /// One line: `{what}: {reason}`.
    pub(super) fn named(self, what: &str) -> io::Error {
        match self {
            Failure::Refused { errno } => {
                let os = io::Error::from_raw_os_error(errno);
                io::Error::new(os.kind(), format!("{what}: {os}"))
            }
            Failure::Interrupted => io::Error::new(
                io::ErrorKind::Interrupted,
                format!("{what}: the answer kept being cut short by changes"),
            ),
            Failure::Io(e) => io::Error::new(e.kind(), format!("{what}: {e}")),
        }
    }
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Failure {
        Failure::Io(e)
    }
}

pub(super) fn malformed(what: &str) -> Failure {
    Failure::Io(io::Error::new(
        io::ErrorKind::InvalidData,
        format!("malformed reply from the kernel: {what}"),
    ))
}

/// One netlink request, built in place: header, family header, attributes.
pub(super) struct Request {
    bytes: [u8; REQUEST_MAX],
    len: usize,
}

impl Request {
    pub(super) fn new(kind: u16, flags: u16, family_header: &[u8]) -> Request {
        let mut request = Request {
            bytes: [0; REQUEST_MAX],
            len: 16,
        };
        request.bytes[4..6].copy_from_slice(&kind.to_ne_bytes());
        request.bytes[6..8].copy_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
        request.push(family_header);
        request
    }

    /// Appends `bytes` and pads to 4 bytes. The requests here are a few fixed sizes well
    /// under `REQUEST_MAX`; one that did not fit would go out cut short, and the kernel
    /// would refuse it.
    fn push(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        if let Some(room) = self.bytes.get_mut(self.len..end) {
            room.copy_from_slice(bytes);
            self.len = align4(end).min(REQUEST_MAX);
        }
    }

    pub(super) fn attribute(&mut self, kind: u16, value: &[u8]) {
        let len = 4 + value.len();
        if self.len + align4(len) > REQUEST_MAX {
            return;
        }
        let mut header = [0u8; 4];
        header[..2].copy_from_slice(&(len as u16).to_ne_bytes());
        header[2..].copy_from_slice(&kind.to_ne_bytes());
        self.push(&header);
        self.push(value);
    }

    /// The finished message with its length and sequence number.
    fn finish(&mut self, sequence: u32) -> &[u8] {
        self.bytes[0..4].copy_from_slice(&(self.len as u32).to_ne_bytes());
        self.bytes[8..12].copy_from_slice(&sequence.to_ne_bytes());
        &self.bytes[..self.len]
    }
}

fn align4(len: usize) -> usize {
    len.saturating_add(3) & !3
}

fn family_of(addr: IpAddr) -> u8 {
    match addr {
        IpAddr::V4(_) => AF_INET,
        IpAddr::V6(_) => AF_INET6,
    }
}

fn ip_from(family: u8, bytes: &[u8]) -> Option<IpAddr> {
    match family {
        AF_INET => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(bytes).ok()?))),
        AF_INET6 => Some(IpAddr::V6(Ipv6Addr::from(
            <[u8; 16]>::try_from(bytes).ok()?,
        ))),
        _ => None,
    }
}

fn octets(addr: &IpAddr) -> ([u8; 16], usize) {
    match addr {
        IpAddr::V4(a) => {
            let mut out = [0; 16];
            out[..4].copy_from_slice(&a.octets());
            (out, 4)
        }
        IpAddr::V6(a) => (a.octets(), 16),
    }
}

/// A netlink socket (NETLINK_ROUTE here; NETLINK_GENERIC for `device.rs`) and its receive
/// buffer.
pub(super) struct Netlink {
    socket: Socket,
    sequence: u32,
    buf: Vec<u8>,
}

impl std::fmt::Debug for Netlink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Netlink")
            .field("fd", &self.socket.as_raw_fd())
            .finish_non_exhaustive()
    }
}

impl Netlink {
    /// A socket of `protocol` in the calling thread's namespace; `query`: connected to the
    /// kernel, with a receive timeout (for questions rather than events).
    pub(super) fn open(protocol: isize, query: bool) -> io::Result<Netlink> {
        let mut socket = Socket::new(protocol)?;
        socket.bind_auto()?;
        if query {
            socket.connect(&NetlinkAddr::new(0, 0))?;
            let timeout = libc::timeval {
                tv_sec: QUERY_TIMEOUT.as_secs() as libc::time_t,
                tv_usec: QUERY_TIMEOUT.subsec_micros() as libc::suseconds_t,
            };
            // SAFETY: SO_RCVTIMEO reads a timeval of the given size from a valid pointer.
            let rc = unsafe {
                libc::setsockopt(
                    socket.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVTIMEO,
                    (&timeout as *const libc::timeval).cast(),
                    std::mem::size_of::<libc::timeval>() as libc::socklen_t,
                )
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(Netlink {
            socket,
            sequence: 0,
            buf: Vec::with_capacity(RECEIVE_BUFFER),
        })
    }

    /// Reads one datagram; one larger than the buffer (never, for rtnetlink) is an error
    /// rather than a silently shortened answer.
    fn receive(&mut self, flags: libc::c_int) -> io::Result<&[u8]> {
        self.buf.clear();
        let n = self.socket.recv(&mut self.buf, flags | libc::MSG_TRUNC)?;
        if n > self.buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a netlink message of {n} bytes is larger than the buffer"),
            ));
        }
        Ok(&self.buf[..n])
    }

    /// Sends one request and reads replies until the answer (a get: the first reply; a
    /// dump: DONE), handing each reply message's type and payload to `on_reply`.
    pub(super) fn exchange(
        &mut self,
        mut request: Request,
        dump: bool,
        mut on_reply: impl FnMut(u16, &[u8]),
    ) -> Result<(), Failure> {
        self.sequence = self.sequence.wrapping_add(1);
        let sequence = self.sequence;
        let bytes = request.finish(sequence);
        loop {
            match self.socket.send(bytes, 0) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
                Ok(_) => break,
            }
        }
        let mut interrupted = false;
        loop {
            let datagram = match self.receive(0) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Err(Failure::Io(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no answer from the kernel",
                    )))
                }
                other => other?,
            };
            if let Some(result) = scan(datagram, sequence, dump, &mut interrupted, &mut on_reply) {
                return result;
            }
        }
    }

    /// Our MAC, if the link is Ethernet and resolves neighbours.
    fn link(&mut self, ifindex: u32) -> Result<Link, Failure> {
        let mut header = [0u8; IFINFOMSG_LEN];
        header[4..8].copy_from_slice(&ifindex.to_ne_bytes());
        let request = Request::new(RTM_GETLINK, 0, &header);
        let mut link = None;
        self.exchange(request, false, |kind, payload| {
            if kind == RTM_NEWLINK {
                link = parse_link(payload);
            }
        })?;
        link.ok_or_else(|| malformed("no link in the answer"))
    }

    /// The kernel's route to `dst`, as a datagram sent now would take it.
    fn route(&mut self, dst: SocketAddr, mark: u32) -> Result<Route, Failure> {
        let ip = dst.ip();
        let (bytes, len) = octets(&ip);
        let mut header = [0u8; RTMSG_LEN];
        header[0] = family_of(ip);
        header[1] = (len * 8) as u8;
        let mut request = Request::new(RTM_GETROUTE, 0, &header);
        request.attribute(RTA_DST, &bytes[..len]);
        if let SocketAddr::V6(v6) = dst {
            if v6.scope_id() != 0 {
                request.attribute(RTA_OIF, &v6.scope_id().to_ne_bytes());
            }
        }
        if mark != 0 {
            request.attribute(RTA_MARK, &mark.to_ne_bytes());
        }
        let mut route = None;
        self.exchange(request, false, |kind, payload| {
            if kind == RTM_NEWROUTE {
                route = parse_route(payload);
            }
        })?;
        route.ok_or_else(|| malformed("no route in the answer"))
    }

    /// The kernel's neighbour entry for `addr` on `ifindex`, if there is one.
    fn neighbour(&mut self, ifindex: u32, addr: IpAddr) -> Result<Option<Neighbour>, Failure> {
        let (bytes, len) = octets(&addr);
        let mut header = [0u8; NDMSG_LEN];
        header[0] = family_of(addr);
        header[4..8].copy_from_slice(&ifindex.to_ne_bytes());
        let mut request = Request::new(RTM_GETNEIGH, 0, &header);
        request.attribute(NDA_DST, &bytes[..len]);
        let mut found = None;
        self.exchange(request, false, |kind, payload| {
            if kind == RTM_NEWNEIGH {
                found = parse_neighbour(payload);
            }
        })?;
        Ok(found)
    }
}

/// Walks the messages of one datagram of replies to request `sequence`. `Some` when the
/// answer is complete (or failed); messages for other requests (late answers to a question
/// that timed out) are skipped.
fn scan(
    mut datagram: &[u8],
    sequence: u32,
    dump: bool,
    interrupted: &mut bool,
    on_reply: &mut impl FnMut(u16, &[u8]),
) -> Option<Result<(), Failure>> {
    while !datagram.is_empty() {
        let Ok(message) = NetlinkBuffer::new_checked(datagram) else {
            return Some(Err(malformed("bad message length")));
        };
        let len = message.length() as usize;
        if message.sequence_number() == sequence {
            let payload = message.payload();
            match message.message_type() {
                NLMSG_ERROR => {
                    let Some(code) = payload.get(..4).and_then(|b| b.try_into().ok()) else {
                        return Some(Err(malformed("short error message")));
                    };
                    return Some(match i32::from_ne_bytes(code) {
                        0 => Ok(()),
                        code => Err(Failure::Refused {
                            errno: i32::try_from(code.unsigned_abs()).unwrap_or(i32::MAX),
                        }),
                    });
                }
                NLMSG_DONE => {
                    let code = payload
                        .get(..4)
                        .and_then(|b| b.try_into().ok())
                        .map_or(0, i32::from_ne_bytes);
                    return Some(if code != 0 {
                        Err(Failure::Refused {
                            errno: i32::try_from(code.unsigned_abs()).unwrap_or(i32::MAX),
                        })
                    } else if *interrupted {
                        Err(Failure::Interrupted)
                    } else {
                        Ok(())
                    });
                }
                NLMSG_OVERRUN => return Some(Err(malformed("data lost (overrun)"))),
                NLMSG_NOOP => {}
                kind => {
                    if message.flags() & NLM_F_DUMP_INTR != 0 {
                        *interrupted = true;
                    }
                    on_reply(kind, payload);
                    if !dump {
                        return Some(Ok(()));
                    }
                }
            }
        }
        // Messages are 4-byte aligned; the last one's padding may be missing.
        datagram = datagram.get(align4(len)..).unwrap_or(&[]);
    }
    None
}

fn parse_link(payload: &[u8]) -> Option<Link> {
    let kind = u16::from_ne_bytes(payload.get(2..4)?.try_into().ok()?);
    let flags = u32::from_ne_bytes(payload.get(8..12)?.try_into().ok()?);
    let mut mac = None;
    for attribute in NlasIterator::new(payload.get(IFINFOMSG_LEN..)?) {
        let attribute = attribute.ok()?;
        if attribute.kind() == IFLA_ADDRESS {
            mac = <[u8; 6]>::try_from(attribute.value()).ok();
        }
    }
    Some(match mac {
        Some(mac) if kind == ARPHRD_ETHER && flags & IFF_NOARP == 0 => Link::Ethernet(mac),
        _ => Link::NotEthernet,
    })
}

fn parse_route(payload: &[u8]) -> Option<Route> {
    let family = *payload.first()?;
    let mut route = Route {
        kind: *payload.get(7)?,
        ..Route::default()
    };
    for attribute in NlasIterator::new(payload.get(RTMSG_LEN..)?) {
        let attribute = attribute.ok()?;
        let value = attribute.value();
        match attribute.kind() {
            RTA_OIF => route.oif = Some(u32::from_ne_bytes(value.try_into().ok()?)),
            RTA_PREFSRC => route.source = ip_from(family, value),
            RTA_GATEWAY => route.gateway = ip_from(family, value),
            // `struct rtvia`: a gateway of another family (IPv4 routes via IPv6 next hops).
            RTA_VIA => {
                let via_family = u16::from_ne_bytes(value.get(..2)?.try_into().ok()?);
                route.gateway = ip_from(u8::try_from(via_family).ok()?, value.get(2..)?);
            }
            _ => {}
        }
    }
    Some(route)
}

fn parse_neighbour(payload: &[u8]) -> Option<Neighbour> {
    let state = u16::from_ne_bytes(payload.get(8..10)?.try_into().ok()?);
    let mut mac = None;
    for attribute in NlasIterator::new(payload.get(NDMSG_LEN..)?) {
        let attribute = attribute.ok()?;
        if attribute.kind() == NDA_LLADDR {
            mac = <[u8; 6]>::try_from(attribute.value()).ok();
        }
    }
    Some(Neighbour { state, mac })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// One netlink attribute, padded as the kernel pads it (also for `device.rs`'s tests).
    pub(in crate::xdp) fn attribute(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut out = ((4 + value.len()) as u16).to_ne_bytes().to_vec();
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(value);
        while !out.len().is_multiple_of(4) {
            out.push(0);
        }
        out
    }

    fn message(kind: u16, flags: u16, sequence: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = ((16 + payload.len()) as u32).to_ne_bytes().to_vec();
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(&flags.to_ne_bytes());
        out.extend_from_slice(&sequence.to_ne_bytes());
        out.extend_from_slice(&0u32.to_ne_bytes());
        out.extend_from_slice(payload);
        while !out.len().is_multiple_of(4) {
            out.push(0);
        }
        out
    }

    fn route_reply(family: u8, kind: u8, attributes: &[Vec<u8>]) -> Vec<u8> {
        let mut payload = vec![family, 32, 0, 0, 254, 2, 0, kind, 0, 0, 0, 0];
        for a in attributes {
            payload.extend_from_slice(a);
        }
        payload
    }

    #[test]
    fn shared_and_moved_between_threads() {
        fn shared<T: Send + Sync>() {}
        fn moved<T: Send>() {}
        shared::<NextHops>();
        moved::<Resolver>();
    }

    #[test]
    fn requests_are_well_formed_netlink() {
        let mut request = Request::new(
            RTM_GETROUTE,
            0,
            &[AF_INET, 32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        );
        request.attribute(RTA_DST, &[192, 0, 2, 7]);
        request.attribute(RTA_MARK, &7u32.to_ne_bytes());
        let bytes = request.finish(42).to_vec();
        let message = NetlinkBuffer::new_checked(&bytes[..]).unwrap();
        assert_eq!(message.length() as usize, bytes.len());
        assert_eq!(message.message_type(), RTM_GETROUTE);
        assert_eq!(message.flags(), NLM_F_REQUEST);
        assert_eq!(message.sequence_number(), 42);
        let attributes: Vec<_> = NlasIterator::new(&message.payload()[RTMSG_LEN..])
            .map(|a| {
                let a = a.unwrap();
                (a.kind(), a.value().to_vec())
            })
            .collect();
        assert_eq!(
            attributes,
            [
                (RTA_DST, vec![192, 0, 2, 7]),
                (RTA_MARK, 7u32.to_ne_bytes().to_vec())
            ]
        );
        // A request that would not fit is cut short, never a panic.
        let mut big = Request::new(RTM_GETROUTE, 0, &[0; 12]);
        for _ in 0..10 {
            big.attribute(RTA_DST, &[0; 16]);
        }
        assert!(big.finish(1).len() <= REQUEST_MAX);
    }

    #[test]
    fn replies_parse_into_routes_neighbours_links_and_addresses() {
        let reply = route_reply(
            AF_INET,
            RTN_UNICAST,
            &[
                attribute(RTA_DST, &[198, 51, 100, 9]),
                attribute(RTA_OIF, &7u32.to_ne_bytes()),
                attribute(RTA_PREFSRC, &[192, 0, 2, 1]),
                attribute(RTA_GATEWAY, &[192, 0, 2, 2]),
            ],
        );
        assert_eq!(
            parse_route(&reply),
            Some(Route {
                kind: RTN_UNICAST,
                oif: Some(7),
                source: Some("192.0.2.1".parse().unwrap()),
                gateway: Some("192.0.2.2".parse().unwrap()),
            })
        );
        let mut via = u16::from(AF_INET6).to_ne_bytes().to_vec();
        via.extend_from_slice(&"fe80::1".parse::<Ipv6Addr>().unwrap().octets());
        let reply = route_reply(AF_INET, RTN_UNICAST, &[attribute(RTA_VIA, &via)]);
        assert_eq!(
            parse_route(&reply).unwrap().gateway,
            Some("fe80::1".parse().unwrap())
        );

        let mut neighbour = vec![AF_INET, 0, 0, 0];
        neighbour.extend_from_slice(&7u32.to_ne_bytes());
        neighbour.extend_from_slice(&NUD_STALE.to_ne_bytes());
        neighbour.extend_from_slice(&[0, 1]);
        neighbour.extend(attribute(NDA_DST, &[192, 0, 2, 2]));
        neighbour.extend(attribute(NDA_LLADDR, &[2, 0, 0, 0, 0, 9]));
        assert_eq!(
            parse_neighbour(&neighbour),
            Some(Neighbour {
                state: NUD_STALE,
                mac: Some([2, 0, 0, 0, 0, 9])
            })
        );
        assert_eq!(neighbour_ifindex(&neighbour), Some(7));

        let mut link = vec![0, 0];
        link.extend_from_slice(&ARPHRD_ETHER.to_ne_bytes());
        link.extend_from_slice(&7u32.to_ne_bytes());
        link.extend_from_slice(&0x1043u32.to_ne_bytes());
        link.extend_from_slice(&0u32.to_ne_bytes());
        link.extend(attribute(IFLA_ADDRESS, &[2, 0, 0, 0, 0, 1]));
        assert_eq!(parse_link(&link), Some(Link::Ethernet([2, 0, 0, 0, 0, 1])));
        link[8..12].copy_from_slice(&(0x1043 | IFF_NOARP).to_ne_bytes());
        assert_eq!(parse_link(&link), Some(Link::NotEthernet));

        let mut address = vec![AF_INET6, 64, 0, 0];
        address.extend_from_slice(&7u32.to_ne_bytes());
        address.extend(attribute(
            IFA_ADDRESS,
            &"fd00::1".parse::<Ipv6Addr>().unwrap().octets(),
        ));
        assert_eq!(parse_address(&address, 7), Some("fd00::1".parse().unwrap()));
        assert_eq!(parse_address(&address, 8), None);
        address.extend(attribute(IFA_FLAGS, &IFA_F_TENTATIVE.to_ne_bytes()));
        assert_eq!(parse_address(&address, 7), None);
    }

    #[test]
    fn answers_are_matched_to_their_question() {
        let run = |datagram: &[u8], dump: bool| {
            let mut seen = Vec::new();
            let mut interrupted = false;
            let result = scan(datagram, 5, dump, &mut interrupted, &mut |kind, _| {
                seen.push(kind)
            });
            (result, seen)
        };
        // A late answer to an earlier question is skipped.
        let mut datagram = message(RTM_NEWROUTE, 0, 4, &[0; 12]);
        datagram.extend(message(RTM_NEWNEIGH, 0, 5, &[0; 12]));
        let (result, seen) = run(&datagram, false);
        assert!(matches!(result, Some(Ok(()))));
        assert_eq!(seen, [RTM_NEWNEIGH]);
        // A refusal carries the errno.
        let refusal = message(NLMSG_ERROR, 0, 5, &(-libc::ENOENT).to_ne_bytes());
        let (result, _) = run(&refusal, false);
        assert!(matches!(
            result,
            Some(Err(Failure::Refused {
                errno: libc::ENOENT
            }))
        ));
        // A dump goes on until DONE, and one cut short by a change asks to be repeated.
        let (result, _) = run(&message(RTM_NEWADDR, 2, 5, &[0; 8]), true);
        assert!(result.is_none());
        let mut datagram = message(RTM_NEWADDR, 2 | NLM_F_DUMP_INTR, 5, &[0; 8]);
        datagram.extend(message(NLMSG_DONE, 2, 5, &0i32.to_ne_bytes()));
        assert!(matches!(
            run(&datagram, true).0,
            Some(Err(Failure::Interrupted))
        ));
    }

    #[test]
    fn neighbour_events_of_other_interfaces_do_not_matter() {
        let mut ndmsg = vec![AF_INET, 0, 0, 0];
        ndmsg.extend_from_slice(&9u32.to_ne_bytes());
        ndmsg.extend_from_slice(&[0; 4]);
        let other = message(RTM_NEWNEIGH, 0, 0, &ndmsg);
        assert!(!matters(&other, 7));
        assert!(matters(&other, 9));
        let mut both = other.clone();
        both.extend(message(RTM_NEWROUTE, 0, 0, &[0; 12]));
        assert!(matters(&both, 7));
        assert!(matters(&[1, 2, 3], 7));
    }

    #[test]
    fn nothing_the_kernel_sends_can_panic() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..50_000u32 {
            let len = (next() % 120) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let _ = parse_route(&bytes);
            let _ = parse_neighbour(&bytes);
            let _ = parse_link(&bytes);
            let _ = parse_address(&bytes, 7);
            let _ = matters(&bytes, 7);
            let kind = [NLMSG_ERROR, NLMSG_DONE, RTM_NEWROUTE, RTM_NEWNEIGH][(round % 4) as usize];
            let framed = message(kind, next() as u16, 5, &bytes);
            let mut interrupted = false;
            for dump in [false, true] {
                let _ = scan(&bytes, 5, dump, &mut interrupted, &mut |_, p| {
                    let _ = (parse_route(p), parse_neighbour(p), parse_link(p));
                });
                let _ = scan(&framed, 5, dump, &mut interrupted, &mut |_, p| {
                    let _ = (parse_route(p), parse_neighbour(p), parse_link(p));
                });
            }
            let _ = matters(&framed, 7);
        }
    }
}
