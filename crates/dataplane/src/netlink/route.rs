//! rtnetlink over [`Netlink`]: configuring an interface (MTU, state, addresses, routes),
//! asking for routes, neighbours, links and addresses, the XDP program of a link, and which
//! events matter to a next hop. The parsers take one reply's payload and answer `None` for
//! anything they cannot read.
//!
//! Routes tunneld adds are `proto static`, and only those are removed; a route to the same
//! prefix through another link is reported rather than silently shadowing the tunnel.

use super::wire::{
    family_of, find_attribute, ip_value, malformed, octets, u16_at, u32_at, u32_value, Attributes,
    Failure, Request,
};
use super::Netlink;
use ipnet::IpNet;
use netlink_packet_core::{NetlinkBuffer, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
use std::io;
use std::net::{IpAddr, SocketAddr};

// rtnetlink ABI numbers (linux/rtnetlink.h, neighbour.h, if_link.h, if_addr.h, if_arp.h),
// spelled out here so the parsing below reads as the kernel's layout.
const NLMSG_NOOP: u16 = 1;
const NLMSG_DONE: u16 = 3;
const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const RTM_SETLINK: u16 = 19;
const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTM_GETADDR: u16 = 22;
const RTM_NEWROUTE: u16 = 24;
const RTM_DELROUTE: u16 = 25;
const RTM_GETROUTE: u16 = 26;
const RTM_NEWNEIGH: u16 = 28;
const RTM_DELNEIGH: u16 = 29;
const RTM_GETNEIGH: u16 = 30;
/// The event groups a next-hop monitor subscribes to ([`Netlink::subscribe`]): links,
/// neighbours, IPv4/IPv6 addresses, routes and rules.
pub const NEXT_HOP_GROUPS: [u32; 8] = [1, 3, 5, 9, 7, 11, 8, 19];
/// Next-hop objects (`ip nexthop`, 5.3 and later): subscribed where the kernel has them.
pub const NEXT_HOP_OBJECT_GROUP: u32 = 32;
/// `struct rtmsg`, `struct ndmsg`, `struct ifinfomsg`, `struct ifaddrmsg`.
const RTMSG_LEN: usize = 12;
const NDMSG_LEN: usize = 12;
const IFINFOMSG_LEN: usize = 16;
const IFADDRMSG_LEN: usize = 8;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PREFSRC: u16 = 7;
const RTA_TABLE: u16 = 15;
const RTA_MARK: u16 = 16;
const RTA_VIA: u16 = 18;
const RTN_UNSPEC: u8 = 0;
const RTN_UNICAST: u8 = 1;
const RT_TABLE_MAIN: u8 = 254;
const RT_SCOPE_LINK: u8 = 253;
const RT_SCOPE_NOWHERE: u8 = 255;
/// Marks the routes tunneld adds (`proto static` in `ip route`), so that removing one never
/// takes the kernel's prefix route of an interface address or an administrator's own route.
const RTPROT_STATIC: u8 = 4;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
const NUD_REACHABLE: u16 = 0x02;
/// A neighbour entry past its reachable time: usable, but to be confirmed.
pub const NUD_STALE: u16 = 0x04;
const NUD_DELAY: u16 = 0x08;
const NUD_PROBE: u16 = 0x10;
const NUD_NOARP: u16 = 0x40;
const NUD_PERMANENT: u16 = 0x80;
/// The states in which the kernel itself sends to the entry's address.
const NUD_USABLE: u16 =
    NUD_REACHABLE | NUD_STALE | NUD_DELAY | NUD_PROBE | NUD_NOARP | NUD_PERMANENT;
const IFLA_ADDRESS: u16 = 1;
const IFLA_IFNAME: u16 = 3;
const IFLA_MTU: u16 = 4;
const IFLA_XDP: u16 = 43;
const IFLA_XDP_FD: u16 = 1;
const IFLA_XDP_ATTACHED: u16 = 2;
const IFLA_XDP_FLAGS: u16 = 3;
const IFLA_XDP_PROG_ID: u16 = 4;
const IFLA_XDP_DRV_PROG_ID: u16 = 5;
const IFLA_XDP_SKB_PROG_ID: u16 = 6;
const IFLA_XDP_HW_PROG_ID: u16 = 7;
const IFLA_XDP_EXPECTED_FD: u16 = 8;
const XDP_ATTACHED_DRV: u8 = 1;
const XDP_ATTACHED_SKB: u8 = 2;
const XDP_ATTACHED_HW: u8 = 3;
const XDP_ATTACHED_MULTI: u8 = 4;
const ARPHRD_ETHER: u16 = 1;
const IFF_UP: u32 = 0x1;
const IFF_NOARP: u32 = 0x80;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFA_CACHEINFO: u16 = 6;
const IFA_FLAGS: u16 = 8;
const IFA_F_NODAD: u8 = 0x02;
const IFA_F_DADFAILED: u32 = 0x08;
const IFA_F_TENTATIVE: u32 = 0x40;
/// Route requests per datagram in [`Netlink::add_routes`]: each is answered by an ACK of its
/// own (about a kilobyte of the receive queue), and ACKs that do not fit are dropped.
const ROUTES_PER_DATAGRAM: usize = 64;
const AF_INET: u8 = libc::AF_INET as u8;
const AF_INET6: u8 = libc::AF_INET6 as u8;
/// Interface names are at most IFNAMSIZ - 1 bytes.
const MAX_NAME_LEN: usize = 15;

/// What the kernel's route lookup (or one route of a dump) said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Route {
    pub family: u8,
    /// `RTN_*`: unicast, local, unreachable, ...
    pub kind: u8,
    pub dst_len: u8,
    pub dst: Option<IpAddr>,
    pub table: u32,
    pub oif: Option<u32>,
    pub source: Option<IpAddr>,
    pub gateway: Option<IpAddr>,
}

