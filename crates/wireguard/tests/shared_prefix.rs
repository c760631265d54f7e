//! A prefix shared by several peers (`PeerSettings::shared_ips`, ECMP): a flow's peer is a
//! function of the flow and the members alone, a member's leaving moves only its flows,
//! packets from every member are accepted, and WireGuard's own rule (an allowed IP moves to
//! the peer that claims it last) is untouched and takes a shared prefix whole.

use ipnet::IpNet;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tunneld_crypto::{PrivateKey, PublicKey};
use tunneld_wireguard::packet::MAX_DATAGRAM;
use tunneld_wireguard::uapi::{PeerUpdate, SetRequest};
use tunneld_wireguard::{
    DatagramSink, Device, DeviceSettings, DropReason, Environment, PacketSink, PeerChange,
    PeerSettings,
};

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// An IPv4 UDP packet of the flow (src, sport) → (dst, 9000).
fn udp_packet(src: [u8; 4], dst: [u8; 4], sport: u16) -> Vec<u8> {
    let mut p = vec![0u8; 32];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&32u16.to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&src);
    p[16..20].copy_from_slice(&dst);
    p[20..22].copy_from_slice(&sport.to_be_bytes());
    p[22..24].copy_from_slice(&9000u16.to_be_bytes());
    p[24..26].copy_from_slice(&12u16.to_be_bytes());
    p
}

/// 2000 flows from site 10.1/16 to 10.2/16, varied in every field the hash reads.
fn flows() -> Vec<Vec<u8>> {
    (0..2000u32)
        .map(|i| {
            let [_, _, a, b] = i.to_be_bytes();
            udp_packet(
                [10, 1, a, b],
                [10, 2, b, a],
                1024 + (i * 7919 % 60000) as u16,
            )
        })
        .collect()
}

fn settings(key: &PrivateKey, port: u16) -> DeviceSettings {
    DeviceSettings {
        private_key: key.clone(),
        listen_port: port,
        mtu: 1420,
        fwmark: 0,
    }
}

fn device(peers: Vec<PeerSettings>, worker: usize, workers: usize) -> Device {
    Device::for_worker(
        settings(&PrivateKey::generate(), 51820),
        peers,
        Instant::now(),
        worker,
        workers,
        Environment::seeded(7, Duration::from_secs(1)),
    )
}

fn keys(n: usize) -> Vec<PublicKey> {
    (0..n)
        .map(|_| PrivateKey::generate().public_key())
        .collect()
}

fn sharing(keys: &[PublicKey], prefix: &str) -> Vec<PeerSettings> {
    keys.iter()
        .map(|k| PeerSettings::new(*k).shared_ips([net(prefix)]))
        .collect()
}

fn choices(device: &Device, flows: &[Vec<u8>]) -> Vec<Option<PublicKey>> {
    flows.iter().map(|f| device.peer_for_packet(f)).collect()
}

fn set(device: &mut Device, update: PeerUpdate) {
    let request = SetRequest {
        peers: vec![update],
        ..SetRequest::default()
    };
    device.apply(request, Instant::now()).unwrap();
}

/// Each member's share of `choices`.
fn shares(choices: &[Option<PublicKey>]) -> HashMap<PublicKey, usize> {
    let mut count = HashMap::new();
    for k in choices.iter().flatten() {
        *count.entry(*k).or_default() += 1;
    }
    count
}

#[test]
fn a_flow_keeps_its_peer_whatever_the_worker_and_the_order_of_the_members() {
    let members = keys(3);
    let flows = flows();
    let reference = choices(&device(sharing(&members, "10.2.0.0/16"), 0, 1), &flows);
    // Another worker of another worker count, the members added the other way round.
    let mut reversed = sharing(&members, "10.2.0.0/16");
    reversed.reverse();
    assert_eq!(choices(&device(reversed, 2, 3), &flows), reference);
    // Every packet of a flow gets the same answer, asked again or on another device.
    let again = device(sharing(&members, "10.2.0.0/16"), 1, 2);
    for (f, want) in flows.iter().zip(&reference) {
        assert_eq!(again.peer_for_packet(f), *want);
        assert_eq!(again.peer_for_packet(f), *want, "asked twice");
    }
    // Spread: each of three members carries about a third.
    let count = shares(&reference);
    assert_eq!(count.len(), 3, "every member carries flows");
    for (k, n) in &count {
        assert!(
            (500..=830).contains(n),
            "{k} carries {n} of 2000 flows, far from a third"
        );
    }
}

