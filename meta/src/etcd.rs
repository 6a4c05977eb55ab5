//! The etcd backend (v3 API), spoken through etcd's JSON gateway (`POST /v3/kv/range`,
//! `/v3/kv/txn`: the same calls as gRPC, as JSON over HTTP/1.1). zrecord needs two calls —
//! a read and a compare-and-swap — and the gateway serves them from every etcd since 3.4
//! with no generated code, so building zrecord needs no `protoc`.
//!
//! Every key lives under a prefix; a compare-and-swap is a transaction on the key's
//! `mod_revision` (or, to create, on its `create_revision` being 0); a write's revision is
//! etcd's, which grows with every write to the etcd cluster and survives restarts. Keys and
//! values cross base64-encoded and 64-bit integers as strings, as the gateway's JSON
//! mapping of the protocol has them. Each call tries the endpoints in turn until one
//! answers.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

use crate::{Call, Error, MetaStore, Revision};

/// Most bytes of a gateway answer read (the calls here return one small key).
const ANSWER_BYTES_MAX: usize = 16 << 20;

/// A connection to an etcd cluster.
#[derive(Clone)]
pub struct EtcdStore {
    http: Client<HttpConnector, Full<Bytes>>,
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

/// Why one endpoint did not answer a call.
#[derive(Debug, thiserror::Error)]
enum PostFailed {
    #[error("{0}")]
    Request(#[from] hyper::http::Error),
    #[error("{0}")]
    Connect(String),
    #[error("reading the answer: {0}")]
    Reading(String),
    #[error("HTTP {status}, not etcd's JSON ({error}): {start}")]
    NotJson {
        status: hyper::StatusCode,
        error: serde_json::Error,
        start: String,
    },
    #[error("HTTP {status}: {message}")]
    Status {
        status: hyper::StatusCode,
        message: String,
    },
}

impl EtcdStore {
    /// Connects to the etcd cluster at `endpoints` (`http://host:port`), keeping this
    /// cluster's keys under `prefix`; every call gets `timeout`. Fails, naming the
    /// endpoints, if none answers.
    pub async fn connect(
        endpoints: &[String],
        prefix: &str,
        timeout: Duration,
    ) -> Result<EtcdStore, Error> {
        let name = endpoints.join(",");
        if let Some(bad) = endpoints.iter().find(|e| !e.starts_with("http://")) {
            return Err(Error::Unavailable {
                store: name,
                reason: format!(
                    "endpoint {bad}: give etcd's client URL as http://HOST:PORT (TLS to etcd is not offered)"
                ),
            });
        }
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        connector.set_nodelay(true);
        let http = Client::builder(TokioExecutor::new()).build(connector);
        let store = EtcdStore {
            http,
            endpoints: endpoints
                .iter()
                .map(|e| e.trim_end_matches('/').to_string())
                .collect(),
            prefix: prefix.trim_end_matches('/').to_string(),
            timeout,
        };
        // One answer proves an endpoint speaks etcd's v3 gateway.
        store.call("/v3/maintenance/status", json!({})).await?;
        Ok(store)
    }

    fn key(&self, key: &str) -> String {
        format!("{}/{key}", self.prefix)
    }

    /// `path` with `body`, at the first endpoint that answers within the timeout; its JSON
    /// answer, or [`Error::Unavailable`] saying why each failed.
    async fn call(&self, path: &str, body: Value) -> Result<Value, Error> {
        let body = Bytes::from(body.to_string());
        let mut reasons = Vec::new();
        for endpoint in &self.endpoints {
            let attempt = self.post(endpoint, path, body.clone());
            match tokio::time::timeout(self.timeout, attempt).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(reason)) => reasons.push(format!("{endpoint}: {reason}")),
                Err(_) => reasons.push(format!(
                    "{endpoint}: no answer within {} ms",
                    self.timeout.as_millis()
                )),
            }
        }
        Err(Error::Unavailable {
            store: self.describe(),
            reason: reasons.join("; "),
        })
    }

