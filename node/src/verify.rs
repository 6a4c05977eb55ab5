//! Offline checks: `verify` (every entry's bounds and every frame's CRC, reported record by
//! record, never "fixed") and `utilization` (how much of the chunks the live records use).

use crate::batch::Span;
use crate::error::Result;
use crate::frame::{frame_start, FRAME_HEADER_BYTES};
use crate::meta::Meta;
use crate::store::Store;
use crate::unit::address;

/// Records checked per step (and per progress report).
const STEP_RECORDS: u64 = 4096;

/// One bad record found by [`Store::verify`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Field name.
    pub field: String,
    /// Record index.
    pub index: u64,
    /// What is wrong.
    pub reason: String,
}

/// What [`Store::verify`] found.
#[derive(Clone, Debug, Default)]
pub struct VerifyReport {
    /// Records checked (each in every field).
    pub records: u64,
    /// Payload bytes checked.
    pub bytes: u64,
    /// Every bad record, in index order per field.
    pub problems: Vec<Problem>,
}

/// How full the chunks are. See [`Store::utilization`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Utilization {
    /// Bytes the live records occupy when written afresh (headers and alignment included).
    pub live_bytes: u64,
    /// Bytes the chunks hold.
    pub allocated_bytes: u64,
}

impl Utilization {
    /// `live / allocated` (1 for an empty dataset).
    pub fn ratio(&self) -> f64 {
        if self.allocated_bytes == 0 {
            1.0
        } else {
            self.live_bytes as f64 / self.allocated_bytes as f64
        }
    }
}

impl Store {
    /// Checks every record of every field: entry bounds, frame header, CRC32. Reports each
    /// bad record; changes nothing. `progress` is called with the records checked so far.
    pub fn verify(&self, mut progress: impl FnMut(u64)) -> Result<VerifyReport> {
        let fields = self.fields().len();
        let mut report = VerifyReport::default();
        // Records of every unit, one after the other: (unit, first, last) steps.
        let steps: Vec<(u32, u64, u64)> = self
            .units()
            .into_iter()
            .flat_map(|(unit, len)| {
                (0..len)
                    .step_by(STEP_RECORDS as usize)
                    .map(move |first| (unit, first, (first + STEP_RECORDS).min(len)))
            })
            .collect();
        for (unit, first, last) in steps {
            let view = self.inner.read_view();
            let maps = std::sync::Arc::clone(&view.maps);
            for field in 0..fields {
                for index in first..last.min(view.len_of(unit)) {
                    let index = address(unit, index);
                    let mut span = [Span::default()];
                    let checked = self
                        .resolve_one(&view, field, index, &mut span)
                        .and_then(
                            |()| match self.frame_header(&maps, field, index, &span[0])? {
                                Some(header) => {
                                    self.check_crc(&maps, field, index, &span[0], header)
                                }
                                None => Ok(()),
                            },
                        );
                    match checked {
                        Ok(()) => report.bytes += span[0].len as u64,
                        Err(crate::Error::BadRecord {
                            field,
                            index,
                            reason,
                        }) => report.problems.push(Problem {
                            field,
                            index,
                            reason,
                        }),
                        Err(other) => return Err(other),
                    }
                }
            }
            drop(view);
            report.records += last - first;
            progress(report.records);
        }
        Ok(report)
    }

    /// The CRC32 each field of record `index` carries in its frame (0 for an absent value),
    /// after checking the payload still matches it: what a record held, in 4 bytes a field,
    /// for comparing against what a past read found ([`Self::verify`]'s check, one record).
    pub fn record_crcs(&self, index: u64) -> Result<Vec<u32>> {
        let view = self.inner.read_view();
        let maps = std::sync::Arc::clone(&view.maps);
        (0..self.fields().len())
            .map(|field| {
                let mut span = [Span::default()];
                self.resolve_one(&view, field, index, &mut span)?;
                match self.frame_header(&maps, field, index, &span[0])? {
                    Some(header) => {
                        self.check_crc(&maps, field, index, &span[0], header)?;
                        Ok(header.crc)
                    }
                    None => Ok(0),
                }
            })
            .collect()
    }

    /// Live bytes (the records as a fresh rewrite in index order would lay them out) against
    /// the bytes the chunks hold.
    pub fn utilization(&self) -> Result<Utilization> {
        let meta = Meta::load(self.dir())?;
        let allocated_bytes = meta.chunks.iter().map(|c| c.bytes).sum();
        let fields = self.fields().len();
        let units = self.units();
        let view = self.inner.read_view();
        let mut live_bytes = 0u64;
        for (unit, len) in units {
            let (mut chunk_end, mut records_in_chunk) = (0u64, 0u32);
            for index in 0..len.min(view.len_of(unit)) {
                for field in 0..fields {
                    let len = view.entry(field, address(unit, index)).map_or(0, |e| e.len);
                    if len > 0 {
                        chunk_end =
                            frame_start(chunk_end, len as usize) + FRAME_HEADER_BYTES + len as u64;
                    }
                }
                records_in_chunk += 1;
                if records_in_chunk == meta.chunk_records {
                    live_bytes += chunk_end;
                    (chunk_end, records_in_chunk) = (0, 0);
                }
            }
            live_bytes += chunk_end;
        }
        Ok(Utilization {
            live_bytes,
            allocated_bytes,
        })
    }
}
