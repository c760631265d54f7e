//! The tokio ecosystem's traits over a tunnel: axum serving on the tunnel's `TcpListener`,
//! hyper-util's pooled client through its `Connector`, a tonic server inside a tunnel, the
//! listener as a `Stream`, and
//! connected UDP sockets, names resolved through a DNS server (dnsmasq) in the far site.
//! In process over loopback (two tunnels, no privileges), against a tunneld gateway and
//! wireguard-go in another namespace, and the `axum_server` and `pooled_client` examples
//! run as a user would.

mod common;

use common::*;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tunneld_userspace::{Connector, PeerSettings, PrivateKey, Tunnel, TunnelSettings};

/// Two tunnels on loopback, each the other's peer, handshaken: A is 10.88.0.1, B 10.88.0.2.
async fn pair() -> (Tunnel, Tunnel) {
    let (a_key, b_key) = (PrivateKey::generate(), PrivateKey::generate());
    let start = |key: &PrivateKey, address: &str| {
        Tunnel::start(
            TunnelSettings::new(key.clone())
                .listen("127.0.0.1:0".parse().unwrap())
                .address(address.parse().unwrap()),
        )
        .unwrap()
    };
    let (a, b) = (start(&a_key, "10.88.0.1/24"), start(&b_key, "10.88.0.2/24"));
    a.add_peer(
        PeerSettings::new(b_key.public_key())
            .endpoint(b.local_addr())
            .allowed_ip("10.88.0.2/32".parse().unwrap()),
    )
    .await
    .unwrap();
    b.add_peer(
        PeerSettings::new(a_key.public_key())
            .endpoint(a.local_addr())
            .allowed_ip("10.88.0.1/32".parse().unwrap()),
    )
    .await
    .unwrap();
    tokio::time::timeout(Duration::from_secs(10), a.ready(&b_key.public_key()))
        .await
        .expect("a handshake")
        .unwrap();
    (a, b)
}

#[test]
fn axum_serves_in_one_tunnel_and_the_pooled_client_reaches_it_through_another() {
    runtime().block_on(async {
        let (a, b) = pair().await;
        let app = axum::Router::new().route(
            "/hello",
            axum::routing::get(|| async { "hello from inside a tunnel\n" }),
        );
        let listener = a.tcp_listen("0.0.0.0:80".parse().unwrap()).await.unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, app).await });

        let client: Client<Connector, Empty<Bytes>> =
            Client::builder(TokioExecutor::new()).build(Connector::new(b.clone()));
        for n in 0..10 {
            let response = client
                .get("http://10.88.0.1/hello".parse().unwrap())
                .await
                .unwrap_or_else(|e| panic!("request {n}: {e}"));
            assert_eq!(response.status(), 200);
            let body = response.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], b"hello from inside a tunnel\n");
        }
        // A name, with no DNS server in the tunnel: a clear error, nothing sent anywhere.
        let e = client
            .get("http://db.internal/".parse().unwrap())
            .await
            .unwrap_err();
        assert!(format!("{e:?}").contains("no DNS server"), "{e:?}");
        server.abort();
        a.shutdown();
        b.shutdown();
    });
}

