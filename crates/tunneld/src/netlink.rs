//! Interface configuration over rtnetlink: MTU, link state, addresses and routes.
//!
//! Synchronous and small: one request, one ACK. The socket belongs to the network namespace
//! of the thread that opened it, which is what lets tests configure links inside namespaces.

use ipnet::IpNet;
use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL,
    NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressHeaderFlags, AddressMessage};
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use std::ffi::CString;
use std::io;
use std::net::IpAddr;

/// A NETLINK_ROUTE socket for configuring links.
pub struct Netlink {
    socket: Socket,
    sequence: u32,
    buf: Vec<u8>,
}

impl std::fmt::Debug for Netlink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Netlink").finish_non_exhaustive()
    }
}

fn context(what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("netlink: {what}: {e}"))
}

impl Netlink {
    /// A socket in the calling thread's network namespace.
    pub fn open() -> io::Result<Netlink> {
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(|e| context("open", e))?;
        socket.bind_auto().map_err(|e| context("bind", e))?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(|e| context("connect", e))?;
        Ok(Netlink {
            socket,
            sequence: 0,
            buf: Vec::with_capacity(64 * 1024),
        })
    }

    pub fn link_index(&mut self, name: &str) -> io::Result<u32> {
        let c_name = CString::new(name).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad interface name {name:?}"),
            )
        })?;
        // SAFETY: c_name is a valid NUL-terminated string for the duration of the call.
        let index = unsafe { libc::if_nametoindex(c_name.as_ptr()) };
        if index == 0 {
            return Err(context(
                &format!("find interface {name}"),
                io::Error::last_os_error(),
            ));
        }
        Ok(index)
    }

    pub fn set_mtu(&mut self, index: u32, mtu: u32) -> io::Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes.push(LinkAttribute::Mtu(mtu));
        self.request(RouteNetlinkMessage::SetLink(msg), 0)
            .map_err(|e| context(&format!("set MTU {mtu} on link {index}"), e))
    }

    pub fn set_up(&mut self, index: u32) -> io::Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.header.flags = LinkFlags::Up;
        msg.header.change_mask = LinkFlags::Up;
        self.request(RouteNetlinkMessage::SetLink(msg), 0)
            .map_err(|e| context(&format!("set link {index} up"), e))
    }

    /// Adds `addr` (host bits kept: it is the interface's own address) to the link. An
    /// address already there is not an error.
    pub fn add_address(&mut self, index: u32, addr: IpNet) -> io::Result<()> {
        let mut msg = AddressMessage::default();
        msg.header.index = index;
        msg.header.prefix_len = addr.prefix_len();
        match addr.addr() {
            IpAddr::V4(_) => {
                msg.header.family = AddressFamily::Inet;
                msg.attributes.push(AddressAttribute::Local(addr.addr()));
            }
            IpAddr::V6(_) => {
                msg.header.family = AddressFamily::Inet6;
                // Usable at once, without duplicate address detection on a point-to-point link.
                msg.header.flags = AddressHeaderFlags::Nodad;
            }
        }
        msg.attributes.push(AddressAttribute::Address(addr.addr()));
        let result = self.request(
            RouteNetlinkMessage::NewAddress(msg),
            NLM_F_CREATE | NLM_F_EXCL,
        );
        ignore(result, &[libc::EEXIST])
            .map_err(|e| context(&format!("add address {addr} to link {index}"), e))
    }

    /// Routes `dst` (truncated to its network) through the link. An existing identical route
    /// is not an error.
    pub fn add_route(&mut self, index: u32, dst: IpNet) -> io::Result<()> {
        let msg = route_message(index, dst);
        let result = self.request(
            RouteNetlinkMessage::NewRoute(msg),
            NLM_F_CREATE | NLM_F_EXCL,
        );
        ignore(result, &[libc::EEXIST])
            .map_err(|e| context(&format!("add route {} via link {index}", dst.trunc()), e))
    }

    /// Removes that route; a route that is not there is not an error.
    pub fn del_route(&mut self, index: u32, dst: IpNet) -> io::Result<()> {
        let msg = route_message(index, dst);
        let result = self.request(RouteNetlinkMessage::DelRoute(msg), 0);
        ignore(result, &[libc::ESRCH, libc::ENOENT])
            .map_err(|e| context(&format!("delete route {} via link {index}", dst.trunc()), e))
    }

    /// Sends one request and waits for its ACK; a refusal comes back as the kernel's errno.
    fn request(&mut self, message: RouteNetlinkMessage, flags: u16) -> io::Result<()> {
        self.sequence = self.sequence.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        header.sequence_number = self.sequence;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(message));
        packet.finalize();
        let mut out = vec![0u8; packet.buffer_len()];
        packet.serialize(&mut out);
        self.socket.send(&out, 0)?;

        loop {
            self.buf.clear();
            let n = self.socket.recv(&mut self.buf, 0)?;
            let mut offset = 0;
            while offset < n {
                let bytes = &self.buf[offset..n];
                let reply =
                    NetlinkMessage::<RouteNetlinkMessage>::deserialize(bytes).map_err(|e| {
                        io::Error::new(io::ErrorKind::InvalidData, format!("unreadable reply: {e}"))
                    })?;
                let len = reply.header.length as usize;
                if reply.header.sequence_number == self.sequence {
                    if let NetlinkPayload::Error(err) = &reply.payload {
                        return match err.code {
                            None => Ok(()),
                            Some(code) => Err(io::Error::from_raw_os_error(code.get().abs())),
                        };
                    }
                }
                if len == 0 {
                    break;
                }
                offset += len.next_multiple_of(4);
            }
        }
    }
}

fn route_message(index: u32, dst: IpNet) -> RouteMessage {
    let dst = dst.trunc();
    let mut msg = RouteMessage::default();
    msg.header.table = RouteHeader::RT_TABLE_MAIN;
    msg.header.protocol = RouteProtocol::Boot;
    msg.header.kind = RouteType::Unicast;
    msg.header.destination_prefix_length = dst.prefix_len();
    let address = match dst.addr() {
        IpAddr::V4(a) => {
            msg.header.address_family = AddressFamily::Inet;
            msg.header.scope = RouteScope::Link;
            RouteAddress::Inet(a)
        }
        IpAddr::V6(a) => {
            msg.header.address_family = AddressFamily::Inet6;
            msg.header.scope = RouteScope::Universe;
            RouteAddress::Inet6(a)
        }
    };
    msg.attributes.push(RouteAttribute::Destination(address));
    msg.attributes.push(RouteAttribute::Oif(index));
    msg
}

/// Treats the given errnos as success, so adds and removes are idempotent.
fn ignore(result: io::Result<()>, errnos: &[i32]) -> io::Result<()> {
    match result {
        Err(e) if e.raw_os_error().is_some_and(|n| errnos.contains(&n)) => Ok(()),
        other => other,
    }
}
