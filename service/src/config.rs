//! `nodes.toml`: the cluster's shape — shards and their addresses and data directories, the
//! dataset's fields, placement parameters, the router's address and timeouts.
//!
//! ```toml
//! [cluster]
//! shards = 2
//! extent_records = 64        # optional: consecutive records per extent
//! seed = 0                   # optional: placement seed
//! replicas = 1               # optional: nodes holding each shard (production wants 2+)
//!
//! [[field]]
//! name = "image"
//! compress = "raw"           # or "flate", "zstd", "zstd:LEVEL"
//!
//! [[shard]]
//! id = 0
//! addr = "127.0.0.1:7100"
//! data = "zr-data/shard-0"   # optional, default ./zr-data/shard-<id>[-r<replica>]
//! replica = 0                # optional: which of the shard's replicas (0..replicas)
//!
//! [router]
//! listen = "127.0.0.1:7000"
//! timeout_ms = 10000         # optional: every network wait
//! reply_budget_mib = 1024    # optional: gather reply bytes held at once (see ops/README)
//! request_budget_mib = 2048  # optional: request bytes held at once, a half to one identity
//!
//! [tls]
//! certs = "certs"            # the directory `zr cluster-init` made: ca.pem, node.pem, ...
//! ```
//! A malformed or inconsistent file is refused with a message naming the problem. Relative
//! paths are relative to the working directory. Without `[tls]` the binaries refuse to start
//! unless given `--insecure-dev`.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use zr_net::Error;
use zr_net::Security;
use zr_proto::placement::{ClusterMap, Placement, EXTENT_RECORDS_DEFAULT, SHARDS_MAX};

pub use zr_net::{CLIENT_TIMEOUT_MS_DEFAULT, TIMEOUT_MS_DEFAULT};

/// The whole file.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    pub cluster: ClusterSection,
    #[serde(default, rename = "field")]
    pub fields: Vec<FieldConfig>,
    #[serde(default, rename = "shard")]
    pub shards: Vec<ShardConfig>,
    pub router: RouterConfig,
    #[serde(default)]
    pub node: NodeConfig,
    /// Where the cluster's metadata lives; absent: an embedded store in `zr-data/metadata`.
    #[serde(default)]
    pub metadata: Option<MetadataConfig>,
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// Where the configuration came from (for messages).
    #[serde(skip)]
    pub origin: String,
}

/// `[tls]`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// Certificate directory: `ca.pem` and each role's `.pem` and `.key`.
    pub certs: PathBuf,
}

/// `[cluster]`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    pub shards: u32,
    #[serde(default = "default_extent")]
    pub extent_records: u64,
    #[serde(default)]
    pub seed: u64,
    /// Nodes holding each shard, each the same records at the same local indices.
    #[serde(default = "default_replicas")]
    pub replicas: u32,
}

fn default_replicas() -> u32 {
    1
}

/// Most replicas of a shard.
pub const REPLICAS_MAX: u32 = 8;

fn default_extent() -> u64 {
    EXTENT_RECORDS_DEFAULT
}

/// `[[field]]`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldConfig {
    pub name: String,
    #[serde(default = "default_compress")]
    pub compress: String,
}

fn default_compress() -> String {
    "raw".into()
}

/// `[[shard]]`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardConfig {
    pub id: u32,
    /// Which of the shard's replicas this node is (`0..replicas`).
    #[serde(default)]
    pub replica: u32,
    pub addr: SocketAddr,
    #[serde(default)]
    pub data: Option<PathBuf>,
    /// Where the node serves Prometheus metrics (`--metrics` overrides it; off if neither).
    #[serde(default)]
    pub metrics: Option<SocketAddr>,
}

/// `[metadata]`: the consensus store that holds the cluster's id, map and committed length.
/// One of `dir` (an embedded store on this host) or `etcd` (endpoints of an etcd cluster).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetadataConfig {
    /// A directory for the embedded store (one host: every router must see the same one).
    #[serde(default)]
    pub dir: Option<PathBuf>,
    /// etcd client URLs, e.g. `["http://10.0.0.5:2379"]`.
    #[serde(default)]
    pub etcd: Vec<String>,
    /// Where this cluster's keys live in etcd (default `/zrecord`): one prefix per cluster.
    #[serde(default)]
    pub prefix: Option<String>,
}

