//! Parquet files (and so Hugging Face datasets, which are Parquet) into a record dataset,
//! a column a field:
//! - binary and string columns: bytes (a null: an absent value);
//! - numbers, and fixed-size lists of numbers (tensors): typed fields of their dtype and
//!   shape (a null is refused, naming the row: every record needs one);
//! - Hugging Face image and audio structs (`{bytes, path}`): their bytes;
//! - any other type is refused by name.
//!
//! The files are read a row group at a time (arrow-rs), so memory holds one batch however
//! large the input.

use std::path::PathBuf;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use zr_node::{FieldSpec, Record};

use crate::IngestError;

/// Rows read per batch.
const BATCH_ROWS: usize = 1024;

/// What to convert.
#[derive(Clone, Debug)]
pub struct ParquetOptions {
    pub inputs: Vec<PathBuf>,
    /// The columns to keep, in this order (empty: every column).
    pub columns: Vec<String>,
    /// The dataset to make (a new or empty directory).
    pub dest: PathBuf,
}

/// What a conversion did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParquetReport {
    pub rows: u64,
    /// Each field: (name, "bytes" or its dtype and shape).
    pub fields: Vec<(String, String)>,
}

/// How a column becomes a field.
#[derive(Clone, Debug, PartialEq)]
enum Kind {
    Bytes,
    /// A Hugging Face image or audio struct: its child `bytes`.
    StructBytes,
    /// Numbers: `width` values of `itemsize` bytes each a row.
    Typed {
        dtype: &'static str,
        width: u64,
    },
}

fn dtype_of(t: &DataType) -> Option<&'static str> {
    Some(match t {
        DataType::Int8 => "|i1",
        DataType::Int16 => "<i2",
        DataType::Int32 => "<i4",
        DataType::Int64 => "<i8",
        DataType::UInt8 => "|u1",
        DataType::UInt16 => "<u2",
        DataType::UInt32 => "<u4",
        DataType::UInt64 => "<u8",
        DataType::Float16 => "<f2",
        DataType::Float32 => "<f4",
        DataType::Float64 => "<f8",
        _ => return None,
    })
}

fn kind_of(name: &str, t: &DataType) -> Result<Kind, String> {
    match t {
        DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Utf8View => Ok(Kind::Bytes),
        DataType::FixedSizeList(child, n) => match dtype_of(child.data_type()) {
            Some(dtype) => Ok(Kind::Typed {
                dtype,
                width: *n as u64,
            }),
            None => Err(format!(
                "column '{name}' is a fixed-size list of {}: only lists of numbers are taken",
                child.data_type()
            )),
        },
        DataType::Struct(fields)
            if fields
                .iter()
                .any(|f| f.name() == "bytes" && matches!(f.data_type(), DataType::Binary | DataType::LargeBinary | DataType::BinaryView)) =>
        {
            Ok(Kind::StructBytes)
        }
        other => match dtype_of(other) {
            Some(dtype) => Ok(Kind::Typed { dtype, width: 1 }),
            None => Err(format!(
                "column '{name}' is {other}: not taken (binary, strings, numbers, fixed-size lists of numbers and image/audio structs with bytes are)"
            )),
        },
    }
}

/// Row `row`'s value of `array` (of `kind`) as bytes; `None` for a null.
fn value(array: &ArrayRef, kind: &Kind, row: usize) -> Option<Vec<u8>> {
    if array.is_null(row) {
        return None;
    }
    Some(match kind {
        Kind::Bytes => bytes_of(array.as_ref(), row),
        Kind::StructBytes => {
            let strukt = array.as_struct();
            let child = strukt.column_by_name("bytes")?;
            if child.is_null(row) {
                return None;
            }
            bytes_of(child.as_ref(), row)
        }
        Kind::Typed { width, .. } => {
            let (values, start) = match array.data_type() {
                DataType::FixedSizeList(..) => {
                    let list = array.as_fixed_size_list();
                    (list.values().clone(), row * *width as usize)
                }
                _ => (array.clone(), row),
            };
            let data = values.to_data();
            let size = data.data_type().primitive_width()?;
            let buffer = &data.buffers()[0];
            let offset = (data.offset() + start) * size;
            buffer.as_slice()[offset..offset + size * *width as usize].to_vec()
        }
    })
}

