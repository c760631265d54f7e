//! `[metrics]`: the interface's and the TLS sections' counters for Prometheus, as `GET /metrics`
//! in its text format.
//!
//! One thread answers one connection at a time, with short timeouts and a bounded request:
//! that is all a scraper needs, and a slow or hostile client can only delay the next scrape
//! by the timeout. (An HTTP server crate would bring a thread pool that grows with idle
//! connections, for one fixed request.) The counters are read from every worker between its
//! batches, as `tunneld show` reads them; nothing on the data path waits for a scrape. The
//! TLS counters are atomics that the connections add to.

use crate::front_end::FrontEndSlot;
use anyhow::Context;
use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tunneld_dataplane::worker::Workers;
use tunneld_tls::{ListenerStats, TlsStats};
use tunneld_wireguard::uapi::{DeviceSnapshot, WorkerStats};
use tunneld_wireguard::DropReason;

/// The longest a client may take to send its request or read the reply.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);
/// A request (line and headers) longer than this is refused.
const MAX_REQUEST: usize = 8 * 1024;

/// The bound listener, before serving (bound while tunneld still has its privileges).
pub struct MetricsServer {
    listener: TcpListener,
}

impl MetricsServer {
    /// The address it listens on.
    #[cfg(feature = "proxy")]
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn bind(addr: SocketAddr) -> anyhow::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)
            .with_context(|| format!("metrics.listen: cannot listen on {addr}"))?;
        Ok(MetricsServer { listener })
    }

    /// Serves `GET /metrics` for the WireGuard interface (its name and workers) and the TLS
    /// sections, whichever the config has, on a thread of its own, until the returned
    /// guard is dropped.
    pub fn serve(
        self,
        wireguard: Option<(String, Workers)>,
        tls: Option<TlsStats>,
        front_end: Option<FrontEndSlot>,
    ) -> anyhow::Result<MetricsServing> {
        self.spawn(Sources {
            wireguard,
            tls,
            front_end,
            body: None,
        })
    }

    /// Serves `GET /metrics` with what `body` renders (`None`: 503, e.g. once stopping), on
    /// a thread of its own, until the returned guard is dropped.
    #[cfg(feature = "proxy")]
    pub fn serve_with(
        self,
        body: impl Fn() -> Option<String> + Send + 'static,
    ) -> anyhow::Result<MetricsServing> {
        self.spawn(Sources {
            wireguard: None,
            tls: None,
            front_end: None,
            body: Some(Box::new(body)),
        })
    }

    fn spawn(self, sources: Sources) -> anyhow::Result<MetricsServing> {
        let listener = self.listener;
        let addr = listener
            .local_addr()
            .context("metrics.listen: no local address")?;
        tracing::info!(%addr, "metrics: serving GET /metrics");
        let stopping = Arc::new(AtomicBool::new(false));
        let serving = MetricsServing {
            addr,
            stopping: stopping.clone(),
        };
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if stopping.load(Ordering::SeqCst) {
                        break;
                    }
                    match stream {
                        Ok(stream) => {
                            if let Err(e) = answer(stream, &sources) {
                                tracing::debug!("metrics client: {e}");
                            }
                        }
                        Err(e) => tracing::debug!("metrics accept: {e}"),
                    }
                }
            })
            .context("cannot start the metrics thread")?;
        Ok(serving)
    }
}

/// Serving `/metrics`; dropping it stops the thread and closes the listener.
#[derive(Debug)]
pub struct MetricsServing {
    addr: SocketAddr,
    stopping: Arc<AtomicBool>,
}

impl Drop for MetricsServing {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        tunneld_tls::wake_listener(self.addr);
    }
}

/// What the metrics are read from.
struct Sources {
    wireguard: Option<(String, Workers)>,
    tls: Option<TlsStats>,
    /// The fleet's counters, once one is attached.
    front_end: Option<FrontEndSlot>,
    /// Another source's whole text (the proxy's).
    body: Option<Box<dyn Fn() -> Option<String> + Send>>,
}