#[test]
fn a_member_leaving_moves_only_its_own_flows_and_coming_back_only_takes_its_own() {
    let members = keys(4);
    let flows = flows();
    let mut d = device(sharing(&members, "10.2.0.0/16"), 0, 1);
    let before = choices(&d, &flows);
    let gone = members[1];
    let mut update = PeerUpdate::new(gone);
    update.remove = true;
    set(&mut d, update);
    let after = choices(&d, &flows);
    let mut moved = 0;
    for (b, a) in before.iter().zip(&after) {
        if *b == Some(gone) {
            moved += 1;
            assert!(
                a.is_some() && *a != Some(gone),
                "a gone member's flow is carried"
            );
        } else {
            assert_eq!(a, b, "a flow of a member that stayed moved");
        }
    }
    assert!(moved > 300, "the gone member carried {moved} flows");
    // Back: exactly its flows go back to it.
    set(&mut d, {
        let mut u = PeerUpdate::new(gone);
        u.shared_ips = Some(vec![net("10.2.0.0/16")]);
        u
    });
    assert_eq!(choices(&d, &flows), before);
    // Leaving the group alone (the peer stays, its shared prefixes emptied) moves the same.
    set(&mut d, PeerChange::new(gone).shared_ips(Vec::new()).into());
    assert_eq!(choices(&d, &flows), after);
}

#[test]
fn an_allowed_ip_claimed_by_one_peer_takes_the_shared_prefix_from_all() {
    let members = keys(2);
    let other = PrivateKey::generate().public_key();
    let mut d = device(sharing(&members, "10.2.0.0/16"), 0, 1);
    // The snapshot (`wg show`) lists the shared prefix on every member.
    let snapshot = d.snapshot(Instant::now(), Duration::ZERO);
    for p in &snapshot.peers {
        assert_eq!(p.allowed_ips, vec![net("10.2.0.0/16")], "{}", p.public_key);
    }
    // `wg set <other> allowed-ips 10.2.0.0/16`: WireGuard's rule, the prefix is its alone.
    let mut claim = PeerUpdate::new(other);
    claim.allowed_ips = vec![net("10.2.0.0/16")];
    set(&mut d, claim);
    assert!(choices(&d, &flows()).iter().all(|c| *c == Some(other)));
    let snapshot = d.snapshot(Instant::now(), Duration::ZERO);
    for p in &snapshot.peers {
        let want = if p.public_key == other {
            vec![net("10.2.0.0/16")]
        } else {
            Vec::new()
        };
        assert_eq!(p.allowed_ips, want, "{}", p.public_key);
    }
    assert_eq!(d.routes(), vec![net("10.2.0.0/16")]);
    // A shared claim later takes it back from the one peer that held it.
    set(
        &mut d,
        PeerChange::new(members[0])
            .shared_ips(vec![net("10.2.0.0/16")])
            .into(),
    );
    assert!(choices(&d, &flows()).iter().all(|c| *c == Some(members[0])));
    // Removing the last member removes the route.
    let mut update = PeerUpdate::new(members[0]);
    update.remove = true;
    set(&mut d, update);
    assert!(d.routes().is_empty());
    assert_eq!(d.peer_for("10.2.0.1".parse().unwrap()), None);
}

#[test]
fn allowed_ips_still_move_to_the_last_claimant_and_win_over_a_shorter_shared_prefix() {
    let (a, b) = (
        PrivateKey::generate().public_key(),
        PrivateKey::generate().public_key(),
    );
    let mut d = device(
        vec![
            PeerSettings::new(a).allowed_ip(net("10.2.0.0/16")),
            PeerSettings::new(b),
        ],
        0,
        1,
    );
    let mut claim = PeerUpdate::new(b);
    claim.allowed_ips = vec![net("10.2.0.0/16")];
    set(&mut d, claim);
    let snapshot = d.snapshot(Instant::now(), Duration::ZERO);
    let listed: HashMap<PublicKey, Vec<IpNet>> = snapshot
        .peers
        .into_iter()
        .map(|p| (p.public_key, p.allowed_ips))
        .collect();
    assert_eq!(listed[&a], Vec::<IpNet>::new());
    assert_eq!(listed[&b], vec![net("10.2.0.0/16")]);
    // Longest prefix first, shared or not.
    set(
        &mut d,
        PeerChange::new(a)
            .shared_ips(vec![net("10.0.0.0/8")])
            .into(),
    );
    assert_eq!(d.peer_for("10.2.3.4".parse().unwrap()), Some(b));
    assert_eq!(d.peer_for("10.3.3.4".parse().unwrap()), Some(a));
}

/// Keeps what the device writes.
#[derive(Default)]
struct Collect {
    scratch: Vec<u8>,
    datagrams: Vec<(SocketAddr, Vec<u8>)>,
    packets: Vec<Vec<u8>>,
}

impl Collect {
    fn new() -> Self {
        Collect {
            scratch: vec![0; MAX_DATAGRAM],
            ..Collect::default()
        }
    }
}

impl DatagramSink for Collect {
    fn slot(&mut self) -> Option<&mut [u8]> {
        Some(&mut self.scratch[..])
    }
    fn push(&mut self, len: usize, to: SocketAddr) {
        self.datagrams.push((to, self.scratch[..len].to_vec()));
    }
}

impl PacketSink for Collect {
    fn slot(&mut self) -> Option<&mut [u8]> {
        Some(&mut self.scratch[..])
    }
    fn push(&mut self, len: usize) {
        self.packets.push(self.scratch[..len].to_vec());
    }
}

