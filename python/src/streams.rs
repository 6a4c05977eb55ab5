//! Token streams from Python: windows, documents and packed rows, local and on a cluster.

use super::*;

/// A token stream (the engine's `stream::Stream`).
#[pyclass(module = "zrecord._zrecord", frozen)]
pub(crate) struct Stream {
    pub(crate) inner: std::sync::Arc<zr_node::stream::Stream>,
}

/// An element type for Python: (component name, NumPy type string) per component.
type ElementTuple = Vec<(String, String)>;

#[pymethods]
impl Stream {
    /// Opens the stream at `path`: read-only (beside other readers and one writer) or for
    /// appending (one writer at a time).
    #[staticmethod]
    fn open(py: Python<'_>, path: std::path::PathBuf, writable: bool) -> PyResult<Stream> {
        let inner = py
            .detach(|| {
                if writable {
                    zr_node::stream::Stream::open(&path)
                } else {
                    zr_node::stream::Stream::open_read_only(&path)
                }
            })
            .map_err(node_error)?;
        Ok(Stream {
            inner: std::sync::Arc::new(inner),
        })
    }

    /// Creates an empty stream of `element` at `path`, open for appending.
    #[staticmethod]
    fn create(py: Python<'_>, path: std::path::PathBuf, element: ElementTuple) -> PyResult<Stream> {
        let element = element
            .into_iter()
            .map(|(name, dtype)| zr_node::stream::Component::new(name, dtype))
            .collect();
        let inner = py
            .detach(|| zr_node::stream::Stream::create(&path, element))
            .map_err(node_error)?;
        Ok(Stream {
            inner: std::sync::Arc::new(inner),
        })
    }

    /// Committed tokens.
    fn __len__(&self) -> usize {
        self.inner.len() as usize
    }

    fn documents(&self) -> u64 {
        self.inner.documents()
    }

    fn spans(&self) -> u64 {
        self.inner.spans()
    }

    fn element(&self) -> ElementTuple {
        self.inner
            .element()
            .into_iter()
            .map(|c| (c.name, c.dtype))
            .collect()
    }

    /// Sees what was committed since; returns the tokens.
    fn refresh(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| self.inner.refresh()).map_err(node_error)
    }

    /// Document `d`'s token range (start, end).
    fn document(&self, d: u64) -> PyResult<(u64, u64)> {
        self.inner.document(d).map_err(node_error)
    }

    /// Span `j`: (start, end, metadata bytes).
    fn span<'py>(
        &self,
        py: Python<'py>,
        j: u64,
    ) -> PyResult<(u64, u64, Bound<'py, pyo3::types::PyBytes>)> {
        let (start, end, metadata) = self.inner.span(j).map_err(node_error)?;
        Ok((start, end, pyo3::types::PyBytes::new(py, &metadata)))
    }

    /// Copies tokens from `start` into `out` (uint8, whole elements).
    fn read_tokens(
        &self,
        py: Python<'_>,
        start: u64,
        out: &Bound<'_, PyArray1<u8>>,
    ) -> PyResult<()> {
        let mut out = borrow_out(out, "out")?;
        let out = out_slice(&mut out, "out")?;
        py.detach(|| self.inner.read_tokens(start, out))
            .map_err(node_error)
    }

    /// Appends a document: its tokens' bytes and its spans as (start, end, metadata);
    /// returns its index.
    fn append_document(
        &self,
        py: Python<'_>,
        tokens: PyReadonlyArray1<'_, u8>,
        spans: Vec<(u64, u64, Vec<u8>)>,
    ) -> PyResult<u64> {
        let tokens = tokens
            .as_slice()
            .map_err(|e| PyValueError::new_err(format!("tokens: {e}")))?;
        let spans: Vec<zr_node::stream::Span> = spans
            .iter()
            .map(|(start, end, metadata)| zr_node::stream::Span {
                start: *start,
                end: *end,
                metadata,
            })
            .collect();
        py.detach(|| self.inner.append_document(tokens, &spans))
            .map_err(node_error)
    }

    fn commit(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.commit()).map_err(node_error)
    }

    /// Every problem `verify` finds, as (table, entry, reason).
    fn verify(&self, py: Python<'_>) -> PyResult<Vec<(String, u64, String)>> {
        let report = py
            .detach(|| self.inner.verify(|_| {}))
            .map_err(node_error)?;
        Ok(report
            .problems
            .into_iter()
            .map(|p| (p.field, p.index, p.reason))
            .collect())
    }

    /// Observations: windows of `seq_len + 1` tokens every `stride`, or (`documents`) one
    /// per document, cut or padded to `seq_len + 1`, read as `read` says.
    fn windows(&self, windows: WindowsTuple, read: ReadTuple) -> PyResult<StreamWindows> {
        let (seq_len, stride, documents) = windows;
        let mode = if documents {
            zr_node::stream::WindowMode::Documents { seq_len }
        } else {
            zr_node::stream::WindowMode::Windows { seq_len, stride }
        };
        let inner = zr_node::stream::Windows::new(self.inner.clone(), mode)
            .map_err(node_error)?
            .with_options(gather_options(read)?);
        Ok(StreamWindows { inner })
    }

    /// Documents packed whole into rows as `pack` says (see [`pack_config`]), read as `read`
    /// says, documents `blocked` left out.
    fn packed(
        &self,
        py: Python<'_>,
        pack: PackTuple,
        read: ReadTuple,
        blocked: Vec<u64>,
    ) -> PyResult<StreamPacked> {
        let config = pack_config(pack)?;
        let options = gather_options(read)?;
        let stream = self.inner.clone();
        let inner = py
            .detach(|| zr_node::stream::Packed::new(stream, config)?.block(&blocked))
            .map_err(|e| match e {
                zr_node::Error::InvalidRecord(reason) => PyValueError::new_err(reason),
                other => node_error(other),
            })?
            .with_options(options);
        Ok(StreamPacked {
            inner: PackedRows::Local(inner),
        })
    }
}

