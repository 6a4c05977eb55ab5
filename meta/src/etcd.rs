//! The etcd backend (v3 API). Every key lives under a prefix; a compare-and-swap is a
//! transaction on the key's `mod_revision`; a write's revision is etcd's, which grows with
//! every write to the etcd cluster and survives restarts.

use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, Txn, TxnOp};

use crate::{Call, Error, MetaStore, Revision};

/// A connection to an etcd cluster.
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    endpoints: Vec<String>,
    prefix: String,
    timeout: Duration,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl EtcdStore {
    /// Connects to the etcd cluster at `endpoints` (`http://host:port`), keeping this
    /// cluster's keys under `prefix`; every call gets `timeout`.
    pub async fn connect(
        endpoints: &[String],
        prefix: &str,
        timeout: Duration,
    ) -> Result<EtcdStore, Error> {
        let name = endpoints.join(",");
        let options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout);
        let connecting = Client::connect(endpoints, Some(options));
        let client = match tokio::time::timeout(timeout, connecting).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => {
                return Err(Error::Unavailable {
                    store: name,
                    reason: e.to_string(),
                })
            }
            Err(_) => {
                return Err(Error::Unavailable {
                    store: name,
                    reason: format!("no answer within {} ms", timeout.as_millis()),
                })
            }
        };
        Ok(EtcdStore {
            client,
            endpoints: endpoints.to_vec(),
            prefix: prefix.trim_end_matches('/').to_string(),
            timeout,
        })
    }

    fn key(&self, key: &str) -> String {
        format!("{}/{key}", self.prefix)
    }

    /// `call` within the timeout; its errors as [`Error::Unavailable`].
    async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(e)) => Err(Error::Unavailable {
                store: self.describe(),
                reason: e.to_string(),
            }),
            Err(_) => Err(Error::Unavailable {
                store: self.describe(),
                reason: format!("no answer within {} ms", self.timeout.as_millis()),
            }),
        }
    }

    fn corrupt(&self, reason: String) -> Error {
        Error::Corrupt {
            store: self.describe(),
            reason,
        }
    }
}

impl MetaStore for EtcdStore {
    fn describe(&self) -> String {
        format!("etcd {}", self.endpoints.join(","))
    }

    fn get<'a>(&'a self, key: &'a str) -> Call<'a, Option<(String, Revision)>> {
        Box::pin(async move {
            let mut client = self.client.clone();
            let full = self.key(key);
            let answer = self.bounded(client.get(full.as_str(), None)).await?;
            let Some(kv) = answer.kvs().first() else {
                return Ok(None);
            };
            let value = kv
                .value_str()
                .map_err(|e| self.corrupt(format!("{full}: {e}")))?
                .to_string();
            Ok(Some((value, kv.mod_revision() as Revision)))
        })
    }

    fn put_if<'a>(
        &'a self,
        key: &'a str,
        expected: Option<Revision>,
        value: &'a str,
    ) -> Call<'a, Revision> {
        Box::pin(async move {
            let mut client = self.client.clone();
            let full = self.key(key);
            let compare = match expected {
                Some(revision) => {
                    Compare::mod_revision(full.as_str(), CompareOp::Equal, revision as i64)
                }
                None => Compare::create_revision(full.as_str(), CompareOp::Equal, 0),
            };
            let txn = Txn::new()
                .when([compare])
                .and_then([TxnOp::put(full.as_str(), value, None)])
                .or_else([TxnOp::get(full.as_str(), None)]);
            let answer = self.bounded(client.txn(txn)).await?;
            if !answer.succeeded() {
                let found = answer.op_responses().into_iter().find_map(|r| match r {
                    etcd_client::TxnOpResponse::Get(get) => {
                        get.kvs().first().map(|kv| kv.mod_revision())
                    }
                    _ => None,
                });
                return Err(Error::Conflict {
                    store: self.describe(),
                    key: key.to_string(),
                    expected,
                    found: found.map(|r| r as Revision),
                });
            }
            let revision = answer
                .header()
                .map(|h| h.revision())
                .ok_or_else(|| self.corrupt("a write came back without a revision".into()))?;
            Ok(revision as Revision)
        })
    }
}
