//! SOCKS5 (RFC 1928): method negotiation (no authentication, or RFC 1929's username and
//! password when the config has a users file), CONNECT and UDP ASSOCIATE; BIND is refused.

use super::{relay::relay, ConnectError, Shared};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

const VERSION: u8 = 5;
const NO_AUTH: u8 = 0;
const USER_PASSWORD: u8 = 2;
const NO_ACCEPTABLE: u8 = 0xff;

const CONNECT: u8 = 1;
const BIND: u8 = 2;
const UDP_ASSOCIATE: u8 = 3;

const ATYP_V4: u8 = 1;
const ATYP_NAME: u8 = 3;
const ATYP_V6: u8 = 4;

// Reply codes (RFC 1928, section 6).
const SUCCEEDED: u8 = 0;
const GENERAL_FAILURE: u8 = 1;
const NETWORK_UNREACHABLE: u8 = 3;
const HOST_UNREACHABLE: u8 = 4;
const CONNECTION_REFUSED: u8 = 5;
const TTL_EXPIRED: u8 = 6;
const COMMAND_NOT_SUPPORTED: u8 = 7;
const ADDRESS_TYPE_NOT_SUPPORTED: u8 = 8;

/// The largest UDP datagram relayed (a SOCKS header and a payload that fits a tunnel MTU).
const MAX_DATAGRAM: usize = 65_535;

/// Where a client asks to go.
#[derive(Debug, Clone)]
pub(super) enum Target {
    Addr(SocketAddr),
    Name(String, u16),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Addr(a) => write!(f, "{a}"),
            Target::Name(n, p) => write!(f, "{n}:{p}"),
        }
    }
}

struct Request {
    command: u8,
    target: Target,
}

/// One client: negotiation within the handshake timeout, then its command.
pub(super) async fn serve(shared: Arc<Shared>, mut stream: TcpStream, from: SocketAddr) {
    let request =
        match tokio::time::timeout(shared.handshake_timeout, negotiate(&shared, &mut stream)).await
        {
            Ok(Ok(request)) => request,
            Ok(Err(why)) => {
                tracing::debug!("socks5 {from}: {why}; closed");
                return;
            }
            Err(_) => {
                tracing::debug!(
                    "socks5 {from}: no request within {:?}; closed",
                    shared.handshake_timeout
                );
                return;
            }
        };
    match request.command {
        CONNECT => connect(&shared, stream, from, &request.target).await,
        UDP_ASSOCIATE => associate(&shared, stream, from, &request.target).await,
        _ => {}
    }
}

/// The greeting, the authentication and the request. Errors say why the connection is
/// closed; the client was sent the reply the RFC has for it, where there is one.
async fn negotiate(shared: &Shared, stream: &mut TcpStream) -> Result<Request, String> {
    let mut head = [0u8; 2];
    read(stream, &mut head).await?;
    let [version, count] = head;
    if version != VERSION {
        return Err(format!("not SOCKS5 (version byte {version})"));
    }
    let mut methods = vec![0u8; usize::from(count)];
    read(stream, &mut methods).await?;
    let wanted = if shared.needs_auth() {
        USER_PASSWORD
    } else {
        NO_AUTH
    };
    if !methods.contains(&wanted) {
        let _ = stream.write_all(&[VERSION, NO_ACCEPTABLE]).await;
        return Err(format!(
            "offers none of the methods this proxy takes ({methods:?}; wanted {wanted})"
        ));
    }
    write(stream, &[VERSION, wanted]).await?;
    if wanted == USER_PASSWORD {
        authenticate(shared, stream).await?;
    }

    let mut head = [0u8; 4];
    read(stream, &mut head).await?;
    let [version, command, _reserved, address_type] = head;
    if version != VERSION {
        return Err(format!("request of version {version}"));
    }
    let target = match read_address(stream, address_type).await? {
        Some(target) => target,
        None => {
            let _ = stream
                .write_all(&reply(ADDRESS_TYPE_NOT_SUPPORTED, None))
                .await;
            return Err(format!("address type {address_type}"));
        }
    };
    match command {
        CONNECT | UDP_ASSOCIATE => Ok(Request { command, target }),
        other => {
            let _ = stream.write_all(&reply(COMMAND_NOT_SUPPORTED, None)).await;
            let what = if other == BIND {
                "BIND"
            } else {
                "an unknown command"
            };
            Err(format!(
                "asks for {what} ({other}), which this proxy does not do"
            ))
        }
    }
}

