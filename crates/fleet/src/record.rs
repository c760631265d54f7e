//! What the fleet keeps in etcd, and the one place that reads it back.
//!
//! Under the fleet's prefix:
//! - `gateways/<site>/<gateway>`: a gateway's [`Record`] (JSON), under its lease. The name is
//!   claimed, not taken: a gateway writes it only where no other lease holds it (a
//!   transaction), so a second gateway given the same name cannot overwrite the first;
//! - `gateways/<site>/<gateway>/refused/<lease id, hex>`: a gateway that claimed that name
//!   and was refused, its record as it would have written it, under its lease: how the
//!   holder (and everyone) learns of the duplicate;
//! - `gateways/<site>/<gateway>/seen/<key hex>`: where that gateway sees the gateway of that
//!   key (a NAT's address), under its lease;
//! - `gateways/<site>/<gateway>/relay/<key hex>`: that gateway asks the relay whose key is
//!   the value for a port to reach the gateway of that key, under its lease;
//! - `gateways/<site>/<gateway>/relaying/<low key hex>-<high key hex>`: that relay serves
//!   the pair on the UDP port in the value, under its lease;
//! - `elections/<site>/<lease id, hex>`: the site's election (etcd's election service
//!   writes these keys under each candidate's lease); the value is a [`Candidate`]: the
//!   gateway's name and public key.
//!
//! A gateway is its public key: a name is bound to a key by the record, and a candidate leads
//! only with the record of its name, key and lease. Records hold public keys, endpoints,
//! subnets and roles only: private keys never leave a gateway.

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use tunneld_config::SiteMode;
use tunneld_crypto::PublicKey;

/// A record longer than this is refused unread: a gateway's own is a few hundred bytes.
pub const MAX_RECORD_BYTES: usize = 4096;
/// At most this many endpoints and subnets in a record.
pub const MAX_ITEMS: usize = 64;

/// Whether a gateway leads its site (what it says of itself; the election decides).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Active,
    Standby,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Active => "active",
            Role::Standby => "standby",
        })
    }
}

/// A gateway as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub site: String,
    pub gateway: String,
    pub public_key: PublicKey,
    /// Where the other sites reach it, the first one first.
    pub endpoints: Vec<SocketAddr>,
    /// The networks its site serves.
    pub subnets: Vec<IpNet>,
    pub role: Role,
    /// The site's mode as this gateway's config says it (the elected gateway's is the site's).
    pub mode: SiteMode,
    /// It relays for pairs of gateways with no direct path (`[fleet] relay = true`).
    pub relay: bool,
    /// Its TLS listener for sites that can send only TCP, and the name its certificate
    /// carries (a relay's `relay_tls`).
    pub relay_tls: Option<(SocketAddr, String)>,
    /// It can send only TCP: reached only through relays' TLS listeners
    /// (`transport = "tls"`).
    pub tls_only: bool,
}

/// The record's JSON: strings, so that a hand-written one is easy to read and to refuse.
/// Unknown fields are ignored (a newer gateway may add some).
#[derive(Serialize, Deserialize)]
struct Json {
    public_key: String,
    endpoints: Vec<String>,
    subnets: Vec<String>,
    role: Role,
    /// Absent: active-standby, which is what a gateway older than the modes runs. A mode this
    /// gateway does not know reads as active-standby too: every gateway of the site still
    /// routes the site then, through its elected one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mode: Option<String>,
    /// Absent: no relay.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    relay: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    relay_tls: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    relay_tls_name: Option<String>,
    /// Absent: UDP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    transport: Option<String>,
}

impl Record {
    /// The value written to the store.
    pub fn to_json(&self) -> Vec<u8> {
        let json = Json {
            public_key: self.public_key.to_base64(),
            endpoints: self.endpoints.iter().map(ToString::to_string).collect(),
            subnets: self.subnets.iter().map(ToString::to_string).collect(),
            role: self.role,
            mode: (self.mode != SiteMode::ActiveStandby).then(|| self.mode.as_str().to_string()),
            relay: self.relay,
            relay_tls: self.relay_tls.as_ref().map(|(a, _)| a.to_string()),
            relay_tls_name: self.relay_tls.as_ref().map(|(_, n)| n.clone()),
            transport: self.tls_only.then(|| "tls".to_string()),
        };
        serde_json::to_vec(&json).unwrap_or_default()
    }