/// Reads one request and answers it; the connection then closes.
fn answer(mut stream: TcpStream, sources: &Sources) -> io::Result<()> {
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        request.extend_from_slice(&buf[..n]);
        if request.len() > MAX_REQUEST {
            return reply(&mut stream, "431 Request Header Fields Too Large", "", true);
        }
    }
    let line = request.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut words = line.split_whitespace();
    let (method, path, version) = (words.next(), words.next(), words.next());
    let Some(("GET" | "HEAD", path)) = method
        .zip(path)
        .filter(|_| version.is_some_and(|v| v.starts_with("HTTP/1.")) && words.next().is_none())
    else {
        return match (method, path) {
            (Some(_), Some("/metrics")) if version.is_some() => reply(
                &mut stream,
                "405 Method Not Allowed\r\nAllow: GET, HEAD",
                "only GET /metrics is served\n",
                true,
            ),
            _ => reply(&mut stream, "400 Bad Request", "", true),
        };
    };
    let with_body = method == Some("GET");
    // Query strings (`?name[]=...`, which some scrapers add) are ignored.
    if path.split('?').next() != Some("/metrics") {
        return reply(
            &mut stream,
            "404 Not Found",
            "only GET /metrics is served\n",
            with_body,
        );
    }
    let mut body = String::new();
    if let Some((interface, workers)) = &sources.wireguard {
        let unix_now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let gathered = workers.run_each(move |device, now| {
            let stats = WorkerStats {
                stats: device.stats().clone(),
                carries: device.carried(),
            };
            (stats, device.snapshot(now, unix_now))
        });
        let Some(parts) = gathered else {
            return reply(&mut stream, "503 Service Unavailable", "", with_body);
        };
        let (stats, snapshots): (Vec<WorkerStats>, Vec<DeviceSnapshot>) = parts.into_iter().unzip();
        body = render(interface, &stats, &DeviceSnapshot::merge(snapshots));
    }
    if let Some(tls) = &sources.tls {
        body.push_str(&render_tls(tls, &tls.relay_loads()));
    }
    let front_end = sources
        .front_end
        .as_ref()
        .and_then(|slot| crate::control::lock(slot).clone());
    if let Some(front_end) = front_end {
        body.push_str(&front_end.metrics());
    }
    if let Some(render) = &sources.body {
        match render() {
            Some(text) => body.push_str(&text),
            None => return reply(&mut stream, "503 Service Unavailable", "", with_body),
        }
    }
    reply(&mut stream, "200 OK", &body, with_body)
}

fn reply(stream: &mut TcpStream, status: &str, body: &str, with_body: bool) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    if with_body {
        stream.write_all(body.as_bytes())?;
    }
    stream.flush()
}

