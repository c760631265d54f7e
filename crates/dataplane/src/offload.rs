//! TUN offloads in user space.
//!
//! With `IFF_VNET_HDR` every packet on the TUN descriptor has a `virtio_net_hdr` in front. With
//! `TUNSETOFFLOAD` the kernel may then hand tunneld a *super-packet*: one TCP or UDP packet of
//! up to 64 KiB whose payload stands for many MTU-sized segments (TSO/USO), with its checksum
//! left to finish (`NEEDS_CSUM`). WireGuard peers expect ordinary packets, so [`segment`] cuts
//! it into the packets the kernel would have sent, with correct headers and checksums, before
//! encryption.
//!
//! The other way, [`Coalescer`] groups the decrypted packets of a batch that continue one TCP
//! (or UDP) flow into one super-packet for the kernel (GRO), so its stack handles one large
//! packet instead of dozens. A group is written with one `writev` of the head packet and the
//! payloads of the rest, so coalescing copies nothing.
//!
//! Both follow the kernel's rules (`virtio_net_hdr_to_skb`, `tcp_gro_receive`,
//! `__udp_gso_segment`) as far as they matter for a tunnel; the parsers never trust a length
//! they have not checked, because a fuzzer feeds them (see `fuzz/`).

use crate::{Batch, BATCH_SIZE};
use std::fmt;

/// Size of the `virtio_net_hdr` the TUN device reads and writes (the default TUNSETVNETHDRSZ).
pub const VNET_HDR_LEN: usize = 10;

/// The checksum from `csum_start` to the end is left to compute (`VIRTIO_NET_HDR_F_NEEDS_CSUM`).
pub const F_NEEDS_CSUM: u8 = 1;
/// The checksum is known good; the kernel need not verify it (`VIRTIO_NET_HDR_F_DATA_VALID`).
pub const F_DATA_VALID: u8 = 2;

pub const GSO_NONE: u8 = 0;
pub const GSO_TCPV4: u8 = 1;
/// IP fragmentation offload; tunneld never enables it, so it is refused.
pub const GSO_UDP: u8 = 3;
pub const GSO_TCPV6: u8 = 4;
pub const GSO_UDP_L4: u8 = 5;
/// Set with a TCP type when the segments carry ECN's CWR bit (only the first keeps it).
pub const GSO_ECN: u8 = 0x80;

const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_ACK: u8 = 0x10;
const TCP_CWR: u8 = 0x80;
/// Room after an emitted packet for WireGuard's padding (to a multiple of 16).
const PAD_ROOM: usize = 16;
/// The longest headers a segment can have: IPv4 with options (60) and TCP with options (60).
const MAX_HEADERS: usize = 120;
/// An IP packet carries at most this many bytes (the IPv4 total length is 16 bits; IPv6 jumbo
/// payloads are not used on a tunnel).
const MAX_IP_LEN: usize = 65_535;

/// The header the TUN device puts in front of each packet (native byte order, as the kernel
/// uses for TUN unless told otherwise).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VnetHdr {
    pub flags: u8,
    pub gso_type: u8,
    /// Length of the headers (IP + transport); a hint, never trusted: the packet says.
    pub hdr_len: u16,
    /// Payload bytes per segment.
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VnetHdr {
    pub fn decode(b: &[u8; VNET_HDR_LEN]) -> VnetHdr {
        let u16_at = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u16_at(2),
            gso_size: u16_at(4),
            csum_start: u16_at(6),
            csum_offset: u16_at(8),
        }
    }

    pub fn encode(&self) -> [u8; VNET_HDR_LEN] {
        let mut b = [0u8; VNET_HDR_LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_ne_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_ne_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_ne_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_ne_bytes());
        b
    }

    /// Nothing to do: an ordinary packet with its checksums in place.
    pub fn is_plain(&self) -> bool {
        self.gso_type == GSO_NONE && self.flags & F_NEEDS_CSUM == 0
    }

    /// How many packets a `len`-byte packet with this header becomes, at most: one when it
    /// is not a super-packet. (Counting the headers as payload makes it an upper bound
    /// without parsing them.)
    pub fn segments_at_most(&self, len: usize) -> usize {
        if self.gso_type == GSO_NONE || self.gso_size == 0 {
            1
        } else {
            len.div_ceil(usize::from(self.gso_size)).max(1)
        }
    }
}

