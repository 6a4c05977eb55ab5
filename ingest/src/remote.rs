//! Inputs where they live: a local path, or an object-store URL (`s3://`, `gs://`, `az://`,
//! `abfs://`, `http://`, `https://`) read through the `object_store` crate in ranges as the
//! conversion goes — sequentially for JSON lines and tar shards, where the Parquet reader
//! asks for Parquet files. Credentials come from the environment as each store's builder
//! takes them (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`, `GOOGLE_*`,
//! `AZURE_*`, …).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use object_store::ObjectStore;

use crate::IngestError;

/// Bytes a sequential reader asks for at a time.
const BLOCK_BYTES: u64 = 8 << 20;

/// True if `path` names an object-store URL rather than a local file.
pub fn is_url(path: &Path) -> bool {
    path.to_str().is_some_and(|s| {
        s.split_once("://").is_some_and(|(scheme, _)| {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '+')
        })
    })
}

/// An object in a store: where it is, and its size.
#[derive(Clone)]
pub struct Remote {
    url: PathBuf,
    store: Arc<dyn ObjectStore>,
    location: object_store::path::Path,
    size: u64,
    runtime: Arc<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.url.display())
    }
}

impl Remote {
    /// The object at `url`, its size asked for (so a missing object is named at once).
    pub fn open(url: &Path) -> Result<Remote, IngestError> {
        let bad = |reason: String| IngestError::Input {
            path: url.to_path_buf(),
            reason,
        };
        let text = url.to_str().ok_or_else(|| bad("not UTF-8".into()))?;
        let parsed = url::Url::parse(text).map_err(|e| bad(format!("not a URL: {e}")))?;
        // The stores' configuration keys, as their builders' `from_env` read them.
        let options = std::env::vars()
            .filter(|(k, _)| {
                ["AWS_", "GOOGLE_", "AZURE_"]
                    .iter()
                    .any(|prefix| k.starts_with(prefix))
            })
            .map(|(k, v)| (k.to_ascii_lowercase(), v));
        let (store, location) = object_store::parse_url_opts(&parsed, options)
            .map_err(|e| bad(format!("no object store for it: {e}")))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| bad(format!("cannot start the reader's runtime: {e}")))?;
        let store: Arc<dyn ObjectStore> = Arc::from(store);
        let meta = runtime
            .block_on(store.head(&location))
            .map_err(|e| bad(described(e)))?;
        Ok(Remote {
            url: url.to_path_buf(),
            store,
            location,
            size: meta.size,
            runtime: Arc::new(runtime),
        })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes `[start, start + len)`, clamped to the object's end.
    pub fn get(&self, start: u64, len: u64) -> Result<Bytes, IngestError> {
        let end = (start + len).min(self.size);
        if start >= end {
            return Ok(Bytes::new());
        }
        self.runtime
            .block_on(self.store.get_range(&self.location, start..end))
            .map_err(|e| IngestError::Input {
                path: self.url.clone(),
                reason: format!("reading bytes {start}..{end}: {}", described(e)),
            })
    }

    /// A reader from byte `start` to the end, a block at a time.
    pub fn reader(&self, start: u64) -> RemoteReader {
        RemoteReader {
            remote: self.clone(),
            at: start,
            block: Bytes::new(),
        }
    }
}

/// What went wrong with an object, in a line.
fn described(e: object_store::Error) -> String {
    match e {
        object_store::Error::NotFound { .. } => "no such object".into(),
        other => other.to_string(),
    }
}

/// An object read in order, 8 MiB (`BLOCK_BYTES`) at a time.
pub struct RemoteReader {
    remote: Remote,
    /// The offset of `block`'s end.
    at: u64,
    block: Bytes,
}

impl Read for RemoteReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.block.is_empty() {
            if self.at >= self.remote.size {
                return Ok(0);
            }
            self.block = self
                .remote
                .get(self.at, BLOCK_BYTES)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            if self.block.is_empty() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "the object ended at byte {} of the {} it had",
                        self.at, self.remote.size
                    ),
                ));
            }
            self.at += self.block.len() as u64;
        }
        let n = out.len().min(self.block.len());
        out[..n].copy_from_slice(&self.block[..n]);
        let _ = self.block.split_to(n);
        Ok(n)
    }
}

