//! `zr cluster-init`, and the `--router ADDR --certs DIR` options with which `convert`,
//! `info`, `gather` and `bench` act on a cluster instead of a dataset directory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use zr_common::Record;
use zr_net::tls::{self, Access, Role};
use zr_net::Security;
use zr_node::convert::{Destination, Target};
use zr_node::meta::FieldSpec;
use zr_node::Error;
use zr_router::MapChange;
use zr_router::{Client, ClientOptions};
use zr_service::config::{cluster_toml, CLIENT_TIMEOUT_MS_DEFAULT};

use crate::CliResult;

/// Where a command reads or writes: a dataset directory, or a cluster through its router.
#[derive(Args, Clone, Debug)]
pub struct RouterArgs {
    /// Act on a cluster through the router at ADDR instead of a dataset directory.
    #[arg(long, value_name = "ADDR")]
    pub router: Option<SocketAddr>,
    /// The certificates to connect with: the cluster's certificate directory (made by
    /// `zr cluster-init`), or one role's directory in it (e.g. certs/reader).
    #[arg(long, value_name = "DIR", requires = "router")]
    pub certs: Option<PathBuf>,
    /// Connect as this role: reader (gather, info, status), writer (also append, modify,
    /// delete, commit) or operator (everything). Default: the least role the command needs
    /// that --certs holds.
    #[arg(long, value_name = "reader|writer|operator", requires = "certs")]
    pub role: Option<Role>,
    /// Connect without a certificate (only a router run with --insecure-dev accepts it).
    #[arg(long, requires = "router", conflicts_with = "certs")]
    pub insecure_dev: bool,
    /// Milliseconds for every network wait (longer than the router's own timeout).
    #[arg(long, value_name = "MS", default_value_t = CLIENT_TIMEOUT_MS_DEFAULT)]
    pub timeout_ms: u64,
    /// The cluster's dataset to act on (`zr dataset list` shows them; default: the one
    /// `zr cluster-init` made, named default).
    #[arg(long, value_name = "NAME", requires = "router")]
    pub dataset: Option<String>,
    /// Gather through the router rather than straight from the nodes (by default a client
    /// reads one hop once the router has said where the records are; it falls back to the
    /// router by itself when it cannot reach the nodes).
    #[arg(long, requires = "router")]
    pub via_router: bool,
}

impl RouterArgs {
    /// A client of the router, if `--router` was given, connected with a role that may do
    /// what the command needs (`needs`).
    pub fn client(&self, needs: Access) -> Result<Option<Client>, Box<dyn std::error::Error>> {
        let Some(addr) = self.router else {
            return Ok(None);
        };
        let security = match (&self.certs, self.insecure_dev) {
            (Some(dir), _) => Security::load(dir, choose_role(dir, self.role, needs)?)?,
            (None, true) => Security::InsecureDev,
            (None, false) => {
                return Err(
                    "--router needs --certs DIR (the cluster's certificates from `zr cluster-init`), or --insecure-dev for a development cluster"
                        .into(),
                )
            }
        };
        let options = ClientOptions {
            timeout: Duration::from_millis(self.timeout_ms.max(1)),
            // Reads go one hop; a command that writes or administers only talks to the
            // router, so it makes no links to the nodes.
            direct: !self.via_router && needs == Access::Read,
            ..ClientOptions::default()
        };
        let client = Client::connect_with(addr, security, options)?;
        Ok(Some(match &self.dataset {
            Some(name) => client.dataset(name)?,
            None => client,
        }))
    }
}

/// The client role to connect with from certificate directory `dir`: `asked` if given (a
/// role that cannot do what is needed is refused here, before connecting), else the least
/// role that has `needs` and whose files `dir` holds.
pub fn choose_role(dir: &Path, asked: Option<Role>, needs: Access) -> Result<Role, String> {
    if let Some(role) = asked {
        return match role.access() {
            None => Err(format!(
                "--role {role}: a {role} certificate does not connect to routers; use reader, writer or operator"
            )),
            Some(has) if has < needs => Err(format!(
                "this command needs the {} role; --role {role} cannot do it",
                needs.role_name()
            )),
            Some(_) => Ok(role),
        };
    }
    Role::CLIENTS
        .into_iter()
        .filter(|r| r.access().is_some_and(|has| has >= needs))
        .find(|&r| tls::holds_role(dir, r))
        .ok_or_else(|| {
            format!(
                "{} holds no certificate that may do this: the command needs the {} role ({}.pem and its key, in {} or its {}/ directory)",
                dir.display(),
                needs.role_name(),
                needs.role_name(),
                dir.display(),
                needs.role_name()
            )
        })
}

