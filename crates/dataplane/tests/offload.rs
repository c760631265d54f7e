//! Segmentation and coalescing of TUN super-packets, checked packet by packet: headers,
//! checksums, sequence numbers and flags of every segment, and the round trip segments →
//! coalesced super-packet → segments giving back exactly what went in.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use tunneld_dataplane::offload::{
    checksum_add, checksum_fold, segment, Coalescer, OffloadError, VnetHdr, F_DATA_VALID,
    F_NEEDS_CSUM, GSO_NONE, GSO_TCPV4, GSO_TCPV6, GSO_UDP, GSO_UDP_L4,
};
use tunneld_dataplane::{Batch, FRAME_PAYLOAD};

const ACK: u8 = 0x10;
const PSH: u8 = 0x08;
const FIN: u8 = 0x01;
const CWR: u8 = 0x80;
const SYN: u8 = 0x02;

const V4_SRC: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 1, 0, 1));
const V4_DST: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 1, 0, 2));
const V6_SRC: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1));
const V6_DST: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2));
const ANY: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);

/// A TCP or UDP packet, described by its fields.
#[derive(Clone)]
struct Spec {
    src: IpAddr,
    dst: IpAddr,
    proto: u8,
    sport: u16,
    dport: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    window: u16,
    /// TCP options (a multiple of 4 bytes).
    options: Vec<u8>,
    ip_id: u16,
    payload: Vec<u8>,
}

impl Spec {
    fn tcp(src: IpAddr, dst: IpAddr, payload: Vec<u8>) -> Spec {
        Spec {
            src,
            dst,
            proto: 6,
            sport: 40000,
            dport: 5201,
            seq: 1_000_000,
            ack: 77,
            flags: ACK,
            window: 500,
            // NOP NOP timestamp, as Linux sends.
            options: vec![1, 1, 8, 10, 0, 0, 1, 0, 0, 0, 2, 0],
            ip_id: 0x1234,
            payload,
        }
    }

    fn udp(src: IpAddr, dst: IpAddr, payload: Vec<u8>) -> Spec {
        Spec {
            proto: 17,
            options: Vec::new(),
            ..Spec::tcp(src, dst, payload)
        }
    }

    fn v6(&self) -> bool {
        self.src.is_ipv6()
    }

    fn ip_hl(&self) -> usize {
        if self.v6() {
            40
        } else {
            20
        }
    }

    fn l4_hl(&self) -> usize {
        if self.proto == 6 {
            20 + self.options.len()
        } else {
            8
        }
    }

    fn hl(&self) -> usize {
        self.ip_hl() + self.l4_hl()
    }

    /// The packet with correct lengths and checksums (a partial checksum with `partial`: the
    /// pseudo-header sum only, as the kernel leaves it for offload).
    fn build(&self, partial: bool) -> Vec<u8> {
        let l4_len = self.l4_hl() + self.payload.len();
        let mut p = Vec::new();
        match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                p.extend_from_slice(&[0x45, 0]);
                p.extend_from_slice(&((20 + l4_len) as u16).to_be_bytes());
                p.extend_from_slice(&self.ip_id.to_be_bytes());
                p.extend_from_slice(&[0x40, 0, 64, self.proto, 0, 0]);
                p.extend_from_slice(&s.octets());
                p.extend_from_slice(&d.octets());
                let c = !checksum_fold(checksum_add(0, &p));
                p[10..12].copy_from_slice(&c.to_be_bytes());
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                p.extend_from_slice(&[0x60, 0, 0, 0]);
                p.extend_from_slice(&(l4_len as u16).to_be_bytes());
                p.extend_from_slice(&[self.proto, 64]);
                p.extend_from_slice(&s.octets());
                p.extend_from_slice(&d.octets());
            }
            _ => panic!("mixed families"),
        }
        let l4 = p.len();
        p.extend_from_slice(&self.sport.to_be_bytes());
        p.extend_from_slice(&self.dport.to_be_bytes());
        if self.proto == 6 {
            p.extend_from_slice(&self.seq.to_be_bytes());
            p.extend_from_slice(&self.ack.to_be_bytes());
            p.push(((self.l4_hl() / 4) as u8) << 4);
            p.push(self.flags);
            p.extend_from_slice(&self.window.to_be_bytes());
            p.extend_from_slice(&[0, 0, 0, 0]);
            p.extend_from_slice(&self.options);
        } else {
            p.extend_from_slice(&(l4_len as u16).to_be_bytes());
            p.extend_from_slice(&[0, 0]);
        }
        p.extend_from_slice(&self.payload);
        let at = l4 + if self.proto == 6 { 16 } else { 6 };
        let pseudo = pseudo_sum(&p, self.v6(), self.proto, l4_len);
        let field = if partial {
            checksum_fold(pseudo)
        } else {
            match !checksum_fold(pseudo + checksum_add(0, &p[l4..])) {
                0 => 0xffff,
                c => c,
            }
        };
        p[at..at + 2].copy_from_slice(&field.to_be_bytes());
        p
    }

    fn gso_hdr(&self, gso_size: u16) -> VnetHdr {
        VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: match (self.proto, self.v6()) {
                (6, false) => GSO_TCPV4,
                (6, true) => GSO_TCPV6,
                _ => GSO_UDP_L4,
            },
            hdr_len: self.hl() as u16,
            gso_size,
            csum_start: self.ip_hl() as u16,
            csum_offset: if self.proto == 6 { 16 } else { 6 },
        }
    }
}

