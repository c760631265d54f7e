//! An HTTP/1.1 GET through a user-space WireGuard tunnel: no TUN, no root.
//!
//! ```text
//! cargo run -p tunneld-userspace --example http_get -- \
//!     --key-file my.key --address 10.77.0.1/24 \
//!     --peer <base64 public key> --endpoint 192.0.2.2:51820 --allowed-ips 10.77.0.0/24 \
//!     http://10.77.0.2:8080/
//! ```
//!
//! The HTTP client is hyper's, over the tunnel's [`tunneld_userspace::TcpStream`] (a tokio
//! `AsyncRead + AsyncWrite`, adapted with hyper-util's `TokioIo`): any tokio-based HTTP
//! client runs over it the same way. The status and headers go to stderr, the body to stdout.

use http_body_util::BodyExt;
use std::net::SocketAddr;
use tunneld_userspace::{PeerSettings, PrivateKey, PublicKey, Tunnel, TunnelSettings};

fn usage() -> ! {
    eprintln!(
        "usage: http_get --key-file FILE --address CIDR --peer PUBKEY --endpoint HOST:PORT \
         --allowed-ips CIDR[,CIDR] [--mtu N] http://IP:PORT/PATH"
    );
    std::process::exit(2)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut key, mut address, mut peer, mut endpoint, mut allowed, mut mtu, mut url) =
        (None, None, None, None, None, 1420u16, None);
    while let Some(arg) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| usage());
        match arg.as_str() {
            "--key-file" => key = Some(std::fs::read_to_string(value())?),
            "--address" => address = Some(value().parse()?),
            "--peer" => peer = Some(PublicKey::from_base64(value().trim())?),
            "--endpoint" => endpoint = Some(value().parse::<SocketAddr>()?),
            "--allowed-ips" => {
                allowed = Some(
                    value()
                        .split(',')
                        .map(str::parse)
                        .collect::<Result<Vec<_>, _>>()?,
                )
            }
            "--mtu" => mtu = value().parse()?,
            _ if arg.starts_with("http://") => url = Some(arg),
            _ => usage(),
        }
    }
    let (Some(key), Some(address), Some(peer), Some(url)) = (key, address, peer, url) else {
        usage()
    };
    let rest = url.trim_start_matches("http://");
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    let target: SocketAddr = authority.parse()?;

    let mut peer = PeerSettings::new(peer);
    peer.endpoint = endpoint;
    peer.allowed_ips = allowed.unwrap_or_default();
    let tunnel = Tunnel::start(
        TunnelSettings::new(PrivateKey::from_base64(key.trim())?)
            .address(address)
            .mtu(mtu)
            .peer(peer),
    )?;
    let stream = tunnel.tcp_connect(target).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    // The connection's I/O runs beside the request, as hyper requires.
    let driver = tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, authority)
        .header(hyper::header::USER_AGENT, "tunneld-userspace")
        .body(http_body_util::Empty::<hyper::body::Bytes>::new())?;
    let response = sender.send_request(request).await?;
    eprintln!("{:?} {}", response.version(), response.status());
    for (name, value) in response.headers() {
        eprintln!("{name}: {}", value.to_str().unwrap_or("(not text)"));
    }
    let body = response.into_body().collect().await?.to_bytes();
    print!("{}", String::from_utf8_lossy(&body));
    drop(sender);
    let _ = driver.await;
    tunnel.shutdown();
    Ok(())
}
