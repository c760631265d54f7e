//! The bodies of the fuzz targets, as plain functions: `fuzz_targets/*.rs` hand them libFuzzer's
//! input, and `tests/replay.rs` runs them on stable over the checked-in seeds and
//! pseudo-random input, so the suite exercises them without nightly.
//!
//! Each checks properties, not just "no panic": segments are valid packets with correct
//! checksums, coalescing round-trips through segmentation, config and UAPI errors are one line.

use std::cell::RefCell;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};
use tunneld_config as config;
use tunneld_crypto::PrivateKey;
use tunneld_dataplane::offload::{
    self, checksum_add, checksum_fold, Coalescer, VnetHdr, GSO_ECN, GSO_NONE, VNET_HDR_LEN,
};
use tunneld_dataplane::{Batch, BATCH_SIZE, FRAME_PAYLOAD};
use tunneld_wireguard::uapi::{self, Request};
use tunneld_wireguard::wire::{self, Message};
use tunneld_wireguard::{Device, DeviceSettings, DropReason, Environment, PeerSettings};

thread_local! {
    // Buffers reused across inputs: a fresh 64 KiB frame or 4 MiB batch per input would make
    // the fuzzer measure zeroing memory.
    static FRAMES: RefCell<(Vec<u8>, Vec<u8>)> =
        RefCell::new((vec![0; FRAME_PAYLOAD], vec![0; FRAME_PAYLOAD]));
    static BATCHES: RefCell<(Batch, Batch)> = RefCell::new((Batch::new(), Batch::new()));
}

/// Splits `data` into length-prefixed pieces (a big-endian u16, then that many bytes; the last
/// piece takes what is left).
fn pieces(mut data: &[u8]) -> impl Iterator<Item = &[u8]> {
    std::iter::from_fn(move || {
        if data.is_empty() {
            return None;
        }
        if data.len() < 2 {
            let piece = data;
            data = &[];
            return Some(piece);
        }
        let len = usize::from(u16::from_be_bytes([data[0], data[1]])).min(data.len() - 2);
        let piece = &data[2..2 + len];
        data = &data[2 + len..];
        Some(piece)
    })
}

/// An emitted segment: its IP length field matches, the IPv4 header checksum and the TCP/UDP
/// checksum (with the pseudo-header) verify.
fn assert_valid_segment(p: &[u8]) {
    let v6 = p[0] >> 4 == 6;
    let (ip_hl, proto) = if v6 {
        assert_eq!(usize::from(u16::from_be_bytes([p[4], p[5]])) + 40, p.len());
        (40, p[6])
    } else {
        let ihl = usize::from(p[0] & 0x0f) * 4;
        assert_eq!(usize::from(u16::from_be_bytes([p[2], p[3]])), p.len());
        assert_eq!(
            checksum_fold(checksum_add(0, &p[..ihl])),
            0xffff,
            "IPv4 header"
        );
        (ihl, p[9])
    };
    let addrs = if v6 { &p[8..40] } else { &p[12..20] };
    let sum = checksum_add(0, addrs)
        + u64::from(proto)
        + (p.len() - ip_hl) as u64
        + checksum_add(0, &p[ip_hl..]);
    assert_eq!(checksum_fold(sum), 0xffff, "transport checksum");
}

/// A `virtio_net_hdr` and a packet, as the TUN hands them over, through `offload::segment`.
pub fn offload_segment(data: &[u8]) {
    let Some((raw, packet)) = data.split_first_chunk::<VNET_HDR_LEN>() else {
        return;
    };
    let hdr = VnetHdr::decode(raw);
    assert_eq!(VnetHdr::decode(&hdr.encode()), hdr);
    if packet.len() > 65_535 {
        return;
    }
    FRAMES.with_borrow_mut(|(frame, scratch)| {
        frame[..packet.len()].copy_from_slice(packet);
        let mut emitted = 0;
        let result = offload::segment(frame, packet.len(), &hdr, scratch, |buf, len| {
            assert!(len + 16 <= buf.len(), "room for padding");
            if hdr.gso_type & !GSO_ECN != GSO_NONE {
                assert_valid_segment(&buf[..len]);
            }
            emitted += 1;
        });
        match result {
            Ok(n) => assert_eq!(n, emitted),
            Err(_) => assert_eq!(emitted, 0, "an error after emitting"),
        }
    });
}

