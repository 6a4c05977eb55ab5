//! Offset tables: one `<field>.offset` file per field, entry i at byte 16·i.
//!
//! ```text
//! 0        8          12    16
//! | offset | chunk_id | len |      little-endian; offset = frame start in chunk `chunk_id`
//! ```
//! `len` is the stored payload length; `len == 0` means the record lacks the field (absent),
//! and such an entry is all zeros. Files grow in steps with `ftruncate`; entries are written
//! with `pwrite` and read through a mapping.

use std::fs::File;
use std::path::Path;

use crate::error::{IoContext, Result};

/// Bytes of one offset entry.
pub const ENTRY_BYTES: u64 = 16;

/// Where one field of one record is stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Entry {
    /// Byte offset of the frame in its chunk.
    pub offset: u64,
    /// Chunk id.
    pub chunk_id: u32,
    /// Stored payload length; 0 = absent.
    pub len: u32,
}

impl Entry {
    /// The entry of an absent field.
    pub const ABSENT: Entry = Entry {
        offset: 0,
        chunk_id: 0,
        len: 0,
    };

    /// Little-endian encoding.
    pub fn encode(self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[0..8].copy_from_slice(&self.offset.to_le_bytes());
        out[8..12].copy_from_slice(&self.chunk_id.to_le_bytes());
        out[12..16].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    /// Decodes what [`Entry::encode`] wrote.
    #[inline]
    pub fn decode(bytes: [u8; 16]) -> Entry {
        let [o0, o1, o2, o3, o4, o5, o6, o7, c0, c1, c2, c3, l0, l1, l2, l3] = bytes;
        Entry {
            offset: u64::from_le_bytes([o0, o1, o2, o3, o4, o5, o6, o7]),
            chunk_id: u32::from_le_bytes([c0, c1, c2, c3]),
            len: u32::from_le_bytes([l0, l1, l2, l3]),
        }
    }

    /// True if the record lacks this field.
    pub fn is_absent(self) -> bool {
        self.len == 0
    }
}

/// File name of a field's offset table.
pub fn offset_file_name(field: &str) -> String {
    format!("{field}.offset")
}

/// Writes `entries` as consecutive entries starting at entry `first`.
pub(crate) fn write_entries(
    disk: &crate::disk::Disk,
    file: &File,
    path: &Path,
    first: u64,
    entries: &[Entry],
) -> Result<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let mut bytes = Vec::with_capacity(entries.len() * ENTRY_BYTES as usize);
    for entry in entries {
        bytes.extend_from_slice(&entry.encode());
    }
    disk.write_at(file, path, &bytes, first * ENTRY_BYTES)
        .ctx("write offset table", path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_round_trip() {
        let e = Entry {
            offset: 0x0102_0304_0506_0708,
            chunk_id: 0x0a0b_0c0d,
            len: 77,
        };
        let bytes = e.encode();
        assert_eq!(&bytes[0..8], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(Entry::decode(bytes), e);
        assert_eq!(Entry::ABSENT.encode(), [0u8; 16]);
    }
}
