//! A shard's store as the server opens it: its fields from the cluster's configuration,
//! and the runtime options a node reads with.

use super::*;

/// Opens shard `shard` replica `replica`'s store at `dir`, creating it with the cluster's
/// fields if it does not exist yet; refuses a store whose fields differ from the
/// configuration, a directory that holds another node's data, and one that holds records but
/// no identity (see `identity`).
pub fn open_shard_store(
    config: &ClusterConfig,
    dir: &Path,
    shard: u32,
    replica: u32,
) -> Result<Store, Error> {
    let store = open_shard_store_fields(config, dir)?;
    crate::identity::Identity::claim(dir, shard, replica, store.len())?;
    Ok(store)
}

pub(super) fn open_shard_store_fields(config: &ClusterConfig, dir: &Path) -> Result<Store, Error> {
    let fields: Vec<FieldSpec> = config
        .fields
        .iter()
        .map(|f| {
            let compress = f
                .compress
                .parse::<Compression>()
                .map_err(|e| Error::InvalidSchema(e.to_string()))?;
            Ok(FieldSpec::new(f.name.clone(), compress))
        })
        .collect::<Result<_, Error>>()?;
    let runtime = shard_runtime();
    let reads = GatherOptions {
        read: config
            .node
            .read
            .parse::<ReadPath>()
            .map_err(|e| Error::InvalidInput {
                path: config.origin.clone().into(),
                reason: e.to_string(),
            })?,
        uncached: config.node.uncached,
        ..GatherOptions::default()
    };
    if !dir.join(zr_node::meta::META_FILE).exists() {
        return Ok(
            Store::create_with(dir, fields, CreateOptions::default(), runtime)?
                .with_gather_options(reads),
        );
    }
    let store = Store::open_with(dir, runtime)?.with_gather_options(reads);
    let names = |fs: &[FieldSpec]| {
        fs.iter()
            .map(|f| format!("{}:{:?}", f.name, f.compress))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let have: Vec<(String, Compression)> = store
        .fields()
        .iter()
        .map(|f| (f.name.clone(), f.compress))
        .collect();
    let want: Vec<(String, Compression)> = fields
        .iter()
        .map(|f| (f.name.clone(), f.compress))
        .collect();
    if have != want {
        return Err(Error::InvalidSchema(format!(
            "{} holds fields [{}] but the configuration says [{}]",
            dir.display(),
            names(store.fields()),
            names(&fields)
        )));
    }
    Ok(store)
}

/// The runtime of a node's stores. Requests run side by side on blocking threads, one each:
/// splitting one request over a reader pool as well only adds thread hand-offs (measured:
/// spinning idle readers cost the network path more than the parallel copy saves).
pub(super) fn shard_runtime() -> RuntimeOptions {
    RuntimeOptions {
        readers: 1,
        ..RuntimeOptions::default()
    }
}
