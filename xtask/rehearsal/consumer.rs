//! A program that depends on tunneld the way `cargo add` gives it: `tunneld` (with its
//! `tokio` feature), `tunneld-userspace` and `tunneld-fleet` from their packages, no
//! `[patch]`. `cargo xtask rehearsal` builds it in an empty directory against the packaged
//! crates and runs it in a network namespace (it creates a TUN interface: root).
//!
//! It starts an embedded gateway (TUN, WireGuard on 127.0.0.1), and a tunnel with its own
//! TCP/IP stack that connects to it; an echo server on the gateway's tunnel address, served
//! by the kernel's TCP through the TUN, returns 1 MiB the user-space side sends through
//! WireGuard, checked byte for byte. It also reads a `[fleet]` section, as a fleet member
//! would before it reaches etcd.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Failure = Box<dyn std::error::Error>;

const BYTES: usize = 1 << 20;
const GATEWAY_PORT: u16 = 51820;
const ECHO: &str = "10.98.0.1:7000";

fn main() {
    if let Err(e) = run() {
        eprintln!("consumer: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Failure> {
    let gateway_key = tunneld::PrivateKey::generate();
    let client_key = tunneld::userspace::PrivateKey::generate();
    let text = format!(
        "[interface]\nname = \"rehearsal0\"\nprivate_key = \"{key}\"\nlisten_port = {GATEWAY_PORT}\n\
         address = [\"10.98.0.1/24\"]\n\n\
         [[peer]]\npublic_key = \"{client}\"\nallowed_ips = [\"10.98.0.2/32\"]\n\n\
         [fleet]\netcd = [\"http://127.0.0.1:2379\"]\ninsecure = true\nprefix = \"/rehearsal\"\n\
         site = \"a\"\ngateway = \"gw1\"\nadvertise = [\"127.0.0.1:{GATEWAY_PORT}\"]\n\
         subnets = [\"10.98.0.0/24\"]\n",
        key = *gateway_key.to_base64(),
        client = client_key.public_key(),
    );
    let settings = tunneld::Settings::from_toml(&text, ".")?;
    let fleet = settings
        .config()
        .fleet
        .as_ref()
        .ok_or("the [fleet] section was lost")?;
    let fleet = tunneld_fleet::FleetSettings::from_config(fleet, std::path::Path::new("."))?;
    println!("fleet settings read: gateway {}", fleet.gateway);

    let gateway = tunneld::Gateway::builder(settings).start()?;
    println!(
        "gateway {} up on UDP {GATEWAY_PORT}",
        gateway.interface_name().unwrap_or("?")
    );
    let echo = TcpListener::bind(ECHO)?;
    let server = std::thread::spawn(move || -> std::io::Result<usize> {
        let (mut conn, _) = echo.accept()?;
        let mut buf = vec![0u8; 64 * 1024];
        let mut echoed = 0;
        loop {
            let n = conn.read(&mut buf)?;
            if n == 0 {
                return Ok(echoed);
            }
            conn.write_all(&buf[..n])?;
            echoed += n;
        }
    });

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let moved = runtime.block_on(async {
        let tunnel = tunneld_userspace::Tunnel::start(
            tunneld_userspace::TunnelSettings::new(client_key)
                .address("10.98.0.2/32".parse()?)
                .peer(
                    tunneld_userspace::PeerSettings::new(gateway_key.public_key())
                        .endpoint(SocketAddr::from(([127, 0, 0, 1], GATEWAY_PORT)))
                        .allowed_ip("10.98.0.0/24".parse()?),
                ),
        )?;
        let exchange = async {
            let stream = tunnel.tcp_connect(ECHO.parse::<SocketAddr>()?).await?;
            let (mut rx, mut tx) = stream.into_split();
            let sent: Vec<u8> = (0..BYTES).map(|i| (i * 7 + i / 4096) as u8).collect();
            let expected = sent.clone();
            let writer = tokio::spawn(async move {
                tx.write_all(&sent).await?;
                tx.shutdown().await
            });
            let mut back = Vec::with_capacity(BYTES);
            rx.read_to_end(&mut back).await?;
            writer.await??;
            if back != expected {
                return Err::<usize, Failure>(
                    format!("{} bytes came back, not the {BYTES} sent", back.len()).into(),
                );
            }
            Ok(back.len())
        };
        let moved = tokio::time::timeout(Duration::from_secs(60), exchange)
            .await
            .map_err(|_| "no echo within 60 s")??;
        tunnel.shutdown();
        Ok::<usize, Failure>(moved)
    })?;
    let echoed = server.join().map_err(|_| "the echo server panicked")??;
    gateway.shutdown()?;
    println!("moved {moved} bytes through the tunnel and back (the server echoed {echoed})");
    Ok(())
}
