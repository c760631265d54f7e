//! The store the fleet keeps its records in: the few primitives it needs (leases, keys under
//! a lease, a listing and a watch from its revision, an election), behind a small trait with
//! etcd as its one real implementation.

use crate::reconcile::{Change, Entry};
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    LeaderKey, LeaseKeepAliveStream, LeaseKeeper, PutOptions, ResignOptions, TlsOptions, Txn,
    TxnOp, TxnOpResponse, WatchOptions, WatchStream,
};
use std::time::Duration;

/// A store failure, in one line.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct StoreError(pub String);

impl StoreError {
    fn from_etcd(what: &str, e: etcd_client::Error) -> StoreError {
        let text = e.to_string().replace('\n', " ");
        StoreError(format!("{what}: {text}"))
    }
}

/// The keys under a prefix and the revision they were read at.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    pub entries: Vec<Entry>,
    pub revision: i64,
}

/// What a watch delivers next.
#[derive(Debug)]
pub enum Watched {
    Changes(Vec<Change>),
    /// The revision watched from was compacted away: list again.
    Compacted,
}

/// What came of claiming a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Written, at this revision.
    Written { revision: i64 },
    /// Another lease holds the key: it is left as it is (here as it stood at `revision`).
    Held { entry: Entry, revision: i64 },
}

/// A campaign won: the key that says so, for resigning.
#[derive(Debug, Clone)]
pub struct Leadership(LeaderKey);

/// The primitives the fleet needs of its store. Futures need not be `Send`: the fleet runs
/// on a single-threaded runtime of its own.
#[allow(async_fn_in_trait)]
pub trait Store: Clone {
    type Watch: WatchEvents;
    /// A new lease of `ttl` seconds.
    async fn grant(&mut self, ttl: i64) -> Result<i64, StoreError>;
    /// Renews a lease; `Ok(false)`: it has expired (its keys are gone).
    async fn keep_alive(&mut self, lease: i64) -> Result<bool, StoreError>;
    /// Ends a lease now, and with it every key under it.
    async fn revoke(&mut self, lease: i64) -> Result<(), StoreError>;
    async fn put(&mut self, key: &str, value: Vec<u8>, lease: i64) -> Result<(), StoreError>;
    async fn delete(&mut self, key: &str) -> Result<(), StoreError>;
    /// Writes `key` under `lease` only if it is free (absent, or under no lease: written by
    /// hand) or already under `lease`; else leaves it to the lease that holds it. One request.
    async fn claim(&mut self, key: &str, value: Vec<u8>, lease: i64) -> Result<Claim, StoreError>;
    async fn list(&mut self, prefix: &str) -> Result<Listing, StoreError>;
    /// Changes under `prefix` from `revision` on.
    async fn watch(&mut self, prefix: &str, revision: i64) -> Result<Self::Watch, StoreError>;
    /// Stands in the election `name` as `value` under `lease`; returns once elected.
    async fn campaign(
        &mut self,
        name: &str,
        value: &str,
        lease: i64,
    ) -> Result<Leadership, StoreError>;
    async fn resign(&mut self, leadership: Leadership) -> Result<(), StoreError>;
    /// Drops the connections, so that the next request opens new ones (after failures
    /// that may be one connection's, not the store's).
    async fn reconnect(&mut self) -> Result<(), StoreError>;
}

#[allow(async_fn_in_trait)]
pub trait WatchEvents {
    async fn next(&mut self) -> Result<Watched, StoreError>;
}

/// How to reach etcd.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    pub endpoints: Vec<String>,
    /// PEM: the CA, and this gateway's certificate and key (`None` with `insecure`).
    pub ca: Option<Vec<u8>>,
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The longest a request (not a watch or a campaign) may take.
    pub request_timeout: Duration,
}

/// etcd v3, through `etcd-client`.
pub struct Etcd {
    client: Client,
    options: EtcdOptions,
    timeout: Duration,
    /// The lease kept alive, with its keep-alive stream (one stream serves every renewal).
    keeper: Option<(i64, Box<(LeaseKeeper, LeaseKeepAliveStream)>)>,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd").finish_non_exhaustive()
    }
}

