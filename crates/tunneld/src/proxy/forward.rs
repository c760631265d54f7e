//! Port forwards: `[[proxy.forward]]` (a local port to an address in the tunnel) and
//! `[[proxy.reverse]]` (a port inside the tunnel to a local address), TCP and UDP. A UDP
//! forward keeps a session per client address (its own socket on the far side, so replies
//! find their way back), ended after [`UDP_IDLE`] without traffic either way.

use super::{relay::relay, AbortOnDrop, Kind, Shared, Slot};
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::mpsc;
use tunneld_config::Endpoint;

/// A UDP session with no datagram either way for this long ends.
pub(super) const UDP_IDLE: Duration = Duration::from_secs(60);
const MAX_DATAGRAM: usize = 65_535;

/// A local connection to `to` through the tunnel.
pub(super) async fn tcp(
    shared: Arc<Shared>,
    stream: TcpStream,
    from: SocketAddr,
    to: Arc<Endpoint>,
) {
    let addrs = match shared.resolve_endpoint(&to).await {
        Ok(addrs) => addrs,
        Err(e) => {
            tracing::warn!("forward {from} to {to}: cannot resolve: {e}");
            return;
        }
    };
    match shared.connect_any(&addrs).await {
        Ok(tunnel) => relay(stream, tunnel, &shared.counters).await,
        Err(e) => tracing::warn!("forward {from} to {to}: {e}"),
    }
}

/// Connections arriving inside the tunnel on `listener`, each to the local `to`.
pub(super) async fn reverse_tcp(
    shared: Arc<Shared>,
    listener: tunneld_userspace::TcpListener,
    to: SocketAddr,
) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tunnel, from)) => {
                    let Some(slot) = shared.admit(Kind::Reverse) else {
                        continue;
                    };
                    let shared = shared.clone();
                    connections.spawn(async move {
                        match TcpStream::connect(to).await {
                            Ok(local) => {
                                let _ = local.set_nodelay(true);
                                relay(local, tunnel, &shared.counters).await;
                            }
                            Err(e) => tracing::warn!("reverse {from} to {to}: {e}"),
                        }
                        drop(slot);
                    });
                }
                Err(e) => {
                    tracing::warn!("reverse to {to}: the listener in the tunnel failed: {e}");
                    return;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Seconds since `start`, as the sessions' last-used clock.
fn seconds_since(start: Instant) -> u64 {
    start.elapsed().as_secs()
}

struct Session {
    /// Where the client's datagrams go (a socket of the session's own).
    send: SessionSocket,
    last_used: Arc<AtomicU64>,
    _replies: AbortOnDrop,
    _slot: Slot,
}

enum SessionSocket {
    Tunnel(Arc<tunneld_userspace::UdpSocket>),
    Local(Arc<UdpSocket>),
}

/// `[[proxy.forward]]` with `protocol = "udp"`: datagrams from local clients to `to` through
/// the tunnel, and the answers back to each client.
pub(super) async fn udp(shared: Arc<Shared>, socket: UdpSocket, to: Endpoint) {
    let socket = Arc::new(socket);
    let start = Instant::now();
    let mut sessions: HashMap<SocketAddr, Session> = HashMap::new();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut sweep = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            received = socket.recv_from(&mut buf) => {
                let Ok((n, client)) = received else { continue };
                let payload = buf.get(..n).unwrap_or_default();
                let session = match sessions.entry(client) {
                    Entry::Occupied(open) => open.into_mut(),
                    Entry::Vacant(slot) => match open_forward_session(&shared, &socket, client, &to, start).await {
                        Some(session) => slot.insert(session),
                        None => continue,
                    },
                };
                session.last_used.store(seconds_since(start), Ordering::Relaxed);
                if let SessionSocket::Tunnel(tunnel) = &session.send {
                    match tunnel.send(payload).await {
                        Ok(_) => {
                            shared.counters.to_tunnel.fetch_add(n as u64, Ordering::Relaxed);
                        }
                        Err(e) => tracing::debug!("forward udp {client} to {to}: {e}"),
                    }
                }
            }
            _ = sweep.tick() => {
                let now = seconds_since(start);
                sessions.retain(|_, s| now.saturating_sub(s.last_used.load(Ordering::Relaxed)) < UDP_IDLE.as_secs());
            }
        }
    }
}

