//! TCP streams and listeners inside the tunnel, as tokio I/O objects.

use crate::engine::{aborted, ListenerParts, StreamParts};
use crate::rings::{StreamShared, ERR_RESET};
use crate::Link;
use rtrb::{Consumer, Producer};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;

/// A TCP connection through the tunnel, made by [`Tunnel::tcp_connect`](crate::Tunnel::tcp_connect)
/// or [`TcpListener::accept`]. Implements tokio's [`AsyncRead`] and [`AsyncWrite`];
/// [`AsyncWrite::poll_shutdown`] sends FIN. Dropping it closes the connection gracefully
/// (what was written is still delivered).
///
/// Reads and writes never block the thread; a write returns once its bytes are in the
/// stream's ring to the engine (they are then sent even if the stream is dropped).
///
/// ```no_run
/// # async fn run(tunnel: tunneld_userspace::Tunnel) -> std::io::Result<()> {
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
/// let mut stream = tunnel.tcp_connect("10.77.0.2:7").await?;
/// stream.write_all(b"ping").await?;
/// stream.shutdown().await?; // FIN: the echo server ends its reply
/// let mut reply = Vec::new();
/// stream.read_to_end(&mut reply).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TcpStream {
    read: OwnedReadHalf,
    write: OwnedWriteHalf,
}

/// The reading half of a [`TcpStream`], from [`TcpStream::into_split`].
///
/// ```no_run
/// # async fn run(stream: tunneld_userspace::TcpStream) -> std::io::Result<()> {
/// use tokio::io::AsyncReadExt;
/// let (mut read, _write) = stream.into_split();
/// let mut buf = [0u8; 1024];
/// let n = read.read(&mut buf).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct OwnedReadHalf {
    link: Arc<Link>,
    shared: Arc<StreamShared>,
    rx: Consumer<u8>,
    local: SocketAddr,
    peer: SocketAddr,
}

/// The writing half of a [`TcpStream`], from [`TcpStream::into_split`]. Dropping it sends
/// FIN, like [`AsyncWrite::poll_shutdown`].
///
/// ```no_run
/// # async fn run(stream: tunneld_userspace::TcpStream) -> std::io::Result<()> {
/// use tokio::io::AsyncWriteExt;
/// let (_read, mut write) = stream.into_split();
/// write.write_all(b"hello").await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct OwnedWriteHalf {
    link: Arc<Link>,
    shared: Arc<StreamShared>,
    tx: Producer<u8>,
    local: SocketAddr,
    peer: SocketAddr,
}

impl TcpStream {
    pub(crate) fn new(link: Arc<Link>, parts: StreamParts) -> TcpStream {
        TcpStream {
            read: OwnedReadHalf {
                link: link.clone(),
                shared: parts.shared.clone(),
                rx: parts.rx,
                local: parts.local,
                peer: parts.peer,
            },
            write: OwnedWriteHalf {
                link,
                shared: parts.shared,
                tx: parts.tx,
                local: parts.local,
                peer: parts.peer,
            },
        }
    }

    /// The stream's address inside the tunnel.
    ///
    /// ```no_run
    /// # fn run(stream: tunneld_userspace::TcpStream) -> std::io::Result<()> {
    /// println!("from {}", stream.local_addr()?);
    /// # Ok(()) }
    /// ```
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.read.local)
    }

    /// The address of the other end.
    ///
    /// ```no_run
    /// # fn run(stream: tunneld_userspace::TcpStream) -> std::io::Result<()> {
    /// println!("to {}", stream.peer_addr()?);
    /// # Ok(()) }
    /// ```
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.read.peer)
    }

    /// Splits the stream into halves that can move to different tasks (no lock between
    /// them: each owns its direction's ring).
    ///
    /// ```no_run
    /// # async fn run(stream: tunneld_userspace::TcpStream) {
    /// let (mut read, mut write) = stream.into_split();
    /// tokio::spawn(async move { tokio::io::copy(&mut read, &mut tokio::io::sink()).await });
    /// # }
    /// ```
    pub fn into_split(self) -> (OwnedReadHalf, OwnedWriteHalf) {
        (self.read, self.write)
    }
}