/// RFC 1929: a wrong user or password gets status 1 and the connection closes.
async fn authenticate(shared: &Shared, stream: &mut TcpStream) -> Result<(), String> {
    let mut byte = [0u8; 1];
    read(stream, &mut byte).await?;
    let version = byte[0];
    read(stream, &mut byte).await?;
    let mut user = vec![0u8; usize::from(byte[0])];
    read(stream, &mut user).await?;
    read(stream, &mut byte).await?;
    let mut password = zeroize::Zeroizing::new(vec![0u8; usize::from(byte[0])]);
    read(stream, &mut password).await?;
    if version != 1 || !shared.authenticates(&user, &password) {
        let _ = stream.write_all(&[1, 1]).await;
        return Err(format!(
            "authentication failed for user {:?}",
            String::from_utf8_lossy(&user)
        ));
    }
    write(stream, &[1, 0]).await
}

/// An address as the RFC writes it (after its type byte); `None` for an unknown type.
async fn read_address(stream: &mut TcpStream, address_type: u8) -> Result<Option<Target>, String> {
    let target = match address_type {
        ATYP_V4 => {
            let mut raw = [0u8; 6];
            read(stream, &mut raw).await?;
            let [a, b, c, d, p0, p1] = raw;
            Target::Addr(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::new(a, b, c, d)),
                u16::from_be_bytes([p0, p1]),
            ))
        }
        ATYP_V6 => {
            let mut ip = [0u8; 16];
            read(stream, &mut ip).await?;
            let mut port = [0u8; 2];
            read(stream, &mut port).await?;
            Target::Addr(SocketAddr::new(
                IpAddr::V6(Ipv6Addr::from(ip)),
                u16::from_be_bytes(port),
            ))
        }
        ATYP_NAME => {
            let mut len = [0u8; 1];
            read(stream, &mut len).await?;
            let mut name = vec![0u8; usize::from(len[0])];
            read(stream, &mut name).await?;
            let mut port = [0u8; 2];
            read(stream, &mut port).await?;
            Target::Name(
                String::from_utf8_lossy(&name).into_owned(),
                u16::from_be_bytes(port),
            )
        }
        _ => return Ok(None),
    };
    Ok(Some(target))
}

async fn read(stream: &mut TcpStream, buf: &mut [u8]) -> Result<(), String> {
    match stream.read_exact(buf).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            Err("closed in the middle of its negotiation".into())
        }
        Err(e) => Err(e.to_string()),
    }
}

async fn write(stream: &mut TcpStream, bytes: &[u8]) -> Result<(), String> {
    stream.write_all(bytes).await.map_err(|e| e.to_string())
}

/// A reply: its code and the bound address (zeros when there is none).
fn reply(code: u8, bound: Option<SocketAddr>) -> Vec<u8> {
    let mut out = vec![VERSION, code, 0];
    put_address(
        &mut out,
        bound.unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0))),
    );
    out
}

fn put_address(out: &mut Vec<u8>, addr: SocketAddr) {
    match addr.ip().to_canonical() {
        IpAddr::V4(ip) => {
            out.push(ATYP_V4);
            out.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            out.push(ATYP_V6);
            out.extend_from_slice(&ip.octets());
        }
    }
    out.extend_from_slice(&addr.port().to_be_bytes());
}

/// The reply code for a connection that could not be made.
fn failure_code(e: &ConnectError) -> u8 {
    match e {
        ConnectError::Resolve(_) => HOST_UNREACHABLE,
        ConnectError::Connect(e) => match e.kind() {
            // No peer is allowed the address: no route into the tunnel for it.
            io::ErrorKind::HostUnreachable | io::ErrorKind::NetworkUnreachable => {
                NETWORK_UNREACHABLE
            }
            io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset => CONNECTION_REFUSED,
            io::ErrorKind::TimedOut => TTL_EXPIRED,
            io::ErrorKind::AddrNotAvailable | io::ErrorKind::InvalidInput => HOST_UNREACHABLE,
            _ => GENERAL_FAILURE,
        },
    }
}

