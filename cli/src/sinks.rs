//! Where `zr convert` writes into a cluster: a new token stream ([`ClusterSink`], for
//! Megatron files, token arrays and text through a tokenizer) or a new record dataset
//! ([`ClusterRecords`], for Parquet and WebDataset), each committed every
//! [`CLUSTER_COMMIT_BYTES`] and dropped again if the conversion fails.

use zr_node::stream::TokenSink;

/// Bytes of tokens a cluster conversion hands over between commits.
pub const CLUSTER_COMMIT_BYTES: u64 = 256 << 20;

/// A new token stream in a cluster as a conversion's sink: committed every
/// [`CLUSTER_COMMIT_BYTES`] at a document boundary, and at the end.
pub struct ClusterSink {
    pub client: zr_router::Client,
    pub name: String,
    pub block_tokens: u64,
    pub stream: Option<zr_router::ClusterStream>,
    pub since_commit: u64,
}

impl ClusterSink {
    fn stream(&mut self) -> zr_node::Result<&mut zr_router::ClusterStream> {
        self.stream
            .as_mut()
            .ok_or_else(|| zr_node::Error::Cluster("tokens before the stream was made".into()))
    }
}

pub fn cluster(e: zr_router::Error) -> zr_node::Error {
    zr_node::Error::Cluster(Box::new(e))
}

impl TokenSink for ClusterSink {
    fn start(&mut self, dtype: &str) -> zr_node::Result<()> {
        let stream =
            zr_router::ClusterStream::create(&self.client, &self.name, dtype, self.block_tokens)
                .map_err(cluster)?;
        self.stream = Some(stream);
        Ok(())
    }

    fn append_tokens(&mut self, bytes: &[u8]) -> zr_node::Result<()> {
        self.since_commit += bytes.len() as u64;
        self.stream()?.append_tokens(bytes).map_err(cluster)?;
        Ok(())
    }

    fn end_documents_at(&mut self, ends: &[u64]) -> zr_node::Result<()> {
        let stream = self.stream()?;
        for &end in ends {
            stream.end_document_at(end).map_err(cluster)?;
        }
        Ok(())
    }

    fn aligned(&mut self) -> zr_node::Result<()> {
        if self.since_commit >= CLUSTER_COMMIT_BYTES {
            self.stream()?.commit().map_err(cluster)?;
            self.since_commit = 0;
        }
        Ok(())
    }

    fn finish(&mut self) -> zr_node::Result<()> {
        self.stream()?.commit().map_err(cluster)
    }
}

impl ClusterSink {
    /// A sink making the cluster's new stream `name`, through `client` (an operator's).
    pub fn new(client: zr_router::Client, name: String, block_tokens: u64) -> ClusterSink {
        ClusterSink {
            client,
            name,
            block_tokens,
            stream: None,
            since_commit: 0,
        }
    }

    /// The conversion failed: the stream made for it is dropped (nothing else was there).
    pub fn abandon(&mut self) {
        if self.stream.take().is_some() {
            if let Err(e) = self.client.drop_dataset(&self.name) {
                eprintln!(
                    "the failed conversion's dataset '{}' could not be dropped: {e}",
                    self.name
                );
            }
        }
    }
}

/// A new record dataset of a cluster as a table conversion's sink.
pub struct ClusterRecords {
    client: zr_router::Client,
    name: String,
    dataset: Option<zr_router::Client>,
    since_commit: u64,
}

impl ClusterRecords {
    /// A sink making the cluster's new dataset `name`, through `client` (an operator's).
    pub fn new(client: zr_router::Client, name: String) -> ClusterRecords {
        ClusterRecords {
            client,
            name,
            dataset: None,
            since_commit: 0,
        }
    }

    fn dataset(&self) -> Result<&zr_router::Client, zr_ingest::IngestError> {
        self.dataset.as_ref().ok_or_else(|| {
            zr_ingest::IngestError::Usage("records before the dataset was made".into())
        })
    }
}

fn ingest(e: zr_router::Error) -> zr_ingest::IngestError {
    zr_ingest::IngestError::Stream(cluster(e))
}

impl zr_ingest::RecordSink for ClusterRecords {
    fn create(&mut self, fields: &[zr_node::FieldSpec]) -> Result<(), zr_ingest::IngestError> {
        let fields = fields
            .iter()
            .map(|spec| zr_router::FieldInfo {
                name: spec.name.clone(),
                compress: spec.storage(),
                dtype: spec.dtype.clone(),
                shape: spec.shape.clone(),
                dict: None,
            })
            .collect();
        let dataset = self
            .client
            .create_dataset(&self.name, fields)
            .map_err(ingest)?;
        self.dataset = Some(dataset);
        Ok(())
    }

    fn append(&mut self, records: &[zr_node::Record<'_>]) -> Result<(), zr_ingest::IngestError> {
        self.dataset()?.append_many(records).map_err(ingest)?;
        self.since_commit += records
            .iter()
            .flat_map(|r| r.values())
            .map(|(_, v)| v.len() as u64)
            .sum::<u64>();
        if self.since_commit >= CLUSTER_COMMIT_BYTES {
            self.dataset()?.commit().map_err(ingest)?;
            self.since_commit = 0;
        }
        Ok(())
    }

    fn commit(&mut self) -> Result<(), zr_ingest::IngestError> {
        self.dataset()?.commit().map_err(ingest)
    }

    fn abandon(&mut self) {
        if self.dataset.take().is_some() {
            if let Err(e) = self.client.drop_dataset(&self.name) {
                eprintln!(
                    "the failed conversion's dataset '{}' could not be dropped: {e}",
                    self.name
                );
            }
        }
    }
}