    async fn post(&self, endpoint: &str, path: &str, body: Bytes) -> Result<Value, PostFailed> {
        let request = hyper::Request::post(format!("{endpoint}{path}"))
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))?;
        let answer = self.http.request(request).await.map_err(|e| {
            // The cause (connection refused, reset) says more than "client error".
            let mut text = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                text = format!("{text}: {cause}");
                source = cause.source();
            }
            PostFailed::Connect(text)
        })?;
        let status = answer.status();
        let body = http_body_util::Limited::new(answer.into_body(), ANSWER_BYTES_MAX)
            .collect()
            .await
            .map_err(|e| PostFailed::Reading(e.to_string()))?
            .to_bytes();
        let value: Value = serde_json::from_slice(&body).map_err(|e| PostFailed::NotJson {
            status,
            error: e,
            start: String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
        })?;
        if !status.is_success() {
            let message = value
                .get("message")
                .or_else(|| value.get("error"))
                .and_then(Value::as_str)
                .unwrap_or("no message")
                .to_string();
            return Err(PostFailed::Status { status, message });
        }
        Ok(value)
    }

    fn corrupt(&self, reason: String) -> Error {
        Error::Corrupt {
            store: self.describe(),
            reason,
        }
    }

    /// The first key-value of a range answer: (value, mod revision).
    fn first_kv(&self, range: &Value, full: &str) -> Result<Option<(String, Revision)>, Error> {
        let Some(kv) = range
            .get("kvs")
            .and_then(Value::as_array)
            .and_then(|kvs| kvs.first())
        else {
            return Ok(None);
        };
        let value = kv.get("value").and_then(Value::as_str).unwrap_or_default();
        let value = BASE64
            .decode(value)
            .map_err(|e| self.corrupt(format!("{full}: its value is not base64: {e}")))?;
        let value = String::from_utf8(value)
            .map_err(|e| self.corrupt(format!("{full}: its value is not UTF-8: {e}")))?;
        let revision = int(kv.get("mod_revision"))
            .ok_or_else(|| self.corrupt(format!("{full}: no mod_revision")))?;
        Ok(Some((value, revision)))
    }
}

/// A 64-bit integer of the gateway's JSON: a string of digits (or a plain number).
fn int(value: Option<&Value>) -> Option<u64> {
    match value? {
        Value::String(text) => text.parse().ok(),
        Value::Number(number) => number.as_u64(),
        _ => None,
    }
}

impl MetaStore for EtcdStore {
    fn describe(&self) -> String {
        format!("etcd {}", self.endpoints.join(","))
    }

    fn get(&self, key: &str) -> Call<'_, Option<(String, Revision)>> {
        let full = self.key(key);
        Box::pin(async move {
            let answer = self
                .call("/v3/kv/range", json!({ "key": BASE64.encode(&full) }))
                .await?;
            self.first_kv(&answer, &full)
        })
    }

    fn put_if(&self, key: &str, expected: Option<Revision>, value: &str) -> Call<'_, Revision> {
        let (full, key) = (self.key(key), key.to_string());
        let encoded = BASE64.encode(&full);
        let compare = match expected {
            Some(revision) => json!({
                "key": encoded, "result": "EQUAL", "target": "MOD",
                "mod_revision": revision.to_string(),
            }),
            None => json!({
                "key": encoded, "result": "EQUAL", "target": "CREATE",
                "create_revision": "0",
            }),
        };
        let txn = json!({
            "compare": [compare],
            "success": [{ "request_put": { "key": encoded, "value": BASE64.encode(value) } }],
            "failure": [{ "request_range": { "key": encoded } }],
        });
        Box::pin(async move {
            let answer = self.call("/v3/kv/txn", txn).await?;
            // The JSON mapping leaves out false.
            let succeeded = answer
                .get("succeeded")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            if !succeeded {
                let range = answer
                    .get("responses")
                    .and_then(Value::as_array)
                    .and_then(|r| r.first())
                    .and_then(|r| r.get("response_range"));
                let found = match range {
                    Some(range) => self.first_kv(range, &full)?.map(|(_, revision)| revision),
                    None => None,
                };
                return Err(Error::Conflict {
                    store: self.describe(),
                    key,
                    expected,
                    found,
                });
            }
            int(answer.get("header").and_then(|h| h.get("revision")))
                .ok_or_else(|| self.corrupt("a write came back without a revision".into()))
        })
    }
}