/// Up to 64 decrypted packets through the coalescer: every frame written exactly once, in
/// order within its group, and every super-packet cut back by `segment` gives the members'
/// payloads.
pub fn offload_coalesce(data: &[u8]) {
    BATCHES.with_borrow_mut(|(batch, _)| {
        batch.clear();
        for piece in pieces(data).take(BATCH_SIZE) {
            let Some(slot) = batch.next_free() else { break };
            slot[..piece.len()].copy_from_slice(piece);
            batch.commit(piece.len(), SocketAddr::from(([0, 0, 0, 0], 0)));
        }
        let originals: Vec<Vec<u8>> = (0..batch.len())
            .map(|i| batch.payload(i).to_vec())
            .collect();
        let mut coalescer = Coalescer::new(true);
        let groups = coalescer.plan(batch);
        let mut seen = vec![false; batch.len()];
        for g in 0..groups {
            let planned = coalescer.planned(g);
            let members: Vec<usize> = coalescer.members(g).collect();
            assert_eq!(planned.count, 1 + members.len());
            let mut last = planned.head;
            for &f in std::iter::once(&planned.head).chain(&members) {
                assert!(!std::mem::replace(&mut seen[f], true), "frame {f} twice");
            }
            for &m in &members {
                assert!(m > last, "members in batch order");
                last = m;
                assert!(planned.member_hl <= batch.payload(m).len());
            }
            if members.is_empty() {
                continue;
            }
            // What the kernel receives, and what its segmentation makes of it.
            let mut whole = batch.payload(planned.head).to_vec();
            for &m in &members {
                whole.extend_from_slice(&batch.payload(m)[planned.member_hl..]);
            }
            let hl = planned.member_hl;
            let mut payloads = Vec::new();
            FRAMES.with_borrow_mut(|(frame, scratch)| {
                frame[..whole.len()].copy_from_slice(&whole);
                let n = offload::segment(frame, whole.len(), &planned.hdr, scratch, |buf, len| {
                    assert_valid_segment(&buf[..len]);
                    payloads.push(buf[hl..len].to_vec());
                })
                .expect("a coalesced super-packet segments");
                assert_eq!(n, planned.count);
            });
            for (k, &f) in std::iter::once(&planned.head).chain(&members).enumerate() {
                assert_eq!(payloads[k], originals[f][hl..], "payload of frame {f}");
            }
        }
        assert!(seen.iter().all(|&s| s), "every frame written");
    });
}

/// A device with one peer and fixed keys: `own` is this side's key byte, `peer` the other's,
/// the last address byte of each side is its key byte minus 0x40 (10.0.0.1 and 10.0.0.2, and
/// 192.0.2.1 and 192.0.2.2 on the underlay).
fn device_with_fixed_keys(own: u8, peer: u8, now: Instant) -> Device {
    let host = |key: u8| key - 0x40;
    Device::new(
        DeviceSettings {
            private_key: PrivateKey::from_bytes([own; 32]),
            listen_port: 51820,
            mtu: 1420,
            fwmark: 0,
        },
        vec![
            PeerSettings::new(PrivateKey::from_bytes([peer; 32]).public_key())
                .endpoint(SocketAddr::new(
                    IpAddr::V4(Ipv4Addr::new(192, 0, 2, host(peer))),
                    51820,
                ))
                .allowed_ip(ipnet::IpNet::from(IpAddr::V4(Ipv4Addr::new(
                    10,
                    0,
                    0,
                    host(peer),
                )))),
        ],
        now,
        // Seeded: a fuzz input replays to the same run.
        Environment::seeded(
            u64::from(own),
            std::time::Duration::from_secs(1_790_000_000),
        ),
    )
}

/// The device the `decapsulate` target feeds.
fn fixed_device(now: Instant) -> Device {
    device_with_fixed_keys(0x41, 0x42, now)
}

/// Its peer: for making seeds that hold a real handshake.
pub fn fixed_peer_device(now: Instant) -> Device {
    device_with_fixed_keys(0x42, 0x41, now)
}

