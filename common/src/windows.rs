//! Observations of a token stream, as pure functions of its counts: windows of `W + 1`
//! tokens at a stride (inputs and labels shifted by one), or whole documents. Shared by the
//! local engine and the cluster client, which read the tokens in their own ways.

use crate::columns::Contiguous;
use crate::error::BoxError;

/// What an observation of a token stream is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WindowMode {
    /// Observation i: tokens `[i·stride, i·stride + seq_len + 1)`; the last incomplete
    /// window is dropped.
    Windows { seq_len: u64, stride: u64 },
    /// Observation i: document i, its first `seq_len + 1` tokens, padded with zeros (and
    /// mask 0, document -1) when shorter.
    Documents { seq_len: u64 },
}

/// Windows asked for with a `seq_len` or `stride` out of range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "windows need 1 <= seq_len < 2^32 and stride >= 1 (got seq_len {seq_len}, stride {stride})"
)]
pub struct BadWindows {
    pub seq_len: u64,
    pub stride: u64,
}

impl WindowMode {
    /// Tokens per observation: `seq_len + 1`.
    pub fn width(&self) -> u64 {
        match *self {
            WindowMode::Windows { seq_len, .. } | WindowMode::Documents { seq_len } => seq_len + 1,
        }
    }

    /// Checks `seq_len` (1 to 2^32 - 2) and `stride` (at least 1).
    pub fn check(&self) -> Result<(), BadWindows> {
        let (seq_len, stride) = match *self {
            WindowMode::Windows { seq_len, stride } => (seq_len, stride),
            WindowMode::Documents { seq_len } => (seq_len, 1),
        };
        if seq_len == 0 || stride == 0 || seq_len >= u32::MAX as u64 {
            return Err(BadWindows { seq_len, stride });
        }
        Ok(())
    }

    /// Observations in a stream of `tokens` tokens in `documents` documents.
    pub fn count(&self, tokens: u64, documents: u64) -> u64 {
        match *self {
            WindowMode::Windows { seq_len, stride } => {
                let width = seq_len + 1;
                if tokens < width {
                    0
                } else {
                    (tokens - width) / stride.max(1) + 1
                }
            }
            WindowMode::Documents { .. } => documents,
        }
    }
}

/// Gathered windows, as a loader hands them over.
#[derive(Debug, Default)]
pub struct WindowColumns {
    pub rows: usize,
    /// Tokens per row.
    pub width: usize,
    pub element_bytes: usize,
    /// `rows × width` elements.
    pub tokens: Vec<u8>,
    /// Each token's document.
    pub document: Vec<i64>,
    /// Document mode: 1 for a token, 0 for padding (empty otherwise).
    pub mask: Vec<u8>,
}

impl WindowColumns {
    /// The columns `fields` names (`tokens`, `document`, `mask` in document mode; empty:
    /// all), each row one window, into `columns`.
    pub fn into_columns(
        mut self,
        fields: &[String],
        columns: &mut Vec<Contiguous>,
    ) -> Result<(), BoxError> {
        let has_mask = !self.mask.is_empty();
        let names: Vec<&str> = if fields.is_empty() {
            let mut all = vec!["tokens", "document"];
            if has_mask {
                all.push("mask");
            }
            all
        } else {
            fields.iter().map(String::as_str).collect()
        };
        columns.resize_with(names.len(), Contiguous::default);
        for (column, name) in columns.iter_mut().zip(names) {
            let (data, row) = match name {
                "tokens" => (
                    std::mem::take(&mut self.tokens),
                    self.width * self.element_bytes,
                ),
                "document" => (
                    self.document.iter().flat_map(|d| d.to_le_bytes()).collect(),
                    self.width * 8,
                ),
                "mask" if has_mask => (std::mem::take(&mut self.mask), self.width),
                other => {
                    return Err(format!(
                        "unknown field '{other}' of windows (they have: tokens, document{})",
                        if has_mask { ", mask" } else { "" }
                    )
                    .into())
                }
            };
            column.data = data;
            column.offsets = (0..=self.rows as u64).map(|r| r * row as u64).collect();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts() {
        let w = WindowMode::Windows {
            seq_len: 9,
            stride: 10,
        };
        assert_eq!(w.count(9, 1), 0);
        assert_eq!(w.count(10, 1), 1);
        assert_eq!(w.count(19, 1), 1);
        assert_eq!(w.count(20, 1), 2);
        assert_eq!(WindowMode::Documents { seq_len: 5 }.count(100, 7), 7);
        assert!(WindowMode::Windows {
            seq_len: 0,
            stride: 1
        }
        .check()
        .is_err());
        assert!(WindowMode::Windows {
            seq_len: 1,
            stride: 0
        }
        .check()
        .is_err());
    }
}
