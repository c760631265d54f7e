//! Interface configuration over rtnetlink: MTU, link state, addresses and routes.
//!
//! Synchronous and small: one request, then read until the kernel's ACK. Requests are built
//! with netlink-packet-route; replies are read with the low-level buffers only (header, then
//! attributes by number), so an attribute the crate cannot decode never fails a request and
//! nothing the kernel sends back can panic. The socket belongs to the network namespace of
//! the thread that opened it, which is what lets tests configure links inside namespaces.

use ipnet::IpNet;
use netlink_packet_core::{
    NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload, NlasIterator, NLM_F_ACK,
    NLM_F_ACK_TLVS, NLM_F_CAPPED, NLM_F_CREATE, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_EXCL,
    NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressHeaderFlags, AddressMessage};
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkHeader, LinkMessage};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use std::io;
use std::net::IpAddr;
use std::os::fd::AsRawFd;

const NLMSG_NOOP: u16 = libc::NLMSG_NOOP as u16;
const NLMSG_ERROR: u16 = libc::NLMSG_ERROR as u16;
const NLMSG_DONE: u16 = libc::NLMSG_DONE as u16;
const NLMSG_OVERRUN: u16 = libc::NLMSG_OVERRUN as u16;
/// `NLMSGERR_ATTR_MSG`: the kernel's text in an extended ACK.
const NLMSGERR_ATTR_MSG: u16 = 1;
const NETLINK_HEADER_LEN: usize = 16;
/// `struct rtmsg`, before a route's attributes.
const ROUTE_HEADER_LEN: usize = 12;
/// Interface names are at most IFNAMSIZ - 1 bytes.
const MAX_NAME_LEN: usize = 15;
/// Marks the routes tunneld adds (`proto static` in `ip route`), so that removing one never
/// takes the kernel's prefix route of an interface address or an administrator's own route.
const ROUTE_PROTOCOL: RouteProtocol = RouteProtocol::Static;
/// How often a route dump cut short by a concurrent change is tried again.
const DUMP_TRIES: usize = 3;

/// A NETLINK_ROUTE socket for configuring links.
pub struct Netlink {
    socket: Socket,
    sequence: u32,
    buf: Vec<u8>,
}

impl std::fmt::Debug for Netlink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Netlink")
            .field("fd", &self.socket.as_raw_fd())
            .field("sequence", &self.sequence)
            .finish_non_exhaustive()
    }
}

/// Why a request failed, before the operation is named in an `io::Error`.
#[derive(Debug)]
enum Failure {
    /// The kernel answered with this errno, and with its reason in words when it gave one.
    Refused { errno: i32, reason: Option<String> },
    /// The socket failed, or the reply could not be read.
    Io(io::Error),
}

impl Failure {
    fn errno(&self) -> Option<i32> {
        match self {
            Failure::Refused { errno, .. } => Some(*errno),
            Failure::Io(_) => None,
        }
    }

    /// One line: `netlink: {what}: {errno text}[: {kernel's reason}]`.
    fn named(self, what: &str) -> io::Error {
        match self {
            Failure::Refused { errno, reason } => {
                let os = io::Error::from_raw_os_error(errno);
                let message = match reason {
                    Some(reason) => format!("netlink: {what}: {os}: {reason}"),
                    None => format!("netlink: {what}: {os}"),
                };
                io::Error::new(os.kind(), message)
            }
            Failure::Io(e) => io::Error::new(e.kind(), format!("netlink: {what}: {e}")),
        }
    }
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Failure {
        Failure::Io(e)
    }
}

fn malformed(what: impl std::fmt::Display) -> Failure {
    Failure::Io(io::Error::new(
        io::ErrorKind::InvalidData,
        format!("malformed reply from the kernel: {what}"),
    ))
}

