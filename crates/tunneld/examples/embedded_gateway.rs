//! A service that embeds a tunneld gateway: it starts the interface a config file describes,
//! adds a peer while running, waits until it is reachable, reports the gateway's events as
//! they happen (no polling), and shuts the interface down cleanly on Ctrl-C.
//!
//! ```sh
//! cargo run --example embedded_gateway -- site-b.toml <peer public key> 192.0.2.1:51820 10.77.0.1/32
//! ```
//! (as root, or with CAP_NET_ADMIN: it creates a TUN interface).

use std::time::Duration;
use tunneld::{Event, Gateway, PeerSettings, PublicKey, Settings};

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
    let peer_key: PublicKey = peer_key.parse()?;
    gateway.add_peer(
        PeerSettings::new(peer_key)
            .endpoint(endpoint.parse()?)
            .allowed_ip(allowed.parse()?)
            .persistent_keepalive(25),
    )?;

    // Events instead of polling: handshakes, endpoints, failures, the end. A thread reports
    // them; the main thread waits for a signal or for the gateway to stop on its own.
    let (done_tx, done_rx) = std::sync::mpsc::channel::<&'static str>();
    let events = gateway.events()?;
    let on_stop = done_tx.clone();
    let reporter = std::thread::spawn(move || {
        for event in events {
            match event {
                Event::HandshakeCompleted { peer, endpoint } => {
                    println!("peer {peer}: handshake done, endpoint {endpoint:?}")
                }
                Event::HandshakeFailed { peer, waited } => {
                    println!("peer {peer}: no answer for {waited:?}")
                }
                Event::EndpointChanged { peer, endpoint } => {
                    println!("peer {peer}: now at {endpoint}")
                }
                Event::Stopped => {
                    let _ = on_stop.send("the gateway stopped");
                }
                other => println!("{other:?}"),
            }
        }
    });
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])?;
    let handle = signals.handle();
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            let _ = done_tx.send("signal");
        }
    });
    // Readiness: blocks until the handshake is done (or says why not).
    match gateway.wait_ready(&peer_key, Duration::from_secs(10)) {
        Ok(()) => {
            for peer in gateway.peers()? {
                println!(
                    "peer {}: endpoint {:?}, received {} B, sent {} B",
                    peer.public_key, peer.endpoint, peer.rx_bytes, peer.tx_bytes
                );
            }
        }
        Err(e) => println!("not ready yet: {e}"),
    }
    let why = done_rx.recv().unwrap_or("the reporter ended");
    println!("stopping: {why}");
    handle.close();
    // Removes the interface, its routes and its UAPI socket; the reporter sees `Stopped`.
    gateway.shutdown()?;
    let _ = reporter.join();
    Ok(())
}
