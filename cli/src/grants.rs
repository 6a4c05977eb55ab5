//! Access control from the command line (see `zr_meta::access`): `zr grant`,
//! `zr revoke-grant`, `zr grants` — which certificate names may read or write which
//! datasets —, `zr cluster revoke` and `zr cluster audit`.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use zr_net::tls::Access;
use zr_router::Grant;

use crate::cluster::RouterArgs;
use crate::CliResult;

/// What a grant allows.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Rights {
    /// Gather, info and waiting for records.
    Read,
    /// Read, and append, modify, delete, commit.
    Write,
}

/// Let a certificate name read or write datasets, by name or prefix.
///
/// A cluster with no grant lets every reader read and every writer write every dataset, as
/// its role says. Once it has one, a reader or writer reaches only the datasets some grant
/// of its certificate's name covers — through routers and one hop from nodes (within a few
/// seconds on every router and node) — and `zr dataset list` shows it only those. A role
/// still bounds a grant: a reader granted write only reads. Operators see and do
/// everything. The name is the one `zr cluster issue --name` gave (or `reader`/`writer`
/// for those roles' shared certificates).
#[derive(Args)]
pub struct GrantArgs {
    /// The certificate name.
    who: String,
    /// read or write.
    rights: Rights,
    /// A dataset's name, or the start of names followed by '*' ('imgs*'), or '*' for all.
    pattern: String,
    /// Grant a dataset that is not created yet (else a name the cluster lacks is refused).
    #[arg(long)]
    create_later: bool,
    #[command(flatten)]
    remote: RouterArgs,
}

/// Take a grant back (the same three words `zr grant` was given).
#[derive(Args)]
pub struct RevokeGrantArgs {
    /// The certificate name.
    who: String,
    /// read or write.
    rights: Rights,
    /// The pattern as granted.
    pattern: String,
    #[command(flatten)]
    remote: RouterArgs,
}

/// List every grant.
#[derive(Args)]
pub struct GrantsArgs {
    #[command(flatten)]
    remote: RouterArgs,
}

fn of(who: String, rights: Rights, pattern: String) -> Grant {
    Grant {
        who,
        write: matches!(rights, Rights::Write),
        pattern,
    }
}

fn show(grants: &[Grant]) {
    if grants.is_empty() {
        println!("no grants: every role reaches every dataset");
    }
    for g in grants {
        let rights = if g.write { "write" } else { "read" };
        println!("{:<24} {rights:<5}  {}", g.who, g.pattern);
    }
}

pub fn grant(args: GrantArgs) -> CliResult {
    let client = args
        .remote
        .client(Access::Operate)?
        .ok_or("--router is missing: zr grant WHO read|write PATTERN --router ADDR --certs DIR")?;
    let grants = client.grant(
        of(args.who, args.rights, args.pattern),
        false,
        args.create_later,
    )?;
    show(&grants);
    Ok(())
}

pub fn revoke_grant(args: RevokeGrantArgs) -> CliResult {
    let client = args.remote.client(Access::Operate)?.ok_or(
        "--router is missing: zr revoke-grant WHO read|write PATTERN --router ADDR --certs DIR",
    )?;
    let grants = client.grant(of(args.who, args.rights, args.pattern), true, false)?;
    show(&grants);
    Ok(())
}

pub fn list(args: GrantsArgs) -> CliResult {
    let client = args
        .remote
        .client(Access::Operate)?
        .ok_or("--router is missing: zr grants --router ADDR --certs DIR")?;
    show(&client.grants()?);
    Ok(())
}

/// Revoke a certificate, by the name it was issued under or by its serial number, on every
/// router and node, within seconds.
///
/// A certificate of a job that leaked, or of a team that left, is refused from then on: its
/// requests on connections already open and on new ones, through routers and one hop from
/// nodes, within a few seconds (every router and node reads the list each second); a router
/// or node that was down meanwhile refuses it from its start. The list is in the metadata
/// store. `--name` refuses every certificate issued under the name (renewed ones too);
/// `--serial` one certificate (`zr cluster issue` prints its serial number; `openssl x509
/// -serial -noout -in FILE` reads it). The certificate this command connects with, and the
/// cluster's own operator, router and node certificates, cannot be revoked. `--undo` serves
/// it again.
#[derive(Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["name", "serial"])))]
pub struct RevokeArgs {
    /// The name the certificate was issued under (`zr cluster issue --name NAME`).
    #[arg(long)]
    name: Option<String>,
    /// The serial number of one certificate `zr cluster issue` made (hex; colons allowed).
    #[arg(long)]
    serial: Option<String>,
    /// Serve it again.
    #[arg(long)]
    undo: bool,
    #[command(flatten)]
    remote: RouterArgs,
}

pub fn revoke(args: RevokeArgs) -> CliResult {
    let client = args.remote.client(Access::Operate)?.ok_or(
        "--router is missing: zr cluster revoke --name NAME|--serial HEX --router ADDR --certs DIR",
    )?;
    let (what, listed, revoked) = match (&args.name, &args.serial) {
        (Some(name), _) => (
            format!("'{name}'"),
            "names",
            client.revoke(name, args.undo)?,
        ),
        (None, Some(serial)) => (
            format!("the certificate of serial number {serial}"),
            "serial numbers",
            client.revoke_serial(serial, args.undo)?,
        ),
        (None, None) => return Err("give --name NAME or --serial HEX".into()),
    };
    if args.undo {
        println!("{what} is served again");
    } else {
        println!(
            "{what} is revoked: refused by every router and node within {} s",
            2 * zr_meta::access::WATCH_EVERY.as_secs()
        );
    }
    if revoked.is_empty() {
        println!("no certificate is revoked by its {listed}");
    } else {
        println!("revoked {listed}: {}", revoked.join(", "));
    }
    Ok(())
}

/// Read a router's audit log: who did what, when.
///
/// A router started with `[router] audit_log = "PATH"` in nodes.toml appends one JSON line
/// there per admin action (dataset created, dropped or grown, scrub, node replaced, shards
/// moved), per commit, and per refused request (at most one a minute per identity), and
/// rotates it by size into PATH.1, PATH.2, …. This prints them, the rotated files first,
/// oldest first: time, who (the certificate's name, or its role), action, dataset, outcome.
#[derive(Args)]
pub struct AuditArgs {
    /// The audit log (the router's `[router] audit_log`).
    #[arg(long, value_name = "PATH")]
    file: PathBuf,
    /// Only entries from then on: an RFC 3339 time (2026-11-27T10:00:00Z) or a span back
    /// from now (90m, 2d).
    #[arg(long)]
    since: Option<String>,
    /// Print the entries as their JSON lines.
    #[arg(long)]
    json: bool,
}

pub fn audit(args: AuditArgs) -> CliResult {
    let since = match &args.since {
        Some(text) => Some(zr_service::audit::since(text)?),
        None => None,
    };
    let entries = zr_service::audit::read(&args.file, since)?;
    for entry in &entries {
        if args.json {
            println!("{}", serde_json::to_string(entry)?);
            continue;
        }
        let detail = if entry.detail.is_empty() {
            String::new()
        } else {
            format!(": {}", entry.detail)
        };
        println!(
            "{}  {} ({})  {} {}  {}{detail}",
            entry.time, entry.who, entry.role, entry.action, entry.dataset, entry.outcome
        );
    }
    if !args.json {
        eprintln!("{} entries", entries.len());
    }
    Ok(())
}