/// Treats the given errnos as success, so adds and removes can be repeated.
fn ignore(result: Result<(), Failure>, errnos: &[i32]) -> Result<(), Failure> {
    match result {
        Err(f) if f.errno().is_some_and(|n| errnos.contains(&n)) => Ok(()),
        other => other,
    }
}

impl Netlink {
    /// A NETLINK_ROUTE socket in the calling thread's network namespace.
    pub fn open() -> io::Result<Netlink> {
        let named = |what: &str, e: io::Error| Failure::Io(e).named(what);
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(|e| named("open socket", e))?;
        socket.bind_auto().map_err(|e| named("bind socket", e))?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(|e| named("connect socket", e))?;
        // Both best effort (older kernels lack them): the kernel's reason in words in an
        // error, and errors that do not echo the whole request back.
        let _ = socket.set_ext_ack(true);
        let _ = socket.set_cap_ack(true);
        Ok(Netlink {
            socket,
            sequence: 0,
            buf: Vec::with_capacity(32 * 1024),
        })
    }

    /// The index of the link called `name`, asked of the socket's namespace (not the calling
    /// thread's, which may have changed since [`Netlink::open`]).
    pub fn link_index(&mut self, name: &str) -> io::Result<u32> {
        let what = format!("find link {name:?}");
        if name.is_empty()
            || name.len() > MAX_NAME_LEN
            || name.contains(|c: char| c == '/' || c == '\0' || c.is_whitespace())
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("netlink: {what}: not a valid interface name"),
            ));
        }
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        let mut index = None;
        self.exchange(RouteNetlinkMessage::GetLink(msg), 0, |kind, payload| {
            if kind == libc::RTM_NEWLINK {
                if let Ok(header) = LinkHeader::parse(payload) {
                    index = Some(header.index);
                }
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
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes.push(LinkAttribute::Mtu(mtu));
        self.exchange(RouteNetlinkMessage::SetLink(msg), 0, |_, _| {})
            .map_err(|f| f.named(&format!("set MTU {mtu} on link {index}")))
    }

    /// Sets the link administratively up.
    pub fn set_up(&mut self, index: u32) -> io::Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.header.flags = LinkFlags::Up;
        msg.header.change_mask = LinkFlags::Up;
        self.exchange(RouteNetlinkMessage::SetLink(msg), 0, |_, _| {})
            .map_err(|f| f.named(&format!("set link {index} up")))
    }

    /// Adds addr/prefix (host bits kept, e.g. 10.77.0.1/24) to the link; an address that is
    /// already there is not an error. IPv6 with IFA_F_NODAD so it is usable at once.
    pub fn add_address(&mut self, index: u32, addr: IpNet) -> io::Result<()> {
        let mut msg = AddressMessage::default();
        msg.header.index = index;
        msg.header.prefix_len = addr.prefix_len();
        match addr.addr() {
            IpAddr::V4(_) => {
                msg.header.family = AddressFamily::Inet;
                // IFA_LOCAL is the interface's own address; IFA_ADDRESS the same on a link
                // that is not point-to-point, as `ip addr add` sends it.
                msg.attributes.push(AddressAttribute::Local(addr.addr()));
            }
            IpAddr::V6(_) => {
                msg.header.family = AddressFamily::Inet6;
                // Without NODAD the address stays "tentative" (unusable) for a second or more.
                msg.header.flags = AddressHeaderFlags::Nodad;
            }
        }
        msg.attributes.push(AddressAttribute::Address(addr.addr()));
        let result = self.exchange(
            RouteNetlinkMessage::NewAddress(msg),
            NLM_F_CREATE | NLM_F_EXCL,
            |_, _| {},
        );
        ignore(result, &[libc::EEXIST])
            .map_err(|f| f.named(&format!("add address {addr} to link {index}")))
    }

    /// Removes addr/prefix from the link (with the prefix route the kernel made for it); an
    /// address that is not there is not an error.
    pub fn del_address(&mut self, index: u32, addr: IpNet) -> io::Result<()> {
        let mut msg = AddressMessage::default();
        msg.header.index = index;
        msg.header.prefix_len = addr.prefix_len();
        msg.header.family = family_of(addr.addr());
        if addr.addr().is_ipv4() {
            msg.attributes.push(AddressAttribute::Local(addr.addr()));
        }
        msg.attributes.push(AddressAttribute::Address(addr.addr()));
        let result = self.exchange(RouteNetlinkMessage::DelAddress(msg), 0, |_, _| {});
        // EADDRNOTAVAIL: no such address; ENODEV: no such link.
        ignore(result, &[libc::EADDRNOTAVAIL, libc::ENODEV])
            .map_err(|f| f.named(&format!("remove address {addr} from link {index}")))
    }

    /// Adds a route to dst (truncated to its network) via the link; an existing identical
    /// route is not an error.
    pub fn add_route(&mut self, index: u32, dst: IpNet) -> io::Result<()> {
        let dst = dst.trunc();
        let what = format!("add route {dst} via link {index}");
        let result = self.exchange(
            RouteNetlinkMessage::NewRoute(route_message(index, dst, false)),
            NLM_F_CREATE | NLM_F_EXCL,
            |_, _| {},
        );
        match result {
            Ok(()) => Ok(()),
            // EEXIST says only that some route to dst is there (in IPv6: with the same
            // metric), maybe through another link; it is fine only if it goes through ours.
            Err(f) if f.errno() == Some(libc::EEXIST) => match self.route_exists(index, dst) {
                Ok(true) => Ok(()),
                Ok(false) => {
                    let why = format!("a route to {dst} through another link is in the way");
                    Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("netlink: {what}: {why}"),
                    ))
                }
                Err(f) => Err(f.named(&what)),
            },
            Err(f) => Err(f.named(&what)),
        }
    }

    /// Removes that route; a route that is not there is not an error. Only a route that
    /// [`Netlink::add_route`] could have added (its protocol) is removed.
    pub fn del_route(&mut self, index: u32, dst: IpNet) -> io::Result<()> {
        let dst = dst.trunc();
        let result = self.exchange(
            RouteNetlinkMessage::DelRoute(route_message(index, dst, true)),
            0,
            |_, _| {},
        );
        // ESRCH: no such route; ENODEV: no such link, so no route through it either.
        ignore(result, &[libc::ESRCH, libc::ENODEV])
            .map_err(|f| f.named(&format!("delete route {dst} via link {index}")))
    }

    /// Whether the main table has a route to exactly `dst` through link `index`.
    fn route_exists(&mut self, index: u32, dst: IpNet) -> Result<bool, Failure> {
        let family = family_of(dst.addr());
        let want: Vec<u8> = match dst.addr() {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        };
        let mut tries = 0;
        loop {
            let mut msg = RouteMessage::default();
            msg.header.address_family = family;
            let mut found = false;
            let result = self.exchange(
                RouteNetlinkMessage::GetRoute(msg),
                NLM_F_DUMP,
                |kind, payload| {
                    if kind == libc::RTM_NEWROUTE
                        && route_matches(payload, family, dst.prefix_len(), &want, index)
                    {
                        found = true;
                    }
                },
            );
            tries += 1;
            match result {
                Err(Failure::Io(e))
                    if e.kind() == io::ErrorKind::Interrupted && tries < DUMP_TRIES => {}
                Err(f) => return Err(f),
                Ok(()) => return Ok(found),
            }
        }
    }

    /// Sends one request and reads replies until its ACK (or, for a dump, its DONE), handing
    /// each reply message's type and payload to `on_reply`.
    fn exchange(
        &mut self,
        message: RouteNetlinkMessage,
        flags: u16,
        mut on_reply: impl FnMut(u16, &[u8]),
    ) -> Result<(), Failure> {
        self.sequence = self.sequence.wrapping_add(1);
        let sequence = self.sequence;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        header.sequence_number = sequence;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(message));
        packet.finalize();
        let mut out = vec![0u8; packet.buffer_len()];
        packet.serialize(&mut out);
        loop {
            match self.socket.send(&out, 0) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
                Ok(_) => break,
            }
        }
        let mut interrupted = false;
        loop {
            let n = self.receive()?;
            let datagram = self.buf.get(..n).unwrap_or(&self.buf);
            match scan(datagram, sequence, &mut interrupted, &mut on_reply) {
                Scan::More => {}
                Scan::Finished(result) => return result,
            }
        }
    }

    /// Reads one datagram into `self.buf`, however long it is, and returns its length.
    fn receive(&mut self) -> io::Result<usize> {
        loop {
            // Peek first so that a reply larger than the buffer is never cut short.
            self.buf.clear();
            let len = match self
                .socket
                .recv(&mut self.buf, libc::MSG_PEEK | libc::MSG_TRUNC)
            {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => other?,
            };
            self.buf.clear();
            self.buf.reserve(len);
            match self.socket.recv(&mut self.buf, 0) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
                Ok(n) => return Ok(n.min(self.buf.len())),
            }
        }
    }
}