/// Why a packet from the TUN could not be segmented; the packet is dropped and counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffloadError {
    /// A GSO type tunneld did not enable (or does not know).
    UnknownGsoType(u8),
    /// The GSO type and the packet's IP version or protocol disagree.
    Mismatch,
    /// A header or the checksum position lies beyond the packet.
    Truncated,
    /// A GSO packet with a segment size of zero.
    ZeroSegmentSize,
    /// A segment would not fit the scratch buffer.
    TooLarge,
}

impl fmt::Display for OffloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OffloadError::UnknownGsoType(t) => write!(f, "unsupported GSO type {t:#x}"),
            OffloadError::Mismatch => f.write_str("GSO type does not match the packet"),
            OffloadError::Truncated => f.write_str("headers or checksum beyond the packet"),
            OffloadError::ZeroSegmentSize => f.write_str("GSO packet with segment size 0"),
            OffloadError::TooLarge => f.write_str("segment larger than the buffer"),
        }
    }
}

impl std::error::Error for OffloadError {}

/// Adds `data` to a ones' complement sum (RFC 1071) of big-endian 16-bit words.
///
/// The ones' complement sum does not depend on byte order (RFC 1071 section 2(B)): the bulk is
/// summed as native 32-bit words into a 64-bit accumulator (no byte swaps, so the compiler
/// can vectorise it, and no overflow for any buffer that fits in memory), folded, and swapped
/// once into big-endian order at the end.
pub fn checksum_add(sum: u64, data: &[u8]) -> u64 {
    let words = data.len() / 4 * 4;
    let folded = checksum_fold(native_sum(&data[..words]));
    let bulk = if cfg!(target_endian = "little") {
        folded.swap_bytes()
    } else {
        folded
    };
    // The tail starts at a multiple of 4 bytes, so it keeps its place in the 16-bit words.
    let rest = &data[words..];
    let mut tail = [0u8; 4];
    tail[..rest.len()].copy_from_slice(rest);
    sum + u64::from(bulk) + u64::from(u32::from_be_bytes(tail))
}

/// The sum of `data` (a multiple of 4 bytes) as native 32-bit words, with the widest vector
/// unit the CPU has: the loop is the same, compiled twice.
fn native_sum(data: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above), the only requirement of the call.
        return unsafe { native_sum_avx2(data) };
    }
    native_sum_portable(data)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn native_sum_avx2(data: &[u8]) -> u64 {
    native_sum_portable(data)
}

#[inline(always)]
fn native_sum_portable(data: &[u8]) -> u64 {
    data.chunks_exact(4)
        .map(|w| u64::from(u32::from_ne_bytes([w[0], w[1], w[2], w[3]])))
        .sum()
}

/// Folds a sum to 16 bits (not complemented).
pub fn checksum_fold(mut sum: u64) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// The sum of the TCP/UDP pseudo-header of `packet` (IPv4 or IPv6, addresses read from it)
/// for a transport length of `l4_len`.
fn pseudo_header_sum(packet: &[u8], v6: bool, proto: u8, l4_len: usize) -> u64 {
    let addrs = if v6 { &packet[8..40] } else { &packet[12..20] };
    checksum_add(0, addrs) + u64::from(proto) + l4_len as u64
}

/// Computes the IPv4 header checksum of `header` in place.
fn fix_ipv4_checksum(header: &mut [u8]) {
    header[10..12].fill(0);
    let sum = !checksum_fold(checksum_add(0, header));
    header[10..12].copy_from_slice(&sum.to_be_bytes());
}

/// The result of a finished transport checksum: 0 is sent as 0xffff (the same value in ones'
/// complement, and for UDP 0 would mean "no checksum").
fn finish(sum: u64) -> [u8; 2] {
    match !checksum_fold(sum) {
        0 => [0xff, 0xff],
        c => c.to_be_bytes(),
    }
}

