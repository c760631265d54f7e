//! A service that embeds a tunneld gateway: it starts the interface a config file describes,
//! adds a peer while running, prints the peers' state every few seconds, and shuts the
//! interface down cleanly on Ctrl-C.
//!
//! ```sh
//! cargo run --example embedded_gateway -- site-b.toml <peer public key> 192.0.2.1:51820 10.77.0.1/32
//! ```
//! (as root, or with CAP_NET_ADMIN: it creates a TUN interface).

use std::time::Duration;
use tunneld::{Gateway, PeerSettings, Settings};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [config, peer_key, endpoint, allowed] = &args[..] else {
        return Err("usage: embedded_gateway CONFIG PEER_PUBLIC_KEY ENDPOINT ALLOWED_IP".into());
    };

    // Settings from the same file `tunneld up` takes; every problem names its field.
    let gateway = Gateway::builder(Settings::from_file(config)?).start()?;
    println!(
        "{} is up on UDP port {}, public key {}",
        gateway.interface_name().unwrap_or("-"),
        gateway.listen_port().unwrap_or(0),
        gateway
            .public_key()
            .map(|k| k.to_string())
            .unwrap_or_default()
    );

    // A peer added at run time, e.g. from the service's own control API.
    gateway.add_peer(PeerSettings {
        public_key: peer_key.parse()?,
        preshared_key: None,
        endpoint: Some(endpoint.parse()?),
        allowed_ips: vec![allowed.parse()?],
        persistent_keepalive: 25,
        parallel: 1,
    })?;

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())?;
    let mut ticks = 0u32;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) && !gateway.has_failed() {
        std::thread::sleep(Duration::from_millis(100));
        ticks += 1;
        if ticks.is_multiple_of(50) {
            for peer in gateway.peers()? {
                println!(
                    "peer {}: endpoint {:?}, received {} B, sent {} B, handshake {}",
                    peer.public_key,
                    peer.endpoint,
                    peer.rx_bytes,
                    peer.tx_bytes,
                    if peer.last_handshake.is_some() {
                        "done"
                    } else {
                        "not yet"
                    }
                );
            }
        }
    }
    // Removes the interface, its routes and its UAPI socket.
    gateway.shutdown()?;
    Ok(())
}