/// What one datagram of replies said about the request `sequence`.
#[derive(Debug)]
enum Scan {
    /// Not finished: read another datagram.
    More,
    Finished(Result<(), Failure>),
}

/// Walks the messages of one datagram. Messages for other requests (late replies to one that
/// failed half-way) are skipped; a dump that a concurrent change cut short sets `interrupted`
/// and ends as an `Interrupted` error, for the caller to try again.
fn scan(
    mut datagram: &[u8],
    sequence: u32,
    interrupted: &mut bool,
    on_reply: &mut impl FnMut(u16, &[u8]),
) -> Scan {
    while !datagram.is_empty() {
        let message = match NetlinkBuffer::new_checked(datagram) {
            Ok(message) => message,
            Err(e) => return Scan::Finished(Err(malformed(e))),
        };
        let len = message.length() as usize;
        if message.sequence_number() == sequence {
            let payload = message.payload();
            match message.message_type() {
                NLMSG_ERROR => return Scan::Finished(ack_result(message.flags(), payload)),
                NLMSG_DONE => {
                    return Scan::Finished(done_result(payload, *interrupted));
                }
                NLMSG_OVERRUN => return Scan::Finished(Err(malformed("data lost (overrun)"))),
                NLMSG_NOOP => {}
                kind => {
                    if message.flags() & NLM_F_DUMP_INTR != 0 {
                        *interrupted = true;
                    }
                    on_reply(kind, payload);
                }
            }
        }
        // Messages are 4-byte aligned; the last one's padding may be missing.
        datagram = datagram.get(align4(len)..).unwrap_or(&[]);
    }
    Scan::More
}

