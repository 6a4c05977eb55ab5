//! Building datasets from NumPy files: one record per row of a `.npy` array, or
//! variable-length records from `values.bin` + `offsets.npy` (N+1 u64 byte offsets).
//!
//! Inputs are memory-mapped and appended in slices of a few MiB, so files larger than memory
//! convert in bounded memory. Everything is checked before the first record is written, and
//! the dataset is committed once at the end: a failed conversion leaves the dataset as it was.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::{Error, IoContext, Result};
use crate::meta::{dtype_itemsize, Compression, FieldSpec};
use crate::store::{CreateOptions, Store};
use zr_common::Record;

/// Bytes appended per `append_many` call.
const SLICE_BYTES: u64 = 8 << 20;
/// Most records appended in one call, whatever their size (empty rows take no bytes but
/// still an entry each).
const SLICE_RECORDS_MAX: u64 = 1 << 16;
/// Longest `.npy` header accepted.
const NPY_HEADER_MAX: usize = 1 << 20;

/// What a `.npy` header says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpyHeader {
    /// NumPy type string, e.g. `<f4`.
    pub descr: String,
    /// Column-major data (refused by the converters).
    pub fortran_order: bool,
    /// Array shape.
    pub shape: Vec<u64>,
    /// Offset of the data in the file.
    pub data_offset: u64,
}

impl NpyHeader {
    /// Parses the header at the start of `bytes`; `path` names the file in errors.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<NpyHeader> {
        let bad = |reason: String| Error::InvalidInput {
            path: path.to_path_buf(),
            reason,
        };
        if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
            return Err(bad("not a .npy file (no \\x93NUMPY magic)".into()));
        }
        let (len, start) = match bytes[6] {
            1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
            2 | 3 if bytes.len() >= 12 => (
                u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
                12,
            ),
            major => {
                return Err(bad(format!(
                    "unsupported .npy format version {major}.{}",
                    bytes[7]
                )))
            }
        };
        if len > NPY_HEADER_MAX || bytes.len() < start + len {
            return Err(bad(format!(
                "header of {len} bytes is truncated or too long"
            )));
        }
        let text = std::str::from_utf8(&bytes[start..start + len])
            .map_err(|_| bad("header is not text".into()))?;
        let descr = dict_value(text, "descr").ok_or_else(|| bad("header has no 'descr'".into()))?;
        if descr.starts_with('[') {
            return Err(bad(
                "structured dtypes are not supported; convert one field at a time".into(),
            ));
        }
        let descr = descr.trim_matches(|c| c == '\'' || c == '"').to_string();
        dtype_itemsize(&descr).map_err(|e| {
            bad(format!(
                "{e} (object and datetime arrays are not supported)"
            ))
        })?;
        let fortran_order = match dict_value(text, "fortran_order") {
            Some("True") => true,
            Some("False") => false,
            _ => return Err(bad("header has no valid 'fortran_order'".into())),
        };
        let shape_text =
            dict_value(text, "shape").ok_or_else(|| bad("header has no 'shape'".into()))?;
        let inner = shape_text
            .strip_prefix('(')
            .and_then(|s| s.strip_suffix(')'))
            .ok_or_else(|| bad(format!("shape {shape_text} is not a tuple")))?;
        let shape = inner
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| s.trim_end_matches('L').parse::<u64>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| bad(format!("shape {shape_text} is not a tuple of integers")))?;
        Ok(NpyHeader {
            descr,
            fortran_order,
            shape,
            data_offset: (start + len) as u64,
        })
    }
}

/// A `.npy` file (format 1.0, C order) of dtype `descr` and `shape` holding `data`, as
/// NumPy writes it: the header padded with spaces to a multiple of 64 bytes.
pub fn npy_bytes(descr: &str, shape: &[u64], data: &[u8]) -> Vec<u8> {
    let mut header = format!(
        "{{'descr': '{descr}', 'fortran_order': False, 'shape': {}, }}",
        shape_tuple(shape)
    );
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    bytes
}

