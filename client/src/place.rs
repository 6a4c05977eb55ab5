//! A one-hop gather's columns, filled as its parts arrive: each part's reader places its
//! shard's records straight into the batch, on the thread that received them (while they
//! are still in that core's cache, and while the other parts still arrive), rather than the
//! gathering thread copying the whole batch once the last part is in.
//!
//! Where a record goes depends on every part's lengths, so nothing is placed until every
//! part's head is in: the last head to arrive lays out the columns ([`Layout`]), and from
//! then on each reader places what it has received and what it receives. What a reader
//! still holds when it ends is placed by the gathering task ([`Batch::finish`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use zr_common::Contiguous;
use zr_proto::assemble::{Layout, Misfit, PartHead, Placer};

use crate::error::Failure;

/// One gather's columns, shared by its parts' readers.
pub(crate) struct Batch {
    records: usize,
    /// Each part's positions in the batch, by part.
    positions: Vec<Vec<u32>>,
    /// The lengths each part's head announced (`lengths[f][k]`), by part, as they arrive.
    heads: Vec<OnceLock<Vec<Vec<u32>>>>,
    /// Heads arrived so far: the last one in lays out the columns.
    arrived: AtomicUsize,
    /// Laid out once every head is in (or why the parts do not fit).
    laid: OnceLock<Result<Columns, Misfit>>,
}

/// The columns being filled: their layout and their buffers.
struct Columns {
    layout: Layout,
    data: Vec<Column>,
}

/// One column's buffer, written by several readers at once, each in its own records'
/// slots, through `base`.
struct Column {
    /// Capacity for the column's bytes; its length is set once every byte is written.
    buffer: Vec<u8>,
    /// `buffer`'s memory.
    base: *mut u8,
}

// SAFETY: a `Column` is written only through `Columns::write`, into the slot of a record of
// the writer's own part; the layout's slots are disjoint (each position is one part's, once),
// and each part has one writer at a time (its reader, then the gathering task after the
// reader has ended). The buffer is read only after every writer has ended (`Batch::finish`,
// which owns the batch by then).
unsafe impl Send for Column {}
// SAFETY: as for `Send`: shared references only ever write disjoint ranges.
unsafe impl Sync for Column {}

impl Columns {
    /// Writes `piece` at byte `at` of column `field`; false if it does not fit there
    /// (which a layout's placer never asks).
    fn write(&self, field: usize, at: usize, piece: &[u8]) -> bool {
        let Some(column) = self.data.get(field) else {
            return false;
        };
        let fits = at
            .checked_add(piece.len())
            .is_some_and(|end| end <= self.layout.column_len(field));
        if fits {
            // SAFETY: `at..at + piece.len()` lies within the column's capacity (checked just
            // above; the capacity is at least `column_len`), inside the slot of a record of
            // the caller's part, which no other writer touches (see `Column`).
            unsafe {
                std::ptr::copy_nonoverlapping(piece.as_ptr(), column.base.add(at), piece.len())
            };
        }
        fits
    }
}

impl Batch {
    /// A batch of `records` records in parts whose records go to `positions` (by part).
    pub(crate) fn new(records: usize, positions: Vec<Vec<u32>>) -> Arc<Batch> {
        Arc::new(Batch {
            records,
            heads: positions.iter().map(|_| OnceLock::new()).collect(),
            arrived: AtomicUsize::new(0),
            positions,
            laid: OnceLock::new(),
        })
    }

    /// A reader of part `part`, which places it into this batch.
    pub(crate) fn placing(self: &Arc<Self>, part: usize) -> Placing {
        Placing {
            batch: Arc::clone(self),
            part,
            head: 0,
            pending: Vec::new(),
            placer: Placer::default(),
            overran: false,
            ended: None,
        }
    }

