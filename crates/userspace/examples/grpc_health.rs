//! A tonic gRPC client through a user-space WireGuard tunnel: no TUN, no root. It asks a
//! server at the far site for the health of services (the standard `grpc.health.v1`).
//!
//! ```text
//! cargo run -p tunneld-userspace --features hyper --example grpc_health -- \
//!     --key-file my.key --address 10.77.0.1/24 \
//!     --peer <base64 public key> --endpoint 192.0.2.2:51820 --allowed-ips 10.77.0.0/24 \
//!     http://10.77.0.2:50051 "" my.Service
//! ```
//!
//! The channel is tonic's, connected with the tunnel's `Connector`
//! (`Endpoint::connect_with_connector`): HTTP/2 over a tunnel `TcpStream`. For each
//! service named (`""` is the server as a whole) it prints `service: status`, or
//! `service: error: …` for one the server does not know.

use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tunneld_userspace::{Connector, PeerSettings, PrivateKey, PublicKey, Tunnel, TunnelSettings};

fn usage() -> ! {
    eprintln!(
        "usage: grpc_health --key-file FILE --address CIDR --peer PUBKEY --endpoint HOST:PORT \
         --allowed-ips CIDR[,CIDR] http://HOST:PORT [SERVICE...]"
    );
    std::process::exit(2)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut key, mut address, mut peer, mut endpoint, mut allowed) =
        (None, None, None, None, Vec::new());
    let (mut url, mut services) = (None, Vec::new());
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
            _ if arg.starts_with("http://") && url.is_none() => url = Some(arg),
            _ if arg.starts_with("--") => usage(),
            _ => services.push(arg),
        }
    }
    let (Some(key), Some(address), Some(peer_key), Some(endpoint), Some(url)) =
        (key, address, peer, endpoint, url)
    else {
        usage()
    };
    let mut peer = PeerSettings::new(peer_key).endpoint(endpoint);
    peer.allowed_ips = allowed;
    let tunnel = Tunnel::start(
        TunnelSettings::new(PrivateKey::from_base64(key.trim())?)
            .address(address)
            .peer(peer),
    )?;

    let channel = tonic::transport::Endpoint::from_shared(url)?
        .connect_timeout(std::time::Duration::from_secs(15))
        .timeout(std::time::Duration::from_secs(15))
        .connect_with_connector(Connector::new(tunnel.clone()))
        .await?;
    let mut client = HealthClient::new(channel);
    if services.is_empty() {
        services.push(String::new());
    }
    for service in services {
        let answer = client
            .check(HealthCheckRequest {
                service: service.clone(),
            })
            .await;
        match answer {
            Ok(reply) => println!("{service:?}: {:?}", reply.into_inner().status()),
            Err(status) => println!("{service:?}: error: {:?}", status.code()),
        }
    }
    tunnel.shutdown();
    Ok(())
}