/// A shape as a Python tuple: `(5,)`, `(2, 3)`, `()`.
fn shape_tuple(shape: &[u64]) -> String {
    match shape {
        [one] => format!("({one},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The text of `key`'s value in a Python dict literal such as NumPy writes.
fn dict_value<'a>(dict: &'a str, key: &str) -> Option<&'a str> {
    let at = dict.find(&format!("'{key}'"))? + key.len() + 2;
    let rest = dict[at..].trim_start().strip_prefix(':')?.trim_start();
    let end = match rest.chars().next()? {
        '(' => rest.find(')')? + 1,
        '[' => rest.find(']')? + 1,
        q @ ('\'' | '"') => rest[1..].find(q)? + 2,
        _ => rest.find([',', '}'])?,
    };
    Some(rest[..end].trim())
}

/// A memory-mapped input file.
struct Input {
    path: PathBuf,
    map: Option<Mmap>,
}

impl Input {
    fn open(path: &Path) -> Result<Input> {
        let file = File::open(path).ctx("open", path)?;
        let len = file.metadata().ctx("stat", path)?.len();
        let map = if len == 0 {
            None
        } else {
            // SAFETY: the input is only read; a file changed by another process while we
            // convert it gives wrong bytes (caught by nothing) or a fault, as with any reader.
            Some(unsafe { Mmap::map(&file) }.ctx("mmap", path)?)
        };
        Ok(Input {
            path: path.to_path_buf(),
            map,
        })
    }

    fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or_default()
    }
}

/// What to fill: one field, its storage, and whether records are added to existing ones.
pub struct Target<'a> {
    /// Field to fill.
    pub field: &'a str,
    /// Its storage, and Zstandard's level for a zstd field (`None`: the default).
    pub compress: Compression,
    pub level: Option<i32>,
    /// Add to an existing dataset instead of creating one.
    pub append: bool,
}

impl Target<'_> {
    /// The field as the target describes it (untyped).
    pub fn spec(&self) -> FieldSpec {
        FieldSpec {
            level: self.level,
            ..FieldSpec::new(self.field, self.compress)
        }
    }

    /// Its storage as commands spell it (`raw`, `flate`, `zstd`, `zstd:LEVEL`).
    pub fn storage(&self) -> String {
        self.spec().storage()
    }
}

/// Where converted records go: a dataset directory ([`LocalDataset`]), or a cluster through
/// its router (the `zr` command implements that one with the client library).
pub trait Destination {
    /// Gets ready for `target`'s records, described by `spec` (dtype and shape included):
    /// creates the dataset, or checks that the existing one fits.
    fn open(&mut self, target: &Target, spec: FieldSpec) -> Result<()>;
    /// Appends records (each names only the target field).
    fn append_many(&mut self, records: &[Record]) -> Result<()>;
    /// Makes everything appended durable.
    fn commit(&mut self) -> Result<()>;
    /// Bytes free where the records go, and that place in words, if known.
    fn room(&self) -> Option<(u64, String)> {
        None
    }
}

/// Refuses a conversion of `records` records of `data_bytes` bytes in all that `dest` has
/// no room for: each record takes a 16-byte offset entry (so even empty rows take room) and
/// each present value a 16-byte frame header besides its bytes.
fn check_room(dest: &dyn Destination, input: &Path, records: u64, data_bytes: u64) -> Result<()> {
    let Some((free, place)) = dest.room() else {
        return Ok(());
    };
    let needed = records
        .saturating_mul(2 * crate::offset::ENTRY_BYTES)
        .saturating_add(data_bytes);
    if needed > free {
        return Err(Error::InvalidInput {
            path: input.to_path_buf(),
            reason: format!(
                "{records} records of {data_bytes} bytes in all need about {} on disk (32 bytes of index and framing per record, plus the data), but {place} has {} free",
                zr_common::human_bytes(needed),
                zr_common::human_bytes(free)
            ),
        });
    }
    Ok(())
}