    /// Reads the record of `site`/`gateway` (from its key) or says in one line why not.
    pub fn parse(site: &str, gateway: &str, value: &[u8]) -> Result<Record, String> {
        if value.len() > MAX_RECORD_BYTES {
            return Err(format!(
                "{} bytes, more than {MAX_RECORD_BYTES}",
                value.len()
            ));
        }
        for (what, name) in [("site", site), ("gateway", gateway)] {
            if let Some(why) = tunneld_config::fleet_name_problem(name) {
                return Err(format!("its {what} name {why}"));
            }
        }
        let json: Json = serde_json::from_slice(value).map_err(|e| {
            let e = e.to_string();
            format!("not a gateway record: {}", e.lines().next().unwrap_or(""))
        })?;
        let public_key =
            PublicKey::from_base64(&json.public_key).map_err(|e| format!("public_key {e}"))?;
        if json.endpoints.is_empty() || json.endpoints.len() > MAX_ITEMS {
            return Err(format!("needs 1 to {MAX_ITEMS} endpoints"));
        }
        if json.subnets.len() > MAX_ITEMS {
            return Err(format!("more than {MAX_ITEMS} subnets"));
        }
        let endpoints = json
            .endpoints
            .iter()
            .map(|e| match e.parse::<SocketAddr>() {
                Ok(a) if a.port() != 0 && !a.ip().is_unspecified() => Ok(a),
                _ => Err(format!("endpoint {e:?} is not an address:port")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let subnets = json
            .subnets
            .iter()
            .map(|s| match s.parse::<IpNet>() {
                Ok(net) => Ok(net.trunc()),
                Err(_) => Err(format!("subnet {s:?} is not a CIDR")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Record {
            site: site.to_string(),
            gateway: gateway.to_string(),
            public_key,
            endpoints,
            subnets,
            role: json.role,
            mode: json
                .mode
                .as_deref()
                .and_then(SiteMode::parse)
                .unwrap_or_default(),
            relay: json.relay,
            relay_tls: match (json.relay_tls, json.relay_tls_name) {
                (Some(a), name) => {
                    let addr = a
                        .parse::<SocketAddr>()
                        .map_err(|_| format!("relay_tls {a:?} is not an address:port"))?;
                    Some((addr, name.unwrap_or_else(|| addr.ip().to_string())))
                }
                (None, _) => None,
            },
            tls_only: json.transport.as_deref() == Some("tls"),
        })
    }
}

/// A gateway standing in its site's election: the election's value, which names the
/// gateway unambiguously (a name alone may be claimed by two gateways).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub gateway: String,
    pub public_key: PublicKey,
}

#[derive(Serialize, Deserialize)]
struct CandidateJson {
    gateway: String,
    public_key: String,
}

impl Candidate {
    pub fn to_value(&self) -> String {
        serde_json::to_string(&CandidateJson {
            gateway: self.gateway.clone(),
            public_key: self.public_key.to_base64(),
        })
        .unwrap_or_default()
    }

    /// `None` for anything else (a value written by hand, or by an older tunneld, which
    /// stood as its name alone): such a candidate never leads.
    pub fn parse(value: &[u8]) -> Option<Candidate> {
        let json: CandidateJson = serde_json::from_slice(value).ok()?;
        Some(Candidate {
            public_key: PublicKey::from_base64(&json.public_key).ok()?,
            gateway: json.gateway,
        })
    }
}

/// The keys of one fleet, all under its prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

/// What a key under the prefix is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyKind<'a> {
    Record {
        site: &'a str,
        gateway: &'a str,
    },
    /// A gateway refused the name `gateway` (another lease holds it).
    Refused {
        site: &'a str,
        gateway: &'a str,
    },
    Election {
        site: &'a str,
    },
    /// The gateway `site`/`gateway` saw the gateway of public key `subject` (hex) send from
    /// the address in the value: how a gateway behind NAT is reached from outside.
    Seen {
        site: &'a str,
        gateway: &'a str,
        subject: &'a str,
    },
    /// The gateway `site`/`gateway` asks the relay whose key the value holds to carry its
    /// datagrams to and from the gateway of key `subject` (hex).
    RelayWanted {
        site: &'a str,
        gateway: &'a str,
        subject: &'a str,
    },
    /// The relay `site`/`gateway` serves `pair` (`<low key hex>-<high key hex>`) on the UDP
    /// port in the value.
    Relaying {
        site: &'a str,
        gateway: &'a str,
        pair: &'a str,
    },
    /// Something else under the prefix (ignored).
    Other,
}

impl Keys {
    /// `prefix` as the config gives it (`/tunneld/corp`, no trailing `/`).
    pub fn new(prefix: &str) -> Keys {
        Keys {
            prefix: format!("{}/", prefix.trim_end_matches('/')),
        }
    }

    /// Everything the fleet reads is under this.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn record(&self, site: &str, gateway: &str) -> String {
        format!("{}gateways/{site}/{gateway}", self.prefix)
    }

    /// Where a gateway refused the name `gateway` says so, under its `lease`.
    pub fn refused(&self, site: &str, gateway: &str, lease: i64) -> String {
        format!("{}/refused/{lease:x}", self.record(site, gateway))
    }

    /// Where the gateway `site`/`gateway` publishes the address it sees `subject`'s
    /// datagrams come from (under its own record, so a site's etcd role covers it).
    pub fn seen(&self, site: &str, gateway: &str, subject: &PublicKey) -> String {
        format!("{}/seen/{}", self.record(site, gateway), key_hex(subject))
    }

    /// Where the gateway `site`/`gateway` asks for a relay to `subject` (under its record).
    pub fn relay_wanted(&self, site: &str, gateway: &str, subject: &PublicKey) -> String {
        format!("{}/relay/{}", self.record(site, gateway), key_hex(subject))
    }

    /// Where the relay `site`/`gateway` says which port serves `pair`.
    /// `pair`: the pair's `<low key hex>-<high key hex>` (`relay::Pair::to_hex`).
    pub fn relaying(&self, site: &str, gateway: &str, pair: &str) -> String {
        format!("{}/relaying/{pair}", self.record(site, gateway))
    }

    /// The name of a site's election (etcd's election service adds `/<lease>`).
    pub fn election(&self, site: &str) -> String {
        format!("{}elections/{site}", self.prefix)
    }

    /// The key etcd's election service writes for the candidate under `lease`.
    pub fn candidate(&self, site: &str, lease: i64) -> String {
        format!("{}/{lease:x}", self.election(site))
    }

    pub fn kind<'a>(&self, key: &'a str) -> KeyKind<'a> {
        let Some(rest) = key.strip_prefix(self.prefix.as_str()) else {
            return KeyKind::Other;
        };
        let parts: Vec<&str> = rest.split('/').collect();
        match parts.as_slice() {
            ["gateways", site, gateway] => KeyKind::Record { site, gateway },
            ["gateways", site, gateway, "refused", _lease] => KeyKind::Refused { site, gateway },
            ["elections", site, _lease] => KeyKind::Election { site },
            ["gateways", site, gateway, "seen", subject] => KeyKind::Seen {
                site,
                gateway,
                subject,
            },
            ["gateways", site, gateway, "relay", subject] => KeyKind::RelayWanted {
                site,
                gateway,
                subject,
            },
            ["gateways", site, gateway, "relaying", pair] => KeyKind::Relaying {
                site,
                gateway,
                pair,
            },
            _ => KeyKind::Other,
        }
    }
}

