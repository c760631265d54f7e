//! A restart storm: many WireGuard spokes, each a real initiator (tunneld's own protocol
//! core, one `Device` per spoke with its own key), all starting a handshake with one hub
//! within a second, from a few hundred source addresses, as the branch offices of a hub do
//! when it comes back from a restart. A spoke keeps a cookie reply's cookie for its next
//! retransmission (5 s later, the protocol's timer), as every WireGuard initiator does.
//! A spoke is done when an ICMP echo it sent through its new session comes back from the
//! hub's kernel: the session is confirmed at the hub and data went both ways. Like ping, a
//! spoke sends its echo again each second until one comes back, so a lost datagram delays
//! a spoke rather than leaving it out.
//!
//! Used by `tests/hub.rs` and by `cargo xtask bench-hub` (which includes this file), so
//! the test and the benchmark drive the hub the same way. It runs in the calling thread,
//! which must be in the namespace whose addresses `sources` are; it is bounded by
//! `deadline`.

#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};
use tunneld_crypto::{PrivateKey, PublicKey};
use tunneld_wireguard::{DatagramSink, Device, DeviceSettings, PacketSink, PeerSettings};

/// The hub's address inside the tunnel; spoke `i` is [`spoke_ip`]`(i)`.
pub const HUB_TUNNEL_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const TICK: Duration = Duration::from_millis(250);
/// How often a spoke whose echo has not come back sends it again (ping's interval).
const ECHO_AGAIN: Duration = Duration::from_secs(1);

/// Spoke `i`'s address inside the tunnel: 10.0.0.2 onwards (a /8 holds 16 M).
pub fn spoke_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 0, 0, 2)) + i as u32)
}

/// The hub's `wg setconf` file for these spokes: each allowed its one address.
pub fn hub_setconf(hub: &PrivateKey, listen_port: u16, spokes: &[PublicKey]) -> String {
    let mut conf = String::with_capacity(100 + spokes.len() * 110);
    conf.push_str(&format!(
        "[Interface]\nPrivateKey = {}\nListenPort = {listen_port}\n",
        &*hub.to_base64()
    ));
    for (i, key) in spokes.iter().enumerate() {
        conf.push_str(&format!(
            "\n[Peer]\nPublicKey = {}\nAllowedIPs = {}/32\n",
            key.to_base64(),
            spoke_ip(i)
        ));
    }
    conf
}

#[derive(Debug, Clone)]
pub struct StormReport {
    pub spokes: usize,
    /// Spokes whose echo came back.
    pub confirmed: usize,
    /// From the first initiation to the last spoke's echo (or the deadline).
    pub took: Duration,
    /// Initiations sent beyond one per spoke.
    pub retransmissions: u64,
    pub cookie_replies: u64,
    pub responses: u64,
    /// When each spoke was done, from the start.
    pub done_at: Vec<Option<Duration>>,
    /// Why the storm stopped early (a spoke's socket could not be made), if it did. Not a
    /// panic: the benchmark runs with `panic = "abort"`, and its namespaces and hub must
    /// still be removed.
    pub error: Option<String>,
    /// The spokes' own drops, by reason, summed (what they refused of the hub's replies).
    pub spoke_drops: Vec<(String, u64)>,
    /// With a zero spread: how long making every spoke's first initiation took, before the
    /// storm's clock started.
    pub prepared: Duration,
}

/// One datagram or packet a spoke's device wrote.
struct Out {
    scratch: Vec<u8>,
    items: Vec<(usize, Option<SocketAddr>)>,
    bytes: Vec<u8>,
}

impl Out {
    fn new() -> Out {
        Out {
            scratch: vec![0; 2048],
            items: Vec::new(),
            bytes: Vec::new(),
        }
    }
    fn clear(&mut self) {
        self.items.clear();
        self.bytes.clear();
    }
    fn iter(&self) -> impl Iterator<Item = (&[u8], Option<SocketAddr>)> + '_ {
        let mut at = 0;
        self.items.iter().map(move |&(len, to)| {
            let item = &self.bytes[at..at + len];
            at += len;
            (item, to)
        })
    }
}

impl DatagramSink for Out {
    fn slot(&mut self) -> Option<&mut [u8]> {
        Some(&mut self.scratch)
    }
    fn push(&mut self, len: usize, to: SocketAddr) {
        self.bytes.extend_from_slice(&self.scratch[..len]);
        self.items.push((len, Some(to)));
    }
}

impl PacketSink for Out {
    fn slot(&mut self) -> Option<&mut [u8]> {
        Some(&mut self.scratch)
    }
    fn push(&mut self, len: usize) {
        self.bytes.extend_from_slice(&self.scratch[..len]);
        self.items.push((len, None));
    }
}

