//! A measurement, not a test: bulk TCP through the user-space tunnel and a tunneld gateway
//! in namespaces, each way, with the engine thread's CPU time (the download direction, and
//! the engine thread alone, which `cargo xtask bench-embedded`'s tunneld-userspace row does
//! not give). Needs root; run it in release, with a release `tunneld` beside it:
//!
//! ```text
//! cargo build --release -p tunneld-cli
//! TUNNELD_BULK_MIB=1024 cargo run --release -p tunneld-userspace --example bulk_throughput
//! ```
//!
//! That every byte arrives intact both ways is a test (`tests/gateway.rs`, echoed streams).

#[path = "../tests/common/mod.rs"]
mod common;

use common::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Nanoseconds on CPU of this process's threads named `name` (all of them with `None`), from
/// `/proc/self/task/*/schedstat`.
fn cpu_ns(name: Option<&str>) -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|task| {
            name.is_none_or(|name| {
                std::fs::read_to_string(task.path().join("comm"))
                    // The kernel keeps 15 bytes of a thread's name.
                    .is_ok_and(|comm| comm.trim_end() == &name[..name.len().min(15)])
            })
        })
        .filter_map(|task| {
            let stat = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
            stat.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

/// The far side: on :5001 a sink that reads to EOF and answers with the byte count; on
/// :5002 a source that sends `bytes` and closes. One connection each.
fn far_servers(sites: &Sites, bytes: usize) -> std::thread::JoinHandle<()> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let thread = sites.far.spawn_in_ns(move || {
        let sink = TcpListener::bind("10.77.0.2:5001").unwrap();
        let source = TcpListener::bind("10.77.0.2:5002").unwrap();
        ready_tx.send(()).unwrap();
        let (mut s, _) = sink.accept().unwrap();
        let mut buf = vec![0u8; 256 << 10];
        let mut total = 0u64;
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => total += n as u64,
                Err(e) => panic!("far sink: {e}"),
            }
        }
        s.write_all(&total.to_be_bytes()).unwrap();
        drop(s);
        let (mut s, _) = source.accept().unwrap();
        let data = pattern(256 << 10, 5);
        let mut left = bytes;
        while left > 0 {
            let n = left.min(data.len());
            s.write_all(&data[..n]).unwrap();
            left -= n;
        }
    });
    ready_rx.recv_timeout(WAIT).unwrap();
    thread
}

fn report(what: &str, bytes: usize, elapsed: Duration, engine_ns: u64, process_ns: u64) {
    let secs = elapsed.as_secs_f64();
    println!(
        "{what}: {} MiB in {secs:.2} s = {:.2} Gbit/s; engine thread {:.2} CPU s, process {:.2} CPU s",
        bytes >> 20,
        bytes as f64 * 8.0 / secs / 1e9,
        engine_ns as f64 / 1e9,
        process_ns as f64 / 1e9,
    );
}

fn main() {
    if let Some(why) = tunneld_testnet::netns_unusable() {
        eprintln!("bulk_throughput: network namespaces are not usable: {why}");
        std::process::exit(2);
    }
    let Some(tunneld) = tunneld_binary("bulk_throughput") else {
        std::process::exit(2);
    };
    let bytes = std::env::var("TUNNELD_BULK_MIB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1024)
        << 20;
    let mut sites = sites();
    sites.start_tunneld(&tunneld);
    let servers = far_servers(&sites, bytes);
    let tunnel = sites.start_tunnel(sites.settings(0));
    runtime().block_on(async {
        let data = pattern(256 << 10, 7);

        let (e0, p0, t0) = (
            cpu_ns(Some("tunneld-userspace")),
            cpu_ns(None),
            Instant::now(),
        );
        let target: SocketAddr = "10.77.0.2:5001".parse().unwrap();
        let mut s = tunnel.tcp_connect(target).await.unwrap();
        let mut left = bytes;
        while left > 0 {
            let n = left.min(data.len());
            s.write_all(&data[..n]).await.unwrap();
            left -= n;
        }
        s.shutdown().await.unwrap();
        let mut count = [0u8; 8];
        s.read_exact(&mut count).await.unwrap();
        assert_eq!(
            u64::from_be_bytes(count),
            bytes as u64,
            "bytes the far side got"
        );
        report(
            "upload",
            bytes,
            t0.elapsed(),
            cpu_ns(Some("tunneld-userspace")).saturating_sub(e0),
            cpu_ns(None).saturating_sub(p0),
        );

        let (e0, p0, t0) = (
            cpu_ns(Some("tunneld-userspace")),
            cpu_ns(None),
            Instant::now(),
        );
        let target: SocketAddr = "10.77.0.2:5002".parse().unwrap();
        let mut s = tunnel.tcp_connect(target).await.unwrap();
        let mut buf = vec![0u8; 256 << 10];
        let mut total = 0usize;
        loop {
            match s.read(&mut buf).await.unwrap() {
                0 => break,
                n => total += n,
            }
        }
        assert_eq!(total, bytes, "bytes from the far side");
        report(
            "download",
            bytes,
            t0.elapsed(),
            cpu_ns(Some("tunneld-userspace")).saturating_sub(e0),
            cpu_ns(None).saturating_sub(p0),
        );
    });
    servers.join().unwrap();
    tunnel.shutdown();
}
