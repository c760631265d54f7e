//! Writes the seed corpus of every fuzz target (`fuzz/corpus/<target>/seed-NN`): real
//! super-packets and their segments, a real handshake from the fixed peer, the README's config,
//! what `wg set` sends. Run when the targets change:
//! `cargo run --manifest-path fuzz/Cargo.toml --example write_seeds`.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tunneld_dataplane::offload::{
    checksum_add, checksum_fold, VnetHdr, F_NEEDS_CSUM, GSO_TCPV4, GSO_TCPV6, GSO_UDP_L4,
};
use tunneld_dataplane::Batch;

fn corpus(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target)
}

/// A TCP or UDP packet with correct lengths; the transport checksum holds only the
/// pseudo-header sum (as the kernel leaves it for offload).
fn packet(v6: bool, tcp: bool, payload: usize) -> Vec<u8> {
    let l4_hl = if tcp { 32 } else { 8 };
    let l4_len = l4_hl + payload;
    let mut p = Vec::new();
    let proto = if tcp { 6 } else { 17 };
    if v6 {
        p.extend_from_slice(&[0x60, 0, 0, 0]);
        p.extend_from_slice(&(l4_len as u16).to_be_bytes());
        p.extend_from_slice(&[proto, 64]);
        p.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        p.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    } else {
        p.extend_from_slice(&[0x45, 0]);
        p.extend_from_slice(&((20 + l4_len) as u16).to_be_bytes());
        p.extend_from_slice(&[
            0x12, 0x34, 0x40, 0, 64, proto, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ]);
        let c = !checksum_fold(checksum_add(0, &p));
        p[10..12].copy_from_slice(&c.to_be_bytes());
    }
    let l4 = p.len();
    p.extend_from_slice(&[0x9c, 0x40, 0x14, 0x51]);
    if tcp {
        p.extend_from_slice(&[0, 0, 0x10, 0, 0, 0, 0, 77, 0x80, 0x10, 1, 0xf4, 0, 0, 0, 0]);
        p.extend_from_slice(&[1, 1, 8, 10, 0, 0, 1, 0, 0, 0, 2, 0]);
    } else {
        p.extend_from_slice(&(l4_len as u16).to_be_bytes());
        p.extend_from_slice(&[0, 0]);
    }
    p.extend((0..payload).map(|i| (i * 7) as u8));
    let addrs = if v6 { &p[8..40] } else { &p[12..20] };
    let pseudo = checksum_fold(checksum_add(0, addrs) + u64::from(proto) + l4_len as u64);
    let at = l4 + if tcp { 16 } else { 6 };
    p[at..at + 2].copy_from_slice(&pseudo.to_be_bytes());
    p
}

fn with_hdr(hdr: VnetHdr, packet: &[u8]) -> Vec<u8> {
    let mut v = hdr.encode().to_vec();
    v.extend_from_slice(packet);
    v
}

fn prefixed(pieces: &[Vec<u8>]) -> Vec<u8> {
    let mut v = Vec::new();
    for p in pieces {
        v.extend_from_slice(&(p.len() as u16).to_be_bytes());
        v.extend_from_slice(p);
    }
    v
}

/// Cuts a super-packet into its segments with the code under test (for coalescing seeds).
fn segments(hdr: &VnetHdr, packet: &[u8]) -> Vec<Vec<u8>> {
    let mut frame = vec![0u8; tunneld_dataplane::FRAME_PAYLOAD];
    let mut scratch = frame.clone();
    frame[..packet.len()].copy_from_slice(packet);
    let mut out = Vec::new();
    tunneld_dataplane::offload::segment(&mut frame, packet.len(), hdr, &mut scratch, |b, n| {
        out.push(b[..n].to_vec())
    })
    .unwrap();
    out
}

fn gso(v6: bool, tcp: bool, size: u16) -> VnetHdr {
    let ip_hl: u16 = if v6 { 40 } else { 20 };
    VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: match (tcp, v6) {
            (true, false) => GSO_TCPV4,
            (true, true) => GSO_TCPV6,
            _ => GSO_UDP_L4,
        },
        hdr_len: ip_hl + if tcp { 32 } else { 8 },
        gso_size: size,
        csum_start: ip_hl,
        csum_offset: if tcp { 16 } else { 6 },
    }
}

