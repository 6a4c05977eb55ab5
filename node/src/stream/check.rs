//! `verify` of a stream: every committed page of tokens against its CRC, the document and
//! span tables against theirs and against each other, and the metadata records. Reports
//! what is wrong; changes nothing.

use crc32fast::Hasher;

use super::{Stream, METADATA_FIELD};
use crate::error::Result;
use crate::map::PAGE_BYTES;
use crate::verify::Problem;

/// Pages checked per progress report.
const STEP_PAGES: u64 = 256;

/// What [`Stream::verify`] found.
#[derive(Clone, Debug, Default)]
pub struct StreamReport {
    /// Tokens checked.
    pub tokens: u64,
    /// Token bytes checked.
    pub bytes: u64,
    /// Everything wrong: `field` names the table (`tokens` with a page index, `documents`,
    /// `spans` with an entry index, `metadata` with a record index).
    pub problems: Vec<Problem>,
}

impl Stream {
    /// Checks the whole stream as committed; `progress` gets token bytes checked so far.
    pub fn verify(&self, mut progress: impl FnMut(u64)) -> Result<StreamReport> {
        let view = self.view();
        let meta = &view.meta;
        let e = view.element_bytes;
        let token_bytes = meta.tokens * e;
        let mut report = StreamReport {
            tokens: meta.tokens,
            bytes: token_bytes,
            problems: Vec::new(),
        };
        let mut problem = |field: &str, index: u64, reason: String| {
            report.problems.push(Problem {
                field: field.into(),
                index,
                reason,
            })
        };

        let pages = token_bytes.div_ceil(PAGE_BYTES);
        for p in 0..pages {
            let start = p * PAGE_BYTES;
            let len = PAGE_BYTES.min(token_bytes - start);
            let bytes = view
                .tokens
                .as_ref()
                .and_then(|m| m.bytes(start, len))
                .unwrap_or_default();
            let want = super::read::page_crc(&view, p).map(|(crc, _)| crc);
            if want != Some(crc32fast::hash(bytes)) {
                problem(
                    "tokens",
                    p,
                    format!("bytes {start}..{} do not match their CRC", start + len),
                );
            }
            if p % STEP_PAGES == STEP_PAGES - 1 {
                progress(start + len);
            }
        }
        progress(token_bytes);

        let mut crc = Hasher::new();
        let mut previous = 0;
        for d in 0..meta.documents {
            let end = view.document_end(d);
            crc.update(&end.to_le_bytes());
            if end < previous || end > meta.tokens {
                problem(
                    "documents",
                    d,
                    format!(
                        "ends at token {end}, before the document before it ({previous}) or past the stream's {} tokens",
                        meta.tokens
                    ),
                );
            }
            previous = end;
        }
        if crc.finalize() != meta.documents_crc {
            problem(
                "documents",
                0,
                "the document table does not match its CRC".into(),
            );
        }
        if previous != meta.tokens {
            problem(
                "documents",
                meta.documents.saturating_sub(1),
                format!(
                    "the last document ends at {previous}, and the stream holds {} tokens",
                    meta.tokens
                ),
            );
        }

        let mut crc = Hasher::new();
        let (mut last_start, mut reach) = (0, 0);
        for j in 0..meta.spans {
            let (start, end, entry_reach) = view.span(j);
            for v in [start, end, entry_reach] {
                crc.update(&v.to_le_bytes());
            }
            reach = reach.max(end);
            if start >= end || end > meta.tokens || start < last_start || entry_reach != reach {
                problem(
                    "spans",
                    j,
                    format!("entry [{start}, {end}) reach {entry_reach} is out of order or out of the stream"),
                );
            }
            last_start = start;
        }
        if crc.finalize() != meta.spans_crc {
            problem("spans", 0, "the span table does not match its CRC".into());
        }

        if let Some(store) = &view.metadata {
            let found = store.verify(|_| {})?;
            for p in found.problems {
                if p.index < meta.spans && p.field == METADATA_FIELD {
                    problem("metadata", p.index, p.reason);
                }
            }
        }
        Ok(report)
    }
}