/// Datagrams from the network (length-prefixed pieces) into a device's receive path, with a
/// timer tick between some of them. Nothing may panic; nothing but what decrypted may reach
/// the tunnel.
pub fn decapsulate(data: &[u8]) {
    let start = Instant::now();
    let mut device = fixed_device(start);
    let from = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2)), 51820);
    BATCHES.with_borrow_mut(|(tunnel, network)| {
        for (i, datagram) in pieces(data).enumerate() {
            tunnel.clear();
            network.clear();
            let now = start + Duration::from_millis(i as u64 * 100);
            device.decapsulate(from, datagram, now, tunnel, network);
            assert!(tunnel.len() <= 1);
            if i % 8 == 7 {
                network.clear();
                device.tick(now, network);
            }
        }
    });
}

/// One datagram through `wire::parse`, the core's only parser of what the network sends.
/// What parses writes back as the same bytes and parses again to the same message, has the
/// datagram's length, and names a receiver unless it is an initiation; what does not parse,
/// a device counts as `malformed` and does nothing else with.
pub fn wire(data: &[u8]) {
    match wire::parse(data) {
        Ok(message) => {
            assert_eq!(message.len(), data.len());
            let mut out = vec![0u8; data.len()];
            assert_eq!(message.write(&mut out), Some(data.len()));
            assert_eq!(out, data, "{message:?} did not write back as parsed");
            assert_eq!(wire::parse(&out), Ok(message));
            assert_eq!(
                message.receiver().is_none(),
                matches!(message, Message::Initiation(_))
            );
        }
        Err(refused) => {
            assert_eq!(DropReason::from(refused), DropReason::Malformed);
            let now = Instant::now();
            let mut device = fixed_device(now);
            let from = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2)), 51820);
            BATCHES.with_borrow_mut(|(tunnel, network)| {
                tunnel.clear();
                network.clear();
                device.decapsulate(from, data, now, tunnel, network);
                assert_eq!((tunnel.len(), network.len()), (0, 0));
            });
            let stats = device.stats();
            assert_eq!(stats.drops(DropReason::Malformed), 1, "{refused}");
            assert_eq!(stats.total_drops(), 1, "{refused}");
        }
    }
}

/// Text as a config file: parsed and validated; every error one line.
pub fn config_parse(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Err(errors) = config::parse(&text) {
        assert!(!errors.0.is_empty());
        for e in &errors.0 {
            assert!(!e.to_string().contains('\n'), "error over two lines: {e}");
        }
    }
}

/// Text as a UAPI request: parsed, and a `set` applied to a device; refusals are errors,
/// never panics.
pub fn uapi_parse(data: &[u8]) {
    let _ = uapi::is_complete(data);
    let text = String::from_utf8_lossy(data);
    match uapi::parse_request(&text) {
        Ok(Request::Set(set)) => {
            let now = Instant::now();
            let _ = fixed_device(now).apply(set, now);
        }
        Ok(Request::Get | Request::Stats | Request::Fleet) => {}
        Err(e) => assert!(!e.to_string().contains('\n'), "error over two lines: {e}"),
    }
}

/// Stream bytes from a WireGuard-over-TLS peer, cut into pieces as reads would return them
/// (the first byte picks the piece size): the deframer yields exactly the datagrams a plain
/// parse of the whole stream finds, whatever the cuts.
pub fn framing(data: &[u8]) {
    use tunneld_wireguard::framing::{Deframer, LENGTH_BYTES};
    let Some((&cut, stream)) = data.split_first() else {
        return;
    };
    let mut expected = Vec::new();
    let mut rest = stream;
    while let Some(prefix) = rest.get(..LENGTH_BYTES) {
        let len = usize::from(u16::from_be_bytes([prefix[0], prefix[1]]));
        let Some(datagram) = rest.get(LENGTH_BYTES..LENGTH_BYTES + len) else {
            break;
        };
        expected.push(datagram);
        rest = &rest[LENGTH_BYTES + len..];
    }
    let piece = usize::from(cut) * 7 + 1;
    let mut deframer = Deframer::new();
    let mut got = Vec::new();
    let mut at = 0;
    while at < stream.len() {
        let space = deframer.space();
        assert!(!space.is_empty(), "no room after the datagrams were taken");
        let n = piece.min(space.len()).min(stream.len() - at);
        space[..n].copy_from_slice(&stream[at..at + n]);
        deframer.filled(n);
        at += n;
        while let Some(datagram) = deframer.next_datagram() {
            got.push(datagram.to_vec());
        }
    }
    assert_eq!(got.len(), expected.len());
    assert!(got.iter().zip(&expected).all(|(g, e)| g == e));
}

