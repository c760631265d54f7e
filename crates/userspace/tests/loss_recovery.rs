//! The user-space TCP recovers from loss by repairing holes (SACK, the vendored smoltcp's
//! patches), not by sending whole windows again: a bulk transfer through a lossy relay
//! against a tunneld gateway, its bytes checked, its time bounded, and the relay's count of
//! what crossed it compared with what had to.
//!
//! Not a speed test (`cargo xtask bench-embedded --lossy` measures speed); the bounds are
//! generous, and fail only when recovery is broken.

mod common;

use common::*;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tunneld_testnet::relay::{LossyRelay, RelayConfig};

/// What crosses the relay each way: 3 MiB up (the stack sends) and the same back (the
/// stack receives, and reports the holes with SACK blocks).
const BYTES: usize = 3 << 20;
const LOSS: f64 = 0.03;
const RTT: Duration = Duration::from_millis(10);
/// The transfer must finish within this. Through this relay with the patches it takes a
/// few seconds; smoltcp 0.14 as released (1 s RTO floor, one segment per fast retransmit,
/// no SACK use) stalls for a second on most losses.
const BOUND: Duration = Duration::from_secs(25);
/// Upper bound on the datagram bytes sent toward the gateway per payload byte sent. Each
/// 1380-byte segment carries 72 bytes of TCP/IP and WireGuard headers (1.05), lost
/// segments are sent again (3 %), and the ACKs of the echoed stream add about 4 %: about
/// 1.13 for hole repair. Sending the rest of the window again after a loss, as go-back-N
/// does, adds tens of segments per loss: well above this.
const MAX_OVERHEAD: f64 = 1.30;

#[test]
fn a_bulk_transfer_through_three_percent_loss_repairs_holes_only() {
    let test = "a_bulk_transfer_through_three_percent_loss_repairs_holes_only";
    if !tunneld_testnet::require_netns(test) {
        return;
    }
    let Some(tunneld) = tunneld_binary(test) else {
        return;
    };
    let mut sites = sites();
    sites.start_tunneld(&tunneld);
    let _echo = EchoServer::start(&sites.far, &["10.77.0.2:7".parse().unwrap()]);
    step("underlay through a relay: 3 % loss each way, 10 ms round trip");
    let relay = LossyRelay::start(
        &sites.near,
        "192.0.2.1:0".parse().unwrap(),
        format!("192.0.2.2:{FAR_PORT}").parse().unwrap(),
        RelayConfig::new(LOSS, RTT, Duration::from_secs(90)),
    )
    .expect("the relay starts");
    let mut settings = sites.settings(0);
    // Our tunnel sends to the relay; the gateway learns the relay's address from our
    // handshake (WireGuard roaming) and answers there.
    settings.peers[0].endpoint = Some(relay.addr());
    let tunnel = sites.start_tunnel(settings);

    let started = Instant::now();
    let sent_up = runtime().block_on(async {
        tokio::time::timeout(BOUND, async {
            // Connecting may take a few tries of the handshake through the loss.
            let stream = tunnel
                .tcp_connect("10.77.0.2:7".parse::<std::net::SocketAddr>().unwrap())
                .await
                .expect("connect through the lossy relay");
            step("3 MiB up and echoed back");
            let (mut r, mut w) = stream.into_split();
            let data = pattern(BYTES, 37);
            let sent = data.clone();
            let writer = tokio::spawn(async move {
                w.write_all(&sent).await?;
                w.shutdown().await
            });
            let mut got = Vec::with_capacity(BYTES);
            r.read_to_end(&mut got).await.expect("read the echo");
            writer.await.unwrap().expect("write");
            assert_eq!(got.len(), BYTES, "every byte came back");
            assert!(got == data, "the echoed bytes are the ones sent");
            BYTES
        })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{} bytes each way did not cross a 3 % lossy link within {} s: recovery is broken",
                BYTES,
                BOUND.as_secs()
            )
        })
    });
    let took = started.elapsed();
    tunnel.shutdown();
    let up = relay.toward_target();
    let down = relay.toward_source();
    let overhead = up.forwarded_bytes as f64 / sent_up as f64;
    eprintln!(
        "took {:.1} s; toward the gateway: {} datagrams, {} dropped, {} bytes forwarded \
         ({overhead:.3} per payload byte); back: {} datagrams, {} dropped",
        took.as_secs_f64(),
        up.received,
        up.dropped,
        up.forwarded_bytes,
        down.received,
        down.dropped
    );
    // The loss was real: about 3 % of some thousands of datagrams each way.
    assert!(
        up.dropped * 100 > up.received && down.dropped * 100 > down.received,
        "the relay dropped datagrams each way: {up:?} {down:?}"
    );
    assert!(
        overhead < MAX_OVERHEAD,
        "{overhead:.3} bytes crossed toward the gateway per payload byte (bound {MAX_OVERHEAD}): \
         the stack sent much more again than it lost"
    );
}