fn align4(len: usize) -> usize {
    len.saturating_add(3) & !3
}

/// The outcome of an NLMSG_ERROR message: an ACK when its code is 0.
fn ack_result(flags: u16, payload: &[u8]) -> Result<(), Failure> {
    let Some(code) = payload.get(..4).and_then(|b| b.try_into().ok()) else {
        return Err(malformed("short error message"));
    };
    match i32::from_ne_bytes(code) {
        0 => Ok(()),
        code => Err(Failure::Refused {
            errno: i32::try_from(code.unsigned_abs()).unwrap_or(i32::MAX),
            reason: kernel_reason(flags, payload),
        }),
    }
}

/// The outcome of an NLMSG_DONE message, which ends a dump; newer kernels put an error
/// code in it.
fn done_result(payload: &[u8], interrupted: bool) -> Result<(), Failure> {
    let code = payload
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, i32::from_ne_bytes);
    if code != 0 {
        return ack_result(0, payload);
    }
    if interrupted {
        return Err(Failure::Io(io::Error::new(
            io::ErrorKind::Interrupted,
            "the dump was interrupted by a concurrent change",
        )));
    }
    Ok(())
}

/// The kernel's reason in words, from an extended ACK (after the error code comes the
/// request's header, or all of the request when not capped, then attributes).
fn kernel_reason(flags: u16, payload: &[u8]) -> Option<String> {
    if flags & NLM_F_ACK_TLVS == 0 {
        return None;
    }
    let request = payload.get(4..)?;
    let request_len = if flags & NLM_F_CAPPED != 0 {
        NETLINK_HEADER_LEN
    } else {
        NetlinkBuffer::new_checked(request).ok()?.length() as usize
    };
    let attributes = request.get(align4(request_len)..)?;
    for attribute in NlasIterator::new(attributes) {
        let attribute = attribute.ok()?;
        if attribute.kind() == NLMSGERR_ATTR_MSG {
            let text = attribute.value().split(|&b| b == 0).next().unwrap_or(&[]);
            let text = String::from_utf8_lossy(text).trim().to_string();
            return (!text.is_empty()).then_some(text);
        }
    }
    None
}