/// Observations asked for from Python: (seq_len, stride, one per document).
type WindowsTuple = (u64, u64, bool);
/// A packing asked for from Python: (seq_len, packer, lookahead, seed).
type PackTuple = (u64, String, usize, u64);
/// How a local stream is read, from Python: (read path: mmap, direct or auto; uncached;
/// checked against the CRCs). A cluster's nodes choose how they read.
type ReadTuple = (String, bool, bool);

fn gather_options((read, uncached, checked): ReadTuple) -> PyResult<zr_node::GatherOptions> {
    let read: zr_node::ReadPath = read
        .parse()
        .map_err(|e: zr_node::UnknownReadPath| PyValueError::new_err(e.to_string()))?;
    Ok(zr_node::GatherOptions {
        read,
        uncached,
        verify: checked,
        ..zr_node::GatherOptions::default()
    })
}

/// A packing asked for from Python (`packer` best_fit or first_fit, `lookahead` documents
/// at a time, in the order `seed` shuffles them into), checked.
pub(crate) fn pack_config(
    (seq_len, packer, lookahead, seed): PackTuple,
) -> PyResult<zr_node::stream::PackConfig> {
    let packer: zr_node::stream::Packer = packer
        .parse()
        .map_err(|e: zr_common::packing::BadPacking| PyValueError::new_err(e.0))?;
    let config = zr_node::stream::PackConfig {
        seq_len,
        packer,
        lookahead,
        seed,
    };
    config.check().map_err(|e| PyValueError::new_err(e.0))?;
    Ok(config)
}

/// What a packing comes to: (rows, documents, tokens, documents split, pieces, padding
/// fraction).
pub(crate) fn plan_stats(plan: &zr_common::PackPlan) -> (u64, u64, u64, u64, u64, f64) {
    let stats = plan.stats();
    (
        stats.rows,
        stats.documents,
        stats.tokens,
        stats.split,
        stats.pieces,
        stats.padding_fraction(plan.config().width()),
    )
}

/// A packed batch's columns, each moved into NumPy.
pub(crate) fn packed_arrays(
    py: Python<'_>,
    out: zr_node::stream::PackedColumns,
) -> PackedArrays<'_> {
    (
        PyArray1::from_vec(py, out.tokens),
        PyArray1::from_vec(py, out.document),
        PyArray1::from_vec(py, out.segment_ids),
        PyArray1::from_vec(py, out.positions),
        PyArray1::from_vec(py, out.loss_mask),
        PyArray1::from_vec(py, out.cu_seqlens),
        out.max_seqlen,
    )
}