/// Bytes an unprivileged writer may still use on the filesystem holding `path` (or its
/// nearest existing ancestor), if the system says.
fn free_bytes(path: &Path) -> Option<u64> {
    let existing = path.ancestors().find(|p| p.exists())?;
    let existing = if existing.as_os_str().is_empty() {
        Path::new(".")
    } else {
        existing
    };
    let name = std::ffi::CString::new(existing.as_os_str().as_encoded_bytes()).ok()?;
    let mut stats = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `name` is a NUL-terminated path and `stats` points to writable memory of the
    // right type, which statvfs fills when it returns 0.
    if unsafe { libc::statvfs(name.as_ptr(), stats.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it initialised `stats`.
    let stats = unsafe { stats.assume_init() };
    Some(stats.f_bavail.saturating_mul(stats.f_frsize))
}

/// A dataset directory as a conversion's destination.
pub struct LocalDataset {
    dir: PathBuf,
    store: Option<Store>,
}

impl LocalDataset {
    /// The dataset at `dir` (created by `open` unless the target appends).
    pub fn new(dir: &Path) -> LocalDataset {
        LocalDataset {
            dir: dir.to_path_buf(),
            store: None,
        }
    }

    fn store(&self) -> Result<&Store> {
        self.store.as_ref().ok_or_else(|| Error::NotADataset {
            path: self.dir.clone(),
            reason: "not opened for conversion".into(),
        })
    }
}

/// A field's dtype and shape in words, for messages: `dtype |u1 shape (64,)`.
fn describe_type(dtype: &Option<String>, shape: &Option<Vec<u64>>) -> String {
    let dtype = dtype.as_deref().unwrap_or("none");
    match shape {
        Some(shape) => format!("dtype {dtype} shape {}", shape_tuple(shape)),
        None => format!("dtype {dtype}, no shape"),
    }
}

fn compression_name(compress: Compression) -> &'static str {
    match compress {
        Compression::Raw => "raw",
        Compression::Flate => "flate",
        Compression::Zstd => "zstd",
    }
}

impl Destination for LocalDataset {
    fn room(&self) -> Option<(u64, String)> {
        Some((free_bytes(&self.dir)?, self.dir.display().to_string()))
    }

    fn open(&mut self, target: &Target, spec: FieldSpec) -> Result<()> {
        let store = if target.append {
            let store = Store::open(&self.dir)?;
            let existing = &store.fields()[store.field_id(target.field)?];
            let types_differ = spec.dtype.is_some()
                && (existing.dtype != spec.dtype || existing.shape != spec.shape);
            if types_differ {
                return Err(Error::InvalidRecord(format!(
                    "field '{}' holds {}; the input has {}",
                    target.field,
                    describe_type(&existing.dtype, &existing.shape),
                    describe_type(&spec.dtype, &spec.shape)
                )));
            }
            if existing.compress != target.compress {
                return Err(Error::InvalidRecord(format!(
                    "field '{}' is stored {}; appending asks for {} (drop --compress, or give --compress {})",
                    target.field,
                    compression_name(existing.compress),
                    compression_name(target.compress),
                    compression_name(existing.compress)
                )));
            }
            store
        } else {
            Store::create(&self.dir, vec![spec], CreateOptions::default())?
        };
        self.store = Some(store);
        Ok(())
    }

    fn append_many(&mut self, records: &[Record]) -> Result<()> {
        self.store()?.append_many(records).map(|_| ())
    }

    fn commit(&mut self) -> Result<()> {
        self.store()?.commit()
    }
}

/// Appends `count` records cut from `record(i)`, committing once at the end.
fn append_all<'a>(
    dest: &mut dyn Destination,
    field: &str,
    count: u64,
    bytes_of: impl Fn(u64, u64) -> u64,
    record: impl Fn(u64) -> &'a [u8],
    mut progress: impl FnMut(u64),
) -> Result<u64> {
    let mut first = 0;
    let mut done_bytes = 0;
    while first < count {
        // As many records as fit in a slice (at least one).
        let mut last = first + 1;
        let mut step = 1;
        let end = count.min(first.saturating_add(SLICE_RECORDS_MAX));
        while last < end && bytes_of(first, (last + step).min(end)) <= SLICE_BYTES {
            last = (last + step).min(end);
            step *= 2;
        }
        let records: Vec<Record> = (first..last)
            .map(|i| Record::new().with(field, record(i)))
            .collect();
        dest.append_many(&records)?;
        done_bytes += bytes_of(first, last);
        progress(done_bytes);
        first = last;
    }
    dest.commit()?;
    Ok(count)
}