/// Delivers datagrams between devices by address until none is left.
fn pump(
    devices: &mut [(SocketAddr, &mut Device)],
    mut queue: Vec<(SocketAddr, SocketAddr, Vec<u8>)>,
    now: Instant,
) -> Vec<(SocketAddr, Vec<u8>)> {
    let mut delivered = Vec::new();
    while let Some((from, to, datagram)) = queue.pop() {
        let Some((_, device)) = devices.iter_mut().find(|(a, _)| *a == to) else {
            continue;
        };
        let mut out = Collect::new();
        let mut overlay = Collect::new();
        device.decapsulate(from, &datagram, now, &mut overlay, &mut out);
        delivered.extend(overlay.packets.into_iter().map(|p| (to, p)));
        queue.extend(out.datagrams.into_iter().map(|(t, d)| (to, t, d)));
    }
    delivered
}

/// Site A's gateway shares 10.2/16 between site B's two gateways: A's flows reach both, and
/// what each sends from 10.2/16 is accepted (from outside it, not).
#[test]
fn every_member_carries_its_flows_and_is_accepted_from_the_shared_prefix() {
    let now = Instant::now();
    let (ka, kb1, kb2) = (
        PrivateKey::generate(),
        PrivateKey::generate(),
        PrivateKey::generate(),
    );
    let addr = |n: u8| -> SocketAddr { format!("192.0.2.{n}:51820").parse().unwrap() };
    let to_a = PeerSettings::new(ka.public_key())
        .endpoint(addr(1))
        .allowed_ip(net("10.1.0.0/16"));
    let env = |seed| Environment::seeded(seed, Duration::from_secs(1));
    let mut a = Device::new(
        settings(&ka, 51820),
        [(&kb1, 2), (&kb2, 3)]
            .iter()
            .map(|(k, n)| {
                PeerSettings::new(k.public_key())
                    .endpoint(addr(*n))
                    .shared_ips([net("10.2.0.0/16")])
            })
            .collect(),
        now,
        env(1),
    );
    let mut b1 = Device::new(settings(&kb1, 51820), vec![to_a.clone()], now, env(2));
    let mut b2 = Device::new(settings(&kb2, 51820), vec![to_a], now, env(3));

    // A's flows, each to the member it chooses (the first packet of each starts a handshake).
    let flows = flows();
    let mut queue = Vec::new();
    for round in 0..2 {
        for f in &flows[..200] {
            let mut frame = f.clone();
            frame.resize(MAX_DATAGRAM, 0);
            let mut out = Collect::new();
            a.encapsulate(&mut frame, f.len(), now, &mut out);
            queue.extend(out.datagrams.into_iter().map(|(to, d)| (addr(1), to, d)));
        }
        let mut devices = [(addr(1), &mut a), (addr(2), &mut b1), (addr(3), &mut b2)];
        let delivered = pump(&mut devices, std::mem::take(&mut queue), now);
        if round == 1 {
            // Every flow arrived, whole, at the gateway the device chose for it.
            assert_eq!(delivered.len(), 200);
            let chosen: Vec<Option<PublicKey>> = choices(&a, &flows[..200]);
            for (to, packet) in &delivered {
                let i = flows[..200]
                    .iter()
                    .position(|f| f == packet)
                    .expect("a packet sent");
                let want = if *to == addr(2) {
                    kb1.public_key()
                } else {
                    kb2.public_key()
                };
                assert_eq!(chosen[i], Some(want));
            }
            assert!(delivered.iter().any(|(to, _)| *to == addr(2)));
            assert!(delivered.iter().any(|(to, _)| *to == addr(3)));
        }
    }

    // Back from both members: accepted from 10.2/16, dropped from elsewhere.
    let mut sent = Vec::new();
    for (n, device) in [(2u8, &mut b1), (3, &mut b2)] {
        for src in [[10, 2, 0, n], [10, 9, 0, n]] {
            let p = udp_packet(src, [10, 1, 0, 1], 4000);
            let mut frame = p.clone();
            frame.resize(MAX_DATAGRAM, 0);
            let mut out = Collect::new();
            device.encapsulate(&mut frame, p.len(), now, &mut out);
            assert_eq!(out.datagrams.len(), 1);
            sent.extend(out.datagrams.into_iter().map(|(to, d)| (addr(n), to, d)));
        }
    }
    let mut devices = [(addr(1), &mut a), (addr(2), &mut b1), (addr(3), &mut b2)];
    let delivered = pump(&mut devices, sent, now);
    let sources: Vec<[u8; 4]> = delivered
        .iter()
        .map(|(_, p)| [p[12], p[13], p[14], p[15]])
        .collect();
    assert_eq!(sources.len(), 2, "{sources:?}");
    assert!(sources.contains(&[10, 2, 0, 2]) && sources.contains(&[10, 2, 0, 3]));
    assert_eq!(a.stats().drops(DropReason::SourceNotAllowed), 2);
}