/// The IP layout of a packet: version and where the transport header starts.
#[derive(Debug, Clone, Copy)]
struct Ip {
    v6: bool,
    /// Length of the IP header (the transport header starts here).
    hl: usize,
    proto: u8,
}

/// Parses the IP header of `packet` (IPv4 with options, IPv6 without extension headers).
fn parse_ip(packet: &[u8]) -> Option<Ip> {
    match packet.first()? >> 4 {
        4 => {
            let hl = usize::from(packet[0] & 0x0f) * 4;
            if hl < 20 || packet.len() < hl {
                return None;
            }
            Some(Ip {
                v6: false,
                hl,
                proto: packet[9],
            })
        }
        6 if packet.len() >= 40 => Some(Ip {
            v6: true,
            hl: 40,
            proto: packet[6],
        }),
        _ => None,
    }
}

/// Cuts the packet in `frame[..len]`, read from the TUN with `hdr`, into the packets it stands
/// for and hands each to `emit(buffer, len)`; the buffer has room after the packet for padding.
/// A plain packet is emitted in place; one that only needs its checksum gets it in place;
/// segments are built in place too, each over the tail of the one before, so `emit` must be
/// done with a buffer when it returns (the worker's encapsulation copies it out). `scratch`
/// (the largest segment plus 16 bytes) is used only for segments shorter than their headers.
/// The frame's contents are not kept.
///
/// Returns how many packets were emitted. On error nothing was emitted.
pub fn segment(
    frame: &mut [u8],
    len: usize,
    hdr: &VnetHdr,
    scratch: &mut [u8],
    mut emit: impl FnMut(&mut [u8], usize),
) -> Result<usize, OffloadError> {
    if len > frame.len() {
        return Err(OffloadError::Truncated);
    }
    let gso_type = hdr.gso_type & !GSO_ECN;
    if gso_type == GSO_NONE {
        if hdr.flags & F_NEEDS_CSUM != 0 {
            complete_checksum(&mut frame[..len], hdr)?;
        }
        emit(frame, len);
        return Ok(1);
    }
    let packet = &frame[..len];
    let ip = parse_ip(packet).ok_or(OffloadError::Truncated)?;
    let (v6, proto) = match gso_type {
        GSO_TCPV4 => (false, PROTO_TCP),
        GSO_TCPV6 => (true, PROTO_TCP),
        GSO_UDP_L4 => (ip.v6, PROTO_UDP),
        other => return Err(OffloadError::UnknownGsoType(other)),
    };
    if ip.v6 != v6 || ip.proto != proto {
        return Err(OffloadError::Mismatch);
    }
    let l4 = ip.hl;
    let hl = if proto == PROTO_TCP {
        let doff = usize::from(*packet.get(l4 + 12).ok_or(OffloadError::Truncated)? >> 4) * 4;
        if doff < 20 {
            return Err(OffloadError::Truncated);
        }
        l4 + doff
    } else {
        l4 + 8
    };
    if hl > len {
        return Err(OffloadError::Truncated);
    }
    let gso = usize::from(hdr.gso_size);
    if gso == 0 {
        return Err(OffloadError::ZeroSegmentSize);
    }
    let payload = len - hl;
    // Segment k's payload stays where it is, and its headers are written into the bytes just
    // before it: the tail of segment k-1's payload, already emitted. That needs a segment
    // at least as long as the headers (always, for real MSS values); otherwise each segment
    // is assembled in `scratch`.
    let in_place = gso >= hl && len + PAD_ROOM <= frame.len();
    if !in_place && hl + gso.min(payload) + PAD_ROOM > scratch.len() {
        return Err(OffloadError::TooLarge);
    }
    let mut template = [0u8; MAX_HEADERS];
    let template = template.get_mut(..hl).ok_or(OffloadError::TooLarge)?;
    template.copy_from_slice(&frame[..hl]);
    let count = payload.div_ceil(gso).max(1);
    let seq0 = u32::from_be_bytes(packet[l4 + 4..l4 + 8].try_into().unwrap_or_default());
    let id0 = u16::from_be_bytes([packet[4], packet[5]]);
    for k in 0..count {
        let payload_start = hl + k * gso;
        let plen = gso.min(len - payload_start);
        let seg_len = hl + plen;
        let (buf, start) = if in_place {
            (&mut *frame, payload_start - hl)
        } else {
            scratch[hl..seg_len].copy_from_slice(&frame[payload_start..payload_start + plen]);
            (&mut *scratch, 0)
        };
        let seg = &mut buf[start..start + seg_len];
        seg[..hl].copy_from_slice(template);
        if v6 {
            seg[4..6].copy_from_slice(&((seg_len - 40) as u16).to_be_bytes());
        } else {
            seg[2..4].copy_from_slice(&(seg_len as u16).to_be_bytes());
            seg[4..6].copy_from_slice(&id0.wrapping_add(k as u16).to_be_bytes());
            fix_ipv4_checksum(&mut seg[..l4]);
        }
        let csum_at = if proto == PROTO_TCP {
            let seq = seq0.wrapping_add((k * gso) as u32);
            seg[l4 + 4..l4 + 8].copy_from_slice(&seq.to_be_bytes());
            if k + 1 < count {
                seg[l4 + 13] &= !(TCP_FIN | TCP_PSH);
            }
            if k > 0 {
                seg[l4 + 13] &= !TCP_CWR;
            }
            l4 + 16
        } else {
            seg[l4 + 4..l4 + 6].copy_from_slice(&((seg_len - l4) as u16).to_be_bytes());
            l4 + 6
        };
        seg[csum_at..csum_at + 2].fill(0);
        let sum = pseudo_header_sum(seg, v6, proto, seg_len - l4) + checksum_add(0, &seg[l4..]);
        seg[csum_at..csum_at + 2].copy_from_slice(&finish(sum));
        // The emitted buffer has PAD_ROOM bytes after the segment for the WireGuard padding;
        // in place they are the start of the next segment's payload, so they are put back.
        let end = start + seg_len;
        let mut saved = [0u8; PAD_ROOM];
        saved.copy_from_slice(&buf[end..end + PAD_ROOM]);
        emit(&mut buf[start..end + PAD_ROOM], seg_len);
        buf[end..end + PAD_ROOM].copy_from_slice(&saved);
    }
    Ok(count)
}