    /// Part `part`'s head announced `lengths`: the last head in lays out the columns. False
    /// if `part` is not one of this batch's, or its head came before.
    fn head(&self, part: usize, lengths: Vec<Vec<u32>>) -> bool {
        let Some(Ok(())) = self.heads.get(part).map(|head| head.set(lengths)) else {
            return false;
        };
        // AcqRel: the last head in sees every other part's lengths, set before their count.
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 < self.heads.len() {
            return true;
        }
        let Some(heads) = self
            .heads
            .iter()
            .map(OnceLock::get)
            .collect::<Option<Vec<_>>>()
        else {
            return true; // unreachable: the count covers only heads set
        };
        // Each body as long as its head implies: the reader checks what arrives against it.
        let parts: Vec<PartHead> = heads
            .into_iter()
            .zip(&self.positions)
            .map(|(lengths, positions)| PartHead {
                positions,
                lengths,
                body_len: lengths.iter().flatten().map(|&l| l as u64).sum(),
            })
            .collect();
        let laid = Layout::new(self.records, 0, &parts).and_then(|layout| {
            // Reserved as the heads announce, before the bytes arrive: a size the process
            // cannot hold fails the gather rather than the process.
            let data = (0..layout.fields())
                .map(|f| {
                    let mut buffer = Vec::new();
                    buffer
                        .try_reserve_exact(layout.column_len(f))
                        .map_err(|_| {
                            let bytes = (0..layout.fields()).map(|f| layout.column_len(f) as u64);
                            Misfit::TooLarge { bytes: bytes.sum() }
                        })?;
                    let base = buffer.as_mut_ptr();
                    Ok(Column { buffer, base })
                })
                .collect::<Result<_, Misfit>>()?;
            Ok(Columns { layout, data })
        });
        let _ = self.laid.set(laid);
        true
    }

    /// The batch's columns, once every part's reader has ended and returned its `placings`
    /// (by part): what they still hold is placed here. A part that failed fails the batch.
    pub(crate) fn finish(
        self: Arc<Self>,
        placings: Vec<Placing>,
    ) -> Result<Result<Vec<Contiguous>, Misfit>, Failure> {
        let by_part = placings.iter().enumerate().all(|(k, p)| p.part == k);
        if placings.len() != self.positions.len() || !by_part {
            return Err(Failure::Inconsistent(format!(
                "a gather of {} parts finished with {} readers",
                self.positions.len(),
                placings.len()
            )));
        }
        for placing in &placings {
            match &placing.ended {
                Some(Ok(())) => {}
                Some(Err(failure)) => return Err(failure.clone()),
                None => {
                    return Err(Failure::Inconsistent(format!(
                        "part {} of a gather stopped before the end of its reply",
                        placing.part
                    )))
                }
            }
        }
        match self.laid.get() {
            Some(Ok(_)) => {}
            Some(Err(misfit)) => return Ok(Err(misfit.clone())),
            None => return Ok(Err(Misfit::Short)),
        }
        for mut placing in placings {
            placing.flush();
            if !placing.complete() {
                return Ok(Err(Misfit::Short));
            }
        }
        let batch = Arc::into_inner(self).ok_or_else(|| {
            Failure::Inconsistent("a gather's reader still holds its batch".into())
        })?;
        let Some(Ok(columns)) = batch.laid.into_inner() else {
            return Ok(Err(Misfit::Short)); // unreachable: laid out, as checked above
        };
        let data = columns
            .data
            .into_iter()
            .enumerate()
            .map(|(f, column)| {
                let mut buffer = column.buffer;
                // SAFETY: every part's body was placed whole (`complete`), each byte into its
                // record's slot; the layout's slots tile the column (each position is one
                // part's, exactly once): every byte of `0..column_len` was written. Every
                // writer has ended: the batch is this function's alone.
                unsafe { buffer.set_len(columns.layout.column_len(f)) };
                buffer
            })
            .collect();
        Ok(Ok(columns.layout.columns(data)))
    }
}

