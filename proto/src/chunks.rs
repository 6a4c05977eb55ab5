//! A message as it came off the network: the chunks it arrived in (pieces of received
//! packets), read front to back without first joining them into one buffer.

use std::mem::MaybeUninit;

use bytes::Bytes;

/// `len` bytes of `chunks`, starting `offset` bytes into the first chunk. Cloning gives a
/// second reader over the same bytes; reading advances only the reader read from.
#[derive(Clone, Debug)]
pub struct Chunks<'a> {
    chunks: &'a [Bytes],
    offset: usize,
    len: usize,
}

impl<'a> Chunks<'a> {
    /// All of `chunks`, in order.
    pub fn new(chunks: &'a [Bytes]) -> Chunks<'a> {
        Chunks {
            chunks,
            offset: 0,
            len: chunks.iter().map(Bytes::len).sum(),
        }
    }

    /// Bytes left.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if no bytes are left.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Takes the next `n` bytes off as a reader of their own; `None` (taking nothing) if
    /// fewer are left.
    pub fn split_to(&mut self, n: usize) -> Option<Chunks<'a>> {
        if n > self.len {
            return None;
        }
        let front = Chunks {
            chunks: self.chunks,
            offset: self.offset,
            len: n,
        };
        self.skip(n);
        Some(front)
    }

    /// Fills `out` with the next bytes; `false` (reading nothing) if fewer are left.
    pub fn read_into(&mut self, out: &mut [u8]) -> bool {
        self.read_pieces(out.len(), |at, piece| {
            out[at..at + piece.len()].copy_from_slice(piece)
        })
    }

    /// [`Chunks::read_into`] for a buffer not yet initialized: `true` means every byte of
    /// `out` was written.
    pub fn read_into_uninit(&mut self, out: &mut [MaybeUninit<u8>]) -> bool {
        self.read_pieces(out.len(), |at, piece| {
            out[at..at + piece.len()].write_copy_of_slice(piece);
        })
    }

    /// Hands the next `n` bytes to `put` as (offset in the `n`, piece), in order; `false`
    /// (handing over nothing) if fewer are left.
    pub fn read_pieces(&mut self, n: usize, mut put: impl FnMut(usize, &[u8])) -> bool {
        if n > self.len {
            return false;
        }
        let mut done = 0;
        while done < n {
            let front = self.front();
            if front.is_empty() {
                // Unreachable: `len` never exceeds what the chunks hold.
                self.len = 0;
                return false;
            }
            let take = front.len().min(n - done);
            put(done, &front[..take]);
            self.offset += take;
            done += take;
        }
        self.len -= n;
        true
    }

    /// The next `n` bytes, copied; `None` if fewer are left.
    pub fn read_vec(&mut self, n: usize) -> Option<Vec<u8>> {
        if n > self.len {
            return None;
        }
        let mut out = vec![0u8; n];
        self.read_into(&mut out).then_some(out)
    }

    /// The bytes left, copied into one buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut rest = self.clone();
        let mut out = Vec::with_capacity(self.len);
        while out.len() < self.len {
            let front = rest.front();
            if front.is_empty() {
                break; // Unreachable: `len` never exceeds what the chunks hold.
            }
            let take = front.len().min(self.len - out.len());
            out.extend_from_slice(&front[..take]);
            rest.offset += take;
        }
        out
    }

    /// Skips `n` bytes (at most what is left).
    pub fn skip(&mut self, n: usize) {
        let mut n = n.min(self.len);
        self.len -= n;
        while n > 0 {
            let take = self.front().len().min(n);
            if take == 0 {
                break;
            }
            self.offset += take;
            n -= take;
        }
    }

    /// The rest of the current chunk, moving on to the next non-empty chunk first if the
    /// current one is used up. Only called while bytes are left, so a chunk remains.
    fn front(&mut self) -> &'a [u8] {
        while let Some((first, rest)) = self.chunks.split_first() {
            if self.offset < first.len() {
                return &first[self.offset..];
            }
            self.chunks = rest;
            self.offset = 0;
        }
        &[]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunked(bytes: &[u8], step: usize) -> Vec<Bytes> {
        let mut chunks: Vec<Bytes> = bytes.chunks(step).map(Bytes::copy_from_slice).collect();
        // Empty chunks anywhere change nothing.
        chunks.insert(chunks.len() / 2, Bytes::new());
        chunks.push(Bytes::new());
        chunks
    }

    #[test]
    fn reads_the_same_bytes_from_any_chunking() {
        let bytes: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        for step in [1, 3, 7, 64, 999, 1000, 5000] {
            let chunks = chunked(&bytes, step);
            let mut all = Chunks::new(&chunks);
            assert_eq!(all.len(), bytes.len());
            let mut front = all.split_to(10).unwrap();
            assert_eq!(front.read_vec(10).unwrap(), &bytes[..10]);
            assert!(front.is_empty());
            assert!(front.read_vec(1).is_none());
            let mut middle = all.split_to(500).unwrap();
            let again = middle.clone();
            assert_eq!(middle.read_vec(300).unwrap(), &bytes[10..310]);
            assert_eq!(middle.read_vec(200).unwrap(), &bytes[310..510]);
            assert_eq!(again.to_vec(), &bytes[10..510]);
            assert!(all.split_to(491).is_none(), "step {step}");
            assert_eq!(all.read_vec(490).unwrap(), &bytes[510..]);
            assert!(all.is_empty());
        }
    }

    proptest::proptest! {
        // Any chunking, any sequence of takes: the same bytes as slicing one buffer.
        #[test]
        fn reads_match_one_buffer(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
            cuts in proptest::collection::vec(0usize..700, 0..12),
            takes in proptest::collection::vec((0usize..200, proptest::prelude::any::<bool>()), 0..12),
        ) {
            let mut bounds: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
            bounds.push(0);
            bounds.push(bytes.len());
            bounds.sort_unstable();
            let chunks: Vec<Bytes> = bounds
                .windows(2)
                .map(|w| Bytes::copy_from_slice(&bytes[w[0]..w[1]]))
                .collect();
            let mut reader = Chunks::new(&chunks);
            let mut at = 0;
            for (n, split) in takes {
                let fits = at + n <= bytes.len();
                if split {
                    match reader.split_to(n) {
                        Some(front) => {
                            proptest::prop_assert!(fits);
                            proptest::prop_assert_eq!(front.to_vec(), &bytes[at..at + n]);
                            at += n;
                        }
                        None => proptest::prop_assert!(!fits),
                    }
                } else {
                    match reader.read_vec(n) {
                        Some(read) => {
                            proptest::prop_assert!(fits);
                            proptest::prop_assert_eq!(read, &bytes[at..at + n]);
                            at += n;
                        }
                        None => proptest::prop_assert!(!fits),
                    }
                }
                proptest::prop_assert_eq!(reader.len(), bytes.len() - at);
            }
            proptest::prop_assert_eq!(reader.to_vec(), &bytes[at..]);
        }
    }
}