impl OwnedReadHalf {
    /// The address of the other end.
    ///
    /// ```no_run
    /// # fn run(read: tunneld_userspace::OwnedReadHalf) {
    /// println!("reading from {}", read.peer_addr());
    /// # }
    /// ```
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }
}

impl OwnedWriteHalf {
    /// The address of the other end.
    ///
    /// ```no_run
    /// # fn run(write: tunneld_userspace::OwnedWriteHalf) {
    /// println!("writing to {}", write.peer_addr());
    /// # }
    /// ```
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// The stream's address inside the tunnel.
    ///
    /// ```no_run
    /// # fn run(write: tunneld_userspace::OwnedWriteHalf) {
    /// println!("writing from {}", write.local_addr());
    /// # }
    /// ```
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

fn reset() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionReset,
        "the connection was reset (or timed out)",
    )
}

impl AsyncRead for OwnedReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        for attempt in 0..2 {
            if this.link.shared.is_stopped() {
                return Poll::Ready(Err(aborted()));
            }
            if buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            let n = this.rx.slots().min(buf.remaining());
            if n > 0 {
                if let Ok(chunk) = this.rx.read_chunk(n) {
                    let (a, b) = chunk.as_slices();
                    buf.put_slice(a);
                    buf.put_slice(b);
                    chunk.commit_all();
                    if this.shared.engine_wants_room() {
                        this.link.shared.notify();
                    }
                    return Poll::Ready(Ok(()));
                }
            }
            if this.shared.error.load(Ordering::Acquire) == ERR_RESET {
                return Poll::Ready(Err(reset()));
            }
            // The engine sets `eof` after its last bytes are in the ring.
            if this.shared.eof.load(Ordering::Acquire) {
                if this.rx.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            if this.rx.is_abandoned() && this.rx.is_empty() {
                return Poll::Ready(Err(aborted()));
            }
            if attempt == 0 {
                this.shared.read_waker.register(cx.waker());
            }
        }
        Poll::Pending
    }
}

impl AsyncWrite for OwnedWriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        for attempt in 0..2 {
            if this.link.shared.is_stopped() {
                return Poll::Ready(Err(aborted()));
            }
            if this.shared.error.load(Ordering::Acquire) == ERR_RESET {
                return Poll::Ready(Err(reset()));
            }
            if this.shared.write_shut.load(Ordering::Acquire) || this.tx.is_abandoned() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "the stream is closed for writing",
                )));
            }
            if buf.is_empty() {
                return Poll::Ready(Ok(0));
            }
            let (pushed, _) = this.tx.push_partial_slice(buf);
            if !pushed.is_empty() {
                if this.shared.engine_wants_data() {
                    this.link.shared.notify();
                }
                return Poll::Ready(Ok(pushed.len()));
            }
            if attempt == 0 {
                this.shared.write_waker.register(cx.waker());
            }
        }
        Poll::Pending
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Written bytes are already the engine's to send.
        if self.link.shared.is_stopped() {
            return Poll::Ready(Err(aborted()));
        }
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.link.shared.is_stopped() {
            return Poll::Ready(Err(aborted()));
        }
        self.shared.write_shut.store(true, Ordering::Release);
        self.link.shared.notify();
        Poll::Ready(Ok(()))
    }
}

impl Drop for OwnedWriteHalf {
    fn drop(&mut self) {
        // FIN once what was written is sent.
        self.shared.write_shut.store(true, Ordering::Release);
        self.link.shared.notify();
    }
}

impl Drop for OwnedReadHalf {
    fn drop(&mut self) {
        self.shared.read_closed.store(true, Ordering::Release);
        self.link.shared.notify();
    }
}

impl AsyncRead for TcpStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().read).poll_read(cx, buf)
    }
}

impl AsyncWrite for TcpStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().write).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().write).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().write).poll_shutdown(cx)
    }
}

