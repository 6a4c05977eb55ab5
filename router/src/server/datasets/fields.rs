//! A dataset's fields: one added to every record, and one field's values written for a
//! range of records.

use super::*;

impl Router {
    /// `zr dataset add-field`: adds `field` to this router's dataset, in the cluster record
    /// (a named dataset) and on every node, between writes. Records stored so far lack it.
    pub(crate) async fn add_field(self: &Arc<Self>, field: FieldInfo) -> Result<(), Failure> {
        check_field(&field)?;
        if let Some(dict) = field.dict {
            return Err(Failure::BadRequest(format!(
                "field '{}' names dictionary {}: a field added later has none (a dictionary comes with the dataset's create)",
                field.name, dict.id
            )));
        }
        if field.dtype.is_some() {
            return Err(Failure::BadRequest(format!(
                "field '{}' has a dtype, so every record would need it, and the records stored so far have none: add it without one",
                field.name
            )));
        }
        let had = self.fields();
        if had.iter().any(|f| f.name == field.name) {
            return Err(Failure::Conflict(format!(
                "dataset '{}' has a field '{}' already",
                self.dataset_name(),
                field.name
            )));
        }
        // Every request names at most FIELDS_MAX fields: a dataset with more could never be
        // appended to or gathered whole again.
        if had.len() >= wire::FIELDS_MAX {
            return Err(Failure::BadRequest(format!(
                "dataset '{}' has {} fields, the most a dataset may have: field '{}' is not added",
                self.dataset_name(),
                had.len(),
                field.name
            )));
        }
        self.exclusive(|| async {
            self.refuse_while_moving("add-field").await?;
            if self.dataset.is_some() {
                loop {
                    let (record, revision) = self.load_cluster().await?;
                    let mut next = record.clone();
                    let Some(dataset) = next
                        .datasets
                        .iter_mut()
                        .find(|d| d.name == self.dataset_name() && d.id == self.dataset_id)
                    else {
                        return Err(Failure::NoSuchDataset {
                            name: self.dataset_name().to_string(),
                        });
                    };
                    if dataset.fields.iter().any(|f| f.name == field.name) {
                        break;
                    }
                    dataset
                        .fields
                        .extend(record_fields(std::slice::from_ref(&field)));
                    match cluster::store(&*self.cluster.meta, Some(revision), &next).await {
                        Ok(_) => break,
                        Err(zr_meta::Error::Conflict { .. }) => continue,
                        Err(e) => return Err(metadata(e)),
                    }
                }
            }
            let request = NodeRequest::AddField {
                field: field.clone(),
            };
            self.on_every_node(self.on(), &request, "add a field to")
                .await;
            self.state().field_added(field.clone());
            Ok(())
        })
        .await
    }

    /// Writes field `field` of records `start..start + lengths.len()` (the payloads back to
    /// back in `body`), their other fields unchanged. The caller holds the lease.
    pub(crate) async fn write_field(
        &self,
        field: String,
        start: u64,
        lengths: Vec<u32>,
        body: &[u8],
    ) -> Result<Reply, Failure> {
        let count = lengths.len() as u64;
        let len = self.len();
        let end = start.saturating_add(count);
        if end > len {
            return Err(Failure::OutOfRange {
                index: end.saturating_sub(1).max(start),
                len,
            });
        }
        if !self.fields().iter().any(|f| f.name == field) {
            return Err(Failure::BadRequest(format!(
                "dataset '{}' has no field '{field}'",
                self.dataset_name()
            )));
        }
        if count == 0 {
            return Ok(Reply::Done);
        }
        self.refuse_while_moving("write-field").await?;
        if self.nodes().replicas() > 1 {
            self.intend(Some(PendingWrite::WriteField { start, count }))
                .await
                .map_err(|e| e.while_("recording the write in the metadata store"))?;
        }
        // Per shard: its records' addresses, their lengths and their bytes, in order.
        let placement = self.cluster.placement.load_full();
        let mut parts: std::collections::BTreeMap<u32, ShardValues> = Default::default();
        let mut at = 0usize;
        for (k, &length) in lengths.iter().enumerate() {
            let (shard, address) = placement.locate_address(start + k as u64);
            let part = parts.entry(shard).or_default();
            part.indices.push(address);
            part.lengths.push(length);
            part.bytes
                .extend_from_slice(&body[at..at + length as usize]);
            at += length as usize;
        }
        let calls = parts.into_iter().map(|(shard, part)| {
            let request = NodeRequest::WriteField {
                token: 0, // write_call sets it
                field: field.clone(),
                indices: part.indices,
                lengths: part.lengths,
            };
            self.write_call(shard, request, vec![Bytes::from(part.bytes)])
        });
        for result in futures::future::join_all(calls).await {
            result?;
        }
        Ok(Reply::Done)
    }
}
