//! The user-space tunnel against a tunneld gateway (`tunneld up`, with a TUN device) in
//! another network namespace: the core checks, a lossy underlay, and a gateway restart.

mod common;

use common::*;
use std::io;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Sites with a tunneld gateway and an echo server on the far side, or `None` to skip.
fn gateway_sites(test: &str) -> Option<(Sites, std::path::PathBuf)> {
    if !tunneld_testnet::require_netns(test) {
        return None;
    }
    let tunneld = tunneld_binary(test)?;
    let mut sites = sites();
    sites.start_tunneld(&tunneld);
    Some((sites, tunneld))
}

fn echo_addrs() -> [std::net::SocketAddr; 2] {
    [
        "10.77.0.2:7".parse().unwrap(),
        "[fd77::2]:7".parse().unwrap(),
    ]
}

#[test]
fn user_space_tunnel_against_a_tunneld_gateway() {
    let Some((sites, _)) = gateway_sites("user_space_tunnel_against_a_tunneld_gateway") else {
        return;
    };
    let _echo = EchoServer::start(&sites.far, &echo_addrs());
    let tunnel = sites.start_tunnel(sites.settings(0));
    runtime().block_on(async {
        tokio::time::timeout(Duration::from_secs(180), async {
            echo_streams(&tunnel, 64, 8 << 20).await;
            listen_reached_from_far(&tunnel, &sites.far).await;
            udp_both_ways(&tunnel, &sites.far).await;
        })
        .await
        .expect("the checks finish in time");
    });
    assert!(tunnel.stats().handshake_done);
    tunnel.shutdown();
}

#[test]
fn a_lossy_reordering_slow_underlay_still_delivers_intact() {
    let test = "a_lossy_reordering_slow_underlay_still_delivers_intact";
    if !require_tool(test, "tc") {
        return;
    }
    let Some((sites, _)) = gateway_sites(test) else {
        return;
    };
    step("netem: 10% loss, 20 ms delay, 25% reordered, both ways");
    for (ns, ifname) in [(&sites.near, &sites.near_if), (&sites.far, &sites.far_if)] {
        ns.run(&[
            "tc", "qdisc", "add", "dev", ifname, "root", "netem", "loss", "10%", "delay", "20ms",
            "reorder", "25%",
        ]);
    }
    let _echo = EchoServer::start(&sites.far, &echo_addrs());
    let tunnel = sites.start_tunnel(sites.settings(0));
    runtime().block_on(async {
        tokio::time::timeout(Duration::from_secs(240), echo_streams(&tunnel, 4, 2 << 20))
            .await
            .expect("4 MiB or so cross a lossy link in time");
    });
    tunnel.shutdown();
}

#[test]
fn a_gateway_restart_mid_stream_ends_in_recovery_or_an_error_never_a_hang() {
    let test = "a_gateway_restart_mid_stream_ends_in_recovery_or_an_error_never_a_hang";
    let Some((mut sites, tunneld)) = gateway_sites(test) else {
        return;
    };
    let _echo = EchoServer::start(&sites.far, &echo_addrs());
    let tunnel = sites.start_tunnel(sites.settings(0));
    let rt = runtime();
    // Streams that send 8 MiB in pieces, paced so that the restart falls in the middle.
    let streams: Vec<_> = (0..4u32)
        .map(|i| {
            let tunnel = tunnel.clone();
            rt.spawn(async move {
                let target = if i % 2 == 0 {
                    "10.77.0.2:7"
                } else {
                    "[fd77::2]:7"
                };
                let stream = tunnel.tcp_connect(target.parse().unwrap()).await?;
                let (mut r, mut w) = stream.into_split();
                let data = pattern(8 << 20, i);
                let sent = data.clone();
                let writer = tokio::spawn(async move {
                    for piece in sent.chunks(256 << 10) {
                        w.write_all(piece).await?;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    w.shutdown().await
                });
                let mut got = Vec::new();
                r.read_to_end(&mut got).await?;
                writer.await.map_err(io::Error::other)??;
                assert!(
                    got == data,
                    "stream {i}: a stream that ends well has all its bytes"
                );
                Ok::<_, io::Error>(())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1200));
    step("stop the gateway mid-stream, and start it again");
    if let Some(peer) = sites.peer.as_mut() {
        peer.stop();
    }
    std::thread::sleep(Duration::from_secs(1));
    sites.start_tunneld(&tunneld);
    rt.block_on(async {
        for (i, s) in streams.into_iter().enumerate() {
            match tokio::time::timeout(Duration::from_secs(150), s).await {
                Err(_) => panic!("stream {i} hung after the restart"),
                Ok(joined) => match joined.unwrap() {
                    Ok(()) => eprintln!("stream {i}: recovered, all bytes echoed"),
                    Err(e) => eprintln!("stream {i}: ended with an error: {e}"),
                },
            }
        }
        step("a new stream works after the restart");
        tokio::time::timeout(Duration::from_secs(60), echo_streams(&tunnel, 1, 1 << 20))
            .await
            .expect("a new stream in time");
    });
    tunnel.shutdown();
}