#[test]
fn the_listener_is_a_stream_and_udp_sockets_connect() {
    use futures_core::Stream;
    runtime().block_on(async {
        let (a, b) = pair().await;
        let mut listener = a.tcp_listen("0.0.0.0:7".parse().unwrap()).await.unwrap();
        let client = tokio::spawn({
            let b = b.clone();
            async move {
                for n in 0..3u8 {
                    let mut s = b.tcp_connect("10.88.0.1:7").await.unwrap();
                    s.write_all(&[n]).await.unwrap();
                    s.shutdown().await.unwrap();
                }
            }
        });
        let mut got = Vec::new();
        for _ in 0..3 {
            let next =
                std::future::poll_fn(|cx| std::pin::Pin::new(&mut listener).poll_next(cx)).await;
            let mut stream = next.expect("the stream goes on").unwrap();
            let mut byte = Vec::new();
            stream.read_to_end(&mut byte).await.unwrap();
            got.extend(byte);
        }
        client.await.unwrap();
        got.sort();
        assert_eq!(got, vec![0, 1, 2]);

        // Connected UDP: send/recv to one peer; a datagram from another port is not taken.
        let server = a.udp_bind("0.0.0.0:53".parse().unwrap()).await.unwrap();
        let socket = b.udp_bind("0.0.0.0:0".parse().unwrap()).await.unwrap();
        let stranger = a.udp_bind("0.0.0.0:54".parse().unwrap()).await.unwrap();
        assert_eq!(
            socket.send(b"x").await.unwrap_err().kind(),
            std::io::ErrorKind::NotConnected
        );
        socket.connect("10.88.0.1:53".parse().unwrap()).unwrap();
        assert_eq!(
            socket.peer_addr().unwrap(),
            "10.88.0.1:53".parse::<SocketAddr>().unwrap()
        );
        let me = socket.local_addr().unwrap().port();
        let to_me: SocketAddr = format!("10.88.0.2:{me}").parse().unwrap();
        stranger.send_to(b"not for you", to_me).await.unwrap();
        // Sent after the stranger's, so taken after it would have been.
        tokio::time::sleep(Duration::from_millis(200)).await;
        socket.send(b"query").await.unwrap();
        let mut buf = [0u8; 64];
        let (n, from) = tokio::time::timeout(WAIT, server.recv_from(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf[..n], b"query");
        server.send_to(b"answer", from).await.unwrap();
        let n = tokio::time::timeout(WAIT, socket.recv(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf[..n], b"answer", "the stranger's datagram was skipped");

        a.shutdown();
        let end = std::future::poll_fn(|cx| std::pin::Pin::new(&mut listener).poll_next(cx)).await;
        assert!(end.is_none(), "the stream ends with the tunnel");
        b.shutdown();
    });
}

/// An example binary beside the tests' directory (`cargo test` builds the examples).
fn example(name: &str) -> PathBuf {
    let path = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name);
    assert!(path.is_file(), "{} is missing", path.display());
    path
}

fn key_file(sites: &Sites) -> String {
    let path = write_private(sites.dir.path(), "near.key", &sites.near_key.to_base64());
    path.to_string_lossy().into_owned()
}

/// One HTTP/1.1 request on `stream` (a kernel socket in the far namespace); the response.
fn http(stream: &mut std::net::TcpStream, request: &str) -> String {
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        response.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&response).into_owned()
}

#[test]
fn the_axum_server_example_serves_the_far_site() {
    let test = "the_axum_server_example_serves_the_far_site";
    if !tunneld_testnet::require_netns(test) {
        return;
    }
    let Some(tunneld) = tunneld_binary(test) else {
        return;
    };
    let example = example("axum_server");
    let mut sites = sites();
    sites.start_tunneld(&tunneld);
    step("axum_server in A, on the user-space tunnel's port");
    let out = sites.dir.path().join("axum.out");
    let mut child = sites
        .near
        .command(example.to_str().unwrap())
        .args(["--key-file", &key_file(&sites)])
        .args(["--address", "10.77.0.1/24"])
        .args(["--listen", &format!("0.0.0.0:{NEAR_PORT}")])
        .args(["--peer", &sites.far_public().to_string()])
        .args(["--endpoint", &format!("192.0.2.2:{FAR_PORT}")])
        .args(["--allowed-ips", "10.77.0.2/32"])
        .args(["--port", "8080"])
        .stdout(std::fs::File::create(&out).unwrap())
        .spawn()
        .unwrap();
    let output = || std::fs::read_to_string(&out).unwrap_or_default();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !output().contains("serving on 10.77.0.1:8080") {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("axum_server exited ({status}): {}", output());
        }
        if std::time::Instant::now() > deadline {
            tunneld_testnet::stop_process(&mut child);
            panic!("axum_server did not start serving: {}", output());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    step("B's kernel TCP: GET /hello and POST /echo");
    let (hello, echo) = sites.far.in_ns(|| {
        let target: SocketAddr = "10.77.0.1:8080".parse().unwrap();
        let connect = || {
            let s = std::net::TcpStream::connect_timeout(&target, WAIT).unwrap();
            s.set_read_timeout(Some(WAIT)).unwrap();
            s
        };
        let hello = http(
            &mut connect(),
            "GET /hello HTTP/1.1\r\nHost: 10.77.0.1\r\nConnection: close\r\n\r\n",
        );
        let echo = http(
            &mut connect(),
            "POST /echo HTTP/1.1\r\nHost: 10.77.0.1\r\nContent-Length: 11\r\n\
             Content-Type: text/plain\r\nConnection: close\r\n\r\nround trip!",
        );
        (hello, echo)
    });
    assert!(hello.starts_with("HTTP/1.1 200"), "{hello}");
    assert!(hello.ends_with("hello from inside a tunnel\n"), "{hello}");
    assert!(
        echo.starts_with("HTTP/1.1 200") && echo.ends_with("round trip!"),
        "{echo}"
    );
    step("SIGINT: a graceful stop");
    let status = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            tunneld_testnet::stop_process(&mut child);
            panic!("axum_server did not stop on SIGINT: {}", output());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}: {}", output());
    assert!(output().contains("stopped"));
}