fn main() {
    let mut all: Vec<(&str, Vec<Vec<u8>>)> = Vec::new();

    let mut segment_seeds = Vec::new();
    let mut coalesce_seeds = Vec::new();
    for v6 in [false, true] {
        for tcp in [true, false] {
            let hdr = gso(v6, tcp, 1200);
            let p = packet(v6, tcp, 1200 * 5 + 300);
            segment_seeds.push(with_hdr(hdr, &p));
            coalesce_seeds.push(prefixed(&segments(&hdr, &p)));
        }
    }
    let plain = packet(false, true, 100);
    segment_seeds.push(with_hdr(VnetHdr::default(), &plain));
    let mut csum = gso(false, true, 0);
    csum.gso_type = 0;
    segment_seeds.push(with_hdr(csum, &plain));
    all.push(("offload_segment", segment_seeds));
    all.push(("offload_coalesce", coalesce_seeds));

    // A real handshake initiation and data from the fixed peer, then garbage of each type.
    let now = Instant::now();
    let mut peer = tunneld_fuzz::fixed_peer_device(now);
    let mut out = Batch::new();
    let mut frame = packet(false, false, 50);
    frame[12..16].copy_from_slice(&[10, 0, 0, 2]);
    frame[16..20].copy_from_slice(&[10, 0, 0, 1]);
    let len = frame.len();
    frame.resize(len + 64, 0);
    peer.encapsulate(&mut frame, len, now, &mut out);
    let initiation = out.payload(0).to_vec();
    // One datagram each: the real initiation; each other type at its length (patterned bytes
    // behind a valid header: a response, a cookie reply, a keepalive's and a packet's data
    // message); a header whose reserved bytes are not zero.
    let shaped = |kind: u8, len: usize| {
        let mut m: Vec<u8> = (0..len)
            .map(|i| (i * 31 + usize::from(kind)) as u8)
            .collect();
        m[..4].copy_from_slice(&[kind, 0, 0, 0]);
        m
    };
    all.push((
        "wire",
        vec![
            initiation.clone(),
            shaped(2, 92),
            shaped(3, 64),
            shaped(4, 32),
            shaped(4, 96),
            vec![4, 0, 1, 0, 9, 9, 9, 9],
        ],
    ));
    all.push((
        "decapsulate",
        vec![
            prefixed(std::slice::from_ref(&initiation)),
            prefixed(&[
                initiation,
                vec![4, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            ]),
            prefixed(&[vec![2, 0, 0, 0], vec![3, 0, 0, 0, 0, 0, 0, 0]]),
        ],
    ));

    all.push((
        "config_parse",
        vec![
            include_bytes!("../../README.md")
                .split(|&b| b == b'`')
                .find(|s| s.starts_with(b"toml\n[interface]"))
                .map(|s| s[5..].to_vec())
                .unwrap_or_default(),
            b"[interface]\nname = \"wg0\"\nprivate_key = \"QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE=\"\n\
              [dataplane]\nbackend = \"mmsg\"\nbusy_poll_us = 0\n"
                .to_vec(),
        ],
    ));
    all.push((
        "uapi_parse",
        vec![
            b"get=1\n\n".to_vec(),
            b"set=1\nlisten_port=51820\nreplace_peers=true\npublic_key=4242424242424242424242424242424242424242424242424242424242424242\n\
              endpoint=192.0.2.2:51820\npersistent_keepalive_interval=25\nreplace_allowed_ips=true\nallowed_ip=10.0.0.2/32\n\n"
                .to_vec(),
            b"set=1\npublic_key=4242424242424242424242424242424242424242424242424242424242424242\nremove=true\n\n".to_vec(),
        ],
    ));

    all.push((
        "framing",
        vec![
            [
                &[3u8][..],
                &[0, 3],
                b"abc",
                &[0, 0],
                &[0, 148],
                &[7; 148],
                &[0, 5],
                b"cut",
            ]
            .concat(),
            [&[0u8][..], &[0xff, 0xff], &vec![1; 65535], &[0, 1], b"x"].concat(),
        ],
    ));
    // Key, counter, flip position, message: empty, a keepalive-sized one, a 1420-byte packet
    // (the vector Poly1305 and the 8-block ChaCha20 tail), and one past a 16-block batch.
    all.push((
        "aead_differential",
        [0usize, 16, 1420, 1100]
            .iter()
            .enumerate()
            .map(|(i, &len)| {
                let mut input = vec![i as u8 + 1; 32];
                input.extend_from_slice(&(i as u64 * 0x0101_0101).to_le_bytes());
                input.extend_from_slice(&(len as u16 / 2).to_le_bytes());
                input.extend((0..len).map(|b| (b * 7 + i) as u8));
                input
            })
            .collect(),
    ));
    // The record layer: a byte choosing the suite, the AEAD library of each side and the
    // read size, then a script of 3-byte operations (see `tunneld_fuzz::records`): data,
    // an empty record, padded data, a KeyUpdate asking for one back, the server's reply,
    // user_canceled, a flipped byte, close_notify; and raw bytes (top bit) shaped like a
    // record header and a too-short record.
    let op = |op: u8, arg: u16| [op, (arg >> 8) as u8, arg as u8];
    all.push((
        "records",
        vec![
            [
                &[0u8][..],
                &op(0, 5),
                &op(1, 0),
                &op(2, 40),
                &[9],
                &op(3, 1),
                &op(4, 300),
                &op(0, 16384),
                &op(6, 0),
                &op(5, 0),
            ]
            .concat(),
            [&[0x21u8][..], &op(0, 100), &op(7, 3), &op(0, 7), &op(4, 1)].concat(),
            [
                &[0x42u8][..],
                &op(2, 256),
                &[250],
                &op(3, 0),
                &op(4, 0),
                &op(0, 1),
            ]
            .concat(),
            [
                &[0x80u8][..],
                &[23, 3, 3, 0, 17],
                &[0; 17],
                &[23, 3, 3, 0, 3],
                &[1, 2, 3],
            ]
            .concat(),
            [&[0x9au8][..], &[22, 3, 3, 0, 2, 1, 0]].concat(),
        ],
    ));
    for (name, inputs) in all {
        let dir = corpus(name);
        fs::create_dir_all(&dir).unwrap();
        for (i, input) in inputs.iter().enumerate() {
            fs::write(dir.join(format!("seed-{i:02}")), input).unwrap();
        }
    }
}
