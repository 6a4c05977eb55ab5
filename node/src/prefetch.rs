//! Prefetching for callers who read records zero-copy: [`Store::prefetched`] gathers the
//! batches a caller will ask for next on a thread of its own, touching every page of their
//! payloads, and hands over the zero-copy [`Batch`]es in order; by the time the caller
//! reaches one, its pages are in memory. (The loader of `zr_common` prefetches too, but into
//! columns it copies the records into.) Also a range read: [`Store::gather_range`].

use std::ops::Range;
use std::sync::mpsc::{sync_channel, Receiver};

use crate::batch::Batch;
use crate::error::Result;
use crate::store::Store;

/// Zero-copy batches gathered ahead of the caller (see [`Store::prefetched`]).
pub struct Prefetched {
    batches: Receiver<Result<Batch>>,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl Iterator for Prefetched {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        self.batches.recv().ok()
    }
}

impl Drop for Prefetched {
    fn drop(&mut self) {
        // Closing the channel stops the worker at its next send.
        let (_, closed) = sync_channel(0);
        drop(std::mem::replace(&mut self.batches, closed));
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

impl Store {
    /// Records `range` (consecutive indices) of `fields` (empty = all): a sequential read in
    /// one call.
    pub fn gather_range(&self, range: Range<u64>, fields: &[&str]) -> Result<Batch> {
        let indices: Vec<u64> = range.collect();
        self.gather(&indices, fields)
    }

    /// The batches of `batches` (lists of indices) of `fields` (empty = all), each gathered
    /// zero-copy on a thread of this iterator's own up to `ahead` batches before the caller
    /// takes it, with every page of its payloads touched (so read into memory). In order; an
    /// error ends nothing, it is the item of its batch. Dropping the iterator stops the
    /// thread.
    pub fn prefetched(
        &self,
        batches: impl Iterator<Item = Vec<u64>> + Send + 'static,
        fields: Vec<String>,
        ahead: usize,
    ) -> Prefetched {
        let (send, receive) = sync_channel(ahead);
        let store = self.clone();
        let worker = std::thread::Builder::new()
            .name("zr-prefetch".into())
            .spawn(move || {
                let names: Vec<&str> = fields.iter().map(String::as_str).collect();
                for indices in batches {
                    let batch = store.gather(&indices, &names);
                    if let Ok(batch) = &batch {
                        for field in batch.fields() {
                            field.iter().for_each(touch_pages);
                        }
                    }
                    if send.send(batch).is_err() {
                        return;
                    }
                }
            })
            .ok();
        Prefetched {
            batches: receive,
            worker,
        }
    }
}

/// Reads one byte of every 4 KiB page of `payload` (and its last byte).
pub fn touch_pages(payload: &[u8]) {
    const PAGE: usize = 4096;
    for byte in payload.iter().step_by(PAGE).chain(payload.last()) {
        std::hint::black_box(*byte);
    }
}

#[cfg(test)]
mod tests {
    use crate::meta::FieldSpec;
    use crate::store::{CreateOptions, Store};
    use zr_common::Record;

    #[test]
    fn prefetched_batches_and_ranges_equal_plain_gathers() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::create(
            dir.path().join("ds"),
            vec![FieldSpec::raw("a"), FieldSpec::flate("b")],
            CreateOptions::default(),
        )
        .unwrap();
        let payloads: Vec<Vec<u8>> = (0..500u32)
            .map(|i| i.to_le_bytes().repeat(1 + (i % 2000) as usize))
            .collect();
        let records: Vec<Record> = payloads
            .iter()
            .map(|p| Record::new().with("a", p).with("b", &p[..4]))
            .collect();
        store.append_many(&records).unwrap();
        let batches: Vec<Vec<u64>> = (0..20u64)
            .map(|k| (0..25).map(|j| (k * 37 + j * 11) % 500).collect())
            .collect();
        let got: Vec<_> = store
            .prefetched(batches.clone().into_iter(), Vec::new(), 3)
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(got.len(), batches.len());
        for (batch, indices) in got.iter().zip(&batches) {
            let a = batch.field("a").unwrap();
            for (k, &i) in indices.iter().enumerate() {
                assert_eq!(a.get(k).unwrap(), &payloads[i as usize][..]);
            }
        }
        // Dropped early: the thread stops.
        let mut some = store.prefetched(batches.into_iter().cycle(), vec!["a".into()], 2);
        assert!(some.next().unwrap().is_ok());
        drop(some);
        // An error is its batch's item.
        let mut bad = store.prefetched(vec![vec![0], vec![500]].into_iter(), Vec::new(), 1);
        assert!(bad.next().unwrap().is_ok());
        assert!(bad.next().unwrap().is_err());
        assert!(bad.next().is_none());
        let range = store.gather_range(490..500, &["a"]).unwrap();
        let a = range.field("a").unwrap();
        for k in 0..10 {
            assert_eq!(a.get(k).unwrap(), &payloads[490 + k][..]);
        }
    }
}
