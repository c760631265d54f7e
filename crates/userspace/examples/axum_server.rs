//! An axum web server inside a user-space WireGuard tunnel: no TUN, no root. Peers of the
//! tunnel reach it at the tunnel's address; nothing listens on the machine's own network.
//!
//! ```text
//! cargo run -p tunneld-userspace --features axum --example axum_server -- \
//!     --key-file my.key --address 10.77.0.1/24 --listen 0.0.0.0:51821 \
//!     --peer <base64 public key> --endpoint 192.0.2.2:51820 --allowed-ips 10.77.0.0/24 \
//!     --port 8080
//! ```
//!
//! `axum::serve` takes the tunnel's `TcpListener` as it takes tokio's (it implements
//! `axum::serve::Listener`). `GET /hello` answers a line, `POST /echo` the body it got.
//! It prints `serving on <address>` once the handshake is done and it listens, and stops
//! gracefully on SIGINT.

use axum::routing::{get, post};
use std::net::SocketAddr;
use tunneld_userspace::{PeerSettings, PrivateKey, PublicKey, Tunnel, TunnelSettings};

fn usage() -> ! {
    eprintln!(
        "usage: axum_server --key-file FILE --address CIDR --peer PUBKEY \
         [--endpoint HOST:PORT] --allowed-ips CIDR[,CIDR] [--listen ADDR:PORT] [--port N]"
    );
    std::process::exit(2)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut key, mut address, mut peer, mut allowed) = (None, None, None, Vec::new());
    let (mut endpoint, mut listen, mut port) = (None, "0.0.0.0:0".parse::<SocketAddr>()?, 8080);
    while let Some(arg) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| usage());
        match arg.as_str() {
            "--key-file" => key = Some(std::fs::read_to_string(value())?),
            "--address" => address = Some(value().parse()?),
            "--peer" => peer = Some(PublicKey::from_base64(value().trim())?),
            "--endpoint" => endpoint = Some(value().parse()?),
            "--allowed-ips" => {
                for net in value().split(',') {
                    allowed.push(net.parse()?);
                }
            }
            "--listen" => listen = value().parse()?,
            "--port" => port = value().parse()?,
            _ => usage(),
        }
    }
    let (Some(key), Some(address), Some(peer_key)) = (key, address, peer) else {
        usage()
    };
    let mut peer = PeerSettings::new(peer_key);
    peer.endpoint = endpoint;
    peer.allowed_ips = allowed;
    let tunnel = Tunnel::start(
        TunnelSettings::new(PrivateKey::from_base64(key.trim())?)
            .listen(listen)
            .address(address)
            .peer(peer),
    )?;
    // With an endpoint, handshake before serving; without, the peer reaches us first.
    if endpoint.is_some() {
        tunnel.ready(&peer_key).await?;
    }

    let app = axum::Router::new()
        .route("/hello", get(|| async { "hello from inside a tunnel\n" }))
        .route("/echo", post(|body: String| async move { body }));
    let listener = tunnel
        .tcp_listen(SocketAddr::new(address.addr(), port))
        .await?;
    println!("serving on {}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    println!("stopped");
    tunnel.shutdown();
    Ok(())
}
