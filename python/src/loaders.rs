//! Loaders and mixtures from Python: the native prefetching loaders over a store, a
//! cluster or a stream's windows, and the mixture they draw from.

use super::*;

/// The engine's prefetching loader over a mixture: each batch's rows gathered from their
/// own datasets (local stores or cluster clients) on background threads, without the GIL.
#[pyclass(module = "zrecord._zrecord")]
pub(crate) struct NativeMixtureLoader {
    pub(crate) inner: std::sync::Mutex<zr_common::MixtureLoader>,
}

#[pymethods]
impl NativeMixtureLoader {
    /// Global batches of `mixture` from `batches` on, this rank's part of each, of `fields`
    /// from `sources` (`Store`s or `Client`s, one per dataset), `prefetch` ahead on
    /// `workers` threads.
    #[new]
    fn new(
        sources: Vec<Bound<'_, PyAny>>,
        mixture: &Mixture,
        batches: u64,
        fields: Vec<String>,
        prefetch: usize,
        workers: usize,
    ) -> PyResult<NativeMixtureLoader> {
        let gathers = sources
            .iter()
            .enumerate()
            .map(|(i, source)| gather_source(source, i))
            .collect::<PyResult<Vec<_>>>()?;
        let options = zr_common::LoaderOptions {
            fields,
            prefetch,
            workers,
            end_epoch: None,
        };
        let state = mixture.inner.state_at(batches);
        let inner = zr_common::MixtureLoader::new(gathers, mixture.inner.clone(), &state, options)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(NativeMixtureLoader {
            inner: std::sync::Mutex::new(inner),
        })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next batch: (global batch, sources, records, columns as (values, offsets)).
    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<MixedColumns<'py>>> {
        let Some((batch, columns)) = next_loaded(py, &self.inner)? else {
            return Ok(None);
        };
        let sources: Vec<i64> = batch.sources.iter().map(|&s| i64::from(s)).collect();
        let records: Vec<i64> = batch.indices.iter().map(|&r| r as i64).collect();
        Ok(Some((
            batch.position,
            PyArray1::from_vec(py, sources),
            PyArray1::from_vec(py, records),
            columns,
        )))
    }
}

/// A loaded mixture batch for Python: (global batch, sources, records, columns).
type MixedColumns<'py> = (
    u64,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i64>>,
    Vec<PyColumn<'py>>,
);

/// A mixture of datasets read by weight as one stream of global batches (see
/// `zr_common::mixture`).
#[pyclass(module = "zrecord._zrecord", frozen)]
pub(crate) struct Mixture {
    pub(crate) inner: zr_common::Mixture,
}

#[pymethods]
impl Mixture {
    /// `stages`: (start global batch, weights) pairs, the first starting at 0; `blocklist`:
    /// (dataset, record) pairs not read.
    #[new]
    #[pyo3(signature = (lengths, stages, seed, rank, ranks, batch, blocklist=Vec::new()))]
    fn new(
        lengths: Vec<u64>,
        stages: Vec<(u64, Vec<f64>)>,
        seed: u64,
        rank: u64,
        ranks: u64,
        batch: u64,
        blocklist: Vec<(u32, u64)>,
    ) -> PyResult<Mixture> {
        let list = zr_common::Blocklist::new(&blocklist, &lengths, seed)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let config = zr_common::MixtureConfig {
            lengths,
            stages: stages
                .into_iter()
                .map(|(start, weights)| zr_common::Stage::new(start, weights))
                .collect(),
            seed,
            rank,
            ranks,
            batch,
        };
        let inner = zr_common::Mixture::new(config)
            .map_err(|e| PyValueError::new_err(e.to_string()))?
            .with_blocklist(list);
        Ok(Mixture { inner })
    }

    /// This rank's part of global batch `batch`: (source dataset, record) per position.
    fn batch<'py>(
        &self,
        py: Python<'py>,
        batch: u64,
    ) -> (Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i64>>) {
        let (mut sources, mut records) = (Vec::new(), Vec::new());
        self.inner.fill(batch, &mut sources, &mut records);
        (
            PyArray1::from_vec(py, sources.into_iter().map(i64::from).collect()),
            PyArray1::from_vec(py, records.into_iter().map(|r| r as i64).collect()),
        )
    }

    /// Every dataset's draws before global batch `batch`.
    fn drawn_before(&self, batch: u64) -> Vec<u64> {
        self.inner.drawn_before(batch)
    }

    /// The state after `batches` global batches, as JSON (the same on every rank).
    fn state_at(&self, batches: u64) -> PyResult<String> {
        serde_json::to_string(&self.inner.state_at(batches))
            .map_err(|e| Error::new_err(e.to_string()))
    }

    /// Raises ValueError, naming what differs, unless the state (JSON) is of this stream;
    /// returns its global batches consumed.
    fn check_state(&self, state: &str) -> PyResult<u64> {
        let state: zr_common::MixtureState = serde_json::from_str(state)
            .map_err(|e| PyValueError::new_err(format!("not a mixture state: {e}")))?;
        self.inner
            .check_state(&state)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(state.batches)
    }
}

