//! The columnar shape of a gathered field: one contiguous buffer plus offsets. Every
//! consumer (NumPy, PyTorch, the wire) wants this shape, whether the batch came from a local
//! store or from the cluster.

/// One field of a batch materialized: record i is `data[offsets[i]..offsets[i + 1]]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Contiguous {
    /// All payloads back to back.
    pub data: Vec<u8>,
    /// `len + 1` byte offsets into `data`, starting at 0.
    pub offsets: Vec<u64>,
}

impl Contiguous {
    /// Number of records.
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// True if there are no records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Record `i`'s bytes.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        let start = *self.offsets.get(i)? as usize;
        let end = *self.offsets.get(i + 1)? as usize;
        self.data.get(start..end)
    }
}