/// A TCP listener inside the tunnel, from [`Tunnel::tcp_listen`](crate::Tunnel::tcp_listen).
/// The engine keeps several sockets listening (a backlog), so connections arriving together
/// are all taken. Dropping it stops listening.
///
/// Besides [`TcpListener::accept`], it is a [`Stream`](futures_core::Stream) of
/// connections and has [`TcpListener::poll_accept`], so servers that take a stream of
/// connections (hyper-util's; tonic's `serve_with_incoming` with the `tonic` feature) use
/// it directly; with the
/// `axum` feature it is an `axum::serve::Listener`, so `axum::serve(listener, router)`
/// serves inside the tunnel.
///
/// ```no_run
/// # async fn run(tunnel: tunneld_userspace::Tunnel) -> std::io::Result<()> {
/// let listener = tunnel.tcp_listen("0.0.0.0:7".parse().unwrap()).await?;
/// loop {
///     let (stream, _) = listener.accept().await?;
///     tokio::spawn(async move {
///         let (mut read, mut write) = tokio::io::split(stream);
///         let _ = tokio::io::copy(&mut read, &mut write).await;
///     });
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct TcpListener {
    link: Arc<Link>,
    /// Locked only for a poll (never across an await).
    accept: Mutex<mpsc::Receiver<StreamParts>>,
    local: SocketAddr,
}

impl TcpListener {
    pub(crate) fn new(link: Arc<Link>, parts: ListenerParts) -> TcpListener {
        TcpListener {
            link,
            accept: Mutex::new(parts.accept),
            local: parts.local,
        }
    }

    /// Waits for the next connection (established, ready to use) and its peer's address.
    ///
    /// Cancel safe: a connection is taken only when this returns it (one dropped while
    /// waiting takes none). Meant for one accepting task at a time: if several wait at
    /// once, only the last to poll is woken for the next connection.
    ///
    /// ```no_run
    /// # async fn run(listener: tunneld_userspace::TcpListener) -> std::io::Result<()> {
    /// let (stream, from) = listener.accept().await?;
    /// # Ok(()) }
    /// ```
    pub async fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        std::future::poll_fn(|cx| self.poll_accept(cx)).await
    }

    /// Polls for the next connection: `Ready` with it (or `ConnectionAborted` once the
    /// tunnel has stopped), else `Pending` with `cx`'s task woken when one arrives.
    pub fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(TcpStream, SocketAddr)>> {
        if self.link.shared.is_stopped() {
            return Poll::Ready(Err(aborted()));
        }
        let mut accept = self.accept.lock().unwrap_or_else(PoisonError::into_inner);
        match accept.poll_recv(cx) {
            Poll::Ready(Some(parts)) => {
                let peer = parts.peer;
                Poll::Ready(Ok((TcpStream::new(self.link.clone(), parts), peer)))
            }
            Poll::Ready(None) => Poll::Ready(Err(aborted())),
            Poll::Pending => Poll::Pending,
        }
    }

    /// The address it listens on (port 0 was replaced by the chosen port).
    ///
    /// ```no_run
    /// # fn run(listener: tunneld_userspace::TcpListener) -> std::io::Result<()> {
    /// println!("listening on port {}", listener.local_addr()?.port());
    /// # Ok(()) }
    /// ```
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// The connections, as they are accepted; the stream ends when the tunnel stops.
impl futures_core::Stream for TcpListener {
    type Item = io::Result<TcpStream>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.poll_accept(cx) {
            Poll::Ready(Ok((stream, _))) => Poll::Ready(Some(Ok(stream))),
            Poll::Ready(Err(_)) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// `axum::serve(listener, router)` inside the tunnel (the `axum` feature). Once the tunnel
/// has stopped no connection can come, and `accept` waits for ever: stop the server with
/// its graceful shutdown.
#[cfg(feature = "axum")]
impl axum::serve::Listener for TcpListener {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        match TcpListener::accept(self).await {
            Ok(accepted) => accepted,
            // The only error is the tunnel's end.
            Err(_) => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// A tonic server takes the tunnel's connections (`serve_with_incoming(listener)`), and its
/// handlers see the peer's tunnel address in `Request::remote_addr`.
#[cfg(feature = "tonic")]
impl tonic::transport::server::Connected for TcpStream {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        tonic::transport::server::TcpConnectInfo {
            local_addr: self.local_addr().ok(),
            remote_addr: self.peer_addr().ok(),
        }
    }
}
