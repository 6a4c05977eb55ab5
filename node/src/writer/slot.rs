//! One writer slot: encodes records into frames (deflating flate fields), writes them to its
//! open chunk with `pwrite`, grows, seals and syncs chunks.

use std::path::PathBuf;

use flate2::{Compress, FlushCompress, Status};

use super::{publish, set_chunk_map, Handle, OpenChunk, Shared, Slot, Writers};

use crate::error::{Error, IoContext, Result};
use crate::frame::encode_frame;
use crate::map::Mapped;
use crate::meta::{ChunkMeta, Compression, FieldSpec};
use crate::offset::Entry;
use crate::unit::{chunk_unit, first_chunk};
use crate::view::{chunk_path, Core};

/// Bytes a chunk of a unit other than 0 starts with (see `open_new_chunk`).
const UNIT_CHUNK_START_BYTES: u64 = 64 << 10;

impl Slot {
    /// Starts a new chunk of unit `unit`, after its highest id.
    pub(crate) fn open_new_chunk(
        &mut self,
        inner: &Core,
        writers: &Writers,
        unit: u32,
    ) -> Result<()> {
        let disk = inner.disk();
        let mut shared = writers.shared();
        let first = first_chunk(unit);
        // The unit's chunks end where the next unit's ids begin.
        let after = shared.chunks.partition_point(|c| chunk_unit(c.id) <= unit);
        let id = match after.checked_sub(1).map(|i| shared.chunks[i].id) {
            Some(last) if chunk_unit(last) == unit => {
                let next = last + 1;
                if chunk_unit(next) != unit {
                    return Err(Error::Corrupt {
                        path: shared.dir.clone(),
                        reason: format!("unit {unit} has used all its chunk ids; run rebalance"),
                    });
                }
                next
            }
            _ => first,
        };
        let path = chunk_path(&shared.dir, id);
        let file = disk.create(&path).ctx("create chunk", &path)?;
        // A chunk of a unit other than 0 starts small and doubles up to the growth step (a
        // node holds hundreds of units, most of them small in a small dataset).
        let capacity = match unit {
            0 => shared.meta.chunk_grow_bytes,
            _ => shared.meta.chunk_grow_bytes.min(UNIT_CHUNK_START_BYTES),
        };
        disk.set_len(&file, &path, capacity)
            .ctx("grow chunk", &path)?;
        let map = Mapped::of_unit(&file, &path, unit)?;
        publish(inner, |m| set_chunk_map(m, id, map));
        shared.chunks.insert(
            after,
            ChunkMeta {
                id,
                bytes: 0,
                records: 0,
                sealed: false,
            },
        );
        shared.new_chunk_files = true;
        self.open = Some(OpenChunk {
            id,
            file: Handle::new(path, file, unit),
            pos: 0,
            records: 0,
            capacity,
            dirty: true,
        });
        Ok(())
    }

    /// Makes this writer's unfull chunk of unit `unit` (if it has one) the one it writes,
    /// parking the one it wrote before.
    fn select(&mut self, inner: &Core, unit: u32) -> Result<()> {
        if self.open.as_ref().is_some_and(|o| chunk_unit(o.id) == unit) {
            return Ok(());
        }
        self.flush_frames(inner, inner.chunk_grow_bytes)?;
        if let Some(open) = self.open.take() {
            self.parked.insert(chunk_unit(open.id), open);
        }
        self.open = self.parked.remove(&unit);
        Ok(())
    }

    /// Encodes records into this writer's chunk(s) of unit `unit`; pushes one entry per
    /// field per record.
    pub(crate) fn encode(
        &mut self,
        inner: &Core,
        writers: &Writers,
        unit: u32,
        records: &[Vec<Option<&[u8]>>],
        entries: &mut [Vec<Entry>],
    ) -> Result<()> {
        let fields = &inner.fields;
        let chunk_records = inner.chunk_records;
        let grow = inner.chunk_grow_bytes;
        self.select(inner, unit)?;
        for payloads in records {
            if self.open.is_none() {
                self.open_new_chunk(inner, writers, unit)?;
            }
            self.encode_record(fields, &inner.dicts, payloads, entries)?;
            if self
                .open
                .as_ref()
                .is_some_and(|o| o.records >= chunk_records)
            {
                self.flush_frames(inner, grow)?;
                self.seal(inner, writers)?;
            }
        }
        self.flush_frames(inner, grow)
    }

