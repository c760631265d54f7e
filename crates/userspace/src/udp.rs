//! UDP sockets inside the tunnel.

use crate::engine::{aborted, DatagramParts};
use crate::rings::{self, DatagramShared};
use crate::Link;
use rtrb::{Consumer, Producer};
use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use tokio::io::ReadBuf;

/// A UDP socket inside the tunnel, from [`Tunnel::udp_bind`](crate::Tunnel::udp_bind).
///
/// One task may send while another receives (share it with an `Arc`); several tasks
/// receiving at once on one socket is not supported (only the last one waiting is woken).
/// Connected or not: [`UdpSocket::connect`] sets a default peer for
/// [`UdpSocket::send`]/[`UdpSocket::recv`]. Every wait has a `poll_*` form for code that
/// implements futures or I/O traits itself.
/// A datagram must fit the tunnel's MTU (no fragmentation): larger ones fail with
/// `EMSGSIZE`.
///
/// ```no_run
/// # async fn run(tunnel: tunneld_userspace::Tunnel) -> std::io::Result<()> {
/// let socket = tunnel.udp_bind("[::]:5353".parse().unwrap()).await?;
/// let mut buf = [0u8; 1500];
/// loop {
///     let (n, from) = socket.recv_from(&mut buf).await?;
///     socket.send_to(&buf[..n], from).await?; // echo
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct UdpSocket {
    link: Arc<Link>,
    shared: Arc<DatagramShared>,
    // Each ring end has one user at a time; the engine never takes these locks.
    rx: Mutex<Consumer<u8>>,
    tx: Mutex<Producer<u8>>,
    local: SocketAddr,
    /// Where `send` goes and what `recv` takes from, once connected.
    peer: Mutex<Option<SocketAddr>>,
}

impl UdpSocket {
    pub(crate) fn new(link: Arc<Link>, parts: DatagramParts) -> UdpSocket {
        UdpSocket {
            link,
            shared: parts.shared,
            rx: Mutex::new(parts.rx),
            tx: Mutex::new(parts.tx),
            local: parts.local,
            peer: Mutex::new(None),
        }
    }

