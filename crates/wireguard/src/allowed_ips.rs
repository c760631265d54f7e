//! Allowed-IPs routing: longest-prefix match over IPv4 and IPv6 prefixes.
//!
//! The same table answers both questions WireGuard asks: which peer gets an outgoing packet
//! (by destination), and may this peer send us a packet from that source (by source).

use ip_network::{IpNetwork, Ipv4Network, Ipv6Network};
use ip_network_table::IpNetworkTable;
use ipnet::IpNet;
use std::fmt;
use std::net::IpAddr;

/// A longest-prefix-match table from prefixes to values (peer slots in the core).
pub struct AllowedIps<T> {
    table: IpNetworkTable<T>,
    /// The last address looked up by [`AllowedIps::lookup_cached`] and its answer. A site-to-
    /// site tunnel asks about the same address again and again (the destination of what it
    /// sends is the source of what it receives), and the tree walk costs more than the
    /// comparison. Every change to the table clears it.
    last: Option<(IpAddr, Option<T>)>,
}

impl<T> fmt::Debug for AllowedIps<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (v4, v6) = self.table.len();
        write!(f, "AllowedIps({v4} v4, {v6} v6)")
    }
}

impl<T> Default for AllowedIps<T> {
    fn default() -> Self {
        Self {
            table: IpNetworkTable::new(),
            last: None,
        }
    }
}

#[allow(
    clippy::expect_used,
    reason = "an invariant, not input: a truncated prefix is always accepted"
)]
fn to_network(net: IpNet) -> IpNetwork {
    // `trunc` zeroes the host bits, which is all ip_network's constructors refuse.
    match net.trunc() {
        IpNet::V4(n) => IpNetwork::V4(
            Ipv4Network::new(n.network(), n.prefix_len()).expect("truncated prefix is valid"),
        ),
        IpNet::V6(n) => IpNetwork::V6(
            Ipv6Network::new(n.network(), n.prefix_len()).expect("truncated prefix is valid"),
        ),
    }
}

#[allow(
    clippy::expect_used,
    reason = "an invariant, not input: the table only holds valid prefixes"
)]
fn from_network(net: IpNetwork) -> IpNet {
    match net {
        IpNetwork::V4(n) => IpNet::V4(
            ipnet::Ipv4Net::new(n.network_address(), n.netmask()).expect("valid prefix length"),
        ),
        IpNetwork::V6(n) => IpNet::V6(
            ipnet::Ipv6Net::new(n.network_address(), n.netmask()).expect("valid prefix length"),
        ),
    }
}

impl<T> AllowedIps<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Maps `net` (host bits ignored) to `value`, returning the value it replaces.
    pub fn insert(&mut self, net: IpNet, value: T) -> Option<T> {
        self.last = None;
        self.table.insert(to_network(net), value)
    }

    pub fn remove(&mut self, net: IpNet) -> Option<T> {
        self.last = None;
        self.table.remove(to_network(net))
    }

    /// The value of the longest prefix containing `addr`.
    pub fn lookup(&self, addr: IpAddr) -> Option<&T> {
        self.table.longest_match(addr).map(|(_, v)| v)
    }

    /// Like [`AllowedIps::lookup`], answering a repeated address from a one-entry cache.
    pub fn lookup_cached(&mut self, addr: IpAddr) -> Option<T>
    where
        T: Copy,
    {
        match self.last {
            Some((last, answer)) if last == addr => answer,
            _ => {
                let answer = self.lookup(addr).copied();
                self.last = Some((addr, answer));
                answer
            }
        }
    }

    /// The value stored for exactly `net`.
    pub fn get(&self, net: IpNet) -> Option<&T> {
        self.table.exact_match(to_network(net))
    }

    pub fn retain(&mut self, mut keep: impl FnMut(IpNet, &mut T) -> bool) {
        self.last = None;
        self.table.retain(|net, v| keep(from_network(net), v));
    }

    pub fn iter(&self) -> impl Iterator<Item = (IpNet, &T)> {
        self.table.iter().map(|(n, v)| (from_network(n), v))
    }

    pub fn len(&self) -> usize {
        let (v4, v6) = self.table.len();
        v4 + v6
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_cached_answer_follows_every_change() {
        let mut t = AllowedIps::new();
        let a = ip("10.1.2.3");
        assert_eq!(t.lookup_cached(a), None);
        t.insert(net("10.0.0.0/8"), 1);
        assert_eq!(t.lookup_cached(a), Some(1), "after insert");
        assert_eq!(t.lookup_cached(a), Some(1), "cached");
        t.insert(net("10.1.0.0/16"), 2);
        assert_eq!(t.lookup_cached(a), Some(2), "a longer prefix inserted");
        t.retain(|_, v| *v != 2);
        assert_eq!(t.lookup_cached(a), Some(1), "after retain");
        t.remove(net("10.0.0.0/8"));
        assert_eq!(t.lookup_cached(a), None, "after remove");
        t.insert(net("fd00::/8"), 3);
        assert_eq!(t.lookup_cached(ip("fd00::1")), Some(3));
        assert_eq!(t.lookup_cached(a), None, "another address");
    }

    #[test]
    fn longest_prefix_wins_v4_and_v6() {
        let mut t = AllowedIps::new();
        t.insert(net("10.0.0.0/8"), 1);
        t.insert(net("10.1.0.0/16"), 2);
        t.insert(net("10.1.2.3/32"), 3);
        t.insert(net("0.0.0.0/0"), 4);
        t.insert(net("fd00::/8"), 5);
        t.insert(net("fd00:1::/32"), 6);
        assert_eq!(t.lookup(ip("10.1.2.3")), Some(&3));
        assert_eq!(t.lookup(ip("10.1.2.4")), Some(&2));
        assert_eq!(t.lookup(ip("10.2.0.1")), Some(&1));
        assert_eq!(t.lookup(ip("192.0.2.1")), Some(&4));
        assert_eq!(t.lookup(ip("fd00:1::9")), Some(&6));
        assert_eq!(t.lookup(ip("fd01::9")), Some(&5));
        assert_eq!(t.lookup(ip("2001:db8::1")), None);
    }

    #[test]
    fn host_bits_are_ignored_and_remove_works() {
        let mut t = AllowedIps::new();
        assert_eq!(t.insert(net("10.1.2.3/24"), 1), None);
        assert_eq!(t.get(net("10.1.2.0/24")), Some(&1));
        assert_eq!(t.insert(net("10.1.2.0/24"), 2), Some(1));
        assert_eq!(t.remove(net("10.1.2.9/24")), Some(2));
        assert!(t.is_empty());
    }

    #[test]
    fn retain_drops_a_peers_prefixes() {
        let mut t = AllowedIps::new();
        t.insert(net("10.0.0.0/24"), 1);
        t.insert(net("10.0.1.0/24"), 2);
        t.insert(net("fd00::/64"), 1);
        t.retain(|_, v| *v != 1);
        assert_eq!(t.len(), 1);
        assert_eq!(t.iter().next().map(|(n, _)| n), Some(net("10.0.1.0/24")));
    }
}
