//! The HTTP proxy: `CONNECT host:port` (200, then the connection's bytes both ways), and
//! requests with an absolute URI (`GET http://host:port/path HTTP/1.1`), sent on in origin
//! form without the hop-by-hop headers. One request per connection: the request goes
//! upstream with `Connection: close`, the answer comes back as the server sends it, and the
//! connection then ends (clients open a new one, as they do after `Connection: close`).
//! With a users file, `Proxy-Authorization: Basic` is required (407 otherwise).

use super::{relay::relay, ConnectError, Shared};
use base64::Engine as _;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tunneld_config::Endpoint;

/// The most a request's head (request line and headers) may be.
pub(super) const MAX_HEAD: usize = 16 * 1024;

/// Headers that concern one connection, not the request (RFC 9110, section 7.6.1), and the
/// proxy's own; `Transfer-Encoding` stays, as the body is passed on as it comes.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
];

enum HeadError {
    /// The client closed before the end of the head.
    Closed,
    TooLarge,
    Io(io::Error),
}

/// A parsed request head.
struct Head<'a> {
    method: &'a str,
    target: &'a str,
    version: &'a str,
    headers: Vec<(&'a str, &'a str)>,
}

pub(super) async fn serve(shared: Arc<Shared>, mut stream: TcpStream, from: SocketAddr) {
    let read = tokio::time::timeout(shared.handshake_timeout, read_head(&mut stream)).await;
    let (head, rest) = match read {
        Ok(Ok(read)) => read,
        Ok(Err(HeadError::TooLarge)) => {
            tracing::debug!("http {from}: request head over {MAX_HEAD} bytes");
            return respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                &format!("the request head is over {MAX_HEAD} bytes\n"),
            )
            .await;
        }
        Ok(Err(HeadError::Closed)) => return,
        Ok(Err(HeadError::Io(e))) => {
            tracing::debug!("http {from}: {e}");
            return;
        }
        Err(_) => {
            tracing::debug!(
                "http {from}: no request within {:?}; closed",
                shared.handshake_timeout
            );
            return respond(&mut stream, "408 Request Timeout", "").await;
        }
    };
    let Some(text) = std::str::from_utf8(&head).ok() else {
        return respond(
            &mut stream,
            "400 Bad Request",
            "the request head is not text\n",
        )
        .await;
    };
    let Some(request) = parse_head(text) else {
        tracing::debug!("http {from}: malformed request");
        return respond(&mut stream, "400 Bad Request", "malformed request\n").await;
    };
    if shared.needs_auth() && !authorized(&shared, &request) {
        return respond_with(
            &mut stream,
            "407 Proxy Authentication Required",
            "Proxy-Authenticate: Basic realm=\"tunneld\"\r\n",
            "proxy authentication required\n",
        )
        .await;
    }
    if request.method == "CONNECT" {
        return connect(&shared, stream, from, &request, rest).await;
    }
    let Some(uri) = absolute_http(request.target) else {
        let why = if request.target.starts_with('/') || request.target == "*" {
            "this is a proxy: send an absolute URI (http://host/path) or CONNECT host:port\n"
        } else {
            "only http:// URIs are forwarded (use CONNECT for https)\n"
        };
        return respond(&mut stream, "400 Bad Request", why).await;
    };
    forward(&shared, stream, from, &request, &uri, rest).await;
}

/// Reads up to the end of the head (an empty line); returns the head and the bytes after it.
async fn read_head(stream: &mut TcpStream) -> Result<(Vec<u8>, Vec<u8>), HeadError> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        let n = stream.read(&mut chunk).await.map_err(HeadError::Io)?;
        if n == 0 {
            return Err(HeadError::Closed);
        }
        let searched_from = buf.len().saturating_sub(3);
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
        if let Some(at) = find_end(buf.get(searched_from..).unwrap_or_default()) {
            let end = searched_from + at;
            if end > MAX_HEAD {
                return Err(HeadError::TooLarge);
            }
            let rest = buf.split_off(end);
            return Ok((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(HeadError::TooLarge);
        }
    }
}