/// Every ChaCha20-Poly1305 implementation this CPU runs seals to the same bytes as ring and
/// opens what any of them sealed; a flipped byte fails everywhere and leaves zeros. Input: a
/// 32-byte key, an 8-byte counter, a 2-byte position to flip, then the message.
pub fn aead_differential(data: &[u8]) {
    use tunneld_crypto::aead::{AeadError, Implementation, TransportKey, TAG_LEN};
    let (Some(key), Some(counter), Some(flip)) =
        (data.get(..32), data.get(32..40), data.get(40..42))
    else {
        return;
    };
    let message = &data[42..];
    let key: [u8; 32] = key.try_into().unwrap_or_default();
    let counter = u64::from_le_bytes(counter.try_into().unwrap_or_default());
    let implementations: Vec<Implementation> = Implementation::available().collect();
    let mut sealed = message.to_vec();
    let tag = TransportKey::with(Implementation::Ring, &key).seal(counter, &mut sealed);
    sealed.extend_from_slice(&tag);
    let flip = usize::from(u16::from_le_bytes([flip[0], flip[1]])) % sealed.len();
    for &implementation in &implementations {
        let mut k = TransportKey::with(implementation, &key);
        let mut out = vec![0; message.len()];
        assert_eq!(
            k.seal_into(counter, message, &mut out),
            tag,
            "{implementation:?}"
        );
        assert_eq!(out, sealed[..message.len()], "{implementation:?}");
        let mut opened = vec![0; sealed.len()];
        assert_eq!(
            k.open_into(counter, &sealed, &mut opened),
            Ok(message.len())
        );
        assert_eq!(&opened[..message.len()], message, "{implementation:?}");
        let mut bad = sealed.clone();
        bad[flip] ^= 1;
        assert_eq!(k.open(counter, &mut bad), Err(AeadError::Unauthentic));
        assert!(bad.iter().all(|b| *b == 0));
        assert!(sealed.len() >= TAG_LEN);
    }
}