/// A stream's documents packed whole into rows (see `Stream.packed`): a local stream's, or
/// a cluster's (the same rows, byte for byte).
#[pyclass(module = "zrecord._zrecord", frozen)]
pub(crate) struct StreamPacked {
    pub(crate) inner: PackedRows,
}

pub(crate) enum PackedRows {
    Local(zr_node::stream::Packed),
    Cluster(std::sync::Arc<zr_client::ClusterPacked>),
}

impl PackedRows {
    fn plan(&self) -> &zr_common::PackPlan {
        match self {
            PackedRows::Local(p) => p.plan(),
            PackedRows::Cluster(p) => p.plan(),
        }
    }

    fn gather(&self, indices: &[u64], out: &mut zr_node::stream::PackedColumns) -> PyResult<()> {
        match self {
            PackedRows::Local(p) => p.gather(indices, out, None).map_err(node_error),
            PackedRows::Cluster(p) => p.gather(indices, out).map_err(cluster_error),
        }
    }
}

/// A packed batch: tokens (bytes), document, segment ids, positions, loss mask (each rows ×
/// width), cu_seqlens, max_seqlen.
type PackedArrays<'py> = (
    Bound<'py, PyArray1<u8>>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i32>>,
    Bound<'py, PyArray1<i32>>,
    Bound<'py, PyArray1<u8>>,
    Bound<'py, PyArray1<i32>>,
    i32,
);

#[pymethods]
impl StreamPacked {
    fn __len__(&self) -> usize {
        self.inner.plan().rows() as usize
    }

    /// Tokens per row.
    fn width(&self) -> usize {
        self.inner.plan().config().width() as usize
    }

    /// (rows, documents, tokens, documents split, pieces, padding fraction).
    fn stats(&self) -> (u64, u64, u64, u64, u64, f64) {
        plan_stats(self.inner.plan())
    }

    /// Rows `indices`: their columns, each moved into NumPy.
    fn gather<'py>(
        &self,
        py: Python<'py>,
        indices: PyReadonlyArray1<'_, u64>,
    ) -> PyResult<PackedArrays<'py>> {
        let indices = indices_of(&indices);
        let mut out = zr_node::stream::PackedColumns::default();
        py.detach(|| self.inner.gather(&indices, &mut out))?;
        Ok(packed_arrays(py, out))
    }
}

/// The observations of a stream (see `Stream.windows`).
#[pyclass(module = "zrecord._zrecord", frozen)]
pub(crate) struct StreamWindows {
    pub(crate) inner: zr_node::stream::Windows,
}

/// The spans a gather found: (hits as row, start, end, span — flat, 4 per hit; the spans
/// hit, ascending; their metadata as (values, offsets)).
type SpanColumns<'py> = (
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<u64>>,
    PyColumn<'py>,
);

#[pymethods]
impl StreamWindows {
    fn __len__(&self) -> usize {
        self.inner.len() as usize
    }

    /// Tokens per observation.
    fn width(&self) -> usize {
        self.inner.width()
    }