/// The dataset directory or the router: exactly one must be given.
pub fn target_dir<'a>(
    dir: &'a Option<PathBuf>,
    router: &RouterArgs,
) -> Result<Option<&'a Path>, String> {
    match (dir, router.router) {
        (Some(dir), None) => Ok(Some(dir)),
        (None, Some(_)) => Ok(None),
        (Some(_), Some(_)) => Err("give a dataset directory or --router, not both".into()),
        (None, None) => Err("give a dataset directory, or --router ADDR --certs DIR".into()),
    }
}

/// Create a cluster's CA, certificates and a ready nodes.toml, for S shards on this machine.
///
/// DIR gets nodes.toml, certs/ and data/ (the shards' stores, created when the nodes first
/// start). certs/ holds a directory per role, each with ca.pem and that role's certificate
/// and key (keys readable by the owner only): ca/ (the CA's key: keep it off the cluster),
/// node/, router/, and for clients reader/ (gather, info, status: what a training job
/// needs), writer/ (also append, modify, delete, commit) and operator/ (everything: moves,
/// node replacement, scrub). Give each process only its role's directory. The router listens on --base-port and shard K on
/// base-port + 1 + K, all on 127.0.0.1; edit nodes.toml for real hosts and copy each process
/// its files (see ops/README.md). Refuses a DIR that already holds a cluster.
#[derive(Args)]
pub struct ClusterInitArgs {
    /// Number of shards.
    #[arg(long)]
    shards: u32,
    /// Nodes holding each shard (the same records on each): 1 keeps one copy; production
    /// wants 2 or more, so that a node's failure or a lost disk loses nothing.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=zr_service::config::REPLICAS_MAX as i64))]
    replicas: u32,
    /// Directory for nodes.toml, certs/ and data/.
    #[arg(long)]
    dir: PathBuf,
    /// The router's port; nodes take the next ones (shard K replica J: + 1 + K·replicas + J).
    #[arg(long, default_value_t = 7000)]
    base_port: u16,
    /// A field of the dataset, as NAME or NAME:flate (repeat for several; default data).
    #[arg(long = "field", value_name = "NAME[:raw|flate|zstd[:LEVEL]]")]
    fields: Vec<String>,
    /// Days the role certificates are valid (the CA: ten years); renew them before then
    /// with `zr cluster-renew`.
    #[arg(long, default_value_t = tls::CERT_VALID_DAYS, value_parser = clap::value_parser!(u32).range(1..=tls::CA_VALID_DAYS as i64))]
    days: u32,
}

/// Issue one more client certificate, of a role, under a name of its own.
///
/// Writes DIR/ROLE-NAME/ (ca.pem, ROLE.pem, ROLE.key) from the CA in DIR/ca: give it to one
/// job or person. Each certificate has its own allowance of router connections, so one
/// job's leaks cannot lock out another's. `zr cluster-renew` renews it with the others.
#[derive(Args)]
pub struct ClusterIssueArgs {
    /// The role: reader (gather, info, status), writer (also append, modify, delete,
    /// commit) or operator (everything).
    #[arg(long, value_name = "reader|writer|operator")]
    role: Role,
    /// Its name: a lower-case letter or digit, then up to 63 of those or '.', '_', '-'.
    #[arg(long)]
    name: String,
    /// The certificate directory (holding ca/ca.pem and ca/ca.key).
    #[arg(long)]
    certs: PathBuf,
    /// Days the certificate is valid (at most until the CA itself expires).
    #[arg(long, default_value_t = tls::CERT_VALID_DAYS, value_parser = clap::value_parser!(u32).range(1..=tls::CA_VALID_DAYS as i64))]
    days: u32,
}

