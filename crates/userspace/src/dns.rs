//! Names resolved through DNS servers inside the tunnel (the `dns` feature): hickory's
//! resolver, given a runtime whose UDP sockets and TCP streams are the tunnel's own, so
//! queries and answers travel only through the tunnel.

use crate::tcp::TcpStream;
use crate::udp::UdpSocket;
use crate::Link;
use hickory_resolver::config::{
    LookupIpStrategy, NameServerConfigGroup, ResolverConfig, ResolverOpts,
};
use hickory_resolver::name_server::GenericConnector;
use hickory_resolver::proto::runtime::iocompat::AsyncIoTokioAsStd;
use hickory_resolver::proto::runtime::{RuntimeProvider, TokioHandle, TokioTime};
use hickory_resolver::proto::udp::DnsUdpSocket;
use hickory_resolver::Resolver;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The resolver of one tunnel (made at its first use, inside the caller's runtime).
pub(crate) type TunnelResolver = Resolver<GenericConnector<TunnelRuntime>>;

/// hickory's runtime with the tunnel's sockets (timers and tasks are tokio's).
#[derive(Clone)]
pub(crate) struct TunnelRuntime {
    link: Arc<Link>,
    handle: TokioHandle,
}

/// A tunnel TCP stream as hickory needs it: `Sync` (a `TcpStream`'s rings are one-owner;
/// the mutex is never locked, `get_mut` reaches the stream through `&mut`).
pub(crate) struct SyncStream(Mutex<TcpStream>);

impl SyncStream {
    fn stream(self: Pin<&mut Self>) -> Pin<&mut TcpStream> {
        Pin::new(
            self.get_mut()
                .0
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }
}

impl AsyncRead for SyncStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.stream().poll_read(cx, buf)
    }
}

impl AsyncWrite for SyncStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.stream().poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream().poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream().poll_shutdown(cx)
    }
}

impl DnsUdpSocket for UdpSocket {
    type Time = TokioTime;

    fn poll_recv_from(
        &self,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<(usize, SocketAddr)>> {
        let mut buf = ReadBuf::new(buf);
        UdpSocket::poll_recv_from(self, cx, &mut buf).map_ok(|from| (buf.filled().len(), from))
    }

    fn poll_send_to(
        &self,
        cx: &mut Context<'_>,
        buf: &[u8],
        target: SocketAddr,
    ) -> Poll<io::Result<usize>> {
        UdpSocket::poll_send_to(self, cx, buf, target)
    }
}

impl RuntimeProvider for TunnelRuntime {
    type Handle = TokioHandle;
    type Timer = TokioTime;
    type Udp = UdpSocket;
    type Tcp = AsyncIoTokioAsStd<SyncStream>;

    fn create_handle(&self) -> TokioHandle {
        self.handle.clone()
    }

    fn connect_tcp(
        &self,
        server_addr: SocketAddr,
        _bind_addr: Option<SocketAddr>,
        timeout: Option<Duration>,
    ) -> Pin<Box<dyn Send + Future<Output = io::Result<Self::Tcp>>>> {
        let tunnel = crate::Tunnel::from_link(self.link.clone());
        let wait = timeout.unwrap_or(Duration::from_secs(5));
        Box::pin(async move {
            match tokio::time::timeout(wait, tunnel.tcp_connect(server_addr)).await {
                Ok(stream) => Ok(AsyncIoTokioAsStd(SyncStream(Mutex::new(stream?)))),
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("connecting to {server_addr} through the tunnel timed out"),
                )),
            }
        })
    }

    fn bind_udp(
        &self,
        local_addr: SocketAddr,
        _server_addr: SocketAddr,
    ) -> Pin<Box<dyn Send + Future<Output = io::Result<UdpSocket>>>> {
        let tunnel = crate::Tunnel::from_link(self.link.clone());
        Box::pin(async move {
            // hickory asks for the unspecified address of the server's family.
            tunnel.udp_bind(local_addr).await
        })
    }
}

/// A resolver that asks `servers` (port 53, UDP then TCP for long answers) through the
/// tunnel `link` leads to.
pub(crate) fn resolver(link: Arc<Link>, servers: &[IpAddr]) -> TunnelResolver {
    let config = ResolverConfig::from_parts(
        None,
        Vec::new(),
        NameServerConfigGroup::from_ips_clear(servers, 53, true),
    );
    let mut options = ResolverOpts::default();
    // Names are tried as given (db.internal), not against a search list; both families
    // are asked for (a dual-stack tunnel reaches either).
    options.ndots = 0;
    options.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    let runtime = TunnelRuntime {
        link,
        handle: TokioHandle::default(),
    };
    Resolver::builder_with_config(config, GenericConnector::new(runtime))
        .with_options(options)
        .build()
}

/// Every address `name` has, through `resolver`.
pub(crate) async fn lookup(resolver: &TunnelResolver, name: &str) -> io::Result<Vec<IpAddr>> {
    let found = resolver.lookup_ip(name).await.map_err(|e| {
        let kind = if e.is_no_records_found() {
            io::ErrorKind::NotFound
        } else {
            io::ErrorKind::Other
        };
        io::Error::new(kind, format!("resolving {name} in the tunnel: {e}"))
    })?;
    Ok(found.iter().collect())
}