impl Route {
    /// A plain unicast route (not local, broadcast, blackhole, unreachable, ...).
    pub fn is_unicast(&self) -> bool {
        self.kind == RTN_UNICAST
    }
}

/// A neighbour entry's state (`NUD_*`) and link-layer address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Neighbour {
    pub state: u16,
    pub mac: Option<[u8; 6]>,
}

impl Neighbour {
    /// Whether the kernel itself would send to this entry's MAC.
    pub fn usable(&self) -> bool {
        self.state & NUD_USABLE != 0
    }
}

/// What we know of a link itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// An Ethernet interface that resolves neighbours: its MAC.
    Ethernet([u8; 6]),
    /// No MAC or no ARP/NDP (tun, wireguard, NOARP): nothing can be sent past the kernel.
    NotEthernet,
}

/// The XDP programs attached to a link, by where they run (their ids; none is `None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct XdpPrograms {
    pub driver: Option<u32>,
    pub generic: Option<u32>,
    pub offload: Option<u32>,
}

/// A link's `struct ifinfomsg`: family, type, index, flags, change mask.
fn ifinfomsg(index: u32, flags: u32, change: u32) -> [u8; IFINFOMSG_LEN] {
    let mut header = [0u8; IFINFOMSG_LEN];
    header[4..8].copy_from_slice(&index.to_ne_bytes());
    header[8..12].copy_from_slice(&flags.to_ne_bytes());
    header[12..16].copy_from_slice(&change.to_ne_bytes());
    header
}

/// A `struct rtmsg` for the device route to `dst` (already truncated) in the main table,
/// `proto static`.
fn route_request(kind: u16, flags: u16, index: u32, dst: IpNet, delete: bool) -> Request {
    let (scope, route_type) = if delete {
        // As `ip route del` does: any scope and type; table, protocol, link and dst must match.
        (RT_SCOPE_NOWHERE, RTN_UNSPEC)
    } else {
        // No gateway: the destination is directly on the link.
        (RT_SCOPE_LINK, RTN_UNICAST)
    };
    let header = [
        family_of(dst.addr()),
        dst.prefix_len(),
        0,
        0,
        RT_TABLE_MAIN,
        RTPROT_STATIC,
        scope,
        route_type,
        0,
        0,
        0,
        0,
    ];
    let mut request = Request::change(kind, flags, &header);
    let (bytes, len) = octets(&dst.addr());
    request.attribute(RTA_DST, &bytes[..len]);
    request.attribute(RTA_OIF, &index.to_ne_bytes());
    request
}

/// Treats the given errnos as success, so adds and removes can be repeated.
fn ignore(result: Result<(), Failure>, errnos: &[i32]) -> Result<(), Failure> {
    match result {
        Err(f) if f.errno().is_some_and(|n| errnos.contains(&n)) => Ok(()),
        other => other,
    }
}

