//! The `http_get` example, run as a user would: an HTTP GET from namespace A through its own
//! user-space tunnel to a server behind a tunneld gateway in namespace B.

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

const BODY: &str = "hello through a tunnel with no TUN\n";

#[test]
fn the_http_get_example_fetches_a_page_behind_a_tunneld_gateway() {
    let test = "the_http_get_example_fetches_a_page_behind_a_tunneld_gateway";
    if !tunneld_testnet::require_netns(test) {
        return;
    }
    let Some(tunneld) = tunneld_binary(test) else {
        return;
    };
    // `cargo test` builds the examples beside the tests' directory.
    let example = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples/http_get");
    assert!(example.is_file(), "{} is missing", example.display());

    let mut sites = sites();
    sites.start_tunneld(&tunneld);

    step("an HTTP server on B's tunnel address, answering one request");
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let server = sites.far.spawn_in_ns(move || {
        let listener = TcpListener::bind("10.77.0.2:8080").unwrap();
        ready_tx.send(()).unwrap();
        let (mut conn, _) = listener.accept().unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut request = Vec::new();
        let mut buf = [0u8; 1024];
        while !request.ends_with(b"\r\n\r\n") {
            let n = conn.read(&mut buf).unwrap();
            assert!(n > 0, "the request ended early");
            request.extend_from_slice(&buf[..n]);
        }
        let reply = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\ncontent-type: text/plain\r\n\r\n{BODY}",
            BODY.len()
        );
        conn.write_all(reply.as_bytes()).unwrap();
        String::from_utf8_lossy(&request).into_owned()
    });
    ready_rx.recv_timeout(Duration::from_secs(10)).unwrap();

    step("http_get in A");
    let key = sites.dir.path().join("near.key");
    std::fs::write(&key, sites.near_key.to_base64().as_bytes()).unwrap();
    let out = sites
        .near
        .command(example.to_str().unwrap())
        .args(["--key-file", key.to_str().unwrap()])
        .args(["--address", "10.77.0.1/24"])
        .args(["--peer", &sites.far_public().to_string()])
        .args(["--endpoint", "192.0.2.2:51820"])
        .args(["--allowed-ips", "10.77.0.0/24"])
        .arg("http://10.77.0.2:8080/hello.txt")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "http_get failed: {stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), BODY);
    assert!(stderr.contains("200 OK"), "{stderr}");
    let request = server.join().unwrap();
    assert!(
        request.starts_with("GET /hello.txt HTTP/1.1\r\n"),
        "{request}"
    );
    assert!(
        request.to_lowercase().contains("host: 10.77.0.2:8080"),
        "{request}"
    );
}
