//! `zr dataset`: the named datasets of a cluster — create, list, show, drop, grow a field.

use clap::{Args, Subcommand};
use zr_net::tls::Access;
use zr_router::Client;
use zr_router::{DatasetInfo, FieldInfo};

use crate::cluster::RouterArgs;
use crate::{human_bytes, CliResult};

/// The datasets of a cluster: each has its own fields, records and writes, and every shard
/// holds a part of each.
#[derive(Subcommand)]
pub enum DatasetCommand {
    Create(CreateArgs),
    List(ListArgs),
    Info(NamedArgs),
    Drop(DropArgs),
    AddField(AddFieldArgs),
}

/// Create a dataset (operator role).
///
/// Example: zr dataset create text --field tokens:raw:<u4 --field meta:flate --router ADDR --certs DIR
///
/// A zstd field can be compressed with a dictionary (for small records): --dict
/// caption=FILE, FILE a zstd dictionary (e.g. a local dataset's dict/caption.zdict from `zr
/// dict train`, or `zstd --train`'s). `zr convert --router --dataset NAME --dict` trains one
/// on the records it converts and makes the dataset with it.
#[derive(Args)]
pub struct CreateArgs {
    /// Its name: 1-64 characters of [a-z0-9._-], starting with a letter or digit.
    name: String,
    /// A field, as NAME[:raw|flate|zstd[:LEVEL]][:DTYPE[:SHAPE]] (DTYPE a NumPy type string
    /// such as <f4, SHAPE dimensions joined by x, e.g. 3x224x224); repeat for several.
    #[arg(long = "field", value_name = "SPEC", required = true)]
    fields: Vec<String>,
    /// A zstd field's dictionary, as FIELD=FILE; repeat for several fields.
    #[arg(long = "dict", value_name = "FIELD=FILE")]
    dicts: Vec<String>,
    #[command(flatten)]
    remote: RouterArgs,
}

/// List the cluster's datasets: name, records, committed, fields, bytes.
#[derive(Args)]
pub struct ListArgs {
    #[command(flatten)]
    remote: RouterArgs,
}

/// Show one dataset: its records, committed records, fields and bytes.
#[derive(Args)]
pub struct NamedArgs {
    name: String,
    #[command(flatten)]
    remote: RouterArgs,
}

/// Drop a dataset and every record in it, on every node (operator role). Refused while a
/// shard move or a replica's catch-up runs.
#[derive(Args)]
pub struct DropArgs {
    name: String,
    /// Say yes: the records cannot be brought back.
    #[arg(long)]
    yes: bool,
    #[command(flatten)]
    remote: RouterArgs,
}

/// Add a field to a dataset (operator role): the records stored so far lack it until a
/// write gives it one (Python: `write_field`).
#[derive(Args)]
pub struct AddFieldArgs {
    name: String,
    /// The field, as NAME[:raw|flate] (a field added later has no dtype: the records
    /// stored so far have no value for it).
    field: String,
    #[command(flatten)]
    remote: RouterArgs,
}

/// A field as `zr dataset create --field` spells it: NAME[:raw|flate|zstd[:LEVEL]][:DTYPE[:SHAPE]].
pub fn parse_field(spec: &str) -> Result<FieldInfo, String> {
    let mut parts = spec.split(':');
    let name = parts.next().unwrap_or_default().to_string();
    let mut compress = "raw".to_string();
    let mut rest: Vec<&str> = parts.collect();
    if let Some(&first) = rest.first() {
        if first == "raw" || first == "flate" || first == "zstd" {
            compress = first.to_string();
            rest.remove(0);
            // zstd:LEVEL (a dtype is never a bare number).
            if first == "zstd"
                && rest
                    .first()
                    .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()))
            {
                compress = format!("zstd:{}", rest.remove(0));
            }
        }
    }
    let dtype = rest.first().map(|d| d.to_string());
    let shape = match rest.get(1) {
        None => None,
        Some(dims) => Some(
            dims.split(['x', ','])
                .map(|d| {
                    d.parse::<u64>().map_err(|_| {
                        format!("field '{spec}': shape '{dims}' is not dimensions like 3x224x224")
                    })
                })
                .collect::<Result<Vec<u64>, String>>()?,
        ),
    };
    if rest.len() > 2 {
        return Err(format!(
            "field '{spec}' is not NAME[:raw|flate][:DTYPE[:SHAPE]]"
        ));
    }
    if name.is_empty() {
        return Err(format!("field '{spec}' has no name"));
    }
    Ok(FieldInfo {
        name,
        compress,
        dtype,
        shape,
        dict: None,
    })
}

/// The cluster's datasets, as a reader of the router `remote` names sees them.
fn datasets(
    remote: &RouterArgs,
    usage: &str,
) -> Result<Vec<DatasetInfo>, Box<dyn std::error::Error>> {
    Ok(connect(remote, Access::Read, usage)?.datasets()?)
}

fn connect(
    remote: &RouterArgs,
    needs: Access,
    usage: &str,
) -> Result<Client, Box<dyn std::error::Error>> {
    let mut remote = remote.clone();
    // The dataset is named by the command itself, not --dataset.
    remote.dataset = None;
    Ok(remote
        .client(needs)?
        .ok_or_else(|| format!("--router is missing: {usage}"))?)
}

