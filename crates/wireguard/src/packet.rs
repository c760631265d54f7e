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

/// TCP's maximum segment size for a tunnel of `mtu`: what fits in one packet after the IPv4
/// (20) or IPv6 (40) header and the TCP header (20), as `(ipv4, ipv6)`.
pub fn mss_for_mtu(mtu: u16) -> (u16, u16) {
    (mtu.saturating_sub(40), mtu.saturating_sub(60))
}

/// Lowers the MSS option of a TCP SYN (or SYN-ACK) in `packet` to at most `mss` (`(ipv4,
/// ipv6)`), fixing the TCP checksum incrementally (RFC 1624), so a connection across the
/// tunnel never sends segments the tunnel would have to fragment or drop (the path-MTU black
/// holes of site-to-site links). Anything else, a fragment, an IPv6 packet with extension
/// headers, or options that do not parse, is left alone. Returns whether it changed the
/// packet. The packet's checksums must be complete (not left to an offload).
pub fn clamp_mss(packet: &mut [u8], mss: (u16, u16)) -> bool {
    let (tcp_at, limit) = match packet.first().map(|b| b >> 4) {
        Some(4) if packet.len() >= 20 => {
            let header = usize::from(packet[0] & 0x0f) * 4;
            let fragment = u16::from_be_bytes([packet[6], packet[7]]) & 0x3fff != 0;
            if packet[9] != 6 || fragment || header < 20 {
                return false;
            }
            (header, mss.0)
        }
        Some(6) if packet.len() >= 40 && packet[6] == 6 => (40, mss.1),
        _ => return false,
    };
    let Some(tcp) = packet.get_mut(tcp_at..) else {
        return false;
    };
    if tcp.len() < 20 || tcp[13] & 0x02 == 0 {
        return false;
    }
    let header = usize::from(tcp[12] >> 4) * 4;
    if header < 20 || header > tcp.len() {
        return false;
    }
    let mut at = 20;
    while at < header {
        match tcp[at] {
            0 => return false,
            1 => at += 1,
            kind => {
                let Some(&len) = tcp.get(at + 1) else {
                    return false;
                };
                let len = usize::from(len);
                if len < 2 || at + len > header {
                    return false;
                }
                if kind == 2 && len == 4 {
                    let old = u16::from_be_bytes([tcp[at + 2], tcp[at + 3]]);
                    if old <= limit {
                        return false;
                    }
                    tcp[at + 2..at + 4].copy_from_slice(&limit.to_be_bytes());
                    // The checksum sums 16-bit words from the header's start: a value at an
                    // odd offset straddles two words, which adds up as its bytes swapped.
                    let (old, new) = if (at + 2) % 2 == 0 {
                        (old, limit)
                    } else {
                        (old.swap_bytes(), limit.swap_bytes())
                    };
                    let check = u16::from_be_bytes([tcp[16], tcp[17]]);
                    let mut sum = u32::from(!check) + u32::from(!old) + u32::from(new);
                    while sum > 0xffff {
                        sum = (sum & 0xffff) + (sum >> 16);
                    }
                    tcp[16..18].copy_from_slice(&(!(sum as u16)).to_be_bytes());
                    return true;
                }
                at += len;
            }
        }
    }
    false
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

    /// A TCP SYN from 10.0.0.1 to 10.0.0.2 (or over IPv6) with `options`, checksums right.
    fn syn(v6: bool, options: &[u8]) -> Vec<u8> {
        let tcp_len = 20 + options.len();
        let ip_len = if v6 { 40 } else { 20 };
        let mut p = vec![0u8; ip_len + tcp_len];
        if v6 {
            p[0] = 0x60;
            p[4..6].copy_from_slice(&(tcp_len as u16).to_be_bytes());
            p[6] = 6;
            p[7] = 64;
            p[8..24].copy_from_slice(&"fd00::1".parse::<Ipv6Addr>().unwrap().octets());
            p[24..40].copy_from_slice(&"fd00::2".parse::<Ipv6Addr>().unwrap().octets());
        } else {
            p[0] = 0x45;
            p[2..4].copy_from_slice(&((20 + tcp_len) as u16).to_be_bytes());
            p[8] = 64;
            p[9] = 6;
            p[12..16].copy_from_slice(&[10, 0, 0, 1]);
            p[16..20].copy_from_slice(&[10, 0, 0, 2]);
        }
        let t = &mut p[ip_len..];
        t[0..2].copy_from_slice(&40000u16.to_be_bytes());
        t[2..4].copy_from_slice(&443u16.to_be_bytes());
        t[12] = ((tcp_len / 4) as u8) << 4;
        t[13] = 0x02;
        t[14..16].copy_from_slice(&64240u16.to_be_bytes());
        t[20..].copy_from_slice(options);
        let sum = tcp_checksum(&p, v6);
        p[ip_len + 16..ip_len + 18].copy_from_slice(&sum.to_be_bytes());
        p
    }

    /// The TCP checksum of `p` computed from scratch (its checksum field taken as zero).
    fn tcp_checksum(p: &[u8], v6: bool) -> u16 {
        let ip_len = if v6 { 40 } else { 20 };
        let tcp = &p[ip_len..];
        let mut words: Vec<u8> = Vec::new();
        if v6 {
            words.extend_from_slice(&p[8..40]);
            words.extend_from_slice(&(tcp.len() as u32).to_be_bytes());
            words.extend_from_slice(&[0, 0, 0, 6]);
        } else {
            words.extend_from_slice(&p[12..20]);
            words.extend_from_slice(&[0, 6]);
            words.extend_from_slice(&(tcp.len() as u16).to_be_bytes());
        }
        let mut t = tcp.to_vec();
        t[16] = 0;
        t[17] = 0;
        words.extend_from_slice(&t);
        let mut sum = 0u32;
        for pair in words.chunks(2) {
            sum += u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]));
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    fn mss_of(p: &[u8], v6: bool) -> u16 {
        let ip_len = if v6 { 40 } else { 20 };
        let t = &p[ip_len..];
        let mut at = 20;
        while at < usize::from(t[12] >> 4) * 4 {
            match t[at] {
                1 => at += 1,
                2 => return u16::from_be_bytes([t[at + 2], t[at + 3]]),
                _ => at += usize::from(t[at + 1]),
            }
        }
        0
    }

    #[test]
    fn a_syn_is_clamped_with_its_checksum_right_at_any_alignment() {
        let mss = mss_for_mtu(1420);
        assert_eq!(mss, (1380, 1360));
        for v6 in [false, true] {
            // MSS first (even offset), after one NOP (odd offset), after SACK-permitted.
            for options in [
                &[2, 4, 0x05, 0xb4, 1, 1, 4, 2][..],
                &[1, 2, 4, 0x05, 0xb4, 1, 4, 2][..],
                &[4, 2, 1, 2, 4, 0x05, 0xb4, 0, 0, 0, 0, 0][..],
            ] {
                let mut p = syn(v6, options);
                assert!(clamp_mss(&mut p, mss), "{options:?}");
                assert_eq!(mss_of(&p, v6), if v6 { 1360 } else { 1380 });
                let ip_len = if v6 { 40 } else { 20 };
                assert_eq!(
                    u16::from_be_bytes([p[ip_len + 16], p[ip_len + 17]]),
                    tcp_checksum(&p, v6),
                    "checksum after clamping {options:?} (v6: {v6})"
                );
            }
        }
    }

    #[test]
    fn what_needs_no_clamp_is_left_alone() {
        let mss = mss_for_mtu(1420);
        // Already small enough.
        let mut small = syn(false, &[2, 4, 0x04, 0x00]);
        let before = small.clone();
        assert!(!clamp_mss(&mut small, mss));
        assert_eq!(small, before);
        // Not a SYN.
        let mut ack = syn(false, &[2, 4, 0x05, 0xb4]);
        ack[20 + 13] = 0x10;
        assert!(!clamp_mss(&mut ack, mss));
        // UDP, a fragment, truncated options, garbage: unchanged, no panic.
        let mut udp = syn(false, &[2, 4, 0x05, 0xb4]);
        udp[9] = 17;
        assert!(!clamp_mss(&mut udp, mss));
        let mut frag = syn(false, &[2, 4, 0x05, 0xb4]);
        frag[6] = 0x20;
        assert!(!clamp_mss(&mut frag, mss));
        let mut cut = syn(false, &[1, 1, 1, 2]);
        assert!(!clamp_mss(&mut cut, mss));
        let full = syn(true, &[4, 2, 2, 4, 0x05, 0xb4, 1, 1]);
        for len in 0..full.len() {
            let mut p = full[..len].to_vec();
            let _ = clamp_mss(&mut p, mss);
        }
        for seed in 0..2000u32 {
            let mut p: Vec<u8> = (0..64u32)
                .map(|i| (seed.wrapping_mul(2_654_435_761).wrapping_add(i * 97) >> 7) as u8)
                .collect();
            p[0] = if seed % 2 == 0 { 0x45 } else { 0x60 };
            let _ = clamp_mss(&mut p, mss);
        }
    }
}