/// `zr convert --npy`: one record per row of `npy` into `target`. `progress` gets bytes
/// converted so far; returns the number of records.
pub fn convert_npy(
    npy: &Path,
    target: &Target,
    dest: &mut dyn Destination,
    progress: impl FnMut(u64),
) -> Result<u64> {
    let input = Input::open(npy)?;
    let bytes = input.bytes();
    let header = NpyHeader::parse(bytes, npy)?;
    let bad = |reason: String| Error::InvalidInput {
        path: input.path.clone(),
        reason,
    };
    if header.fortran_order {
        return Err(bad(
            "Fortran-order arrays are not supported; save it C-contiguous (np.ascontiguousarray)"
                .into(),
        ));
    }
    let Some((&rows, row_shape)) = header.shape.split_first() else {
        return Err(bad("a 0-dimensional array has no rows".into()));
    };
    let itemsize = dtype_itemsize(&header.descr).map_err(|e| bad(e.to_string()))?;
    let row_bytes = row_shape
        .iter()
        .try_fold(itemsize, |acc, &d| acc.checked_mul(d))
        .filter(|&b| b <= u32::MAX as u64)
        .ok_or_else(|| {
            bad(format!(
                "rows of shape {row_shape:?} exceed the 4 GiB record limit"
            ))
        })?;
    let data_bytes = rows
        .checked_mul(row_bytes)
        .ok_or_else(|| bad("array size overflows".into()))?;
    let have = bytes.len() as u64 - header.data_offset;
    if have != data_bytes {
        return Err(bad(format!(
            "holds {have} data bytes but its header ({rows} rows of {row_bytes} bytes) needs {data_bytes}: truncated or not a plain array"
        )));
    }
    check_room(dest, npy, rows, data_bytes)?;
    let spec = target
        .spec()
        .typed(header.descr.clone(), row_shape.to_vec());
    dest.open(target, spec)?;
    let data = &bytes[header.data_offset as usize..];
    append_all(
        dest,
        target.field,
        rows,
        |a, b| (b - a) * row_bytes,
        |i| &data[(i * row_bytes) as usize..((i + 1) * row_bytes) as usize],
        progress,
    )
}

/// A values file and its offsets, checked: record i is `values[offsets[i]..offsets[i + 1]]`.
struct Values {
    values: Input,
    offsets: Input,
    /// Where the offsets' data starts in their file.
    data_offset: usize,
    /// Offsets (records + 1).
    count: u64,
}