/// Interface configuration: tunneld's links, MTU, addresses and routes. Errors are one line,
/// `netlink: {operation}: {errno text}[: {kernel's reason}]`.
impl Netlink {
    /// The index of the link called `name`, asked of the socket's namespace (not the calling
    /// thread's, which may have changed since the socket was opened).
    pub fn link_index(&mut self, name: &str) -> io::Result<u32> {
        let what = format!("netlink: find link {name:?}");
        if name.is_empty()
            || name.len() > MAX_NAME_LEN
            || name.contains(|c: char| c == '/' || c == '\0' || c.is_whitespace())
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{what}: not a valid interface name"),
            ));
        }
        let mut request = Request::get(RTM_GETLINK, &ifinfomsg(0, 0, 0));
        let mut value = [0u8; MAX_NAME_LEN + 1];
        value[..name.len()].copy_from_slice(name.as_bytes());
        request.attribute(IFLA_IFNAME, &value[..=name.len()]);
        let mut index = None;
        self.exchange(&mut request, |kind, payload| {
            if kind == RTM_NEWLINK {
                index = u32_at(payload, 4);
            }
        })
        .map_err(|f| f.named(&what))?;
        match index {
            Some(index) if index != 0 => Ok(index),
            _ => Err(malformed("no link in the answer").named(&what)),
        }
    }

    /// Sets the link's MTU.
    pub fn set_mtu(&mut self, index: u32, mtu: u32) -> io::Result<()> {
        let mut request = Request::change(RTM_SETLINK, 0, &ifinfomsg(index, 0, 0));
        request.attribute(IFLA_MTU, &mtu.to_ne_bytes());
        self.exchange(&mut request, |_, _| {})
            .map_err(|f| f.named(&format!("netlink: set MTU {mtu} on link {index}")))
    }

    /// Sets the link administratively up.
    pub fn set_up(&mut self, index: u32) -> io::Result<()> {
        let mut request = Request::change(RTM_SETLINK, 0, &ifinfomsg(index, IFF_UP, IFF_UP));
        self.exchange(&mut request, |_, _| {})
            .map_err(|f| f.named(&format!("netlink: set link {index} up")))
    }

    /// Adds addr/prefix (host bits kept, e.g. 10.77.0.1/24) to the link; an address that is
    /// already there is not an error. IPv6 with IFA_F_NODAD so it is usable at once.
    pub fn add_address(&mut self, index: u32, addr: IpNet) -> io::Result<()> {
        let mut request = address_request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, index, addr);
        let result = self.exchange(&mut request, |_, _| {});
        ignore(result, &[libc::EEXIST])
            .map_err(|f| f.named(&format!("netlink: add address {addr} to link {index}")))
    }

    /// Adds addr/prefix to the link, or renews it, with a lifetime of `lifetime_secs`
    /// (at least 1): the kernel removes the address by itself when it has not been renewed
    /// for that long, whatever becomes of the process that added it. IPv6 with IFA_F_NODAD.
    pub fn hold_address(&mut self, index: u32, addr: IpNet, lifetime_secs: u32) -> io::Result<()> {
        let what = || format!("netlink: hold address {addr} on link {index} for {lifetime_secs} s");
        if lifetime_secs == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: a lifetime of 0 is none", what()),
            ));
        }
        let mut request = address_request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_REPLACE, index, addr);
        // struct ifa_cacheinfo: preferred and valid lifetimes (seconds), then two time
        // stamps the kernel fills in. Preferred as long as valid: never merely deprecated.
        let mut cacheinfo = [0u8; 16];
        cacheinfo[0..4].copy_from_slice(&lifetime_secs.to_ne_bytes());
        cacheinfo[4..8].copy_from_slice(&lifetime_secs.to_ne_bytes());
        request.attribute(IFA_CACHEINFO, &cacheinfo);
        self.exchange(&mut request, |_, _| {})
            .map_err(|f| f.named(&what()))
    }

    /// Removes addr/prefix from the link (with the prefix route the kernel made for it); an
    /// address that is not there is not an error.
    pub fn del_address(&mut self, index: u32, addr: IpNet) -> io::Result<()> {
        let mut request = address_request(RTM_DELADDR, 0, index, addr);
        let result = self.exchange(&mut request, |_, _| {});
        // EADDRNOTAVAIL: no such address; ENODEV: no such link.
        ignore(result, &[libc::EADDRNOTAVAIL, libc::ENODEV])
            .map_err(|f| f.named(&format!("netlink: remove address {addr} from link {index}")))
    }

    /// Adds a route to dst (truncated to its network) via the link; an existing identical
    /// route is not an error.
    pub fn add_route(&mut self, index: u32, dst: IpNet) -> io::Result<()> {
        let dst = dst.trunc();
        let result = self.exchange(&mut add_route_request(index, dst), |_, _| {});
        self.route_added(index, dst, result)
    }

    /// [`Netlink::add_route`] for every prefix of `dsts`, many requests to a datagram (a
    /// hub's thousands of routes in a few system calls), and one dump of the table for
    /// those already there. Every route is tried; the first error is returned.
    pub fn add_routes(&mut self, index: u32, dsts: &[IpNet]) -> io::Result<()> {
        let mut first_error = None;
        let mut existing = Vec::new();
        for chunk in dsts.chunks(ROUTES_PER_DATAGRAM) {
            let mut requests: Vec<Request> = chunk
                .iter()
                .map(|dst| add_route_request(index, dst.trunc()))
                .collect();
            let outcomes = match self.exchange_batch(&mut requests) {
                Ok(outcomes) => outcomes,
                Err(f) => {
                    let what = format!("netlink: add {} routes via link {index}", chunk.len());
                    return Err(first_error.unwrap_or_else(|| f.named(&what)));
                }
            };
            for (dst, result) in chunk.iter().map(IpNet::trunc).zip(outcomes) {
                match result {
                    Ok(()) => {}
                    // Some route to dst is there: through our link, below.
                    Err(f) if f.errno() == Some(libc::EEXIST) => existing.push(dst),
                    Err(f) => {
                        first_error.get_or_insert_with(|| {
                            f.named(&format!("netlink: add route {dst} via link {index}"))
                        });
                    }
                }
            }
        }
        for family in [AF_INET, AF_INET6] {
            let Some(&first) = existing.iter().find(|d| family_of(d.addr()) == family) else {
                continue;
            };
            let ours = match self.routes_via(index, family) {
                Ok(ours) => ours,
                Err(f) => {
                    let what = format!("netlink: add route {first} via link {index}");
                    first_error.get_or_insert_with(|| f.named(&what));
                    continue;
                }
            };
            for dst in existing.iter().filter(|d| family_of(d.addr()) == family) {
                if !ours.contains(dst) {
                    first_error.get_or_insert_with(|| in_the_way(index, *dst));
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The prefixes of the main table's routes of `family` through link `index`.
    fn routes_via(&mut self, index: u32, family: u8) -> Result<Vec<IpNet>, Failure> {
        let mut header = [0u8; RTMSG_LEN];
        header[0] = family;
        let mut found = Vec::new();
        self.dump(
            || Request::dump(RTM_GETROUTE, &header),
            |reply| match reply {
                None => found.clear(),
                Some((RTM_NEWROUTE, payload)) => found.extend(route_via(payload, index)),
                Some(_) => {}
            },
        )?;
        Ok(found)
    }

    /// The outcome of adding the route to `dst` (truncated): an existing route through
    /// the link is fine, one through another link is in the way.
    fn route_added(
        &mut self,
        index: u32,
        dst: IpNet,
        result: Result<(), Failure>,
    ) -> io::Result<()> {
        let what = format!("netlink: add route {dst} via link {index}");
        match result {
            Ok(()) => Ok(()),
            // EEXIST says only that some route to dst is there (in IPv6: with the same
            // metric), maybe through another link; it is fine only if it goes through ours.
            Err(f) if f.errno() == Some(libc::EEXIST) => match self.route_exists(index, dst) {
                Ok(true) => Ok(()),
                Ok(false) => Err(in_the_way(index, dst)),
                Err(f) => Err(f.named(&what)),
            },
            Err(f) => Err(f.named(&what)),
        }
    }

    /// Removes that route; a route that is not there is not an error. Only a route that
    /// [`Netlink::add_route`] could have added (its protocol) is removed.
    pub fn del_route(&mut self, index: u32, dst: IpNet) -> io::Result<()> {
        let dst = dst.trunc();
        let mut request = route_request(RTM_DELROUTE, 0, index, dst, true);
        let result = self.exchange(&mut request, |_, _| {});
        // ESRCH: no such route; ENODEV: no such link, so no route through it either.
        ignore(result, &[libc::ESRCH, libc::ENODEV])
            .map_err(|f| f.named(&format!("netlink: delete route {dst} via link {index}")))
    }

    /// Whether the main table has a route to exactly `dst` through link `index`.
    fn route_exists(&mut self, index: u32, dst: IpNet) -> Result<bool, Failure> {
        Ok(self
            .routes_via(index, family_of(dst.addr()))?
            .contains(&dst))
    }
}

/// The refusal of a route to `dst` that another link's route would shadow.
fn in_the_way(index: u32, dst: IpNet) -> io::Error {
    io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!(
            "netlink: add route {dst} via link {index}: \
             a route to {dst} through another link is in the way"
        ),
    )
}

fn add_route_request(index: u32, dst: IpNet) -> Request {
    route_request(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, index, dst, false)
}

/// An add or remove request for addr/prefix on link `index`.
fn address_request(kind: u16, flags: u16, index: u32, addr: IpNet) -> Request {
    let ip = addr.addr();
    // IPv6: without NODAD the address stays "tentative" (unusable) for a second or more.
    let header_flags = if ip.is_ipv6() && kind == RTM_NEWADDR {
        IFA_F_NODAD
    } else {
        0
    };
    let mut header = [0u8; IFADDRMSG_LEN];
    header[0] = family_of(ip);
    header[1] = addr.prefix_len();
    header[2] = header_flags;
    header[4..8].copy_from_slice(&index.to_ne_bytes());
    let mut request = Request::change(kind, flags, &header);
    let (bytes, len) = octets(&ip);
    if ip.is_ipv4() {
        // IFA_LOCAL is the interface's own address; IFA_ADDRESS the same on a link that is
        // not point-to-point, as `ip addr add` sends it.
        request.attribute(IFA_LOCAL, &bytes[..len]);
    }
    request.attribute(IFA_ADDRESS, &bytes[..len]);
    request
}

/// Questions for the AF_XDP path.
impl Netlink {
    /// Link `ifindex`'s MAC, if it is Ethernet and resolves neighbours.
    pub fn link(&mut self, ifindex: u32) -> Result<Link, Failure> {
        let mut request = Request::get(RTM_GETLINK, &ifinfomsg(ifindex, 0, 0));
        let mut link = None;
        self.exchange(&mut request, |kind, payload| {
            if kind == RTM_NEWLINK {
                link = parse_link(payload);
            }
        })?;
        link.ok_or_else(|| malformed("no link in the answer"))
    }

    /// The kernel's route to `dst`, as a datagram sent now from a socket with `SO_MARK`
    /// `mark` (0: none) would take it. No allocation.
    pub fn route(&mut self, dst: SocketAddr, mark: u32) -> Result<Route, Failure> {
        let ip = dst.ip();
        let (bytes, len) = octets(&ip);
        let mut header = [0u8; RTMSG_LEN];
        header[0] = family_of(ip);
        header[1] = (len * 8) as u8;
        let mut request = Request::get(RTM_GETROUTE, &header);
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
        self.exchange(&mut request, |kind, payload| {
            if kind == RTM_NEWROUTE {
                route = parse_route(payload);
            }
        })?;
        route.ok_or_else(|| malformed("no route in the answer"))
    }

    /// The kernel's neighbour entry for `addr` on `ifindex`, if there is one. No allocation.
    pub fn neighbour(&mut self, ifindex: u32, addr: IpAddr) -> Result<Option<Neighbour>, Failure> {
        let (bytes, len) = octets(&addr);
        let mut header = [0u8; NDMSG_LEN];
        header[0] = family_of(addr);
        header[4..8].copy_from_slice(&ifindex.to_ne_bytes());
        let mut request = Request::get(RTM_GETNEIGH, &header);
        request.attribute(NDA_DST, &bytes[..len]);
        let mut found = None;
        self.exchange(&mut request, |kind, payload| {
            if kind == RTM_NEWNEIGH {
                found = parse_neighbour(payload);
            }
        })?;
        Ok(found)
    }

    /// The usable addresses of `ifindex` ([`parse_address`]), each once.
    pub fn addresses(&mut self, ifindex: u32) -> Result<Vec<IpAddr>, Failure> {
        let mut addresses = Vec::new();
        self.dump(
            || Request::dump(RTM_GETADDR, &[0; IFADDRMSG_LEN]),
            |reply| match reply {
                None => addresses.clear(),
                Some((kind, payload)) => {
                    if kind == RTM_NEWADDR {
                        if let Some(addr) = parse_address(payload, ifindex) {
                            if !addresses.contains(&addr) {
                                addresses.push(addr);
                            }
                        }
                    }
                }
            },
        )?;
        Ok(addresses)
    }

    /// The XDP programs attached to `ifindex` (RTM_GETLINK's IFLA_XDP).
    pub fn xdp_programs(&mut self, ifindex: u32) -> Result<XdpPrograms, Failure> {
        let mut request = Request::get(RTM_GETLINK, &ifinfomsg(ifindex, 0, 0));
        let mut programs = None;
        self.exchange(&mut request, |kind, payload| {
            if kind == RTM_NEWLINK {
                programs = Some(parse_xdp_programs(payload));
            }
        })?;
        programs.ok_or_else(|| malformed("no link in the answer"))
    }

    /// Sets (`fd` of a program) or clears (`fd` -1) the XDP program of `ifindex` the
    /// netlink way (IFLA_XDP), in the mode `flags` (`XDP_FLAGS_*`) says; with
    /// `XDP_FLAGS_REPLACE`, only if `expected_fd`'s program is the one attached.
    pub fn set_xdp(
        &mut self,
        ifindex: u32,
        fd: i32,
        flags: u32,
        expected_fd: Option<i32>,
    ) -> Result<(), Failure> {
        let mut request = Request::change(RTM_SETLINK, 0, &ifinfomsg(ifindex, 0, 0));
        let nest = request.begin_nested(IFLA_XDP);
        request.attribute(IFLA_XDP_FD, &fd.to_ne_bytes());
        request.attribute(IFLA_XDP_FLAGS, &flags.to_ne_bytes());
        if let Some(expected) = expected_fd {
            request.attribute(IFLA_XDP_EXPECTED_FD, &expected.to_ne_bytes());
        }
        request.end_nested(nest);
        self.exchange(&mut request, |_, _| {})
    }
}

/// One RTM_NEWROUTE payload: `struct rtmsg`, then attributes (the table in RTA_TABLE when
/// it does not fit the header's byte).
pub fn parse_route(payload: &[u8]) -> Option<Route> {
    let family = *payload.first()?;
    let mut route = Route {
        family,
        dst_len: *payload.get(1)?,
        table: u32::from(*payload.get(4)?),
        kind: *payload.get(7)?,
        ..Route::default()
    };
    for attribute in Attributes::after(payload, RTMSG_LEN) {
        let (kind, value) = attribute.ok()?;
        match kind {
            RTA_DST => route.dst = ip_value(family, value),
            RTA_OIF => route.oif = Some(u32_value(value)?),
            RTA_TABLE => route.table = u32_value(value).unwrap_or(route.table),
            RTA_PREFSRC => route.source = ip_value(family, value),
            RTA_GATEWAY => route.gateway = ip_value(family, value),
            // `struct rtvia`: a gateway of another family (IPv4 routes via IPv6 next hops).
            RTA_VIA => {
                let via_family = u8::try_from(u16_at(value, 0)?).ok()?;
                route.gateway = ip_value(via_family, value.get(2..)?);
            }
            _ => {}
        }
    }
    Some(route)
}

/// The prefix of one route of a dump (an RTM_NEWROUTE payload) if it is a main-table route
/// through link `index`.
pub fn route_via(payload: &[u8], index: u32) -> Option<IpNet> {
    let route = parse_route(payload)?;
    if route.oif != Some(index) || route.table != u32::from(RT_TABLE_MAIN) {
        return None;
    }
    // A default route has no RTA_DST.
    let dst = match (route.dst, route.family) {
        (Some(dst), _) => dst,
        (None, _) if route.dst_len != 0 => return None,
        (None, AF_INET) => IpAddr::from([0u8; 4]),
        (None, AF_INET6) => IpAddr::from([0u16; 8]),
        (None, _) => return None,
    };
    if family_of(dst) != route.family {
        return None;
    }
    IpNet::new(dst, route.dst_len).ok()
}

/// Whether one route of a dump (an RTM_NEWROUTE payload) is the main-table route to
/// exactly `dst` (truncated) through link `index`.
pub fn route_matches(payload: &[u8], dst: IpNet, index: u32) -> bool {
    route_via(payload, index) == Some(dst)
}

/// One RTM_NEWNEIGH payload: `struct ndmsg`, then attributes.
pub fn parse_neighbour(payload: &[u8]) -> Option<Neighbour> {
    let state = u16_at(payload, 8)?;
    let mut mac = None;
    for attribute in Attributes::after(payload, NDMSG_LEN) {
        let (kind, value) = attribute.ok()?;
        if kind == NDA_LLADDR {
            mac = <[u8; 6]>::try_from(value).ok();
        }
    }
    Some(Neighbour { state, mac })
}

/// The interface of a neighbour event (`struct ndmsg`'s index).
pub fn neighbour_ifindex(payload: &[u8]) -> Option<u32> {
    u32_at(payload, 4)
}

/// One RTM_NEWLINK payload: `struct ifinfomsg`, then attributes.
pub fn parse_link(payload: &[u8]) -> Option<Link> {
    let kind = u16_at(payload, 2)?;
    let flags = u32_at(payload, 8)?;
    let mut mac = None;
    for attribute in Attributes::after(payload, IFINFOMSG_LEN) {
        let (attribute, value) = attribute.ok()?;
        if attribute == IFLA_ADDRESS {
            mac = <[u8; 6]>::try_from(value).ok();
        }
    }
    Some(match mac {
        Some(mac) if kind == ARPHRD_ETHER && flags & IFF_NOARP == 0 => Link::Ethernet(mac),
        _ => Link::NotEthernet,
    })
}

/// The usable address of one RTM_NEWADDR payload, if it is on `ifindex`: an IPv4 local
/// address or an IPv6 address, not still tentative (duplicate address detection not done)
/// nor failed: one the kernel accepts datagrams for.
pub fn parse_address(payload: &[u8], ifindex: u32) -> Option<IpAddr> {
    let family = *payload.first()?;
    let mut flags = u32::from(*payload.get(2)?);
    if u32_at(payload, 4)? != ifindex {
        return None;
    }
    let (mut local, mut address) = (None, None);
    for attribute in Attributes::after(payload, IFADDRMSG_LEN) {
        let (kind, value) = attribute.ok()?;
        match kind {
            IFA_LOCAL => local = ip_value(family, value),
            IFA_ADDRESS => address = ip_value(family, value),
            IFA_FLAGS => flags = u32_value(value)?,
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

/// The XDP programs of one RTM_NEWLINK payload (none when it has no IFLA_XDP).
pub fn parse_xdp_programs(payload: &[u8]) -> XdpPrograms {
    let mut programs = XdpPrograms::default();
    let Some(xdp) = find_attribute(payload.get(IFINFOMSG_LEN..).unwrap_or(&[]), IFLA_XDP) else {
        return programs;
    };
    let id = |kind| {
        find_attribute(xdp, kind)
            .and_then(|v| v.get(..4))
            .and_then(u32_value)
            .filter(|&id| id != 0)
    };
    match find_attribute(xdp, IFLA_XDP_ATTACHED).and_then(|v| v.first().copied()) {
        Some(XDP_ATTACHED_DRV) => programs.driver = id(IFLA_XDP_PROG_ID),
        Some(XDP_ATTACHED_SKB) => programs.generic = id(IFLA_XDP_PROG_ID),
        Some(XDP_ATTACHED_HW) => programs.offload = id(IFLA_XDP_PROG_ID),
        Some(XDP_ATTACHED_MULTI) => {
            programs.driver = id(IFLA_XDP_DRV_PROG_ID);
            programs.generic = id(IFLA_XDP_SKB_PROG_ID);
            programs.offload = id(IFLA_XDP_HW_PROG_ID);
        }
        _ => {}
    }
    programs
}

/// Whether a datagram of events can change a next hop on `ifindex`: everything but
/// neighbour events for other interfaces (and what cannot be read counts).
pub fn event_matters(datagram: &[u8], ifindex: u32) -> bool {
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
        rest = rest.get(super::wire::align4(len)..).unwrap_or(&[]);
    }
    any
}

#[cfg(test)]
mod tests {
    use super::super::wire::tests::{attribute, message};
    use super::*;
    use crate::netlink::Exchange;
    use netlink_packet_core::{NLM_F_ACK, NLM_F_DUMP};
    use std::net::Ipv6Addr;
    use tunneld_testnet::{require_netns, unique_name, NetNs};

    fn net(s: &str) -> IpNet {
        s.parse().expect("test network")
    }

    /// The innermost `{...}` objects of `ip -j` output: one per route, per address, per link.
    fn objects(json: &str) -> Vec<&str> {
        let mut found = Vec::new();
        let mut start = None;
        for (i, c) in json.char_indices() {
            match c {
                '{' => start = Some(i),
                '}' => {
                    if let Some(s) = start.take() {
                        found.push(&json[s..=i]);
                    }
                }
                _ => {}
            }
        }
        found
    }

    fn count(json: &str, fields: &[&str]) -> usize {
        objects(json)
            .iter()
            .filter(|o| fields.iter().all(|f| o.contains(f)))
            .count()
    }

    /// A veth pair inside `ns`, the peer up; returns (the link to configure, the peer).
    fn veth_in(ns: &NetNs) -> (String, String) {
        let (a, b) = (unique_name("nla"), unique_name("nlb"));
        ns.run(&["ip", "link", "add", &a, "type", "veth", "peer", "name", &b]);
        ns.run(&["ip", "link", "set", &b, "up"]);
        (a, b)
    }

    fn routes(ns: &NetNs, family: &str, link: &str) -> String {
        ns.run(&[
            "ip", "-j", family, "route", "show", "table", "main", "dev", link,
        ])
    }

    #[test]
    fn configures_mtu_state_addresses_and_routes() {
        if !require_netns("netlink::configures_mtu_state_addresses_and_routes") {
            return;
        }
        let ns = NetNs::new();
        let (link, _) = veth_in(&ns);
        let name = link.clone();
        let index = ns
            .in_ns(move || -> io::Result<u32> {
                let mut nl = Netlink::open()?;
                let index = nl.link_index(&name)?;
                nl.set_mtu(index, 1400)?;
                nl.set_up(index)?;
                // Twice: every add is idempotent.
                for _ in 0..2 {
                    nl.add_address(index, net("10.77.0.1/24"))?;
                    nl.add_address(index, net("fd77::1/64"))?;
                    // Host bits in a route are dropped.
                    nl.add_route(index, net("10.20.1.2/16"))?;
                    nl.add_route(index, net("fd20::1/48"))?;
                }
                Ok(index)
            })
            .expect("configure the link");

        let shown = ns.run(&["ip", "-j", "link", "show", "dev", &link]);
        let fields = [
            format!("\"ifindex\":{index},"),
            "\"mtu\":1400,".to_string(),
            "\"UP\"".to_string(),
        ];
        let fields: Vec<&str> = fields.iter().map(String::as_str).collect();
        assert_eq!(count(&shown, &fields), 1, "link: {shown}");

        let addrs = ns.run(&["ip", "-j", "addr", "show", "dev", &link]);
        assert_eq!(
            count(&addrs, &["\"local\":\"10.77.0.1\"", "\"prefixlen\":24,"]),
            1,
            "addresses: {addrs}"
        );
        assert_eq!(
            count(&addrs, &["\"local\":\"fd77::1\"", "\"prefixlen\":64,"]),
            1,
            "addresses: {addrs}"
        );
        assert_eq!(
            count(&addrs, &["\"local\":\"fd77::1\"", "tentative"]),
            0,
            "IPv6 address still tentative (no NODAD?): {addrs}"
        );

        let v4 = routes(&ns, "-4", &link);
        let v6 = routes(&ns, "-6", &link);
        assert_eq!(count(&v4, &["\"dst\":\"10.20.0.0/16\""]), 1, "routes: {v4}");
        assert_eq!(count(&v6, &["\"dst\":\"fd20::/48\""]), 1, "routes: {v6}");

        ns.in_ns(move || -> io::Result<()> {
            let mut nl = Netlink::open()?;
            // The kernel's own route for the address subnet counts as there already, and
            // removing "that route" later must not take the kernel's route with it.
            nl.add_route(index, net("10.77.0.0/24"))?;
            nl.del_route(index, net("10.77.0.0/24"))?;
            nl.add_route(index, net("fd77::/64"))?;
            nl.del_route(index, net("fd77::/64"))?;
            // Twice: removing a route that is not there is not an error.
            for _ in 0..2 {
                nl.del_route(index, net("10.20.0.0/16"))?;
                nl.del_route(index, net("fd20::/48"))?;
            }
            Ok(())
        })
        .expect("remove the routes");

        let v4 = routes(&ns, "-4", &link);
        let v6 = routes(&ns, "-6", &link);
        assert_eq!(count(&v4, &["\"dst\":\"10.20.0.0/16\""]), 0, "routes: {v4}");
        assert_eq!(count(&v6, &["\"dst\":\"fd20::/48\""]), 0, "routes: {v6}");
        let kernel = "\"protocol\":\"kernel\"";
        assert_eq!(
            count(&v4, &["\"dst\":\"10.77.0.0/24\"", kernel]),
            1,
            "routes: {v4}"
        );
        assert_eq!(
            count(&v6, &["\"dst\":\"fd77::/64\"", kernel]),
            1,
            "routes: {v6}"
        );
        assert_eq!(count(&v6, &["\"dst\":\"fd77::/64\""]), 1, "routes: {v6}");
    }

    #[test]
    fn a_route_through_another_link_is_in_the_way() {
        if !require_netns("netlink::a_route_through_another_link_is_in_the_way") {
            return;
        }
        let ns = NetNs::new();
        let (link, other) = veth_in(&ns);
        ns.run(&["ip", "link", "set", &link, "up"]);
        ns.run(&["ip", "route", "add", "10.30.0.0/16", "dev", &other]);
        ns.run(&["ip", "-6", "route", "add", "fd30::/48", "dev", &other]);
        let errors = ns.in_ns(move || {
            let mut nl = Netlink::open().expect("open");
            let index = nl.link_index(&link).expect("index");
            [net("10.30.0.0/16"), net("fd30::/48")].map(|dst| {
                let e = nl.add_route(index, dst).expect_err("route in the way");
                (e.kind(), e.to_string(), index)
            })
        });
        for ((kind, message, index), dst) in errors.iter().zip(["10.30.0.0/16", "fd30::/48"]) {
            assert_eq!(*kind, io::ErrorKind::AlreadyExists, "{message}");
            assert_eq!(
                message,
                &format!(
                    "netlink: add route {dst} via link {index}: \
                     a route to {dst} through another link is in the way"
                )
            );
        }
    }

    #[test]
    fn many_routes_go_in_batches_and_each_is_checked() {
        if !require_netns("netlink::many_routes_go_in_batches_and_each_is_checked") {
            return;
        }
        let ns = NetNs::new();
        let (link, other) = veth_in(&ns);
        ns.run(&["ip", "link", "set", &link, "up"]);
        ns.run(&["ip", "route", "add", "10.99.0.0/16", "dev", &other]);
        // More than one datagram's worth, both families, host bits to drop, and one already
        // added one at a time.
        let mut dsts: Vec<IpNet> = (0..300u32)
            .map(|i| net(&format!("10.{}.{}.1/24", 100 + i / 256, i % 256)))
            .collect();
        dsts.extend((0..70u32).map(|i| net(&format!("fd30:{i:x}::1/64"))));
        let name = link.clone();
        let (index, first, second, in_the_way) = ns.in_ns(move || {
            let mut nl = Netlink::open().expect("open");
            let index = nl.link_index(&name).expect("index");
            nl.add_route(index, dsts[5]).expect("one route");
            let first = nl.add_routes(index, &dsts).map_err(|e| e.to_string());
            // Again: every route is there through this link, so nothing is in the way.
            let second = nl.add_routes(index, &dsts).map_err(|e| e.to_string());
            let mut with_one_in_the_way = dsts[..100].to_vec();
            with_one_in_the_way.insert(70, net("10.99.0.0/16"));
            let in_the_way = nl
                .add_routes(index, &with_one_in_the_way)
                .expect_err("a route in the way");
            (
                index,
                first,
                second,
                (in_the_way.kind(), in_the_way.to_string()),
            )
        });
        assert_eq!(first, Ok(()));
        assert_eq!(second, Ok(()));
        assert_eq!(in_the_way.0, io::ErrorKind::AlreadyExists);
        assert_eq!(
            in_the_way.1,
            format!(
                "netlink: add route 10.99.0.0/16 via link {index}: \
                 a route to 10.99.0.0/16 through another link is in the way"
            )
        );
        let v4 = routes(&ns, "-4", &link);
        let v6 = routes(&ns, "-6", &link);
        assert_eq!(
            count(&v4, &["\"protocol\":\"static\""]),
            300,
            "routes: {v4}"
        );
        assert_eq!(
            count(&v4, &["\"dst\":\"10.101.43.0/24\""]),
            1,
            "routes: {v4}"
        );
        assert_eq!(count(&v6, &["\"dst\":\"fd30:45::/64\""]), 1, "routes: {v6}");
        assert_eq!(count(&v6, &["\"protocol\":\"static\""]), 70, "routes: {v6}");
    }

    #[test]
    fn a_wrong_link_gives_a_clear_error() {
        if !require_netns("netlink::a_wrong_link_gives_a_clear_error") {
            return;
        }
        let ns = NetNs::new();
        let messages = ns.in_ns(|| {
            let mut nl = Netlink::open().expect("open");
            let bad = 999_999;
            [
                nl.link_index("nosuch0").map(drop),
                nl.set_mtu(bad, 1400),
                nl.set_up(bad),
                nl.add_address(bad, net("10.77.0.1/24")),
                nl.add_route(bad, net("10.20.1.0/16")),
                nl.add_route(bad, net("fd20::/48")),
            ]
            .map(|r| r.expect_err("bad link").to_string())
        });
        let expected = [
            "netlink: find link \"nosuch0\": No such device (os error 19)",
            "netlink: set MTU 1400 on link 999999: No such device (os error 19)",
            "netlink: set link 999999 up: No such device (os error 19)",
            "netlink: add address 10.77.0.1/24 to link 999999: No such device (os error 19)",
            "netlink: add route 10.20.0.0/16 via link 999999: No such device (os error 19)",
            "netlink: add route fd20::/48 via link 999999: No such device (os error 19)",
        ];
        for (message, expected) in messages.iter().zip(expected) {
            // The kernel may add its reason in words after the errno.
            assert!(
                message.starts_with(expected),
                "{message:?} is not {expected:?}"
            );
            assert!(!message.contains('\n'), "{message:?}");
        }
    }

    #[test]
    fn the_kernel_reason_is_in_the_error() {
        if !require_netns("netlink::the_kernel_reason_is_in_the_error") {
            return;
        }
        let ns = NetNs::new();
        let (link, _) = veth_in(&ns);
        let message = ns.in_ns(move || {
            let mut nl = Netlink::open().expect("open");
            let index = nl.link_index(&link).expect("index");
            // The link is down: the kernel refuses a route through it.
            let e = nl
                .add_route(index, net("10.20.0.0/16"))
                .expect_err("link down");
            (index, e.to_string())
        });
        let (index, message) = message;
        assert!(
            message.starts_with(&format!(
                "netlink: add route 10.20.0.0/16 via link {index}: Network is down (os error 100)"
            )),
            "{message}"
        );
    }

    #[test]
    fn loopback_is_found_and_bad_names_are_refused() {
        // Read-only: runs without privileges, in the test's own namespace.
        let mut nl = Netlink::open().expect("open");
        assert_eq!(nl.link_index("lo").expect("lo"), 1);
        for name in ["", "a-name-longer-than-15", "a b", "a/b", "a\0b"] {
            let e = nl.link_index(name).expect_err(name);
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            assert_eq!(
                e.to_string(),
                format!("netlink: find link {name:?}: not a valid interface name")
            );
        }
        assert!(format!("{nl:?}").starts_with("Netlink"));
    }

    fn route_reply(family: u8, kind: u8, attributes: &[Vec<u8>]) -> Vec<u8> {
        let mut payload = vec![family, 32, 0, 0, 254, 2, 0, kind, 0, 0, 0, 0];
        for a in attributes {
            payload.extend_from_slice(a);
        }
        payload
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
                family: AF_INET,
                kind: RTN_UNICAST,
                dst_len: 32,
                dst: Some("198.51.100.9".parse().unwrap()),
                table: u32::from(RT_TABLE_MAIN),
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
    fn neighbour_events_of_other_interfaces_do_not_matter() {
        let mut ndmsg = vec![AF_INET, 0, 0, 0];
        ndmsg.extend_from_slice(&9u32.to_ne_bytes());
        ndmsg.extend_from_slice(&[0; 4]);
        let other = message(RTM_NEWNEIGH, 0, 0, &ndmsg);
        assert!(!event_matters(&other, 7));
        assert!(event_matters(&other, 9));
        let mut both = other.clone();
        both.extend(message(RTM_NEWROUTE, 0, 0, &[0; 12]));
        assert!(event_matters(&both, 7));
        assert!(event_matters(&[1, 2, 3], 7));
    }

    /// Every parser of kernel bytes on `bytes`, and the scanner on them as a get, a change
    /// and a dump (as the fuzz target does): never a panic, and errors are one line.
    fn every_parser(bytes: &[u8]) {
        let dst: IpNet = "10.20.0.0/16".parse().expect("net");
        let parse = |payload: &[u8]| {
            let _ = (
                parse_route(payload),
                parse_neighbour(payload),
                parse_link(payload),
            );
            let _ = (parse_address(payload, 7), parse_xdp_programs(payload));
            let _ = (neighbour_ifindex(payload), route_matches(payload, dst, 1));
            if let Some(via) = route_via(payload, 1) {
                assert!(route_matches(payload, via, 1));
            }
            let _ = super::super::generic::parse_family_id(payload);
            let _ = super::super::generic::parse_xsk_features(payload);
        };
        parse(bytes);
        let _ = event_matters(bytes, 7);
        for flags in [0, NLM_F_ACK, NLM_F_DUMP] {
            let mut exchange = Exchange::new(5, flags);
            if let Some(Err(failure)) = exchange.scan(bytes, &mut |_, payload| parse(payload)) {
                assert!(!failure.named("x").to_string().contains('\n'));
            }
        }
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
            let kind =
                [2, 3, RTM_NEWROUTE, RTM_NEWNEIGH, RTM_NEWLINK, RTM_NEWADDR][(round % 6) as usize];
            let framed = message(kind, next() as u16, 5, &bytes);
            every_parser(&bytes);
            every_parser(&framed);
        }
    }

    #[test]
    fn dump_entries_match_only_the_same_route_through_the_same_link() {
        // Encoded by netlink-packet-route, as a second opinion on the layout.
        use netlink_packet_route::route::{
            RouteAddress, RouteAttribute, RouteHeader, RouteMessage,
        };
        use netlink_packet_route::AddressFamily;
        let mut msg = RouteMessage::default();
        msg.header.address_family = AddressFamily::Inet;
        msg.header.destination_prefix_length = 16;
        msg.header.table = RouteHeader::RT_TABLE_MAIN;
        msg.attributes
            .push(RouteAttribute::Destination(RouteAddress::Inet(
                "10.20.0.0".parse().expect("addr"),
            )));
        msg.attributes.push(RouteAttribute::Oif(7));
        let encode = |msg: &RouteMessage| {
            use netlink_packet_core::Emitable;
            let mut out = vec![0; msg.buffer_len()];
            msg.emit(&mut out);
            out
        };
        let payload = encode(&msg);
        let want = net("10.20.0.0/16");
        assert!(route_matches(&payload, want, 7));
        assert!(!route_matches(&payload, want, 8));
        assert!(!route_matches(&payload, net("10.20.0.0/24"), 7));
        // Another family: the same first bytes as IPv6, and the same prefix length.
        assert!(!route_matches(&payload, net("a14::/16"), 7));
        assert!(!route_matches(&payload, net("10.21.0.0/16"), 7));
        msg.attributes.push(RouteAttribute::Table(100));
        assert!(!route_matches(&encode(&msg), want, 7));
    }
}
