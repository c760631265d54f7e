//! WireGuard over TLS: a bridge between a loopback UDP socket and a TLS stream of
//! length-prefixed datagrams (`tunneld_tunnel::framing`). The WireGuard worker is unchanged:
//! it sends to and hears from the bridge's loopback address as it would a UDP peer.
//!
//! - Client side (a peer with `transport = "tls"`): the peer's endpoint is the bridge socket
//!   (127.0.0.1), made at start and kept across reconnects; a thread per peer connects to the
//!   other tunneld, runs the bridge, and reconnects with backoff when the stream ends.
//! - Server side (`[[tls.listen]]` with `forward_to = "wireguard"`): each accepted stream gets
//!   its own loopback socket aimed at the interface's port; WireGuard learns it as the peer's
//!   endpoint from the first authenticated packet, as it does for any roaming peer.
//!
//! The stream never stalls the worker: the bridge reads its UDP socket only while the TLS
//! side has taken everything before, so when the stream is slow the datagrams wait in, and
//! overflow from, the UDP socket's buffer: lost as UDP would lose them, never blocking.

use anyhow::{bail, Context};
use rustls::Connection;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tunneld_tunnel::framing::{length_prefix, Deframer, LENGTH_BYTES, MAX_DATAGRAM};

/// Datagrams taken from the UDP socket per turn at most, so the other direction gets turns.
const BURST: usize = 64;
/// Bytes of framed datagrams handed to rustls at once (it cuts them into records).
const FRAMES: usize = 256 * 1024;
/// Reconnect backoff: from the first to the last delay, doubling.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(10));

/// Where the bridge sends the datagrams that arrive over TLS.
#[derive(Clone, Debug)]
pub enum UdpPeer {
    /// Client side: the worker's address, learnt from what it sends (known once it has).
    Learnt,
    /// Server side: the interface's UDP port on loopback, known once the interface is up.
    Port(Arc<OnceLock<u16>>),
}