fn pseudo_sum(p: &[u8], v6: bool, proto: u8, l4_len: usize) -> u64 {
    let addrs = if v6 { &p[8..40] } else { &p[12..20] };
    checksum_add(0, addrs) + u64::from(proto) + l4_len as u64
}

/// Checks a packet's IP length field and its transport (and IPv4 header) checksum.
fn assert_valid(p: &[u8], what: &str) {
    let v6 = p[0] >> 4 == 6;
    let (ip_hl, proto) = if v6 {
        assert_eq!(
            usize::from(u16::from_be_bytes([p[4], p[5]])) + 40,
            p.len(),
            "{what}: IPv6 payload length"
        );
        (40, p[6])
    } else {
        assert_eq!(
            usize::from(u16::from_be_bytes([p[2], p[3]])),
            p.len(),
            "{what}: IPv4 total length"
        );
        assert_eq!(
            checksum_fold(checksum_add(0, &p[..20])),
            0xffff,
            "{what}: IPv4 header checksum"
        );
        (20, p[9])
    };
    let sum = pseudo_sum(p, v6, proto, p.len() - ip_hl) + checksum_add(0, &p[ip_hl..]);
    assert_eq!(checksum_fold(sum), 0xffff, "{what}: transport checksum");
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Runs `segment` on `packet` and returns copies of what it emitted.
fn segments_of(packet: &[u8], hdr: &VnetHdr) -> Result<Vec<Vec<u8>>, OffloadError> {
    let mut frame = vec![0u8; FRAME_PAYLOAD];
    frame[..packet.len()].copy_from_slice(packet);
    let mut scratch = vec![0u8; FRAME_PAYLOAD];
    let mut out = Vec::new();
    let n = segment(&mut frame, packet.len(), hdr, &mut scratch, |buf, len| {
        assert!(buf.len() >= len + 16, "room for padding after the packet");
        out.push(buf[..len].to_vec());
    })?;
    assert_eq!(n, out.len());
    Ok(out)
}

#[test]
fn vnet_header_round_trips() {
    let hdr = VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: GSO_TCPV6,
        hdr_len: 72,
        gso_size: 1368,
        csum_start: 40,
        csum_offset: 16,
    };
    assert_eq!(VnetHdr::decode(&hdr.encode()), hdr);
    assert!(VnetHdr::default().is_plain());
    assert!(!hdr.is_plain());
}

#[test]
fn segments_at_most_bounds_what_segment_cuts() {
    assert_eq!(VnetHdr::default().segments_at_most(65_000), 1);
    let gso = 1368;
    for (src, dst) in [(V4_SRC, V4_DST), (V6_SRC, V6_DST)] {
        for (segments, tail) in [(0, 1), (1, 0), (2, 1), (47, 0), (46, 828), (46, 1367)] {
            let spec = Spec::tcp(src, dst, pattern(gso * segments + tail, 5));
            let packet = spec.build(true);
            let hdr = spec.gso_hdr(gso as u16);
            let cut = segments_of(&packet, &hdr).unwrap().len();
            let bound = hdr.segments_at_most(packet.len());
            assert!(
                (cut..=cut + 1).contains(&bound),
                "{segments} segments + {tail} bytes: cut into {cut}, bound {bound}"
            );
        }
    }
}

