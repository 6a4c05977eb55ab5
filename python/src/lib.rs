//! `zrecord._zrecord`: the engine, the cluster client, the samplers and the in-process test
//! cluster, as the `zrecord` package (python/zrecord) uses them. Arrays cross as NumPy
//! arrays of bytes; the package gives them their dtypes and shapes. Every call that reads or
//! writes records releases the GIL, and no engine error crosses as a panic: each becomes a
//! Python exception (`IndexError`, `KeyError`, `FileNotFoundError`, `zrecord.CorruptRecord`,
//! `zrecord.Error`).

use std::collections::HashMap;

use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyFileNotFoundError, PyIndexError, PyKeyError, PyValueError};
use pyo3::prelude::*;
use zr_common::sampler::{Order, SamplerConfig, SamplerState, Tail};
use zr_common::Record;
use zr_node::meta::FieldSpec;
use zr_node::{CreateOptions, Error as NodeError};
use zr_proto::ErrorCode;

mod cluster;
mod loaders;
mod plans;
mod streams;

use cluster::*;
use loaders::*;
use streams::*;

create_exception!(zrecord, Error, PyException, "A zrecord operation failed.");
create_exception!(
    zrecord,
    CorruptRecord,
    Error,
    "A record failed its check (CRC) or its frame is damaged."
);

/// The Python exception for an engine error.
fn node_error(e: NodeError) -> PyErr {
    let message = e.to_string();
    match e {
        // An index far past the end addresses a unit the dataset lacks: out of range too.
        NodeError::IndexOutOfRange { .. } | NodeError::UnitIndexOutOfRange { .. } => {
            PyIndexError::new_err(message)
        }
        NodeError::UnknownField { .. } => PyKeyError::new_err(message),
        NodeError::BadRecord { .. } | NodeError::Corrupt { .. } => CorruptRecord::new_err(message),
        NodeError::Io { ref source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            PyFileNotFoundError::new_err(message)
        }
        // No meta.json at all is a missing dataset; a damaged one is not.
        NodeError::NotADataset { ref reason, .. } if reason.ends_with("not found") => {
            PyFileNotFoundError::new_err(message)
        }
        NodeError::InvalidSchema(_)
        | NodeError::InvalidRecord(_)
        | NodeError::InvalidInput { .. } => PyValueError::new_err(message),
        _ => Error::new_err(message),
    }
}

/// The Python exception for a cluster error.
fn cluster_error(e: zr_client::Error) -> PyErr {
    let message = e.to_string();
    match e.code() {
        Some(ErrorCode::IndexOutOfRange) => PyIndexError::new_err(message),
        Some(ErrorCode::UnknownField) => PyKeyError::new_err(message),
        Some(ErrorCode::CorruptRecord) => CorruptRecord::new_err(message),
        _ => Error::new_err(message),
    }
}

/// A field as Python sees it: (name, compression, dtype, shape).
type FieldTuple = (String, String, Option<String>, Option<Vec<u64>>);
/// A dataset as Python sees it: (name, records, committed, fields, bytes).
type DatasetTuple = (
    String,
    u64,
    Option<u64>,
    Vec<FieldTuple>,
    u64,
    u64,
    Option<u64>,
);

fn field_tuple(spec: &FieldSpec) -> FieldTuple {
    (
        spec.name.clone(),
        spec.storage(),
        spec.dtype.clone(),
        spec.shape.clone(),
    )
}

/// Columns as Python hands them over: per field, all records' bytes back to back and
/// `count + 1` offsets into them.
type Columns<'py> = HashMap<String, (PyReadonlyArray1<'py, u8>, PyReadonlyArray1<'py, i64>)>;

/// One field's column, checked: (name, bytes, offsets).
type Column<'a> = (&'a str, &'a [u8], &'a [i64]);

/// A column as Python gets it: bytes and offsets.
type PyColumn<'py> = (Bound<'py, PyArray1<u8>>, Bound<'py, PyArray1<i64>>);