/// One part's reader's share of a [`Batch`]: what its reply's head said, what it received
/// before the columns were laid out, and how far it has placed its body.
pub(crate) struct Placing {
    batch: Arc<Batch>,
    part: usize,
    /// Bytes of the head still to pass over before the body.
    head: u64,
    /// Received, not placed yet.
    pending: Vec<Bytes>,
    placer: Placer,
    /// Bytes arrived past the body (or a second head).
    overran: bool,
    /// How the reader ended.
    ended: Option<Result<(), Failure>>,
}

impl Placing {
    /// The reply's head said `lengths` in a message of `message_len` bytes; `chunks` are its
    /// first pieces, head and all.
    pub(crate) fn head(&mut self, chunks: Vec<Bytes>, lengths: Vec<Vec<u32>>, message_len: u64) {
        let body: u64 = lengths.iter().flatten().map(|&l| l as u64).sum();
        self.head = message_len.saturating_sub(body);
        self.overran |= !self.batch.head(self.part, lengths);
        self.received(chunks);
    }

    /// The next pieces of the reply: placed at once if the columns are laid out.
    pub(crate) fn received(&mut self, chunks: Vec<Bytes>) {
        self.pending.extend(chunks);
        self.flush();
    }

    /// The reader ended, with its reply whole or not.
    pub(crate) fn ended(&mut self, ended: Result<(), Failure>) {
        self.ended = Some(ended);
    }

    /// The part this reads.
    #[cfg(test)]
    pub(crate) fn part(&self) -> usize {
        self.part
    }

    /// Why the reader failed, if it did.
    pub(crate) fn failure(&self) -> Option<Failure> {
        self.ended.as_ref()?.as_ref().err().cloned()
    }

    /// Places what is pending, if the columns are laid out.
    fn flush(&mut self) {
        let Some(Ok(columns)) = self.batch.laid.get() else {
            return;
        };
        let (Some(positions), Some(Some(lengths))) = (
            self.batch.positions.get(self.part),
            self.batch.heads.get(self.part).map(OnceLock::get),
        ) else {
            self.overran = true;
            return;
        };
        let mut fits = true;
        for chunk in self.pending.drain(..) {
            let from = self.head.min(chunk.len() as u64);
            self.head -= from;
            let mut put = |f: usize, at: usize, piece: &[u8]| fits &= columns.write(f, at, piece);
            let body = &chunk[from as usize..];
            fits &= self
                .placer
                .place(&columns.layout, positions, lengths, body, &mut put);
        }
        self.overran |= !fits;
    }

