//! A decoded request carried out against the node's store: the data requests, the
//! coordination of writes (fences), digests, and the datasets a node holds.

use super::*;

pub(super) type Outcome = Result<(Reply, Vec<Bytes>), Refusal>;

/// Runs `write` if it carries a lease token the node's fence admits.
pub(super) fn fenced(
    coordination: &Coordination,
    token: Option<u64>,
    write: impl FnOnce() -> Outcome,
) -> Outcome {
    let Some(token) = token else {
        return Err(Refusal::NoLeaseToken);
    };
    coordination
        .fence
        .admit(token, write)
        .map_err(Refusal::Fenced)?
}

pub(super) fn execute(
    store: &Store,
    coordination: &Coordination,
    on: OnNode<'_>,
    dataset: Option<&str>,
    request: NodeRequest,
    body: &[u8],
) -> Outcome {
    let node = || {
        on.map(|(_, catalog)| catalog).ok_or_else(|| {
            Refusal::Store(Error::InvalidRecord(
                "this server holds one dataset: it has no others to list, create or drop".into(),
            ))
        })
    };
    let mover = || {
        on.map(|(shard, _)| shard).ok_or_else(|| {
            Refusal::Store(Error::InvalidRecord(
                "this server does not take part in shard moves".into(),
            ))
        })
    };
    let named = || {
        dataset.filter(|&d| d != crate::catalog::DEFAULT).ok_or_else(|| {
            Refusal::Store(Error::InvalidRecord(
                "the default dataset is the data directory itself: it is never created or dropped".into(),
            ))
        })
    };
    let fail = Refusal::Store;
    let served_len = || crate::stage::served_len(store, coordination);
    let info = || {
        let fields = store.fields().iter().map(field_info).collect();
        Ok((
            Reply::Info {
                len: served_len(),
                fields,
                incarnation: coordination.incarnation,
            },
            Vec::new(),
        ))
    };
    match request {
        NodeRequest::Info => info(),
        NodeRequest::Identity => Ok((
            Reply::Identity {
                cluster: coordination.identity.cluster(),
                map_version: coordination.identity.map_version(),
                len: served_len(),
            },
            Vec::new(),
        )),
        NodeRequest::Gather {
            indices,
            fields,
            checked,
        } => {
            let names: Vec<&str> = fields.iter().map(String::as_str).collect();
            let options = GatherOptions {
                verify: checked || store.gather_options().verify,
                ..store.gather_options()
            };
            let batch = Arc::new(store.gather_with(&indices, &names, options).map_err(fail)?);
            // The reply's body is sent straight from the batch: raw payloads from the mapped
            // chunks, flate ones from the batch's buffers; no copy into a reply buffer.
            let mut lengths = Vec::new();
            let mut pieces = Vec::new();
            for (field, view) in batch.fields().enumerate() {
                let column: Vec<u32> = view.iter().map(|p| p.len() as u32).collect();
                let total: u64 = column.iter().map(|&l| l as u64).sum();
                if total >= ZERO_COPY_MEAN_BYTES * column.len().max(1) as u64 {
                    // Every page read here: a record sent from the mapping is copied later, by
                    // the transport, on an async worker; a page the page cache no longer
                    // holds is read from the disk here instead, in the store call, where
                    // `Handling` chose to wait for the disk and `warm` counts the fault.
                    view.iter().for_each(touch_pages);
                    for (record, &len) in column.iter().enumerate() {
                        if len > 0 {
                            pieces.push(Bytes::from_owner(RecordBytes {
                                batch: Arc::clone(&batch),
                                field,
                                record,
                            }));
                        }
                    }
                } else {
                    // Small records: one copy is cheaper than a handle per record.
                    pieces.push(Bytes::from(view.to_contiguous().data));
                }
                lengths.push(column);
            }
            Ok((Reply::Gather { lengths }, pieces))
        }
        NodeRequest::Append {
            runs,
            token,
            fields,
            lengths,
        } => fenced(coordination, token, || {
            let building = coordination.identity.staged();
            // Where each slot's next record goes: its length, then past the runs before.
            let mut next_at: std::collections::HashMap<u32, u64> = Default::default();
            for run in &runs {
                if building
                    .as_ref()
                    .is_some_and(|b| b.slots.contains(&run.slot))
                {
                    return Err(Refusal::Building(run.slot));
                }
                let at = next_at
                    .entry(run.slot)
                    .or_insert_with(|| store.unit_len(run.slot).unwrap_or(0));
                if run.at != *at {
                    return Err(Refusal::OutOfStep {
                        slot: run.slot,
                        at: run.at,
                        len: *at,
                    });
                }
                *at += run.count;
            }
            let records = records_of(&fields, &lengths, body);
            let mut next = 0;
            let mut parts = Vec::with_capacity(runs.len());
            for run in &runs {
                let end = next + run.count as usize;
                let part = records.get(next..end).ok_or_else(|| {
                    Refusal::Store(Error::InvalidRecord(format!(
                        "the runs count {} records or more, the body holds {}",
                        end,
                        records.len()
                    )))
                })?;
                parts.push((run.slot, part));
                next = end;
            }
            store.append_runs(&parts).map_err(fail)?;
            Ok((
                Reply::Appended {
                    start: runs.first().map_or(0, |r| unit_address(r.slot, r.at)),
                    count: records.len() as u64,
                },
                Vec::new(),
            ))
        }),
        NodeRequest::Modify {
            index,
            token,
            fields,
            lengths,
        } => fenced(coordination, token, || {
            let columns =
                wire::split_columns(&lengths.iter().map(|&l| vec![l]).collect::<Vec<_>>(), body);
            let mut record = Record::new();
            for (name, column) in fields.iter().zip(&columns) {
                record.set(name, column[0]);
            }
            store.modify(index, &record).map_err(fail)?;
            Ok((Reply::Done, Vec::new()))
        }),
        NodeRequest::WriteField {
            token,
            field,
            indices,
            lengths,
        } => fenced(coordination, Some(token), || {
            let values = wire::split_columns(&[lengths], body);
            let values = values.first().map_or(&[][..], Vec::as_slice);
            store.write_field(&field, &indices, values).map_err(fail)?;
            Ok((Reply::Done, Vec::new()))
        }),
        NodeRequest::Datasets => {
            let held = node()?
                .list()
                .into_iter()
                .map(|held| wire::DatasetInfo {
                    name: held.name,
                    id: held.id,
                    fields: held.fields.iter().map(field_info).collect(),
                    len: held.len,
                    committed: None,
                    bytes: held.bytes,
                    commits: None,
                })
                .collect();
            Ok((Reply::Datasets(held), Vec::new()))
        }
        NodeRequest::CreateDataset { id, fields, dicts } => {
            let specs = fields
                .iter()
                .map(field_spec)
                .collect::<Result<Vec<_>, _>>()
                .map_err(fail)?;
            let dicts = field_dicts(&fields, dicts)?;
            node()?.create(named()?, id, specs, &dicts).map_err(fail)?;
            Ok((Reply::Done, Vec::new()))
        }
        NodeRequest::ShipOpen { slots } => {
            // Slots being built are not served: not copied from here either.
            let building = coordination.identity.staged();
            let refused = match &building {
                Some(_) if slots.is_empty() => true,
                Some(staged) => slots.iter().any(|s| staged.slots.contains(s)),
                None => false,
            };
            if refused {
                return Err(Refusal::Store(Error::InvalidRecord(
                    "a shard move is building slots on this node: copy from it once the move is done".into(),
                )));
            }
            let reply = node()?
                .ships
                .open(store, &slots, coordination.incarnation)?;
            Ok((reply, Vec::new()))
        }
        NodeRequest::ShipRead {
            ship,
            file,
            offset,
            len,
        } => {
            let (reply, bytes) = node()?.ships.read(ship, file, offset, len)?;
            Ok((reply, vec![bytes]))
        }
        NodeRequest::ShipReadMany { ship, pieces } => {
            let (reply, bytes) = node()?.ships.read_many(ship, &pieces)?;
            Ok((reply, bytes))
        }
        NodeRequest::ShipClose { ship } => {
            node()?.ships.close(ship);
            Ok((Reply::Done, Vec::new()))
        }
        NodeRequest::ShipFrom {
            addr,
            replica,
            shard: from_shard,
            slots,
            rate,
        } => {
            let catalog = node()?;
            let shard = catalog.get(dataset).ok_or_else(|| {
                Refusal::Store(Error::InvalidRecord(format!(
                    "this node holds no dataset '{}'",
                    dataset.unwrap_or(crate::catalog::DEFAULT)
                )))
            })?;
            let place = coordination.identity.place().ok_or_else(|| {
                Refusal::Store(Error::InvalidRecord(
                    "this node belongs to no cluster yet: nothing to rebuild".into(),
                ))
            })?;
            let partner = wire::Target {
                shard: from_shard.unwrap_or(place.shard),
                replica,
            };
            let dataset = dataset.map(str::to_string);
            let status = catalog
                .ships
                .start(shard, dataset, partner, &addr, slots, rate)?;
            Ok((Reply::Shipping(status), Vec::new()))
        }
        NodeRequest::DropDataset { id } => {
            node()?.drop_dataset(named()?, id).map_err(fail)?;
            Ok((Reply::Done, Vec::new()))
        }
        NodeRequest::AddField { field } => {
            let spec = field_spec(&field).map_err(fail)?;
            node()?.add_field(dataset, spec).map_err(fail)?;
            Ok((Reply::Done, Vec::new()))
        }
        NodeRequest::Truncate { slots, token } => fenced(coordination, Some(token), || {
            for (slot, len) in slots {
                store.truncate_unit(slot, len).map_err(fail)?;
            }
            Ok((Reply::Done, Vec::new()))
        }),
        NodeRequest::Fence { token } => coordination
            .fence
            .raise(token, info)
            .map_err(Refusal::FenceStorage)?,
        NodeRequest::Commit => {
            store.commit().map_err(fail)?;
            Ok((Reply::Done, Vec::new()))
        }
        NodeRequest::StageOpen { version, slots } => {
            let slots = mover()?.open_stage(version, &slots).map_err(fail)?;
            Ok((Reply::Staged { slots }, Vec::new()))
        }
        NodeRequest::Stage {
            version,
            runs,
            fields,
            lengths,
            commit,
        } => {
            let received = records_of(&fields, &lengths, body);
            let slots = mover()?
                .stage(version, &runs, &received, commit)
                .map_err(fail)?;
            Ok((Reply::Staged { slots }, Vec::new()))
        }
        NodeRequest::Switch {
            version,
            slots,
            token,
        } => {
            // Checked, not held: a switch is no write.
            fenced(coordination, Some(token), || Ok((Reply::Done, Vec::new())))?;
            mover()?.switch(version, &slots).map_err(fail)?;
            Ok((Reply::Done, Vec::new()))
        }
        NodeRequest::Digest { runs } => {
            // Before the records are read (see `Store::mark`).
            let of_store = store.mark();
            let mark = wire::DataMark {
                incarnation: coordination.incarnation,
                instance: of_store.instance,
                rewrites: of_store.rewrites,
            };
            let (crcs, corrupt) = digest(store, &runs).map_err(fail)?;
            Ok((
                Reply::Digest {
                    crcs,
                    corrupt,
                    mark,
                },
                Vec::new(),
            ))
        }
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
