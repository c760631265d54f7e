//! A connector for HTTP clients (the `hyper` feature): a `tower::Service<Uri>` that opens
//! TCP connections through a tunnel, which hyper-util's pooled client and tonic's
//! channels take.

use crate::tcp::TcpStream;
use crate::Tunnel;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Opens connections through a tunnel for HTTP clients: a `tower::Service<http::Uri>`
/// whose responses are hyper I/O ([`TokioIo`] over a [`TcpStream`]). Give it to
/// hyper-util's pooled client (`Client::builder(TokioExecutor::new()).build(connector)`)
/// or to tonic (`Endpoint::connect_with_connector`). Cheap to clone.
///
/// The URI's host is an IP address (`http://10.77.0.2:8080/`, `http://[fd77::2]/`) or,
/// with the `dns` feature, a name resolved through the tunnel's DNS servers
/// (`http://api.internal/`); the port defaults to 80 (443 for `https`, whose TLS is the
/// client's to add). Each call is [`Tunnel::tcp_connect`], with its errors and timeout.
///
/// ```no_run
/// # async fn run(tunnel: tunneld_userspace::Tunnel) -> Result<(), Box<dyn std::error::Error>> {
/// use http_body_util::{BodyExt, Empty};
/// use hyper_util::client::legacy::Client;
/// use hyper_util::rt::TokioExecutor;
/// let client: Client<_, Empty<hyper::body::Bytes>> =
///     Client::builder(TokioExecutor::new()).build(tunneld_userspace::Connector::new(tunnel));
/// let response = client.get("http://10.77.0.2:8080/".parse()?).await?;
/// let body = response.into_body().collect().await?.to_bytes();
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Connector {
    tunnel: Tunnel,
}

impl Connector {
    /// A connector through `tunnel`.
    pub fn new(tunnel: Tunnel) -> Connector {
        Connector { tunnel }
    }
}

/// Where `uri` points: its host (an address, or a name for the tunnel's DNS servers) and
/// its port (or the scheme's).
fn target(uri: &http::Uri) -> io::Result<(String, u16)> {
    let host = uri
        .host()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("{uri} has no host")))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
        Some("https") => 443,
        _ => 80,
    });
    Ok((host.to_string(), port))
}

impl tower_service::Service<http::Uri> for Connector {
    type Response = TokioIo<TcpStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<TcpStream>>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let tunnel = self.tunnel.clone();
        Box::pin(async move { Ok(TokioIo::new(tunnel.tcp_connect(target(&uri)?).await?)) })
    }
}

/// What hyper-util's client asks of a connection (nothing beyond the defaults).
impl Connection for TcpStream {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_come_from_the_uri() {
        let at = |u: &str| target(&u.parse().unwrap()).unwrap();
        assert_eq!(at("http://10.77.0.2:8080/x"), ("10.77.0.2".into(), 8080));
        assert_eq!(at("http://[fd77::2]/"), ("fd77::2".into(), 80));
        assert_eq!(at("https://10.0.0.1"), ("10.0.0.1".into(), 443));
        assert_eq!(at("http://db.internal/"), ("db.internal".into(), 80));
        assert!(target(&"/relative".parse().unwrap()).is_err());
    }
}
