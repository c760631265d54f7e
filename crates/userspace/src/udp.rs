//! UDP sockets inside the tunnel.

use crate::engine::{aborted, DatagramParts};
use crate::rings::{self, DatagramShared};
use crate::Link;
use rtrb::{Consumer, Producer};
use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;

/// A UDP socket inside the tunnel, from [`Tunnel::udp_bind`](crate::Tunnel::udp_bind).
///
/// One task may send while another receives (share it with an `Arc`); several tasks
/// receiving at once on one socket is not supported (only the last one waiting is woken).
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
}

impl UdpSocket {
    pub(crate) fn new(link: Arc<Link>, parts: DatagramParts) -> UdpSocket {
        UdpSocket {
            link,
            shared: parts.shared,
            rx: Mutex::new(parts.rx),
            tx: Mutex::new(parts.tx),
            local: parts.local,
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
        let max = if target.is_ipv4() {
            self.link.shared.max_udp_v4
        } else {
            self.link.shared.max_udp_v6
        };
        if buf.len() > max {
            return Err(io::Error::from_raw_os_error(libc::EMSGSIZE));
        }
        poll_fn(|cx| {
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
        })
        .await
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
        poll_fn(|cx| {
            for attempt in 0..2 {
                if self.link.shared.is_stopped() {
                    return Poll::Ready(Err(aborted()));
                }
                let mut rx = self.rx.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some((from, len)) = rings::peek_datagram(&mut rx) {
                    let n = rings::take_datagram(&mut rx, len, buf);
                    drop(rx);
                    if self.shared.engine_wants(&self.shared.rx_blocked) {
                        self.link.shared.notify();
                    }
                    return Poll::Ready(Ok((n, from)));
                }
                if rx.is_abandoned() {
                    return Poll::Ready(Err(aborted()));
                }
                if attempt == 0 {
                    self.shared.recv_waker.register(cx.waker());
                }
            }
            Poll::Pending
        })
        .await
    }
}

impl Drop for UdpSocket {
    fn drop(&mut self) {
        self.shared
            .closed
            .store(true, std::sync::atomic::Ordering::Release);
        self.link.shared.notify();
    }
}