/// Finishes a partial checksum: the field at `csum_start + csum_offset` holds the pseudo-header
/// sum, and the sum of everything from `csum_start` completes it.
fn complete_checksum(packet: &mut [u8], hdr: &VnetHdr) -> Result<(), OffloadError> {
    let start = usize::from(hdr.csum_start);
    let at = start + usize::from(hdr.csum_offset);
    if at + 2 > packet.len() {
        return Err(OffloadError::Truncated);
    }
    let sum = checksum_add(0, &packet[start..]);
    packet[at..at + 2].copy_from_slice(&finish(sum));
    Ok(())
}

/// What a packet is to the coalescer.
#[derive(Debug, Clone, Copy, Default)]
struct Flow {
    /// 0: not TCP or UDP (or not parseable); otherwise the GSO type a group of it has.
    gso_type: u8,
    /// A plain data packet that may join or start a group (TCP: only ACK, maybe PSH).
    mergeable: bool,
    v6: bool,
    /// Where the transport header starts and where the payload starts.
    l4: usize,
    hl: usize,
    payload: usize,
    /// TCP only: sequence number and flags.
    seq: u32,
    tcp_flags: u8,
}

/// A group of packets written as one: a head and the members that follow it.
#[derive(Debug, Clone, Copy, Default)]
struct Group {
    head: u8,
    tail: u8,
    count: u8,
    /// Payload bytes of the head: every member but the last carries exactly this many.
    gso_size: u16,
    /// Headers plus every member's payload.
    total: usize,
    /// No more members may join (the last was short, or had PSH/FIN, or a packet of the
    /// flow could not join).
    closed: bool,
}