/// The counters in Prometheus's text exposition format: per worker (packets, bytes,
/// handshakes, hand-offs, drops by reason) and per peer (bytes, last handshake).
pub fn render(interface: &str, workers: &[WorkerStats], snapshot: &DeviceSnapshot) -> String {
    let mut out = String::new();
    let mut family =
        |name: &str, kind: &str, help: &str, samples: &mut dyn Iterator<Item = (String, u64)>| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, value) in samples {
                let _ = writeln!(out, "{name}{{interface=\"{interface}\"{labels}}} {value}");
            }
        };
    family(
        "tunneld_peers",
        "gauge",
        "Peers configured on the interface.",
        &mut std::iter::once((String::new(), snapshot.peers.len() as u64)),
    );
    let per_worker = |pick: fn(&WorkerStats) -> [(&'static str, u64); 2], label: &'static str| {
        workers
            .iter()
            .enumerate()
            .flat_map(move |(i, w)| {
                pick(w)
                    .into_iter()
                    .map(move |(which, v)| (format!(",worker=\"{i}\",{label}=\"{which}\""), v))
            })
            .collect::<Vec<_>>()
    };
    family(
        "tunneld_worker_packets_total",
        "counter",
        "Packets a worker encrypted and sent to peers (sent) or authenticated and delivered to the interface (received).",
        &mut per_worker(
            |w| [("sent", w.stats.tx_packets), ("received", w.stats.rx_packets)],
            "direction",
        )
        .into_iter(),
    );
    family(
        "tunneld_worker_bytes_total",
        "counter",
        "Bytes of those packets.",
        &mut per_worker(
            |w| [("sent", w.stats.tx_bytes), ("received", w.stats.rx_bytes)],
            "direction",
        )
        .into_iter(),
    );
    family(
        "tunneld_worker_handoffs_total",
        "counter",
        "Packets a worker handed to the worker carrying their session (out) or took from another (in).",
        &mut per_worker(
            |w| [("out", w.stats.handoffs_out), ("in", w.stats.handoffs_in)],
            "direction",
        )
        .into_iter(),
    );
    family(
        "tunneld_worker_handshake_messages_total",
        "counter",
        "Handshake initiations and cookie replies a worker sent.",
        &mut per_worker(
            |w| {
                [
                    ("initiation", w.stats.handshakes_sent),
                    ("cookie_reply", w.stats.cookie_replies_sent),
                ]
            },
            "kind",
        )
        .into_iter(),
    );
    family(
        "tunneld_worker_drops_total",
        "counter",
        "Packets and datagrams a worker dropped, by reason.",
        &mut workers.iter().enumerate().flat_map(|(i, w)| {
            DropReason::ALL.iter().map(move |r| {
                (
                    format!(",worker=\"{i}\",reason=\"{}\"", r.name()),
                    w.stats.drops(*r),
                )
            })
        }),
    );
    let per_peer = |value: fn(&tunneld_wireguard::uapi::PeerSnapshot) -> u64| {
        snapshot
            .peers
            .iter()
            .map(move |p| (format!(",peer=\"{}\"", p.public_key), value(p)))
            .collect::<Vec<_>>()
    };
    family(
        "tunneld_peer_sent_bytes_total",
        "counter",
        "Bytes of datagrams sent to the peer (as `wg show` counts them).",
        &mut per_peer(|p| p.tx_bytes).into_iter(),
    );
    family(
        "tunneld_peer_received_bytes_total",
        "counter",
        "Bytes of datagrams authenticated from the peer.",
        &mut per_peer(|p| p.rx_bytes).into_iter(),
    );
    family(
        "tunneld_peer_last_handshake_seconds",
        "gauge",
        "When the peer's latest handshake completed, in seconds since the UNIX epoch; 0 if never.",
        &mut per_peer(|p| p.last_handshake.map_or(0, |d| d.as_secs())).into_iter(),
    );
    out
}

/// The TLS sections' counters: per listener (connections, failures, bytes each way) and per
/// relay worker (connections it carries).
pub fn render_tls(tls: &TlsStats, relay_loads: &[usize]) -> String {
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, u64)>| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(out, "{name}{{{labels}}} {value}");
        }
    };
    let per_listener = |value: fn(&ListenerStats) -> u64| {
        tls.listeners
            .iter()
            .map(|(name, s)| (format!("listener=\"{name}\""), value(s)))
            .collect::<Vec<_>>()
    };
    family(
        "tunneld_tls_connections_total",
        "counter",
        "Connections a TLS listener accepted and took on.",
        per_listener(|s| s.accepted.load(Ordering::Relaxed)),
    );
    family(
        "tunneld_tls_open_connections",
        "gauge",
        "Connections of a TLS listener open now.",
        per_listener(|s| s.open.load(Ordering::Relaxed) as u64),
    );
    family(
        "tunneld_tls_failed_connections_total",
        "counter",
        "Connections that ended with an error (handshake, connect, a stream cut short); the log says why.",
        per_listener(|s| s.failed.load(Ordering::Relaxed)),
    );
    family(
        "tunneld_tls_refused_connections_total",
        "counter",
        "Connections closed at once because the listener had its most open.",
        per_listener(|s| s.refused.load(Ordering::Relaxed)),
    );
    family(
        "tunneld_tls_bytes_total",
        "counter",
        "Plaintext bytes forwarded into TLS (to_tls) and out of it (from_tls).",
        tls.listeners
            .iter()
            .flat_map(|(name, s)| {
                [
                    ("to_tls", s.to_tls_bytes.load(Ordering::Relaxed)),
                    ("from_tls", s.from_tls_bytes.load(Ordering::Relaxed)),
                ]
                .map(|(dir, v)| (format!("listener=\"{name}\",direction=\"{dir}\""), v))
            })
            .collect(),
    );
    family(
        "tunneld_tls_relay_worker_connections",
        "gauge",
        "Connections a TLS relay worker (one per CPU) carries now.",
        relay_loads
            .iter()
            .enumerate()
            .map(|(i, n)| (format!("worker=\"{i}\""), *n as u64))
            .collect(),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tunneld_crypto::PrivateKey;
    use tunneld_wireguard::uapi::PeerSnapshot;

    #[test]
    fn every_sample_line_is_a_named_labelled_number_and_no_secret_shows() {
        let mut stats = WorkerStats::default();
        stats.stats.tx_packets = 7;
        let psk = tunneld_crypto::PresharedKey::generate();
        let private = PrivateKey::generate();
        let peer = PrivateKey::generate().public_key();
        let snapshot = DeviceSnapshot {
            private_key: Some(private.clone()),
            listen_port: 51820,
            fwmark: 0,
            peers: vec![PeerSnapshot {
                public_key: peer,
                preshared_key: Some(psk.clone()),
                endpoint: None,
                last_handshake: Some(Duration::from_secs(1_700_000_000)),
                tx_bytes: 1000,
                rx_bytes: 2000,
                persistent_keepalive: 0,
                allowed_ips: Vec::new(),
            }],
        };
        let text = render("wg0", &[stats.clone(), stats], &snapshot);
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (series, value) = line.rsplit_once(' ').unwrap();
            assert!(value.parse::<u64>().is_ok(), "{line}");
            let (name, labels) = series.split_once('{').unwrap();
            assert!(
                name.starts_with("tunneld_") && labels.ends_with('}'),
                "{line}"
            );
            assert!(labels.starts_with("interface=\"wg0\""), "{line}");
        }
        assert!(text.contains(
            "tunneld_worker_packets_total{interface=\"wg0\",worker=\"1\",direction=\"sent\"} 7"
        ));
        assert!(text.contains(&format!(
            "tunneld_peer_received_bytes_total{{interface=\"wg0\",peer=\"{peer}\"}} 2000"
        )));
        assert!(text.contains("tunneld_peer_last_handshake_seconds{interface=\"wg0\",peer="));
        assert!(text.contains("reason=\"handoff_full\"} 0"));
        assert!(!text.contains(psk.to_base64().as_str()));
        assert!(!text.contains(private.to_base64().as_str()));
    }

    #[test]
    fn the_tls_counters_are_labelled_by_listener_and_worker() {
        let stats = Arc::new(ListenerStats::default());
        stats.accepted.store(3, Ordering::Relaxed);
        stats.to_tls_bytes.store(4096, Ordering::Relaxed);
        let tls = TlsStats {
            listeners: vec![("tls.forward[0]".into(), stats)],
        };
        let text = render_tls(&tls, &[2, 0]);
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (series, value) = line.rsplit_once(' ').unwrap();
            assert!(value.parse::<u64>().is_ok(), "{line}");
            assert!(
                series.starts_with("tunneld_tls_") && series.ends_with('}'),
                "{line}"
            );
        }
        assert!(text.contains("tunneld_tls_connections_total{listener=\"tls.forward[0]\"} 3"));
        assert!(text.contains(
            "tunneld_tls_bytes_total{listener=\"tls.forward[0]\",direction=\"to_tls\"} 4096"
        ));
        assert!(text.contains("tunneld_tls_relay_worker_connections{worker=\"0\"} 2"));
    }
}
