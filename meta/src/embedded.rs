//! The embedded metadata store: one JSON file in a directory, replaced atomically (temporary
//! file, fsync, rename, fsync of the directory) under an exclusive file lock, so that every
//! process on the host that opens the same directory sees one history. Revisions come from a
//! counter kept in the same file: they only grow, across keys and restarts.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Call, Error, MetaStore, Revision};

/// The file holding everything.
const STATE_FILE: &str = "metadata.json";
const LOCK_FILE: &str = "metadata.lock";

/// The store on one host, in a directory.
#[derive(Clone, Debug)]
pub struct EmbeddedStore {
    dir: PathBuf,
    /// Run each call on the calling task instead of a blocking thread: for a simulation on
    /// one thread with a paused clock, where a call must not let time jump meanwhile.
    inline: bool,
}

#[derive(Default, Serialize, Deserialize)]
struct State {
    /// The last revision given to any write.
    revision: u64,
    keys: BTreeMap<String, Entry>,
}

#[derive(Serialize, Deserialize)]
struct Entry {
    revision: u64,
    value: String,
}

impl EmbeddedStore {
    /// The store in `dir` (created if missing).
    pub fn open(dir: impl AsRef<Path>) -> Result<EmbeddedStore, Error> {
        let dir = dir.as_ref().to_path_buf();
        fs::create_dir_all(&dir).map_err(|e| Error::Unavailable {
            store: dir.display().to_string(),
            reason: format!("cannot create the directory: {e}"),
        })?;
        Ok(EmbeddedStore { dir, inline: false })
    }

    /// This store, its calls run on the calling task (see the field's documentation).
    pub fn inline(mut self) -> EmbeddedStore {
        self.inline = true;
        self
    }

    /// Runs `change` on the state under the lock; writes the state back if it returns
    /// `Ok((true, _))`.
    fn locked<T: Send + 'static>(
        &self,
        change: impl FnOnce(&mut State, &str) -> Result<(bool, T), Error> + Send + 'static,
    ) -> Call<'_, T> {
        let dir = self.dir.clone();
        let run = move || locked_blocking(&dir, change);
        if self.inline {
            Box::pin(async move { run() })
        } else {
            Box::pin(async move {
                tokio::task::spawn_blocking(run)
                    .await
                    .map_err(|e| Error::Unavailable {
                        store: String::new(),
                        reason: format!("the metadata call failed: {e}"),
                    })?
            })
        }
    }
}

fn locked_blocking<T>(
    dir: &Path,
    change: impl FnOnce(&mut State, &str) -> Result<(bool, T), Error>,
) -> Result<T, Error> {
    let name = dir.display().to_string();
    let io = |what: &str, e: std::io::Error| Error::Unavailable {
        store: name.clone(),
        reason: format!("{what}: {e}"),
    };
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(LOCK_FILE))
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound if !dir.exists() => Error::Unavailable {
                store: name.clone(),
                reason: "its directory is gone (removed since the store was opened)".into(),
            },
            _ => io("cannot open the lock file", e),
        })?;
    lock.lock().map_err(|e| io("cannot lock", e))?;
    let path = dir.join(STATE_FILE);
    let mut state = match fs::read(&path) {
        Ok(bytes) => serde_json::from_slice::<State>(&bytes).map_err(|e| Error::Corrupt {
            store: name.clone(),
            reason: format!("{}: {e}", path.display()),
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => State::default(),
        Err(e) => return Err(io("cannot read the state", e)),
    };
    let (write, out) = change(&mut state, &name)?;
    if write {
        let bytes = serde_json::to_vec_pretty(&state).map_err(|e| Error::Corrupt {
            store: name.clone(),
            reason: format!("cannot encode the state: {e}"),
        })?;
        let temporary = dir.join(format!("{STATE_FILE}.tmp"));
        let mut file = File::create(&temporary).map_err(|e| io("cannot write the state", e))?;
        file.write_all(&bytes)
            .and_then(|()| file.sync_all())
            .map_err(|e| io("cannot write the state", e))?;
        fs::rename(&temporary, &path).map_err(|e| io("cannot replace the state", e))?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io("cannot sync the directory", e))?;
    }
    drop(lock);
    Ok(out)
}

impl MetaStore for EmbeddedStore {
    fn describe(&self) -> String {
        self.dir.display().to_string()
    }

    fn get(&self, key: &str) -> Call<'_, Option<(String, Revision)>> {
        let key = key.to_string();
        self.locked(move |state, _| {
            Ok((
                false,
                state
                    .keys
                    .get(&key)
                    .map(|entry| (entry.value.clone(), entry.revision)),
            ))
        })
    }

    fn put_if(&self, key: &str, expected: Option<Revision>, value: &str) -> Call<'_, Revision> {
        let (key, value) = (key.to_string(), value.to_string());
        self.locked(move |state, name| {
            let found = state.keys.get(&key).map(|e| e.revision);
            if found != expected {
                return Err(Error::Conflict {
                    store: name.to_string(),
                    key,
                    expected,
                    found,
                });
            }
            state.revision += 1;
            let revision = state.revision;
            state.keys.insert(key, Entry { revision, value });
            Ok((true, revision))
        })
    }
}