/// Checks `columns` (every field's offsets rise within its bytes, every field the same
/// number of records) and returns (name, bytes, offsets) per field and the record count.
fn columns_of<'a>(columns: &'a Columns<'_>) -> PyResult<(Vec<Column<'a>>, usize)> {
    let mut out = Vec::with_capacity(columns.len());
    let mut count = None;
    for (name, (values, offsets)) in columns {
        let values = values
            .as_slice()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let offsets = offsets
            .as_slice()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let records = offsets.len().checked_sub(1).ok_or_else(|| {
            PyValueError::new_err(format!("field '{name}': offsets need at least one entry"))
        })?;
        if offsets[0] != 0
            || offsets.windows(2).any(|w| w[0] > w[1])
            || offsets[records] as usize != values.len()
        {
            return Err(PyValueError::new_err(format!(
                "field '{name}': offsets must rise from 0 to the length of its bytes ({})",
                values.len()
            )));
        }
        match count {
            Some(n) if n != records => {
                return Err(PyValueError::new_err(format!(
                    "field '{name}' has {records} records, another field {n}"
                )))
            }
            _ => count = Some(records),
        }
        out.push((name.as_str(), values, offsets));
    }
    Ok((out, count.unwrap_or(0)))
}

/// Record `k` of `columns`.
fn record_of<'a>(columns: &[Column<'a>], k: usize) -> Record<'a> {
    let mut record = Record::new();
    for (name, values, offsets) in columns {
        record.set(name, &values[offsets[k] as usize..offsets[k + 1] as usize]);
    }
    record
}

/// Every record of `columns` (see [`columns_of`]).
fn records_of<'a>(columns: &'a Columns<'_>) -> PyResult<Vec<Record<'a>>> {
    let (columns, count) = columns_of(columns)?;
    Ok((0..count).map(|k| record_of(&columns, k)).collect())
}

/// The one record of `columns`, checked, for a modify.
fn only_record<'a>(columns: &'a Columns<'_>) -> PyResult<Record<'a>> {
    let (columns, count) = columns_of(columns)?;
    if count != 1 {
        return Err(PyValueError::new_err("modify takes exactly one record"));
    }
    Ok(record_of(&columns, 0))
}

/// A column as NumPy arrays: its bytes (moved, not copied) and its offsets.
fn py_column(py: Python<'_>, column: zr_common::Contiguous) -> PyColumn<'_> {
    let offsets: Vec<i64> = column.offsets.iter().map(|&o| o as i64).collect();
    (
        PyArray1::from_vec(py, column.data),
        PyArray1::from_vec(py, offsets),
    )
}

/// Caller-owned array `array` borrowed for writing; `what` names it in errors.
fn borrow_out<'py, T: numpy::Element>(
    array: &Bound<'py, PyArray1<T>>,
    what: &str,
) -> PyResult<numpy::PyReadwriteArray1<'py, T>> {
    array
        .try_readwrite()
        .map_err(|e| PyValueError::new_err(format!("{what}: {e}")))
}

/// The memory of a borrowed array, which must be contiguous.
fn out_slice<'a, T: numpy::Element>(
    array: &'a mut numpy::PyReadwriteArray1<'_, T>,
    what: &str,
) -> PyResult<&'a mut [T]> {
    array
        .as_slice_mut()
        .map_err(|e| PyValueError::new_err(format!("{what}: {e}")))
}

/// [`borrow_out`] of an array that may not be given.
fn borrow_optional<'py, T: numpy::Element>(
    array: Option<&Bound<'py, PyArray1<T>>>,
    what: &str,
) -> PyResult<Option<numpy::PyReadwriteArray1<'py, T>>> {
    array.map(|a| borrow_out(a, what)).transpose()
}

/// [`out_slice`] of an array that may not be given.
fn optional_slice<'a, T: numpy::Element>(
    array: &'a mut Option<numpy::PyReadwriteArray1<'_, T>>,
    what: &str,
) -> PyResult<Option<&'a mut [T]>> {
    array.as_mut().map(|a| out_slice(a, what)).transpose()
}

