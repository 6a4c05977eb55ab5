//! `zr grant`, `zr revoke-grant`, `zr grants`: which certificate names may read or write
//! which datasets (see `zr_meta::access`).

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