/// Where the metadata store is, as routers and nodes open it.
pub use zr_meta::Location as MetadataLocation;

/// `[node]`: how every node reads its shard.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// `auto` (the default: through the memory mappings while a gather's pages are in
    /// memory, explicit reads at a deep queue otherwise), `mmap` or `direct`.
    #[serde(default = "default_read")]
    pub read: String,
    /// Explicit reads bypass the page cache (`O_DIRECT`): for shards far larger than memory,
    /// on hosts that run other work.
    #[serde(default)]
    pub uncached: bool,
    /// Where each node appends its audit log (the access-control refusals of one-hop reads;
    /// see `zr_service::audit`): `{shard}` and `{replica}` in it are replaced by the node's,
    /// so nodes sharing a host and a nodes.toml keep files of their own. None if unset.
    #[serde(default)]
    pub audit_log: Option<String>,
    /// MiB per second one client certificate's requests and replies may move through this
    /// node, over all its connections (routers are not limited); no limit if unset.
    #[serde(default)]
    pub mib_per_second_per_identity: Option<u64>,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            read: default_read(),
            uncached: false,
            audit_log: None,
            mib_per_second_per_identity: None,
        }
    }
}

impl NodeConfig {
    /// The audit log of shard `shard`'s replica `replica`, if nodes keep one.
    pub fn audit_path(&self, shard: u32, replica: u32) -> Option<PathBuf> {
        self.audit_log.as_ref().map(|pattern| {
            PathBuf::from(
                pattern
                    .replace("{shard}", &shard.to_string())
                    .replace("{replica}", &replica.to_string()),
            )
        })
    }
}

fn default_read() -> String {
    "auto".into()
}

/// The read paths `[node] read` may name.
pub const READ_PATHS: [&str; 3] = ["auto", "mmap", "direct"];

/// `[router]`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouterConfig {
    pub listen: SocketAddr,
    #[serde(default = "default_timeout")]
    pub timeout_ms: u64,
    /// Where the router serves Prometheus metrics (`--metrics` overrides it; off if neither).
    #[serde(default)]
    pub metrics: Option<SocketAddr>,
    /// MiB of gather replies the router holds at once, over all clients (received from
    /// nodes, not yet acknowledged by the client); a gather holds at most 72 MiB of it.
    #[serde(default = "default_reply_budget")]
    pub reply_budget_mib: u64,
    /// MiB of requests the router reads or handles at once, over all clients: one identity
    /// (certificate) holds at most half of it, readers together at most three quarters, so
    /// that writers and operators always find room.
    #[serde(default = "default_request_budget")]
    pub request_budget_mib: u64,
    /// Requests one client certificate has in flight at once at this router, over all its
    /// connections (waiting gathers count until their wait ends); its next ones are read as
    /// these are answered, so one job's flood waits on itself, not on others.
    #[serde(default = "default_requests_per_identity")]
    pub requests_per_identity: usize,
    /// MiB per second one client certificate's requests and replies may move through this
    /// router, over all its connections, so that one job cannot take another's bandwidth; no
    /// limit if unset. (Its one-hop reads are bounded by `[node]`'s.)
    #[serde(default)]
    pub mib_per_second_per_identity: Option<u64>,
    /// Where the router appends its audit log (admin actions, commits, refused requests;
    /// see `zr_service::audit`); none if unset. A path that cannot be written stops the
    /// router at start, naming it.
    #[serde(default)]
    pub audit_log: Option<std::path::PathBuf>,
}

fn default_requests_per_identity() -> usize {
    zr_net::REQUESTS_PER_IDENTITY_DEFAULT
}

/// A `mib_per_second_per_identity` in bytes per second.
pub fn bytes_per_second(mib: Option<u64>) -> Option<u64> {
    mib.map(|mib| mib.saturating_mul(1 << 20))
}

/// The default of `[router] request_budget_mib`.
pub const REQUEST_BUDGET_MIB_DEFAULT: u64 = 2048;

fn default_request_budget() -> u64 {
    REQUEST_BUDGET_MIB_DEFAULT
}