/// Plans which packets of a batch are written together, and rewrites each head's headers for
/// it. Its tables are allocated once, with it.
#[derive(Debug)]
pub struct Coalescer {
    flows: [Flow; BATCH_SIZE],
    /// The next member of a frame's group, or `BATCH_SIZE` for none.
    next: [u8; BATCH_SIZE],
    groups: [Group; BATCH_SIZE],
    group_count: usize,
    /// Whether TCP segments may be coalesced (until the kernel refuses a TCP super-packet).
    tcp: bool,
    /// Whether UDP datagrams may be coalesced (the kernel accepted USO on the TUN).
    udp: bool,
}

/// One super-packet (or plain packet) to write: the header to put in front, the head frame,
/// and the frames whose payloads follow it.
#[derive(Debug, Clone, Copy)]
pub struct Planned {
    pub hdr: VnetHdr,
    pub head: usize,
    /// Bytes of headers in each member, skipped when writing it (its payload follows the head).
    pub member_hl: usize,
    pub count: usize,
}

impl Coalescer {
    pub fn new(udp: bool) -> Coalescer {
        Coalescer {
            flows: [Flow::default(); BATCH_SIZE],
            next: [BATCH_SIZE as u8; BATCH_SIZE],
            groups: [Group::default(); BATCH_SIZE],
            group_count: 0,
            tcp: true,
            udp,
        }
    }

    /// Stops coalescing packets of this GSO type (the kernel refused such a super-packet).
    /// Returns whether it was still on.
    pub fn disable(&mut self, gso_type: u8) -> bool {
        let on = match gso_type & !GSO_ECN {
            GSO_TCPV4 | GSO_TCPV6 => &mut self.tcp,
            GSO_UDP_L4 => &mut self.udp,
            _ => return false,
        };
        std::mem::replace(on, false)
    }

    /// Groups the packets of `batch` and rewrites the head of each group of two or more into a
    /// super-packet header. Afterwards `Coalescer::groups` lists what to write, in order;
    /// [`Coalescer::members`] the frames of one group after its head.
    pub fn plan(&mut self, batch: &mut Batch) -> usize {
        self.group_count = 0;
        for i in 0..batch.len() {
            self.next[i] = BATCH_SIZE as u8;
            let flow = classify(batch.payload(i), self.tcp, self.udp);
            self.flows[i] = flow;
            if flow.gso_type == 0 {
                self.start_group(i, true);
                continue;
            }
            // The open group of the same flow, if any: join it, or close it so that no later
            // packet of the flow can be written before this one.
            let mut joined = false;
            for g in 0..self.group_count {
                let group = self.groups[g];
                if group.closed {
                    continue;
                }
                let tail = usize::from(group.tail);
                let tail_flow = self.flows[tail];
                if tail_flow.gso_type != flow.gso_type
                    || !same_flow(batch.payload(tail), batch.payload(i), &tail_flow)
                {
                    continue;
                }
                if can_join(
                    &group,
                    &tail_flow,
                    &flow,
                    batch.payload(tail),
                    batch.payload(i),
                ) {
                    self.join(g, i, &flow);
                    joined = true;
                } else {
                    self.groups[g].closed = true;
                }
                break;
            }
            if !joined {
                let ends = !flow.mergeable || flow.tcp_flags & TCP_PSH != 0;
                self.start_group(i, ends || flow.payload == 0);
            }
        }
        for g in 0..self.group_count {
            self.finish_head(g, batch);
        }
        self.group_count
    }

    fn start_group(&mut self, i: usize, closed: bool) {
        let flow = &self.flows[i];
        self.groups[self.group_count] = Group {
            head: i as u8,
            tail: i as u8,
            count: 1,
            gso_size: flow.payload.min(usize::from(u16::MAX)) as u16,
            total: flow.hl + flow.payload,
            closed,
        };
        self.group_count += 1;
    }

    fn join(&mut self, g: usize, i: usize, flow: &Flow) {
        let group = &mut self.groups[g];
        self.next[usize::from(group.tail)] = i as u8;
        group.tail = i as u8;
        group.count += 1;
        group.total += flow.payload;
        if flow.payload < usize::from(group.gso_size) || flow.tcp_flags & TCP_PSH != 0 {
            group.closed = true;
        }
    }