#[test]
fn tcp_super_packets_split_like_the_kernel() {
    for (src, dst) in [(V4_SRC, V4_DST), (V6_SRC, V6_DST)] {
        let gso = 1368usize;
        let payload = pattern(gso * 7 + 100, 3);
        let mut spec = Spec::tcp(src, dst, payload.clone());
        spec.flags = ACK | PSH | FIN | CWR;
        let packet = spec.build(true);
        let segs = segments_of(&packet, &spec.gso_hdr(gso as u16)).unwrap();
        assert_eq!(segs.len(), 8);
        let mut joined = Vec::new();
        for (k, s) in segs.iter().enumerate() {
            let what = format!("{src} segment {k}");
            assert_valid(s, &what);
            let l4 = spec.ip_hl();
            let seq = u32::from_be_bytes(s[l4 + 4..l4 + 8].try_into().unwrap());
            assert_eq!(seq, spec.seq + (k * gso) as u32, "{what}: sequence");
            let flags = s[l4 + 13];
            let last = k == segs.len() - 1;
            assert_eq!(
                flags & (PSH | FIN) != 0,
                last,
                "{what}: PSH/FIN only on the last"
            );
            assert_eq!(flags & CWR != 0, k == 0, "{what}: CWR only on the first");
            assert_eq!(flags & ACK, ACK);
            assert_eq!(
                &s[l4 + 20..spec.hl()],
                &spec.options[..],
                "{what}: options kept"
            );
            if !spec.v6() {
                let id = u16::from_be_bytes([s[4], s[5]]);
                assert_eq!(id, spec.ip_id + k as u16, "{what}: IPv4 id increments");
            }
            assert_eq!(s.len(), spec.hl() + if last { 100 } else { gso });
            joined.extend_from_slice(&s[spec.hl()..]);
        }
        assert_eq!(joined, payload, "the payload, in order, nothing lost");
    }
}

#[test]
fn udp_super_packets_split_into_datagrams() {
    for (src, dst) in [(V4_SRC, V4_DST), (V6_SRC, V6_DST)] {
        let gso = 1200usize;
        let payload = pattern(gso * 3 + 1, 9);
        let spec = Spec::udp(src, dst, payload.clone());
        let segs = segments_of(&spec.build(true), &spec.gso_hdr(gso as u16)).unwrap();
        assert_eq!(segs.len(), 4);
        for (k, s) in segs.iter().enumerate() {
            assert_valid(s, &format!("{src} datagram {k}"));
            let l4 = spec.ip_hl();
            let udp_len = usize::from(u16::from_be_bytes([s[l4 + 4], s[l4 + 5]]));
            assert_eq!(udp_len, s.len() - l4, "UDP length");
            let start = k * gso;
            assert_eq!(
                &s[spec.hl()..],
                &payload[start..(start + gso).min(payload.len())]
            );
        }
    }
}

#[test]
fn partial_checksums_are_completed_and_plain_packets_pass_untouched() {
    for spec in [
        Spec::tcp(V4_SRC, V4_DST, pattern(333, 1)),
        Spec::udp(V6_SRC, V6_DST, pattern(77, 2)),
    ] {
        let partial = spec.build(true);
        let mut hdr = spec.gso_hdr(0);
        hdr.gso_type = GSO_NONE;
        let out = segments_of(&partial, &hdr).unwrap();
        assert_eq!(out, vec![spec.build(false)], "checksum completed in place");
        assert_valid(&out[0], "completed");
        let plain = segments_of(&partial, &VnetHdr::default()).unwrap();
        assert_eq!(
            plain,
            vec![partial.clone()],
            "a plain packet is not touched"
        );
    }
}

