//! Units: independent index spaces inside one dataset.
//!
//! A dataset's records may be kept in several *units*, each with its own length, offset
//! tables and chunks, so that a unit can be added, dropped, or copied to another dataset as
//! its files, and the indices inside every other unit stay as they are. A cluster node keeps
//! one unit per slot it holds (see `zr_proto::placement`); a dataset on one host has one
//! unit, 0, and never needs to know of the others.
//!
//! A record is addressed by one u64: its unit in the top bits, its index inside the unit in
//! the low [`UNIT_SHIFT`] bits — so the addresses of unit 0 are the plain indices
//! `0..N`. Chunk ids carry their unit the same way, in their top bits, so a unit's chunk
//! files keep their names (and its entries their chunk ids) in any dataset.
//!
//! ```text
//! dataset/
//! ├── meta.json               every unit's length and chunks: the commit point
//! ├── <field>.offset          unit 0's offset tables
//! ├── units/<u>/<field>.offset  unit u's
//! └── chunk/<id>.zr           every unit's chunks; unit = id >> CHUNK_SEQ_BITS
//! ```

use std::path::{Path, PathBuf};

use crate::offset::offset_file_name;

/// Bits of an address that hold the index inside its unit: a record's address is its unit
/// in the top bits, its index inside the unit below; `address(unit, index)` makes one and
/// `split` takes it apart. A cluster's slot is a node's unit, so these are the placement's
/// own.
pub use zr_proto::placement::UNIT_SHIFT;
pub use zr_proto::placement::{split_address as split, unit_address as address};
/// Largest index inside a unit, plus one.
pub const UNIT_INDEX_LIMIT: u64 = 1 << UNIT_SHIFT;
/// Bits of a chunk id that number the chunk inside its unit.
pub const CHUNK_SEQ_BITS: u32 = 20;
/// Most units a dataset may have (ids `0..UNITS_MAX`): what the chunk ids leave for them.
pub const UNITS_MAX: u32 = 1 << (32 - CHUNK_SEQ_BITS);
/// The folder of the units other than 0, inside a dataset directory.
pub const UNITS_DIR: &str = "units";

/// The unit chunk `id` belongs to.
#[inline]
pub fn chunk_unit(id: u32) -> u32 {
    id >> CHUNK_SEQ_BITS
}

/// The position of chunk `id` among its unit's chunk ids.
#[inline]
pub fn chunk_seq(id: u32) -> u32 {
    id & ((1 << CHUNK_SEQ_BITS) - 1)
}

/// The first chunk id of unit `unit`.
pub fn first_chunk(unit: u32) -> u32 {
    unit << CHUNK_SEQ_BITS
}

/// The offset table of field `field` of unit `unit`: unit 0's in the dataset directory,
/// the others' side by side in `units/`, named `<unit>.<field>.offset` (one folder for all:
/// a folder per unit would double the files a move or rebuild makes and syncs).
pub fn offset_path(dir: &Path, unit: u32, field: &str) -> PathBuf {
    if unit == 0 {
        dir.join(offset_file_name(field))
    } else {
        dir.join(UNITS_DIR)
            .join(format!("{unit}.{}", offset_file_name(field)))
    }
}

/// The unit whose table is named `name` in `units/` (`None`: no table of a unit).
pub fn unit_of_table(name: &str) -> Option<u32> {
    let (id, rest) = name.split_once('.')?;
    let plain = !id.is_empty() && !id.starts_with('0') && id.bytes().all(|b| b.is_ascii_digit());
    let unit = id
        .parse::<u32>()
        .ok()
        .filter(|&u| plain && u > 0 && u < UNITS_MAX)?;
    rest.strip_suffix(".offset").filter(|f| !f.is_empty())?;
    Some(unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_chunk_ids_round_trip() {
        for (unit, index) in [(0, 0), (0, 77), (1, 0), (1023, UNIT_INDEX_LIMIT - 1)] {
            assert_eq!(split(address(unit, index)), (unit, index));
        }
        assert_eq!(address(0, 5), 5, "unit 0's addresses are plain indices");
        let id = first_chunk(UNITS_MAX - 1) + 9;
        assert_eq!((chunk_unit(id), chunk_seq(id)), (UNITS_MAX - 1, 9));
        assert_eq!(chunk_unit(1000), 0);
        assert_eq!(
            offset_path(Path::new("d"), 3, "a"),
            Path::new("d/units/3.a.offset")
        );
        assert_eq!(unit_of_table("3.a.offset"), Some(3));
        assert_eq!(unit_of_table("3.a.b.offset"), Some(3));
        for not in [
            "03.a.offset",
            "0.a.offset",
            "3..offset",
            "3.a",
            "x.a.offset",
            ".a.offset",
        ] {
            assert_eq!(unit_of_table(not), None, "{not}");
        }
        assert_eq!(offset_path(Path::new("d"), 0, "a"), Path::new("d/a.offset"));
    }
}