/// tunneld's TLS 1.3 record layer, client and server built from fixed secrets. With the first
/// byte's top bit set, the rest is raw bytes from the network, fed to the server in pieces:
/// it never panics and never yields plaintext (nothing was sealed). Otherwise the rest is a
/// script of what the client sends (application data with or without padding, empty
/// records, KeyUpdates, alerts, a byte flipped on the wire) and of server replies, each
/// record fed to the other side as it is made, in pieces: what the server yields is always
/// a prefix of what the client sealed, all of it unless a byte was flipped or a limit of
/// RFC 8446 section 5 was crossed (then the server refuses), and what the server seals the
/// client opens byte for byte.
pub fn records(data: &[u8]) {
    use tunneld_tls::records::{
        Records, Suite, ALERT, APPLICATION_DATA, FULL_RECORD, HEADER, MAX_EMPTY_RECORDS,
        MAX_KEY_UPDATES, MAX_PLAINTEXT, MAX_RECORD, TAG,
    };
    let Some((&first, script)) = data.split_first() else {
        return;
    };
    let suite = match first % 3 {
        0 => Suite::Aes128GcmSha256,
        1 => Suite::Aes256GcmSha384,
        _ => Suite::Chacha20Poly1305Sha256,
    };
    let (c, s) = (vec![0xc1; suite.hash_len()], vec![0x5e; suite.hash_len()]);
    let new = |client: bool, ring: bool| {
        let (tx, rx) = if client { (&c, &s) } else { (&s, &c) };
        Records::from_secrets(suite, client, tx, rx, ring).unwrap()
    };
    let mut client = new(true, first & 8 != 0);
    let mut server = new(false, first & 16 == 0);
    let piece = usize::from(first >> 2 & 0x1f) * 97 + 1;

    /// A receiving side: its receive buffer, and the plaintext it has yielded.
    struct Side {
        received: Vec<u8>,
        plaintext: Vec<u8>,
        closed: bool,
    }
    impl Side {
        /// Feeds `bytes` in pieces of `piece`, as reads would; false once `to` refused.
        fn feed(&mut self, to: &mut Records, bytes: &[u8], piece: usize) -> bool {
            for chunk in bytes.chunks(piece) {
                if self.closed {
                    return true;
                }
                self.received.extend_from_slice(chunk);
                let mut pieces = Vec::new();
                let opened = to.open(&mut self.received, &mut pieces);
                for &(at, len) in &pieces {
                    self.plaintext
                        .extend_from_slice(&self.received[at..at + len]);
                }
                let Ok(opened) = opened else {
                    return false;
                };
                assert!(opened.consumed <= self.received.len());
                self.received.drain(..opened.consumed);
                self.closed = opened.close_notify;
                assert!(
                    self.received.len() < MAX_RECORD,
                    "a whole record left unopened"
                );
            }
            true
        }
    }
    let side = || Side {
        received: Vec::new(),
        plaintext: Vec::new(),
        closed: false,
    };
    let (mut at_server, mut at_client) = (side(), side());

    if first & 0x80 != 0 {
        at_server.feed(&mut server, script, piece);
        assert!(at_server.plaintext.is_empty(), "plaintext nobody sealed");
        return;
    }

    let mut sent = Vec::new();
    let mut replies = Vec::new();
    let (mut flip, mut tampered, mut over_limit, mut closing) = (None, false, false, false);
    let (mut empties, mut updates) = (0u32, 0u32);
    let mut buf = vec![0; FULL_RECORD + 256];
    let mut ops = script.iter().copied();
    let mut next = move || ops.next().unwrap_or(0);
    for _ in 0..script.len().min(200) {
        let op = next();
        let arg = usize::from(u16::from_be_bytes([next(), next()]));
        let record = match op % 8 {
            0 | 1 => {
                let len = if op % 8 == 0 {
                    arg % (MAX_PLAINTEXT + 1)
                } else {
                    0
                };
                let text: Vec<u8> = (0..len).map(|i| (i * 31 + sent.len()) as u8).collect();
                buf[HEADER..HEADER + len].copy_from_slice(&text);
                let n = client.seal(&mut buf, len, APPLICATION_DATA).unwrap();
                if !closing {
                    sent.extend_from_slice(&text);
                    if len == 0 {
                        empties += 1;
                        over_limit |= empties > MAX_EMPTY_RECORDS;
                    } else {
                        (empties, updates) = (0, 0);
                    }
                }
                buf[..n].to_vec()
            }
            2 => {
                // Data, its type and zero padding, laid out by hand: up to the largest record.
                let len = (arg % 257).min(MAX_PLAINTEXT);
                let inner = (len + 1 + usize::from(next()) * 67).min(MAX_RECORD - HEADER - TAG);
                let text: Vec<u8> = (0..len).map(|i| (i * 7 + sent.len()) as u8 | 1).collect();
                buf[HEADER..HEADER + len].copy_from_slice(&text);
                buf[HEADER + len] = APPLICATION_DATA;
                buf[HEADER + len + 1..HEADER + inner].fill(0);
                let n = client.seal_inner(&mut buf, inner).unwrap();
                if !closing {
                    over_limit |= inner > MAX_PLAINTEXT + 1;
                    if !over_limit {
                        sent.extend_from_slice(&text);
                    }
                    if len == 0 {
                        empties += 1;
                        over_limit |= empties > MAX_EMPTY_RECORDS;
                    } else {
                        (empties, updates) = (0, 0);
                    }
                }
                buf[..n].to_vec()
            }
            3 => {
                let n = client.key_update(&mut buf, arg & 1 != 0).unwrap();
                if !closing {
                    updates += 1;
                    over_limit |= updates > MAX_KEY_UPDATES;
                }
                buf[..n].to_vec()
            }
            4 => {
                // The server answers: a KeyUpdate if one is owed, then data.
                let mut out = Vec::new();
                let n = server.due(&mut buf, 1).unwrap();
                out.extend_from_slice(&buf[..n]);
                let len = arg % (MAX_PLAINTEXT + 1);
                let text: Vec<u8> = (0..len).map(|i| (i * 13 + replies.len()) as u8).collect();
                buf[HEADER..HEADER + len].copy_from_slice(&text);
                let n = server.seal(&mut buf, len, APPLICATION_DATA).unwrap();
                out.extend_from_slice(&buf[..n]);
                replies.extend_from_slice(&text);
                assert!(
                    at_client.feed(&mut client, &out, piece),
                    "the client refused the server"
                );
                assert_eq!(
                    at_client.plaintext, replies,
                    "the server's data, byte for byte"
                );
                continue;
            }
            5 => {
                let n = client.close_notify(&mut buf).unwrap();
                closing = true;
                buf[..n].to_vec()
            }
            6 => {
                let n = client.seal_message(&mut buf, ALERT, &[1, 90]).unwrap(); // user_canceled
                buf[..n].to_vec()
            }
            _ => {
                flip = Some(arg);
                continue;
            }
        };
        let mut record = record;
        if let Some(at) = flip.take() {
            let at = at % record.len();
            record[at] ^= 1 << (op % 8);
            tampered = true;
        }
        let fine = at_server.feed(&mut server, &record, piece);
        assert!(
            sent.starts_with(&at_server.plaintext),
            "plaintext that was not sealed"
        );
        if !fine {
            assert!(
                tampered || over_limit,
                "refused a record sealed as it should be"
            );
            return;
        }
    }
    if !tampered && !over_limit {
        assert_eq!(at_server.plaintext, sent, "what was sealed, byte for byte");
        assert_eq!(at_server.closed, closing);
    }
}

