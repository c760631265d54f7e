//! The tunneld-userspace row of `cargo xtask bench-embedded`: a program with its own TCP/IP
//! stack inside a WireGuard tunnel (no TUN, no root), driving the benchmark's traffic. It
//! follows the client contract of `xtask/src/embedded_bench.rs`:
//!
//! ```text
//! embedded_client --address 10.77.0.1 --peer-addr 10.77.0.2 --sink-port 5301 --echo-port 5302 \
//!     --private-key-file FILE --peer-public-key BASE64 --endpoint 192.0.2.2:51820 \
//!     --mtu 1420  (bulk SECONDS | rr CONNS ROUNDS)
//! ```
//!
//! `bulk`: one stream written to the sink as fast as it goes for SECONDS, then closed and
//! read until the sink closes; prints `{"mode":"bulk","bytes":N,"seconds":S}`. `rr`: CONNS
//! connections to the echo server, each keeping one 64-byte request in flight, ROUNDS round
//! trips in all; prints requests per second and the round trips' p50/p99 in µs.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tunneld_userspace::{PeerSettings, PrivateKey, PublicKey, TcpStream, Tunnel, TunnelSettings};

type Failure = Box<dyn std::error::Error>;

/// Bytes per write in `bulk`.
const CHUNK: usize = 256 * 1024;
/// The request size of `rr`.
const REQUEST: usize = 64;

struct Args {
    address: IpAddr,
    peer_addr: IpAddr,
    sink_port: u16,
    echo_port: u16,
    key_file: String,
    peer_public_key: String,
    endpoint: SocketAddr,
    mtu: u16,
    mode: Mode,
}