#[test]
fn a_super_packet_that_lies_is_refused_not_trusted() {
    let spec = Spec::tcp(V4_SRC, V4_DST, pattern(4000, 5));
    let packet = spec.build(true);
    let good = spec.gso_hdr(1000);
    let refused = |hdr: VnetHdr, packet: &[u8]| segments_of(packet, &hdr).unwrap_err();

    assert_eq!(
        refused(
            VnetHdr {
                gso_size: 0,
                ..good
            },
            &packet
        ),
        OffloadError::ZeroSegmentSize
    );
    assert_eq!(
        refused(
            VnetHdr {
                gso_type: GSO_UDP,
                ..good
            },
            &packet
        ),
        OffloadError::UnknownGsoType(GSO_UDP)
    );
    assert_eq!(
        refused(
            VnetHdr {
                gso_type: GSO_TCPV6,
                ..good
            },
            &packet
        ),
        OffloadError::Mismatch,
        "an IPv4 packet sent as TCPv6"
    );
    assert_eq!(
        refused(
            VnetHdr {
                gso_type: GSO_UDP_L4,
                ..good
            },
            &packet
        ),
        OffloadError::Mismatch,
        "a TCP packet sent as UDP"
    );
    assert_eq!(refused(good, &packet[..30]), OffloadError::Truncated);
    let mut bad_doff = packet.clone();
    bad_doff[32] = 0xf0; // 60 bytes of TCP header claimed, the packet is long enough...
    assert!(segments_of(&bad_doff, &good).is_ok());
    assert_eq!(
        refused(good, &bad_doff[..70]),
        OffloadError::Truncated,
        "...not here"
    );
    let csum_beyond = VnetHdr {
        gso_type: GSO_NONE,
        csum_start: 4040, // + csum_offset 16 + 2 is past the 4052 bytes
        ..good
    };
    assert_eq!(refused(csum_beyond, &packet), OffloadError::Truncated);
    // The header's hdr_len is a hint only: a wrong one changes nothing.
    let hinted = segments_of(&packet, &VnetHdr { hdr_len: 3, ..good }).unwrap();
    assert_eq!(hinted, segments_of(&packet, &good).unwrap());
}

#[test]
fn random_headers_and_packets_never_panic() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let base = [
        Spec::tcp(V4_SRC, V4_DST, pattern(3000, 1)).build(true),
        Spec::udp(V6_SRC, V6_DST, pattern(3000, 2)).build(true),
    ];
    for round in 0..20_000 {
        let mut packet = base[round % 2].clone();
        let len = (next() as usize) % (packet.len() + 1);
        packet.truncate(len);
        for _ in 0..(next() % 4) {
            if !packet.is_empty() {
                let at = (next() as usize) % packet.len();
                packet[at] = next() as u8;
            }
        }
        let raw: [u8; 10] = std::array::from_fn(|_| next() as u8);
        let mut hdr = VnetHdr::decode(&raw);
        hdr.gso_size %= 3000;
        hdr.gso_type = [GSO_NONE, GSO_TCPV4, GSO_TCPV6, GSO_UDP_L4, hdr.gso_type][round % 5];
        let _ = segments_of(&packet, &hdr);
    }
}

/// Plans `packets` as one batch and returns, per group, the header and the bytes a TUN write
/// would carry (head, then each member's payload), in write order.
fn coalesce(packets: &[Vec<u8>], udp: bool) -> Vec<(VnetHdr, Vec<u8>, Vec<usize>)> {
    let mut batch = Batch::new();
    for p in packets {
        batch.next_free().unwrap()[..p.len()].copy_from_slice(p);
        batch.commit(p.len(), ANY);
    }
    let mut coalescer = Coalescer::new(udp);
    let groups = coalescer.plan(&mut batch);
    let mut seen = vec![false; packets.len()];
    let written: Vec<_> = (0..groups)
        .map(|g| {
            let planned = coalescer.planned(g);
            let mut bytes = batch.payload(planned.head).to_vec();
            let mut frames = vec![planned.head];
            for m in coalescer.members(g) {
                bytes.extend_from_slice(&batch.payload(m)[planned.member_hl..]);
                frames.push(m);
            }
            assert_eq!(frames.len(), planned.count);
            for &f in &frames {
                assert!(!seen[f], "frame {f} written twice");
                seen[f] = true;
            }
            (planned.hdr, bytes, frames)
        })
        .collect();
    assert!(seen.iter().all(|&s| s), "every packet written");
    written
}

