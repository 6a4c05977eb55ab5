//! `meta.json`: the dataset's global metadata and its commit point.
//!
//! Everything a reopen trusts comes from here: the length N, the fields, and for every chunk
//! the number of bytes and records committed. Bytes in any file past what this file commits
//! are ignored. It is replaced atomically (temp file, fsync, rename, fsync directory), so a
//! crash leaves either the old or the new version, whole.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::disk::Disk;
use crate::error::{Error, IoContext, Result, SchemaError};
use crate::unit::{chunk_unit, UNITS_MAX};

/// The `format` key every dataset carries.
pub const FORMAT_NAME: &str = "zrecord";
/// The on-disk format version of a dataset with one unit, 0 (see `unit`): what a dataset on
/// one host is.
pub const FORMAT_VERSION: u32 = 1;
/// The version of one with other units: `units` lists them all.
pub const FORMAT_VERSION_UNITS: u32 = 2;
/// File name of the metadata inside a dataset directory.
pub const META_FILE: &str = "meta.json";
/// Longest field name accepted (names become file names): kept beside the error that
/// names it, so the error module needs nothing of this one.
pub use crate::error::FIELD_NAME_MAX;

/// How a field's payloads are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Stored as given; gathers return zero-copy slices of the mapped chunk.
    Raw,
    /// Deflate per record; gathers decompress into buffers owned by the batch.
    Flate,
    /// Zstandard per record (at the field's level), as `Flate` otherwise; a record that
    /// would not get smaller is stored as given (its frame's stored and logical lengths are
    /// then equal, which a compressed record's never are).
    Zstd,
}

/// Zstandard's level when a field names none.
pub const ZSTD_LEVEL_DEFAULT: i32 = 3;

/// A field's storage as written in commands and on the wire: `raw`, `flate`, `zstd` or
/// `zstd:LEVEL` (1–22; see `zr_proto::wire::parse_storage`).
pub fn parse_storage(text: &str) -> Result<(Compression, Option<i32>), zr_proto::Invalid> {
    let (kind, level) = zr_proto::wire::parse_storage(text)?;
    Ok((kind.parse()?, level))
}

impl std::str::FromStr for Compression {
    type Err = zr_proto::Invalid;
    fn from_str(s: &str) -> Result<Self, zr_proto::Invalid> {
        match s {
            "raw" => Ok(Compression::Raw),
            "flate" => Ok(Compression::Flate),
            "zstd" => Ok(Compression::Zstd),
            other => Err(zr_proto::Invalid::Compression(
                other.escape_debug().to_string(),
            )),
        }
    }
}

/// One named field of the schema.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldSpec {
    /// Name: 1–128 characters of `[A-Za-z0-9_.-]`, not starting with '.'.
    pub name: String,
    /// Storage of the field's payloads.
    pub compress: Compression,
    /// NumPy type string of the elements (e.g. `<f4`, `|u1`), for typed views.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    /// Per-record shape, for typed views. With a dtype, it fixes every record's length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<Vec<u64>>,
    /// Zstandard's level for a `zstd` field (default [`ZSTD_LEVEL_DEFAULT`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<i32>,
    /// The id of the dictionary a `zstd` field's records are compressed with, kept in
    /// `dict/<field>.zdict` (see `dict`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dict: Option<u32>,
    /// CRC32 of that dictionary's file: a damaged one is refused when the dataset opens
    /// (records decoded with it would be wrong while their frames' CRCs held).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dict_crc: Option<u32>,
}

impl FieldSpec {
    /// An untyped field.
    pub fn new(name: impl Into<String>, compress: Compression) -> FieldSpec {
        FieldSpec {
            name: name.into(),
            compress,
            dtype: None,
            shape: None,
            level: None,
            dict: None,
            dict_crc: None,
        }
    }

    /// An untyped field stored as `storage` says (see [`parse_storage`]).
    pub fn stored(name: impl Into<String>, storage: &str) -> Result<FieldSpec, SchemaError> {
        let (compress, level) = parse_storage(storage)?;
        Ok(FieldSpec {
            level,
            ..FieldSpec::new(name, compress)
        })
    }