/// The default of `[router] reply_budget_mib`.
pub const REPLY_BUDGET_MIB_DEFAULT: u64 = 1024;

fn default_reply_budget() -> u64 {
    REPLY_BUDGET_MIB_DEFAULT
}

fn default_timeout() -> u64 {
    TIMEOUT_MS_DEFAULT
}

impl ClusterConfig {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<ClusterConfig, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Config {
            path: path.display().to_string(),
            reason: format!("cannot read: {e}"),
        })?;
        ClusterConfig::parse(&text, &path.display().to_string())
    }

    /// Parses and checks `text` (`origin` names it in errors).
    pub fn parse(text: &str, origin: &str) -> Result<ClusterConfig, Error> {
        let bad = |reason: String| Error::Config {
            path: origin.to_string(),
            reason,
        };
        let mut config: ClusterConfig =
            toml::from_str(text).map_err(|e| bad(e.to_string().trim().replace('\n', " ")))?;
        config.origin = origin.to_string();
        let n = config.cluster.shards;
        if n == 0 || n > SHARDS_MAX {
            return Err(bad(format!(
                "cluster.shards is {n}; it must be 1..={SHARDS_MAX}"
            )));
        }
        let r = config.cluster.replicas;
        if r == 0 || r > REPLICAS_MAX {
            return Err(bad(format!(
                "cluster.replicas is {r}; it must be 1..={REPLICAS_MAX}"
            )));
        }
        if config.shards.len() != (n * r) as usize {
            return Err(bad(if r == 1 {
                format!(
                    "cluster.shards is {n} but {} [[shard]] entries are given",
                    config.shards.len()
                )
            } else {
                format!(
                    "cluster.shards is {n} and cluster.replicas {r}, so {} [[shard]] entries are needed (one per shard and replica), but {} are given",
                    n * r,
                    config.shards.len()
                )
            }));
        }
        let mut addrs = HashSet::new();
        for id in 0..n {
            for replica in 0..r {
                let entries = config
                    .shards
                    .iter()
                    .filter(|s| s.id == id && s.replica == replica)
                    .count();
                let name = if r == 1 {
                    format!("shard {id}")
                } else {
                    format!("shard {id} replica {replica}")
                };
                match entries {
                    0 => {
                        return Err(bad(format!(
                            "{name} is missing (ids must be 0..{n}, replicas 0..{r})"
                        )))
                    }
                    1 => {}
                    _ => return Err(bad(format!("{name} is given {entries} times"))),
                }
            }
        }
        for shard in &config.shards {
            if !addrs.insert(shard.addr) {
                return Err(bad(format!("address {} is used by two nodes", shard.addr)));
            }
        }
        if addrs.contains(&config.router.listen) {
            return Err(bad(format!(
                "router.listen {} is also a shard's address",
                config.router.listen
            )));
        }
        if config.fields.is_empty() {
            return Err(bad(
                "no [[field]] given: the dataset needs at least one".into()
            ));
        }
        if let Some(metadata) = &config.metadata {
            if metadata.dir.is_some() != metadata.etcd.is_empty() {
                return Err(bad(
                    "[metadata] needs exactly one of dir (an embedded store on this host) or etcd (endpoints)".into(),
                ));
            }
        }
        if !READ_PATHS.contains(&config.node.read.as_str()) {
            return Err(bad(format!(
                "node.read is '{}'; it must be one of {}",
                config.node.read,
                READ_PATHS.join(", ")
            )));
        }
        for field in &config.fields {
            if let Err(e) = zr_proto::wire::parse_storage(&field.compress) {
                return Err(bad(format!("field '{}': {e}", field.name)));
            }
        }
        if config.router.timeout_ms == 0 {
            return Err(bad("router.timeout_ms must be at least 1".into()));
        }
        if !(4..=1 << 20).contains(&config.router.reply_budget_mib) {
            return Err(bad(format!(
                "router.reply_budget_mib must be 4..1048576, not {}",
                config.router.reply_budget_mib
            )));
        }
        if !(4..=1 << 20).contains(&config.router.request_budget_mib) {
            return Err(bad(format!(
                "router.request_budget_mib must be 4..1048576, not {}",
                config.router.request_budget_mib
            )));
        }
        for (section, rate) in [
            ("router", config.router.mib_per_second_per_identity),
            ("node", config.node.mib_per_second_per_identity),
        ] {
            if rate.is_some_and(|r| !(1..=1 << 20).contains(&r)) {
                return Err(bad(format!(
                    "{section}.mib_per_second_per_identity must be 1..1048576 (leave it out for no limit), not {}",
                    rate.unwrap_or_default()
                )));
            }
        }
        config.placement().map_err(|e| bad(e.to_string()))?;
        Ok(config)
    }

    /// The placement this configuration describes.
    pub fn placement(&self) -> Result<Placement, Error> {
        Ok(Placement::new(ClusterMap::balanced(
            self.cluster.shards,
            self.cluster.extent_records,
            self.cluster.seed,
        )?)?)
    }

    /// What a cluster process of `role` (named `process` in the log) needs to start: the
    /// configuration at `path` and its security. Logs the `--insecure-dev` warning.
    pub fn load_for(
        path: &Path,
        role: zr_net::tls::Role,
        insecure_dev: bool,
        process: &str,
    ) -> Result<(ClusterConfig, Security), Error> {
        let config = ClusterConfig::load(path)?;
        let security = config.security(role, insecure_dev)?;
        security.warn_if_insecure(process);
        Ok((config, security))
    }

    /// How a process of `role` secures its connections: the `[tls]` certificates, or no
    /// authentication at all if `insecure_dev` (the binaries' `--insecure-dev`).
    pub fn security(&self, role: zr_net::tls::Role, insecure_dev: bool) -> Result<Security, Error> {
        if insecure_dev {
            return Ok(Security::InsecureDev);
        }
        match &self.tls {
            Some(tls) => Security::load(&tls.certs, role),
            None => Err(Error::Config {
                path: self.origin.clone(),
                reason: "no [tls] section: create certificates with `zr cluster-init --shards S --dir DIR` (it writes a nodes.toml with [tls]), or pass --insecure-dev to run without authentication".into(),
            }),
        }
    }

    /// Where the metadata store is (see [`MetadataConfig`]).
    pub fn metadata_location(&self) -> MetadataLocation {
        match &self.metadata {
            Some(MetadataConfig {
                etcd,
                prefix,
                dir: None,
            }) if !etcd.is_empty() => MetadataLocation::Etcd {
                endpoints: etcd.clone(),
                prefix: prefix.clone().unwrap_or_else(|| "/zrecord".into()),
            },
            Some(MetadataConfig { dir: Some(dir), .. }) => MetadataLocation::Embedded(dir.clone()),
            _ => MetadataLocation::Embedded(PathBuf::from("zr-data/metadata")),
        }
    }

    /// Shard `id`'s entry (its replica 0).
    pub fn shard(&self, id: u32) -> Option<&ShardConfig> {
        self.node(id, 0)
    }

    /// The entry of shard `id`'s replica `replica`.
    pub fn node(&self, id: u32, replica: u32) -> Option<&ShardConfig> {
        self.shards
            .iter()
            .find(|s| s.id == id && s.replica == replica)
    }

    /// Shard `id`'s data directory (its replica 0).
    pub fn data_dir(&self, id: u32) -> PathBuf {
        self.node_data_dir(id, 0)
    }

    /// The data directory of shard `id`'s replica `replica`.
    pub fn node_data_dir(&self, id: u32, replica: u32) -> PathBuf {
        self.node(id, replica)
            .and_then(|s| s.data.clone())
            .unwrap_or_else(|| PathBuf::from(default_data_dir(id, replica)))
    }
}