/// The segments of a TCP stream: `count` full segments of `mss` and one of `tail` bytes.
fn tcp_stream(src: IpAddr, dst: IpAddr, mss: usize, count: usize, tail: usize) -> Vec<Spec> {
    let mut seq = 5000u32;
    (0..=count)
        .map(|k| {
            let len = if k == count { tail } else { mss };
            let mut s = Spec::tcp(src, dst, pattern(len, k as u8));
            s.seq = seq;
            s.ip_id = 100 + k as u16;
            seq = seq.wrapping_add(len as u32);
            s
        })
        .filter(|s| !s.payload.is_empty())
        .collect()
}

#[test]
fn segments_of_a_flow_coalesce_and_split_back_exactly() {
    for (src, dst) in [(V4_SRC, V4_DST), (V6_SRC, V6_DST)] {
        let specs = tcp_stream(src, dst, 1368, 20, 500);
        let packets: Vec<Vec<u8>> = specs.iter().map(|s| s.build(false)).collect();
        let written = coalesce(&packets, false);
        assert_eq!(written.len(), 1, "one super-packet");
        let (hdr, bytes, frames) = &written[0];
        assert_eq!(frames, &(0..packets.len()).collect::<Vec<_>>());
        assert_eq!(
            hdr.gso_type,
            if src.is_ipv6() { GSO_TCPV6 } else { GSO_TCPV4 }
        );
        assert_eq!(hdr.gso_size, 1368);
        assert_eq!(hdr.flags, F_NEEDS_CSUM);
        assert_eq!(usize::from(hdr.hdr_len), specs[0].hl());
        // What the kernel does with it: segment it again. It must give back the originals.
        let again = segments_of(bytes, hdr).unwrap();
        assert_eq!(again, packets, "{src}: round trip");
    }
}

#[test]
fn udp_datagrams_coalesce_only_when_the_kernel_takes_uso() {
    let mut packets: Vec<Vec<u8>> = (0..5)
        .map(|k| Spec::udp(V4_SRC, V4_DST, pattern(1000, k)).build(false))
        .collect();
    packets.push(Spec::udp(V4_SRC, V4_DST, pattern(10, 9)).build(false));
    let written = coalesce(&packets, true);
    assert_eq!(written.len(), 1);
    let (hdr, bytes, _) = &written[0];
    assert_eq!((hdr.gso_type, hdr.gso_size), (GSO_UDP_L4, 1000));
    let again = segments_of(bytes, hdr).unwrap();
    // Segmenting gives new IPv4 ids (id + k), as the kernel's USO does; compare the rest.
    assert_eq!(again.len(), packets.len());
    for (a, p) in again.iter().zip(&packets) {
        assert_eq!(a[20..], p[20..], "UDP header and payload");
        assert_valid(a, "datagram");
    }
    let alone = coalesce(&packets, false);
    assert_eq!(alone.len(), packets.len(), "no USO: each datagram alone");
    assert!(alone.iter().all(|(h, _, _)| h.flags == F_DATA_VALID));
}

#[test]
fn only_what_continues_a_flow_joins_it() {
    let specs = tcp_stream(V4_SRC, V4_DST, 1000, 4, 0);
    let base: Vec<Vec<u8>> = specs.iter().map(|s| s.build(false)).collect();
    let groups = |packets: &[Vec<u8>]| -> Vec<Vec<usize>> {
        coalesce(packets, true)
            .into_iter()
            .map(|(_, _, f)| f)
            .collect()
    };
    assert_eq!(groups(&base), vec![vec![0, 1, 2, 3]]);

    // A gap in the sequence.
    let mut gap = specs.clone();
    gap[2].seq += 1;
    let packets: Vec<_> = gap.iter().map(|s| s.build(false)).collect();
    assert_eq!(groups(&packets), vec![vec![0, 1], vec![2], vec![3]]);

    // A different ACK number, window or options: not the same segment train.
    for change in 0..3 {
        let mut other = specs.clone();
        match change {
            0 => other[2].ack += 1,
            1 => other[2].window += 1,
            _ => other[2].options[11] ^= 1,
        }
        let packets: Vec<_> = other.iter().map(|s| s.build(false)).collect();
        assert_eq!(groups(&packets)[0], vec![0, 1], "change {change}");
    }

    // PSH ends a group (it joins it); a short segment too.
    let mut push = specs.clone();
    push[1].flags = ACK | PSH;
    let packets: Vec<_> = push.iter().map(|s| s.build(false)).collect();
    assert_eq!(groups(&packets), vec![vec![0, 1], vec![2, 3]]);

    // SYN, FIN and pure ACKs go alone, and nothing after them is written before them.
    let mut fin = specs.clone();
    fin[2].flags = ACK | FIN;
    let packets: Vec<_> = fin.iter().map(|s| s.build(false)).collect();
    assert_eq!(groups(&packets), vec![vec![0, 1], vec![2], vec![3]]);
    let mut syn = specs.clone();
    syn[0].flags = SYN;
    let packets: Vec<_> = syn.iter().map(|s| s.build(false)).collect();
    assert_eq!(groups(&packets), vec![vec![0], vec![1, 2, 3]]);
    let mut with_ack = base.clone();
    let mut pure_ack = specs[2].clone();
    pure_ack.payload.clear();
    with_ack.insert(2, pure_ack.build(false));
    assert_eq!(groups(&with_ack), vec![vec![0, 1], vec![2], vec![3, 4]]);
}