/// Where the head ends (just after `\r\n\r\n`) in `bytes`.
fn find_end(bytes: &[u8]) -> Option<usize> {
    bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4)
}

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn parse_head(text: &str) -> Option<Head<'_>> {
    let mut lines = text.split("\r\n");
    let mut words = lines.next()?.split(' ');
    let (method, target, version) = (words.next()?, words.next()?, words.next()?);
    if words.next().is_some()
        || !is_token(method)
        || target.is_empty()
        || !matches!(version, "HTTP/1.0" | "HTTP/1.1")
    {
        return None;
    }
    let mut headers = Vec::new();
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':')?;
        if !is_token(name) {
            return None;
        }
        headers.push((name, value.trim()));
    }
    Some(Head {
        method,
        target,
        version,
        headers,
    })
}

fn authorized(shared: &Shared, request: &Head<'_>) -> bool {
    request
        .headers
        .iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case("proxy-authorization"))
        .any(|(_, value)| {
            let Some((scheme, encoded)) = value.split_once(' ') else {
                return false;
            };
            if !scheme.eq_ignore_ascii_case("basic") {
                return false;
            }
            let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim())
            else {
                return false;
            };
            let decoded = zeroize::Zeroizing::new(decoded);
            match decoded.iter().position(|b| *b == b':') {
                Some(at) => shared.authenticates(
                    decoded.get(..at).unwrap_or_default(),
                    decoded.get(at + 1..).unwrap_or_default(),
                ),
                None => false,
            }
        })
}

/// `host:port` (an authority, as CONNECT and URIs write it).
fn authority(text: &str, default_port: Option<u16>) -> Option<Endpoint> {
    let with_port = match default_port {
        Some(port) if !text.ends_with(']') && !text.contains(':') => format!("{text}:{port}"),
        Some(port) if text.starts_with('[') && text.ends_with(']') => format!("{text}:{port}"),
        _ => text.to_string(),
    };
    with_port.parse::<Endpoint>().ok()
}

/// An `http://authority/path` URI: where to connect, and the path to ask for.
struct Uri {
    to: Endpoint,
    /// As written, for the Host header.
    authority: String,
    path: String,
}

fn absolute_http(target: &str) -> Option<Uri> {
    let scheme_end = target.find("://")?;
    if !target.get(..scheme_end)?.eq_ignore_ascii_case("http") {
        return None;
    }
    let rest = target.get(scheme_end + 3..)?;
    let (authority_text, path) = match rest.find(['/', '?']) {
        Some(at) => (rest.get(..at)?, rest.get(at..)?),
        None => (rest, "/"),
    };
    // User information in a URI (`http://user@host/`) is not passed on.
    let authority_text = authority_text
        .rsplit_once('@')
        .map_or(authority_text, |(_, host)| host);
    let to = authority(authority_text, Some(80))?;
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    Some(Uri {
        to,
        authority: authority_text.to_string(),
        path,
    })
}

async fn connect_to(
    shared: &Shared,
    to: &Endpoint,
) -> Result<tunneld_userspace::TcpStream, ConnectError> {
    match to {
        Endpoint::Addr(addr) => shared.connect_any(&[*addr]).await,
        Endpoint::Host { host, port } => shared.connect(host, *port).await,
    }
}

/// The status for a destination that could not be reached.
fn failure_status(e: &ConnectError) -> &'static str {
    match e {
        ConnectError::Connect(e) if e.kind() == io::ErrorKind::TimedOut => "504 Gateway Timeout",
        _ => "502 Bad Gateway",
    }
}

async fn connect(
    shared: &Shared,
    mut stream: TcpStream,
    from: SocketAddr,
    request: &Head<'_>,
    rest: Vec<u8>,
) {
    let Some(to) = authority(request.target, None) else {
        return respond(&mut stream, "400 Bad Request", "CONNECT takes host:port\n").await;
    };
    let mut tunnel = match connect_to(shared, &to).await {
        Ok(tunnel) => tunnel,
        Err(e) => {
            tracing::debug!("http {from}: CONNECT {to}: {e}");
            return respond(&mut stream, failure_status(&e), &format!("{to}: {e}\n")).await;
        }
    };
    let established = format!("{} 200 Connection established\r\n\r\n", request.version);
    if stream.write_all(established.as_bytes()).await.is_err() {
        return;
    }
    // Bytes the client sent right behind its request (a TLS ClientHello) go first.
    if !rest.is_empty() && tunnel.write_all(&rest).await.is_err() {
        return;
    }
    relay(stream, tunnel, &shared.counters).await;
}