pub fn issue(args: ClusterIssueArgs) -> CliResult {
    let home = tls::issue_cert(&args.certs, args.role, &args.name, args.days)?;
    let cert = home.join(format!("{}.pem", args.role.name()));
    let pem = std::fs::read(&cert).map_err(|e| format!("{}: {e}", cert.display()))?;
    let serial = tls::serial_of(&pem).map_err(|e| format!("{}: {e}", cert.display()))?;
    println!(
        "issued a {} certificate named {} in {} (valid for {} days), serial number {serial}",
        args.role,
        args.name,
        home.display(),
        args.days
    );
    Ok(())
}

/// Rebuild a cluster record lost from the metadata store, from the nodes.
///
/// A router that finds no cluster record while its nodes hold records refuses to start
/// (a new record would give the cluster a new id, and every node would refuse it). This
/// asks every node of nodes.toml which cluster and map version its data belongs to and how
/// many records it holds, and stores the record they agree on where nodes.toml's [metadata]
/// says; then start the routers. It talks to the nodes as a router does: run it with the
/// router's certificate (nodes.toml's [tls] certs, or --certs). Refused if a record exists,
/// a node does not answer or names another cluster, or the map changed by moves since the
/// cluster was made (only the lost record kept those: restore the store from a backup).
#[derive(Args)]
pub struct RestoreRecordArgs {
    /// The cluster's nodes.toml.
    #[arg(long, default_value = "nodes.toml", value_name = "PATH")]
    nodes: PathBuf,
    /// The certificate directory holding the router's certificate (default: nodes.toml's).
    #[arg(long, value_name = "DIR")]
    certs: Option<PathBuf>,
}