/// The nodes.toml `zr cluster-init` writes: `shards` shards of `replicas` nodes each on
/// 127.0.0.1, the router on `base_port` and node N (shard K, replica J: N = K·replicas + J) on
/// `base_port + 1 + N`, data in `dir/data/shard-K` (replica 0) or `dir/data/shard-K-rJ`,
/// certificates in `certs`, and `fields` as (name, storage: "raw", "flate", "zstd[:LEVEL]"). Paths are written as
/// given (make them absolute so the file works from any directory).
pub fn cluster_toml(
    shards: u32,
    replicas: u32,
    base_port: u16,
    dir: &Path,
    certs: &Path,
    fields: &[(String, String)],
) -> String {
    let mut text = format!(
        "# A zrecord cluster made by `zr cluster-init`: {shards} shard(s) and a router on this\n\
         # machine. For real hosts, change the addresses and copy each process its files:\n\
         # certs/node/ to nodes, certs/router/ to routers, certs/reader/ (or writer/,\n\
         # operator/) to clients. Keep certs/ca/ (the CA's key) off the cluster.\n\n\
         [cluster]\nshards = {shards}\nreplicas = {replicas}\nextent_records = {EXTENT_RECORDS_DEFAULT}\nseed = 0\n\n"
    );
    for (name, compress) in fields {
        text.push_str(&format!(
            "[[field]]\nname = {}\ncompress = {}\n\n",
            toml_string(name),
            toml_string(compress)
        ));
    }
    for id in 0..shards {
        for replica in 0..replicas {
            let data = dir.join(default_data_dir(id, replica).replacen("zr-data", "data", 1));
            text.push_str(&format!(
                "[[shard]]\nid = {id}\nreplica = {replica}\naddr = \"127.0.0.1:{}\"\ndata = {}\n\n",
                base_port as u32 + 1 + id * replicas + replica,
                toml_string(&data.display().to_string())
            ));
        }
    }
    text.push_str(&format!(
        "[router]\nlisten = \"127.0.0.1:{base_port}\"\ntimeout_ms = {TIMEOUT_MS_DEFAULT}\n\n\
         # The cluster's id, map and committed length: an embedded store for one host (for\n\
         # several hosts, etcd = [\"http://HOST:2379\"] instead).\n\
         [metadata]\ndir = {}\n\n\
         [tls]\ncerts = {}\n",
        toml_string(&dir.join("metadata").display().to_string()),
        toml_string(&certs.display().to_string())
    ));
    text
}