    /// The address it is bound to (port 0 was replaced by the chosen port).
    ///
    /// ```no_run
    /// # fn run(socket: tunneld_userspace::UdpSocket) -> std::io::Result<()> {
    /// println!("bound to {}", socket.local_addr()?);
    /// # Ok(()) }
    /// ```
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }

    /// Sends one datagram to `target`; waits while the engine's queue is full.
    ///
    /// Cancel safe: the datagram is queued whole when this returns `Ok`, or not at all.
    ///
    /// ```no_run
    /// # async fn run(socket: tunneld_userspace::UdpSocket) -> std::io::Result<()> {
    /// socket.send_to(b"hello", "10.77.0.2:9".parse().unwrap()).await?;
    /// # Ok(()) }
    /// ```
    pub async fn send_to(&self, buf: &[u8], target: SocketAddr) -> io::Result<usize> {
        poll_fn(|cx| self.poll_send_to(cx, buf, target)).await
    }

    /// Polls to send one datagram to `target`: `Ready(Ok(len))` once it is queued whole,
    /// `Pending` while the engine's queue is full (`cx`'s task is woken when it has room).
    pub fn poll_send_to(
        &self,
        cx: &mut Context<'_>,
        buf: &[u8],
        target: SocketAddr,
    ) -> Poll<io::Result<usize>> {
        let max = if target.is_ipv4() {
            self.link.shared.max_udp_v4
        } else {
            self.link.shared.max_udp_v6
        };
        if buf.len() > max {
            return Poll::Ready(Err(io::Error::from_raw_os_error(libc::EMSGSIZE)));
        }
        for attempt in 0..2 {
            if self.link.shared.is_stopped() {
                return Poll::Ready(Err(aborted()));
            }
            let mut tx = self.tx.lock().unwrap_or_else(PoisonError::into_inner);
            if rings::push_datagram(&mut tx, target, buf) {
                drop(tx);
                if self.shared.engine_wants(&self.shared.tx_idle) {
                    self.link.shared.notify();
                }
                return Poll::Ready(Ok(buf.len()));
            }
            if attempt == 0 {
                self.shared.send_waker.register(cx.waker());
            }
        }
        Poll::Pending
    }

    /// Receives one datagram into `buf` (the rest of a longer one is discarded) and says
    /// how long it was and where it came from.
    ///
    /// Cancel safe: a datagram is taken only when this returns it.
    ///
    /// ```no_run
    /// # async fn run(socket: tunneld_userspace::UdpSocket) -> std::io::Result<()> {
    /// let mut buf = [0u8; 1500];
    /// let (n, from) = socket.recv_from(&mut buf).await?;
    /// # Ok(()) }
    /// ```
    pub async fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        let mut buf = ReadBuf::new(buf);
        let from = poll_fn(|cx| self.poll_recv_from(cx, &mut buf)).await?;
        Ok((buf.filled().len(), from))
    }

    /// Polls for a datagram: `Ready(Ok(from))` with as much of it as fits put into `buf`
    /// (the rest is discarded), else `Pending` with `cx`'s task woken when one arrives. On
    /// a connected socket, datagrams from elsewhere are discarded.
    pub fn poll_recv_from(
        &self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<SocketAddr>> {
        let connected = *self.peer.lock().unwrap_or_else(PoisonError::into_inner);
        for attempt in 0..2 {
            if self.link.shared.is_stopped() {
                return Poll::Ready(Err(aborted()));
            }
            let mut rx = self.rx.lock().unwrap_or_else(PoisonError::into_inner);
            while let Some((from, len)) = rings::peek_datagram(&mut rx) {
                if connected.is_some_and(|peer| peer != from) {
                    rings::take_datagram(&mut rx, len, &mut []);
                    continue;
                }
                let n = rings::take_datagram(&mut rx, len, buf.initialize_unfilled());
                buf.advance(n);
                drop(rx);
                if self.shared.engine_wants(&self.shared.rx_blocked) {
                    self.link.shared.notify();
                }
                return Poll::Ready(Ok(from));
            }
            if rx.is_abandoned() {
                return Poll::Ready(Err(aborted()));
            }
            if attempt == 0 {
                self.shared.recv_waker.register(cx.waker());
            }
        }
        Poll::Pending
    }

    /// Sets the socket's default destination: [`UdpSocket::send`] goes there, and
    /// [`UdpSocket::recv`] (and `recv_from`) take only datagrams from there, as a
    /// connected UDP socket does. Checks only that the tunnel routes it (no packet is
    /// sent); connecting again replaces it.
    ///
    /// ```no_run
    /// # async fn run(socket: tunneld_userspace::UdpSocket) -> std::io::Result<()> {
    /// socket.connect("10.77.0.53:53".parse().unwrap())?;
    /// socket.send(b"query").await?;
    /// let mut reply = [0u8; 512];
    /// let n = socket.recv(&mut reply).await?;
    /// # Ok(()) }
    /// ```
    pub fn connect(&self, peer: SocketAddr) -> io::Result<()> {
        if peer.port() == 0 || peer.ip().is_unspecified() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot connect to {peer}"),
            ));
        }
        *self.peer.lock().unwrap_or_else(PoisonError::into_inner) = Some(peer);
        Ok(())
    }

    /// The address it is connected to; `NotConnected` before [`UdpSocket::connect`].
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.peer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .ok_or_else(not_connected)
    }

    /// Sends one datagram to the connected address. Cancel safe, as `send_to`.
    pub async fn send(&self, buf: &[u8]) -> io::Result<usize> {
        let peer = self.peer_addr()?;
        self.send_to(buf, peer).await
    }

    /// [`UdpSocket::send`]'s poll form.
    pub fn poll_send(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.peer_addr() {
            Ok(peer) => self.poll_send_to(cx, buf, peer),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    /// Receives one datagram from the connected address into `buf` and says how long it
    /// was (cut to `buf`). Cancel safe, as `recv_from`.
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.peer_addr()?;
        Ok(self.recv_from(buf).await?.0)
    }

    /// [`UdpSocket::recv`]'s poll form.
    pub fn poll_recv(&self, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if let Err(e) = self.peer_addr() {
            return Poll::Ready(Err(e));
        }
        self.poll_recv_from(cx, buf).map_ok(drop)
    }
}

fn not_connected() -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        "the UDP socket is not connected",
    )
}

impl Drop for UdpSocket {
    fn drop(&mut self) {
        self.shared
            .closed
            .store(true, std::sync::atomic::Ordering::Release);
        self.link.shared.notify();
    }
}
