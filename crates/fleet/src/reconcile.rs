//! The reconcile step, without I/O: the store's keys → the fleet (sites, their gateways, who
//! leads, which records are refused and why) → the peers this gateway wants → the
//! operations that turn the peers it has into those.
//!
//! The rules:
//! - a record that does not parse, or whose public key another record (created earlier) or
//!   this gateway already has, is refused;
//! - **conflicting claims**: a record claiming a subnet that overlaps one claimed by another
//!   site's record created earlier (lower etcd create revision) is refused whole, so a site
//!   that joins later can never take over another's subnets;
//! - a site's active gateway is the one whose election key was created first (etcd's
//!   election), provided its record is valid;
//! - every other site's active gateway is a peer, its subnets the allowed IPs.

use crate::record::{KeyKind, Keys, Record};
use ipnet::IpNet;
use std::collections::{BTreeMap, HashMap};
use tunneld::{PeerChange, PeerSettings};
use tunneld_crypto::PublicKey;

/// One key as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub value: Vec<u8>,
    /// The store's revision when the key was created (etcd's `create_revision`): it orders
    /// claims and candidates.
    pub create_revision: i64,
}

/// A change the store reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Put(Entry),
    Delete(String),
}

/// The fleet's keys, as last listed and watched.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    entries: BTreeMap<String, Entry>,
}

impl View {
    pub fn from_entries(entries: impl IntoIterator<Item = Entry>) -> View {
        View {
            entries: entries.into_iter().map(|e| (e.key.clone(), e)).collect(),
        }
    }

    pub fn apply(&mut self, change: Change) {
        match change {
            Change::Put(entry) => {
                self.entries.insert(entry.key.clone(), entry);
            }
            Change::Delete(key) => {
                self.entries.remove(&key);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A gateway the fleet knows, with the revision its record was created at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub record: Record,
    pub create_revision: i64,
}

/// One site: its gateways (valid records) and which one leads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Site {
    pub gateways: Vec<Member>,
    /// The gateway the site's election chose, when its record is valid.
    pub active: Option<String>,
}

impl Site {
    pub fn active_member(&self) -> Option<&Member> {
        let name = self.active.as_deref()?;
        self.gateways.iter().find(|m| m.record.gateway == name)
    }
}

/// A record refused, and why (one line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub key: String,
    /// The record's value as it was refused: a rejection is logged once per value.
    pub create_revision: i64,
    pub reason: String,
}

/// The fleet as one gateway sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fleet {
    pub sites: BTreeMap<String, Site>,
    pub rejected: Vec<Rejection>,
}

impl Fleet {
    /// Reads the keys: records checked, conflicting claims settled, leaders found.
    /// `own_key`: this gateway's public key, which no other record may carry.
    pub fn resolve(view: &View, keys: &Keys, own: (&str, &str, &PublicKey)) -> Fleet {
        let (own_site, own_gateway, own_key) = own;
        let mut fleet = Fleet::default();
        let mut records: Vec<(&Entry, Record)> = Vec::new();
        let mut candidates: HashMap<&str, (i64, &str)> = HashMap::new();
        for entry in view.entries.values() {
            match keys.kind(&entry.key) {
                KeyKind::Record { site, gateway } => {
                    match Record::parse(site, gateway, &entry.value) {
                        Ok(record) => records.push((entry, record)),
                        Err(reason) => fleet.reject(entry, reason),
                    }
                }
                KeyKind::Election { site } => {
                    let Ok(name) = std::str::from_utf8(&entry.value) else {
                        continue;
                    };
                    let first = candidates.entry(site).or_insert((i64::MAX, ""));
                    if entry.create_revision < first.0 {
                        *first = (entry.create_revision, name);
                    }
                }
                KeyKind::Other => {}
            }
        }
        // Earlier claims first: they win every conflict.
        records.sort_by_key(|(entry, _)| (entry.create_revision, entry.key.clone()));
        let mut keys_seen: HashMap<PublicKey, String> = HashMap::new();
        let mut claims: Vec<(IpNet, String)> = Vec::new();
        for (entry, record) in records {
            let is_own = record.site == own_site && record.gateway == own_gateway;
            if !is_own && record.public_key == *own_key {
                fleet.reject(entry, "its public key is this gateway's own".into());
                continue;
            }
            if let Some(holder) = keys_seen.get(&record.public_key) {
                fleet.reject(entry, format!("its public key is {holder}'s already"));
                continue;
            }
            let conflict = record.subnets.iter().find_map(|net| {
                claims
                    .iter()
                    .find(|(claimed, site)| {
                        *site != record.site && (claimed.contains(net) || net.contains(claimed))
                    })
                    .map(|(claimed, site)| (net, claimed, site))
            });
            if let Some((net, claimed, site)) = conflict {
                fleet.reject(
                    entry,
                    format!("subnet {net} overlaps {claimed}, claimed first by site {site}"),
                );
                continue;
            }
            keys_seen.insert(
                record.public_key,
                format!("{}/{}", record.site, record.gateway),
            );
            claims.extend(record.subnets.iter().map(|n| (*n, record.site.clone())));
            fleet
                .sites
                .entry(record.site.clone())
                .or_default()
                .gateways
                .push(Member {
                    record,
                    create_revision: entry.create_revision,
                });
        }
        for (site, (_, leader)) in candidates {
            if let Some(s) = fleet.sites.get_mut(site) {
                if s.gateways.iter().any(|m| m.record.gateway == leader) {
                    s.active = Some(leader.to_string());
                }
            }
        }
        fleet
    }