/// Where a node keeps its data unless nodes.toml says: `zr-data/shard-K` (replica 0), or
/// `zr-data/shard-K-rJ`.
fn default_data_dir(id: u32, replica: u32) -> String {
    if replica == 0 {
        format!("zr-data/shard-{id}")
    } else {
        format!("zr-data/shard-{id}-r{replica}")
    }
}

fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
        [cluster]
        shards = 2
        [[field]]
        name = "x"
        [[shard]]
        id = 0
        addr = "127.0.0.1:7100"
        [[shard]]
        id = 1
        addr = "127.0.0.1:7101"
        data = "/tmp/s1"
        [router]
        listen = "127.0.0.1:7000"
    "#;

    #[test]
    fn parses_and_defaults() {
        let c = ClusterConfig::parse(GOOD, "nodes.toml").unwrap();
        assert_eq!(c.cluster.extent_records, EXTENT_RECORDS_DEFAULT);
        assert_eq!(c.router.timeout_ms, TIMEOUT_MS_DEFAULT);
        assert_eq!(c.data_dir(0), PathBuf::from("zr-data/shard-0"));
        assert_eq!(c.data_dir(1), PathBuf::from("/tmp/s1"));
    }

    #[test]
    fn cluster_init_file_parses_and_needs_certificates() {
        let fields = vec![("image".to_string(), "raw".to_string())];
        let text = cluster_toml(
            3,
            1,
            7300,
            Path::new("/srv/zr"),
            Path::new("/srv/zr/certs"),
            &fields,
        );
        let c = ClusterConfig::parse(&text, "nodes.toml").unwrap();
        assert_eq!(c.cluster.shards, 3);
        assert_eq!(c.router.listen.port(), 7300);
        assert_eq!(c.shard(2).unwrap().addr.port(), 7303);
        assert_eq!(c.data_dir(1), PathBuf::from("/srv/zr/data/shard-1"));
        assert_eq!(
            c.tls.as_ref().unwrap().certs,
            PathBuf::from("/srv/zr/certs")
        );
        // Replicas: one entry per shard and replica, each with its own port and directory.
        let replicated = cluster_toml(
            2,
            2,
            7300,
            Path::new("/srv/zr"),
            Path::new("/srv/zr/certs"),
            &fields,
        );
        let c = ClusterConfig::parse(&replicated, "nodes.toml").unwrap();
        assert_eq!((c.cluster.shards, c.cluster.replicas), (2, 2));
        assert_eq!(c.node(1, 1).unwrap().addr.port(), 7304);
        assert_eq!(
            c.node_data_dir(1, 1),
            PathBuf::from("/srv/zr/data/shard-1-r1")
        );
        assert_eq!(c.node_data_dir(1, 0), PathBuf::from("/srv/zr/data/shard-1"));
        // No [tls]: refused unless insecure on purpose.
        let bare = ClusterConfig::parse(GOOD, "nodes.toml").unwrap();
        let err = bare
            .security(zr_net::tls::Role::Node, false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("[tls]") && err.contains("--insecure-dev"),
            "{err}"
        );
        assert!(matches!(
            bare.security(zr_net::tls::Role::Node, true),
            Ok(Security::InsecureDev)
        ));
    }

    #[test]
    fn the_ops_example_is_valid() {
        let c =
            ClusterConfig::parse(include_str!("../../ops/nodes.toml"), "ops/nodes.toml").unwrap();
        assert_eq!(c.router.metrics, Some(([127, 0, 0, 1], 9100).into()));
        assert_eq!(
            c.shard(0).and_then(|s| s.metrics),
            Some(([127, 0, 0, 1], 9101).into())
        );
        assert_eq!(c.tls.unwrap().certs, PathBuf::from("certs"));
        assert_eq!(c.router.audit_log, None, "commented out");
        let audited =
            include_str!("../../ops/nodes.toml").replace("# audit_log = ", "audit_log = ");
        let audited = ClusterConfig::parse(&audited, "ops/nodes.toml").unwrap();
        assert_eq!(
            audited.router.audit_log,
            Some(PathBuf::from("zr-audit.log"))
        );
        let compose = ClusterConfig::parse(
            include_str!("../../ops/container/nodes.toml"),
            "ops/container/nodes.toml",
        )
        .unwrap();
        assert_eq!(compose.cluster.shards, 3);
        assert!(matches!(
            compose.metadata_location(),
            MetadataLocation::Etcd { .. }
        ));
    }

    #[test]
    fn problems_are_named() {
        for (edit, needle) in [
            (
                GOOD.replace("shards = 2", "shards = 3"),
                "3 but 2 [[shard]]",
            ),
            (GOOD.replace("id = 1", "id = 0"), "shard 0 is given 2 times"),
            (GOOD.replace("7101", "7100"), "used by two nodes"),
            (
                GOOD.replace("shards = 2", "shards = 2\nreplicas = 2"),
                "4 [[shard]] entries are needed",
            ),
            (
                GOOD.replace("shards = 2", "shards = 2\nreplicas = 0"),
                "cluster.replicas is 0",
            ),
            (
                GOOD.replace("[[field]]\n        name = \"x\"", ""),
                "no [[field]]",
            ),
            (GOOD.replace("127.0.0.1:7000", "nowhere"), "listen"),
            (GOOD.replace("[router]", "[routr]"), "routr"),
            (
                GOOD.replace("[router]", "[router]\nreply_budget_mib = 1"),
                "reply_budget_mib must be 4..1048576, not 1",
            ),
            (
                GOOD.replace("[router]", "[router]\nrequest_budget_mib = 0"),
                "request_budget_mib must be 4..1048576, not 0",
            ),
            (
                format!("{GOOD}\n[node]\nread = \"fast\"\n"),
                "node.read is 'fast'",
            ),
            (
                GOOD.replace("[router]", "[router]\nmib_per_second_per_identity = 0"),
                "router.mib_per_second_per_identity must be 1..1048576 (leave it out for no limit), not 0",
            ),
            (
                format!("{GOOD}\n[node]\nmib_per_second_per_identity = -1\n"),
                "mib_per_second_per_identity",
            ),
            (
                format!("{GOOD}\n[metadata]\nprefix = \"/x\"\n"),
                "exactly one of dir",
            ),
        ] {
            let err = ClusterConfig::parse(&edit, "nodes.toml")
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(needle) && err.starts_with("nodes.toml"),
                "{needle}: {err}"
            );
        }
    }
}