async fn connect(shared: &Shared, mut stream: TcpStream, from: SocketAddr, target: &Target) {
    let connected = match target {
        Target::Addr(addr) => shared.connect_any(&[*addr]).await,
        Target::Name(name, port) => shared.connect(name, *port).await,
    };
    match connected {
        Ok(tunnel) => {
            let bound = tunnel.local_addr().ok();
            if stream.write_all(&reply(SUCCEEDED, bound)).await.is_err() {
                return;
            }
            relay(stream, tunnel, &shared.counters).await;
        }
        Err(e) => {
            tracing::debug!("socks5 {from}: CONNECT {target}: {e}");
            let _ = stream.write_all(&reply(failure_code(&e), None)).await;
        }
    }
}

/// Counts an association open while it lives.
struct Association<'a>(&'a Shared);

impl Drop for Association<'_> {
    fn drop(&mut self) {
        self.0
            .counters
            .udp_associations_active
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// UDP ASSOCIATE: a relay socket of its own on the address the client reached us on, and a
/// UDP socket inside the tunnel; it lives as long as the control connection. Datagrams are
/// taken only from the client's address (and the port it named, if it named one, else the
/// first it sends from); fragments (FRAG != 0) are dropped.
async fn associate(shared: &Shared, mut control: TcpStream, from: SocketAddr, asked: &Target) {
    let local_ip = match control.local_addr() {
        Ok(addr) => addr.ip(),
        Err(_) => return,
    };
    let relay_socket = match UdpSocket::bind(SocketAddr::new(local_ip, 0)).await {
        Ok(socket) => socket,
        Err(e) => {
            tracing::warn!("socks5 {from}: UDP ASSOCIATE: cannot bind a relay socket: {e}");
            let _ = control.write_all(&reply(GENERAL_FAILURE, None)).await;
            return;
        }
    };
    let tunnel_socket = match shared
        .tunnel
        .udp_bind(SocketAddr::from(([0, 0, 0, 0], 0)))
        .await
    {
        Ok(socket) => socket,
        Err(e) => {
            tracing::warn!("socks5 {from}: UDP ASSOCIATE: no socket in the tunnel: {e}");
            let _ = control.write_all(&reply(GENERAL_FAILURE, None)).await;
            return;
        }
    };
    let bound = relay_socket.local_addr().ok();
    if control.write_all(&reply(SUCCEEDED, bound)).await.is_err() {
        return;
    }
    shared
        .counters
        .udp_associations
        .fetch_add(1, Ordering::Relaxed);
    shared
        .counters
        .udp_associations_active
        .fetch_add(1, Ordering::Relaxed);
    let _association = Association(shared);

    let client_ip = from.ip().to_canonical();
    // The port the client said it sends from, if it said one.
    let mut client: Option<SocketAddr> = match asked {
        Target::Addr(addr) if addr.port() != 0 && !addr.ip().is_unspecified() => {
            Some(SocketAddr::new(addr.ip().to_canonical(), addr.port()))
        }
        _ => None,
    };
    let fixed_port = match asked {
        Target::Addr(addr) if addr.port() != 0 => Some(addr.port()),
        _ => None,
    };
    let mut control_buf = [0u8; 64];
    let mut from_client = vec![0u8; MAX_DATAGRAM];
    let mut from_tunnel = vec![0u8; MAX_DATAGRAM];
    loop {
        tokio::select! {
            read = control.read(&mut control_buf) => match read {
                // Bytes on the control connection mean nothing: ignored.
                Ok(n) if n > 0 => {}
                _ => break,
            },
            received = relay_socket.recv_from(&mut from_client) => {
                let Ok((n, source)) = received else { break };
                let source = SocketAddr::new(source.ip().to_canonical(), source.port());
                if source.ip() != client_ip || fixed_port.is_some_and(|p| p != source.port()) {
                    continue;
                }
                match client {
                    Some(known) if known != source => continue,
                    _ => client = Some(source),
                }
                let Some((target, payload)) = parse_datagram(from_client.get(..n).unwrap_or_default()) else {
                    continue;
                };
                let addr = match target {
                    Target::Addr(addr) => addr,
                    Target::Name(name, port) => match shared.resolve(&name, port).await {
                        Ok(addrs) => match addrs.first() {
                            Some(addr) => *addr,
                            None => continue,
                        },
                        Err(e) => {
                            tracing::debug!("socks5 {from}: UDP to {name}: {e}");
                            continue;
                        }
                    },
                };
                match tunnel_socket.send_to(payload, addr).await {
                    Ok(_) => {
                        shared.counters.to_tunnel.fetch_add(payload.len() as u64, Ordering::Relaxed);
                    }
                    Err(e) => tracing::debug!("socks5 {from}: UDP to {addr}: {e}"),
                }
            }
            received = tunnel_socket.recv_from(&mut from_tunnel) => {
                let Ok((n, source)) = received else { break };
                let Some(client) = client else { continue };
                let payload = from_tunnel.get(..n).unwrap_or_default();
                let mut datagram = Vec::with_capacity(n + 22);
                datagram.extend_from_slice(&[0, 0, 0]);
                put_address(&mut datagram, source);
                datagram.extend_from_slice(payload);
                if relay_socket.send_to(&datagram, client).await.is_ok() {
                    shared.counters.from_tunnel.fetch_add(n as u64, Ordering::Relaxed);
                }
            }
        }
    }
    tracing::debug!("socks5 {from}: UDP association ended");
}

/// A client's datagram: RSV (2), FRAG, the address and the payload. `None` for a fragment
/// or a malformed header.
fn parse_datagram(datagram: &[u8]) -> Option<(Target, &[u8])> {
    let (&[_, _, frag, address_type], rest) = datagram.split_first_chunk::<4>()?;
    if frag != 0 {
        return None;
    }
    let (target, rest) = match address_type {
        ATYP_V4 => {
            let (ip, rest) = rest.split_first_chunk::<4>()?;
            let (port, rest) = rest.split_first_chunk::<2>()?;
            (
                Target::Addr(SocketAddr::new(
                    IpAddr::V4(Ipv4Addr::from(*ip)),
                    u16::from_be_bytes(*port),
                )),
                rest,
            )
        }
        ATYP_V6 => {
            let (ip, rest) = rest.split_first_chunk::<16>()?;
            let (port, rest) = rest.split_first_chunk::<2>()?;
            (
                Target::Addr(SocketAddr::new(
                    IpAddr::V6(Ipv6Addr::from(*ip)),
                    u16::from_be_bytes(*port),
                )),
                rest,
            )
        }
        ATYP_NAME => {
            let (&len, rest) = rest.split_first()?;
            let name = rest.get(..usize::from(len))?;
            let rest = rest.get(usize::from(len)..)?;
            let (port, rest) = rest.split_first_chunk::<2>()?;
            let name = std::str::from_utf8(name).ok()?.to_string();
            (Target::Name(name, u16::from_be_bytes(*port)), rest)
        }
        _ => return None,
    };
    Some((target, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagram_headers_are_read_and_fragments_and_junk_dropped() {
        let mut d = vec![0, 0, 0, ATYP_V4, 10, 77, 0, 1, 0, 53];
        d.extend_from_slice(b"query");
        let (target, payload) = parse_datagram(&d).unwrap();
        assert_eq!(target.to_string(), "10.77.0.1:53");
        assert_eq!(payload, b"query");
        let mut name = vec![0, 0, 0, ATYP_NAME, 4];
        name.extend_from_slice(b"ns.x");
        name.extend_from_slice(&[0, 53, 1, 2]);
        let (target, payload) = parse_datagram(&name).unwrap();
        assert_eq!(target.to_string(), "ns.x:53");
        assert_eq!(payload, [1, 2]);
        let mut fragment = d.clone();
        fragment[2] = 1;
        assert!(parse_datagram(&fragment).is_none());
        for cut in 0..10 {
            assert!(parse_datagram(&d[..cut]).is_none(), "{cut}");
        }
        assert!(parse_datagram(&[0, 0, 0, 9, 1, 2, 3]).is_none());
        assert!(parse_datagram(&[0, 0, 0, ATYP_NAME, 200, 1]).is_none());
    }

    #[test]
    fn replies_carry_the_bound_address() {
        assert_eq!(reply(SUCCEEDED, None), [5, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
        let v6 = reply(HOST_UNREACHABLE, Some("[fd77::2]:80".parse().unwrap()));
        assert_eq!(v6.len(), 4 + 16 + 2);
        assert_eq!(&v6[..4], &[5, 4, 0, ATYP_V6]);
    }
}
