//! Peers changed on a running user-space tunnel, under open streams, with its events:
//! against a tunneld gateway and wireguard-go in another namespace (each with a TUN and the
//! kernel's TCP behind it), and between two user-space tunnels on loopback (no privileges).

mod common;

use common::*;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tunneld_userspace::{
    Error, Event, Events, PeerChange, PeerSettings, PrivateKey, PublicKey, Tunnel,
};

/// One test at a time: each keeps 64 streams busy on two shared cores.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The byte at `offset` of stream `seed`'s endless data.
fn byte_at(seed: u64, offset: u64) -> u8 {
    let x = offset
        .wrapping_add(seed << 40)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (x >> 56) as u8
}

/// Streams that write a paced, endless, checkable byte sequence to an echo server and
/// check what comes back, until told to stop; then they close and check the echo's end.
struct BusyStreams {
    stop: Arc<AtomicBool>,
    open: Arc<AtomicUsize>,
    tasks: tokio::task::JoinSet<Result<u64, String>>,
}

impl BusyStreams {
    /// `count` streams to `targets` in turn, each writing 8 KiB every 50 ms.
    async fn start(tunnel: &Tunnel, count: usize, targets: &[SocketAddr]) -> BusyStreams {
        step(&format!("{count} paced echo streams, kept open"));
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(AtomicUsize::new(0));
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..count {
            let target = targets[i % targets.len()];
            let tunnel = tunnel.clone();
            let stop = stop.clone();
            let open = open.clone();
            tasks.spawn(async move {
                let stream = tunnel
                    .tcp_connect(target)
                    .await
                    .map_err(|e| format!("stream {i}: connect {target}: {e}"))?;
                open.fetch_add(1, Ordering::SeqCst);
                let (mut r, mut w) = stream.into_split();
                let seed = i as u64;
                let writer = tokio::spawn(async move {
                    let mut sent = 0u64;
                    let mut piece = vec![0u8; 8 << 10];
                    while !stop.load(Ordering::SeqCst) {
                        for (k, b) in piece.iter_mut().enumerate() {
                            *b = byte_at(seed, sent + k as u64);
                        }
                        w.write_all(&piece).await?;
                        sent += piece.len() as u64;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    w.shutdown().await?;
                    Ok::<u64, std::io::Error>(sent)
                });
                let mut got = 0u64;
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    let n = r
                        .read(&mut buf)
                        .await
                        .map_err(|e| format!("stream {i} to {target}: read after {got} B: {e}"))?;
                    if n == 0 {
                        break;
                    }
                    for (k, b) in buf[..n].iter().enumerate() {
                        if *b != byte_at(seed, got + k as u64) {
                            return Err(format!("stream {i}: byte {} differs", got + k as u64));
                        }
                    }
                    got += n as u64;
                }
                let sent = writer
                    .await
                    .map_err(|e| format!("stream {i}: writer: {e}"))?
                    .map_err(|e| format!("stream {i}: write: {e}"))?;
                if got != sent {
                    return Err(format!("stream {i}: sent {sent} B, {got} B echoed"));
                }
                Ok(sent)
            });
        }
        let streams = BusyStreams { stop, open, tasks };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while streams.open.load(Ordering::SeqCst) < count {
            assert!(
                tokio::time::Instant::now() < deadline,
                "only {} of {count} streams connected",
                streams.open.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        streams
    }

    /// Stops them and returns each one's outcome (bytes echoed, or what went wrong).
    async fn finish(mut self) -> Vec<Result<u64, String>> {
        self.stop.store(true, Ordering::SeqCst);
        let mut outcomes = Vec::new();
        while let Some(joined) =
            tokio::time::timeout(Duration::from_secs(120), self.tasks.join_next())
                .await
                .expect("the streams end in time")
        {
            outcomes.push(joined.unwrap_or_else(|e| Err(format!("task: {e}"))));
        }
        outcomes
    }
}

/// Takes events until `wanted` returns true for one (which is returned); every event taken
/// is appended to `seen`.
async fn wait_event(
    events: &mut Events,
    seen: &mut Vec<Event>,
    what: &str,
    wanted: impl Fn(&Event) -> bool,
) -> Event {
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(event) = events.recv().await {
            seen.push(event.clone());
            if wanted(&event) {
                return Some(event);
            }
        }
        None
    })
    .await;
    match found {
        Ok(Some(event)) => event,
        Ok(None) => panic!("the events ended before {what}: {seen:?}"),
        Err(_) => panic!("no event for {what} in 30 s: {seen:?}"),
    }
}

