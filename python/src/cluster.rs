//! A cluster from Python: the client of its router, its datasets and their records.

use super::*;

/// A client of a zrecord cluster's router.
#[pyclass(module = "zrecord._zrecord", frozen)]
pub(crate) struct Client {
    /// Shared with the loaders reading through it.
    pub(crate) inner: std::sync::Arc<zr_client::Client>,
}

#[pymethods]
impl Client {
    /// Connects to the router at `router` ("HOST:PORT") with a client certificate from
    /// `certs` (None: a router run with --insecure-dev) of role `role` (reader, writer or
    /// operator; None: the writer's if `certs` holds one, else the reader's, else the
    /// operator's); gathers one hop, straight from the nodes, unless `direct` is false.
    #[staticmethod]
    #[pyo3(signature = (router, certs=None, timeout_ms=30_000, role=None, dataset=None, direct=true))]
    fn connect(
        py: Python<'_>,
        router: &str,
        certs: Option<std::path::PathBuf>,
        timeout_ms: u64,
        role: Option<&str>,
        dataset: Option<&str>,
        direct: bool,
    ) -> PyResult<Client> {
        use zr_net::tls::Role;
        let addr: std::net::SocketAddr = router
            .parse()
            .map_err(|e| PyValueError::new_err(format!("router '{router}': {e}")))?;
        let security = match certs {
            Some(dir) => {
                let role = match role {
                    Some(name) => match name.parse::<Role>() {
                        Ok(role) if role.access().is_some() => role,
                        _ => {
                            return Err(PyValueError::new_err(format!(
                                "role {name:?}: one of 'reader', 'writer', 'operator'"
                            )))
                        }
                    },
                    None => [Role::Writer, Role::Client, Role::Reader, Role::Operator]
                        .into_iter()
                        .find(|&r| zr_net::tls::holds_role(&dir, r))
                        .unwrap_or(Role::Reader),
                };
                zr_net::Security::load(&dir, role).map_err(|e| Error::new_err(e.to_string()))?
            }
            None => zr_net::Security::InsecureDev,
        };
        let timeout = std::time::Duration::from_millis(timeout_ms.max(1));
        let inner = py
            .detach(|| {
                let options = zr_client::ClientOptions {
                    timeout,
                    direct,
                    ..zr_client::ClientOptions::default()
                };
                let client = zr_client::Client::connect_with(addr, security, options)?;
                match dataset {
                    Some(name) => client.dataset(name),
                    None => Ok(client),
                }
            })
            .map_err(cluster_error)?;
        Ok(Client {
            inner: std::sync::Arc::new(inner),
        })
    }

    /// True if gathers go straight to the nodes (one hop), False if through the router.
    fn reads_direct(&self) -> bool {
        self.inner.reads_direct()
    }

    /// The dataset this client addresses.
    fn name(&self) -> String {
        self.inner.name().to_string()
    }

    /// The cluster's datasets: (name, records, committed, fields, bytes, id, commits) each.
    fn datasets(&self, py: Python<'_>) -> PyResult<Vec<DatasetTuple>> {
        let all = py.detach(|| self.inner.datasets()).map_err(cluster_error)?;
        Ok(all
            .into_iter()
            .map(|d| {
                let fields = d
                    .fields
                    .into_iter()
                    .map(|f| (f.name, f.compress, f.dtype, f.shape))
                    .collect();
                (d.name, d.len, d.committed, fields, d.bytes, d.id, d.commits)
            })
            .collect())
    }

    /// Creates dataset `name` with `fields` ((name, compression, dtype, shape) each), zstd
    /// fields among them compressed with the dictionaries `dicts` ((field, bytes) each).
    #[pyo3(signature = (name, fields, dicts=Vec::new()))]
    fn create_dataset(
        &self,
        py: Python<'_>,
        name: &str,
        fields: Vec<FieldTuple>,
        dicts: Vec<(String, Vec<u8>)>,
    ) -> PyResult<()> {
        let fields = fields
            .into_iter()
            .map(|(name, compress, dtype, shape)| zr_client::FieldInfo {
                name,
                compress,
                dtype,
                shape,
                dict: None,
            })
            .collect();
        let dicts = dicts
            .into_iter()
            .map(|(field, bytes)| zr_client::FieldDict { field, bytes })
            .collect();
        py.detach(|| self.inner.create_dataset_with_dicts(name, fields, dicts))
            .map(|_| ())
            .map_err(cluster_error)
    }