impl Values {
    fn open(values: &Path, offsets: &Path) -> Result<Values> {
        let values_input = Input::open(values)?;
        let offsets_input = Input::open(offsets)?;
        let header = NpyHeader::parse(offsets_input.bytes(), offsets)?;
        let bad = |reason: String| Error::InvalidInput {
            path: offsets.to_path_buf(),
            reason,
        };
        if !matches!(header.descr.as_str(), "<u8" | "<i8") || header.shape.len() != 1 {
            return Err(bad(format!(
                "offsets must be a 1-D array of little-endian 64-bit integers (<u8); found dtype {} shape {:?}",
                header.descr, header.shape
            )));
        }
        let count = header.shape[0];
        let raw_len = offsets_input.bytes().len() - header.data_offset as usize;
        // `count` comes from the file: checked, so that a huge shape is an error, not an
        // overflow.
        if count == 0 || count.checked_mul(8) != Some(raw_len as u64) {
            return Err(bad(format!(
                "holds {raw_len} data bytes for {count} offsets (need N+1 ≥ 1 of 8 bytes)"
            )));
        }
        let checked = Values {
            values: values_input,
            offsets: offsets_input,
            data_offset: header.data_offset as usize,
            count,
        };
        let values_len = checked.values.bytes().len() as u64;
        for i in 0..count {
            let offset = checked.at(i);
            if i > 0 && offset < checked.at(i - 1) {
                return Err(bad(format!(
                    "offsets are not monotonic: offsets[{i}] = {offset} < offsets[{}] = {}",
                    i - 1,
                    checked.at(i - 1)
                )));
            }
            if offset > values_len {
                return Err(bad(format!(
                    "offsets[{i}] = {offset} points past the end of {} ({values_len} bytes)",
                    values.display()
                )));
            }
            if i > 0 && offset - checked.at(i - 1) > u32::MAX as u64 {
                return Err(bad(format!(
                    "record {} is longer than the 4 GiB record limit",
                    i - 1
                )));
            }
        }
        Ok(checked)
    }

    /// Offset `i` (< `count`).
    fn at(&self, i: u64) -> u64 {
        let raw = &self.offsets.bytes()[self.data_offset..];
        u64::from_le_bytes(
            raw[(i * 8) as usize..(i * 8 + 8) as usize]
                .try_into()
                .unwrap_or_default(),
        )
    }

    fn records(&self) -> u64 {
        self.count - 1
    }

    /// Record `i` (< `records()`).
    fn record(&self, i: u64) -> &[u8] {
        &self.values.bytes()[self.at(i) as usize..self.at(i + 1) as usize]
    }
}

/// `zr convert --values --offsets`: record i is `values[offsets[i]..offsets[i + 1]]`.
pub fn convert_values(
    values: &Path,
    offsets: &Path,
    target: &Target,
    dest: &mut dyn Destination,
    progress: impl FnMut(u64),
) -> Result<u64> {
    let input = Values::open(values, offsets)?;
    let records = input.records();
    check_room(dest, offsets, records, input.at(records) - input.at(0))?;
    dest.open(target, target.spec())?;
    append_all(
        dest,
        target.field,
        records,
        |a, b| input.at(b) - input.at(a),
        |i| input.record(i),
        progress,
    )
}

/// A zstd dictionary of at most `max_bytes` trained on records of `values` + `offsets`
/// spread evenly over them (as [`crate::rebalance::train_dict`] samples a dataset), for a
/// dataset made with it before its records are converted into it; with the number of
/// records it was trained on.
pub fn train_dict_on_values(
    values: &Path,
    offsets: &Path,
    max_bytes: usize,
) -> Result<(Vec<u8>, usize)> {
    let input = Values::open(values, offsets)?;
    let samples = crate::dict::spread_samples(input.records(), |i| input.record(i));
    if samples.is_empty() {
        return Err(Error::InvalidInput {
            path: values.to_path_buf(),
            reason: "has no records with bytes to train a dictionary on".into(),
        });
    }
    Ok((crate::dict::train(&samples, max_bytes)?, samples.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_bytes_parse_back() {
        for shape in [vec![3], vec![2, 3], vec![]] {
            let data: Vec<u8> = (0..shape.iter().product::<u64>() * 4)
                .map(|b| b as u8)
                .collect();
            let bytes = npy_bytes("<i4", &shape, &data);
            let header = NpyHeader::parse(&bytes, Path::new("x.npy")).unwrap();
            assert_eq!(header.descr, "<i4");
            assert!(!header.fortran_order);
            assert_eq!(header.shape, shape);
            assert_eq!(header.data_offset % 64, 0);
            assert_eq!(&bytes[header.data_offset as usize..], &data[..]);
        }
    }
}