    fn reject(&mut self, entry: &Entry, reason: String) {
        self.rejected.push(Rejection {
            key: entry.key.clone(),
            create_revision: entry.create_revision,
            reason,
        });
    }

    /// Whether `gateway` leads `site`.
    pub fn is_active(&self, site: &str, gateway: &str) -> bool {
        self.sites
            .get(site)
            .and_then(|s| s.active.as_deref())
            .is_some_and(|a| a == gateway)
    }

    /// The peers a gateway of `own_site` wants: every other site's active gateway, its
    /// subnets as allowed IPs, `keepalive` its keepalive. A standby (`own_active` false)
    /// keeps the same peers warm but routes nothing and stays quiet: no allowed IPs (what
    /// reaches it for another site is its LAN's to send to the active gateway) and no
    /// keepalive (no handshakes that the other sites, which do not know it, would drop).
    pub fn wanted_peers(
        &self,
        own_site: &str,
        own_active: bool,
        keepalive: u16,
    ) -> BTreeMap<PublicKey, PeerSettings> {
        self.sites
            .iter()
            .filter(|(name, _)| name.as_str() != own_site)
            .filter_map(|(_, site)| site.active_member())
            .map(|m| {
                let r = &m.record;
                (r.public_key, {
                    let mut peer = PeerSettings::new(r.public_key)
                        .persistent_keepalive(if own_active { keepalive } else { 0 });
                    if own_active {
                        peer = peer.allowed_ips(r.subnets.iter().copied());
                    }
                    peer.endpoint = r.endpoints.first().copied();
                    peer
                })
            })
            .collect()
    }
}

/// One change to the gateway's peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerOp {
    Remove(PublicKey),
    Update(PeerChange),
    Add(PeerSettings),
}

