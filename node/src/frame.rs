//! The frame that precedes every record payload in a chunk.
//!
//! ```text
//! 0      4           8            12     16
//! | ZRF1 | stored_len | logical_len | crc32 | payload (stored_len bytes) | pad to 8 |
//! ```
//! `crc32` covers `stored_len`, `logical_len` and the payload, so a damaged header is caught
//! too. The offset entry points at the frame start; zero-copy slices start past the header.
//! Padding goes in front of a frame: frames start 8-byte aligned, so typed views of raw
//! payloads are aligned, and payloads of [`CACHE_ALIGN_MIN_BYTES`] or more start on a 64-byte
//! cache line, so a gather moves no partial line (a 1 KiB payload spans 16 lines, not 17).

/// Bytes of the frame header.
pub const FRAME_HEADER_BYTES: u64 = 16;
/// Every frame starts at a multiple of this.
pub const FRAME_ALIGN: u64 = 8;
/// Payloads at least this long start on a cache line.
pub const CACHE_ALIGN_MIN_BYTES: usize = 256;
const CACHE_LINE: u64 = 64;
const MAGIC: [u8; 4] = *b"ZRF1";

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// Payload bytes as stored (compressed for `flate` fields).
    pub stored_len: u32,
    /// Payload bytes after decompression (equal to `stored_len` for `raw`).
    pub logical_len: u32,
    /// CRC32 of the two lengths and the stored payload.
    pub crc: u32,
}

/// A frame header that is not one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// Its first four bytes are not the frame magic (`ZRF1`).
    #[error("frame header has bad magic {0:02x?}")]
    BadMagic([u8; 4]),
}

impl FrameHeader {
    /// Decodes a header; `Err` says what is wrong with it.
    pub fn decode(bytes: [u8; 16]) -> Result<FrameHeader, FrameError> {
        if bytes[0..4] != MAGIC {
            return Err(FrameError::BadMagic([
                bytes[0], bytes[1], bytes[2], bytes[3],
            ]));
        }
        let word =
            |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        Ok(FrameHeader {
            stored_len: word(4),
            logical_len: word(8),
            crc: word(12),
        })
    }
}

/// The CRC a frame with these lengths and payload must carry.
pub fn frame_crc(stored_len: u32, logical_len: u32, payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&stored_len.to_le_bytes());
    hasher.update(&logical_len.to_le_bytes());
    hasher.update(payload);
    hasher.finalize()
}

/// Where a frame for a payload of `stored_len` bytes starts when the chunk's data ends at `end`.
pub fn frame_start(end: u64, stored_len: usize) -> u64 {
    if stored_len >= CACHE_ALIGN_MIN_BYTES {
        (end + FRAME_HEADER_BYTES).next_multiple_of(CACHE_LINE) - FRAME_HEADER_BYTES
    } else {
        end.next_multiple_of(FRAME_ALIGN)
    }
}

/// Appends one frame (padding, header, payload) to `out`, whose first byte lies at chunk
/// position `out_pos`. Returns the frame's position in the chunk.
pub fn encode_frame(out: &mut Vec<u8>, out_pos: u64, payload: &[u8], logical_len: u32) -> u64 {
    let start = frame_start(out_pos + out.len() as u64, payload.len());
    out.resize((start - out_pos) as usize, 0);
    let stored_len = payload.len() as u32;
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&stored_len.to_le_bytes());
    out.extend_from_slice(&logical_len.to_le_bytes());
    out.extend_from_slice(&frame_crc(stored_len, logical_len, payload).to_le_bytes());
    out.extend_from_slice(payload);
    start
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let mut out = Vec::new();
        assert_eq!(encode_frame(&mut out, 0, b"hello", 5), 0);
        assert_eq!(out.len(), 21);
        assert_eq!(
            encode_frame(&mut out, 0, b"hello", 5),
            24,
            "small frames start 8-aligned"
        );
        let big = vec![7u8; CACHE_ALIGN_MIN_BYTES];
        let at = encode_frame(&mut out, 100, &big, big.len() as u32);
        assert_eq!(
            (at + FRAME_HEADER_BYTES) % 64,
            0,
            "large payloads start on a cache line"
        );
        assert_eq!(
            out.len() as u64 + 100,
            at + FRAME_HEADER_BYTES + big.len() as u64
        );
        let header = FrameHeader::decode(out[..16].try_into().unwrap()).unwrap();
        assert_eq!(header.stored_len, 5);
        assert_eq!(header.crc, frame_crc(5, 5, b"hello"));
        assert_ne!(header.crc, frame_crc(5, 5, b"hellp"));
        assert_ne!(header.crc, frame_crc(5, 6, b"hello"));
        out[1] ^= 1;
        assert!(FrameHeader::decode(out[..16].try_into().unwrap()).is_err());
    }
}