    /// Its storage as [`parse_storage`] reads it: `raw`, `flate`, `zstd` or `zstd:LEVEL`.
    pub fn storage(&self) -> String {
        match (self.compress, self.level) {
            (Compression::Raw, _) => "raw".into(),
            (Compression::Flate, _) => "flate".into(),
            (Compression::Zstd, None) => "zstd".into(),
            (Compression::Zstd, Some(level)) => format!("zstd:{level}"),
        }
    }

    /// Zstandard's level for this field.
    pub fn zstd_level(&self) -> i32 {
        self.level.unwrap_or(ZSTD_LEVEL_DEFAULT)
    }

    /// A raw, untyped field.
    pub fn raw(name: impl Into<String>) -> FieldSpec {
        FieldSpec::new(name, Compression::Raw)
    }

    /// A Deflate-compressed, untyped field.
    pub fn flate(name: impl Into<String>) -> FieldSpec {
        FieldSpec::new(name, Compression::Flate)
    }

    /// Adds a dtype and per-record shape.
    pub fn typed(mut self, dtype: impl Into<String>, shape: Vec<u64>) -> FieldSpec {
        self.dtype = Some(dtype.into());
        self.shape = Some(shape);
        self
    }

    /// "dtype D, shape [A, B]", for messages.
    pub fn describe_type(&self) -> String {
        let shape: Vec<String> = self.shape.iter().flatten().map(|d| d.to_string()).collect();
        format!(
            "dtype {}, shape [{}]",
            self.dtype.as_deref().unwrap_or("none"),
            shape.join(", ")
        )
    }

    /// Bytes every present record must have, when dtype and shape fix it.
    pub fn record_bytes(&self) -> Option<u64> {
        let item = dtype_itemsize(self.dtype.as_deref()?).ok()?;
        self.shape
            .as_ref()?
            .iter()
            .try_fold(item, |acc, &d| acc.checked_mul(d))
    }

    pub(crate) fn validate(&self) -> Result<(), SchemaError> {
        let name = &self.name;
        let valid_chars = name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if name.is_empty() || name.len() > FIELD_NAME_MAX || !valid_chars || name.starts_with('.') {
            return Err(SchemaError::FieldName(name.clone()));
        }
        let field = || format!("field '{name}'");
        if self.compress != Compression::Zstd && (self.level.is_some() || self.dict.is_some()) {
            let storage = self.storage();
            return Err(SchemaError::NotZstd { storage }.of(field()));
        }
        if self.level.is_some_and(|l| !(1..=22).contains(&l)) {
            return Err(SchemaError::ZstdLevel.of(field()));
        }
        if let Some(dtype) = &self.dtype {
            dtype_itemsize(dtype).map_err(|e| e.of(field()))?;
        }
        if let (Some(shape), None, Some(_)) = (&self.shape, self.record_bytes(), &self.dtype) {
            return Err(SchemaError::ShapeOverflow(shape.clone()).of(field()));
        }
        if let Some(bytes) = self.record_bytes().filter(|&b| b > u32::MAX as u64) {
            return Err(SchemaError::RecordTooLarge(bytes).of(field()));
        }
        Ok(())
    }
}

/// Element size of a NumPy type string such as `<f4`, `|u1`, `>i8`, `<c16`, `|b1`, `|S10`.
pub fn dtype_itemsize(dtype: &str) -> Result<u64, SchemaError> {
    let bad = || SchemaError::Dtype(dtype.to_string());
    let rest = dtype.strip_prefix(['<', '>', '|', '=']).unwrap_or(dtype);
    let mut chars = rest.chars();
    let kind = chars.next().ok_or_else(bad)?;
    if !"biufcSUV".contains(kind) {
        return Err(bad());
    }
    let size: u64 = chars.as_str().parse().map_err(|_| bad())?;
    if size == 0 {
        return Err(bad());
    }
    Ok(if kind == 'U' { size * 4 } else { size })
}

/// Committed state of one chunk file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkMeta {
    /// Chunk id: the file is `chunk/<id>.zr`.
    pub id: u32,
    /// Bytes committed (the write position).
    pub bytes: u64,
    /// Records committed into it.
    pub records: u32,
    /// A sealed chunk is full and never written again; an unfull one is some writer's.
    pub sealed: bool,
}