/// The operations that turn `applied` (the peers the fleet has put on the gateway) into
/// `wanted`: removals first (so that subnets moving to another peer are free), then changes,
/// then additions. A peer that did not change gets none, so it keeps its session.
pub fn diff(
    applied: &BTreeMap<PublicKey, PeerSettings>,
    wanted: &BTreeMap<PublicKey, PeerSettings>,
) -> Vec<PeerOp> {
    let mut ops: Vec<PeerOp> = applied
        .keys()
        .filter(|k| !wanted.contains_key(k))
        .map(|k| PeerOp::Remove(*k))
        .collect();
    let mut adds = Vec::new();
    for (key, want) in wanted {
        let Some(have) = applied.get(key) else {
            adds.push(PeerOp::Add(want.clone()));
            continue;
        };
        let mut change = PeerChange::new(*key);
        let mut changed = false;
        if have.endpoint != want.endpoint {
            change.endpoint = want.endpoint;
            changed = true;
        }
        if have.allowed_ips != want.allowed_ips {
            change.allowed_ips = Some(want.allowed_ips.clone());
            changed = true;
        }
        if have.persistent_keepalive != want.persistent_keepalive {
            change.persistent_keepalive = Some(want.persistent_keepalive);
            changed = true;
        }
        if changed {
            ops.push(PeerOp::Update(change));
        }
    }
    ops.extend(adds);
    ops
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Role;
    use proptest::prelude::*;
    use tunneld_crypto::PrivateKey;

    fn key(n: u8) -> PublicKey {
        PrivateKey::from_bytes([n.max(1); 32]).public_key()
    }

    fn record_entry(
        keys: &Keys,
        site: &str,
        gateway: &str,
        n: u8,
        subnets: &[&str],
        rev: i64,
    ) -> Entry {
        let record = Record {
            site: site.into(),
            gateway: gateway.into(),
            public_key: key(n),
            endpoints: vec![format!("192.0.2.{n}:51820").parse().unwrap()],
            subnets: subnets.iter().map(|s| s.parse().unwrap()).collect(),
            role: Role::Standby,
        };
        Entry {
            key: keys.record(site, gateway),
            value: record.to_json(),
            create_revision: rev,
        }
    }

    fn election_entry(keys: &Keys, site: &str, gateway: &str, rev: i64) -> Entry {
        Entry {
            key: format!("{}/{rev:x}", keys.election(site)),
            value: gateway.as_bytes().to_vec(),
            create_revision: rev,
        }
    }

    #[test]
    fn the_first_candidate_leads_and_the_others_route_to_it() {
        let keys = Keys::new("/f");
        let mut view = View::from_entries([
            record_entry(&keys, "a", "a1", 1, &["10.1.0.0/24"], 1),
            election_entry(&keys, "a", "a1", 2),
            record_entry(&keys, "b", "b1", 2, &["10.2.0.0/24"], 3),
            record_entry(&keys, "b", "b2", 3, &["10.2.0.0/24"], 4),
            election_entry(&keys, "b", "b1", 5),
            election_entry(&keys, "b", "b2", 6),
        ]);
        let fleet = Fleet::resolve(&view, &keys, ("a", "a1", &key(1)));
        assert!(fleet.rejected.is_empty(), "{:?}", fleet.rejected);
        assert!(fleet.is_active("b", "b1"));
        let wanted = fleet.wanted_peers("a", true, 25);
        assert_eq!(wanted.keys().copied().collect::<Vec<_>>(), vec![key(2)]);
        // b2 stands by: the same peers, routing nothing, quiet.
        let standby =
            Fleet::resolve(&view, &keys, ("b", "b2", &key(3))).wanted_peers("b", false, 25);
        assert_eq!(standby.keys().copied().collect::<Vec<_>>(), vec![key(1)]);
        assert!(standby[&key(1)].allowed_ips.is_empty());
        assert_eq!(standby[&key(1)].persistent_keepalive, 0);
        // b1's lease expires: its keys go, and b2 leads.
        view.apply(Change::Delete(keys.record("b", "b1")));
        view.apply(Change::Delete(format!("{}/{:x}", keys.election("b"), 5)));
        let after = Fleet::resolve(&view, &keys, ("a", "a1", &key(1)));
        assert!(after.is_active("b", "b2"));
        let ops = diff(&wanted, &after.wanted_peers("a", true, 25));
        assert_eq!(ops.len(), 2);
        assert_eq!(ops[0], PeerOp::Remove(key(2)));
        assert!(matches!(&ops[1], PeerOp::Add(p) if p.public_key == key(3)));
    }

    #[test]
    fn a_later_claim_on_a_subnet_is_refused_and_the_first_keeps_it() {
        let keys = Keys::new("/f");
        let view = View::from_entries([
            record_entry(&keys, "b", "b1", 2, &["10.2.0.0/24"], 3),
            election_entry(&keys, "b", "b1", 4),
            record_entry(&keys, "x", "x1", 9, &["10.2.0.128/25"], 10),
            election_entry(&keys, "x", "x1", 11),
        ]);
        let fleet = Fleet::resolve(&view, &keys, ("a", "a1", &key(1)));
        assert_eq!(fleet.rejected.len(), 1);
        assert!(fleet.rejected[0].reason.contains("claimed first by site b"));
        let wanted = fleet.wanted_peers("a", true, 25);
        assert_eq!(wanted.len(), 1);
        assert!(wanted.contains_key(&key(2)));
    }

    #[test]
    fn own_key_and_duplicate_keys_are_refused() {
        let keys = Keys::new("/f");
        let view = View::from_entries([
            record_entry(&keys, "a", "a1", 1, &["10.1.0.0/24"], 1),
            record_entry(&keys, "c", "c1", 1, &["10.3.0.0/24"], 2),
            record_entry(&keys, "d", "d1", 4, &["10.4.0.0/24"], 3),
            record_entry(&keys, "e", "e1", 4, &["10.5.0.0/24"], 4),
        ]);
        let fleet = Fleet::resolve(&view, &keys, ("a", "a1", &key(1)));
        let reasons: Vec<&str> = fleet.rejected.iter().map(|r| r.reason.as_str()).collect();
        assert_eq!(reasons.len(), 2, "{reasons:?}");
        assert!(reasons[0].contains("this gateway's own"));
        assert!(reasons[1].contains("d/d1's already"));
    }

    fn peer_strategy() -> impl Strategy<Value = (u8, PeerSettings)> {
        (1u8..12, 1u8..4, 0u8..3, prop::bool::ANY).prop_map(|(n, port, net, keepalive)| {
            (
                n,
                PeerSettings::new(key(n))
                    .endpoint(
                        format!("192.0.2.{n}:{}", 51820 + u16::from(port))
                            .parse()
                            .unwrap(),
                    )
                    .allowed_ip(format!("10.{n}.{net}.0/24").parse().unwrap())
                    .persistent_keepalive(if keepalive { 25 } else { 0 }),
            )
        })
    }

    fn peers() -> impl Strategy<Value = BTreeMap<PublicKey, PeerSettings>> {
        prop::collection::vec(peer_strategy(), 0..10)
            .prop_map(|v| v.into_iter().map(|(_, p)| (p.public_key, p)).collect())
    }

    /// Applies operations as the gateway would.
    fn apply(
        mut peers: BTreeMap<PublicKey, PeerSettings>,
        ops: &[PeerOp],
    ) -> BTreeMap<PublicKey, PeerSettings> {
        for op in ops {
            match op {
                PeerOp::Remove(k) => assert!(peers.remove(k).is_some()),
                PeerOp::Add(p) => assert!(peers.insert(p.public_key, p.clone()).is_none()),
                PeerOp::Update(c) => {
                    let p = peers
                        .get_mut(&c.public_key)
                        .expect("update of a peer that is there");
                    if let Some(e) = c.endpoint {
                        p.endpoint = Some(e);
                    }
                    if let Some(a) = &c.allowed_ips {
                        p.allowed_ips.clone_from(a);
                    }
                    if let Some(k) = c.persistent_keepalive {
                        p.persistent_keepalive = k;
                    }
                }
            }
        }
        peers
    }

    proptest! {
        #[test]
        fn the_operations_lead_to_the_wanted_peers_and_spare_the_unchanged(
            applied in peers(),
            wanted in peers(),
        ) {
            let ops = diff(&applied, &wanted);
            prop_assert_eq!(apply(applied.clone(), &ops), wanted.clone());
            for op in &ops {
                let key = match op {
                    PeerOp::Remove(k) => *k,
                    PeerOp::Add(p) => p.public_key,
                    PeerOp::Update(c) => c.public_key,
                };
                prop_assert_ne!(applied.get(&key), wanted.get(&key));
            }
            // Removals come before anything that may take over their subnets.
            let first_other = ops.iter().position(|op| !matches!(op, PeerOp::Remove(_)));
            if let Some(i) = first_other {
                prop_assert!(ops[i..].iter().all(|op| !matches!(op, PeerOp::Remove(_))));
            }
            prop_assert!(diff(&wanted, &wanted).is_empty());
        }

        #[test]
        fn accepted_sites_never_share_a_subnet_and_the_first_claim_stands(
            claims in prop::collection::vec((0u8..5, 0u8..4, 20u8..26), 1..12),
        ) {
            let keys = Keys::new("/f");
            let entries: Vec<Entry> = claims
                .iter()
                .enumerate()
                .map(|(i, (site, net, len))| {
                    let subnet = format!("10.0.{}.0/{len}", net * 16);
                    record_entry(&keys, &format!("s{site}"), &format!("g{i}"), i as u8 + 2, &[subnet.as_str()], i as i64 + 1)
                })
                .collect();
            let fleet = Fleet::resolve(&View::from_entries(entries), &keys, ("me", "me", &key(1)));
            let accepted: Vec<&Member> = fleet.sites.values().flat_map(|s| &s.gateways).collect();
            prop_assert_eq!(accepted.len() + fleet.rejected.len(), claims.len());
            for a in &accepted {
                for b in &accepted {
                    if a.record.site != b.record.site {
                        let (x, y) = (a.record.subnets[0], b.record.subnets[0]);
                        prop_assert!(!x.contains(&y) && !y.contains(&x));
                    }
                }
            }
            // The first record written is never refused.
            prop_assert!(accepted.iter().any(|m| m.create_revision == 1));
        }
    }
}