async fn forward(
    shared: &Shared,
    mut stream: TcpStream,
    from: SocketAddr,
    request: &Head<'_>,
    uri: &Uri,
    rest: Vec<u8>,
) {
    let mut tunnel = match connect_to(shared, &uri.to).await {
        Ok(tunnel) => tunnel,
        Err(e) => {
            tracing::debug!("http {from}: {} {}: {e}", request.method, uri.to);
            let status = failure_status(&e);
            return respond(&mut stream, status, &format!("{}: {e}\n", uri.to)).await;
        }
    };
    // Headers the Connection header names are this hop's too.
    let named: Vec<String> = request
        .headers
        .iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case("connection"))
        .flat_map(|(_, value)| value.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .collect();
    let mut upstream = format!("{} {} {}\r\n", request.method, uri.path, request.version);
    let mut has_host = false;
    for (name, value) in &request.headers {
        let lower = name.to_ascii_lowercase();
        if HOP_BY_HOP.contains(&lower.as_str()) || named.contains(&lower) {
            continue;
        }
        has_host |= lower == "host";
        upstream.push_str(&format!("{name}: {value}\r\n"));
    }
    if !has_host {
        upstream.push_str(&format!("Host: {}\r\n", uri.authority));
    }
    upstream.push_str("Connection: close\r\n\r\n");
    if tunnel.write_all(upstream.as_bytes()).await.is_err()
        || (!rest.is_empty() && tunnel.write_all(&rest).await.is_err())
    {
        return respond(&mut stream, "502 Bad Gateway", "the server closed\n").await;
    }
    relay(stream, tunnel, &shared.counters).await;
}

async fn respond(stream: &mut TcpStream, status: &str, body: &str) {
    respond_with(stream, status, "", body).await;
}

/// An answer of the proxy's own; the connection then closes.
async fn respond_with(stream: &mut TcpStream, status: &str, headers: &str, body: &str) {
    let reply = format!(
        "HTTP/1.1 {status}\r\n{headers}Content-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(reply.as_bytes()).await;
    let _ = stream.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_heads_are_parsed_or_refused() {
        let head = parse_head("GET http://web.corp/x?y HTTP/1.1\r\nHost: web.corp\r\nProxy-Connection: keep-alive\r\n\r\n").unwrap();
        assert_eq!((head.method, head.version), ("GET", "HTTP/1.1"));
        assert_eq!(head.headers.len(), 2);
        for bad in [
            "GET\r\n\r\n",
            "GET /x\r\n\r\n",
            "GET /x HTTP/2\r\n\r\n",
            "G(T /x HTTP/1.1\r\n\r\n",
            "GET /x HTTP/1.1 extra\r\n\r\n",
            "GET /x HTTP/1.1\r\nno colon\r\n\r\n",
            "GET /x HTTP/1.1\r\nbad name: v\r\n\r\n",
        ] {
            assert!(parse_head(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn absolute_uris_give_the_destination_and_the_path() {
        let uri = absolute_http("http://web.corp:8080/a/b?c").unwrap();
        assert_eq!(uri.to.to_string(), "web.corp:8080");
        assert_eq!(uri.path, "/a/b?c");
        let uri = absolute_http("HTTP://10.20.0.1").unwrap();
        assert_eq!(uri.to.to_string(), "10.20.0.1:80");
        assert_eq!(uri.path, "/");
        assert_eq!(
            absolute_http("http://[fd77::1]/").unwrap().to.to_string(),
            "[fd77::1]:80"
        );
        assert_eq!(
            absolute_http("http://u:p@web.corp/").unwrap().authority,
            "web.corp"
        );
        assert!(absolute_http("https://web.corp/").is_none());
        assert!(absolute_http("/relative").is_none());
        assert!(absolute_http("http://bad host/").is_none());
        assert!(
            authority("web.corp", None).is_none(),
            "CONNECT needs a port"
        );
        assert_eq!(
            authority("web.corp:443", None).unwrap().to_string(),
            "web.corp:443"
        );
    }
}