    /// Forgets this writer's unfull chunk of unit `unit` (the unit is being dropped).
    pub(crate) fn forget_unit(&mut self, unit: u32) {
        if self.open.as_ref().is_some_and(|o| chunk_unit(o.id) == unit) {
            self.frames.clear();
            self.open = None;
        }
        self.parked.remove(&unit);
        self.unsynced
            .retain(|h| chunk_of_path(&h.path).is_none_or(|id| chunk_unit(id) != unit));
    }

    pub(crate) fn encode_record(
        &mut self,
        fields: &[FieldSpec],
        dicts: &[Option<std::sync::Arc<[u8]>>],
        payloads: &[Option<&[u8]>],
        entries: &mut [Vec<Entry>],
    ) -> Result<()> {
        let Some(open) = self.open.as_mut() else {
            return Err(Error::Corrupt {
                path: PathBuf::new(),
                reason: "internal invariant broken: encoding with no open chunk".into(),
            });
        };
        for (field, payload) in payloads.iter().enumerate() {
            let entry = match payload {
                Some(payload) if !payload.is_empty() => {
                    let spec = &fields[field];
                    let stored: &[u8] = match spec.compress {
                        Compression::Raw => payload,
                        Compression::Flate => {
                            let compressor = self.compressor.get_or_insert_with(|| {
                                Compress::new(flate2::Compression::default(), false)
                            });
                            deflate(compressor, payload, &mut self.compressed).map_err(|e| {
                                Error::InvalidRecord(format!("field '{}': {e}", spec.name))
                            })?;
                            &self.compressed
                        }
                        Compression::Zstd => {
                            let level = spec.zstd_level();
                            if self.zstd.len() <= field {
                                self.zstd.resize_with(field + 1, || None);
                            }
                            let compressor = match &mut self.zstd[field] {
                                Some((l, c)) if *l == level => c,
                                slot => {
                                    let dict = dicts.get(field).and_then(Option::as_deref);
                                    let made = match dict {
                                        Some(dict) => {
                                            zstd::bulk::Compressor::with_dictionary(level, dict)
                                        }
                                        None => zstd::bulk::Compressor::new(level),
                                    }
                                    .map_err(|e| {
                                        Error::InvalidRecord(format!(
                                            "field '{}': cannot start zstd at level {level}: {e}",
                                            spec.name
                                        ))
                                    })?;
                                    &mut slot.insert((level, made)).1
                                }
                            };
                            let smaller = crate::codec::zstd_smaller(
                                compressor,
                                payload,
                                &mut self.compressed,
                            )
                            .map_err(|e| {
                                Error::InvalidRecord(format!("field '{}': {e}", spec.name))
                            })?;
                            if smaller {
                                &self.compressed
                            } else {
                                payload
                            }
                        }
                    };
                    let len = u32::try_from(stored.len()).map_err(|_| {
                        Error::InvalidRecord(format!(
                            "field '{}': {} stored bytes exceed the 4 GiB record limit",
                            spec.name,
                            stored.len()
                        ))
                    })?;
                    let offset =
                        encode_frame(&mut self.frames, open.pos, stored, payload.len() as u32);
                    Entry {
                        offset,
                        chunk_id: open.id,
                        len,
                    }
                }
                _ => Entry::ABSENT,
            };
            entries[field].push(entry);
        }
        open.records += 1;
        Ok(())
    }

    /// Writes the frame buffer to the open chunk, growing the file if needed.
    pub(crate) fn flush_frames(&mut self, inner: &Core, grow: u64) -> Result<()> {
        let disk = inner.disk();
        if self.frames.is_empty() {
            return Ok(());
        }
        let Some(open) = self.open.as_mut() else {
            return Err(Error::Corrupt {
                path: PathBuf::new(),
                reason: "internal invariant broken: frames buffered with no open chunk".into(),
            });
        };
        let end = open.pos + self.frames.len() as u64;
        let path = open.file.path.clone();
        if end > open.capacity {
            let capacity =
                end.next_multiple_of(grow.min(open.capacity.max(UNIT_CHUNK_START_BYTES)));
            disk.set_len(open.file.file()?, &path, capacity)
                .ctx("grow chunk", &path)?;
            open.capacity = capacity;
            let map = Mapped::of_unit(open.file.file()?, &path, chunk_unit(open.id))?;
            let id = open.id;
            publish(inner, |m| set_chunk_map(m, id, map));
        }
        disk.write_at(open.file.file()?, &path, &self.frames, open.pos)
            .ctx("write chunk", &path)?;
        open.file.done();
        open.pos = end;
        open.dirty = true;
        self.frames.clear();
        Ok(())
    }