/// A public key as the store's keys name it: 64 hex digits.
pub fn key_hex(key: &PublicKey) -> String {
    key.as_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

/// The public key a `seen/` key names (64 hex digits).
pub fn seen_subject(hex: &str) -> Option<PublicKey> {
    if hex.len() != 64 {
        return None;
    }
    let mut bytes = [0u8; 32];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(PublicKey::from_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            site: "b".into(),
            gateway: "b1".into(),
            public_key: tunneld_crypto::PrivateKey::generate().public_key(),
            endpoints: vec!["192.0.2.2:51820".parse().unwrap()],
            subnets: vec!["10.2.0.0/24".parse().unwrap()],
            role: Role::Standby,
            mode: SiteMode::ActiveStandby,
            relay: false,
            relay_tls: None,
            tls_only: false,
        }
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let r = record();
        assert_eq!(Record::parse("b", "b1", &r.to_json()).unwrap(), r);
        // An active-standby record is what a gateway older than the modes writes.
        assert!(!String::from_utf8(r.to_json()).unwrap().contains("mode"));
        let both = Record {
            mode: SiteMode::ActiveActive,
            ..record()
        };
        assert_eq!(Record::parse("b", "b1", &both.to_json()).unwrap(), both);
        assert!(!String::from_utf8(r.to_json()).unwrap().contains("relay"));
        let relay = Record {
            relay: true,
            relay_tls: Some(("192.0.2.31:443".parse().unwrap(), "relay.example".into())),
            ..record()
        };
        let tls_only = Record {
            tls_only: true,
            ..record()
        };
        assert_eq!(
            Record::parse("b", "b1", &tls_only.to_json()).unwrap(),
            tls_only
        );
        assert_eq!(Record::parse("b", "b1", &relay.to_json()).unwrap(), relay);
        let newer = String::from_utf8(both.to_json())
            .unwrap()
            .replace("active-active", "some-later-mode");
        assert_eq!(
            Record::parse("b", "b1", newer.as_bytes()).unwrap().mode,
            SiteMode::ActiveStandby
        );
    }

    #[test]
    fn bad_records_are_refused_with_a_reason() {
        let key = record().public_key.to_base64();
        let cases: &[(&str, &str)] = &[
            ("{", "not a gateway record"),
            (
                r#"{"public_key":"AAAA","endpoints":["192.0.2.1:1"],"subnets":[],"role":"active"}"#,
                "public_key",
            ),
            (
                &format!(
                    r#"{{"public_key":"{key}","endpoints":["host:1"],"subnets":[],"role":"active"}}"#
                ),
                "endpoint \"host:1\"",
            ),
            (
                &format!(r#"{{"public_key":"{key}","endpoints":[],"subnets":[],"role":"active"}}"#),
                "endpoints",
            ),
            (
                &format!(
                    r#"{{"public_key":"{key}","endpoints":["192.0.2.1:1"],"subnets":["10.0.0.0/33"],"role":"active"}}"#
                ),
                "subnet",
            ),
            (
                &format!(
                    r#"{{"public_key":"{key}","endpoints":["192.0.2.1:1"],"subnets":[],"role":"boss"}}"#
                ),
                "not a gateway record",
            ),
        ];
        for (json, why) in cases {
            let e = Record::parse("b", "b1", json.as_bytes()).unwrap_err();
            assert!(e.contains(why), "{json}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
        let huge = vec![b' '; MAX_RECORD_BYTES + 1];
        assert!(Record::parse("b", "b1", &huge)
            .unwrap_err()
            .contains("bytes"));
        let r = record();
        assert!(Record::parse("b/x", "b1", &r.to_json()).is_err());
    }

    #[test]
    fn a_candidate_reads_back_and_a_bare_name_is_none() {
        let c = Candidate {
            gateway: "b1".into(),
            public_key: record().public_key,
        };
        assert_eq!(Candidate::parse(c.to_value().as_bytes()), Some(c));
        assert_eq!(Candidate::parse(b"b1"), None);
    }

    #[test]
    fn keys_name_their_kind() {
        let keys = Keys::new("/tunneld/corp");
        assert_eq!(
            keys.kind(&keys.record("b", "b1")),
            KeyKind::Record {
                site: "b",
                gateway: "b1"
            }
        );
        assert_eq!(
            keys.kind(&format!("{}/694d7a", keys.election("b"))),
            KeyKind::Election { site: "b" }
        );
        assert_eq!(
            keys.kind(&keys.refused("b", "b1", 0x694d7a)),
            KeyKind::Refused {
                site: "b",
                gateway: "b1"
            }
        );
        assert_eq!(
            keys.candidate("b", 0x694d7a),
            format!("{}/694d7a", keys.election("b"))
        );
        assert_eq!(keys.kind("/tunneld/corpx/gateways/b/b1"), KeyKind::Other);
        assert_eq!(keys.kind("/tunneld/corp/gateways/b"), KeyKind::Other);
        let subject = tunneld_crypto::PrivateKey::generate().public_key();
        let seen = keys.seen("a", "a1", &subject);
        let KeyKind::Seen {
            site: "a",
            gateway: "a1",
            subject: hex,
        } = keys.kind(&seen)
        else {
            panic!("{seen} is not a seen/ key: {:?}", keys.kind(&seen));
        };
        assert_eq!(seen_subject(hex), Some(subject));
        let wanted = keys.relay_wanted("a", "a1", &subject);
        assert!(matches!(
            keys.kind(&wanted),
            KeyKind::RelayWanted { site: "a", gateway: "a1", subject: s } if seen_subject(s) == Some(subject)
        ));
        let pair = crate::relay::Pair::new(subject, record().public_key);
        let relaying = keys.relaying("r", "r1", &pair.to_hex());
        assert!(matches!(
            keys.kind(&relaying),
            KeyKind::Relaying { site: "r", gateway: "r1", pair: p } if crate::relay::Pair::from_hex(p) == Some(pair)
        ));
        assert_eq!(seen_subject(&hex[1..]), None);
        assert_eq!(seen_subject(&format!("{}zz", &hex[2..])), None);
    }
}