/// The value `options` names `given`; a ValueError saying which `what` may be otherwise.
fn one_of<T: Copy>(what: &str, given: &str, options: &[(&str, T)]) -> PyResult<T> {
    if let Some(&(_, value)) = options.iter().find(|(name, _)| *name == given) {
        return Ok(value);
    }
    let names: Vec<&str> = options.iter().map(|(name, _)| *name).collect();
    let (last, rest) = names.split_last().unwrap_or((&"", &[]));
    let choices = if rest.is_empty() {
        last.to_string()
    } else {
        format!("{} or {last}", rest.join(", "))
    };
    Err(PyValueError::new_err(format!(
        "{what} must be {choices}, not '{given}'"
    )))
}

/// Indices as a slice (a copy only if the array is not contiguous).
fn indices_of(indices: &PyReadonlyArray1<'_, u64>) -> Vec<u64> {
    match indices.as_slice() {
        Ok(slice) => slice.to_vec(),
        Err(_) => indices.as_array().iter().copied().collect(),
    }
}

/// A local dataset (the engine's `Store`).
#[pyclass(module = "zrecord._zrecord", frozen)]
struct Store {
    inner: zr_node::Store,
}

#[pymethods]
impl Store {
    /// Opens the dataset at `path`: read-only (shared with other readers and processes) or
    /// writable (this process alone).
    #[staticmethod]
    fn open(py: Python<'_>, path: std::path::PathBuf, writable: bool) -> PyResult<Store> {
        let inner = py
            .detach(|| {
                if writable {
                    zr_node::Store::open(&path)
                } else {
                    zr_node::Store::open_read_only(&path)
                }
            })
            .map_err(node_error)?;
        Ok(Store { inner })
    }

    /// Creates a dataset at `path` with `fields` as (name, "raw" | "flate", dtype, shape).
    #[staticmethod]
    fn create(
        py: Python<'_>,
        path: std::path::PathBuf,
        fields: Vec<FieldTuple>,
    ) -> PyResult<Store> {
        let specs = fields
            .into_iter()
            .map(|(name, compress, dtype, shape)| {
                let spec = FieldSpec::stored(name.clone(), &compress)
                    .map_err(|e| PyValueError::new_err(format!("field '{name}': {e}")))?;
                Ok(FieldSpec {
                    dtype,
                    shape,
                    ..spec
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let inner = py
            .detach(|| zr_node::Store::create(&path, specs, CreateOptions::default()))
            .map_err(node_error)?;
        Ok(Store { inner })
    }

    fn __len__(&self) -> usize {
        self.inner.len() as usize
    }

    /// The fields, as (name, compression, dtype, shape).
    fn fields(&self) -> Vec<FieldTuple> {
        self.inner.fields().iter().map(field_tuple).collect()
    }

    /// Gathers field `field` of `indices` into `out` (uint8, C-contiguous, exactly
    /// `len(indices) * record size` bytes): one copy, the GIL released; `checked`: each
    /// record read against its CRC.
    #[pyo3(signature = (indices, field, out, checked=false))]
    fn gather_into(
        &self,
        py: Python<'_>,
        indices: PyReadonlyArray1<'_, u64>,
        field: &str,
        out: &Bound<'_, PyArray1<u8>>,
        checked: bool,
    ) -> PyResult<()> {
        let indices = indices_of(&indices);
        let mut out = borrow_out(out, "out")?;
        let out = out_slice(&mut out, "out")?;
        let options = self.options(checked);
        py.detach(|| self.inner.gather_into_with(&indices, field, out, options))
            .map_err(node_error)
    }

    /// Field `field` of record `index` as a read-only uint8 array over the mapped chunk
    /// (raw fields) or the decompressed payload (flate): no copy. The array keeps what it
    /// views alive.
    fn record_view<'py>(
        &self,
        py: Python<'py>,
        index: u64,
        field: &str,
    ) -> PyResult<Bound<'py, PyArray1<u8>>> {
        let batch = py
            .detach(|| self.inner.gather(&[index], &[field]))
            .map_err(node_error)?;
        let (ptr, len) = {
            let view = batch.field(field).ok_or_else(|| {
                PyKeyError::new_err(format!("field '{field}' missing from the batch"))
            })?;
            let payload = view.get(0).unwrap_or_default();
            (payload.as_ptr(), payload.len())
        };
        let holder = Bound::new(py, Held { _batch: batch })?;
        // SAFETY: `ptr..ptr + len` is the payload inside the batch's mapping (or its
        // decompressed buffer), which stays valid and unmoved while the batch lives; the
        // batch moved into `holder`, the array's base object, which lives as long as the
        // array. The array is made read-only below, before Python sees it.
        let array = unsafe {
            let view = numpy::ndarray::ArrayView1::from_shape_ptr(len, ptr);
            PyArray1::borrow_from_array(&view, holder.into_any())
        };
        let array = array
            .try_readwrite()
            .map_err(|e| Error::new_err(e.to_string()))?
            .make_nonwriteable();
        Ok(array.as_borrowed().to_owned())
    }

    /// The Rust baseline of the Python benchmark: gathers of `batches` in turn (field
    /// `field`, into `out`) for about `seconds`, in a Rust loop without the GIL; returns
    /// gathers per second.
    fn time_gathers(
        &self,
        py: Python<'_>,
        batches: Vec<PyReadonlyArray1<'_, u64>>,
        field: &str,
        out: &Bound<'_, PyArray1<u8>>,
        seconds: f64,
    ) -> PyResult<f64> {
        let batches: Vec<Vec<u64>> = batches.iter().map(indices_of).collect();
        if batches.is_empty() {
            return Err(PyValueError::new_err("no batches to time"));
        }
        let mut out = borrow_out(out, "out")?;
        let out = out_slice(&mut out, "out")?;
        py.detach(|| {
            let started = std::time::Instant::now();
            let mut calls = 0u64;
            loop {
                self.inner
                    .gather_into(&batches[calls as usize % batches.len()], field, out)?;
                calls += 1;
                let elapsed = started.elapsed().as_secs_f64();
                if elapsed >= seconds {
                    return Ok(calls as f64 / elapsed);
                }
            }
        })
        .map_err(node_error)
    }

    /// Field `field` of `indices`, every record's bytes back to back, and their
    /// `len(indices) + 1` offsets: for fields of any record length.
    #[pyo3(signature = (indices, field, checked=false))]
    fn gather_columns<'py>(
        &self,
        py: Python<'py>,
        indices: PyReadonlyArray1<'_, u64>,
        field: &str,
        checked: bool,
    ) -> PyResult<PyColumn<'py>> {
        let indices = indices_of(&indices);
        let options = self.options(checked);
        let contiguous = py
            .detach(|| {
                let batch = self.inner.gather_with(&indices, &[field], options)?;
                let view = batch.field(field).ok_or_else(|| NodeError::UnknownField {
                    name: field.to_string(),
                    known: String::new(),
                })?;
                Ok::<_, NodeError>(view.to_contiguous())
            })
            .map_err(node_error)?;
        Ok(py_column(py, contiguous))
    }

