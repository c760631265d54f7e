//! The user-space tunnel against wireguard-go (with a kernel TCP/IP stack behind a TUN) in
//! another network namespace.

mod common;

use common::*;
use std::time::Duration;

#[test]
fn user_space_tunnel_against_wireguard_go() {
    let test = "user_space_tunnel_against_wireguard_go";
    let Some(sites) = wireguard_go_sites(test) else {
        return;
    };
    let _echo = EchoServer::start(
        &sites.far,
        &[
            "10.77.0.2:7".parse().unwrap(),
            "[fd77::2]:7".parse().unwrap(),
        ],
    );
    let tunnel = sites.start_tunnel(sites.settings(0));
    let rt = runtime();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(180), async {
            echo_streams(&tunnel, 64, 8 << 20).await;
            listen_reached_from_far(&tunnel, &sites.far).await;
            udp_both_ways(&tunnel, &sites.far).await;
        })
        .await
        .expect("the checks finish in time");
    });
    let stats = tunnel.stats();
    assert!(stats.handshake_done, "{stats:?}");
    assert!(
        stats.tx_bytes > 256 << 20 && stats.rx_bytes > 256 << 20,
        "{stats:?}"
    );
    tunnel.shutdown();
}