    /// Gathers observations `indices`: tokens into `tokens` (uint8 view of rows × width
    /// elements), documents into `document` (int64, rows × width) and the mask into `mask`
    /// (uint8, document mode) when given; with `spans`, the spans hit.
    #[pyo3(signature = (indices, tokens, document=None, mask=None, spans=false))]
    fn gather<'py>(
        &self,
        py: Python<'py>,
        indices: PyReadonlyArray1<'_, u64>,
        tokens: &Bound<'_, PyArray1<u8>>,
        document: Option<&Bound<'_, PyArray1<i64>>>,
        mask: Option<&Bound<'_, PyArray1<u8>>>,
        spans: bool,
    ) -> PyResult<Option<SpanColumns<'py>>> {
        let indices = indices_of(&indices);
        let mut tokens = borrow_out(tokens, "tokens")?;
        let tokens = out_slice(&mut tokens, "tokens")?;
        let mut document = borrow_optional(document, "document")?;
        let document = optional_slice(&mut document, "document")?;
        let mut mask = borrow_optional(mask, "mask")?;
        let mask = optional_slice(&mut mask, "mask")?;
        let mut sink = zr_node::stream::SpanSink::default();
        py.detach(|| {
            self.inner
                .gather_to(&indices, tokens, document, mask, spans.then_some(&mut sink))
        })
        .map_err(node_error)?;
        if !spans {
            return Ok(None);
        }
        let hits: Vec<i64> = sink
            .hits
            .iter()
            .flat_map(|h| [h.row as i64, h.start as i64, h.end as i64, h.span as i64])
            .collect();
        Ok(Some((
            PyArray1::from_vec(py, hits),
            PyArray1::from_vec(py, sink.ids),
            py_column(py, sink.metadata),
        )))
    }
}

/// A token stream held by a cluster's named dataset (`zr_client::ClusterStream`).
#[pyclass(module = "zrecord._zrecord", frozen)]
pub(crate) struct ClusterStream {
    /// Gathers share it; appends and commits take it alone.
    pub(crate) inner: std::sync::Arc<std::sync::RwLock<zr_client::ClusterStream>>,
}

impl ClusterStream {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, zr_client::ClusterStream> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, zr_client::ClusterStream> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    fn wrap(inner: zr_client::ClusterStream) -> ClusterStream {
        ClusterStream {
            inner: std::sync::Arc::new(std::sync::RwLock::new(inner)),
        }
    }
}

pub(crate) fn local_only(what: &str) -> PyErr {
    Error::new_err(format!(
        "{what} is offered for local token streams; a cluster's stream is read as windows"
    ))
}

#[pymethods]
impl ClusterStream {
    /// The token stream `client`'s dataset holds.
    #[staticmethod]
    fn open(py: Python<'_>, client: &Client) -> PyResult<ClusterStream> {
        let inner = py
            .detach(|| {
                let handle = client.inner.dataset(client.inner.name())?;
                zr_client::ClusterStream::open(handle)
            })
            .map_err(cluster_error)?;
        Ok(ClusterStream::wrap(inner))
    }

    /// Makes dataset `name` a token stream of `dtype` in blocks of `block_tokens`.
    #[staticmethod]
    fn create(
        py: Python<'_>,
        client: &Client,
        name: &str,
        dtype: &str,
        block_tokens: u64,
    ) -> PyResult<ClusterStream> {
        let inner = py
            .detach(|| zr_client::ClusterStream::create(&client.inner, name, dtype, block_tokens))
            .map_err(cluster_error)?;
        Ok(ClusterStream::wrap(inner))
    }

    fn __len__(&self) -> usize {
        self.read().len() as usize
    }

    fn documents(&self) -> u64 {
        self.read().documents()
    }

    fn spans(&self) -> u64 {
        0
    }

    fn element(&self) -> ElementTuple {
        vec![("token".into(), self.read().dtype().to_string())]
    }