fn restore_record(args: RestoreRecordArgs) -> CliResult {
    let config = zr_service::config::ClusterConfig::load(&args.nodes)?;
    let security = match &args.certs {
        Some(dir) => Security::load(dir, Role::Router)?,
        None => config.security(Role::Router, false)?,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let timeout = Duration::from_millis(config.router.timeout_ms);
    let record = runtime.block_on(async {
        let meta = zr_meta::open(&config.metadata_location(), timeout).await?;
        let where_ = meta.describe();
        let restored = zr_router::restore_record(&config, security, meta).await?;
        Ok::<_, Box<dyn std::error::Error>>((restored, where_))
    })?;
    let (
        zr_router::Restored {
            record,
            committed,
            dicts,
            dicts_missing,
        },
        where_,
    ) = record;
    println!(
        "restored the record of cluster {} in {where_}: map version {}, {} records committed",
        record.id, record.map.version, record.committed_len
    );
    for dataset in &record.datasets {
        let fields: Vec<&str> = dataset.fields.iter().map(|f| f.name.as_str()).collect();
        println!(
            "  dataset '{}': {} records committed, fields {}",
            dataset.name,
            committed.get(&dataset.name).copied().unwrap_or(0),
            fields.join(", ")
        );
    }
    for (dataset, field) in &dicts {
        println!(
            "  dataset '{dataset}' field '{field}': its dictionary put back, read from a node"
        );
    }
    for missing in &dicts_missing {
        eprintln!("warning: {missing}");
    }
    println!("start the routers");
    Ok(())
}

/// Issue new certificates and keys from a cluster's CA for every one in its directory.
///
/// Replaces each role's certificate and key in the certificate directory (each role's
/// directory, those `zr cluster issue` added, or the flat files of an older cluster; each
/// file atomically), signed by ca/ca.pem with ca/ca.key. Running processes keep their
/// old certificates until restarted; old and new come from the same CA, so restart the
/// processes one at a time (nodes, then routers) and clients reconnect on their own. Copy the
/// new files to each host first (see ops/README.md). Processes warn in their log when their
/// certificate expires within 30 days.
#[derive(Args)]
pub struct ClusterRenewArgs {
    /// The certificate directory (holding ca/ca.pem and ca/ca.key), e.g. DIR/certs of `zr cluster-init`.
    #[arg(long)]
    certs: PathBuf,
    /// Days the new certificates are valid (at most until the CA itself expires).
    #[arg(long, default_value_t = tls::CERT_VALID_DAYS, value_parser = clap::value_parser!(u32).range(1..=tls::CA_VALID_DAYS as i64))]
    days: u32,
}

pub fn renew(args: ClusterRenewArgs) -> CliResult {
    let renewal = tls::renew_certs(&args.certs, args.days)?;
    println!(
        "issued new certificates in {}, valid until {} (UTC)",
        args.certs.display(),
        renewal.until.date()
    );
    if renewal.cut_to_ca {
        println!(
            "they end with the cluster CA, before the {} days asked: plan a new CA (`zr cluster-init`, see ops/README.md)",
            args.days
        );
    }
    println!("restart the processes one at a time (nodes, then routers) to take them up");
    Ok(())
}

pub fn init(args: ClusterInitArgs) -> CliResult {
    if args.shards == 0 {
        return Err("--shards must be at least 1".into());
    }
    if args.base_port as u32 + args.shards * args.replicas > u16::MAX as u32 {
        return Err(format!(
            "--base-port {} leaves no room for {} node ports",
            args.base_port,
            args.shards * args.replicas
        )
        .into());
    }
    let fields: Vec<(String, String)> = if args.fields.is_empty() {
        vec![("data".into(), "raw".into())]
    } else {
        args.fields
            .iter()
            .map(|f| match f.split_once(':') {
                Some((name, compress)) => (name.to_string(), compress.to_string()),
                None => (f.clone(), "raw".to_string()),
            })
            .collect()
    };
    std::fs::create_dir_all(&args.dir)
        .map_err(|e| format!("cannot create {}: {e}", args.dir.display()))?;
    let dir = args
        .dir
        .canonicalize()
        .map_err(|e| format!("{}: {e}", args.dir.display()))?;
    let config_path = dir.join("nodes.toml");
    if config_path.exists() {
        return Err(format!(
            "{} already exists: this directory holds a cluster; choose another --dir",
            config_path.display()
        )
        .into());
    }
    let certs = dir.join("certs");
    let text = cluster_toml(
        args.shards,
        args.replicas,
        args.base_port,
        &dir,
        &certs,
        &fields,
    );
    // Check the file before writing anything (bad field names, compressions).
    zr_service::config::ClusterConfig::parse(&text, &config_path.display().to_string())?;
    tls::init_certs(&certs, args.days)?;
    std::fs::write(&config_path, text)
        .map_err(|e| format!("cannot write {}: {e}", config_path.display()))?;
    let nodes = config_path.display();
    println!("created {nodes}");
    println!(
        "created {} (ca/, node/, router/, reader/, writer/, operator/; valid for {} days, then `zr cluster-renew`)",
        certs.display(),
        args.days
    );
    println!(
        "give each process only its role's directory; keep {} off the cluster",
        certs.join(tls::CA_DIR).display()
    );
    println!("start the cluster:");
    for shard in 0..args.shards {
        for replica in 0..args.replicas {
            if args.replicas == 1 {
                println!("  zr-node --shard {shard} --nodes {nodes} &");
            } else {
                println!("  zr-node --shard {shard} --replica {replica} --nodes {nodes} &");
            }
        }
    }
    println!("  zr-router --nodes {nodes} &");
    println!(
        "then, e.g.: zr info --router 127.0.0.1:{} --certs {}",
        args.base_port,
        certs.join("reader").display()
    );
    Ok(())
}

/// What `zr cluster` does with a running cluster.
#[derive(clap::Subcommand)]
pub enum ClusterCommand {
    Status(StatusArgs),
    Issue(ClusterIssueArgs),
    RestoreRecord(RestoreRecordArgs),
    ReplaceNode(ReplaceNodeArgs),
    AddShard(AddShardArgs),
    DrainShard(DrainShardArgs),
    Audit(crate::grants::AuditArgs),
    Revoke(crate::grants::RevokeArgs),
}

/// Add a shard to a running cluster, online, moving only the records it takes.
///
/// First add the new shard to nodes.toml (`shards = S + 1` and its [[shard]] entries, id S)
/// and start its nodes (`zr-node --shard S --nodes nodes.toml`, empty data directories).
/// Then run this command with that nodes.toml: routers started from an older one learn the
/// new nodes from the metadata store, no restart needed. It publishes the next cluster map, in which the new shard takes an even share of the slots
/// from the others; every node gaining slots builds them while gathers and appends go on
/// (their records sent from the shard holding them; the slots a shard keeps are not
/// touched), then the cluster switches to it with appends held for a moment. Modify
/// and delete wait for the move's end. Progress is shown; stopped anywhere (this command, the
/// router, a node), running it again finishes the move.
#[derive(Args)]
pub struct AddShardArgs {
    /// The updated nodes.toml, listing the new shard's nodes (routers started from an older
    /// one learn them from here, through the metadata store).
    #[arg(long, value_name = "PATH")]
    nodes: Option<PathBuf>,
    #[command(flatten)]
    rate: MoveRateArgs,
    #[command(flatten)]
    remote: RouterArgs,
}

/// How fast a move copies.
#[derive(Args)]
pub struct MoveRateArgs {
    /// Most MiB a second each node gaining slots copies their files at, so that gathers keep
    /// most of the machines (0: as fast as it can). Running the command again with another
    /// rate changes it for the rest of the move.
    #[arg(long, value_name = "MIB_PER_S", default_value_t = zr_router::MOVE_RATE_DEFAULT >> 20)]
    max_rate: u64,
}

impl MoveRateArgs {
    /// The rate in bytes a second.
    fn bytes(&self) -> Option<u64> {
        Some(self.max_rate.saturating_mul(1 << 20))
    }
}

/// Drain a shard of a running cluster, online: its records go to the others.
///
/// The next cluster map gives the shard's slots to the other shards (each to the one owning
/// the fewest); the records move as for add-shard, and the shard ends holding none. It keeps
/// its id: leave its entries in nodes.toml (its nodes must answer while the move runs).
#[derive(Args)]
pub struct DrainShardArgs {
    /// The shard to drain.
    shard: u32,
    #[command(flatten)]
    rate: MoveRateArgs,
    #[command(flatten)]
    remote: RouterArgs,
}

/// Replace a node of a replicated cluster with another machine, online.
///
/// Start the replacement first: an empty data directory, nodes.toml naming NEW_ADDR for the
/// shard's replica (`zr-node --shard K --replica J --nodes nodes.toml`). The router then
/// records in the metadata store that the replica is served from NEW_ADDR (every router takes
/// this over nodes.toml), marks it behind, and rebuilds it from an in-sync partner while
/// gathers and appends go on; it serves once it holds what its partner holds. Progress is
/// shown until then (Ctrl-C stops watching, not the rebuild). Refused for a cluster with one
/// replica per shard, or while no partner of the replica is in sync. The old node, if it still
/// runs, is no longer asked: stop it.
#[derive(Args)]
pub struct ReplaceNodeArgs {
    /// The shard whose node is replaced.
    #[arg(long)]
    shard: u32,
    /// Which of the shard's replicas is replaced.
    #[arg(long)]
    replica: u32,
    /// The replacement node's address (IP:PORT), as in its nodes.toml.
    #[arg(long = "with", value_name = "NEW_ADDR")]
    with: SocketAddr,
    /// Return once the move is recorded, without waiting for the rebuild.
    #[arg(long)]
    no_wait: bool,
    #[command(flatten)]
    remote: RouterArgs,
}

/// The cluster as its router sees it: id, map version, committed length, and each node —
/// shard, address, state (up, down or refused, and why), records, last seen.
#[derive(Args)]
pub struct StatusArgs {
    #[command(flatten)]
    remote: RouterArgs,
}

/// Runs a `zr cluster` subcommand.
pub fn run(command: ClusterCommand) -> CliResult {
    match command {
        ClusterCommand::Status(args) => status(args),
        ClusterCommand::Issue(args) => issue(args),
        ClusterCommand::Audit(args) => crate::grants::audit(args),
        ClusterCommand::Revoke(args) => crate::grants::revoke(args),
        ClusterCommand::RestoreRecord(args) => restore_record(args),
        ClusterCommand::ReplaceNode(args) => replace_node(args),
        ClusterCommand::AddShard(args) => {
            let nodes = match &args.nodes {
                Some(path) => zr_service::config::ClusterConfig::load(path)?
                    .shards
                    .iter()
                    .map(|s| (s.id, s.replica, s.addr))
                    .collect(),
                None => Vec::new(),
            };
            move_shards(&args.remote, MapChange::AddShard, nodes, args.rate.bytes())
        }
        ClusterCommand::DrainShard(args) => move_shards(
            &args.remote,
            MapChange::DrainShard(args.shard),
            Vec::new(),
            args.rate.bytes(),
        ),
    }
}

/// Starts (or goes on with) a move to the map with `change` and shows its progress until
/// it ends.
fn move_shards(
    remote: &RouterArgs,
    change: MapChange,
    nodes: Vec<(u32, u32, SocketAddr)>,
    rate: Option<u64>,
) -> CliResult {
    let usage = match change {
        MapChange::AddShard => "zr cluster add-shard --nodes nodes.toml --router ADDR --certs DIR",
        MapChange::DrainShard(_) => "zr cluster drain-shard K --router ADDR --certs DIR",
    };
    let client = remote
        .client(Access::Operate)?
        .ok_or_else(|| format!("--router is missing: {usage}"))?;
    let started = std::time::Instant::now();
    client.move_shards_at(change, nodes, rate)?;
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {pos}/{len} records copied ({per_sec}, about {eta} left)",
        )
        .map_err(|e| e.to_string())?
        .progress_chars("=> "),
    );
    let on_terminal = !bar.is_hidden();
    let mut printed = std::time::Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let Some(report) = client.move_progress()? else {
            bar.finish_and_clear();
            return Err("the router runs no move (was it restarted? run the command again)".into());
        };
        // Another command's move is never reported as this one's.
        if report.change != Some(change) {
            bar.finish_and_clear();
            return Err(format!(
                "the router reports a move of another change ({:?}), not this one ({change:?}): see `zr cluster status`, and run this command again once that move has ended",
                report.change
            )
            .into());
        }
        if let Some(error) = &report.error {
            bar.finish_and_clear();
            return Err(format!("the move stopped: {error}").into());
        }
        if report.done && report.already {
            bar.finish_and_clear();
            println!(
                "map version {} has this change already: nothing to move",
                report.version
            );
            return Ok(());
        }
        if report.done {
            bar.finish_and_clear();
            let share = if report.records == 0 {
                0.0
            } else {
                100.0 * report.moved as f64 / report.records as f64
            };
            println!(
                "map version {} serves: {} of {} records moved ({share:.1}%), in {:.1} s",
                report.version,
                report.moved,
                report.records,
                started.elapsed().as_secs_f64()
            );
            println!("records per shard: zr cluster status");
            return Ok(());
        }
        let message = format!("map version {}: {} moved", report.version, report.moved);
        if on_terminal {
            bar.set_length(report.staged_total);
            bar.set_position(report.staged);
            bar.set_message(message);
        } else if printed.elapsed() >= Duration::from_secs(5) {
            eprintln!(
                "{message}, {} of {} records copied",
                report.staged, report.staged_total
            );
            printed = std::time::Instant::now();
        }
    }
}

