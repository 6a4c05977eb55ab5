//! The client's writes: records encoded for the wire, appended, modified, deleted, a
//! field written for a range, and commits.

use super::*;

impl AsyncClient {
    /// Writes field `field` of records `start..start + values.len()`, their other fields
    /// unchanged.
    pub async fn write_field(
        &self,
        field: &str,
        start: u64,
        values: &[&[u8]],
    ) -> Result<(), Error> {
        self.known_field(field)?;
        let request = ClientRequest::WriteField {
            field: field.to_string(),
            start,
            lengths: values.iter().map(|v| v.len() as u32).collect(),
        };
        let body = vec![Bytes::from(values.concat())];
        self.call(&request, body).await.map(|_| ())
    }

    /// Refuses a field the dataset does not have, naming those it has (checked before a
    /// write is sent).
    fn known_field(&self, name: &str) -> Result<(), Error> {
        if self.fields.iter().any(|f| f.name == name) {
            return Ok(());
        }
        Err(Error::UnknownField {
            name: name.to_string(),
            known: self
                .fields
                .iter()
                .map(|f| f.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })
    }

    /// One record's fields as it names them: names, lengths, one body piece.
    pub(super) fn encode_named(&self, record: &Record) -> Result<EncodedOne, Error> {
        let mut names = Vec::new();
        let mut lengths = Vec::new();
        let mut body = Vec::new();
        for &(name, payload) in record.values() {
            self.known_field(name)?;
            names.push(name.to_string());
            lengths.push(payload.len() as u32);
            body.extend_from_slice(payload);
        }
        Ok((names, lengths, vec![Bytes::from(body)]))
    }

    pub(super) fn encode_records(&self, records: &[Record]) -> Result<Encoded, Error> {
        let names: Vec<String> = self.fields.iter().map(|f| f.name.clone()).collect();
        for record in records {
            for (name, _) in record.values() {
                if !names.iter().any(|n| n == name) {
                    return Err(Error::UnknownField {
                        name: name.to_string(),
                        known: names.join(", "),
                    });
                }
            }
        }
        let mut lengths = Vec::with_capacity(names.len());
        let mut body = Vec::with_capacity(names.len());
        for name in &names {
            let payloads: Vec<&[u8]> = records
                .iter()
                .map(|r| r.get(name).unwrap_or_default())
                .collect();
            lengths.push(payloads.iter().map(|p| p.len() as u32).collect());
            body.push(Bytes::from(payloads.concat()));
        }
        Ok((names, lengths, body))
    }

    /// Appends records; returns their global index range.
    pub async fn append_many(&self, records: &[Record<'_>]) -> Result<Range<u64>, Error> {
        let (fields, lengths, body) = self.encode_records(records)?;
        // A refused append is cut back (where part of it landed) before the next write.
        self.across_map_switches(|| async {
            let request = ClientRequest::Append {
                fields: fields.clone(),
                lengths: lengths.clone(),
            };
            match self.call(&request, body.clone()).await?.0 {
                Reply::Appended { start, count } => Ok(start..start + count),
                other => Err(unexpected("append", &other)),
            }
        })
        .await
    }

    /// Appends one record; returns its index.
    pub async fn append(&self, record: &Record<'_>) -> Result<u64, Error> {
        Ok(self.append_many(std::slice::from_ref(record)).await?.start)
    }

    /// Replaces the fields `record` names of record `index`; its other fields keep their
    /// values (an empty payload makes a field absent).
    pub async fn modify(&self, index: u64, record: &Record<'_>) -> Result<(), Error> {
        let (fields, lengths, body) = self.encode_named(record)?;
        self.call(
            &ClientRequest::Modify {
                index,
                fields,
                lengths,
            },
            body,
        )
        .await
        .map(|_| ())
    }

    /// Swap-removes record `index`: the last record takes its index.
    pub async fn delete(&self, index: u64) -> Result<(), Error> {
        self.call(&ClientRequest::Delete { index }, Vec::new())
            .await
            .map(|_| ())
    }

    /// Commits every shard; returns once all have.
    pub async fn commit(&self) -> Result<(), Error> {
        self.call(&ClientRequest::Commit, Vec::new())
            .await
            .map(|_| ())
    }
}
