//! The loader: sampler → gather → batch, prepared ahead of the training loop on background
//! threads, handed out strictly in sampler order, resumable exactly.
//!
//! Worker `w` of `W` prepares batches `w, w+W, w+2W, …` of the run and sends each into its
//! own bounded channel; the consumer takes from channel `seq % W`, so order needs no
//! reordering and the queue bound is the channels' capacity. [`Loader::state`] counts only
//! batches handed to the caller, so a loader rebuilt from it yields exactly the batches the
//! caller had not yet received, whatever was prefetched. Dropping the loader closes the
//! channels and joins the workers (each finishes at most the gather it is in).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::columns::Contiguous;
use crate::error::{BoxError, Error};
use crate::mixture::{Mixture, MixtureState};
use crate::sampler::{Sampler, SamplerState};

mod steps;
pub use steps::{BudgetLoader, LoadedStep, RampLoader};

/// Anything that can gather records into columns: a local store, a cluster client.
pub trait GatherSource: Send + Sync + 'static {
    /// Gathers `indices` for `fields` (empty = all, in schema order) into `columns`, one
    /// column per field. `columns` may arrive holding buffers of an earlier batch: reuse
    /// their memory (fresh buffers would page-fault on every batch).
    fn gather_into(
        &self,
        indices: &[u64],
        fields: &[String],
        columns: &mut Vec<Contiguous>,
    ) -> Result<(), BoxError>;
}

/// Buffers of dropped batches, waiting to be filled again.
struct Pool {
    free: Mutex<Vec<Vec<Contiguous>>>,
    capacity: usize,
}

impl Pool {
    fn take(&self) -> Vec<Contiguous> {
        self.free
            .lock()
            .ok()
            .and_then(|mut free| free.pop())
            .unwrap_or_default()
    }

    fn give(&self, columns: Vec<Contiguous>) {
        if let Ok(mut free) = self.free.lock() {
            if free.len() < self.capacity {
                free.push(columns);
            }
        }
    }
}

/// Loader settings.
#[derive(Clone, Debug)]
pub struct LoaderOptions {
    /// Fields to load (empty = all).
    pub fields: Vec<String>,
    /// Batches prepared ahead of the caller (default 4). With 0, each worker still prepares
    /// the one batch it hands over next.
    pub prefetch: usize,
    /// Background threads gathering batches (default 2).
    pub workers: usize,
    /// Stop when this epoch would begin (`None`: run until dropped). Absolute, so a loader
    /// resumed from a checkpoint stops where the original would have.
    pub end_epoch: Option<u64>,
}

impl Default for LoaderOptions {
    fn default() -> Self {
        LoaderOptions {
            fields: Vec::new(),
            prefetch: 4,
            workers: 2,
            end_epoch: None,
        }
    }
}

/// Upper bound on loader threads: more only adds contention.
pub const LOADER_WORKERS_MAX: usize = 64;

/// One batch as the training loop receives it.
pub struct LoadedBatch {
    /// Epoch it belongs to.
    pub epoch: u64,
    /// Position of its first index in the rank's epoch.
    pub position: u64,
    /// The record indices, in order.
    pub indices: Vec<u64>,
    /// Over a mixture: the dataset each row came from (empty over one dataset).
    pub sources: Vec<u32>,
    /// One column per loaded field, in the order of `LoaderOptions::fields` (or schema order).
    /// Dropping the batch hands these buffers back to the loader for reuse; `mem::take` them
    /// to keep them.
    pub columns: Vec<Contiguous>,
    pool: Option<Arc<Pool>>,
}

impl std::fmt::Debug for LoadedBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedBatch")
            .field("epoch", &self.epoch)
            .field("position", &self.position)
            .field("indices", &self.indices.len())
            .field("columns", &self.columns.len())
            .finish()
    }
}

impl Drop for LoadedBatch {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.give(std::mem::take(&mut self.columns));
        }
    }
}

