//! An HTTP/1.1 GET through a user-space WireGuard tunnel: no TUN, no root.
//!
//! ```text
//! cargo run -p tunneld-userspace --example http_get -- \
//!     --key-file my.key --address 10.77.0.1/24 \
//!     --peer <base64 public key> --endpoint 192.0.2.2:51820 --allowed-ips 10.77.0.0/24 \
//!     http://10.77.0.2:8080/
//! ```
//!
//! The request is written by hand (HTTP/1.1, `Connection: close`, body read to EOF), which
//! is all a GET needs; an HTTP client library (hyper with hyper-util's `TokioIo`) works the
//! same way over [`tunneld_userspace::TcpStream`], which is a tokio `AsyncRead + AsyncWrite`.

use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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

    let tunnel = Tunnel::start(TunnelSettings {
        private_key: PrivateKey::from_base64(key.trim())?,
        listen: "0.0.0.0:0".parse()?,
        addresses: vec![address],
        mtu,
        peers: vec![PeerSettings {
            public_key: peer,
            preshared_key: None,
            endpoint,
            allowed_ips: allowed.unwrap_or_default(),
            persistent_keepalive: 0,
            parallel: 1,
        }],
    })?;
    let mut stream = tunnel.tcp_connect(target).await?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: tunneld-userspace\r\n\
         Connection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let text = String::from_utf8_lossy(&response);
    match text.split_once("\r\n\r\n") {
        Some((head, body)) => {
            eprintln!("{head}");
            print!("{body}");
        }
        None => print!("{text}"),
    }
    tunnel.shutdown();
    Ok(())
}