    /// Rewrites the head of group `g` to stand for the whole group and works out its header.
    fn finish_head(&mut self, g: usize, batch: &mut Batch) {
        let group = self.groups[g];
        let head = usize::from(group.head);
        let flow = self.flows[head];
        if group.count == 1 {
            return;
        }
        // The last member's PSH (if any) belongs on the super-packet.
        let tail_flags = self.flows[usize::from(group.tail)].tcp_flags;
        let (frame, _) = batch.frame_mut(head);
        let packet = &mut frame[..flow.hl];
        if flow.v6 {
            packet[4..6].copy_from_slice(&((group.total - 40) as u16).to_be_bytes());
        } else {
            packet[2..4].copy_from_slice(&(group.total as u16).to_be_bytes());
            fix_ipv4_checksum(&mut packet[..flow.l4]);
        }
        let l4_len = group.total - flow.l4;
        let (proto, csum_at) = if flow.gso_type == GSO_UDP_L4 {
            packet[flow.l4 + 4..flow.l4 + 6].copy_from_slice(&(l4_len as u16).to_be_bytes());
            (PROTO_UDP, flow.l4 + 6)
        } else {
            packet[flow.l4 + 13] |= tail_flags & TCP_PSH;
            (PROTO_TCP, flow.l4 + 16)
        };
        // A partial checksum: the pseudo-header only, for the kernel to complete.
        let partial = checksum_fold(pseudo_header_sum(packet, flow.v6, proto, l4_len));
        packet[csum_at..csum_at + 2].copy_from_slice(&partial.to_be_bytes());
    }

    /// What to write for group `g` (in order, `0..plan()`).
    pub fn planned(&self, g: usize) -> Planned {
        let group = self.groups[g];
        let head = usize::from(group.head);
        let flow = self.flows[head];
        let hdr = if group.count > 1 {
            VnetHdr {
                flags: F_NEEDS_CSUM,
                gso_type: flow.gso_type,
                hdr_len: flow.hl as u16,
                gso_size: group.gso_size,
                csum_start: flow.l4 as u16,
                csum_offset: if flow.gso_type == GSO_UDP_L4 { 6 } else { 16 },
            }
        } else if flow.gso_type != 0 {
            // Decrypted and authenticated by the AEAD: the kernel need not verify it again.
            VnetHdr {
                flags: F_DATA_VALID,
                ..VnetHdr::default()
            }
        } else {
            VnetHdr::default()
        };
        Planned {
            hdr,
            head,
            member_hl: flow.hl,
            count: usize::from(group.count),
        }
    }

    /// The frames of group `g` after its head, in order.
    pub fn members(&self, g: usize) -> impl Iterator<Item = usize> + '_ {
        let mut at = self.next[usize::from(self.groups[g].head)];
        std::iter::from_fn(move || {
            let i = usize::from(at);
            if i >= BATCH_SIZE {
                return None;
            }
            at = self.next[i];
            Some(i)
        })
    }
}

/// Whether and how `packet` could be part of a super-packet.
fn classify(packet: &[u8], tcp: bool, udp: bool) -> Flow {
    let none = Flow::default();
    let Some(ip) = parse_ip(packet) else {
        return none;
    };
    let l4 = ip.hl;
    if ip.v6 {
        let payload_len = usize::from(u16::from_be_bytes([packet[4], packet[5]]));
        if payload_len + 40 != packet.len() {
            return none;
        }
    } else {
        let total = usize::from(u16::from_be_bytes([packet[2], packet[3]]));
        let fragment = u16::from_be_bytes([packet[6], packet[7]]) & 0x3fff;
        // Options would have to be compared too; fragments cannot be coalesced at all.
        if total != packet.len() || ip.hl != 20 || fragment != 0 {
            return none;
        }
    }
    match ip.proto {
        PROTO_TCP => {
            let Some(&doff) = packet.get(l4 + 12) else {
                return none;
            };
            let hl = l4 + usize::from(doff >> 4) * 4;
            if usize::from(doff >> 4) < 5 || hl > packet.len() {
                return none;
            }
            let flags = packet[l4 + 13];
            Flow {
                gso_type: if ip.v6 { GSO_TCPV6 } else { GSO_TCPV4 },
                // Only plain data segments: ACK, optionally PSH (which ends a group). SYN,
                // FIN, RST, URG, ECE and CWR packets go alone.
                mergeable: tcp && flags & !TCP_PSH == TCP_ACK,
                v6: ip.v6,
                l4,
                hl,
                payload: packet.len() - hl,
                seq: u32::from_be_bytes(packet[l4 + 4..l4 + 8].try_into().unwrap_or_default()),
                tcp_flags: flags,
            }
        }
        PROTO_UDP => {
            let hl = l4 + 8;
            if hl > packet.len()
                || usize::from(u16::from_be_bytes([packet[l4 + 4], packet[l4 + 5]]))
                    != packet.len() - l4
            {
                return none;
            }
            Flow {
                gso_type: GSO_UDP_L4,
                // Without USO the kernel could not take a UDP super-packet.
                mergeable: udp,
                v6: ip.v6,
                l4,
                hl,
                payload: packet.len() - hl,
                seq: 0,
                tcp_flags: 0,
            }
        }
        _ => none,
    }
}