    fn refresh(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| self.write().refresh()).map_err(cluster_error)
    }

    fn document(&self, _d: u64) -> PyResult<(u64, u64)> {
        Err(local_only("document()"))
    }

    fn span<'py>(&self, _j: u64) -> PyResult<(u64, u64, Bound<'py, pyo3::types::PyBytes>)> {
        Err(local_only("span metadata"))
    }

    fn read_tokens(&self, _start: u64, _out: &Bound<'_, PyArray1<u8>>) -> PyResult<()> {
        Err(local_only("tokens()"))
    }

    fn verify(&self) -> PyResult<Vec<(String, u64, String)>> {
        Err(local_only(
            "verify() (a cluster checks its blocks with zr cluster scrub)",
        ))
    }

    /// Appends a document; `spans` must be empty (a cluster's streams carry none).
    fn append_document(
        &self,
        py: Python<'_>,
        tokens: PyReadonlyArray1<'_, u8>,
        spans: Vec<(u64, u64, Vec<u8>)>,
    ) -> PyResult<u64> {
        if !spans.is_empty() {
            return Err(local_only("span metadata"));
        }
        let tokens = tokens
            .as_slice()
            .map_err(|e| PyValueError::new_err(format!("tokens: {e}")))?;
        py.detach(|| self.write().append_document(tokens))
            .map_err(cluster_error)
    }

    fn commit(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.write().commit()).map_err(cluster_error)
    }

    /// Windows of `seq_len + 1` tokens every `stride` (document windows are local only);
    /// the nodes choose how they read.
    fn windows(&self, windows: WindowsTuple, _read: ReadTuple) -> PyResult<ClusterStreamWindows> {
        let (seq_len, stride, documents) = windows;
        if documents {
            return Err(local_only("document_windows()"));
        }
        let mode = zr_common::WindowMode::Windows { seq_len, stride };
        self.read().count(mode).map_err(cluster_error)?;
        Ok(ClusterStreamWindows {
            stream: self.inner.clone(),
            mode,
        })
    }

    /// Documents packed whole into rows (see the local stream's `packed`); the rows are the
    /// local stream's, byte for byte. The nodes choose how they read.
    fn packed(
        &self,
        py: Python<'_>,
        pack: PackTuple,
        _read: ReadTuple,
        blocked: Vec<u64>,
    ) -> PyResult<StreamPacked> {
        let config = pack_config(pack)?;
        let stream = self.read();
        let handle = stream
            .client()
            .dataset(stream.client().name())
            .map_err(cluster_error)?;
        drop(stream);
        let inner = py
            .detach(|| {
                zr_client::ClusterStream::open(handle)
                    .and_then(|fresh| zr_client::ClusterPacked::new(fresh, config))
                    .and_then(|packed| packed.block(&blocked))
            })
            .map_err(cluster_error)?;
        Ok(StreamPacked {
            inner: PackedRows::Cluster(std::sync::Arc::new(inner)),
        })
    }
}

/// A cluster stream's packed rows as a loader source.
pub(crate) struct SharedClusterPacked(pub(crate) std::sync::Arc<zr_client::ClusterPacked>);

impl zr_common::GatherSource for SharedClusterPacked {
    fn gather_into(
        &self,
        indices: &[u64],
        fields: &[String],
        columns: &mut Vec<zr_common::Contiguous>,
    ) -> Result<(), zr_common::BoxError> {
        self.0.gather_into(indices, fields, columns)
    }
}

/// Windows of a cluster's token stream.
#[pyclass(module = "zrecord._zrecord", frozen)]
pub(crate) struct ClusterStreamWindows {
    pub(crate) stream: std::sync::Arc<std::sync::RwLock<zr_client::ClusterStream>>,
    pub(crate) mode: zr_common::WindowMode,
}

#[pymethods]
impl ClusterStreamWindows {
    fn __len__(&self) -> PyResult<usize> {
        let stream = self.stream.read().unwrap_or_else(|e| e.into_inner());
        Ok(stream.count(self.mode).map_err(cluster_error)? as usize)
    }

    fn width(&self) -> usize {
        self.mode.width() as usize
    }

    /// As `StreamWindows.gather` (no mask, no spans).
    #[pyo3(signature = (indices, tokens, document=None, mask=None, spans=false))]
    fn gather(
        &self,
        py: Python<'_>,
        indices: PyReadonlyArray1<'_, u64>,
        tokens: &Bound<'_, PyArray1<u8>>,
        document: Option<&Bound<'_, PyArray1<i64>>>,
        mask: Option<&Bound<'_, PyArray1<u8>>>,
        spans: bool,
    ) -> PyResult<Option<(u8,)>> {
        if mask.is_some() || spans {
            return Err(local_only("masks and spans"));
        }
        let indices = indices_of(&indices);
        let mut tokens = borrow_out(tokens, "tokens")?;
        let tokens = out_slice(&mut tokens, "tokens")?;
        let mut document = borrow_optional(document, "document")?;
        let document = optional_slice(&mut document, "document")?;
        py.detach(|| {
            let stream = self.stream.read().unwrap_or_else(|e| e.into_inner());
            stream.gather(self.mode, &indices, tokens, document)
        })
        .map_err(cluster_error)?;
        Ok(None)
    }
}