    /// Drops dataset `name` and every record in it.
    fn drop_dataset(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        py.detach(|| self.inner.drop_dataset(name))
            .map_err(cluster_error)
    }

    /// Adds field `name` (`compress`: raw, flate, zstd or zstd:LEVEL) to this client's dataset: the records
    /// stored so far lack it. A client made before does not know it: reconnect.
    fn add_field(&self, py: Python<'_>, name: String, compress: String) -> PyResult<()> {
        py.detach(|| {
            let mut handle = self.inner.dataset(self.inner.name())?;
            handle.add_field(zr_client::FieldInfo {
                name,
                compress,
                dtype: None,
                shape: None,
                dict: None,
            })
        })
        .map_err(cluster_error)
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
        let slices: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
        py.detach(|| {
            // The field may be newer than this client.
            let fresh = self.inner.dataset(self.inner.name())?;
            fresh.write_field(field, start, &slices)
        })
        .map_err(cluster_error)
    }

    /// Waits until the dataset has committed `len` records, `timeout_ms` at most; returns
    /// its committed length.
    fn wait_len(&self, py: Python<'_>, len: u64, timeout_ms: u64) -> PyResult<u64> {
        py.detach(|| {
            self.inner
                .wait_len(len, std::time::Duration::from_millis(timeout_ms))
        })
        .map_err(cluster_error)
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(py.detach(|| self.inner.len()).map_err(cluster_error)? as usize)
    }

    /// The fields, as (name, compression, dtype, shape).
    fn fields(&self) -> Vec<FieldTuple> {
        self.inner
            .fields()
            .iter()
            .map(|f| {
                (
                    f.name.clone(),
                    f.compress.clone(),
                    f.dtype.clone(),
                    f.shape.clone(),
                )
            })
            .collect()
    }

    /// Fields `fields` (empty: all) of `indices`: per field, its bytes and offsets.
    #[pyo3(signature = (indices, fields, checked=false, wait_ms=0))]
    fn gather_columns<'py>(
        &self,
        py: Python<'py>,
        indices: PyReadonlyArray1<'_, u64>,
        fields: Vec<String>,
        checked: bool,
        wait_ms: u64,
    ) -> PyResult<Vec<PyColumn<'py>>> {
        let indices = indices_of(&indices);
        let names: Vec<&str> = fields.iter().map(String::as_str).collect();
        let columns = py
            .detach(|| {
                if wait_ms > 0 {
                    let wait = std::time::Duration::from_millis(wait_ms);
                    self.inner.gather_waiting(&indices, &names, wait)
                } else if checked {
                    self.inner.gather_checked(&indices, &names)
                } else {
                    self.inner.gather(&indices, &names)
                }
            })
            .map_err(cluster_error)?;
        Ok(columns.into_iter().map(|c| py_column(py, c)).collect())
    }

    /// Appends the records of `columns` ({field: (bytes, offsets)}); returns the first index.
    fn append_columns(&self, py: Python<'_>, columns: Columns<'_>) -> PyResult<u64> {
        let records = records_of(&columns)?;
        let range = py.detach(|| self.inner.append_many(&records));
        Ok(range.map_err(cluster_error)?.start)
    }

    /// Replaces record `index` with the one record of `columns`.
    fn modify(&self, py: Python<'_>, index: u64, columns: Columns<'_>) -> PyResult<()> {
        let record = only_record(&columns)?;
        py.detach(|| self.inner.modify(index, &record))
            .map_err(cluster_error)
    }

    /// Deletes record `index`: the last record takes its place.
    fn delete(&self, py: Python<'_>, index: u64) -> PyResult<()> {
        py.detach(|| self.inner.delete(index))
            .map_err(cluster_error)
    }

    /// Makes every write so far durable on every node.
    fn commit(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.commit()).map_err(cluster_error)
    }
}