#[test]
fn interleaved_flows_coalesce_separately_and_keep_their_order() {
    let a = tcp_stream(V4_SRC, V4_DST, 1200, 6, 0);
    let mut b = tcp_stream(V6_SRC, V6_DST, 1300, 6, 0);
    for s in &mut b {
        s.sport = 40001;
    }
    let mut packets = Vec::new();
    for k in 0..6 {
        packets.push(a[k].build(false));
        packets.push(b[k].build(false));
        if k == 3 {
            packets.push(vec![0x45, 0, 0, 4]); // not even a whole IP header
        }
    }
    let written = coalesce(&packets, true);
    let frames: Vec<Vec<usize>> = written.iter().map(|(_, _, f)| f.clone()).collect();
    assert_eq!(
        frames,
        vec![vec![0, 2, 4, 6, 9, 11], vec![1, 3, 5, 7, 10, 12], vec![8]]
    );
    assert_eq!(
        written[2].0,
        VnetHdr::default(),
        "garbage gets a plain header"
    );
    for (hdr, bytes, frames) in &written[..2] {
        let originals: Vec<Vec<u8>> = frames.iter().map(|&f| packets[f].clone()).collect();
        assert_eq!(segments_of(bytes, hdr).unwrap(), originals);
    }
}

#[test]
fn a_disabled_kind_is_no_longer_coalesced() {
    let packets: Vec<Vec<u8>> = tcp_stream(V4_SRC, V4_DST, 1000, 4, 0)
        .iter()
        .map(|s| s.build(false))
        .collect();
    let mut coalescer = Coalescer::new(true);
    assert!(coalescer.disable(GSO_TCPV6), "TCP was on");
    assert!(
        !coalescer.disable(GSO_TCPV4),
        "TCP (v4 and v6 together) already off"
    );
    let mut batch = Batch::new();
    for p in &packets {
        batch.next_free().unwrap()[..p.len()].copy_from_slice(p);
        batch.commit(p.len(), ANY);
    }
    assert_eq!(
        coalescer.plan(&mut batch),
        packets.len(),
        "each packet alone"
    );
    for (i, p) in packets.iter().enumerate() {
        assert_eq!(batch.payload(i), &p[..], "headers untouched");
        assert_eq!(coalescer.planned(i).hdr.flags, F_DATA_VALID);
    }
}

#[test]
fn segments_shorter_than_their_headers_are_built_aside() {
    // 52 bytes of IPv4 + TCP headers with timestamps, 30-byte segments: cutting in place would
    // overwrite what is not yet sent, so the scratch buffer is used; the result is the same.
    let payload = pattern(30 * 5 + 7, 4);
    let spec = Spec::tcp(V4_SRC, V4_DST, payload.clone());
    let segs = segments_of(&spec.build(true), &spec.gso_hdr(30)).unwrap();
    assert_eq!(segs.len(), 6);
    let mut joined = Vec::new();
    for (k, s) in segs.iter().enumerate() {
        assert_valid(s, &format!("segment {k}"));
        joined.extend_from_slice(&s[spec.hl()..]);
    }
    assert_eq!(joined, payload);
}
