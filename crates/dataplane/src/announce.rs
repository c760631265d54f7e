//! Telling a LAN that an address has moved to this host: a gratuitous ARP for an IPv4
//! address, an unsolicited neighbour advertisement (override flag, to all nodes) for an IPv6
//! one, both from the interface's MAC. The hosts that already have a neighbour entry for the
//! address point it at this MAC at once, instead of sending to the gateway that held it
//! until their entry goes stale and is probed (many seconds).
//!
//! The frames are built whole (Ethernet header on) and sent through one packet socket.
//! Opening it takes `CAP_NET_RAW`; sending on it afterwards takes nothing, so a gateway opens
//! it at start and drops the capability with the others.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const ETHERTYPE_ARP: u16 = 0x0806;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETHERNET_HEADER: usize = 14;
/// The shortest Ethernet frame without its FCS: an ARP frame is padded up to it.
const ETHERNET_MIN: usize = 60;
const ARP_REQUEST: u16 = 1;
const ARP_REPLY: u16 = 2;
const BROADCAST: [u8; 6] = [0xff; 6];
/// ff02::1's multicast MAC (33:33 and the group's low 32 bits).
const ALL_NODES_MAC: [u8; 6] = [0x33, 0x33, 0, 0, 0, 1];
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
const IPPROTO_ICMPV6: u8 = 58;
const NEIGHBOUR_ADVERTISEMENT: u8 = 136;
/// The NA's flags: R (the sender routes), O (override the receivers' cached address).
const NA_ROUTER: u8 = 0x80;
const NA_OVERRIDE: u8 = 0x20;
const OPTION_TARGET_LINK_ADDRESS: u8 = 2;
/// An NA with the target link-layer address option: 24 bytes and an 8-byte option.
const NA_LEN: usize = 32;

/// The ARP frames that announce `ip` at `mac`: a request and a reply, each with sender and
/// target address `ip`, to broadcast. Receivers take either as gratuitous (Linux lets a
/// gratuitous one replace an entry within its `locktime`; a reply counts as gratuitous only
/// when its target MAC is its sender's, so the reply's is `mac`). Some hosts heed only one
/// kind, hence both, as keepalived and `arping -U`/`-A` between them send.
pub fn gratuitous_arp(mac: [u8; 6], ip: Ipv4Addr) -> [[u8; ETHERNET_MIN]; 2] {
    [
        arp_frame(mac, ip, ARP_REQUEST, [0; 6]),
        arp_frame(mac, ip, ARP_REPLY, mac),
    ]
}

fn arp_frame(mac: [u8; 6], ip: Ipv4Addr, op: u16, target_mac: [u8; 6]) -> [u8; ETHERNET_MIN] {
    let mut f = [0u8; ETHERNET_MIN];
    f[0..6].copy_from_slice(&BROADCAST);
    f[6..12].copy_from_slice(&mac);
    f[12..14].copy_from_slice(&ETHERTYPE_ARP.to_be_bytes());
    let a = &mut f[ETHERNET_HEADER..];
    a[0..2].copy_from_slice(&1u16.to_be_bytes()); // Ethernet
    a[2..4].copy_from_slice(&0x0800u16.to_be_bytes()); // IPv4
    a[4] = 6;
    a[5] = 4;
    a[6..8].copy_from_slice(&op.to_be_bytes());
    a[8..14].copy_from_slice(&mac);
    a[14..18].copy_from_slice(&ip.octets());
    a[18..24].copy_from_slice(&target_mac);
    a[24..28].copy_from_slice(&ip.octets());
    f
}