    /// Whether the whole body is placed, and nothing past it arrived.
    fn complete(&mut self) -> bool {
        let lengths = self.batch.heads.get(self.part).and_then(OnceLock::get);
        let lengths = lengths.map_or(&[][..], Vec::as_slice);
        self.pending.is_empty() && !self.overran && self.placer.done(lengths)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A part's reply: a 5-byte head, then `records[f][k]` for each field in turn.
    fn reply(records: &[Vec<&[u8]>]) -> (Vec<u8>, Vec<Vec<u32>>) {
        let mut message = b"head!".to_vec();
        for field in records {
            for record in field {
                message.extend_from_slice(record);
            }
        }
        let lengths = records
            .iter()
            .map(|field| field.iter().map(|r| r.len() as u32).collect())
            .collect();
        (message, lengths)
    }

    /// `message` cut into pieces of `size` bytes.
    fn pieces(message: &[u8], size: usize) -> Vec<Bytes> {
        message.chunks(size).map(Bytes::copy_from_slice).collect()
    }

    #[test]
    fn parts_placed_as_they_arrive_make_the_batch_in_position_order() {
        // Part 0 holds positions 2 and 0, part 1 positions 1 and 3; two fields each.
        let (first, first_lengths) = reply(&[vec![b"cc", b""], vec![b"C", b"AAA"]]);
        let (second, second_lengths) = reply(&[vec![b"b", b"dddd"], vec![b"", b"DD"]]);
        for size in [1, 3, 7, 64] {
            let batch = Batch::new(4, vec![vec![2, 0], vec![1, 3]]);
            let (mut zero, mut one) = (batch.placing(0), batch.placing(1));
            let mut arriving = pieces(&first, size).into_iter();
            // Part 0 receives before part 1's head is in: held until the layout is known.
            let head = arriving.by_ref().take(1).collect();
            zero.head(head, first_lengths.clone(), first.len() as u64);
            zero.received(arriving.collect());
            zero.ended(Ok(()));
            let mut arriving = pieces(&second, size).into_iter();
            let head = arriving.by_ref().take(1).collect();
            one.head(head, second_lengths.clone(), second.len() as u64);
            // Placed as received from here on.
            for piece in arriving {
                one.received(vec![piece]);
            }
            one.ended(Ok(()));
            let columns = batch.finish(vec![zero, one]).unwrap().unwrap();
            assert_eq!(columns[0].data, b"bccdddd", "pieces of {size}");
            assert_eq!(columns[0].offsets, [0, 0, 1, 3, 7]);
            assert_eq!(columns[1].data, b"AAACDD", "pieces of {size}");
            assert_eq!(columns[1].offsets, [0, 3, 3, 4, 6]);
        }
    }

    #[test]
    fn short_long_or_failed_parts_fail_the_batch() {
        let (message, lengths) = reply(&[vec![b"abc", b"de"]]);
        let run = |cut: &[u8], ended: Result<(), Failure>| {
            let batch = Batch::new(2, vec![vec![1, 0]]);
            let mut part = batch.placing(0);
            part.head(pieces(cut, 4), lengths.clone(), message.len() as u64);
            part.ended(ended);
            batch.finish(vec![part])
        };
        assert!(run(&message, Ok(())).unwrap().is_ok());
        let short = &message[..message.len() - 1];
        assert!(matches!(run(short, Ok(())), Ok(Err(Misfit::Short))));
        let long = [&message[..], b"x"].concat();
        assert!(matches!(run(&long, Ok(())), Ok(Err(Misfit::Short))));
        let failed = run(&message, Err(Failure::BadRequest("gone".into())));
        assert!(matches!(failed, Err(Failure::BadRequest(_))));
    }

    #[test]
    fn a_batch_too_large_to_hold_fails_the_gather_not_the_process() {
        // A part announcing 2^20 records of 4 GiB - 1 each: 4 PiB, more than a process
        // can map (128 TiB with 4-level page tables).
        let records = 1 << 20;
        let lengths = vec![vec![u32::MAX; records]];
        let positions: Vec<u32> = (0..records as u32).collect();
        let batch = Batch::new(records, vec![positions]);
        let mut part = batch.placing(0);
        let body: u64 = u32::MAX as u64 * records as u64;
        part.head(pieces(b"head!", 64), lengths, 5 + body);
        part.ended(Ok(()));
        assert!(matches!(
            batch.finish(vec![part]),
            Ok(Err(Misfit::TooLarge { .. }))
        ));
    }

    /// A batch of two parts, one record each at `positions`, both read whole.
    fn two_read(positions: [u32; 2]) -> (Arc<Batch>, Placing, Placing) {
        let (message, lengths) = reply(&[vec![b"a"]]);
        let batch = Batch::new(2, positions.map(|p| vec![p]).to_vec());
        let (mut zero, mut one) = (batch.placing(0), batch.placing(1));
        for part in [&mut zero, &mut one] {
            part.head(pieces(&message, 64), lengths.clone(), message.len() as u64);
            part.ended(Ok(()));
        }
        (batch, zero, one)
    }

    #[test]
    fn a_batch_finished_without_every_part_is_refused() {
        let (batch, _zero, one) = two_read([0, 1]);
        // Part 1's reader handed back in part 0's place, and part 0's missing.
        assert!(matches!(
            Arc::clone(&batch).finish(vec![one]),
            Err(Failure::Inconsistent(_))
        ));
    }

    #[test]
    fn parts_that_do_not_fit_are_refused() {
        // Both parts claim position 0.
        let (batch, zero, one) = two_read([0, 0]);
        assert!(matches!(
            batch.finish(vec![zero, one]),
            Ok(Err(Misfit::Twice(0)))
        ));
    }
}