    /// Seals the open chunk: trims the file to its data and records it as full.
    pub(crate) fn seal(&mut self, inner: &Core, writers: &Writers) -> Result<()> {
        let disk = inner.disk();
        let Some(open) = self.open.as_mut() else {
            return Ok(());
        };
        let path = open.file.path.clone();
        disk.set_len(open.file.file()?, &path, open.pos)
            .ctx("trim sealed chunk", &path)?;
        let map = Mapped::of_unit(open.file.file()?, &path, chunk_unit(open.id))?;
        open.file.done();
        let (id, pos, records) = (open.id, open.pos, open.records);
        publish(inner, |m| set_chunk_map(m, id, map));
        writers.shared().update_chunk_meta(id, pos, records, true);
        if let Some(open) = self.open.take() {
            self.unsynced.push(open.file);
        }
        Ok(())
    }

    /// Step 1 of a commit: this writer's chunk data on disk; reports its unfull chunks'
    /// state.
    pub(crate) fn sync(&mut self, shared: &mut Shared) -> Result<()> {
        let disk = shared.disk.clone();
        for open in self.open.iter_mut().chain(self.parked.values_mut()) {
            if open.dirty {
                open.file.sync(&disk)?;
                open.dirty = false;
            }
            shared.update_chunk_meta(open.id, open.pos, open.records, false);
        }
        while let Some(file) = self.unsynced.last_mut() {
            file.sync(&disk)?;
            self.unsynced.pop();
        }
        Ok(())
    }
}

/// The chunk id a chunk file's path names.
fn chunk_of_path(path: &std::path::Path) -> Option<u32> {
    path.file_name()?
        .to_str()?
        .strip_suffix(".zr")?
        .parse()
        .ok()
}

const STORED_BYTES_MAX: usize = 32;

/// `payload` as a raw Deflate stream in `out`.
fn deflate(
    compressor: &mut Compress,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), crate::codec::CodecError> {
    if payload.len() <= STORED_BYTES_MAX {
        let len = payload.len() as u16;
        out.clear();
        out.push(0b001); // the final block (bit 0), stored (bits 1-2: 00), padded to the byte
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(payload);
        return Ok(());
    }
    compressor.reset();
    out.clear();
    out.reserve(payload.len() + payload.len() / 16 + 64);
    loop {
        let consumed = compressor.total_in() as usize;
        let status = compressor
            .compress_vec(&payload[consumed..], out, FlushCompress::Finish)
            .map_err(crate::codec::CodecError::Deflate)?;
        match status {
            Status::StreamEnd => return Ok(()),
            Status::Ok | Status::BufError => out.reserve(out.capacity().max(64)),
        }
    }
}

#[cfg(test)]
mod tests {
    use flate2::{Decompress, FlushDecompress};

    use super::*;

    fn inflate(stream: &[u8], len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 1);
        let status = Decompress::new(false)
            .decompress_vec(stream, &mut out, FlushDecompress::Finish)
            .unwrap();
        assert_eq!(status, Status::StreamEnd, "the stream is not whole");
        out
    }

    /// Small payloads are stored blocks and large ones deflated; both are whole raw Deflate
    /// streams that inflate to the payload, and one compressor serves both in turn.
    #[test]
    fn every_payload_deflates_to_a_stream_that_inflates_back() {
        let mut compressor = Compress::new(flate2::Compression::default(), false);
        let mut out = Vec::new();
        let text = b"a red shape beside a blue shape beside a green shape ".repeat(100);
        for len in [0, 1, 31, 32, 33, 64, 1000, 5000] {
            for payload in [
                &text[..len],
                &(0..len).map(|k| (k * 131 % 251) as u8).collect::<Vec<_>>()[..],
            ] {
                deflate(&mut compressor, payload, &mut out).unwrap();
                assert_eq!(inflate(&out, payload.len()), payload, "{len} bytes");
                if len <= STORED_BYTES_MAX {
                    assert_eq!(out.len(), len + 5, "{len} bytes are stored");
                }
            }
        }
        deflate(&mut compressor, &text, &mut out).unwrap();
        assert!(out.len() < text.len() / 10, "repetitive text is compressed");
    }
}