fn bytes_of(array: &dyn Array, row: usize) -> Vec<u8> {
    match array.data_type() {
        DataType::Binary => array.as_binary::<i32>().value(row).to_vec(),
        DataType::LargeBinary => array.as_binary::<i64>().value(row).to_vec(),
        DataType::BinaryView => array.as_binary_view().value(row).to_vec(),
        DataType::Utf8 => array.as_string::<i32>().value(row).as_bytes().to_vec(),
        DataType::LargeUtf8 => array.as_string::<i64>().value(row).as_bytes().to_vec(),
        DataType::Utf8View => array.as_string_view().value(row).as_bytes().to_vec(),
        _ => Vec::new(),
    }
}

/// A schema's column names, for an error naming what a file has.
fn columns_of(schema: &arrow_schema::Schema) -> String {
    schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The Parquet file at `path`, its footer read.
fn open(
    path: &std::path::Path,
) -> Result<ParquetRecordBatchReaderBuilder<crate::remote::ParquetSource>, IngestError> {
    let bad = |reason: String| IngestError::Input {
        path: path.to_path_buf(),
        reason,
    };
    let file = crate::remote::ParquetSource::open(path)?;
    ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| bad(format!("not a Parquet file we can read: {e}")))
}

/// Converts `options.inputs` into a record dataset at `options.dest`, calling `progress`
/// with the rows written so far.
pub fn convert_parquet(
    options: &ParquetOptions,
    progress: impl FnMut(u64),
) -> Result<ParquetReport, IngestError> {
    if options.inputs.is_empty() {
        return Err(IngestError::Usage("no input files".into()));
    }
    let mut sink = crate::LocalRecords::new(&options.dest)?;
    convert_parquet_into(options, &mut sink, progress)
}