fn echo_targets() -> [SocketAddr; 2] {
    [
        "10.77.0.2:7".parse().unwrap(),
        "[fd77::2]:7".parse().unwrap(),
    ]
}

/// The far side's operations the scenario needs.
trait FarSide {
    /// Gives the far side's peer (our tunnel) `psk`, as `wg set` does.
    fn set_preshared_key(&self, psk: &str);
}

struct WgSet<'a> {
    sites: &'a Sites,
}

impl FarSide for WgSet<'_> {
    fn set_preshared_key(&self, psk: &str) {
        let file = write_private(self.sites.dir.path(), "psk", psk);
        let ifname = &self.sites.peer.as_ref().expect("a far peer").ifname;
        self.sites.far.run(&[
            "wg",
            "set",
            ifname,
            "peer",
            &self.sites.near_key.public_key().to_base64(),
            "preshared-key",
            &file.to_string_lossy(),
        ]);
    }
}

/// The scenario: 64 streams open through the far peer while another peer is added,
/// the far peer's keepalive, endpoint, allowed IPs and preshared key change and the other
/// peer is removed: none of the 64 is lost, and the events come in order. Then the far
/// peer itself is removed (its streams reset) and added again (new streams work).
async fn peers_change_under_open_streams(sites: &Sites, tunnel: &Tunnel, far: &dyn FarSide) {
    let far_key = sites.far_public();
    let mut events = tunnel.events();
    let mut seen = Vec::new();
    step("ready: the first handshake");
    tokio::time::timeout(Duration::from_secs(20), tunnel.ready(&far_key))
        .await
        .expect("a handshake in 20 s")
        .expect("ready");
    wait_event(
        &mut events,
        &mut seen,
        "the first handshake",
        |e| matches!(e, Event::HandshakeCompleted { peer, .. } if *peer == far_key),
    )
    .await;
    tunnel.ready(&far_key).await.expect("ready again at once");

    let streams = BusyStreams::start(tunnel, 64, &echo_targets()).await;

    step("add another peer (nobody answers there)");
    let other = PrivateKey::generate().public_key();
    tunnel
        .add_peer(
            PeerSettings::new(other)
                .endpoint("192.0.2.2:51999".parse().unwrap())
                .allowed_ip("10.99.0.0/24".parse().unwrap()),
        )
        .await
        .unwrap();
    assert!(matches!(
        tunnel
            .add_peer(PeerSettings::new(other))
            .await,
        Err(Error::PeerExists(k)) if k == other
    ));
    wait_event(&mut events, &mut seen, "the other peer added", |e| {
        *e == Event::PeerAdded { peer: other }
    })
    .await;

    step("the far peer: keepalive, a second endpoint address, more allowed IPs");
    tunnel
        .update_peer(PeerChange::new(far_key).persistent_keepalive(5))
        .await
        .unwrap();
    sites
        .far
        .run(&["ip", "addr", "add", "192.0.2.3/24", "dev", &sites.far_if]);
    let moved: SocketAddr = format!("192.0.2.3:{FAR_PORT}").parse().unwrap();
    tunnel
        .update_peer(PeerChange::new(far_key).endpoint(moved))
        .await
        .unwrap();
    wait_event(&mut events, &mut seen, "the endpoint moved", |e| {
        *e == Event::EndpointChanged {
            peer: far_key,
            endpoint: moved,
        }
    })
    .await;
    tunnel
        .update_peer(PeerChange::new(far_key).allowed_ips(vec![
            "10.77.0.2/32".parse().unwrap(),
            "fd77::2/128".parse().unwrap(),
            "10.77.9.0/24".parse().unwrap(),
        ]))
        .await
        .unwrap();
    let peers = tunnel.peers().await.unwrap();
    let far_state = peers.iter().find(|p| p.public_key == far_key).unwrap();
    assert_eq!(far_state.allowed_ips.len(), 3, "{far_state:?}");
    assert_eq!(far_state.persistent_keepalive, 5);
    assert!(far_state.last_handshake.is_some() && far_state.rx_bytes > 0);
    assert!(far_state.preshared_key.is_none(), "never handed out");
    assert!(peers.iter().any(|p| p.public_key == other));

    step("a preshared key on both sides: a new session");
    let psk = tunneld_userspace::PresharedKey::generate();
    far.set_preshared_key(&psk.to_base64());
    tunnel
        .update_peer(PeerChange::new(far_key).preshared_key(Some(psk)))
        .await
        .unwrap();
    wait_event(
        &mut events,
        &mut seen,
        "a handshake with the new key",
        |e| matches!(e, Event::HandshakeCompleted { peer, .. } if *peer == far_key),
    )
    .await;

    step("remove the other peer");
    tunnel.remove_peer(&other).await.unwrap();
    wait_event(&mut events, &mut seen, "the other peer removed", |e| {
        *e == Event::PeerRemoved { peer: other }
    })
    .await;
    assert!(matches!(
        tunnel.remove_peer(&other).await,
        Err(Error::UnknownPeer(k)) if k == other
    ));
    assert!(matches!(
        tunnel.ready(&other).await,
        Err(Error::UnknownPeer(_))
    ));
    let unrouted = tunnel.tcp_connect("10.99.0.1:7").await;
    assert_eq!(
        unrouted.err().map(|e| e.kind()),
        Some(std::io::ErrorKind::HostUnreachable)
    );

    // Some more traffic after the last change, then every stream must have all its bytes.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let outcomes = streams.finish().await;
    let failed: Vec<&String> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    assert!(failed.is_empty(), "streams lost: {failed:?}");
    assert_eq!(outcomes.len(), 64);
    let total: u64 = outcomes.iter().map(|o| *o.as_ref().unwrap()).sum();
    step(&format!("all 64 streams intact, {total} B echoed"));

    step("remove the far peer under 4 open streams, then add it back");
    let doomed = BusyStreams::start(tunnel, 4, &echo_targets()).await;
    tunnel.remove_peer(&far_key).await.unwrap();
    wait_event(&mut events, &mut seen, "the far peer removed", |e| {
        *e == Event::PeerRemoved { peer: far_key }
    })
    .await;
    let outcomes = doomed.finish().await;
    assert!(
        outcomes.iter().all(|o| o.is_err()),
        "streams through a removed peer are reset: {outcomes:?}"
    );
    let mut back = sites.settings(0).peers.remove(0);
    back.preshared_key = Some(psk_again(&sites.dir));
    tunnel.add_peer(back).await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), tunnel.ready(&far_key))
        .await
        .expect("a handshake in 20 s")
        .expect("ready after re-adding");
    let again = BusyStreams::start(tunnel, 4, &echo_targets()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    for outcome in again.finish().await {
        outcome.expect("a stream through the re-added peer");
    }

    step("shut down: Stopped is the last event");
    tunnel.shutdown();
    while let Some(event) = tokio::time::timeout(Duration::from_secs(10), events.recv())
        .await
        .expect("the events end after shutdown")
    {
        seen.push(event);
    }
    assert_eq!(seen.last(), Some(&Event::Stopped), "{seen:?}");
    assert_order(
        &seen,
        &[
            &|e| matches!(e, Event::HandshakeCompleted { peer, .. } if *peer == far_key),
            &|e| *e == Event::PeerAdded { peer: other },
            &|e| matches!(e, Event::EndpointChanged { endpoint, .. } if *endpoint == moved),
            &|e| matches!(e, Event::HandshakeCompleted { peer, .. } if *peer == far_key),
            &|e| *e == Event::PeerRemoved { peer: other },
            &|e| *e == Event::PeerRemoved { peer: far_key },
            &|e| *e == Event::PeerAdded { peer: far_key },
            &|e| matches!(e, Event::HandshakeCompleted { peer, .. } if *peer == far_key),
            &|e| *e == Event::Stopped,
        ],
    );
    assert!(matches!(tunnel.ready(&far_key).await, Err(Error::Stopped)));
    let mut late = tunnel.events();
    assert_eq!(late.recv().await, Some(Event::Stopped));
    assert_eq!(late.recv().await, None);
}