/// Which batch the loader's `seq`-th batch is.
#[derive(Clone, Debug)]
struct Plan {
    sampler: Arc<Sampler>,
    start: SamplerState,
    end_epoch: Option<u64>,
}

impl Plan {
    /// (epoch, start, end) of batch `seq` counted from the start state; `None` past the end.
    fn batch(&self, seq: u64) -> Option<(u64, u64, u64)> {
        let s = &self.sampler;
        let (items, batch) = (s.items_per_epoch(), s.config().batch);
        let first_epoch_batches = (items - self.start.position).div_ceil(batch);
        let (epoch, start) = if seq < first_epoch_batches {
            (self.start.epoch, self.start.position + seq * batch)
        } else {
            let rest = seq - first_epoch_batches;
            let per_epoch = s.batches_per_epoch();
            (
                self.start.epoch + 1 + rest / per_epoch,
                (rest % per_epoch) * batch,
            )
        };
        if self.end_epoch.is_some_and(|end| epoch >= end) {
            return None;
        }
        Some((epoch, start, (start + batch).min(items)))
    }
}

/// A prefetching, resumable batch iterator. See the module documentation.
pub struct Loader {
    plan: Plan,
    workers: Workers<LoadedBatch, ()>,
}

/// The threads preparing items (batches, steps) ahead, and the channels they hand them over
/// in, each item with the checkpoint after it (`C`; `()` where the count delivered says it).
struct Workers<T, C> {
    receivers: Vec<Receiver<Result<(T, C), Error>>>,
    handles: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    finished: bool,
    /// Items handed to the caller.
    delivered: u64,
    /// The checkpoint after the last item handed to the caller.
    last: Option<C>,
}

impl<T: Send + 'static, C: Send + 'static> Workers<T, C> {
    /// Worker `w` of `W` prepares items `w, w+W, …` with `produce(seq, pool)` (`None`: the
    /// run has no item `seq`) until stopped, an error, or the end.
    fn start<F>(options: &LoaderOptions, produce: F) -> Result<Workers<T, C>, Error>
    where
        F: Fn(u64, &Arc<Pool>) -> Option<Result<(T, C), Error>> + Send + Sync + 'static,
    {
        let workers = options.workers.clamp(1, LOADER_WORKERS_MAX);
        let capacity = options.prefetch.div_ceil(workers);
        let stop = Arc::new(AtomicBool::new(false));
        let pool = Arc::new(Pool {
            free: Mutex::new(Vec::new()),
            capacity: options.prefetch + 2 * workers,
        });
        let produce = Arc::new(produce);
        let mut receivers = Vec::with_capacity(workers);
        let mut handles = Vec::with_capacity(workers);
        for worker in 0..workers {
            let (tx, rx) = sync_channel(capacity);
            receivers.push(rx);
            let (produce, stop, pool) =
                (Arc::clone(&produce), Arc::clone(&stop), Arc::clone(&pool));
            let handle = std::thread::Builder::new()
                .name(format!("zr-loader-{worker}"))
                .spawn(move || {
                    let mut seq = worker as u64;
                    while !stop.load(Ordering::Relaxed) {
                        let Some(result) = produce(seq, &pool) else {
                            break;
                        };
                        let failed = result.is_err();
                        if tx.send(result).is_err() || failed {
                            break; // the loader is gone, or the error ends the run
                        }
                        seq += workers as u64;
                    }
                })
                .map_err(|e| Error::Sampler(format!("cannot start a loader thread: {e}")))?;
            handles.push(handle);
        }
        Ok(Workers {
            receivers,
            handles,
            stop,
            finished: false,
            delivered: 0,
            last: None,
        })
    }

    /// The next item in order, or `None` at the end.
    fn next(&mut self) -> Option<Result<T, Error>> {
        if self.finished {
            return None;
        }
        let channel = &self.receivers[(self.delivered % self.receivers.len() as u64) as usize];
        match channel.recv() {
            Ok(Ok((item, after))) => {
                self.delivered += 1;
                self.last = Some(after);
                Some(Ok(item))
            }
            Ok(Err(e)) => {
                self.finished = true;
                Some(Err(e))
            }
            // The worker stopped: the run's last batch is done.
            Err(_) => {
                self.finished = true;
                None
            }
        }
    }
}