/// An input opened for reading in order: a local file or an object.
pub fn open_read(path: &Path) -> Result<Box<dyn Read + Send>, IngestError> {
    if is_url(path) {
        return Ok(Box::new(Remote::open(path)?.reader(0)));
    }
    let file = std::fs::File::open(path).map_err(|e| IngestError::Input {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    Ok(Box::new(file))
}

/// Checks that `path` is there to read: a local file, or an object (its size asked).
pub fn check_input(path: &Path) -> Result<(), IngestError> {
    if is_url(path) {
        return Remote::open(path).map(|_| ());
    }
    if path.is_file() {
        Ok(())
    } else {
        Err(IngestError::Input {
            path: path.to_path_buf(),
            reason: "no such file".into(),
        })
    }
}

/// A Parquet file where it lives, for the Parquet reader's ranged reads.
pub enum ParquetSource {
    File(std::fs::File),
    Remote(Remote),
}

impl ParquetSource {
    pub fn open(path: &Path) -> Result<ParquetSource, IngestError> {
        if is_url(path) {
            return Ok(ParquetSource::Remote(Remote::open(path)?));
        }
        std::fs::File::open(path)
            .map(ParquetSource::File)
            .map_err(|e| IngestError::Input {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })
    }
}

impl parquet::file::reader::Length for ParquetSource {
    fn len(&self) -> u64 {
        match self {
            ParquetSource::File(f) => parquet::file::reader::Length::len(f),
            ParquetSource::Remote(r) => r.size,
        }
    }
}

impl parquet::file::reader::ChunkReader for ParquetSource {
    type T = Box<dyn Read + Send>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        match self {
            ParquetSource::File(f) => Ok(Box::new(parquet::file::reader::ChunkReader::get_read(
                f, start,
            )?)),
            ParquetSource::Remote(r) => Ok(Box::new(r.reader(start))),
        }
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        match self {
            ParquetSource::File(f) => {
                parquet::file::reader::ChunkReader::get_bytes(f, start, length)
            }
            ParquetSource::Remote(r) => {
                let bytes = r
                    .get(start, length as u64)
                    .map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))?;
                if bytes.len() != length {
                    return Err(parquet::errors::ParquetError::EOF(format!(
                        "asked for {length} bytes at {start}, the object holds {}",
                        bytes.len()
                    )));
                }
                Ok(bytes)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use object_store::PutPayload;

    fn remote(store: Arc<InMemory>, key: &str, size: u64) -> Remote {
        Remote {
            url: PathBuf::from(format!("memory:///{key}")),
            store,
            location: object_store::path::Path::from(key),
            size,
            runtime: Arc::new(
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap(),
            ),
        }
    }

    /// An object read in blocks gives its bytes in order; one that vanishes midway fails
    /// the read, naming the object, rather than ending it short.
    #[test]
    fn an_object_is_read_in_order_and_one_that_vanishes_is_named() {
        let store = Arc::new(InMemory::new());
        let bytes: Vec<u8> = (0..(BLOCK_BYTES as usize * 2 + 1234))
            .map(|i| (i * 7) as u8)
            .collect();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let key = object_store::path::Path::from("corpus/a.jsonl");
        runtime
            .block_on(store.put(&key, PutPayload::from(bytes.clone())))
            .unwrap();
        let object = remote(Arc::clone(&store), "corpus/a.jsonl", bytes.len() as u64);
        let mut all = Vec::new();
        object.reader(0).read_to_end(&mut all).unwrap();
        assert_eq!(all, bytes);
        assert_eq!(object.get(10, 5).unwrap().as_ref(), &bytes[10..15]);

        let mut reader = object.reader(0);
        let mut first = vec![0u8; 1000];
        reader.read_exact(&mut first).unwrap();
        runtime.block_on(store.delete(&key)).unwrap();
        let mut rest = Vec::new();
        let e = reader.read_to_end(&mut rest).unwrap_err();
        assert!(e.to_string().contains("memory:///corpus/a.jsonl"), "{e}");
        assert!(e.to_string().contains("no such object"), "{e}");
    }

    #[test]
    fn urls_and_paths_are_told_apart() {
        assert!(is_url(Path::new("s3://bucket/key.jsonl")));
        assert!(is_url(Path::new("https://host/x.parquet")));
        assert!(!is_url(Path::new("/data/x.jsonl")));
        assert!(!is_url(Path::new("relative/x.jsonl")));
        assert!(!is_url(Path::new("://nothing")));
    }
}