/// The preshared key the far side has now (written by `WgSet::set_preshared_key`).
fn psk_again(dir: &tempfile::TempDir) -> tunneld_userspace::PresharedKey {
    let text = std::fs::read_to_string(dir.path().join("psk")).unwrap();
    tunneld_userspace::PresharedKey::from_base64(text.trim()).unwrap()
}

/// `seen` has events matching `steps`, in that order (others may come between).
fn assert_order(seen: &[Event], steps: &[&dyn Fn(&Event) -> bool]) {
    let mut at = 0;
    for (n, step) in steps.iter().enumerate() {
        match seen[at..].iter().position(step) {
            Some(k) => at += k + 1,
            None => panic!("step {n} of the expected order not found after event {at}: {seen:?}"),
        }
    }
}

#[test]
fn peers_change_under_open_streams_against_a_tunneld_gateway() {
    let _serial = one_at_a_time();
    let test = "peers_change_under_open_streams_against_a_tunneld_gateway";
    if !tunneld_testnet::require_netns(test) {
        return;
    }
    let Some(tunneld) = tunneld_binary(test) else {
        return;
    };
    let mut sites = sites();
    sites.start_tunneld(&tunneld);
    let _echo = EchoServer::start(&sites.far, &echo_targets());
    let tunnel = sites.start_tunnel(sites.settings(0));
    runtime().block_on(peers_change_under_open_streams(
        &sites,
        &tunnel,
        &WgSet { sites: &sites },
    ));
}

