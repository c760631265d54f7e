//! A site behind a NAT, made with nftables in a router namespace of its own on the
//! [`Underlay`]: the behaviours a gateway meets in a branch office, for the tests and the
//! bench of sites behind NAT.
//!
//! The site's namespace has a private /30 (from 198.51.100.0/24) toward its router and a
//! default route through it; the router holds the public address on the underlay and
//! masquerades what the site sends out. Linux's connection tracking filters what comes
//! back by address and port: only replies from where the site sent go in (a "port
//! restricted" NAT), whatever the mapping. Like a real router's firewall, it drops what
//! the outside sends to the router itself unasked: a datagram it took in instead would hold
//! a connection-tracking entry that makes the site's own reply to that sender leave from
//! another port (a hole punch between two such NATs would never meet). Everything goes when
//! dropped.

use crate::etcd::{link, Underlay};
use crate::NetNs;
use std::process::Output;

/// How the router maps and filters what its site sends out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NatKind {
    /// Endpoint-independent mapping: a site's port keeps one public port whatever it sends
    /// to (nftables `masquerade`, which keeps the port where it is free), as most home
    /// and office routers do. Two such sites can open a direct path toward each other.
    EndpointIndependent,
    /// Endpoint-dependent mapping: each new destination gets a public port of its own
    /// (`masquerade fully-random`), as carrier-grade and cloud NATs often do. What a third
    /// party saw of the site's port says nothing of the port a peer will see.
    EndpointDependent,
    /// Only TCP to port 443 leaves (and its replies come back); no UDP at all.
    Tcp443Only,
}

/// A site behind a NAT: its router (on the underlay) and the site's namespace.
#[derive(Debug)]
pub struct Nat {
    /// The site's namespace: its only way out is the router.
    pub site: NetNs,
    /// The router, with the public address on the underlay.
    pub router: NetNs,
    /// The router's public address (without the prefix).
    pub public: String,
    /// The site's own (private) address toward the router.
    pub private: String,
    pub kind: NatKind,
}

impl Nat {
    /// A site behind a router at `public` (CIDR on `wan`'s subnet) NATing as `kind`.
    /// `slot` (0 to 63) picks the site's private /30, 198.51.100.4·slot: one per NAT of a
    /// test.
    pub fn new(wan: &Underlay, public: &str, slot: u8, kind: NatKind) -> Nat {
        assert!(slot < 64, "a NAT slot is 0 to 63");
        let router = wan.host(public);
        let site = NetNs::new();
        let base = 4 * u32::from(slot);
        let (router_ip, site_ip) = (
            format!("198.51.100.{}", base + 1),
            format!("198.51.100.{}", base + 2),
        );
        let (router_end, site_end) = link(&router, &site);
        router.run(&[
            "ip",
            "addr",
            "add",
            &format!("{router_ip}/30"),
            "dev",
            &router_end,
        ]);
        router.run(&["ip", "link", "set", &router_end, "up"]);
        router.run(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        site.run(&[
            "ip",
            "addr",
            "add",
            &format!("{site_ip}/30"),
            "dev",
            &site_end,
        ]);
        site.run(&["ip", "link", "set", &site_end, "up"]);
        site.run(&["ip", "route", "add", "default", "via", &router_ip]);
        let masquerade = match kind {
            NatKind::EndpointDependent => "masquerade fully-random",
            NatKind::EndpointIndependent | NatKind::Tcp443Only => "masquerade",
        };
        let filter = match kind {
            NatKind::Tcp443Only => format!(
                "iifname \"{router_end}\" tcp dport 443 accept\n\
                 iifname \"{router_end}\" drop\n"
            ),
            NatKind::EndpointIndependent | NatKind::EndpointDependent => String::new(),
        };
        let rules = format!(
            "table ip tunneld_nat {{\n\
             chain postrouting {{\n\
             type nat hook postrouting priority srcnat; policy accept;\n\
             ip saddr {site_ip} oifname != \"{router_end}\" {masquerade}\n\
             }}\n\
             chain forward {{\n\
             type filter hook forward priority filter; policy accept;\n\
             {filter}\
             }}\n\
             chain input {{\n\
             type filter hook input priority filter; policy accept;\n\
             iifname != \"{router_end}\" ct state new drop\n\
             }}\n\
             }}\n"
        );
        load_rules(&router, &rules);
        let public = public.split_once('/').map_or(public, |(ip, _)| ip);
        Nat {
            site,
            router,
            public: public.to_string(),
            private: site_ip,
            kind,
        }
    }

    /// Forgets every mapping, as a NAT that rebooted or whose table was flushed: the next
    /// datagram out gets a new one (with [`NatKind::EndpointDependent`], a new port), and
    /// replies to the old ones are dropped.
    pub fn flush(&self) {
        self.router.run(&["conntrack", "-F"]);
    }

    /// Lets the site open TCP connections to `to`:`port` too (a TCP-443-only site's way to
    /// its fleet's etcd, say), ahead of the router's other rules.
    pub fn allow_tcp(&self, to: &str, port: u16) {
        self.router.run(&[
            "nft",
            "insert",
            "rule",
            "ip",
            "tunneld_nat",
            "forward",
            "ip",
            "saddr",
            &self.private,
            "ip",
            "daddr",
            to,
            "tcp",
            "dport",
            &port.to_string(),
            "accept",
        ]);
    }

    /// Drops every datagram between this site and `other_public` (an address on the
    /// underlay), both ways, as a firewall between two sites would; [`Nat::unblock`] ends it.
    pub fn block(&self, other_public: &str) {
        load_rules(
            &self.router,
            &format!(
                "table ip tunneld_block {{\n\
                 chain forward {{\n\
                 type filter hook forward priority filter - 1; policy accept;\n\
                 ip saddr {other_public} drop\n\
                 ip daddr {other_public} drop\n\
                 }}\n\
                 }}\n"
            ),
        );
    }

    pub fn unblock(&self) {
        self.router
            .run(&["nft", "delete", "table", "ip", "tunneld_block"]);
    }

    /// The router's mappings (`conntrack -L`), to show when a test fails.
    pub fn mappings(&self) -> String {
        let out: Output = self.router.output(&["conntrack", "-L"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

fn load_rules(router: &NetNs, rules: &str) {
    use std::io::Write;
    let mut child = router
        .command("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run nft: {e}"));
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(rules.as_bytes())
            .unwrap_or_else(|e| panic!("cannot write nft's rules: {e}"));
    }
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("nft did not finish: {e}"));
    assert!(
        out.status.success(),
        "nft refused the NAT's rules ({}):\n{rules}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
}