impl<T, C> Drop for Workers<T, C> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Closing the channels wakes workers blocked on a full one.
        self.receivers.clear();
        for worker in self.handles.drain(..) {
            let _ = worker.join();
        }
    }
}

impl Loader {
    /// A loader over `source` starting at `state` (e.g. `sampler.start(0)` or a checkpoint).
    pub fn new<S: GatherSource + ?Sized>(
        source: Arc<S>,
        sampler: Sampler,
        state: SamplerState,
        options: LoaderOptions,
    ) -> Result<Loader, Error> {
        let state = sampler.adopt(&state)?;
        let sampler = Arc::new(sampler);
        let plan = Plan {
            start: sampler.state_at(state.epoch, state.position),
            sampler,
            end_epoch: options.end_epoch,
        };
        let fields: Arc<[String]> = options.fields.clone().into();
        let produce = {
            let plan = plan.clone();
            move |seq: u64, pool: &Arc<Pool>| {
                let (epoch, start, end) = plan.batch(seq)?;
                let mut indices = Vec::new();
                plan.sampler.epoch(epoch).fill(start, end, &mut indices);
                let mut columns = pool.take();
                Some(match source.gather_into(&indices, &fields, &mut columns) {
                    Ok(()) => Ok((
                        LoadedBatch {
                            epoch,
                            position: start,
                            indices,
                            sources: Vec::new(),
                            columns,
                            pool: Some(Arc::clone(pool)),
                        },
                        (),
                    )),
                    Err(source) => Err(Error::Gather {
                        epoch,
                        start,
                        end,
                        source,
                    }),
                })
            }
        };
        let workers = Workers::start(&options, produce)?;
        Ok(Loader { plan, workers })
    }

    /// The checkpoint after the last batch handed to the caller.
    pub fn state(&self) -> SamplerState {
        let delivered = self.workers.delivered;
        if delivered == 0 {
            return self.plan.start;
        }
        match self.plan.batch(delivered - 1) {
            Some((epoch, _, end)) => self.plan.sampler.state_at(epoch, end),
            None => self.plan.start,
        }
    }

    /// The sampler driving the loader.
    pub fn sampler(&self) -> &Sampler {
        &self.plan.sampler
    }
}

impl Iterator for Loader {
    type Item = Result<LoadedBatch, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        self.workers.next()
    }
}

/// A prefetching, resumable iterator over a [`Mixture`]'s global batches (this rank's part
/// of each), each row gathered from its own dataset's source: per batch, every dataset's
/// rows in one gather, put back in batch order. It has no end.
pub struct MixtureLoader {
    mixture: Arc<Mixture>,
    start: u64,
    workers: Workers<LoadedBatch, ()>,
}

impl MixtureLoader {
    /// A loader over `sources` (dataset i's is `sources[i]`), from `state` (a checkpoint,
    /// or `mixture.state_at(0)`), reading `options.fields` (which every source must hold).
    pub fn new(
        sources: Vec<Arc<dyn GatherSource>>,
        mixture: Mixture,
        state: &MixtureState,
        options: LoaderOptions,
    ) -> Result<MixtureLoader, Error> {
        mixture.check_state(state)?;
        check_sources(mixture.config().lengths.len(), &sources)?;
        let mixture = Arc::new(mixture);
        let start = state.batches;
        let fields: Arc<[String]> = options.fields.clone().into();
        let produce = {
            let mixture = Arc::clone(&mixture);
            move |seq: u64, pool: &Arc<Pool>| {
                let batch = start + seq;
                let (mut from, mut records) = (Vec::new(), Vec::new());
                mixture.fill(batch, &mut from, &mut records);
                Some(
                    gather_rows(&sources, &fields, &from, &records, pool.take())
                        .map_err(|(i, source)| Error::Gather {
                            epoch: 0,
                            start: batch,
                            end: batch + 1,
                            source: format!("dataset {i}: {source}").into(),
                        })
                        .map(|columns| {
                            let batch = LoadedBatch {
                                epoch: 0,
                                position: batch,
                                indices: records,
                                sources: from,
                                columns,
                                pool: Some(Arc::clone(pool)),
                            };
                            (batch, ())
                        }),
                )
            }
        };
        let workers = Workers::start(&options, produce)?;
        Ok(MixtureLoader {
            mixture,
            start,
            workers,
        })
    }