/// [`convert_parquet`] into `sink` (`options.dest` is not used); a failed conversion
/// abandons the sink.
pub fn convert_parquet_into(
    options: &ParquetOptions,
    sink: &mut dyn crate::RecordSink,
    mut progress: impl FnMut(u64),
) -> Result<ParquetReport, IngestError> {
    if options.inputs.is_empty() {
        return Err(IngestError::Usage("no input files".into()));
    }
    let mut made = false;
    let mut plan: Vec<(String, Kind)> = Vec::new();
    let mut report = ParquetReport::default();
    let result = (|| -> Result<(), IngestError> {
        for path in &options.inputs {
            let bad = |reason: String| IngestError::Input {
                path: path.clone(),
                reason,
            };
            let builder = open(path)?;
            let schema = builder.schema().clone();
            let names: Vec<String> = if options.columns.is_empty() {
                schema.fields().iter().map(|f| f.name().clone()).collect()
            } else {
                options.columns.clone()
            };
            let mut kinds = Vec::with_capacity(names.len());
            for name in &names {
                let field = schema.field_with_name(name).map_err(|_| {
                    bad(format!(
                        "no column '{name}' (it has: {})",
                        columns_of(&schema)
                    ))
                })?;
                kinds.push((name.clone(), kind_of(name, field.data_type()).map_err(bad)?));
            }
            if !made {
                let specs: Vec<FieldSpec> = kinds
                    .iter()
                    .map(|(name, kind)| match kind {
                        Kind::Typed { dtype, width } => {
                            let shape = if *width == 1 { vec![] } else { vec![*width] };
                            FieldSpec::raw(name.as_str()).typed(*dtype, shape)
                        }
                        _ => FieldSpec::raw(name.as_str()),
                    })
                    .collect();
                sink.create(&specs)?;
                made = true;
                report.fields = kinds
                    .iter()
                    .map(|(name, kind)| {
                        let what = match kind {
                            Kind::Typed { dtype, width } if *width > 1 => {
                                format!("{dtype}[{width}]")
                            }
                            Kind::Typed { dtype, .. } => dtype.to_string(),
                            _ => "bytes".into(),
                        };
                        (name.clone(), what)
                    })
                    .collect();
                plan = kinds;
            } else if kinds != plan {
                return Err(bad(format!(
                    "its columns are not the first file's ({})",
                    report
                        .fields
                        .iter()
                        .map(|(n, w)| format!("{n}: {w}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            let reader = builder
                .with_batch_size(BATCH_ROWS)
                .build()
                .map_err(|e| bad(e.to_string()))?;
            let mut row_base = 0u64;
            for batch in reader {
                let batch: RecordBatch =
                    batch.map_err(|e| bad(format!("after row {row_base}: {e}")))?;
                let columns: Vec<ArrayRef> = plan
                    .iter()
                    .map(|(name, _)| {
                        batch
                            .column_by_name(name)
                            .cloned()
                            .ok_or_else(|| bad(format!("column '{name}' vanished")))
                    })
                    .collect::<Result<_, _>>()?;
                let mut rows: Vec<Vec<Option<Vec<u8>>>> = Vec::with_capacity(batch.num_rows());
                for row in 0..batch.num_rows() {
                    let mut values = Vec::with_capacity(plan.len());
                    for ((name, kind), column) in plan.iter().zip(&columns) {
                        let v = value(column, kind, row);
                        if v.is_none() && matches!(kind, Kind::Typed { .. }) {
                            return Err(bad(format!(
                                "row {} of column '{name}' is null, and a typed field needs a value in every record",
                                row_base + row as u64
                            )));
                        }
                        values.push(v);
                    }
                    rows.push(values);
                }
                let records: Vec<Record> = rows
                    .iter()
                    .map(|values| {
                        let mut record = Record::new();
                        for ((name, _), v) in plan.iter().zip(values) {
                            if let Some(v) = v {
                                record = record.with(name, v);
                            }
                        }
                        record
                    })
                    .collect();
                sink.append(&records)?;
                row_base += batch.num_rows() as u64;
                report.rows += batch.num_rows() as u64;
                progress(report.rows);
            }
        }
        match made {
            true => sink.commit(),
            false => Err(IngestError::Usage("no rows".into())),
        }
    })();
    match result {
        Ok(()) => Ok(report),
        Err(e) => {
            sink.abandon();
            Err(e)
        }
    }
}

/// Calls `each` with every row's text of string column `column` of the Parquet file at
/// `path` (its row number from 1, and the text, `None` for a null), a batch at a time, until
/// `each` says stop (false); returns whether every row was given.
pub(crate) fn read_texts(
    path: &std::path::Path,
    column: &str,
    mut each: impl FnMut(u64, Option<String>) -> bool,
) -> Result<bool, IngestError> {
    let bad = |reason: String| IngestError::Input {
        path: path.to_path_buf(),
        reason,
    };
    let builder = open(path)?;
    let schema = builder.schema().clone();
    let (index, field) = schema.column_with_name(column).ok_or_else(|| {
        bad(format!(
            "no column '{column}' to tokenize (it has: {})",
            columns_of(&schema)
        ))
    })?;
    if !matches!(
        field.data_type(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    ) {
        return Err(bad(format!(
            "column '{column}' is {}, not text",
            field.data_type()
        )));
    }
    let mask = parquet::arrow::ProjectionMask::roots(builder.parquet_schema(), [index]);
    let reader = builder
        .with_projection(mask)
        .with_batch_size(BATCH_ROWS)
        .build()
        .map_err(|e| bad(e.to_string()))?;
    let mut number = 0u64;
    for batch in reader {
        let batch = batch.map_err(|e| bad(format!("after row {number}: {e}")))?;
        let array = batch.column(0);
        for row in 0..batch.num_rows() {
            number += 1;
            let text = (!array.is_null(row))
                .then(|| String::from_utf8_lossy(&bytes_of(array.as_ref(), row)).into_owned());
            if !each(number, text) {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use super::*;

    /// Writes `batch` as the Parquet file `path`.
    pub(crate) fn write_parquet(path: &std::path::Path, batch: &RecordBatch) {
        let file = std::fs::File::create(path).unwrap();
        let mut writer = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
        writer.write(batch).unwrap();
        writer.close().unwrap();
    }
    use arrow_array::builder::{BinaryBuilder, FixedSizeListBuilder, Float32Builder};
    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::{Field, Schema};

    #[test]
    fn columns_become_fields_by_type() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let mut vectors = FixedSizeListBuilder::new(Float32Builder::new(), 3);
        let mut blobs = BinaryBuilder::new();
        for k in 0..100 {
            for j in 0..3 {
                vectors.values().append_value((k * 3 + j) as f32);
            }
            vectors.append(true);
            if k % 10 == 0 {
                blobs.append_null();
            } else {
                blobs.append_value(vec![k as u8; k]);
            }
        }
        let ids = Int64Array::from_iter_values(0..100);
        let text = StringArray::from_iter_values((0..100).map(|k| format!("caption {k}")));
        let vectors: ArrayRef = Arc::new(vectors.finish());
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("text", DataType::Utf8, false),
            Field::new("blob", DataType::Binary, true),
            Field::new("vector", vectors.data_type().clone(), false),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(ids),
                Arc::new(text),
                Arc::new(blobs.finish()),
                vectors,
            ],
        )
        .unwrap();
        write_parquet(&path, &batch);
        let options = ParquetOptions {
            inputs: vec![path.clone(), path],
            columns: Vec::new(),
            dest: dir.path().join("ds"),
        };
        let report = convert_parquet(&options, |_| {}).unwrap();
        assert_eq!(report.rows, 200);
        assert_eq!(report.fields[0], ("id".into(), "<i8".into()));
        assert_eq!(report.fields[3], ("vector".into(), "<f4[3]".into()));
        let store = zr_node::Store::open_read_only(&options.dest).unwrap();
        let got = store
            .gather(&[7, 110], &["id", "text", "blob", "vector"])
            .unwrap();
        assert_eq!(
            got.field("id").unwrap().get(0).unwrap(),
            &7i64.to_le_bytes()
        );
        assert_eq!(got.field("text").unwrap().get(1).unwrap(), b"caption 10");
        assert_eq!(got.field("blob").unwrap().get(0).unwrap(), &[7u8; 7][..]);
        assert_eq!(
            got.field("blob").unwrap().get(1).unwrap(),
            b"",
            "a null is an absent value"
        );
        let vector: Vec<u8> = [21f32, 22., 23.]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(got.field("vector").unwrap().get(0).unwrap(), &vector[..]);
        // A column asked for that is not there; a file that is not Parquet.
        let missing = ParquetOptions {
            columns: vec!["nope".into()],
            dest: dir.path().join("other"),
            ..options.clone()
        };
        let e = convert_parquet(&missing, |_| {}).unwrap_err().to_string();
        assert!(
            e.contains("no column 'nope' (it has: id, text, blob, vector)"),
            "{e}"
        );
        assert!(!missing.dest.exists());
        let junk = dir.path().join("junk.parquet");
        std::fs::write(&junk, b"PAR1 not really").unwrap();
        let e = convert_parquet(
            &ParquetOptions {
                inputs: vec![junk],
                columns: Vec::new(),
                dest: dir.path().join("other"),
            },
            |_| {},
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("junk.parquet: not a Parquet file we can read"),
            "{e}"
        );
    }
}
