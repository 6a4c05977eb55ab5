//! The bounds every header is checked against, before anything is allocated from it.

use super::*;

pub(super) fn check_reply(reply: &Reply, body: usize) -> Result<(), Error> {
    match reply {
        Reply::Gather { lengths } => check_columns(lengths, body),
        // Frames, checked as they are taken apart (crate::assemble).
        Reply::GatherParts { .. } => Ok(()),
        // The piece's bytes, checked against its CRC32 by the receiver.
        Reply::Piece { .. } if body <= SHIP_PIECE_MAX => Ok(()),
        Reply::Piece { .. } => Err(Error::Malformed(format!(
            "a piece of {body} bytes (at most {SHIP_PIECE_MAX})"
        ))),
        Reply::Pieces { pieces } => {
            let sum: u64 = pieces.iter().map(|p| u64::from(p.len)).sum();
            if sum != body as u64 || body > SHIP_PIECE_MAX {
                return Err(Error::Malformed(format!(
                    "pieces of {sum} bytes in a body of {body} (at most {SHIP_PIECE_MAX})"
                )));
            }
            Ok(())
        }
        _ => expect_empty(body),
    }
}

pub(super) fn check_fields(fields: &[String]) -> Result<(), Error> {
    if fields.len() > FIELDS_MAX {
        return Err(Error::Malformed(format!(
            "{} fields exceed the limit of {FIELDS_MAX}",
            fields.len()
        )));
    }
    Ok(())
}

/// Checks per-field length lists against each other and against the body size.
pub(super) fn check_columns(lengths: &[Vec<u32>], body: usize) -> Result<(), Error> {
    let total = column_bytes(lengths)?;
    if total != body as u64 {
        return Err(Error::Malformed(format!(
            "lengths add up to {total} bytes but the body has {body}"
        )));
    }
    Ok(())
}

/// Checks per-field length lists against each other and the limits; returns their total.
pub(super) fn column_bytes(lengths: &[Vec<u32>]) -> Result<u64, Error> {
    if lengths.len() > FIELDS_MAX {
        return Err(Error::Malformed(format!(
            "{} columns exceed the limit of {FIELDS_MAX}",
            lengths.len()
        )));
    }
    let records = lengths.first().map_or(0, Vec::len);
    if records > RECORDS_MAX || lengths.iter().any(|l| l.len() != records) {
        return Err(Error::Malformed(format!(
            "columns must all hold the same number (≤ {RECORDS_MAX}) of records"
        )));
    }
    Ok(lengths.iter().flatten().map(|&l| l as u64).sum())
}

pub(super) fn check_create(
    fields: &[FieldInfo],
    dicts: &[FieldDict],
    body: usize,
) -> Result<(), Error> {
    if fields.len() > FIELDS_MAX {
        return Err(Error::Malformed(format!(
            "{} fields (at most {FIELDS_MAX})",
            fields.len()
        )));
    }
    for dict in dicts {
        if !fields.iter().any(|f| f.name == dict.field) {
            return Err(Error::Malformed(format!(
                "a dictionary for field '{}', which the dataset does not have",
                dict.field.escape_debug()
            )));
        }
        if dict.bytes.len() > DICT_BYTES_MAX {
            return Err(Error::Malformed(format!(
                "field '{}''s dictionary holds {} bytes (at most {DICT_BYTES_MAX})",
                dict.field.escape_debug(),
                dict.bytes.len()
            )));
        }
    }
    expect_empty(body)
}

/// Records appended where `runs` say: as many runs' records as lengths, then as an append.
pub(super) fn check_placed_append(
    runs: &[Run],
    fields: &[String],
    lengths: &[Vec<u32>],
    body: usize,
) -> Result<(), Error> {
    let count = check_runs(runs)?;
    let records = lengths.first().map_or(0, Vec::len) as u64;
    if count != records {
        return Err(Error::Malformed(format!(
            "runs of {count} records, but the lengths describe {records}"
        )));
    }
    check_append(fields, lengths, body)
}

/// The records `runs` cover, refused past [`RECORDS_MAX`] or with a run that overflows.
pub(super) fn check_runs(runs: &[Run]) -> Result<u64, Error> {
    let mut count = 0u64;
    for run in runs {
        if run
            .at
            .checked_add(run.count)
            .is_none_or(|end| end > 1 << crate::placement::UNIT_SHIFT)
        {
            return Err(Error::Malformed(format!(
                "a run of {} records from {} in slot {} passes a slot's end",
                run.count, run.at, run.slot
            )));
        }
        count = count.saturating_add(run.count);
    }
    if count > RECORDS_MAX as u64 {
        return Err(Error::Malformed(format!(
            "runs of {count} records (at most {RECORDS_MAX} at once)"
        )));
    }
    Ok(count)
}

pub(super) fn check_gather(indices: &[u64], fields: &[String], body: usize) -> Result<(), Error> {
    check_fields(fields)?;
    if indices.len() > RECORDS_MAX {
        return Err(Error::Malformed(format!(
            "{} indices exceed the limit of {RECORDS_MAX}",
            indices.len()
        )));
    }
    expect_empty(body)
}

pub(super) fn check_append(
    fields: &[String],
    lengths: &[Vec<u32>],
    body: usize,
) -> Result<(), Error> {
    check_per_field(fields, lengths.len(), "length lists")?;
    check_columns(lengths, body)
}

pub(super) fn check_modify(fields: &[String], lengths: &[u32], body: usize) -> Result<(), Error> {
    check_per_field(fields, lengths.len(), "lengths")?;
    check_body(lengths, body)
}

/// Valid field names, and `given` of `what` (e.g. "lengths"): one per field.
fn check_per_field(fields: &[String], given: usize, what: &str) -> Result<(), Error> {
    check_fields(fields)?;
    if given != fields.len() {
        return Err(Error::Malformed(format!(
            "{} fields but {given} {what}",
            fields.len()
        )));
    }
    Ok(())
}

/// One field's values of many records: at most `RECORDS_MAX`, their lengths adding up to
/// the body.
pub(super) fn check_field_values(lengths: &[u32], body: usize) -> Result<(), Error> {
    if lengths.len() > RECORDS_MAX {
        return Err(Error::Malformed(format!(
            "{} records written at once (at most {RECORDS_MAX})",
            lengths.len()
        )));
    }
    check_body(lengths, body)
}

/// Payload lengths that add up to the body.
pub(super) fn check_body(lengths: &[u32], body: usize) -> Result<(), Error> {
    let total: u64 = lengths.iter().map(|&l| l as u64).sum();
    if total != body as u64 {
        return Err(Error::Malformed(format!(
            "lengths add up to {total} bytes but the body has {body}"
        )));
    }
    Ok(())
}

pub(super) fn expect_empty(body: usize) -> Result<(), Error> {
    if body != 0 {
        return Err(Error::Malformed(format!("unexpected body of {body} bytes")));
    }
    Ok(())
}

/// Cuts a checked body into per-field, per-record slices: `columns[f][k]`.
pub fn split_columns<'a>(lengths: &[Vec<u32>], mut body: &'a [u8]) -> Vec<Vec<&'a [u8]>> {
    lengths
        .iter()
        .map(|column| {
            column
                .iter()
                .map(|&len| {
                    let (record, rest) = body.split_at((len as usize).min(body.len()));
                    body = rest;
                    record
                })
                .collect()
        })
        .collect()
}
