//! `[metrics]` end to end, in network namespaces this test creates: a Prometheus scrape of a
//! running tunneld shows the traffic that crossed it, and requests that are not a scrape get
//! their HTTP error without disturbing the next scrape.

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const METRICS: &str = "127.0.0.1:9586";

/// Sends `request` to the metrics listener (inside the namespace) and returns the reply.
fn http(ns: &tunneld_testnet::NetNs, request: &'static str) -> String {
    ns.in_ns(move || {
        let mut stream = TcpStream::connect(METRICS).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        reply
    })
}

/// The value of the one sample whose series starts with `series`.
fn sample(text: &str, series: &str) -> u64 {
    let line = text
        .lines()
        .find(|l| l.starts_with(series))
        .unwrap_or_else(|| panic!("no {series} in\n{text}"));
    line.rsplit_once(' ').unwrap().1.parse().unwrap()
}

#[test]
fn a_scrape_shows_the_traffic_and_other_requests_get_http_errors() {
    if !require_netns_and_wg("a_scrape_shows_the_traffic_and_other_requests_get_http_errors") {
        return;
    }
    let sites = tunneld_sites(&format!("\n[metrics]\nlisten = \"{METRICS}\"\n"));
    ping(&sites.a, "10.77.0.2");
    let (ib, peer_a) = (sites.gb.ifname.clone(), sites.ga.public_key.clone());

    step("GET /metrics");
    let reply = http(
        &sites.b,
        "GET /metrics HTTP/1.1\r\nHost: tunneld\r\nAccept: */*\r\n\r\n",
    );
    assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
    assert!(reply.contains("Content-Type: text/plain; version=0.0.4"));
    let body = reply.split_once("\r\n\r\n").unwrap().1;
    let at = format!("{{interface=\"{ib}\"");
    assert_eq!(sample(body, &format!("tunneld_peers{at}}}")), 1);
    let received = sample(
        body,
        &format!("tunneld_worker_packets_total{at},worker=\"0\",direction=\"received\"}}"),
    );
    assert!(received >= 3, "the pings were received: {received}");
    let peer = format!("{at},peer=\"{peer_a}\"}}");
    assert!(sample(body, &format!("tunneld_peer_received_bytes_total{peer}")) > 0);
    assert!(sample(body, &format!("tunneld_peer_last_handshake_seconds{peer}")) > 1_600_000_000);
    assert_eq!(
        sample(
            body,
            &format!("tunneld_worker_drops_total{at},worker=\"0\",reason=\"decrypt_failed\"}}")
        ),
        0
    );

    step("the scrape, taken under traffic, passes Prometheus's own checker");
    if require_tool(
        "a_scrape_shows_the_traffic_and_other_requests_get_http_errors",
        "promtool",
    ) {
        tcp_transfer(
            &sites.a,
            &sites.b,
            "10.77.0.2:5401".parse().unwrap(),
            1 << 20,
        );
        let reply = http(
            &sites.b,
            "GET /metrics HTTP/1.1\r\nHost: tunneld\r\nAccept: */*\r\n\r\n",
        );
        let body = reply.split_once("\r\n\r\n").unwrap().1.to_string();
        promtool_checks(&body);
    }

    step("what is not a scrape gets its HTTP error");
    let head = http(&sites.b, "HEAD /metrics HTTP/1.1\r\n\r\n");
    assert!(
        head.starts_with("HTTP/1.1 200 OK\r\n") && head.ends_with("\r\n\r\n"),
        "{head}"
    );
    let other = http(&sites.b, "GET / HTTP/1.1\r\n\r\n");
    assert!(other.starts_with("HTTP/1.1 404 "), "{other}");
    let post = http(
        &sites.b,
        "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    );
    assert!(post.starts_with("HTTP/1.1 405 "), "{post}");
    let garbage = http(&sites.b, "\u{1}\u{2} hello there\r\n\r\n");
    assert!(garbage.starts_with("HTTP/1.1 400 "), "{garbage}");

    step("a client that sends nothing only delays the next scrape");
    let idle = sites.b.in_ns(|| TcpStream::connect(METRICS).unwrap());
    let reply = http(&sites.b, "GET /metrics HTTP/1.0\r\n\r\n");
    assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
    drop(idle);
    assert!(sites
        .gb
        .log_text()
        .contains("metrics: serving GET /metrics"));
}