#[test]
fn the_pooled_client_example_reuses_its_connection() {
    let test = "the_pooled_client_example_reuses_its_connection";
    if !tunneld_testnet::require_netns(test) {
        return;
    }
    let Some(tunneld) = tunneld_binary(test) else {
        return;
    };
    let example = example("pooled_client");
    let mut sites = sites();
    sites.start_tunneld(&tunneld);
    step("a keep-alive HTTP server in B counting connections and requests");
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let server = sites.far.spawn_in_ns(move || {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = std::net::TcpListener::bind("10.77.0.2:8080").unwrap();
        listener.set_nonblocking(true).unwrap();
        ready_tx.send(()).unwrap();
        let requests = std::sync::Arc::new(AtomicUsize::new(0));
        let mut connections = 0;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        // A thread per connection: the client may open a second while the first is idle.
        while requests.load(Ordering::SeqCst) < 20 && std::time::Instant::now() < deadline {
            let Ok((mut conn, _)) = listener.accept() else {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            };
            connections += 1;
            let requests = requests.clone();
            std::thread::spawn(move || {
                conn.set_nonblocking(false).unwrap();
                conn.set_read_timeout(Some(Duration::from_secs(30)))
                    .unwrap();
                let mut pending = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => pending.extend_from_slice(&buf[..n]),
                    }
                    while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                        pending.drain(..end + 4);
                        let n = requests.fetch_add(1, Ordering::SeqCst) + 1;
                        let body = format!("response {n}\n");
                        let reply = format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if conn.write_all(reply.as_bytes()).is_err() {
                            return;
                        }
                    }
                }
            });
        }
        (connections, requests.load(Ordering::SeqCst))
    });
    ready_rx.recv_timeout(WAIT).unwrap();
    let _dns = Dnsmasq::start(&sites);
    step("pooled_client in A: 20 requests to a name the far site's DNS server knows");
    let out = sites
        .near
        .command(example.to_str().unwrap())
        .args(["--key-file", &key_file(&sites)])
        .args(["--address", "10.77.0.1/24"])
        .args(["--peer", &sites.far_public().to_string()])
        .args(["--endpoint", &format!("192.0.2.2:{FAR_PORT}")])
        .args(["--allowed-ips", "10.77.0.2/32"])
        .args(["--requests", "20"])
        .args(["--dns", "10.77.0.2"])
        .arg("http://api.internal:8080/")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "pooled_client failed: {stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "response 20\n");
    let (connections, requests) = server.join().unwrap();
    assert_eq!(requests, 20);
    // hyper-util's pool races a new connection against an idle one coming back, so a few
    // may be opened; without reuse there would be one per request.
    eprintln!("20 requests over {connections} connections");
    assert!(
        connections < 10,
        "the pool reused its connections: {connections} for 20 requests"
    );
}

/// dnsmasq in the far site on 10.77.0.2:53, the only server for `.internal`: `db.internal`
/// and `api.internal` are 10.77.0.2 and fd77::2, other names there do not exist.
/// Stopped when dropped.
struct Dnsmasq {
    child: std::process::Child,
}

impl Dnsmasq {
    fn start(sites: &Sites) -> Dnsmasq {
        step("dnsmasq in the far site, on its tunnel address");
        let pid_file = sites.dir.path().join("dnsmasq.pid");
        let child = sites
            .far
            .command("dnsmasq")
            .args([
                "--keep-in-foreground",
                "--no-resolv",
                "--no-hosts",
                "--bind-interfaces",
                "--listen-address=10.77.0.2",
                "--except-interface=lo",
                "--local=/internal/",
                "--host-record=db.internal,10.77.0.2,fd77::2",
                "--host-record=api.internal,10.77.0.2",
                "--log-queries",
                "--log-facility=-",
            ])
            .arg(format!("--pid-file={}", pid_file.display()))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("dnsmasq (cargo xtask deps installs dnsmasq-base)");
        let far = &sites.far;
        wait_until("dnsmasq listens on 10.77.0.2:53", || {
            far.run(&["ss", "-lun"]).contains("10.77.0.2:53")
        });
        Dnsmasq { child }
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        tunneld_testnet::stop_process(&mut self.child);
    }
}

