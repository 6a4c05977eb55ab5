//! A decoded request carried out against the node's store: the data requests, the
//! coordination of writes (fences), digests, and the datasets a node holds.

use super::*;

mod data;
mod datasets;
mod moves;
mod ship;
mod state;

pub(super) type Outcome = Result<(Reply, Vec<Bytes>), Refusal>;

/// What a request is carried out with: the node's store, its coordination state, the
/// shard server around it (none for a server of one dataset), the dataset named, the body.
#[derive(Clone, Copy)]
pub(crate) struct Ctx<'a> {
    pub(crate) store: &'a Store,
    pub(crate) coordination: &'a Coordination,
    pub(crate) on: OnNode<'a>,
    pub(crate) dataset: Option<&'a str>,
    pub(crate) body: &'a [u8],
}

impl<'a> Ctx<'a> {
    /// Runs `write` if it carries a lease token the node's fence admits.
    fn fenced(&self, token: Option<u64>, write: impl FnOnce() -> Outcome) -> Outcome {
        let Some(token) = token else {
            return Err(Refusal::NoLeaseToken);
        };
        self.coordination
            .fence
            .admit(token, write)
            .map_err(Refusal::Fenced)?
    }

    /// The node's datasets; refused by a server of one dataset.
    pub(crate) fn node(&self) -> Result<&'a Catalog, Refusal> {
        self.on.map(|(_, catalog)| catalog).ok_or_else(|| {
            Refusal::Store(Error::InvalidRecord(
                "this server holds one dataset: it has no others to list, create or drop".into(),
            ))
        })
    }

    /// The shard's part in moves; refused by a server of one dataset.
    pub(crate) fn mover(&self) -> Result<&'a Shard, Refusal> {
        self.on.map(|(shard, _)| shard).ok_or_else(|| {
            Refusal::Store(Error::InvalidRecord(
                "this server does not take part in shard moves".into(),
            ))
        })
    }

    /// The named dataset addressed; refused for the default one.
    pub(crate) fn named(&self) -> Result<&'a str, Refusal> {
        self.dataset
            .filter(|&d| d != crate::catalog::DEFAULT)
            .ok_or_else(|| {
                Refusal::Store(Error::InvalidRecord(
                    "the default dataset is the data directory itself: it is never created or dropped".into(),
                ))
            })
    }

    /// The records the node serves (slots being built for a move not counted).
    pub(crate) fn served_len(&self) -> u64 {
        crate::stage::served_len(self.store, self.coordination)
    }
}

pub(super) fn execute(
    store: &Store,
    coordination: &Coordination,
    on: OnNode<'_>,
    dataset: Option<&str>,
    request: NodeRequest,
    body: &[u8],
) -> Outcome {
    let ctx = Ctx {
        store,
        coordination,
        on,
        dataset,
        body,
    };
    match request {
        NodeRequest::Info => state::info(&ctx),
        NodeRequest::Identity => state::identity(&ctx),
        NodeRequest::Gather {
            indices,
            fields,
            checked,
        } => data::gather(&ctx, indices, fields, checked),
        NodeRequest::Append {
            runs,
            token,
            fields,
            lengths,
        } => data::append(&ctx, runs, token, fields, lengths),
        NodeRequest::Modify {
            index,
            token,
            fields,
            lengths,
        } => data::modify(&ctx, index, token, fields, lengths),
        NodeRequest::WriteField {
            token,
            field,
            indices,
            lengths,
        } => data::write_field(&ctx, token, field, indices, lengths),
        NodeRequest::Datasets => datasets::datasets(&ctx),
        NodeRequest::CreateDataset { id, fields, dicts } => {
            datasets::create_dataset(&ctx, id, fields, dicts)
        }
        NodeRequest::ShipOpen { slots } => ship::ship_open(&ctx, slots),
        NodeRequest::ShipRead {
            ship,
            file,
            offset,
            len,
        } => ship::ship_read(&ctx, ship, file, offset, len),
        NodeRequest::ShipReadMany { ship, pieces } => ship::ship_read_many(&ctx, ship, pieces),
        NodeRequest::ShipClose { ship } => ship::ship_close(&ctx, ship),
        NodeRequest::ShipFrom {
            addr,
            replica,
            shard: from_shard,
            slots,
            rate,
        } => ship::ship_from(&ctx, addr, replica, from_shard, slots, rate),
        NodeRequest::DropDataset { id } => datasets::drop_dataset(&ctx, id),
        NodeRequest::AddField { field } => datasets::add_field(&ctx, field),
        NodeRequest::Truncate { slots, token } => data::truncate(&ctx, slots, token),
        NodeRequest::Fence { token } => state::fence(&ctx, token),
        NodeRequest::Commit => data::commit(&ctx),
        NodeRequest::StageOpen { version, slots } => moves::stage_open(&ctx, version, slots),
        NodeRequest::Stage {
            version,
            runs,
            fields,
            lengths,
            commit,
        } => moves::stage(&ctx, version, runs, fields, lengths, commit),
        NodeRequest::Switch {
            version,
            slots,
            token,
        } => moves::switch(&ctx, version, slots, token),
        NodeRequest::Digest { runs } => state::digest_of(&ctx, runs),
    }
}

