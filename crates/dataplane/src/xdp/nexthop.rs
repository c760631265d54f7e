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
//! Every question and event goes through [`crate::netlink`] (the one netlink layer, where
//! replies are read and why nothing the kernel sends can panic); a query allocates nothing.
//! Sockets belong to the network namespace of the thread that opens them: call
//! [`NextHops::start`] and [`Resolver::new`] from threads in the interface's namespace.

use super::frame::Hop;
use crate::netlink::route::{event_matters, NEXT_HOP_GROUPS, NEXT_HOP_OBJECT_GROUP, NUD_STALE};
use crate::netlink::{Failure, Link, Neighbour, Netlink};
use crate::waker::Waker;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
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
        // Next-hop objects (`ip nexthop`) are newer (5.3); without them nothing uses them.
        let socket =
            Netlink::subscribe(&NEXT_HOP_GROUPS, &[NEXT_HOP_OBJECT_GROUP]).map_err(context)?;
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
                fd: rtnl.as_raw_fd(),
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
                Ok(datagram) => changed |= event_matters(datagram, ifindex),
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

/// The addresses of interface `ifindex` (asked in the calling thread's network namespace):
/// IPv4 local addresses and IPv6 addresses, without those still tentative (duplicate
/// address detection not done) or whose detection failed: those the kernel accepts
/// datagrams for. Ask again when [`NextHops::generation`] moves.
pub fn interface_addresses(ifindex: u32) -> io::Result<Vec<IpAddr>> {
    let context = |e: Failure| e.named(&format!("cannot list the addresses of link {ifindex}"));
    let mut rtnl = Netlink::open_query().map_err(|e| context(Failure::Io(e)))?;
    rtnl.addresses(ifindex).map_err(context)
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
        let rtnl = Netlink::open_query().map_err(|e| {
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
        let (true, Some(oif), Some(source)) = (route.is_unicast(), route.oif, route.source) else {
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
            Some(
                found @ Neighbour {
                    state,
                    mac: Some(dst_mac),
                },
            ) if found.usable() => Entry {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_and_moved_between_threads() {
        fn shared<T: Send + Sync>() {}
        fn moved<T: Send>() {}
        shared::<NextHops>();
        moved::<Resolver>();
    }
}
