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

/// A hash of a packet's flow: its addresses and, for TCP and UDP (unfragmented, or the first
/// fragment), its ports. Every packet of a flow gets the same value, in both directions, so
/// a flow keeps to one sub-tunnel and its packets stay in order. 0 for what is not IP.
pub fn flow_hash(packet: &[u8]) -> u32 {
    let (src, dst, protocol, rest) = match packet.first().map(|b| b >> 4) {
        Some(4) if packet.len() >= 20 => {
            let header = usize::from(packet[0] & 0x0f) * 4;
            let first_fragment = u16::from_be_bytes([packet[6], packet[7]]) & 0x1fff == 0;
            let rest = if first_fragment {
                packet.get(header..)
            } else {
                None
            };
            (&packet[12..16], &packet[16..20], packet[9], rest)
        }
        Some(6) if packet.len() >= 40 => {
            (&packet[8..24], &packet[24..40], packet[6], packet.get(40..))
        }
        _ => return 0,
    };
    let ports = match (protocol, rest) {
        (6 | 17, Some(l4)) if l4.len() >= 4 => Some((&l4[0..2], &l4[2..4])),
        _ => None,
    };
    let end = |addr: &[u8], port: Option<&[u8]>| {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in addr.iter().chain(port.unwrap_or(&[])) {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
        h
    };
    // Adding the two ends' hashes makes the result the same whichever way the packet goes.
    let mut h = end(src, ports.map(|p| p.0)).wrapping_add(end(dst, ports.map(|p| p.1)));
    // FNV's low bits follow the last byte's; a final mix (MurmurHash3's) spreads every bit.
    h = (h ^ (h >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
    h = (h ^ (h >> 33)).wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    (h ^ (h >> 33)) as u32
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

    fn v4_tcp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let mut p = vec![0u8; 40];
        p[0] = 0x45;
        p[9] = 6;
        p[12..16].copy_from_slice(&src);
        p[16..20].copy_from_slice(&dst);
        p[20..22].copy_from_slice(&sport.to_be_bytes());
        p[22..24].copy_from_slice(&dport.to_be_bytes());
        p
    }

    #[test]
    fn flow_hash_is_per_flow_and_the_same_both_ways() {
        let a = v4_tcp([10, 0, 0, 1], [10, 0, 0, 2], 40000, 5201);
        let back = v4_tcp([10, 0, 0, 2], [10, 0, 0, 1], 5201, 40000);
        let other = v4_tcp([10, 0, 0, 1], [10, 0, 0, 2], 40001, 5201);
        assert_eq!(flow_hash(&a), flow_hash(&back));
        assert_ne!(flow_hash(&a), flow_hash(&other));
        // The payload does not matter; a later fragment (no ports) hashes by addresses only.
        let mut longer = a.clone();
        longer.extend_from_slice(&[7; 100]);
        assert_eq!(flow_hash(&a), flow_hash(&longer));
        let mut fragment = a.clone();
        fragment[7] = 1;
        assert_ne!(flow_hash(&fragment), flow_hash(&a));
        // Different source ports spread over both halves of the hash space.
        let odd = (0..64u16)
            .filter(|p| flow_hash(&v4_tcp([10, 0, 0, 1], [10, 0, 0, 2], 40000 + p, 5201)) % 2 == 1)
            .count();
        assert!((16..=48).contains(&odd), "{odd} of 64 odd");
        assert_eq!(flow_hash(&[]), 0);
        assert_eq!(flow_hash(&[0x45; 10]), 0);
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