#[test]
fn peers_change_under_open_streams_against_wireguard_go() {
    let _serial = one_at_a_time();
    let test = "peers_change_under_open_streams_against_wireguard_go";
    let Some(sites) = wireguard_go_sites(test) else {
        return;
    };
    let _echo = EchoServer::start(&sites.far, &echo_targets());
    let tunnel = sites.start_tunnel(sites.settings(0));
    runtime().block_on(peers_change_under_open_streams(
        &sites,
        &tunnel,
        &WgSet { sites: &sites },
    ));
}

/// Two user-space tunnels on loopback (no privileges): a peer unknown to the other side
/// reports failed handshakes, and `ready` and a connect waiting on it fail naming it; once
/// the other side adds it, `ready` returns (with `stats` agreeing) and traffic flows.
#[test]
fn two_tunnels_on_loopback_report_failure_then_readiness() {
    let _serial = one_at_a_time();
    runtime().block_on(async {
        let (a_key, b_key) = (PrivateKey::generate(), PrivateKey::generate());
        let settings = |key: &PrivateKey, address: &str| {
            tunneld_userspace::TunnelSettings::new(key.clone())
                .listen("127.0.0.1:0".parse().unwrap())
                .address(address.parse().unwrap())
        };
        let a = Tunnel::start(settings(&a_key, "10.88.0.1/24")).unwrap();
        let b = Tunnel::start(settings(&b_key, "10.88.0.2/24")).unwrap();
        let peer = |key: &PublicKey, endpoint: SocketAddr, ip: &str| {
            PeerSettings::new(*key)
                .endpoint(endpoint)
                .allowed_ip(ip.parse().unwrap())
        };
        let mut events = a.events();
        let mut seen = Vec::new();
        a.add_peer(peer(&b_key.public_key(), b.local_addr(), "10.88.0.2/32"))
            .await
            .unwrap();
        let b_pub = b_key.public_key();
        // B does not know A yet: A's attempt goes unanswered, and what waits on it says so.
        let waiting = tokio::spawn({
            let a = a.clone();
            async move { a.ready(&b_pub).await }
        });
        let connecting = tokio::spawn({
            let a = a.clone();
            async move { a.tcp_connect("10.88.0.2:7").await }
        });
        let failed = wait_event(
            &mut events,
            &mut seen,
            "a failed handshake",
            |e| matches!(e, Event::HandshakeFailed { peer, .. } if *peer == b_pub),
        )
        .await;
        let Event::HandshakeFailed { waited, .. } = failed else {
            unreachable!()
        };
        assert!(waited >= tunneld_userspace::HANDSHAKE_FAILED_AFTER);
        // A failed attempt is not yet a reason to give up: WireGuard retries, and a peer
        // that was starting would answer the next one.
        assert!(
            !waiting.is_finished(),
            "ready waits through one failed attempt"
        );
        let not_ready = tokio::time::timeout(tunneld_userspace::HANDSHAKE_GIVE_UP, waiting)
            .await
            .expect("ready gives up after HANDSHAKE_GIVE_UP")
            .unwrap();
        match not_ready {
            Err(Error::HandshakeFailed(failed)) => {
                assert_eq!(failed.peer, b_pub);
                assert!(failed.waited >= tunneld_userspace::HANDSHAKE_GIVE_UP);
                assert!(failed.to_string().contains(&b_pub.to_base64()), "{failed}");
            }
            other => panic!("ready: {other:?}"),
        }
        let refused = tokio::time::timeout(Duration::from_secs(2), connecting)
            .await
            .expect("a connect through the silent peer gives up with it, not after 60 s")
            .unwrap()
            .expect_err("no connection without a handshake");
        assert_eq!(refused.kind(), std::io::ErrorKind::TimedOut);
        let inner = refused
            .get_ref()
            .and_then(|e| e.downcast_ref::<tunneld_userspace::HandshakeFailed>())
            .unwrap_or_else(|| panic!("the connect's error names the handshake: {refused}"));
        assert_eq!(inner.peer, b_pub);
        assert!(!a.stats().handshake_done);

        step("B adds A: the retried handshake completes and ready returns");
        b.add_peer(peer(&a_key.public_key(), a.local_addr(), "10.88.0.1/32"))
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(15), a.ready(&b_pub))
            .await
            .expect("ready within a retry")
            .unwrap();
        // Not 250 ms later: the counters say what ready said.
        assert!(a.stats().handshake_done, "stats agree with ready at once");
        wait_event(
            &mut events,
            &mut seen,
            "the handshake",
            |e| matches!(e, Event::HandshakeCompleted { peer, .. } if *peer == b_pub),
        )
        .await;
        let listener = b.tcp_listen("0.0.0.0:7".parse().unwrap()).await.unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            s.read_to_end(&mut buf).await.unwrap();
            s.write_all(&buf).await.unwrap();
            s.shutdown().await.unwrap();
        });
        let mut s = a.tcp_connect("10.88.0.2:7").await.unwrap();
        s.write_all(b"through a peer added live").await.unwrap();
        s.shutdown().await.unwrap();
        let mut back = Vec::new();
        s.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"through a peer added live");
        server.await.unwrap();
        let state = a.peers().await.unwrap();
        assert_eq!(state.len(), 1);
        assert!(state[0].last_handshake.is_some() && state[0].tx_bytes > 0);
        a.shutdown();
        b.shutdown();
        assert!(matches!(a.peers().await, Err(Error::Stopped)));
    });
}