    /// Appends the records of `columns` ({field: (bytes, offsets)}); returns the first
    /// index. Fields not given are absent in these records.
    fn append_columns(&self, py: Python<'_>, columns: Columns<'_>) -> PyResult<u64> {
        let records = records_of(&columns)?;
        let range = py.detach(|| self.inner.append_many(&records));
        Ok(range.map_err(node_error)?.start)
    }

    /// Replaces record `index` with the one record of `columns`.
    fn modify(&self, py: Python<'_>, index: u64, columns: Columns<'_>) -> PyResult<()> {
        let record = only_record(&columns)?;
        py.detach(|| self.inner.modify(index, &record))
            .map_err(node_error)
    }

    /// Deletes record `index`: the last record takes its place.
    fn delete(&self, py: Python<'_>, index: u64) -> PyResult<()> {
        py.detach(|| self.inner.delete(index)).map_err(node_error)
    }

    /// Makes every write so far durable.
    fn commit(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.commit()).map_err(node_error)
    }

    /// Adds field `name` (`compress`: raw, flate, zstd or zstd:LEVEL): the records stored
    /// so far lack it. Returns the store with the field, which replaces this one (it
    /// refuses writes now).
    fn add_field(&self, py: Python<'_>, name: String, compress: &str) -> PyResult<Store> {
        let spec = zr_node::FieldSpec::stored(name, compress)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let inner = py
            .detach(|| self.inner.add_field(spec))
            .map_err(node_error)?;
        Ok(Store { inner })
    }

    /// Writes field `field` of records `start..start + len(values)`, their other fields
    /// unchanged.
    fn write_field(
        &self,
        py: Python<'_>,
        field: &str,
        start: u64,
        values: Vec<Vec<u8>>,
    ) -> PyResult<()> {
        let indices: Vec<u64> = (start..start + values.len() as u64).collect();
        let slices: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
        py.detach(|| self.inner.write_field(field, &indices, &slices))
            .map_err(node_error)
    }
}

