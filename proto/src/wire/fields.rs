//! Fields as the wire describes them: their storage, type and zstd dictionary.

use super::*;

/// A field's storage as commands, configurations and the wire spell it: `raw`, `flate`,
/// `zstd` or `zstd:LEVEL` (1–22). Returns the kind and the level, if given.
pub fn parse_storage(text: &str) -> Result<(&'static str, Option<i32>), Invalid> {
    match text {
        "raw" => Ok(("raw", None)),
        "flate" => Ok(("flate", None)),
        "zstd" => Ok(("zstd", None)),
        _ => match text.strip_prefix("zstd:") {
            Some(level) => {
                let level = level
                    .parse::<i32>()
                    .ok()
                    .filter(|l| (1..=22).contains(l))
                    .ok_or_else(|| Invalid::ZstdLevel(level.escape_debug().to_string()))?;
                Ok(("zstd", Some(level)))
            }
            None => Err(Invalid::Compression(text.escape_debug().to_string())),
        },
    }
}

/// A field as the wire describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldInfo {
    pub name: String,
    /// Its storage (see [`parse_storage`]).
    pub compress: String,
    pub dtype: Option<String>,
    pub shape: Option<Vec<u64>>,
    /// The zstd dictionary its records are compressed with, if any.
    pub dict: Option<DictRef>,
}

/// A zstd dictionary as a field names it: its id and the CRC32 of its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DictRef {
    pub id: u32,
    pub crc: u32,
}

impl DictRef {
    /// How `bytes` are named, or `None` if they are no zstd dictionary.
    pub fn of(bytes: &[u8]) -> Option<DictRef> {
        Some(DictRef {
            id: zstd_dict_id(bytes)?,
            crc: crc32fast::hash(bytes),
        })
    }
}

impl FieldInfo {
    /// A field of storage `compress` (see [`parse_storage`]), untyped, with no dictionary.
    pub fn new(name: impl Into<String>, compress: impl Into<String>) -> FieldInfo {
        FieldInfo {
            name: name.into(),
            compress: compress.into(),
            dtype: None,
            shape: None,
            dict: None,
        }
    }
}

/// A zstd dictionary for field `field`, as a dataset is created with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldDict {
    pub field: String,
    pub bytes: Vec<u8>,
}

/// The id a zstd dictionary names itself by (RFC 8878, section 5: the magic number
/// 0xEC30A437, then the id, both little-endian), or `None` for bytes that do not start like
/// one (or whose id is 0, "no id").
pub fn zstd_dict_id(bytes: &[u8]) -> Option<u32> {
    const MAGIC: u32 = 0xEC30_A437;
    let word = |at: usize| {
        bytes
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    (word(0)? == MAGIC).then_some(())?;
    word(4).filter(|&id| id != 0)
}