    /// The checkpoint after the last batch handed to the caller (the same on every rank).
    pub fn state(&self) -> MixtureState {
        self.mixture.state_at(self.start + self.workers.delivered)
    }
}

impl Iterator for MixtureLoader {
    type Item = Result<LoadedBatch, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        self.workers.next()
    }
}

/// Refuses a loader given another number of sources than its order reads datasets.
fn check_sources(datasets: usize, sources: &[Arc<dyn GatherSource>]) -> Result<(), Error> {
    if sources.len() != datasets {
        return Err(Error::Sampler(format!(
            "the order reads {datasets} datasets and the loader was given {} sources",
            sources.len()
        )));
    }
    Ok(())
}

/// Rows `(from[k], records[k])` — dataset and record — gathered into `buffers`, per field in
/// row order: each dataset's rows in one gather first. A failed gather names its dataset.
fn gather_rows(
    sources: &[Arc<dyn GatherSource>],
    fields: &[String],
    from: &[u32],
    records: &[u64],
    mut buffers: Vec<Contiguous>,
) -> Result<Vec<Contiguous>, (usize, BoxError)> {
    if sources.len() == 1 {
        sources[0]
            .gather_into(records, fields, &mut buffers)
            .map_err(|e| (0, e))?;
        return Ok(buffers);
    }
    // Per dataset: its rows' places in the batch and their records.
    let mut rows: Vec<(Vec<usize>, Vec<u64>)> = vec![(Vec::new(), Vec::new()); sources.len()];
    for (place, (&i, &record)) in from.iter().zip(records).enumerate() {
        rows[i as usize].0.push(place);
        rows[i as usize].1.push(record);
    }
    let mut parts: Vec<(usize, Vec<Contiguous>)> = Vec::new();
    for (i, (_, indices)) in rows.iter().enumerate() {
        if indices.is_empty() {
            continue;
        }
        let mut columns = Vec::new();
        sources[i]
            .gather_into(indices, fields, &mut columns)
            .map_err(|e| (i, e))?;
        parts.push((i, columns));
    }
    let count = from.len();
    let width = parts.first().map_or(fields.len(), |(_, c)| c.len());
    buffers.resize_with(width, Contiguous::default);
    for (f, out) in buffers.iter_mut().enumerate() {
        // Row lengths in batch order, then the rows.
        let mut lengths = vec![0u64; count];
        for (i, columns) in &parts {
            let column = &columns[f];
            for (k, &place) in rows[*i].0.iter().enumerate() {
                lengths[place] = column.offsets[k + 1] - column.offsets[k];
            }
        }
        out.offsets.clear();
        out.offsets.reserve(count + 1);
        out.offsets.push(0);
        let mut total = 0;
        for &len in &lengths {
            total += len;
            out.offsets.push(total);
        }
        out.data.clear();
        out.data.resize(total as usize, 0);
        for (i, columns) in &parts {
            let column = &columns[f];
            for (k, &place) in rows[*i].0.iter().enumerate() {
                let (from, to) = (column.offsets[k] as usize, column.offsets[k + 1] as usize);
                let at = out.offsets[place] as usize;
                out.data[at..at + (to - from)].copy_from_slice(&column.data[from..to]);
            }
        }
    }
    Ok(buffers)
}