/// A clone shares the connection; it opens its own keep-alive stream when it needs one.
impl Clone for Etcd {
    fn clone(&self) -> Self {
        Etcd {
            client: self.client.clone(),
            options: self.options.clone(),
            timeout: self.timeout,
            keeper: None,
        }
    }
}

impl Etcd {
    /// A client of the members `options` names. It connects lazily: an unreachable store
    /// shows as the first request's error.
    pub async fn connect(options: &EtcdOptions) -> Result<Etcd, StoreError> {
        Ok(Etcd {
            client: Self::client(options).await?,
            options: options.clone(),
            timeout: options.request_timeout,
            keeper: None,
        })
    }

    async fn client(options: &EtcdOptions) -> Result<Client, StoreError> {
        let mut connect = ConnectOptions::new()
            // Dead connections are noticed within seconds, watches included.
            .with_keep_alive(Duration::from_secs(1), Duration::from_secs(2))
            .with_keep_alive_while_idle(true)
            // A loaded machine may take more than a SYN's first retry to connect.
            .with_connect_timeout(options.request_timeout.max(Duration::from_secs(3)))
            // A member cut off from the others' quorum answers no request (nor keeps a
            // watch), rather than stale data.
            .with_require_leader(true);
        if let Some(ca) = &options.ca {
            let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(ca));
            if let Some((cert, key)) = &options.identity {
                tls = tls.identity(Identity::from_pem(cert, key));
            }
            connect = connect.with_tls(tls);
        }
        let endpoints = answering_members(&options.endpoints).await;
        Client::connect(&endpoints, Some(connect))
            .await
            .map_err(|e| StoreError::from_etcd("connecting to etcd", e))
    }

    async fn timed_store<T>(
        &self,
        what: &str,
        request: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.timeout, request)
            .await
            .unwrap_or_else(|_| {
                Err(StoreError(format!(
                    "{what}: no answer within {} ms",
                    self.timeout.as_millis()
                )))
            })
    }

    async fn timed<T>(
        &self,
        what: &str,
        request: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, request).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(StoreError::from_etcd(what, e)),
            Err(_) => Err(StoreError(format!(
                "{what}: no answer within {} ms",
                self.timeout.as_millis()
            ))),
        }
    }
}

fn entry(kv: &etcd_client::KeyValue) -> Option<Entry> {
    Some(Entry {
        key: kv.key_str().ok()?.to_string(),
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        lease: kv.lease(),
    })
}

impl Store for Etcd {
    type Watch = EtcdWatch;

    async fn grant(&mut self, ttl: i64) -> Result<i64, StoreError> {
        let mut client = self.client.clone();
        let granted = self
            .timed("granting a lease", client.lease_grant(ttl, None))
            .await?;
        Ok(granted.id())
    }

    async fn keep_alive(&mut self, lease: i64) -> Result<bool, StoreError> {
        if self.keeper.as_ref().map(|(id, _)| *id) != Some(lease) {
            let mut client = self.client.clone();
            let what = "keeping the lease alive";
            let opened = self
                .timed_store(what, async {
                    match client.lease_keep_alive(lease).await {
                        Ok(pair) => Ok(Some(pair)),
                        // etcd answered the stream's first renewal with no time left: the
                        // lease expired (a gateway cut off for longer than its TTL). An
                        // answer, not a failure: the gateway must take a new lease, not
                        // wait for the store.
                        Err(etcd_client::Error::LeaseKeepAliveError(why))
                            if why == "lease not found" =>
                        {
                            Ok(None)
                        }
                        Err(e) => Err(StoreError::from_etcd(what, e)),
                    }
                })
                .await?;
            let Some(pair) = opened else {
                return Ok(false);
            };
            self.keeper = Some((lease, Box::new(pair)));
        }
        let timeout = self.timeout;
        let Some((_, pair)) = self.keeper.as_mut() else {
            return Err(StoreError("no lease keeper".into()));
        };
        let (keeper, stream) = &mut **pair;
        let renewed = tokio::time::timeout(timeout, async {
            keeper.keep_alive().await?;
            stream.message().await
        })
        .await;
        match renewed {
            Ok(Ok(Some(answer))) => Ok(answer.ttl() > 0),
            Ok(Ok(None)) => {
                self.keeper = None;
                Err(StoreError(
                    "keeping the lease alive: the stream ended".into(),
                ))
            }
            Ok(Err(e)) => {
                self.keeper = None;
                Err(StoreError::from_etcd("keeping the lease alive", e))
            }
            Err(_) => {
                self.keeper = None;
                Err(StoreError(format!(
                    "keeping the lease alive: no answer within {} ms",
                    timeout.as_millis()
                )))
            }
        }
    }

