//! A tonic gRPC server inside a user-space WireGuard tunnel: no TUN, no root. It serves the
//! standard health service (`grpc.health.v1`) on a port of the tunnel's own address, and
//! logs each caller's address inside the tunnel.
//!
//! ```text
//! cargo run -p tunneld-userspace --features tonic --example grpc_server -- \
//!     --key-file my.key --address 10.77.0.2/24 --listen-port 51820 \
//!     --peer <base64 public key> --allowed-ips 10.77.0.1/32 --port 50051
//! ```
//!
//! With the `tonic` feature the tunnel's `TcpStream` is tonic's `server::Connected`, so the
//! tunnel's `TcpListener` goes straight to `serve_with_incoming`, and
//! `Request::remote_addr` is the caller's address inside the tunnel. The `grpc_health`
//! example asks it from another tunnel.

use tonic::transport::Server;
use tunneld_userspace::{PeerSettings, PrivateKey, PublicKey, Tunnel, TunnelSettings};

fn usage() -> ! {
    eprintln!(
        "usage: grpc_server --key-file FILE --address CIDR --listen-port PORT --peer PUBKEY \
         --allowed-ips CIDR[,CIDR] --port PORT"
    );
    std::process::exit(2)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut key, mut address, mut listen_port, mut peer, mut allowed, mut port) =
        (None, None, 0u16, None, Vec::new(), None);
    while let Some(arg) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| usage());
        match arg.as_str() {
            "--key-file" => key = Some(std::fs::read_to_string(value())?),
            "--address" => address = Some(value().parse()?),
            "--listen-port" => listen_port = value().parse()?,
            "--peer" => peer = Some(PublicKey::from_base64(value().trim())?),
            "--allowed-ips" => {
                for net in value().split(',') {
                    allowed.push(net.parse()?);
                }
            }
            "--port" => port = Some(value().parse::<u16>()?),
            _ => usage(),
        }
    }
    let (Some(key), Some(address), Some(peer_key), Some(port)) = (key, address, peer, port) else {
        usage()
    };
    let tunnel = Tunnel::start(
        TunnelSettings::new(PrivateKey::from_base64(key.trim())?)
            .listen(([0, 0, 0, 0], listen_port).into())
            .address(address)
            .peer(PeerSettings::new(peer_key).allowed_ips(allowed)),
    )?;

    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("tunneld.Demo", tonic_health::ServingStatus::Serving)
        .await;
    let listener = tunnel.tcp_listen((address.addr(), port).into()).await?;
    println!("serving gRPC on {}", listener.local_addr()?);
    Server::builder()
        // Each call's caller, as the tunnel's TcpStream reports it to tonic.
        .layer(tonic::service::InterceptorLayer::new(
            |request: tonic::Request<()>| -> Result<tonic::Request<()>, tonic::Status> {
                if let Some(from) = request.remote_addr() {
                    println!("call from {from}");
                }
                Ok(request)
            },
        ))
        .add_service(health)
        .serve_with_incoming_shutdown(listener, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    tunnel.shutdown();
    Ok(())
}
