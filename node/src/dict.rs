//! Zstandard dictionaries of a dataset's fields: `dict/<field>.zdict` in the dataset
//! directory, trained on a sample of the field's records (`zr dict train`, `zr convert
//! --dict`). meta.json keeps each field's dictionary id (`FieldSpec::dict`), and opening the
//! dataset checks the file against it: a record compressed with one dictionary is never
//! read with another. Small records, which give a compressor too little context alone,
//! compress well with one.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::disk::Disk;
use crate::error::{Error, IoContext, Result};
use crate::meta::{sync_dir, write_atomically, FieldSpec};

/// The directory of a dataset's dictionaries.
pub const DICT_DIR: &str = "dict";
/// Dictionary bytes trained when no size is asked for (zstd's own default).
pub const DICT_BYTES_DEFAULT: usize = 112_640;

/// Where field `field`'s dictionary of the dataset at `dir` is kept.
pub fn path(dir: &Path, field: &str) -> PathBuf {
    dir.join(DICT_DIR).join(format!("{field}.zdict"))
}

/// A dictionary of at most `max_bytes` trained on `samples`; refused, saying why, when they
/// are too few or too alike to train one.
pub fn train(samples: &[&[u8]], max_bytes: usize) -> Result<Vec<u8>> {
    zstd::dict::from_samples(samples, max_bytes).map_err(|e| {
        Error::InvalidRecord(format!(
            "cannot train a dictionary from {} records: {e} (a dictionary needs many, varied records)",
            samples.len()
        ))
    })
}

/// Most bytes of records a dictionary is trained on (zstd suggests about 100 times the
/// dictionary's size).
pub const SAMPLE_BYTES_MAX: usize = 16 << 20;

/// Records to train a dictionary on, of `len` records read by `record`: evenly spread (at
/// most about 100,000), the empty ones left out, up to [`SAMPLE_BYTES_MAX`] bytes in all.
pub fn spread_samples<'a>(len: u64, record: impl Fn(u64) -> &'a [u8]) -> Vec<&'a [u8]> {
    let step = (len / 100_000).max(1);
    let mut samples = Vec::new();
    let mut total = 0;
    for i in (0..len).step_by(step as usize) {
        let bytes = record(i);
        if bytes.is_empty() {
            continue;
        }
        total += bytes.len();
        if total > SAMPLE_BYTES_MAX {
            break;
        }
        samples.push(bytes);
    }
    samples
}

/// The id a dictionary carries (`None` for bytes that are no zstd dictionary).
pub fn id(dict: &[u8]) -> Option<u32> {
    zstd::zstd_safe::get_dict_id_from_dict(dict).map(|id| id.get())
}

/// The id of `dict` once a sample compressed with it has read back: bytes that carry a
/// dictionary's magic and id but are none fail here, not in every append after a create.
pub fn check(field: &str, dict: &[u8]) -> Result<u32> {
    let bad = |why: String| Error::InvalidSchema(format!("field '{field}': {why}"));
    let id = id(dict).ok_or_else(|| bad("the dictionary is no zstd dictionary".into()))?;
    let sample = b"a sample record compressed with the dictionary, then read back".repeat(4);
    let compressed =
        zstd::bulk::Compressor::with_dictionary(3, dict).and_then(|mut c| c.compress(&sample));
    let back = compressed.and_then(|c| {
        zstd::bulk::Decompressor::with_dictionary(dict)
            .and_then(|mut d| d.decompress(&c, sample.len()))
    });
    match back {
        Ok(back) if back == sample => Ok(id),
        Ok(_) => Err(bad(format!(
            "dictionary {id} reads a sample back different"
        ))),
        Err(e) => Err(bad(format!("dictionary {id} cannot be used: {e}"))),
    }
}

/// Writes `dict` as field `field`'s dictionary of the dataset at `dir` (durably); returns
/// its id.
pub(crate) fn write(disk: &Disk, dir: &Path, field: &str, dict: &[u8]) -> Result<u32> {
    let id = check(field, dict)?;
    let parent = dir.join(DICT_DIR);
    disk.create_dir_all(&parent)
        .ctx("create directory", &parent)?;
    write_atomically(disk, &parent, &format!("{field}.zdict"), dict)?;
    sync_dir(disk, dir)?;
    Ok(id)
}

/// Field `spec`'s dictionary of the dataset at `dir`, if it has one, checked against the id
/// meta.json keeps.
pub(crate) fn load(dir: &Path, spec: &FieldSpec) -> Result<Option<Arc<[u8]>>> {
    let Some(want) = spec.dict else {
        return Ok(None);
    };
    let path = path(dir, &spec.name);
    let bytes = std::fs::read(&path).map_err(|e| Error::Corrupt {
        path: path.clone(),
        reason: format!(
            "field '{}' is compressed with dictionary {want}, and its file cannot be read: {e}",
            spec.name
        ),
    })?;
    match id(&bytes) {
        Some(have) if have == want => {
            let crc = crc32fast::hash(&bytes);
            if spec.dict_crc.is_some_and(|expected| expected != crc) {
                return Err(Error::Corrupt {
                    path,
                    reason: format!(
                        "field '{}''s dictionary {want} is damaged: its CRC32 is {crc:08x}, meta.json says {:08x}",
                        spec.name,
                        spec.dict_crc.unwrap_or_default()
                    ),
                });
            }
            Ok(Some(bytes.into()))
        }
        have => Err(Error::Corrupt {
            path,
            reason: format!(
                "field '{}' is compressed with dictionary {want}; this file {}",
                spec.name,
                match have {
                    Some(have) => format!("is dictionary {have}"),
                    None => "is no zstd dictionary (damaged?)".into(),
                }
            ),
        }),
    }
}