/// Committed state of one unit (see `unit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitMeta {
    pub id: u32,
    /// Records committed into it.
    pub length: u64,
}

/// The contents of `meta.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// Always [`FORMAT_NAME`].
    pub format: String,
    /// On-disk format version.
    pub version: u32,
    /// Incremented by every commit; ties `redo.log` to the commit that wrote it.
    pub generation: u64,
    /// Number of records N: with units, of all of them.
    pub length: u64,
    /// Records per chunk before a writer seals it.
    pub chunk_records: u32,
    /// Chunk files grow by this many bytes at a time.
    pub chunk_grow_bytes: u64,
    /// Offset tables grow by this many entries at a time.
    pub offset_grow_entries: u64,
    /// The schema.
    pub fields: Vec<FieldSpec>,
    /// Every chunk, sealed or unfull, ordered by id.
    pub chunks: Vec<ChunkMeta>,
    /// Version 2: every unit, ordered by id (see [`Meta::units`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub units: Vec<UnitMeta>,
}

impl Meta {
    /// The layout this dataset was created with: a copy made with them lays its files out
    /// the same way.
    pub fn create_options(&self) -> crate::CreateOptions {
        crate::CreateOptions {
            chunk_records: self.chunk_records,
            chunk_grow_bytes: self.chunk_grow_bytes,
            offset_grow_entries: self.offset_grow_entries,
        }
    }

    /// Every unit and its length, ordered by id: for version 1, unit 0 alone.
    pub fn units(&self) -> Vec<UnitMeta> {
        if self.version == FORMAT_VERSION {
            vec![UnitMeta {
                id: 0,
                length: self.length,
            }]
        } else {
            self.units.clone()
        }
    }

    /// Records `units` (ordered by id) as the dataset's: version 1 if they are unit 0
    /// alone, else version 2.
    pub fn set_units(&mut self, units: Vec<UnitMeta>) {
        self.length = units.iter().map(|u| u.length).sum();
        if units.len() == 1 && units[0].id == 0 {
            self.version = FORMAT_VERSION;
            self.units = Vec::new();
        } else {
            self.version = FORMAT_VERSION_UNITS;
            self.units = units;
        }
    }

    /// Checks everything that does not need the other files.
    pub fn validate(&self) -> Result<(), SchemaError> {
        if self.fields.is_empty() {
            return Err(SchemaError::NoFields);
        }
        for (i, field) in self.fields.iter().enumerate() {
            field.validate()?;
            if self.fields[..i].iter().any(|f| f.name == field.name) {
                return Err(SchemaError::FieldTwice(field.name.clone()));
            }
        }
        for (setting, value, min) in [
            ("chunk_records", u64::from(self.chunk_records), 1),
            ("chunk_grow_bytes", self.chunk_grow_bytes, 4096),
            ("offset_grow_entries", self.offset_grow_entries, 1),
        ] {
            if value < min {
                return Err(SchemaError::TooSmall { setting, min });
            }
        }
        for pair in self.chunks.windows(2) {
            if pair[0].id >= pair[1].id {
                return Err(SchemaError::ChunkOrder(pair[0].id, pair[1].id));
            }
        }
        let units = self.units();
        for pair in units.windows(2) {
            if pair[0].id >= pair[1].id {
                return Err(SchemaError::UnitOrder(pair[0].id, pair[1].id));
            }
        }
        if let Some(unit) = units.iter().find(|u| u.id >= UNITS_MAX) {
            return Err(SchemaError::UnitId(unit.id));
        }
        if self.version == FORMAT_VERSION_UNITS
            && self.length != units.iter().map(|u| u.length).sum::<u64>()
        {
            return Err(SchemaError::UnitLengths(self.length));
        }
        for chunk in &self.chunks {
            let unit = chunk_unit(chunk.id);
            if units.binary_search_by_key(&unit, |u| u.id).is_err() {
                return Err(SchemaError::ChunkUnit { id: chunk.id, unit });
            }
        }
        for chunk in &self.chunks {
            if chunk.records > self.chunk_records {
                return Err(SchemaError::ChunkOverfull {
                    id: chunk.id,
                    records: chunk.records.into(),
                    max: self.chunk_records.into(),
                });
            }
        }
        Ok(())
    }