async fn open_forward_session(
    shared: &Arc<Shared>,
    socket: &Arc<UdpSocket>,
    client: SocketAddr,
    to: &Endpoint,
    start: Instant,
) -> Option<Session> {
    let slot = shared.admit(Kind::Forward)?;
    let target = match shared.resolve_endpoint(to).await {
        Ok(addrs) => *addrs.first()?,
        Err(e) => {
            tracing::warn!("forward udp {client} to {to}: cannot resolve: {e}");
            return None;
        }
    };
    let tunnel = match shared
        .tunnel
        .udp_bind(SocketAddr::from(([0, 0, 0, 0], 0)))
        .await
        .and_then(|s| s.connect(target).map(|()| s))
    {
        Ok(tunnel) => Arc::new(tunnel),
        Err(e) => {
            tracing::warn!("forward udp {client} to {to}: no socket in the tunnel: {e}");
            return None;
        }
    };
    let last_used = Arc::new(AtomicU64::new(seconds_since(start)));
    let replies = {
        let (tunnel, socket, last_used, shared) = (
            tunnel.clone(),
            socket.clone(),
            last_used.clone(),
            shared.clone(),
        );
        tokio::spawn(async move {
            let mut buf = vec![0u8; MAX_DATAGRAM];
            while let Ok(n) = tunnel.recv(&mut buf).await {
                last_used.store(seconds_since(start), Ordering::Relaxed);
                if socket
                    .send_to(buf.get(..n).unwrap_or_default(), client)
                    .await
                    .is_ok()
                {
                    shared
                        .counters
                        .from_tunnel
                        .fetch_add(n as u64, Ordering::Relaxed);
                }
            }
        })
    };
    Some(Session {
        send: SessionSocket::Tunnel(tunnel),
        last_used,
        _replies: AbortOnDrop(replies),
        _slot: slot,
    })
}

/// `[[proxy.reverse]]` with `protocol = "udp"`: datagrams arriving inside the tunnel on
/// `socket`, each sender a session with a local socket of its own towards `to`; the answers
/// go back through one queue, as the tunnel's socket has one sender at a time.
pub(super) async fn reverse_udp(
    shared: Arc<Shared>,
    socket: tunneld_userspace::UdpSocket,
    to: SocketAddr,
) {
    let start = Instant::now();
    let (answers_tx, mut answers) = mpsc::channel::<(SocketAddr, Vec<u8>)>(256);
    let mut sessions: HashMap<SocketAddr, Session> = HashMap::new();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut sweep = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            received = socket.recv_from(&mut buf) => {
                let Ok((n, peer)) = received else {
                    tracing::warn!("reverse udp to {to}: the socket in the tunnel closed");
                    return;
                };
                let session = match sessions.entry(peer) {
                    Entry::Occupied(open) => open.into_mut(),
                    Entry::Vacant(slot) => match open_reverse_session(&shared, peer, to, &answers_tx, start).await {
                        Some(session) => slot.insert(session),
                        None => continue,
                    },
                };
                session.last_used.store(seconds_since(start), Ordering::Relaxed);
                if let SessionSocket::Local(local) = &session.send {
                    if local.send(buf.get(..n).unwrap_or_default()).await.is_ok() {
                        shared.counters.from_tunnel.fetch_add(n as u64, Ordering::Relaxed);
                    }
                }
            }
            Some((peer, answer)) = answers.recv() => {
                if socket.send_to(&answer, peer).await.is_ok() {
                    shared.counters.to_tunnel.fetch_add(answer.len() as u64, Ordering::Relaxed);
                }
            }
            _ = sweep.tick() => {
                let now = seconds_since(start);
                sessions.retain(|_, s| now.saturating_sub(s.last_used.load(Ordering::Relaxed)) < UDP_IDLE.as_secs());
            }
        }
    }
}

async fn open_reverse_session(
    shared: &Arc<Shared>,
    peer: SocketAddr,
    to: SocketAddr,
    answers: &mpsc::Sender<(SocketAddr, Vec<u8>)>,
    start: Instant,
) -> Option<Session> {
    let slot = shared.admit(Kind::Reverse)?;
    let any: SocketAddr = if to.is_ipv4() {
        SocketAddr::from(([0, 0, 0, 0], 0))
    } else {
        SocketAddr::from(([0u16; 8], 0))
    };
    let local = match UdpSocket::bind(any).await {
        Ok(local) => local,
        Err(e) => {
            tracing::warn!("reverse udp {peer} to {to}: {e}");
            return None;
        }
    };
    if let Err(e) = local.connect(to).await {
        tracing::warn!("reverse udp {peer} to {to}: {e}");
        return None;
    }
    let local = Arc::new(local);
    let last_used = Arc::new(AtomicU64::new(seconds_since(start)));
    let replies = {
        let (local, last_used, answers) = (local.clone(), last_used.clone(), answers.clone());
        tokio::spawn(async move {
            let mut buf = vec![0u8; MAX_DATAGRAM];
            loop {
                let n = match local.recv(&mut buf).await {
                    Ok(n) => n,
                    // An ICMP port unreachable from the local service: it may start later.
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => continue,
                    Err(_) => return,
                };
                last_used.store(seconds_since(start), Ordering::Relaxed);
                let answer = buf.get(..n).unwrap_or_default().to_vec();
                if answers.send((peer, answer)).await.is_err() {
                    return;
                }
            }
        })
    };
    Some(Session {
        send: SessionSocket::Local(local),
        last_used,
        _replies: AbortOnDrop(replies),
        _slot: slot,
    })
}