/// Names resolved by a DNS server in the far site, asked through the tunnel: `resolve`,
/// `tcp_connect` with a name (both forms), a name that does not exist.
async fn names_through_the_far_sites_dns(tunnel: &Tunnel, far: &tunneld_userspace::PublicKey) {
    use std::net::IpAddr;
    // The handshake first, as a program would wait for it: a first initiation that
    // reaches the far side before its socket is up is retried only after 5 s, which
    // would eat into the resolver's own timeouts.
    tokio::time::timeout(Duration::from_secs(30), tunnel.ready(far))
        .await
        .expect("a handshake in time")
        .unwrap();
    step("resolve db.internal through the tunnel");
    let mut found = tokio::time::timeout(WAIT, tunnel.resolve("db.internal"))
        .await
        .expect("an answer in time")
        .unwrap();
    found.sort();
    let wanted: Vec<IpAddr> = vec!["10.77.0.2".parse().unwrap(), "fd77::2".parse().unwrap()];
    assert_eq!(found, wanted);
    let e = tunnel.resolve("missing.internal").await.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    assert!(e.to_string().contains("missing.internal"), "{e}");

    step("tcp_connect by name, both forms");
    for n in 0..2u8 {
        let mut stream = if n == 0 {
            tunnel.tcp_connect(("db.internal", 7)).await.unwrap()
        } else {
            tunnel.tcp_connect("db.internal:7").await.unwrap()
        };
        assert!(stream.peer_addr().unwrap().port() == 7);
        stream.write_all(b"by name").await.unwrap();
        stream.shutdown().await.unwrap();
        let mut back = Vec::new();
        stream.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"by name");
    }
}

#[test]
fn names_resolve_through_a_dns_server_in_a_tunneld_gateways_site() {
    let test = "names_resolve_through_a_dns_server_in_a_tunneld_gateways_site";
    if !tunneld_testnet::require_netns(test) || !tunneld_testnet::require_tool(test, "dnsmasq") {
        return;
    }
    let Some(tunneld) = tunneld_binary(test) else {
        return;
    };
    let mut sites = sites();
    sites.start_tunneld(&tunneld);
    let _dns = Dnsmasq::start(&sites);
    let _echo = EchoServer::start(
        &sites.far,
        &[
            "10.77.0.2:7".parse().unwrap(),
            "[fd77::2]:7".parse().unwrap(),
        ],
    );
    let tunnel = sites.start_tunnel(sites.settings(0).dns_server("10.77.0.2".parse().unwrap()));
    runtime().block_on(names_through_the_far_sites_dns(
        &tunnel,
        &sites.far_public(),
    ));
    tunnel.shutdown();
}

#[test]
fn names_resolve_through_a_dns_server_in_wireguard_gos_site() {
    let test = "names_resolve_through_a_dns_server_in_wireguard_gos_site";
    if !tunneld_testnet::require_tool(test, "dnsmasq") {
        return;
    }
    let Some(sites) = wireguard_go_sites(test) else {
        return;
    };
    let _dns = Dnsmasq::start(&sites);
    let _echo = EchoServer::start(
        &sites.far,
        &[
            "10.77.0.2:7".parse().unwrap(),
            "[fd77::2]:7".parse().unwrap(),
        ],
    );
    let tunnel = sites.start_tunnel(sites.settings(0).dns_server("10.77.0.2".parse().unwrap()));
    runtime().block_on(names_through_the_far_sites_dns(
        &tunnel,
        &sites.far_public(),
    ));
    tunnel.shutdown();
}