    async fn revoke(&mut self, lease: i64) -> Result<(), StoreError> {
        self.keeper = None;
        let mut client = self.client.clone();
        self.timed("revoking the lease", client.lease_revoke(lease))
            .await
            .map(drop)
    }

    async fn put(&mut self, key: &str, value: Vec<u8>, lease: i64) -> Result<(), StoreError> {
        let mut client = self.client.clone();
        let options = PutOptions::new().with_lease(lease);
        self.timed("writing the record", client.put(key, value, Some(options)))
            .await
            .map(drop)
    }

    async fn delete(&mut self, key: &str) -> Result<(), StoreError> {
        let mut client = self.client.clone();
        self.timed("deleting a key", client.delete(key, None))
            .await
            .map(drop)
    }

    async fn claim(&mut self, key: &str, value: Vec<u8>, lease: i64) -> Result<Claim, StoreError> {
        let put = || {
            TxnOp::put(
                key,
                value.clone(),
                Some(PutOptions::new().with_lease(lease)),
            )
        };
        // Ours already, else free (a missing key compares as lease 0), else who holds it.
        let free = Txn::new()
            .when([Compare::lease(key, CompareOp::Equal, 0)])
            .and_then([put()])
            .or_else([TxnOp::get(key, None)]);
        let txn = Txn::new()
            .when([Compare::lease(key, CompareOp::Equal, lease)])
            .and_then([put()])
            .or_else([TxnOp::txn(free)]);
        let mut client = self.client.clone();
        let answer = self
            .timed("claiming the gateway's name", client.txn(txn))
            .await?;
        let revision = answer.header().map_or(0, |h| h.revision());
        if answer.succeeded() {
            return Ok(Claim::Written { revision });
        }
        let inner = answer.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Txn(t) => Some(t),
            _ => None,
        });
        let Some(inner) = inner else {
            return Err(StoreError(
                "claiming the gateway's name: an answer without its second part".into(),
            ));
        };
        if inner.succeeded() {
            return Ok(Claim::Written { revision });
        }
        let held = inner.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Get(got) => got.kvs().first().and_then(entry),
            _ => None,
        });
        match held {
            Some(entry) => Ok(Claim::Held { entry, revision }),
            // Gone between the comparison and the read cannot be: one transaction.
            None => Err(StoreError(
                "claiming the gateway's name: held, but not found".into(),
            )),
        }
    }

    async fn list(&mut self, prefix: &str) -> Result<Listing, StoreError> {
        let mut client = self.client.clone();
        let got = self
            .timed(
                "listing the fleet",
                client.get(prefix, Some(GetOptions::new().with_prefix())),
            )
            .await?;
        Ok(Listing {
            entries: got.kvs().iter().filter_map(entry).collect(),
            revision: got.header().map_or(0, |h| h.revision()),
        })
    }

    async fn watch(&mut self, prefix: &str, revision: i64) -> Result<EtcdWatch, StoreError> {
        let mut client = self.client.clone();
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision);
        let stream = self
            .timed("watching the fleet", client.watch(prefix, Some(options)))
            .await?;
        Ok(EtcdWatch { stream })
    }

    async fn campaign(
        &mut self,
        name: &str,
        value: &str,
        lease: i64,
    ) -> Result<Leadership, StoreError> {
        let mut client = self.client.clone();
        let mut won = client
            .campaign(name, value, lease)
            .await
            .map_err(|e| StoreError::from_etcd("standing in the site's election", e))?;
        won.take_leader()
            .map(Leadership)
            .ok_or_else(|| StoreError("the election answered without a leader key".into()))
    }

    async fn resign(&mut self, leadership: Leadership) -> Result<(), StoreError> {
        let mut client = self.client.clone();
        let options = ResignOptions::new().with_leader(leadership.0);
        self.timed("resigning", client.resign(Some(options)))
            .await
            .map(drop)
    }

    async fn reconnect(&mut self) -> Result<(), StoreError> {
        self.keeper = None;
        let options = self.options.clone();
        self.client = self
            .timed_store("reconnecting", Self::client(&options))
            .await?;
        Ok(())
    }
}