impl Store {
    /// The store's read options, `checked` or not.
    fn options(&self, checked: bool) -> zr_node::GatherOptions {
        zr_node::GatherOptions {
            verify: checked,
            ..zr_node::GatherOptions::default()
        }
    }
}

/// Keeps a gathered batch — and so the mappings it points into — alive for the arrays
/// that view it.
#[pyclass(module = "zrecord._zrecord", frozen)]
struct Held {
    _batch: zr_node::Batch,
}

/// The engine's sampler: which indices each batch of each epoch holds, a pure function of
/// (configuration, epoch, position).
#[pyclass(module = "zrecord._zrecord", frozen)]
struct Sampler {
    inner: zr_common::sampler::Sampler,
}

#[pymethods]
impl Sampler {
    #[new]
    #[pyo3(signature = (len, order, seed, rank, ranks, batch, window=0, stride=0, blocklist=Vec::new()))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        len: u64,
        order: &str,
        seed: u64,
        rank: u64,
        ranks: u64,
        batch: u64,
        window: u64,
        stride: u64,
        blocklist: Vec<u64>,
    ) -> PyResult<Sampler> {
        let orders = [
            ("sequential", Order::Sequential),
            ("shuffle", Order::Shuffle),
            ("random", Order::Random),
            ("sliding", Order::Sliding { window, stride }),
        ];
        let order = one_of("order", order, &orders)?;
        let config = SamplerConfig {
            len,
            order,
            seed,
            rank,
            ranks,
            batch,
            // Every rank gets the same count: the uneven tail is dropped.
            tail: Tail::Drop,
        };
        let pairs: Vec<(u32, u64)> = blocklist.into_iter().map(|r| (0, r)).collect();
        let list = zr_common::Blocklist::new(&pairs, &[len], seed)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let inner = zr_common::sampler::Sampler::new(config)
            .map_err(|e| PyValueError::new_err(e.to_string()))?
            .with_blocklist(list);
        Ok(Sampler { inner })
    }

    /// Indices each rank sees per epoch.
    fn items_per_epoch(&self) -> u64 {
        self.inner.items_per_epoch()
    }

    /// The indices at positions `start..end` of epoch `epoch`.
    fn indices<'py>(
        &self,
        py: Python<'py>,
        epoch: u64,
        start: u64,
        end: u64,
    ) -> Bound<'py, PyArray1<u64>> {
        let mut out = Vec::with_capacity(end.saturating_sub(start) as usize);
        self.inner.epoch(epoch).fill(start, end, &mut out);
        PyArray1::from_vec(py, out)
    }

    /// Raises ValueError unless a state (seed, epoch, position, len, rank, ranks) belongs to
    /// this sampler's configuration.
    fn check_state(
        &self,
        seed: u64,
        epoch: u64,
        position: u64,
        len: u64,
        rank: u64,
        ranks: u64,
    ) -> PyResult<()> {
        let state = SamplerState {
            seed,
            epoch,
            position,
            len,
            rank,
            ranks,
            batch: 0,
        };
        self.inner
            .check_state(&state)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }
}

/// An in-process cluster for tests and examples: only in a build with the `testing`
/// feature, so the wheel users install does not link the simulator.
#[cfg(feature = "testing")]
mod local_cluster {
    use super::Error;
    use pyo3::prelude::*;

    /// An in-process cluster (nodes and a router on 127.0.0.1, mutual TLS from a generated CA):
    /// for tests and examples.
    #[pyclass(module = "zrecord._zrecord", unsendable)]
    pub(super) struct LocalCluster {
        cluster: Option<zr_sim::SimCluster>,
    }