/// The records an append's body carries: per field of `fields`, `lengths` payloads.
pub(super) fn records_of<'a>(
    fields: &'a [String],
    lengths: &[Vec<u32>],
    body: &'a [u8],
) -> Vec<Record<'a>> {
    let columns = wire::split_columns(lengths, body);
    let count = lengths.first().map_or(0, Vec::len);
    (0..count)
        .map(|k| {
            let mut record = Record::new();
            for (name, column) in fields.iter().zip(&columns) {
                record.set(name, column[k]);
            }
            record
        })
        .collect()
}

/// Records read per gather of a digest.
pub(super) const DIGEST_BATCH: usize = 4096;

/// Per record of `runs` (each clamped to its slot's length), in order: a CRC32 of each
/// field's length and contents, each read checked against its CRC; and the positions among
/// them of the records that failed the check (their digest is 0).
pub(super) fn digest(store: &Store, runs: &[Run]) -> zr_node::Result<(Vec<u32>, Vec<u64>)> {
    let addresses: Vec<u64> = runs
        .iter()
        .flat_map(|run| {
            let end = run
                .at
                .saturating_add(run.count)
                .min(store.unit_len(run.slot).unwrap_or(0));
            (run.at..end.max(run.at)).map(move |i| unit_address(run.slot, i))
        })
        .collect();
    let mut crcs = Vec::with_capacity(addresses.len());
    let mut corrupt = Vec::new();
    let checked = GatherOptions {
        verify: true,
        ..store.gather_options()
    };
    let record_crc = |batch: &Batch, k: usize| {
        let mut hasher = crc32fast::Hasher::new();
        for field in batch.fields() {
            let payload = field.get(k).unwrap_or_default();
            hasher.update(&(payload.len() as u32).to_le_bytes());
            hasher.update(payload);
        }
        hasher.finalize()
    };
    for (part, indices) in addresses.chunks(DIGEST_BATCH).enumerate() {
        match store.gather_with(indices, &[], checked) {
            Ok(batch) => crcs.extend((0..indices.len()).map(|k| record_crc(&batch, k))),
            Err(Error::BadRecord { .. } | Error::Corrupt { .. }) => {
                // Which ones: record by record.
                for (k, &index) in indices.iter().enumerate() {
                    match store.gather_with(&[index], &[], checked) {
                        Ok(batch) => crcs.push(record_crc(&batch, 0)),
                        Err(Error::BadRecord { .. } | Error::Corrupt { .. }) => {
                            crcs.push(0);
                            corrupt.push((part * DIGEST_BATCH + k) as u64);
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok((crcs, corrupt))
}

/// One gathered payload as a `Bytes` that keeps its batch (and so its mapping) alive.
pub(super) struct RecordBytes {
    batch: Arc<Batch>,
    field: usize,
    record: usize,
}

impl AsRef<[u8]> for RecordBytes {
    fn as_ref(&self) -> &[u8] {
        self.batch
            .fields()
            .nth(self.field)
            .and_then(|f| f.get(self.record))
            .unwrap_or_default()
    }
}

pub(super) fn field_info(spec: &FieldSpec) -> FieldInfo {
    FieldInfo {
        name: spec.name.clone(),
        compress: spec.storage(),
        dtype: spec.dtype.clone(),
        shape: spec.shape.clone(),
        // A cluster's datasets are made with their dictionary's CRC32 (only local
        // datasets of an early format lack it).
        dict: spec.dict.map(|id| DictRef {
            id,
            crc: spec.dict_crc.unwrap_or_default(),
        }),
    }
}

/// The dictionaries a create sends, each checked against the id its field names (the
/// engine checks that the bytes are a dictionary of that id and that the field is zstd).
pub(super) fn field_dicts(
    fields: &[FieldInfo],
    dicts: Vec<FieldDict>,
) -> Result<Vec<(String, Vec<u8>)>, Refusal> {
    for field in fields {
        let sent = dicts
            .iter()
            .find(|d| d.field == field.name)
            .map(|d| DictRef::of(&d.bytes));
        match (field.dict, sent) {
            (None, None) => {}
            (Some(want), Some(Some(have))) if want == have => {}
            (want, sent) => {
                return Err(Refusal::DictMismatch {
                    field: field.name.clone(),
                    want: want.map(|d| d.id),
                    sent: match sent {
                        None => "is none".into(),
                        Some(None) => "is no zstd dictionary".into(),
                        Some(Some(have)) => {
                            format!("is dictionary {} with CRC32 {:08x}", have.id, have.crc)
                        }
                    },
                })
            }
        }
    }
    Ok(dicts.into_iter().map(|d| (d.field, d.bytes)).collect())
}

/// The field a wire description asks for: its compression and type checked.
pub(super) fn field_spec(info: &FieldInfo) -> Result<FieldSpec, Error> {
    let spec = FieldSpec::stored(info.name.clone(), &info.compress)?;
    Ok(match (&info.dtype, &info.shape) {
        (Some(dtype), shape) => spec.typed(dtype.clone(), shape.clone().unwrap_or_default()),
        (None, _) => spec,
    })
}