fn replace_node(args: ReplaceNodeArgs) -> CliResult {
    let client = args.remote.client(Access::Operate)?.ok_or(
        "--router is missing: zr cluster replace-node --shard K --replica J --with NEW_ADDR --router ADDR --certs DIR",
    )?;
    let (shard, replica) = (args.shard, args.replica);
    let started = std::time::Instant::now();
    client.replace_node(shard, replica, args.with)?;
    println!(
        "shard {shard} replica {replica} is served from {} from now on; it is rebuilt from a partner first",
        args.with
    );
    if args.no_wait {
        println!("follow the rebuild with: zr cluster status");
        return Ok(());
    }
    let spinner = indicatif::ProgressBar::new_spinner();
    let on_terminal = !spinner.is_hidden();
    let mut printed = std::time::Instant::now();
    loop {
        let status = client.status()?;
        let node = status
            .nodes
            .iter()
            .find(|n| n.shard == shard && n.replica == replica)
            .ok_or_else(|| format!("the router's status has no shard {shard} replica {replica}"))?;
        if node.addr != args.with.to_string() {
            spinner.finish_and_clear();
            return Err(format!(
                "shard {shard} replica {replica} is now at {}, not {}: another replacement overtook this one",
                node.addr, args.with
            )
            .into());
        }
        if node.in_sync && node.state == "up" {
            spinner.finish_and_clear();
            println!(
                "shard {shard} replica {replica} at {} is in sync and serving: {} records, rebuilt in {:.1} s",
                node.addr,
                node.records.map_or("?".into(), |r| r.to_string()),
                started.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        let doing = match &node.rebuild {
            Some(rebuild) => rebuild.clone(),
            None if node.state == "up" => "waiting for the rebuild to start".into(),
            None => format!("waiting for the node: {}", node.state),
        };
        if on_terminal {
            spinner.set_message(doing);
            spinner.tick();
        } else if printed.elapsed() >= Duration::from_secs(5) {
            eprintln!("{doing}");
            printed = std::time::Instant::now();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn status(args: StatusArgs) -> CliResult {
    let client = args
        .remote
        .client(Access::Read)?
        .ok_or("--router is missing: zr cluster status --router ADDR --certs DIR")?;
    let status = client.status()?;
    println!("cluster      {}", status.cluster);
    println!("map version  {}", status.map_version);
    println!("committed    {} records", status.committed_len);
    println!("serving      {} records", status.len);
    if let Some(moving) = &status.moving {
        println!("moving       {moving}");
    }
    let datasets = client.datasets()?;
    println!(
        "{:<24} {:>12} {:>12}  state",
        "dataset", "records", "committed"
    );
    let catching_up = status.nodes.iter().any(|n| n.rebuild.is_some());
    for dataset in &datasets {
        let state = match (&status.moving, catching_up) {
            (Some(_), _) => "moving",
            (None, true) => "rebuilding",
            (None, false) => "ok",
        };
        println!(
            "{:<24} {:>12} {:>12}  {state}",
            dataset.name,
            dataset.len,
            dataset.committed.map_or("-".into(), |c| c.to_string())
        );
    }
    println!(
        "{:<8} {:<22} {:>10} {:>10} {:>9}  state",
        "shard", "address", "records", "last seen", "rtt"
    );
    let replicated = status.nodes.iter().any(|n| n.replica > 0);
    let mut healthy = true;
    for node in &status.nodes {
        healthy &= node.state == "up" && node.in_sync;
        let name = if replicated {
            format!("{}/{}", node.shard, node.replica)
        } else {
            node.shard.to_string()
        };
        println!(
            "{:<8} {:<22} {:>10} {:>10} {:>9}  {}",
            name,
            node.addr,
            node.records.map_or("-".into(), |r| r.to_string()),
            node.last_seen_ms
                .map_or("never".into(), |ms| format!("{:.1} s", ms as f64 / 1000.0)),
            node.rtt_us
                .map_or("-".into(), |us| format!("{:.2} ms", us as f64 / 1000.0)),
            node.state
        );
        println!("{:<8} {}", "", node.lease);
        if let Some(rebuild) = &node.rebuild {
            println!("{:<8} {rebuild}", "");
        }
    }
    if healthy {
        Ok(())
    } else {
        Err("not every node is up and in sync (see above)".into())
    }
}

/// A cluster as a conversion's destination: records are appended through the router.
pub struct ClusterDestination {
    pub client: Client,
}

fn cluster_error(e: zr_router::Error) -> Error {
    Error::Cluster(Box::new(e))
}

impl Destination for ClusterDestination {
    fn open(&mut self, target: &Target, _spec: FieldSpec) -> zr_node::Result<()> {
        let field = self
            .client
            .fields()
            .iter()
            .find(|f| f.name == target.field)
            .ok_or_else(|| {
                let names: Vec<&str> = self
                    .client
                    .fields()
                    .iter()
                    .map(|f| f.name.as_str())
                    .collect();
                Error::Cluster(
                    format!(
                        "the dataset has no field '{}' (it has: {}); add it with `zr dataset add-field`",
                        target.field,
                        names.join(", ")
                    )
                    .into(),
                )
            })?;
        let compress = target.storage();
        let kind = |storage: &str| zr_node::meta::parse_storage(storage).map(|(k, _)| k).ok();
        if kind(&field.compress) != kind(&compress) {
            return Err(Error::Cluster(
                format!(
                    "the cluster stores field '{}' as {}, not {compress} (drop --compress or match nodes.toml)",
                    field.name, field.compress
                )
                .into(),
            ));
        }
        let len = self.client.len().map_err(cluster_error)?;
        if !target.append && len > 0 {
            return Err(Error::Cluster(
                format!("the cluster already holds {len} records; pass --append to add to them")
                    .into(),
            ));
        }
        Ok(())
    }

    fn append_many(&mut self, records: &[Record]) -> zr_node::Result<()> {
        self.client
            .append_many(records)
            .map(|_| ())
            .map_err(cluster_error)
    }

    fn commit(&mut self) -> zr_node::Result<()> {
        self.client.commit().map_err(cluster_error)
    }
}
