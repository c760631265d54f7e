//! Sizes and small parsers of the packets the core handles.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// WireGuard data message overhead: type, receiver index, counter (16) and the AEAD tag (16).
pub const DATA_OVERHEAD: usize = 32;
/// The largest IP packet the overlay carries.
pub const MAX_IP_PACKET: usize = 65535;
/// The largest buffer any message needs: a maximal IP packet, padded, plus the data overhead.
pub const MAX_DATAGRAM: usize = MAX_IP_PACKET + 16 + DATA_OVERHEAD;
/// Handshake messages are at most this long (the initiation).
pub const MAX_HANDSHAKE: usize = 148;

/// The destination address of an IPv4 or IPv6 packet, `None` if it is neither or too short.
pub fn destination(packet: &[u8]) -> Option<IpAddr> {
    match packet.first()? >> 4 {
        4 if packet.len() >= 20 => {
            let b: [u8; 4] = packet[16..20].try_into().ok()?;
            Some(IpAddr::V4(Ipv4Addr::from(b)))
        }
        6 if packet.len() >= 40 => {
            let b: [u8; 16] = packet[24..40].try_into().ok()?;
            Some(IpAddr::V6(Ipv6Addr::from(b)))
        }
        _ => None,
    }
}

/// The length a plaintext of `len` bytes is padded to before encryption: the next multiple of
/// 16, but never beyond the MTU (WireGuard's padding rule), and never below `len`.
pub fn padded_len(len: usize, mtu: usize) -> usize {
    let rounded = len.div_ceil(16) * 16;
    rounded.min(mtu.max(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_follows_the_wireguard_rule() {
        assert_eq!(padded_len(0, 1420), 0);
        assert_eq!(padded_len(1, 1420), 16);
        assert_eq!(padded_len(16, 1420), 16);
        assert_eq!(padded_len(1419, 1420), 1420);
        assert_eq!(padded_len(1420, 1420), 1420);
        // Longer than the MTU (GSO-sized): never padded past its own length.
        assert_eq!(padded_len(1500, 1420), 1500);
    }

    #[test]
    fn destination_of_v4_v6_and_garbage() {
        let mut v4 = [0u8; 20];
        v4[0] = 0x45;
        v4[16..20].copy_from_slice(&[10, 0, 0, 2]);
        assert_eq!(destination(&v4), Some("10.0.0.2".parse().unwrap()));
        let mut v6 = [0u8; 40];
        v6[0] = 0x60;
        v6[39] = 1;
        assert_eq!(destination(&v6), Some("::1".parse().unwrap()));
        assert_eq!(destination(&v4[..10]), None);
        assert_eq!(destination(&[]), None);
        assert_eq!(destination(&[0x10; 40]), None);
    }
}