enum Mode {
    Bulk { seconds: f64 },
    Rr { conns: usize, rounds: usize },
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Args, Failure> {
    let (mut address, mut peer_addr, mut sink_port, mut echo_port) = (None, None, None, None);
    let (mut key_file, mut peer_public_key, mut endpoint, mut mtu) = (None, None, None, 1420);
    let mut mode = None;
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} takes a value"));
        match arg.as_str() {
            "--address" => address = Some(value()?.parse()?),
            "--peer-addr" => peer_addr = Some(value()?.parse()?),
            "--sink-port" => sink_port = Some(value()?.parse()?),
            "--echo-port" => echo_port = Some(value()?.parse()?),
            "--private-key-file" => key_file = Some(value()?),
            "--peer-public-key" => peer_public_key = Some(value()?),
            "--endpoint" => endpoint = Some(value()?.parse()?),
            "--mtu" => mtu = value()?.parse()?,
            "bulk" => {
                mode = Some(Mode::Bulk {
                    seconds: value()?.parse()?,
                })
            }
            "rr" => {
                let conns = value()?.parse()?;
                let rounds = value()?.parse()?;
                mode = Some(Mode::Rr { conns, rounds })
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let missing = |what: &str| format!("{what} is missing");
    Ok(Args {
        address: address.ok_or_else(|| missing("--address"))?,
        peer_addr: peer_addr.ok_or_else(|| missing("--peer-addr"))?,
        sink_port: sink_port.ok_or_else(|| missing("--sink-port"))?,
        echo_port: echo_port.ok_or_else(|| missing("--echo-port"))?,
        key_file: key_file.ok_or_else(|| missing("--private-key-file"))?,
        peer_public_key: peer_public_key.ok_or_else(|| missing("--peer-public-key"))?,
        endpoint: endpoint.ok_or_else(|| missing("--endpoint"))?,
        mtu,
        mode: mode.ok_or_else(|| missing("the mode (bulk SECONDS | rr CONNS ROUNDS)"))?,
    })
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let result = match runtime {
        Ok(runtime) => runtime.block_on(run()),
        Err(e) => Err(e.into()),
    };
    match result {
        Ok(line) => println!("{line}"),
        Err(e) => {
            eprintln!("embedded_client: {}", e.to_string().replace('\n', "; "));
            std::process::exit(1);
        }
    }
}

async fn run() -> Result<String, Failure> {
    let args = parse(std::env::args().skip(1))?;
    let host = |ip: IpAddr| ipnet::IpNet::from(ip);
    let private_key = PrivateKey::from_base64(std::fs::read_to_string(&args.key_file)?.trim())?;
    let peer = PublicKey::from_base64(args.peer_public_key.trim())?;
    let tunnel = Tunnel::start(
        TunnelSettings::new(private_key)
            .address(host(args.address))
            .mtu(args.mtu)
            .peer(
                PeerSettings::new(peer)
                    .endpoint(args.endpoint)
                    .allowed_ip(host(args.peer_addr)),
            ),
    )?;
    let line = match args.mode {
        Mode::Bulk { seconds } => {
            let sink = SocketAddr::new(args.peer_addr, args.sink_port);
            tokio::time::timeout(
                Duration::from_secs_f64(seconds) + Duration::from_secs(25),
                bulk(&tunnel, sink, Duration::from_secs_f64(seconds)),
            )
            .await
            .map_err(|_| "bulk: out of time")??
        }
        Mode::Rr { conns, rounds } => {
            let echo = SocketAddr::new(args.peer_addr, args.echo_port);
            tokio::time::timeout(Duration::from_secs(85), rr(&tunnel, echo, conns, rounds))
                .await
                .map_err(|_| "rr: out of time")??
        }
    };
    tunnel.shutdown();
    Ok(line)
}

async fn bulk(tunnel: &Tunnel, sink: SocketAddr, length: Duration) -> Result<String, Failure> {
    let mut stream = tunnel.tcp_connect(sink).await?;
    let chunk = vec![0x5a_u8; CHUNK];
    let mut bytes = 0u64;
    let start = Instant::now();
    let mut last = start;
    while last.duration_since(start) < length {
        stream.write_all(&chunk).await?;
        bytes += CHUNK as u64;
        last = Instant::now();
    }
    stream.shutdown().await?;
    // The sink closes once it has read everything: then every byte has been delivered.
    let mut rest = [0u8; 1024];
    let drained = tokio::time::timeout(Duration::from_secs(10), async {
        while stream.read(&mut rest).await? > 0 {}
        Ok::<_, std::io::Error>(())
    })
    .await;
    drained.map_err(|_| "bulk: the sink did not close within 10 s")??;
    let seconds = last.duration_since(start).as_secs_f64();
    Ok(format!(
        "{{\"mode\":\"bulk\",\"bytes\":{bytes},\"seconds\":{seconds:.6}}}"
    ))
}

/// One request and its echo, checked.
async fn round_trip(stream: &mut TcpStream, request: &[u8; REQUEST]) -> Result<(), Failure> {
    stream.write_all(request).await?;
    let mut echo = [0u8; REQUEST];
    stream.read_exact(&mut echo).await?;
    if &echo != request {
        return Err("an echo differs from its request".into());
    }
    Ok(())
}

async fn rr(
    tunnel: &Tunnel,
    echo: SocketAddr,
    conns: usize,
    rounds: usize,
) -> Result<String, Failure> {
    if conns == 0 || rounds < conns {
        return Err("rr takes CONNS >= 1 and ROUNDS >= CONNS".into());
    }
    let mut streams = Vec::with_capacity(conns);
    for i in 0..conns {
        let mut stream = tunnel.tcp_connect(echo).await?;
        round_trip(&mut stream, &[i as u8; REQUEST]).await?; // warm-up, not counted
        streams.push(stream);
    }
    let tickets = Arc::new(AtomicUsize::new(rounds));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(conns);
    for (i, mut stream) in streams.into_iter().enumerate() {
        let tickets = tickets.clone();
        tasks.push(tokio::spawn(async move {
            let mut times = Vec::new();
            let mut seq = 0u32;
            while tickets
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| t.checked_sub(1))
                .is_ok()
            {
                let mut request = [0u8; REQUEST];
                request[..4].copy_from_slice(&(i as u32).to_le_bytes());
                request[4..8].copy_from_slice(&seq.to_le_bytes());
                seq += 1;
                let sent = Instant::now();
                round_trip(&mut stream, &request)
                    .await
                    .map_err(|e| e.to_string())?;
                times.push(sent.elapsed());
            }
            Ok::<_, String>((times, Instant::now()))
        }));
    }
    let mut times = Vec::with_capacity(rounds);
    let mut end = start;
    for task in tasks {
        let (mine, done) = task.await??;
        times.extend(mine);
        end = end.max(done);
    }
    let seconds = end.duration_since(start).as_secs_f64();
    times.sort();
    let at = |q: f64| {
        let i = ((times.len() - 1) as f64 * q).round() as usize;
        times[i].as_secs_f64() * 1e6
    };
    Ok(format!(
        "{{\"mode\":\"rr\",\"conns\":{conns},\"requests\":{},\"seconds\":{seconds:.6},\"requests_per_second\":{:.1},\"p50_us\":{:.1},\"p99_us\":{:.1}}}",
        times.len(),
        times.len() as f64 / seconds,
        at(0.5),
        at(0.99)
    ))
}