/// An ICMP echo request from `src` to `dst` with both checksums right (the hub's kernel
/// answers it).
pub fn echo_request(src: Ipv4Addr, dst: Ipv4Addr, id: u16) -> Vec<u8> {
    let mut p = vec![0u8; 28 + 8];
    let len = p.len() as u16;
    p[0] = 0x45;
    p[2..4].copy_from_slice(&len.to_be_bytes());
    p[8] = 64;
    p[9] = 1;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    let sum = checksum(&p[..20]);
    p[10..12].copy_from_slice(&sum.to_be_bytes());
    p[20] = 8;
    p[24..26].copy_from_slice(&id.to_be_bytes());
    p[26..28].copy_from_slice(&1u16.to_be_bytes());
    p[28..].copy_from_slice(b"spoke!!!");
    let sum = checksum(&p[20..]);
    p[22..24].copy_from_slice(&sum.to_be_bytes());
    p
}

fn checksum(bytes: &[u8]) -> u16 {
    let mut sum = 0u32;
    for pair in bytes.chunks(2) {
        let word = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Whether `packet` is the echo reply to spoke `ip`.
fn is_echo_reply_to(packet: &[u8], ip: Ipv4Addr) -> bool {
    packet.len() >= 28 && packet[9] == 1 && packet[16..20] == ip.octets() && packet[20] == 0
}

/// The spokes: their keys (for the hub's configuration) and their devices.
pub struct Spokes {
    keys: Vec<PrivateKey>,
}

impl Spokes {
    pub fn new(count: usize) -> Spokes {
        Spokes {
            keys: (0..count).map(|_| PrivateKey::generate()).collect(),
        }
    }

    pub fn public_keys(&self) -> Vec<PublicKey> {
        self.keys.iter().map(PrivateKey::public_key).collect()
    }

    /// The first `count` spokes start a handshake with `hub` at `endpoint` within `spread`,
    /// spoke `i` from its own port on `sources[i % sources.len()]`; runs until every such
    /// spoke's echo came back or `deadline` passed. A spoke is a socket: `count` is bounded
    /// by the limit of open files ([`max_spokes`]). A zero `spread` is the harshest storm:
    /// every spoke's state and first initiation are made before the clock starts (the
    /// generator would otherwise spread them over the time it takes to make them), then all
    /// the initiations are sent at once; a spoke's retransmission timer runs from when its
    /// initiation was made ([`StormReport::prepared`] before the storm).
    pub fn storm(
        &self,
        count: usize,
        hub: PublicKey,
        endpoint: SocketAddr,
        sources: &[IpAddr],
        spread: Duration,
        deadline: Duration,
    ) -> StormReport {
        let n = count.min(self.keys.len());
        raise_fd_limit(n as u64 + 1024);
        // SAFETY: epoll_create1 takes a flag and returns a new descriptor or -1.
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(
            epoll >= 0,
            "epoll_create1: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: `epoll` is ours and open; the wrapper closes it once.
        let epoll = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(epoll) };
        // Made as they start, so the storm's first second is not spent making every
        // spoke's state before any is sent; with no spread, all made first.
        let mut spokes: Vec<Option<(Device, UdpSocket)>> = (0..n).map(|_| None).collect();
        let mut started_count = 0usize;
        let mut error = None;
        let mut first: Vec<Out> = Vec::new();
        let preparing = Instant::now();
        if spread.is_zero() {
            for (i, slot) in spokes.iter_mut().enumerate() {
                let mut out = Out::new();
                match self.make_spoke(i, hub, endpoint, sources, &epoll, Instant::now(), &mut out) {
                    Ok(spoke) => *slot = Some(spoke),
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
                first.push(out);
            }
        }
        let prepared = preparing.elapsed();
        let started = Instant::now();
        let mut done_at: Vec<Option<Duration>> = vec![None; n];
        // When each spoke last sent (or queued) its echo.
        let mut echoed: Vec<Instant> = vec![started; n];
        let mut done = 0usize;
        let (mut initiations, mut cookie_replies, mut responses) = (0u64, 0u64, 0u64);
        let mut out = Out::new();
        let mut overlay = Out::new();
        let mut next_tick = started + TICK;
        let mut buf = vec![0u8; 2048];
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];

        let send = |out: &Out, socket: &UdpSocket, initiations: &mut u64| {
            for (datagram, to) in out.iter() {
                if let Some(to) = to {
                    if datagram.first() == Some(&1) {
                        *initiations += 1;
                    }
                    let _ = socket.send_to(datagram, to);
                }
            }
        };

        if error.is_none() && spread.is_zero() {
            for (spoke, out) in spokes.iter().zip(&first) {
                if let Some((_, socket)) = spoke {
                    send(out, socket, &mut initiations);
                }
            }
            started_count = n;
        }
        drop(first);
        while done < n && started.elapsed() < deadline && error.is_none() {
            let now = Instant::now();
            // Start the spokes due by now: spoke i at i/n of the spread.
            let due = if spread.is_zero() {
                n
            } else {
                ((now - started).as_secs_f64() / spread.as_secs_f64() * n as f64).ceil() as usize
            }
            .min(n);
            // At most 256 at a time, so replies are read in between.
            let until = due.min(started_count + 256);
            while started_count < until {
                let i = started_count;
                started_count += 1;
                match self.make_spoke(i, hub, endpoint, sources, &epoll, now, &mut out) {
                    Ok(spoke) => {
                        send(&out, &spoke.1, &mut initiations);
                        spokes[i] = Some(spoke);
                        echoed[i] = now;
                    }
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }

            let timeout = if started_count < n { 1 } else { 10 };
            // SAFETY: `events` has room for its length in epoll_event structs.
            let ready = unsafe {
                libc::epoll_wait(
                    epoll.as_raw_fd(),
                    events.as_mut_ptr(),
                    events.len() as i32,
                    timeout,
                )
            };
            for event in &events[..ready.max(0) as usize] {
                let i = event.u64 as usize;
                let Some(Some((device, socket))) = spokes.get_mut(i) else {
                    continue;
                };
                while let Ok((len, from)) = socket.recv_from(&mut buf) {
                    let datagram = &buf[..len];
                    match datagram.first() {
                        Some(2) => responses += 1,
                        Some(3) => cookie_replies += 1,
                        _ => {}
                    }
                    out.clear();
                    overlay.clear();
                    let now = Instant::now();
                    device.decapsulate(from, datagram, now, &mut overlay, &mut out);
                    send(&out, socket, &mut initiations);
                    if done_at[i].is_none()
                        && overlay
                            .iter()
                            .any(|(packet, _)| is_echo_reply_to(packet, spoke_ip(i)))
                    {
                        done_at[i] = Some(started.elapsed());
                        done += 1;
                    }
                }
            }

            let now = Instant::now();
            if now >= next_tick {
                next_tick = now + TICK;
                for (i, spoke) in spokes.iter_mut().enumerate() {
                    if done_at[i].is_some() {
                        continue;
                    }
                    if let Some((device, socket)) = spoke {
                        out.clear();
                        device.tick(now, &mut out);
                        if now.saturating_duration_since(echoed[i]) >= ECHO_AGAIN {
                            echoed[i] = now;
                            let mut packet = echo_request(spoke_ip(i), HUB_TUNNEL_IP, i as u16);
                            let len = packet.len();
                            packet.resize(len + 64, 0);
                            device.encapsulate(&mut packet, len, now, &mut out);
                        }
                        send(&out, socket, &mut initiations);
                    }
                }
            }
        }
        let mut drops: std::collections::BTreeMap<String, u64> = Default::default();
        for (device, _) in spokes.iter().flatten() {
            for (reason, n) in device.stats().nonzero_drops() {
                *drops.entry(reason.to_string()).or_default() += n;
            }
        }
        let took = done_at
            .iter()
            .flatten()
            .max()
            .copied()
            .filter(|_| done == n)
            .unwrap_or_else(|| started.elapsed());
        StormReport {
            spokes: n,
            confirmed: done,
            took,
            retransmissions: initiations.saturating_sub(n as u64),
            cookie_replies,
            responses,
            done_at,
            error,
            spoke_drops: drops.into_iter().collect(),
            prepared,
        }
    }

    /// Spoke `i`'s device and socket (registered with `epoll`), its first initiation (a
    /// packet for the hub, queued behind the handshake) written to `out`.
    #[allow(clippy::too_many_arguments)]
    fn make_spoke(
        &self,
        i: usize,
        hub: PublicKey,
        endpoint: SocketAddr,
        sources: &[IpAddr],
        epoll: &std::os::fd::OwnedFd,
        now: Instant,
        out: &mut Out,
    ) -> Result<(Device, UdpSocket), String> {
        let ip = sources[i % sources.len()];
        let socket = UdpSocket::bind(SocketAddr::new(ip, 0))
            .and_then(|s| s.set_nonblocking(true).map(|()| s))
            .map_err(|e| format!("spoke {i}: a socket on {ip}: {e}"))?;
        let mut event = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: i as u64,
        };
        // SAFETY: both descriptors are open; `event` is a valid epoll_event.
        let rc = unsafe {
            libc::epoll_ctl(
                epoll.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                socket.as_raw_fd(),
                &mut event,
            )
        };
        assert_eq!(rc, 0, "epoll_ctl: {}", std::io::Error::last_os_error());
        let mut device = Device::new(
            DeviceSettings {
                private_key: self.keys[i].clone(),
                listen_port: 0,
                mtu: 1420,
                fwmark: 0,
            },
            vec![PeerSettings::new(hub)
                .endpoint(endpoint)
                .allowed_ip("10.0.0.0/8".parse().unwrap())],
            now,
            tunneld_dataplane::system_environment(),
        );
        let mut packet = echo_request(spoke_ip(i), HUB_TUNNEL_IP, i as u16);
        let len = packet.len();
        packet.resize(len + 64, 0);
        out.clear();
        device.encapsulate(&mut packet, len, now, out);
        Ok((device, socket))
    }
}

/// How many spokes one storm can run: a socket each, within the hard limit of open files
/// (less room for the rest of the process).
pub fn max_spokes() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 0;
    }
    usize::try_from(limit.rlim_max.saturating_sub(1024)).unwrap_or(usize::MAX)
}

/// A socket per spoke: raises the soft (and if need be the hard) limit of open files.
fn raise_fd_limit(want: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 || limit.rlim_cur >= want {
        return;
    }
    limit.rlim_cur = want;
    limit.rlim_max = limit.rlim_max.max(want);
    // SAFETY: setrlimit reads one rlimit.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
}
