//! `redo.log`: entry changes to already-committed records, made durable by a commit.
//!
//! Appends write their entries straight into the offset tables, past the committed length,
//! where a reopen ignores them. Modify and delete (and appends that refill indices a delete
//! freed) change entries *below* the committed length; writing those in place before the
//! commit would let a crash expose an uncommitted change. So they wait in memory (the view's
//! overlay) and `commit` writes them here — fsynced before meta.json — then applies them to
//! the tables. A reopen re-applies the log if its generation equals meta.json's: the commit
//! landed, the in-place writes may not have. Re-applying is idempotent.
//!
//! ```text
//! magic "ZRREDO01" | generation u64 | fields u32 | count u64 | crc32 u32 |
//! count × (index u64, fields × entry 16 B)
//! ```

use std::path::Path;

use crate::error::{Error, IoContext, Result};
use crate::meta::write_atomically;
use crate::offset::Entry;

/// File name of the redo log inside a dataset directory.
pub const REDO_FILE: &str = "redo.log";
const MAGIC: &[u8; 8] = b"ZRREDO01";
const HEADER_BYTES: usize = 8 + 8 + 4 + 8 + 4;

/// Writes the log of `changes` (index → one entry per field) for commit `generation`.
pub(crate) fn write(
    disk: &crate::disk::Disk,
    dir: &Path,
    generation: u64,
    fields: usize,
    changes: &[(u64, &[Entry])],
) -> Result<()> {
    let mut body = Vec::with_capacity(changes.len() * (8 + 16 * fields));
    for (index, entries) in changes {
        debug_assert_eq!(entries.len(), fields);
        body.extend_from_slice(&index.to_le_bytes());
        for entry in *entries {
            body.extend_from_slice(&entry.encode());
        }
    }
    let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&generation.to_le_bytes());
    out.extend_from_slice(&(fields as u32).to_le_bytes());
    out.extend_from_slice(&(changes.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    out.extend_from_slice(&body);
    write_atomically(disk, dir, REDO_FILE, &out)
}

/// Entry changes of one commit: record index → one entry per field.
pub type Changes = Vec<(u64, Vec<Entry>)>;

/// Reads the log if it belongs to commit `generation`; `None` if there is none or it is stale.
pub(crate) fn read(dir: &Path, generation: u64, fields: usize) -> Result<Option<Changes>> {
    let path = dir.join(REDO_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).ctx("read", &path),
    };
    decode(&bytes, &path, generation, fields)
}

/// Decodes the log `bytes` (read from `path`, which errors name) if it belongs to commit
/// `generation`; `None` if it is stale.
pub fn decode(
    bytes: &[u8],
    path: &Path,
    generation: u64,
    fields: usize,
) -> Result<Option<Changes>> {
    let path = path.to_path_buf();
    let corrupt = |reason: String| Error::Corrupt {
        path: path.clone(),
        reason,
    };
    if bytes.len() < HEADER_BYTES || &bytes[0..8] != MAGIC {
        return Err(corrupt("not a redo log (bad magic or too short)".into()));
    }
    let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap_or_default());
    let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap_or_default());
    let log_generation = u64_at(8);
    if log_generation != generation {
        // Written by a commit whose meta.json never landed, or by an older commit already
        // applied: either way not part of the committed state.
        return Ok(None);
    }
    let log_fields = u32_at(16) as usize;
    let count = u64_at(20);
    let crc = u32_at(28);
    let body = &bytes[HEADER_BYTES..];
    let record_bytes = 8 + 16 * fields;
    if log_fields != fields || (body.len() as u64) != count.saturating_mul(record_bytes as u64) {
        return Err(corrupt(format!(
            "redo log of the committed generation {generation} has {log_fields} fields and {} body bytes for {count} changes; expected {fields} fields",
            body.len()
        )));
    }
    if crc32fast::hash(body) != crc {
        return Err(corrupt(format!(
            "redo log of the committed generation {generation} fails its CRC"
        )));
    }
    let changes = body
        .chunks_exact(record_bytes)
        .map(|rec| {
            let index = u64::from_le_bytes(rec[0..8].try_into().unwrap_or_default());
            let entries = rec[8..]
                .chunks_exact(16)
                .map(|e| Entry::decode(e.try_into().unwrap_or_default()))
                .collect();
            (index, entries)
        })
        .collect();
    Ok(Some(changes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_stale_and_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let e = [
            Entry {
                offset: 8,
                chunk_id: 1,
                len: 3,
            },
            Entry::ABSENT,
        ];
        write(&crate::disk::Disk::real(), dir.path(), 7, 2, &[(5, &e[..])]).unwrap();
        let back = read(dir.path(), 7, 2).unwrap().unwrap();
        assert_eq!(back, vec![(5, e.to_vec())]);
        assert!(read(dir.path(), 8, 2).unwrap().is_none());
        let path = dir.path().join(REDO_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        std::fs::write(&path, bytes).unwrap();
        assert!(matches!(read(dir.path(), 7, 2), Err(Error::Corrupt { .. })));
    }
}
