//! The data requests: gathers (sent from the store's mapping), appends, modifies, a
//! field's writes, truncation and commits — each write admitted by the node's fence.

use super::*;

/// Records `indices` (fields `fields`, all if none), sent from the store's mapping where they
/// are large enough, each checked against its CRC if `checked`.
pub(crate) fn gather(
    ctx: &Ctx<'_>,
    indices: Vec<u64>,
    fields: Vec<String>,
    checked: bool,
) -> Outcome {
    let Ctx { store, .. } = *ctx;
    let names: Vec<&str> = fields.iter().map(String::as_str).collect();
    let options = GatherOptions {
        verify: checked || store.gather_options().verify,
        ..store.gather_options()
    };
    let batch = Arc::new(
        store
            .gather_with(&indices, &names, options)
            .map_err(Refusal::Store)?,
    );
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

/// Appends the body's records as `runs` place them, each run at its slot's end, under the
/// fence; refused for a slot being built by a move.
pub(crate) fn append(
    ctx: &Ctx<'_>,
    runs: Vec<Run>,
    token: Option<u64>,
    fields: Vec<String>,
    lengths: Vec<Vec<u32>>,
) -> Outcome {
    let Ctx {
        store,
        coordination,
        body,
        ..
    } = *ctx;
    ctx.fenced(token, || {
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
        store.append_runs(&parts).map_err(Refusal::Store)?;
        Ok((
            Reply::Appended {
                start: runs.first().map_or(0, |r| unit_address(r.slot, r.at)),
                count: records.len() as u64,
            },
            Vec::new(),
        ))
    })
}

/// Replaces record `index` with the body's fields, under the fence.
pub(crate) fn modify(
    ctx: &Ctx<'_>,
    index: u64,
    token: Option<u64>,
    fields: Vec<String>,
    lengths: Vec<u32>,
) -> Outcome {
    let (store, body) = (ctx.store, ctx.body);
    ctx.fenced(token, || {
        let columns =
            wire::split_columns(&lengths.iter().map(|&l| vec![l]).collect::<Vec<_>>(), body);
        let mut record = Record::new();
        for (name, column) in fields.iter().zip(&columns) {
            record.set(name, column[0]);
        }
        store.modify(index, &record).map_err(Refusal::Store)?;
        Ok((Reply::Done, Vec::new()))
    })
}

/// Writes field `field` of records `indices` from the body, under the fence.
pub(crate) fn write_field(
    ctx: &Ctx<'_>,
    token: u64,
    field: String,
    indices: Vec<u64>,
    lengths: Vec<u32>,
) -> Outcome {
    let (store, body) = (ctx.store, ctx.body);
    ctx.fenced(Some(token), || {
        let values = wire::split_columns(&[lengths], body);
        let values = values.first().map_or(&[][..], Vec::as_slice);
        store
            .write_field(&field, &indices, values)
            .map_err(Refusal::Store)?;
        Ok((Reply::Done, Vec::new()))
    })
}

/// Cuts each slot of `slots` to its length, under the fence (a repair).
pub(crate) fn truncate(ctx: &Ctx<'_>, slots: Vec<(u32, u64)>, token: u64) -> Outcome {
    let store = ctx.store;
    ctx.fenced(Some(token), || {
        for (slot, len) in slots {
            store.truncate_unit(slot, len).map_err(Refusal::Store)?;
        }
        Ok((Reply::Done, Vec::new()))
    })
}

/// Makes every write so far durable.
pub(crate) fn commit(ctx: &Ctx<'_>) -> Outcome {
    let Ctx { store, .. } = *ctx;
    store.commit().map_err(Refusal::Store)?;
    Ok((Reply::Done, Vec::new()))
}