/// Same addresses, ports and IP header fields that must not change within a super-packet.
fn same_flow(a: &[u8], b: &[u8], flow: &Flow) -> bool {
    let ip_same = if flow.v6 {
        // Version, traffic class, flow label; next header and hop limit; addresses.
        a[0..4] == b[0..4] && a[6..40] == b[6..40]
    } else {
        // Version/IHL and TOS; flags (DF); TTL, protocol; addresses.
        a[0..2] == b[0..2] && a[6] == b[6] && a[8..10] == b[8..10] && a[12..20] == b[12..20]
    };
    ip_same && a[flow.l4..flow.l4 + 4] == b[flow.l4..flow.l4 + 4]
}

/// Whether `packet` (flow `new`) continues `group`, whose last packet is `tail` (flow `last`).
fn can_join(group: &Group, last: &Flow, new: &Flow, tail: &[u8], packet: &[u8]) -> bool {
    if group.closed
        || !new.mergeable
        || usize::from(group.count) >= BATCH_SIZE
        || new.payload == 0
        || new.payload > usize::from(group.gso_size)
        || last.payload != usize::from(group.gso_size)
        || group.total + new.payload > MAX_IP_LEN
    {
        return false;
    }
    if new.gso_type == GSO_UDP_L4 {
        return true;
    }
    let l4 = new.l4;
    // The next byte of the stream, the same acknowledgement, header length, flags (but PSH),
    // window and options: what the kernel's TCP GRO requires.
    new.hl == last.hl
        && new.seq == last.seq.wrapping_add(last.payload as u32)
        && tail[l4 + 8..l4 + 13] == packet[l4 + 8..l4 + 13]
        && (tail[l4 + 13] | TCP_PSH) == (packet[l4 + 13] | TCP_PSH)
        && tail[l4 + 14..l4 + 16] == packet[l4 + 14..l4 + 16]
        && tail[l4 + 20..last.hl] == packet[l4 + 20..new.hl]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 1071 the slow way: big-endian 16-bit words, odd byte padded with zero.
    fn reference(data: &[u8]) -> u16 {
        let mut sum: u64 = 0;
        for pair in data.chunks(2) {
            sum += u64::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]));
        }
        checksum_fold(sum)
    }

    #[test]
    fn checksum_matches_rfc_1071_for_every_length_and_offset() {
        let data: Vec<u8> = (0..3004u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for len in (0..70).chain([1379, 1380, 1381, 1448, 2999]) {
            for start in 0..4 {
                let chunk = &data[start..start + len];
                assert_eq!(
                    checksum_fold(checksum_add(0, chunk)),
                    reference(chunk),
                    "len {len} start {start}"
                );
            }
        }
        let ones = [0xffu8; 1500];
        assert_eq!(checksum_fold(checksum_add(0, &ones)), reference(&ones));
        // Sums compose: adding to an existing sum is the same as summing the concatenation
        // (for a first part of even length).
        let (a, b) = data[..1001].split_at(600);
        assert_eq!(
            checksum_fold(checksum_add(checksum_add(0, a), b)),
            reference(&data[..1001])
        );
    }
}