/// The engine's prefetching loader over a local dataset: batches of a sampler's order
/// gathered ahead on background threads, without the GIL, each handed over as its columns
/// (moved into NumPy, not copied). Python's `zrecord.Loader` drives it for local datasets.
#[pyclass(module = "zrecord._zrecord")]
pub(crate) struct NativeLoader {
    /// Locked only by the thread taking the next batch (a loader is iterated by one).
    pub(crate) inner: std::sync::Mutex<zr_common::Loader>,
}

#[pymethods]
impl NativeLoader {
    /// Batches of `sampler` from (`epoch`, `position`) to the end of that epoch, of `fields`
    /// (empty: all), `prefetch` ahead on `workers` threads.
    #[new]
    #[pyo3(signature = (store, sampler, epoch, position, fields, prefetch, workers))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        store: &Bound<'_, PyAny>,
        sampler: &Sampler,
        epoch: u64,
        position: u64,
        fields: Vec<String>,
        prefetch: usize,
        workers: usize,
    ) -> PyResult<NativeLoader> {
        let options = zr_common::LoaderOptions {
            fields,
            prefetch,
            workers,
            end_epoch: Some(epoch + 1),
        };
        let inner = zr_common::Loader::new(
            gather_source(store, 0)?,
            sampler.inner.clone(),
            sampler.inner.state_at(epoch, position),
            options,
        )
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(NativeLoader {
            inner: std::sync::Mutex::new(inner),
        })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next batch: (epoch, its first position, its end position, its columns as
    /// (values, offsets) per field).
    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<LoadedColumns<'py>>> {
        let Some((batch, columns)) = next_loaded(py, &self.inner)? else {
            return Ok(None);
        };
        let end = batch.position + batch.indices.len() as u64;
        Ok(Some((batch.epoch, batch.position, end, columns)))
    }
}

/// What a loader reads from: a local dataset, a cluster's, or a token stream's windows
/// (local or a cluster's); `i` names it in the error.
pub(crate) fn gather_source(
    source: &Bound<'_, PyAny>,
    i: usize,
) -> PyResult<std::sync::Arc<dyn zr_common::GatherSource>> {
    if let Ok(store) = source.cast::<Store>() {
        Ok(std::sync::Arc::new(store.get().inner.clone()))
    } else if let Ok(client) = source.cast::<Client>() {
        Ok(client.get().inner.clone())
    } else if let Ok(windows) = source.cast::<StreamWindows>() {
        Ok(std::sync::Arc::new(windows.get().inner.clone()))
    } else if let Ok(packed) = source.cast::<StreamPacked>() {
        Ok(match &packed.get().inner {
            PackedRows::Local(p) => std::sync::Arc::new(p.clone()),
            PackedRows::Cluster(p) => std::sync::Arc::new(SharedClusterPacked(p.clone())),
        })
    } else if let Ok(windows) = source.cast::<ClusterStreamWindows>() {
        let windows = windows.get();
        Ok(std::sync::Arc::new(SharedClusterWindows {
            stream: windows.stream.clone(),
            mode: windows.mode,
        }))
    } else {
        Err(PyValueError::new_err(format!(
            "source {i} is neither a dataset (local or a cluster's) nor a stream's windows"
        )))
    }
}

/// A cluster stream's windows as a loader source, the stream shared with its handle.
pub(crate) struct SharedClusterWindows {
    pub(crate) stream: std::sync::Arc<std::sync::RwLock<zr_client::ClusterStream>>,
    pub(crate) mode: zr_common::WindowMode,
}

impl zr_common::GatherSource for SharedClusterWindows {
    fn gather_into(
        &self,
        indices: &[u64],
        fields: &[String],
        columns: &mut Vec<zr_common::Contiguous>,
    ) -> Result<(), zr_common::BoxError> {
        let stream = self.stream.read().unwrap_or_else(|e| e.into_inner());
        stream.gather_columns(self.mode, indices, fields, columns)
    }
}

/// The next batch of a loader (waited for without the GIL), its columns moved into NumPy.
pub(crate) fn next_loaded<'py, L>(
    py: Python<'py>,
    loader: &std::sync::Mutex<L>,
) -> PyResult<Option<(zr_common::LoadedBatch, Vec<PyColumn<'py>>)>>
where
    L: Iterator<Item = Result<zr_common::LoadedBatch, zr_common::Error>> + Send,
{
    let next = py.detach(|| loader.lock().unwrap_or_else(|e| e.into_inner()).next());
    let Some(next) = next else {
        return Ok(None);
    };
    let mut batch = next.map_err(loader_error)?;
    let columns = std::mem::take(&mut batch.columns)
        .into_iter()
        .map(|column| py_column(py, column))
        .collect();
    Ok(Some((batch, columns)))
}

/// A loaded batch for Python: (epoch, first position, end position, columns).
type LoadedColumns<'py> = (u64, u64, u64, Vec<PyColumn<'py>>);

/// The Python exception for a loader's failure: the engine's own, where it says which.
pub(crate) fn loader_error(e: zr_common::Error) -> PyErr {
    let message = e.to_string();
    if let zr_common::Error::Gather { source, .. } = &e {
        match source.downcast_ref::<NodeError>() {
            Some(NodeError::IndexOutOfRange { .. } | NodeError::UnitIndexOutOfRange { .. }) => {
                return PyIndexError::new_err(message)
            }
            Some(NodeError::BadRecord { .. } | NodeError::Corrupt { .. }) => {
                return CorruptRecord::new_err(message)
            }
            _ => {}
        }
    }
    Error::new_err(message)
}