/// A tonic server inside one tunnel (the `tonic` feature: the tunnel's `TcpStream` is
/// tonic's `Connected`), asked through another: its handlers see the caller's address
/// inside the tunnel.
#[test]
fn a_tonic_server_inside_a_tunnel_sees_its_callers_tunnel_address() {
    use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
    runtime().block_on(async {
        let (a, b) = pair().await;
        let (reporter, health) = tonic_health::server::health_reporter();
        reporter
            .set_service_status("tunneld.Demo", tonic_health::ServingStatus::Serving)
            .await;
        let listener = b
            .tcp_listen("10.88.0.2:50051".parse().unwrap())
            .await
            .unwrap();
        let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .layer(tonic::service::InterceptorLayer::new(
                    move |request: tonic::Request<()>| -> Result<_, tonic::Status> {
                        let _ = seen_tx.send(request.remote_addr());
                        Ok(request)
                    },
                ))
                .add_service(health)
                .serve_with_incoming(listener),
        );
        let channel = tonic::transport::Endpoint::from_static("http://10.88.0.2:50051")
            .connect_with_connector(Connector::new(a.clone()))
            .await
            .unwrap();
        let status = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: "tunneld.Demo".into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status();
        assert_eq!(
            status,
            tonic_health::pb::health_check_response::ServingStatus::Serving
        );
        let caller = seen_rx.recv().await.unwrap().expect("the caller's address");
        assert_eq!(
            caller.ip(),
            "10.88.0.1".parse::<std::net::IpAddr>().unwrap()
        );
        server.abort();
        a.shutdown();
        b.shutdown();
    });
}

#[test]
fn the_grpc_health_example_asks_a_tonic_server_at_the_far_site() {
    let test = "the_grpc_health_example_asks_a_tonic_server_at_the_far_site";
    if !tunneld_testnet::require_netns(test) {
        return;
    }
    let Some(tunneld) = tunneld_binary(test) else {
        return;
    };
    let example = example("grpc_health");
    let mut sites = sites();
    sites.start_tunneld(&tunneld);
    step("a tonic gRPC server with the health service in B, on its kernel TCP");
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = sites.far.spawn_in_ns(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let (reporter, service) = tonic_health::server::health_reporter();
            reporter
                .set_service_status("tunneld.Demo", tonic_health::ServingStatus::Serving)
                .await;
            reporter
                .set_service_status("tunneld.Down", tonic_health::ServingStatus::NotServing)
                .await;
            let listener = tokio::net::TcpListener::bind("10.77.0.2:50051")
                .await
                .unwrap();
            ready_tx.send(()).unwrap();
            // Stopped outright, not gracefully: a graceful stop would wait for the
            // client's connection, which a process that exited leaves open.
            let serve = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream_of(listener));
            tokio::select! {
                served = serve => served.unwrap(),
                _ = stop_rx => {}
            }
        });
    });
    ready_rx.recv_timeout(WAIT).unwrap();
    step("grpc_health in A, through its user-space tunnel");
    let mut out_cmd = sites.near.command(example.to_str().unwrap());
    out_cmd
        .args(["--key-file", &key_file(&sites)])
        .args(["--address", "10.77.0.1/24"])
        .args(["--peer", &sites.far_public().to_string()])
        .args(["--endpoint", &format!("192.0.2.2:{FAR_PORT}")])
        .args(["--allowed-ips", "10.77.0.2/32"])
        .arg("http://10.77.0.2:50051")
        .args(["", "tunneld.Demo", "tunneld.Down", "tunneld.Unknown"]);
    let out = output_within(&mut out_cmd, Duration::from_secs(60));
    let _ = stop_tx.send(());
    server.join().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "grpc_health failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout,
        "\"\": Serving\n\"tunneld.Demo\": Serving\n\"tunneld.Down\": NotServing\n\
         \"tunneld.Unknown\": error: NotFound\n"
    );
}

/// A kernel listener as the stream of connections tonic's server takes.
fn tokio_stream_of(
    listener: tokio::net::TcpListener,
) -> impl futures_core::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    struct Incoming(tokio::net::TcpListener);
    impl futures_core::Stream for Incoming {
        type Item = std::io::Result<tokio::net::TcpStream>;
        fn poll_next(
            self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Self::Item>> {
            self.0.poll_accept(cx).map(|r| Some(r.map(|(s, _)| s)))
        }
    }
    Incoming(listener)
}

/// Runs `cmd` to its end, killing it after `limit` (a failure that shows its output).
fn output_within(cmd: &mut std::process::Command, limit: Duration) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    let mut child = cmd
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            tunneld_testnet::stop_process(&mut child);
            panic!(
                "{cmd:?} did not finish in {limit:?}: {}{}",
                std::fs::read_to_string(&out).unwrap_or_default(),
                std::fs::read_to_string(&err).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    std::process::Output {
        status,
        stdout: std::fs::read(&out).unwrap(),
        stderr: std::fs::read(&err).unwrap(),
    }
}