/// netlink replies, as the kernel would send them to tunneld: the first byte picks the
/// request they answer (a get, a change or a dump) and the link asked about; the rest is
/// datagrams (length-prefixed pieces) fed to one reply scanner, every reply's payload to
/// every parser of the netlink layer (routes, neighbours, links, addresses, XDP state,
/// events, generic netlink). Never a panic; every error is one line; a get ends at its
/// first reply; what the parsers accept is what was asked for.
pub fn netlink(data: &[u8]) {
    use tunneld_dataplane::netlink::{generic, route, Exchange};
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    // A get (no flags), a change (NLM_F_ACK) or a dump (NLM_F_DUMP).
    let flags = [0, 4, 0x300][usize::from(first % 3)];
    let index = u32::from(first >> 2 & 7);
    let dst: ipnet::IpNet = "10.20.0.0/16".parse().unwrap();
    let parse = |payload: &[u8]| {
        let _ = route::parse_neighbour(payload);
        let _ = route::parse_link(payload);
        let _ = route::parse_xdp_programs(payload);
        let _ = (
            generic::parse_family_id(payload),
            generic::parse_xsk_features(payload),
        );
        if let Some(addr) = route::parse_address(payload, index) {
            let on = u32::from_ne_bytes(payload[4..8].try_into().unwrap());
            assert_eq!(on, index, "{addr} is on link {on}");
        }
        if let Some(via) = route::route_via(payload, index) {
            assert!(route::route_matches(payload, via, index));
        }
        if route::route_matches(payload, dst, index) {
            let found = route::parse_route(payload).unwrap();
            assert_eq!((found.oif, found.dst_len), (Some(index), 16));
        }
    };
    let _ = route::event_matters(rest, index);
    let mut exchange = Exchange::new(1, flags);
    let mut replies = 0;
    for datagram in pieces(rest) {
        let _ = route::event_matters(datagram, index);
        let end = exchange.scan(datagram, &mut |_, payload| {
            replies += 1;
            parse(payload);
        });
        match end {
            None => continue,
            Some(Ok(())) => {
                if flags == 0 {
                    assert!(replies <= 1, "a get answered {replies} times");
                }
            }
            Some(Err(failure)) => {
                let line = failure
                    .named("netlink: add route 10.20.0.0/16 via link 1")
                    .to_string();
                assert!(!line.contains('\n') && !line.contains('\r'), "{line:?}");
            }
        }
        break;
    }
}

/// A fuzz target's body.
pub type Target = fn(&[u8]);

/// The targets by name, for the replay test.
pub const TARGETS: &[(&str, Target)] = &[
    ("offload_segment", offload_segment),
    ("offload_coalesce", offload_coalesce),
    ("decapsulate", decapsulate),
    ("wire", wire),
    ("config_parse", config_parse),
    ("uapi_parse", uapi_parse),
    ("framing", framing),
    ("aead_differential", aead_differential),
    ("records", records),
    ("netlink", netlink),
];