/// How long a member has to accept a TCP connection to be put in a new client.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// The members of `endpoints` that accept a TCP connection within [`PROBE_TIMEOUT`], in
/// their order; all of them when none does (the requests then say why). The client spreads
/// requests over its members, so one that is down would take its share of them, each
/// failing, however many others answer; it is left out until the next reconnection.
async fn answering_members(endpoints: &[String]) -> Vec<String> {
    let mut probes = tokio::task::JoinSet::new();
    for (i, endpoint) in endpoints.iter().enumerate() {
        let authority = authority(endpoint).to_string();
        probes.spawn(async move {
            let connect = tokio::net::TcpStream::connect(authority);
            (
                i,
                matches!(
                    tokio::time::timeout(PROBE_TIMEOUT, connect).await,
                    Ok(Ok(_))
                ),
            )
        });
    }
    let mut answers = vec![false; endpoints.len()];
    while let Some(joined) = probes.join_next().await {
        if let Ok((i, answered)) = joined {
            answers[i] = answered;
        }
    }
    let answering: Vec<String> = endpoints
        .iter()
        .zip(&answers)
        .filter(|(_, answered)| **answered)
        .map(|(endpoint, _)| endpoint.clone())
        .collect();
    if answering.is_empty() {
        endpoints.to_vec()
    } else {
        answering
    }
}

/// `host:port` of an endpoint written `https://host:port`, `host:port` or with a path.
fn authority(endpoint: &str) -> &str {
    let rest = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest)
}

/// A watch on etcd.
pub struct EtcdWatch {
    stream: WatchStream,
}

impl std::fmt::Debug for EtcdWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdWatch").finish_non_exhaustive()
    }
}

impl WatchEvents for EtcdWatch {
    async fn next(&mut self) -> Result<Watched, StoreError> {
        loop {
            let Some(answer) = self
                .stream
                .message()
                .await
                .map_err(|e| StoreError::from_etcd("watching the fleet", e))?
            else {
                return Err(StoreError("watching the fleet: the stream ended".into()));
            };
            if answer.compact_revision() > 0 {
                return Ok(Watched::Compacted);
            }
            if answer.canceled() {
                return Err(StoreError(format!(
                    "watching the fleet: cancelled by etcd ({})",
                    answer.cancel_reason()
                )));
            }
            let changes: Vec<Change> = answer
                .events()
                .iter()
                .filter_map(|event| {
                    let kv = event.kv()?;
                    match event.event_type() {
                        EventType::Put => entry(kv).map(Change::Put),
                        EventType::Delete => kv.key_str().ok().map(|k| Change::Delete {
                            key: k.to_string(),
                            revision: kv.mod_revision(),
                        }),
                    }
                })
                .collect();
            if !changes.is_empty() {
                return Ok(Watched::Changes(changes));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{answering_members, authority};

    #[test]
    fn an_endpoints_authority_is_its_host_and_port() {
        assert_eq!(authority("https://192.0.2.11:2379"), "192.0.2.11:2379");
        assert_eq!(authority("http://etcd.test:2379/v3"), "etcd.test:2379");
        assert_eq!(authority("[::1]:2379"), "[::1]:2379");
    }

    /// A member that refuses connections is left out of a new client; when none answers,
    /// all are kept (so the requests say why).
    #[test]
    fn a_new_client_leaves_out_members_that_refuse() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let listening = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let up = format!("https://{}", listening.local_addr().unwrap());
        // A port that was bound and is closed again: connections to it are refused.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let down = format!("https://{}", closed.local_addr().unwrap());
        drop(closed);
        runtime.block_on(async {
            let both = [down.clone(), up.clone()];
            assert_eq!(answering_members(&both).await, vec![up]);
            assert_eq!(answering_members(&both[..1]).await, vec![down]);
        });
    }
}
