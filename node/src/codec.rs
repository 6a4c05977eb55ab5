//! Decoding a compressed field's stored payload into its logical bytes: Deflate (`flate`)
//! and Zstandard (`zstd`, whose records that would not have got smaller are stored as given:
//! stored length = logical length). One decoder per thread of a gather, reused record after
//! record.

use flate2::{Decompress, FlushDecompress, Status};

use crate::meta::Compression;

/// Decodes records of one compression (see the module documentation).
pub(crate) struct Decoder {
    compress: Compression,
    /// The field's zstd dictionary, if it has one.
    dict: Option<std::sync::Arc<[u8]>>,
    inflater: Option<Decompress>,
    zstd: Option<zstd::bulk::Decompressor<'static>>,
}

impl Decoder {
    pub(crate) fn new(compress: Compression, dict: Option<std::sync::Arc<[u8]>>) -> Decoder {
        Decoder {
            compress,
            dict,
            inflater: None,
            zstd: None,
        }
    }

    /// Decodes `stored` into `out`, which is exactly the record's logical length; `Err`
    /// says what is wrong with the stored bytes.
    pub(crate) fn decode(&mut self, stored: &[u8], out: &mut [u8]) -> Result<(), CodecError> {
        match self.compress {
            Compression::Raw => {
                if stored.len() != out.len() {
                    return Err(CodecError::RawLength {
                        stored: stored.len(),
                        logical: out.len(),
                    });
                }
                out.copy_from_slice(stored);
                Ok(())
            }
            Compression::Flate => {
                let inflater = self.inflater.get_or_insert_with(|| Decompress::new(false));
                inflater.reset(false);
                let status = inflater
                    .decompress(stored, out, FlushDecompress::Finish)
                    .map_err(CodecError::Inflate)?;
                if status != Status::StreamEnd || inflater.total_out() != out.len() as u64 {
                    return Err(CodecError::InflatedLength {
                        inflated: inflater.total_out(),
                        stream: if status == Status::StreamEnd {
                            "complete"
                        } else {
                            "incomplete"
                        },
                        logical: out.len(),
                    });
                }
                Ok(())
            }
            Compression::Zstd => {
                if stored.len() == out.len() {
                    // Stored as given: compressing did not make it smaller.
                    out.copy_from_slice(stored);
                    return Ok(());
                }
                let decompressor = match &mut self.zstd {
                    Some(d) => d,
                    slot => slot.insert(
                        match &self.dict {
                            Some(dict) => zstd::bulk::Decompressor::with_dictionary(dict),
                            None => zstd::bulk::Decompressor::new(),
                        }
                        .map_err(CodecError::ZstdStart)?,
                    ),
                };
                let written = decompressor
                    .decompress_to_buffer(stored, out)
                    .map_err(CodecError::Zstd)?;
                if written != out.len() {
                    return Err(CodecError::ZstdLength {
                        written,
                        logical: out.len(),
                    });
                }
                Ok(())
            }
        }
    }
}

/// Compresses `payload` with Zstandard at `level` into `out`; false (and `out` untouched in
/// meaning) if the result would not be smaller, when the record is stored as given.
pub(crate) fn zstd_smaller(
    compressor: &mut zstd::bulk::Compressor<'static>,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Result<bool, CodecError> {
    out.clear();
    out.reserve(zstd::zstd_safe::compress_bound(payload.len()));
    let n = compressor
        .compress_to_buffer(payload, out)
        .map_err(CodecError::ZstdCompress)?;
    Ok(n < payload.len())
}

/// What is wrong with a record's stored bytes, or why a codec failed on them.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CodecError {
    #[error("holds {stored} bytes, frame says {logical}")]
    RawLength { stored: usize, logical: usize },
    #[error("cannot inflate: {0}")]
    Inflate(#[source] flate2::DecompressError),
    #[error("inflates to {inflated} bytes (stream {stream}), frame says {logical}")]
    InflatedLength {
        inflated: u64,
        stream: &'static str,
        logical: usize,
    },
    #[error("cannot start zstd: {0}")]
    ZstdStart(#[source] std::io::Error),
    #[error("cannot decompress (zstd): {0}")]
    Zstd(#[source] std::io::Error),
    #[error("decompresses to {written} bytes (zstd), frame says {logical}")]
    ZstdLength { written: usize, logical: usize },
    #[error("cannot compress (zstd): {0}")]
    ZstdCompress(#[source] std::io::Error),
    #[error("cannot deflate: {0}")]
    Deflate(#[source] flate2::CompressError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zstd_stores_what_does_not_shrink_as_given_and_reads_both() {
        let mut compressor = zstd::bulk::Compressor::new(3).unwrap();
        let mut out = Vec::new();
        let text = b"a caption about a cat on a mat, a cat on a mat, a cat on a mat".repeat(4);
        assert!(zstd_smaller(&mut compressor, &text, &mut out).unwrap());
        let mut decoder = Decoder::new(Compression::Zstd, None);
        let mut back = vec![0u8; text.len()];
        decoder.decode(&out, &mut back).unwrap();
        assert_eq!(back, text);
        // One byte, or random bytes, do not shrink.
        for payload in [
            vec![7u8],
            (0..4096u64)
                .map(|i| zr_common::hash::mix2(9, i) as u8)
                .collect(),
        ] {
            assert!(!zstd_smaller(&mut compressor, &payload, &mut out).unwrap());
            let mut back = vec![0u8; payload.len()];
            decoder.decode(&payload, &mut back).unwrap();
            assert_eq!(back, payload);
        }
        // Damaged compressed bytes are refused, naming zstd.
        let mut damaged = Vec::new();
        zstd_smaller(&mut compressor, &text, &mut damaged).unwrap();
        damaged.truncate(damaged.len() / 2);
        let mut back = vec![0u8; text.len()];
        let e = decoder.decode(&damaged, &mut back).unwrap_err();
        assert!(e.to_string().contains("zstd"), "{e}");
    }
}