/// The unsolicited neighbour advertisement of `ip` at `mac` (RFC 4861 7.2.6): from `ip` to
/// all nodes, hop limit 255, override set, solicited clear, the router flag set (the
/// address is a gateway's), with the target link-layer address option.
pub fn neighbour_advertisement(mac: [u8; 6], ip: Ipv6Addr) -> [u8; ETHERNET_HEADER + 40 + NA_LEN] {
    let mut f = [0u8; ETHERNET_HEADER + 40 + NA_LEN];
    f[0..6].copy_from_slice(&ALL_NODES_MAC);
    f[6..12].copy_from_slice(&mac);
    f[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
    let ip6 = &mut f[ETHERNET_HEADER..ETHERNET_HEADER + 40];
    ip6[0] = 0x60;
    ip6[4..6].copy_from_slice(&(NA_LEN as u16).to_be_bytes());
    ip6[6] = IPPROTO_ICMPV6;
    ip6[7] = 255;
    ip6[8..24].copy_from_slice(&ip.octets());
    ip6[24..40].copy_from_slice(&ALL_NODES.octets());
    let na = &mut f[ETHERNET_HEADER + 40..];
    na[0] = NEIGHBOUR_ADVERTISEMENT;
    na[4] = NA_ROUTER | NA_OVERRIDE;
    na[8..24].copy_from_slice(&ip.octets());
    na[24] = OPTION_TARGET_LINK_ADDRESS;
    na[25] = 1; // in units of 8 bytes
    na[26..32].copy_from_slice(&mac);
    let checksum = icmpv6_checksum(ip, ALL_NODES, na);
    na[2..4].copy_from_slice(&checksum.to_be_bytes());
    f
}

/// The ICMPv6 checksum over the pseudo-header and `message` (its checksum field zero).
fn icmpv6_checksum(src: Ipv6Addr, dst: Ipv6Addr, message: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut add = |bytes: &[u8]| {
        for pair in bytes.chunks(2) {
            let word = match pair {
                [hi, lo] => u16::from_be_bytes([*hi, *lo]),
                [hi] => u16::from_be_bytes([*hi, 0]),
                _ => 0,
            };
            sum += u32::from(word);
        }
    };
    add(&src.octets());
    add(&dst.octets());
    add(&(message.len() as u32).to_be_bytes());
    add(&[0, 0, 0, IPPROTO_ICMPV6]);
    add(message);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A packet socket that sends whole Ethernet frames out of any interface of its network
/// namespace (the one of the thread that opened it). It receives nothing.
#[derive(Debug)]
pub struct Announcer {
    socket: OwnedFd,
}

impl Announcer {
    /// Opens the socket (needs `CAP_NET_RAW`).
    pub fn open() -> io::Result<Announcer> {
        // Protocol 0: the socket is bound to no protocol, so the kernel queues nothing to it.
        // SAFETY: plain socket(2); the result is checked.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor we just opened and own.
        let socket = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Announcer { socket })
    }

    /// Announces each of `addresses` at `mac` out of interface `ifindex`: a gratuitous ARP
    /// (request and reply) for IPv4, an unsolicited NA for IPv6. Tries every address; the
    /// first error is returned.
    pub fn announce(&self, ifindex: u32, mac: [u8; 6], addresses: &[IpAddr]) -> io::Result<()> {
        let mut first_error = None;
        for addr in addresses {
            let sent = match addr {
                IpAddr::V4(ip) => gratuitous_arp(mac, *ip)
                    .iter()
                    .try_for_each(|frame| self.send(ifindex, frame)),
                IpAddr::V6(ip) => self.send(ifindex, &neighbour_advertisement(mac, *ip)),
            };
            if let Err(e) = sent {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Sends one whole frame out of `ifindex`.
    pub fn send(&self, ifindex: u32, frame: &[u8]) -> io::Result<()> {
        // SAFETY: all-zero is a valid sockaddr_ll.
        let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        to.sll_family = libc::AF_PACKET as u16;
        to.sll_ifindex = i32::try_from(ifindex)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface index"))?;
        // With SOCK_RAW the frame carries its own header; the protocol is the frame's.
        to.sll_protocol =
            u16::from_be_bytes([*frame.get(12).unwrap_or(&0), *frame.get(13).unwrap_or(&0)])
                .to_be();
        loop {
            // SAFETY: `frame` is readable for its length and `to` is a sockaddr_ll of the
            // size passed.
            let n = unsafe {
                libc::sendto(
                    self.socket.as_raw_fd(),
                    frame.as_ptr().cast(),
                    frame.len(),
                    0,
                    (&to as *const libc::sockaddr_ll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
                )
            };
            if n >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];

    #[test]
    fn gratuitous_arp_is_a_request_and_a_reply_for_the_address_itself() {
        let ip = Ipv4Addr::new(192, 168, 10, 1);
        let [request, reply] = gratuitous_arp(MAC, ip);
        for (frame, op, target_mac) in [(request, 1, [0; 6]), (reply, 2, MAC)] {
            assert_eq!(frame[0..6], BROADCAST);
            assert_eq!(frame[6..12], MAC);
            assert_eq!(frame[12..14], [0x08, 0x06]);
            let arp = &frame[14..42];
            assert_eq!(arp[0..8], [0, 1, 8, 0, 6, 4, 0, op]);
            assert_eq!(arp[8..14], MAC, "sender MAC");
            assert_eq!(arp[14..18], ip.octets(), "sender address");
            assert_eq!(arp[18..24], target_mac);
            assert_eq!(arp[24..28], ip.octets(), "target address: the same");
            assert!(frame[42..].iter().all(|b| *b == 0), "padding");
        }
    }

    /// Every field at its RFC 4861 offset, and a checksum that sums to zero with the
    /// pseudo-header (Linux drops an NA whose does not; the fleet's test sees one taken).
    #[test]
    fn a_neighbour_advertisement_overrides_and_checks_out() {
        let ip: Ipv6Addr = "fd10::1".parse().unwrap();
        let f = neighbour_advertisement(MAC, ip);
        assert_eq!(f.len(), 86);
        assert_eq!(f[0..6], ALL_NODES_MAC);
        assert_eq!(f[12..14], [0x86, 0xdd]);
        let ip6 = &f[14..54];
        assert_eq!(ip6[0], 0x60);
        assert_eq!(u16::from_be_bytes([ip6[4], ip6[5]]), 32, "payload length");
        assert_eq!((ip6[6], ip6[7]), (58, 255), "ICMPv6, hop limit 255");
        assert_eq!(ip6[8..24], ip.octets());
        assert_eq!(ip6[24..40], ALL_NODES.octets());
        let na = &f[54..];
        assert_eq!((na[0], na[1]), (136, 0));
        assert_eq!(na[4], 0xa0, "router and override, not solicited");
        assert_eq!(na[8..24], ip.octets(), "target");
        assert_eq!(na[24..32], [2, 1, 0x02, 0, 0, 0, 0, 0x0b]);
        // A message with its checksum in place sums to 0xffff (its complement is zero).
        assert_eq!(icmpv6_checksum(ip, ALL_NODES, na), 0);
        let mut zeroed = na.to_vec();
        zeroed[2..4].copy_from_slice(&[0, 0]);
        assert_ne!(icmpv6_checksum(ip, ALL_NODES, &zeroed), 0);
    }
}