    /// Reads and validates `dir/meta.json`.
    pub fn load(dir: &Path) -> Result<Meta> {
        let path = dir.join(META_FILE);
        let not_dataset = |reason: String| Error::NotADataset {
            path: dir.to_path_buf(),
            reason,
        };
        let text = match fs::read(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(not_dataset(format!("{META_FILE} not found")))
            }
            Err(e) => return Err(e).ctx("read", &path),
        };
        Meta::parse(&text, dir)
    }

    /// Parses and validates the bytes of `dir/meta.json` (`dir` names it in errors).
    pub fn parse(text: &[u8], dir: &Path) -> Result<Meta> {
        let path = dir.join(META_FILE);
        let not_dataset = |reason: String| Error::NotADataset {
            path: dir.to_path_buf(),
            reason,
        };
        // Check the format and version before the rest, so a newer format gets a clear error
        // rather than a complaint about some field it added.
        let value: serde_json::Value = serde_json::from_slice(text)
            .map_err(|e| not_dataset(format!("{META_FILE} is not valid JSON: {e}")))?;
        if value.get("format").and_then(|f| f.as_str()) != Some(FORMAT_NAME) {
            return Err(not_dataset(format!(
                "{META_FILE} has no \"format\": \"{FORMAT_NAME}\" key"
            )));
        }
        let version = value.get("version").and_then(|v| v.as_u64()).unwrap_or(0);
        if version != FORMAT_VERSION as u64 && version != FORMAT_VERSION_UNITS as u64 {
            return Err(Error::UnsupportedVersion {
                path: dir.to_path_buf(),
                found: version,
                supported: FORMAT_VERSION_UNITS,
            });
        }
        let meta: Meta = serde_json::from_value(value).map_err(|e| Error::Corrupt {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        meta.validate().map_err(|e| Error::Corrupt {
            path,
            reason: e.to_string(),
        })?;
        Ok(meta)
    }

    /// Replaces `dir/meta.json` atomically and durably.
    pub fn store(&self, disk: &Disk, dir: &Path) -> Result<()> {
        let text = serde_json::to_vec_pretty(self).map_err(|e| Error::Corrupt {
            path: dir.join(META_FILE),
            reason: format!("cannot serialize metadata: {e}"),
        })?;
        write_atomically(disk, dir, META_FILE, &text)
    }
}

/// Writes `dir/name` as a whole or not at all: temp file, fsync, rename, fsync directory.
pub fn write_atomically(disk: &Disk, dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let tmp: PathBuf = dir.join(format!("{name}.tmp"));
    let path = dir.join(name);
    let file = disk.create(&tmp).ctx("create", &tmp)?;
    disk.write_at(&file, &tmp, bytes, 0).ctx("write", &tmp)?;
    disk.sync(&file, &tmp).ctx("fsync", &tmp)?;
    drop(file);
    disk.rename(&tmp, &path).ctx("rename into place", &path)?;
    sync_dir(disk, dir)
}

/// Makes renames and creations inside `dir` durable.
pub fn sync_dir(disk: &Disk, dir: &Path) -> Result<()> {
    disk.sync_dir(dir).ctx("fsync directory", dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_sizes() {
        assert_eq!(dtype_itemsize("<f4"), Ok(4));
        assert_eq!(dtype_itemsize("|u1"), Ok(1));
        assert_eq!(dtype_itemsize("<U3"), Ok(12));
        assert_eq!(dtype_itemsize("f8"), Ok(8));
        assert!(dtype_itemsize("float").is_err());
        assert!(dtype_itemsize("<f0").is_err());
        assert_eq!(
            FieldSpec::raw("x").typed("<f4", vec![3, 4]).record_bytes(),
            Some(48)
        );
    }

    #[test]
    fn field_names() {
        assert!(FieldSpec::raw("image.jpg_2-a").validate().is_ok());
        for bad in ["", ".hidden", "a/b", "a b", &"x".repeat(200)] {
            assert!(FieldSpec::raw(bad).validate().is_err(), "{bad:?} accepted");
        }
    }
}