/// Relays between the bridge socket and an established TLS stream until the stream ends
/// (`Ok` for a close_notify, `Err` for anything else).
pub fn bridge(
    udp: &UdpSocket,
    peer: &UdpPeer,
    learnt: &mut Option<SocketAddr>,
    mut tls: TcpStream,
    mut conn: Connection,
) -> anyhow::Result<()> {
    udp.set_nonblocking(true)?;
    tls.set_nonblocking(true)?;
    conn.set_buffer_limit(None);
    let mut frames: Vec<u8> = Vec::with_capacity(FRAMES + LENGTH_BYTES + MAX_DATAGRAM);
    let mut datagram = vec![0u8; MAX_DATAGRAM].into_boxed_slice();
    let mut deframer = Deframer::new();
    loop {
        let mut progress = super::relay::flush_tls(&mut conn, &mut tls)?;
        // UDP → TLS, once the stream has taken what came before.
        if !conn.wants_write() {
            frames.clear();
            for _ in 0..BURST {
                match udp.recv_from(&mut datagram) {
                    Ok((n, from)) => {
                        if matches!(peer, UdpPeer::Learnt) {
                            *learnt = Some(from);
                        }
                        if let Some(prefix) = length_prefix(n).filter(|_| n > 0) {
                            frames.extend_from_slice(&prefix);
                            frames.extend_from_slice(&datagram[..n]);
                        }
                        if frames.len() >= FRAMES {
                            break;
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    // ICMP errors from earlier sends (the worker restarting): not ours to fail on.
                    Err(e) if e.kind() == ErrorKind::ConnectionRefused => {}
                    Err(e) => return Err(e).context("bridge socket receive"),
                }
            }
            if !frames.is_empty() {
                conn.writer().write_all(&frames).context("TLS encrypt")?;
                progress = true;
            }
        }
        // TLS → UDP.
        match conn.read_tls(&mut tls) {
            Ok(0) => {
                conn.process_new_packets().context("TLS")?;
                deliver(&mut conn, &mut deframer, udp, peer, *learnt)?;
                bail!("the other side closed the TLS stream");
            }
            Ok(_) => {
                if let Err(e) = conn.process_new_packets() {
                    let _ = conn.write_tls(&mut tls);
                    return Err(e).context("TLS");
                }
                if deliver(&mut conn, &mut deframer, udp, peer, *learnt)? {
                    return Ok(());
                }
                progress = true;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => progress = true,
            Err(e) => return Err(e).context("TLS read"),
        }
        if progress {
            continue;
        }
        let mut fds = [
            libc::pollfd {
                fd: udp.as_raw_fd(),
                events: if conn.wants_write() { 0 } else { libc::POLLIN },
                revents: 0,
            },
            libc::pollfd {
                fd: tls.as_raw_fd(),
                events: libc::POLLIN | if conn.wants_write() { libc::POLLOUT } else { 0 },
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfds for the duration of the call.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != ErrorKind::Interrupted {
                return Err(e).context("poll");
            }
        }
    }
}

/// Sends every complete datagram rustls has decrypted to the worker. Returns whether the
/// other side's close_notify was reached.
fn deliver(
    conn: &mut Connection,
    deframer: &mut Deframer,
    udp: &UdpSocket,
    peer: &UdpPeer,
    learnt: Option<SocketAddr>,
) -> anyhow::Result<bool> {
    let to = match peer {
        UdpPeer::Learnt => learnt,
        UdpPeer::Port(port) => port.get().map(|p| SocketAddr::from(([127, 0, 0, 1], *p))),
    };
    loop {
        while let Some(datagram) = deframer.next_datagram() {
            // Until the worker has spoken (client side) there is nowhere to deliver; like a
            // full socket buffer, that loses the datagram, which WireGuard retries.
            if let Some(to) = to {
                match udp.send_to(datagram, to) {
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.kind(),
                            ErrorKind::WouldBlock | ErrorKind::ConnectionRefused
                        ) => {}
                    Err(e) => return Err(e).context("bridge socket send"),
                }
            }
        }
        match conn.reader().read(deframer.space()) {
            Ok(0) => return Ok(true),
            Ok(n) => deframer.filled(n),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => {
                bail!("the TLS stream ended without close_notify (cut short)")
            }
            Err(e) => return Err(e).context("TLS read"),
        }
    }
}

/// A loopback socket for one bridge.
pub fn bridge_socket() -> io::Result<UdpSocket> {
    UdpSocket::bind(("127.0.0.1", 0))
}

/// The client side of one peer, for ever: connect, bridge, and on any end wait and reconnect
/// (backoff doubling to `BACKOFF.1`, back to the start after a stream that lasted).
/// `connected` runs after each (re)connection: the other end may have restarted, so the
/// caller asks WireGuard for a handshake now rather than after its timers give up.
pub fn run_client(
    name: String,
    udp: UdpSocket,
    connect: impl Fn() -> anyhow::Result<(TcpStream, Connection)>,
    connected: impl Fn(),
) {
    let mut delay = BACKOFF.0;
    let mut learnt = None;
    let mut failures: u64 = 0;
    loop {
        let started = Instant::now();
        match connect() {
            Ok((tls, conn)) => {
                tracing::info!("{name}: WireGuard over TLS connected");
                failures = 0;
                connected();
                let ended = bridge(&udp, &UdpPeer::Learnt, &mut learnt, tls, conn);
                match ended {
                    Ok(()) => tracing::info!("{name}: the TLS stream was closed; reconnecting"),
                    Err(e) => tracing::warn!("{name}: TLS stream ended: {e:#}; reconnecting"),
                }
                if started.elapsed() > BACKOFF.1 {
                    delay = BACKOFF.0;
                }
            }
            Err(e) => {
                failures += 1;
                // The first failure and then every doubling: enough to see, never a flood.
                if failures.is_power_of_two() {
                    tracing::warn!("{name}: cannot connect ({failures} attempt(s)): {e:#}");
                }
            }
        }
        std::thread::sleep(delay);
        delay = (delay * 2).min(BACKOFF.1);
    }
}