fn family_of(addr: IpAddr) -> AddressFamily {
    match addr {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    }
}

/// An add or delete request for the device route to `dst` (already truncated) via `index`.
fn route_message(index: u32, dst: IpNet, delete: bool) -> RouteMessage {
    let mut msg = RouteMessage::default();
    msg.header.address_family = family_of(dst.addr());
    msg.header.table = RouteHeader::RT_TABLE_MAIN;
    msg.header.protocol = ROUTE_PROTOCOL;
    msg.header.destination_prefix_length = dst.prefix_len();
    if delete {
        // As `ip route del` does: any scope and type; table, protocol, link and dst must match.
        msg.header.scope = RouteScope::NoWhere;
        msg.header.kind = RouteType::Unspec;
    } else {
        // No gateway: the destination is directly on the link.
        msg.header.scope = RouteScope::Link;
        msg.header.kind = RouteType::Unicast;
    }
    let address = match dst.addr() {
        IpAddr::V4(a) => RouteAddress::Inet(a),
        IpAddr::V6(a) => RouteAddress::Inet6(a),
    };
    msg.attributes.push(RouteAttribute::Destination(address));
    msg.attributes.push(RouteAttribute::Oif(index));
    msg
}

/// Whether one route of a dump (an RTM_NEWROUTE payload) is the main-table route to
/// `dst`/`prefix_len` (address bytes `want`) through link `index`.
fn route_matches(
    payload: &[u8],
    family: AddressFamily,
    prefix_len: u8,
    want: &[u8],
    index: u32,
) -> bool {
    let Ok(header) = RouteHeader::parse(payload) else {
        return false;
    };
    if header.address_family != family || header.destination_prefix_length != prefix_len {
        return false;
    }
    let mut table = u32::from(header.table);
    let mut oif = None;
    // A default route has no RTA_DST.
    let mut dst_ok = prefix_len == 0;
    for attribute in NlasIterator::new(payload.get(ROUTE_HEADER_LEN..).unwrap_or(&[])) {
        let Ok(attribute) = attribute else {
            return false;
        };
        let value = attribute.value();
        let as_u32 = || <[u8; 4]>::try_from(value).ok().map(u32::from_ne_bytes);
        match attribute.kind() {
            libc::RTA_DST => dst_ok = value == want,
            libc::RTA_OIF => oif = as_u32(),
            libc::RTA_TABLE => table = as_u32().unwrap_or(table),
            _ => {}
        }
    }
    dst_ok && oif == Some(index) && table == u32::from(RouteHeader::RT_TABLE_MAIN)
}

#[cfg(test)]
mod tests {
    use super::*;
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

