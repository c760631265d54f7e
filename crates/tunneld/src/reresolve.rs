//! Endpoints given as host names, looked up again (what wg-quick users run
//! `reresolve-dns.sh` from cron for). When a handshake with such a peer goes unanswered
//! ([`Event::HandshakeFailed`]: 5 s after an initiation, once per attempt), its name is
//! resolved again; an answer is kept for its TTL, so a name is asked at most once per TTL.
//! If the address the peer's datagrams go to is not among the answer's, they go to the new
//! one from then on and a handshake starts there at once. A peer that roamed to another
//! port of an address the name still has is left where it is.
//!
//! A thread of its own, started with the gateway's first such peer (`Gateway` does that at
//! start and after a reload); it ends with the gateway's events. The lookups go through
//! hickory's resolver with the system's settings (`/etc/resolv.conf`, `/etc/hosts`), the
//! one resolver here that reports TTLs; without those settings, through the C library's
//! resolver, whose answers are kept [`WITHOUT_TTL`].

use crate::control::{lock, ControlHandle};
use crate::events::GatewayEvents;
use hickory_resolver::config::LookupIpStrategy;
use hickory_resolver::TokioResolver;
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};
use tunneld_wireguard::event::Event;

/// How long an answer of the C library's resolver (which gives no TTL) is kept.
pub(crate) const WITHOUT_TTL: Duration = Duration::from_secs(30);

/// Starts the thread that follows `control`'s host-name endpoints, on `events`.
pub(crate) fn start(control: ControlHandle, events: GatewayEvents) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("tunneld-dns".into())
        .spawn(move || run(&control, events))?;
    Ok(())
}

fn run(control: &ControlHandle, events: GatewayEvents) {
    let mut names = match Names::new() {
        Ok(names) => names,
        Err(e) => {
            tracing::error!(
                "dns: cannot start the resolver ({e}); host-name endpoints are not looked up again"
            );
            return;
        }
    };
    for event in events {
        let Event::HandshakeFailed { peer, waited } = event else {
            continue;
        };
        let (host, current) = {
            let control = lock(control);
            let Some(host) = control.host_endpoint(&peer) else {
                continue;
            };
            (host, control.current_endpoint(peer))
        };
        // Looked up without the control lock: other writers do not wait for DNS.
        let addrs = match names.lookup(&host.host) {
            Ok(addrs) => {
                names.failing.remove(&host.host);
                addrs
            }
            Err(e) => {
                if names.failing.insert(host.host.clone()) {
                    tracing::warn!(
                        peer = %peer,
                        "dns: cannot look {} up again: {e}; the peer's endpoint stays {}",
                        host.host,
                        shown(current)
                    );
                }
                continue;
            }
        };
        let Some(ip) = moved_to(&addrs, current) else {
            tracing::debug!(
                peer = %peer,
                "dns: no handshake for {waited:?}; {} still has {}",
                host.host,
                shown(current)
            );
            continue;
        };
        let endpoint = SocketAddr::new(ip, host.port);
        if lock(control).follow_resolved(peer, endpoint) {
            tracing::info!(
                peer = %peer,
                "dns: no handshake for {waited:?} and {} now resolves to {ip} (was {}); handshaking with {endpoint}",
                host.host,
                shown(current)
            );
        }
    }
}

/// The same rule for a proxy's user-space tunnel: `hosts` are the peers whose endpoint was
/// given as a name. The thread ends when the tunnel stops.
#[cfg(feature = "proxy")]
pub(crate) fn start_for_tunnel(
    tunnel: tunneld_userspace::Tunnel,
    hosts: HashMap<tunneld_crypto::PublicKey, (String, u16)>,
) -> std::io::Result<()> {
    let mut events = tunnel.events();
    std::thread::Builder::new()
        .name("tunneld-dns".into())
        .spawn(move || {
            let mut names = match Names::new() {
                Ok(names) => names,
                Err(e) => {
                    tracing::error!("dns: cannot start the resolver ({e}); host-name endpoints are not looked up again");
                    return;
                }
            };
            while let Some(event) = names.runtime.block_on(events.recv()) {
                let Event::HandshakeFailed { peer, waited } = event else {
                    continue;
                };
                let Some((host, port)) = hosts.get(&peer) else {
                    continue;
                };
                let current = names
                    .runtime
                    .block_on(tunnel.peers())
                    .ok()
                    .and_then(|peers| peers.into_iter().find(|p| p.public_key == peer))
                    .and_then(|p| p.endpoint);
                let addrs = match names.lookup(host) {
                    Ok(addrs) => {
                        names.failing.remove(host);
                        addrs
                    }
                    Err(e) => {
                        if names.failing.insert(host.clone()) {
                            tracing::warn!(peer = %peer, "dns: cannot look {host} up again: {e}; the peer's endpoint stays {}", shown(current));
                        }
                        continue;
                    }
                };
                let Some(ip) = moved_to(&addrs, current) else {
                    continue;
                };
                let endpoint = SocketAddr::new(ip, *port);
                let change = tunneld_userspace::PeerChange::new(peer).endpoint(endpoint);
                if names.runtime.block_on(tunnel.update_peer(change)).is_ok() {
                    tracing::info!(peer = %peer, "dns: no handshake for {waited:?} and {host} now resolves to {ip} (was {}); handshaking with {endpoint}", shown(current));
                }
            }
        })?;
    Ok(())
}

