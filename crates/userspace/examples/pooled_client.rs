//! hyper-util's pooled HTTP client through a user-space WireGuard tunnel: no TUN, no root.
//! The tunnel's `Connector` opens the connections; the client keeps them alive and reuses
//! them, as it does over the machine's own network.
//!
//! ```text
//! cargo run -p tunneld-userspace --features hyper --example pooled_client -- \
//!     --key-file my.key --address 10.77.0.1/24 \
//!     --peer <base64 public key> --endpoint 192.0.2.2:51820 --allowed-ips 10.77.0.0/24 \
//!     --dns 10.77.0.53 --requests 20 http://api.internal:8080/
//! ```
//!
//! With `--dns`, names in the URL are resolved by that DNS server, asked through the
//! tunnel (the `dns` feature: hickory's resolver over the tunnel's UDP and TCP). It makes
//! the requests one after another and prints each response's status, then the last body
//! to stdout.

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tunneld_userspace::{Connector, PeerSettings, PrivateKey, PublicKey, Tunnel, TunnelSettings};

fn usage() -> ! {
    eprintln!(
        "usage: pooled_client --key-file FILE --address CIDR --peer PUBKEY --endpoint HOST:PORT \
         --allowed-ips CIDR[,CIDR] [--dns IP] [--requests N] http://HOST:PORT/PATH"
    );
    std::process::exit(2)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut key, mut address, mut peer, mut endpoint, mut allowed) =
        (None, None, None, None, Vec::new());
    let (mut requests, mut url, mut dns) = (1usize, None, Vec::new());
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
            "--requests" => requests = value().parse()?,
            "--dns" => dns.push(value().parse()?),
            _ if arg.starts_with("http://") => url = Some(arg.parse::<hyper::Uri>()?),
            _ => usage(),
        }
    }
    let (Some(key), Some(address), Some(peer_key), Some(endpoint), Some(url)) =
        (key, address, peer, endpoint, url)
    else {
        usage()
    };
    let mut peer = PeerSettings::new(peer_key).endpoint(endpoint);
    peer.allowed_ips = allowed;
    let mut settings = TunnelSettings::new(PrivateKey::from_base64(key.trim())?)
        .address(address)
        .peer(peer);
    settings.dns_servers = dns;
    let tunnel = Tunnel::start(settings)?;

    // The handshake first (bounded), so the first request does not wait on it.
    tokio::time::timeout(std::time::Duration::from_secs(20), tunnel.ready(&peer_key)).await??;
    let client: Client<Connector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build(Connector::new(tunnel.clone()));
    let mut body = Bytes::new();
    for n in 0..requests {
        let response = client.get(url.clone()).await?;
        eprintln!("request {n}: {}", response.status());
        if !response.status().is_success() {
            return Err(format!("request {n}: {}", response.status()).into());
        }
        body = response.into_body().collect().await?.to_bytes();
    }
    print!("{}", String::from_utf8_lossy(&body));
    drop(client);
    tunnel.shutdown();
    Ok(())
}