    #[pymethods]
    impl LocalCluster {
        #[new]
        #[pyo3(signature = (shards, fields, replicas=1))]
        fn new(
            py: Python<'_>,
            shards: u32,
            fields: Vec<(String, String)>,
            replicas: u32,
        ) -> PyResult<LocalCluster> {
            let options = zr_sim::SimOptions {
                fields,
                replicas,
                ..zr_sim::SimOptions::default()
            };
            let cluster = py
                .detach(|| zr_sim::SimCluster::start(shards, options))
                .map_err(|e| Error::new_err(e.to_string()))?;
            Ok(LocalCluster {
                cluster: Some(cluster),
            })
        }

        /// The router's address.
        fn router(&self) -> PyResult<String> {
            Ok(self.running()?.router_addr().to_string())
        }

        /// The certificate directory clients use.
        fn certs(&self) -> PyResult<Option<String>> {
            Ok(self.running()?.certs_dir().map(|p| p.display().to_string()))
        }

        /// Stops every node and router.
        fn stop(&mut self) {
            self.cluster = None;
        }
    }

    impl LocalCluster {
        fn running(&self) -> PyResult<&zr_sim::SimCluster> {
            self.cluster
                .as_ref()
                .ok_or_else(|| Error::new_err("the cluster is stopped"))
        }
    }
}

/// Trains a zstd dictionary for field `field` of the local dataset at `path` and rewrites
/// the dataset with the field compressed with it (as `zr dict train`); returns (dictionary
/// id, its bytes, records trained on).
#[pyfunction]
#[pyo3(signature = (path, field, size=zr_node::dict::DICT_BYTES_DEFAULT, level=None))]
fn train_dict(
    py: Python<'_>,
    path: std::path::PathBuf,
    field: &str,
    size: usize,
    level: Option<i32>,
) -> PyResult<(u32, usize, usize)> {
    if let Some(level) = level {
        zr_node::meta::parse_storage(&format!("zstd:{level}"))
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
    }
    let report = py
        .detach(|| zr_node::rebalance::train_dict(&path, field, size, level, |_, _| {}))
        .map_err(node_error)?;
    Ok((report.id, report.bytes, report.samples))
}

/// A zstd dictionary of at most `size` bytes trained on `samples` (records like those it
/// will compress); refused, saying why, when they are too few or too alike.
#[pyfunction]
#[pyo3(signature = (samples, size=zr_node::dict::DICT_BYTES_DEFAULT))]
fn train_dictionary<'py>(
    py: Python<'py>,
    samples: Vec<Vec<u8>>,
    size: usize,
) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
    let dict = py
        .detach(|| {
            let refs: Vec<&[u8]> = samples.iter().map(Vec::as_slice).collect();
            zr_node::dict::train(&refs, size)
        })
        .map_err(node_error)?;
    Ok(pyo3::types::PyBytes::new(py, &dict))
}

#[pymodule]
fn _zrecord(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(train_dict, m)?)?;
    m.add_function(wrap_pyfunction!(plans::token_mixture, m)?)?;
    m.add_function(wrap_pyfunction!(plans::explain, m)?)?;
    m.add_function(wrap_pyfunction!(plans::explain_grep, m)?)?;
    m.add_function(wrap_pyfunction!(plans::tokenize_jsonl, m)?)?;
    m.add_function(wrap_pyfunction!(train_dictionary, m)?)?;
    m.add_class::<Store>()?;
    m.add_class::<Stream>()?;
    m.add_class::<StreamWindows>()?;
    m.add_class::<StreamPacked>()?;
    m.add_class::<plans::TokenBudget>()?;
    m.add_class::<plans::RampSampler>()?;
    m.add_class::<ClusterStream>()?;
    m.add_class::<ClusterStreamWindows>()?;
    m.add_class::<NativeLoader>()?;
    m.add_class::<Mixture>()?;
    m.add_class::<NativeMixtureLoader>()?;
    m.add_class::<Client>()?;
    m.add_class::<Sampler>()?;
    #[cfg(feature = "testing")]
    m.add_class::<local_cluster::LocalCluster>()?;
    m.add("Error", m.py().get_type::<Error>())?;
    m.add("CorruptRecord", m.py().get_type::<CorruptRecord>())?;
    Ok(())
}