fn shown(endpoint: Option<SocketAddr>) -> String {
    endpoint.map_or_else(|| "none".into(), |e| e.to_string())
}

/// The address a peer at `current` should move to, given a name's answer: none while the
/// answer still has its address (whatever the port: a peer behind NAT roams between
/// ports); else the answer's first of the same family, or its first.
pub(crate) fn moved_to(answer: &[IpAddr], current: Option<SocketAddr>) -> Option<IpAddr> {
    let Some(current) = current else {
        return answer.first().copied();
    };
    let ip = current.ip().to_canonical();
    if answer.iter().any(|a| a.to_canonical() == ip) {
        return None;
    }
    answer
        .iter()
        .find(|a| a.is_ipv4() == ip.is_ipv4())
        .or(answer.first())
        .copied()
}

struct Answer {
    addrs: Vec<IpAddr>,
    valid_until: Instant,
}

/// Name lookups and the answers still within their TTL.
struct Names {
    runtime: tokio::runtime::Runtime,
    /// `None` when the system's resolver settings could not be read.
    resolver: Option<TokioResolver>,
    answers: HashMap<String, Answer>,
    /// Names whose last lookup failed (said once until one succeeds).
    failing: HashSet<String>,
}

impl Names {
    fn new() -> std::io::Result<Names> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let resolver = match TokioResolver::builder_tokio() {
            Ok(mut builder) => {
                // Both families, so a peer reached over IPv6 is compared with the name's
                // IPv6 addresses (the default asks for IPv6 only when there is no IPv4).
                builder.options_mut().ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
                Some(builder.build())
            }
            Err(e) => {
                tracing::warn!(
                    "dns: cannot read the system's resolver settings ({e}); host names are looked up again through the C library, each answer kept {WITHOUT_TTL:?}"
                );
                None
            }
        };
        Ok(Names {
            runtime,
            resolver,
            answers: HashMap::new(),
            failing: HashSet::new(),
        })
    }

    /// `name`'s addresses: the last answer while its TTL runs, else a new one.
    fn lookup(&mut self, name: &str) -> Result<Vec<IpAddr>, String> {
        let now = Instant::now();
        if let Some(answer) = self.answers.get(name).filter(|a| a.valid_until > now) {
            return Ok(answer.addrs.clone());
        }
        let answer = match &self.resolver {
            Some(resolver) => {
                let found = self
                    .runtime
                    .block_on(resolver.lookup_ip(name))
                    .map_err(|e| e.to_string())?;
                Answer {
                    addrs: found.iter().collect(),
                    valid_until: found.valid_until(),
                }
            }
            None => Answer {
                addrs: (name, 0)
                    .to_socket_addrs()
                    .map_err(|e| e.to_string())?
                    .map(|a| a.ip())
                    .collect(),
                valid_until: now + WITHOUT_TTL,
            },
        };
        if answer.addrs.is_empty() {
            return Err("no address found".into());
        }
        let addrs = answer.addrs.clone();
        self.answers.insert(name.to_string(), answer);
        Ok(addrs)
    }
}

#[cfg(test)]
mod tests {
    use super::moved_to;
    use std::net::{IpAddr, SocketAddr};

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|a| a.parse().unwrap()).collect()
    }

    fn at(addr: &str) -> Option<SocketAddr> {
        Some(addr.parse().unwrap())
    }

    #[test]
    fn a_peer_stays_while_the_answer_has_its_address_whatever_the_port() {
        let answer = ips(&["192.0.2.9", "192.0.2.2"]);
        assert_eq!(moved_to(&answer, at("192.0.2.2:51820")), None);
        assert_eq!(moved_to(&answer, at("192.0.2.2:40000")), None);
        assert_eq!(moved_to(&answer, at("[::ffff:192.0.2.2]:51820")), None);
    }

    #[test]
    fn a_peer_moves_to_the_answers_first_address_of_its_family() {
        let answer = ips(&["2001:db8::3", "192.0.2.3", "192.0.2.4"]);
        assert_eq!(
            moved_to(&answer, at("192.0.2.2:51820")),
            Some("192.0.2.3".parse().unwrap())
        );
        assert_eq!(
            moved_to(&answer, at("[2001:db8::2]:51820")),
            Some("2001:db8::3".parse().unwrap())
        );
        let only_v6 = ips(&["2001:db8::3"]);
        assert_eq!(
            moved_to(&only_v6, at("192.0.2.2:51820")),
            Some("2001:db8::3".parse().unwrap())
        );
        assert_eq!(
            moved_to(&answer, None),
            Some("2001:db8::3".parse().unwrap())
        );
        assert_eq!(moved_to(&[], at("192.0.2.2:51820")), None);
    }
}