/// A `--dict FIELD=FILE`: the field and the file's bytes.
fn read_dict(spec: &str) -> Result<zr_router::FieldDict, String> {
    let (field, file) = spec
        .split_once('=')
        .ok_or_else(|| format!("--dict '{spec}' is not FIELD=FILE"))?;
    let bytes =
        std::fs::read(file).map_err(|e| format!("--dict {spec}: cannot read {file}: {e}"))?;
    if zr_router::DictRef::of(&bytes).is_none() {
        return Err(format!(
            "--dict {spec}: {file} is no zstd dictionary (train one with `zr dict train` or zstd --train)"
        ));
    }
    Ok(zr_router::FieldDict {
        field: field.to_string(),
        bytes,
    })
}

fn describe_fields(fields: &[FieldInfo]) -> String {
    fields
        .iter()
        .map(|f| {
            let mut s = format!("{}:{}", f.name, f.compress);
            if let Some(dtype) = &f.dtype {
                s.push(':');
                s.push_str(dtype);
            }
            if let Some(shape) = &f.shape {
                s.push(':');
                s.push_str(
                    &shape
                        .iter()
                        .map(u64::to_string)
                        .collect::<Vec<_>>()
                        .join("x"),
                );
            }
            if let Some(dict) = f.dict {
                s.push_str(&format!(" (dict {})", dict.id));
            }
            s
        })
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn run(command: DatasetCommand) -> CliResult {
    match command {
        DatasetCommand::Create(args) => {
            let fields = args
                .fields
                .iter()
                .map(|f| parse_field(f))
                .collect::<Result<Vec<_>, _>>()?;
            let dicts = args
                .dicts
                .iter()
                .map(|spec| read_dict(spec))
                .collect::<Result<Vec<_>, _>>()?;
            let client = connect(
                &args.remote,
                Access::Operate,
                "zr dataset create NAME --field F --router ADDR --certs DIR",
            )?;
            let described: Vec<String> = dicts
                .iter()
                .filter_map(|d| {
                    let id = zr_router::DictRef::of(&d.bytes)?.id;
                    Some(format!("field '{}' with dictionary {id}", d.field))
                })
                .collect();
            client.create_dataset_with_dicts(&args.name, fields, dicts)?;
            if described.is_empty() {
                println!("created dataset '{}'", args.name);
            } else {
                println!("created dataset '{}' ({})", args.name, described.join(", "));
            }
            Ok(())
        }
        DatasetCommand::List(args) => {
            let all = datasets(&args.remote, "zr dataset list --router ADDR --certs DIR")?;
            println!(
                "{:<24} {:>12} {:>12} {:>10}  fields",
                "name", "records", "committed", "bytes"
            );
            for dataset in &all {
                println!(
                    "{:<24} {:>12} {:>12} {:>10}  {}",
                    dataset.name,
                    dataset.len,
                    dataset.committed.map_or("-".into(), |c| c.to_string()),
                    human_bytes(dataset.bytes),
                    describe_fields(&dataset.fields)
                );
            }
            Ok(())
        }
        DatasetCommand::Info(args) => {
            let all = datasets(
                &args.remote,
                "zr dataset info NAME --router ADDR --certs DIR",
            )?;
            let Some(dataset) = all.iter().find(|d| d.name == args.name) else {
                let names: Vec<&str> = all.iter().map(|d| d.name.as_str()).collect();
                return Err(format!(
                    "the cluster has no dataset '{}' (it has: {})",
                    args.name,
                    names.join(", ")
                )
                .into());
            };
            print_info(dataset);
            Ok(())
        }
        DatasetCommand::Drop(args) => {
            if !args.yes {
                return Err(format!(
                    "dropping dataset '{}' deletes every record in it on every node; run again with --yes to do it",
                    args.name
                )
                .into());
            }
            let client = connect(
                &args.remote,
                Access::Operate,
                "zr dataset drop NAME --yes --router ADDR --certs DIR",
            )?;
            client.drop_dataset(&args.name)?;
            println!("dropped dataset '{}'", args.name);
            Ok(())
        }
        DatasetCommand::AddField(args) => {
            let field = parse_field(&args.field)?;
            let client = connect(
                &args.remote,
                Access::Operate,
                "zr dataset add-field NAME FIELD --router ADDR --certs DIR",
            )?;
            let mut dataset = client.dataset(&args.name)?;
            dataset.add_field(field.clone())?;
            println!(
                "dataset '{}' has field '{}' now (the records stored so far lack it until written)",
                args.name, field.name
            );
            Ok(())
        }
    }
}

fn print_info(dataset: &DatasetInfo) {
    println!("dataset      {}", dataset.name);
    println!("records      {}", dataset.len);
    if let Some(committed) = dataset.committed {
        println!("committed    {committed}");
    }
    println!("bytes        {}", human_bytes(dataset.bytes));
    for field in &dataset.fields {
        println!(
            "field        {}",
            describe_fields(std::slice::from_ref(field))
        );
    }
}