    /// One netlink message in a datagram.
    fn message(kind: u16, flags: u16, sequence: u32, payload: &[u8]) -> Vec<u8> {
        let len = (NETLINK_HEADER_LEN + payload.len()) as u32;
        let mut out = Vec::new();
        out.extend_from_slice(&len.to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(&flags.to_ne_bytes());
        out.extend_from_slice(&sequence.to_ne_bytes());
        out.extend_from_slice(&0u32.to_ne_bytes());
        out.extend_from_slice(payload);
        while out.len() % 4 != 0 {
            out.push(0);
        }
        out
    }

    fn run_scan(datagram: &[u8], sequence: u32) -> (Scan, Vec<u16>) {
        let mut seen = Vec::new();
        let mut interrupted = false;
        let scan = scan(datagram, sequence, &mut interrupted, &mut |kind, _| {
            seen.push(kind)
        });
        (scan, seen)
    }

    /// The kind of a local (not kernel-refused) failure that ended a scan.
    fn io_kind(scan: &Scan) -> Option<io::ErrorKind> {
        match scan {
            Scan::Finished(Err(Failure::Io(e))) => Some(e.kind()),
            _ => None,
        }
    }

    fn error_payload(code: i32, request: &[u8], attributes: &[u8]) -> Vec<u8> {
        let mut p = code.to_ne_bytes().to_vec();
        p.extend_from_slice(request);
        p.extend_from_slice(attributes);
        p
    }

    #[test]
    fn replies_are_matched_to_their_request() {
        // A late ACK for another request is skipped; ours ends the exchange.
        let mut datagram = message(NLMSG_ERROR, 0, 6, &error_payload(0, &[0; 16], &[]));
        datagram.extend(message(libc::RTM_NEWLINK, 0, 7, &[0; 16]));
        datagram.extend(message(NLMSG_ERROR, 0, 7, &error_payload(0, &[0; 16], &[])));
        let (scan, seen) = run_scan(&datagram, 7);
        assert!(matches!(scan, Scan::Finished(Ok(()))), "{scan:?}");
        assert_eq!(seen, [libc::RTM_NEWLINK]);

        // A multipart dump goes on across datagrams until DONE.
        let part = message(libc::RTM_NEWROUTE, 2, 7, &[0; 12]);
        let (scan, seen) = run_scan(&part, 7);
        assert!(matches!(scan, Scan::More));
        assert_eq!(seen, [libc::RTM_NEWROUTE]);
        let (scan, _) = run_scan(&message(NLMSG_DONE, 2, 7, &0i32.to_ne_bytes()), 7);
        assert!(matches!(scan, Scan::Finished(Ok(()))), "{scan:?}");

        // A dump cut short by a change is to be tried again.
        let mut interrupted = false;
        let intr = message(libc::RTM_NEWROUTE, 2 | NLM_F_DUMP_INTR, 7, &[0; 12]);
        let _ = super::scan(&intr, 7, &mut interrupted, &mut |_, _| {});
        let done = message(NLMSG_DONE, 2, 7, &0i32.to_ne_bytes());
        let end = super::scan(&done, 7, &mut interrupted, &mut |_, _| {});
        assert_eq!(io_kind(&end), Some(io::ErrorKind::Interrupted), "{end:?}");
    }

    #[test]
    fn refusals_carry_the_errno_and_the_kernel_reason() {
        let mut attribute = Vec::new();
        let text = b"Nexthop device is not up\0";
        attribute.extend_from_slice(&((4 + text.len()) as u16).to_ne_bytes());
        attribute.extend_from_slice(&NLMSGERR_ATTR_MSG.to_ne_bytes());
        attribute.extend_from_slice(text);
        while attribute.len() % 4 != 0 {
            attribute.push(0);
        }
        let request = message(libc::RTM_NEWROUTE, 0, 3, &[0; 12]);
        let capped = error_payload(-libc::ENETDOWN, &request[..16], &attribute);
        let uncapped = error_payload(-libc::ENETDOWN, &request, &attribute);
        for (flags, payload) in [
            (NLM_F_ACK_TLVS | NLM_F_CAPPED, capped),
            (NLM_F_ACK_TLVS, uncapped),
        ] {
            let (scan, _) = run_scan(&message(NLMSG_ERROR, flags, 3, &payload), 3);
            let Scan::Finished(Err(failure)) = scan else {
                panic!("not a refusal: {scan:?}");
            };
            assert_eq!(
                failure
                    .named("add route 10.20.0.0/16 via link 7")
                    .to_string(),
                "netlink: add route 10.20.0.0/16 via link 7: Network is down (os error 100): \
                 Nexthop device is not up"
            );
        }
        // Without the extended ACK: the errno alone.
        let plain = error_payload(-libc::ENETUNREACH, &[0; 16], &[]);
        let (scan, _) = run_scan(&message(NLMSG_ERROR, 0, 3, &plain), 3);
        let Scan::Finished(Err(failure)) = scan else {
            panic!("not a refusal: {scan:?}");
        };
        assert_eq!(
            failure
                .named("add route 10.20.0.0/16 via link 7")
                .to_string(),
            "netlink: add route 10.20.0.0/16 via link 7: Network is unreachable (os error 101)"
        );
    }

    #[test]
    fn garbage_from_the_kernel_is_an_error_not_a_panic() {
        let short_error = message(NLMSG_ERROR, 0, 1, &[1, 2]);
        let mut bad_length = message(NLMSG_ERROR, 0, 1, &error_payload(0, &[], &[]));
        bad_length[..4].copy_from_slice(&4000u32.to_ne_bytes());
        let mut tiny_length = bad_length.clone();
        tiny_length[..4].copy_from_slice(&3u32.to_ne_bytes());
        for datagram in [&short_error[..], &bad_length, &tiny_length, &[1, 2, 3]] {
            let (scan, _) = run_scan(datagram, 1);
            assert_eq!(io_kind(&scan), Some(io::ErrorKind::InvalidData), "{scan:?}");
        }
        // Odd codes and bogus extended ACKs still give one clear line.
        for code in [i32::MIN, -1, 5, i32::MAX] {
            let payload = error_payload(code, &[0xff; 16], &[0xff; 7]);
            let (scan, _) = run_scan(&message(NLMSG_ERROR, !0, 1, &payload), 1);
            let Scan::Finished(Err(failure)) = scan else {
                panic!("not a refusal: {scan:?}");
            };
            assert!(!failure.named("x").to_string().contains('\n'));
        }
        // Pseudo-random bytes, with and without a valid header in front: never a panic.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for round in 0..20_000u32 {
            let mut bytes = Vec::new();
            let len = (round % 90) as usize;
            for _ in 0..len {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                bytes.push(state as u8);
            }
            let kind = [NLMSG_ERROR, NLMSG_DONE, libc::RTM_NEWROUTE][(round % 3) as usize];
            let framed = message(kind, (state >> 8) as u16, 1, &bytes);
            let _ = run_scan(&bytes, 1);
            let _ = run_scan(&framed, 1);
            let _ = route_matches(&bytes, AddressFamily::Inet, 16, &[10, 20, 0, 0], 1);
        }
    }

    #[test]
    fn dump_entries_match_only_the_same_route_through_the_same_link() {
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
        let want = [10, 20, 0, 0];
        assert!(route_matches(&payload, AddressFamily::Inet, 16, &want, 7));
        assert!(!route_matches(&payload, AddressFamily::Inet, 16, &want, 8));
        assert!(!route_matches(&payload, AddressFamily::Inet, 24, &want, 7));
        assert!(!route_matches(&payload, AddressFamily::Inet6, 16, &want, 7));
        assert!(!route_matches(
            &payload,
            AddressFamily::Inet,
            16,
            &[10, 21, 0, 0],
            7
        ));
        msg.attributes.push(RouteAttribute::Table(100));
        assert!(!route_matches(
            &encode(&msg),
            AddressFamily::Inet,
            16,
            &want,
            7
        ));
    }
}
