//! WebDataset tar shards into a record dataset: the members of each sample (consecutive
//! members sharing a key, the path up to the first dot of the file name) become its fields,
//! named by their extension (`jpg`, `cls`, `json`, …), stored as they are.

use std::io::Read;
use std::path::{Path, PathBuf};

use zr_node::{FieldSpec, Record};

use crate::IngestError;

/// Samples appended per call.
const BATCH: usize = 256;

/// What to convert.
#[derive(Clone, Debug)]
pub struct TarOptions {
    /// The shards, read in this order.
    pub shards: Vec<PathBuf>,
    /// The dataset to make (a new or empty directory).
    pub dest: PathBuf,
    /// A sample lacking a member the first sample has is counted and left out, instead of
    /// failing the conversion.
    pub skip_incomplete: bool,
}

/// What a conversion did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TarReport {
    pub samples: u64,
    pub bytes: u64,
    /// The fields, by extension, in the order the first sample has them.
    pub fields: Vec<String>,
    /// Samples left out for lacking a member.
    pub skipped: u64,
}

/// One sample being read: its key, where, and its members.
struct Sample {
    key: String,
    shard: usize,
    members: Vec<(String, Vec<u8>)>,
}

/// Expands `shard-{000000..000099}.tar` into its names (the digits keep their width); a
/// pattern without braces is itself.
pub fn expand(pattern: &str) -> Result<Vec<String>, IngestError> {
    let Some(open) = pattern.find('{') else {
        return Ok(vec![pattern.to_string()]);
    };
    let close = pattern[open..]
        .find('}')
        .map(|c| open + c)
        .ok_or_else(|| IngestError::Usage(format!("'{pattern}': an unclosed '{{'")))?;
    let inner = &pattern[open + 1..close];
    let (a, b) = inner.split_once("..").ok_or_else(|| {
        IngestError::Usage(format!("'{pattern}': braces hold FROM..TO, not '{inner}'"))
    })?;
    let parse = |s: &str| {
        s.parse::<u64>()
            .map_err(|_| IngestError::Usage(format!("'{pattern}': '{s}' is not a number")))
    };
    let (from, to) = (parse(a)?, parse(b)?);
    if to < from || to - from > 1_000_000 {
        return Err(IngestError::Usage(format!(
            "'{pattern}': {from}..{to} is no range of shards"
        )));
    }
    let width = a.len();
    let mut out = Vec::new();
    for n in from..=to {
        let rest = expand(&pattern[close + 1..])?;
        for tail in rest {
            out.push(format!("{}{n:0width$}{tail}", &pattern[..open]));
        }
    }
    Ok(out)
}

/// Converts `options.shards` into a record dataset at `options.dest`, calling `progress`
/// with the samples and bytes written so far.
pub fn convert_tars(
    options: &TarOptions,
    progress: impl FnMut(u64, u64),
) -> Result<TarReport, IngestError> {
    check_shards(options)?;
    let mut sink = crate::LocalRecords::new(&options.dest)?;
    convert_tars_into(options, &mut sink, progress)
}

fn check_shards(options: &TarOptions) -> Result<(), IngestError> {
    if options.shards.is_empty() {
        return Err(IngestError::Usage("no shards".into()));
    }
    for shard in &options.shards {
        crate::remote::check_input(shard)?;
    }
    Ok(())
}

/// [`convert_tars`] into `sink` (`options.dest` is not used); a failed conversion abandons
/// the sink.
pub fn convert_tars_into(
    options: &TarOptions,
    sink: &mut dyn crate::RecordSink,
    mut progress: impl FnMut(u64, u64),
) -> Result<TarReport, IngestError> {
    check_shards(options)?;
    let mut state = Converting {
        options,
        sink,
        made: false,
        fields: Vec::new(),
        pending: Vec::new(),
        report: TarReport::default(),
    };
    let result = (|| {
        let mut current: Option<Sample> = None;
        for (shard, path) in options.shards.iter().enumerate() {
            let file = crate::remote::open_read(path)?;
            let mut archive = tar::Archive::new(file);
            let bad = |reason: String| IngestError::Input {
                path: path.clone(),
                reason,
            };
            for entry in archive.entries().map_err(|e| bad(e.to_string()))? {
                let mut entry = entry.map_err(|e| bad(format!("a damaged member: {e}")))?;
                if !entry.header().entry_type().is_file() {
                    continue;
                }
                let name = entry
                    .path()
                    .map_err(|e| bad(e.to_string()))?
                    .to_string_lossy()
                    .into_owned();
                let (key, extension) = split_name(&name);
                if extension.is_empty() {
                    continue; // no field to hold it
                }
                let mut bytes = Vec::with_capacity(entry.size() as usize);
                entry
                    .read_to_end(&mut bytes)
                    .map_err(|e| bad(format!("member {name} cut short: {e}")))?;
                if current
                    .as_ref()
                    .is_some_and(|s| s.key != key || s.shard != shard)
                {
                    if let Some(done) = current.take() {
                        state.sample(done, &mut progress)?;
                    }
                }
                current
                    .get_or_insert_with(|| Sample {
                        key: key.to_string(),
                        shard,
                        members: Vec::new(),
                    })
                    .members
                    .push((extension.to_string(), bytes));
            }
        }
        if let Some(done) = current.take() {
            state.sample(done, &mut progress)?;
        }
        state.flush(&mut progress)?;
        match state.made {
            true => state.sink.commit(),
            false => Err(IngestError::Usage("the shards hold no sample".into())),
        }
    })();
    match result {
        Ok(()) => Ok(state.report),
        Err(e) => {
            state.sink.abandon();
            Err(e)
        }
    }
}

/// `dir/key.ext.more` → (`dir/key`, `ext.more`): WebDataset's key and extension.
fn split_name(name: &str) -> (&str, &str) {
    let start = name.rfind('/').map_or(0, |s| s + 1);
    match name[start..].find('.') {
        Some(dot) => (&name[..start + dot], &name[start + dot + 1..]),
        None => (name, ""),
    }
}

struct Converting<'a> {
    options: &'a TarOptions,
    sink: &'a mut dyn crate::RecordSink,
    /// Whether the sink's dataset was made (with the first sample's fields).
    made: bool,
    fields: Vec<String>,
    /// Samples read, in field order, not appended yet.
    pending: Vec<Vec<Vec<u8>>>,
    report: TarReport,
}

impl Converting<'_> {
    fn sample(
        &mut self,
        sample: Sample,
        progress: &mut impl FnMut(u64, u64),
    ) -> Result<(), IngestError> {
        let shard = &self.options.shards[sample.shard];
        if !self.made {
            self.fields = sample.members.iter().map(|(e, _)| e.clone()).collect();
            let specs: Vec<FieldSpec> = self
                .fields
                .iter()
                .map(|f| FieldSpec::raw(f.as_str()))
                .collect();
            self.sink.create(&specs)?;
            self.made = true;
            self.report.fields = self.fields.clone();
        }
        let mut values = Vec::with_capacity(self.fields.len());
        for field in &self.fields {
            match sample.members.iter().position(|(e, _)| e == field) {
                Some(k) => values.push(sample.members[k].1.clone()),
                None if self.options.skip_incomplete => {
                    self.report.skipped += 1;
                    return Ok(());
                }
                None => {
                    return Err(IngestError::Input {
                        path: shard.clone(),
                        reason: format!(
                            "sample '{}' has no '{field}' member (the first sample has {}); --missing skip leaves such samples out",
                            sample.key,
                            self.fields.join(", ")
                        ),
                    })
                }
            }
        }
        if let Some((extra, _)) = sample
            .members
            .iter()
            .find(|(e, _)| !self.fields.contains(e))
        {
            return Err(IngestError::Input {
                path: shard.clone(),
                reason: format!(
                    "sample '{}' has a '{extra}' member the first sample lacks (it has {})",
                    sample.key,
                    self.fields.join(", ")
                ),
            });
        }
        self.report.bytes += values.iter().map(|v| v.len() as u64).sum::<u64>();
        self.pending.push(values);
        if self.pending.len() >= BATCH {
            self.flush(progress)?;
        }
        Ok(())
    }

    fn flush(&mut self, progress: &mut impl FnMut(u64, u64)) -> Result<(), IngestError> {
        if !self.made || self.pending.is_empty() {
            return Ok(());
        }
        let records: Vec<Record> = self
            .pending
            .iter()
            .map(|values| {
                let mut record = Record::new();
                for (field, value) in self.fields.iter().zip(values) {
                    record = record.with(field, value);
                }
                record
            })
            .collect();
        self.sink.append(&records)?;
        self.report.samples += records.len() as u64;
        self.pending.clear();
        progress(self.report.samples, self.report.bytes);
        Ok(())
    }
}

/// The shards `pattern` names, checked to exist.
pub fn shards_of(patterns: &[String]) -> Result<Vec<PathBuf>, IngestError> {
    let mut out = Vec::new();
    for pattern in patterns {
        for name in expand(pattern)? {
            out.push(Path::new(&name).to_path_buf());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sample of a test shard: its key, and its members (extension, bytes).
    type TestSample<'a> = (&'a str, &'a [(&'a str, &'a [u8])]);

    fn shard(path: &Path, samples: &[TestSample]) {
        let mut builder = tar::Builder::new(std::fs::File::create(path).unwrap());
        for (key, members) in samples {
            for (ext, bytes) in *members {
                let mut header = tar::Header::new_gnu();
                header.set_size(bytes.len() as u64);
                header.set_mode(0o644);
                header.set_cksum();
                builder
                    .append_data(&mut header, format!("{key}.{ext}"), *bytes)
                    .unwrap();
            }
        }
        builder.finish().unwrap();
    }

    fn records(dir: &Path, field: &str) -> Vec<Vec<u8>> {
        let store = zr_node::Store::open_read_only(dir).unwrap();
        let all: Vec<u64> = (0..store.len()).collect();
        let batch = store.gather(&all, &[field]).unwrap();
        let column = batch.field(field).unwrap();
        (0..all.len())
            .map(|k| column.get(k).unwrap().to_vec())
            .collect()
    }

    #[test]
    fn shards_become_records_field_by_extension() {
        let dir = tempfile::tempdir().unwrap();
        shard(
            &dir.path().join("s-000.tar"),
            &[
                ("a/0", &[("jpg", b"img0"), ("cls", b"3")]),
                ("a/1", &[("jpg", b"img1"), ("cls", b"7")]),
            ],
        );
        shard(
            &dir.path().join("s-001.tar"),
            &[("b/2", &[("cls", b"1"), ("jpg", b"")])],
        );
        let pattern = format!("{}/s-{{000..001}}.tar", dir.path().display());
        let options = TarOptions {
            shards: shards_of(&[pattern]).unwrap(),
            dest: dir.path().join("ds"),
            skip_incomplete: false,
        };
        let report = convert_tars(&options, |_, _| {}).unwrap();
        assert_eq!(report.samples, 3);
        assert_eq!(report.fields, vec!["jpg", "cls"]);
        assert_eq!(
            records(&options.dest, "jpg"),
            vec![b"img0".to_vec(), b"img1".to_vec(), Vec::new()]
        );
        assert_eq!(
            records(&options.dest, "cls"),
            vec![b"3".to_vec(), b"7".to_vec(), b"1".to_vec()]
        );
        assert_eq!(
            expand("x-{08..10}.tar").unwrap(),
            vec!["x-08.tar", "x-09.tar", "x-10.tar"]
        );
        assert!(expand("x-{3..1}.tar").is_err());
    }

    #[test]
    fn a_sample_missing_a_member_is_named_or_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.tar");
        shard(
            &path,
            &[
                ("k0", &[("jpg", b"a"), ("cls", b"0")]),
                ("k1", &[("jpg", b"b")]),
                ("k2", &[("jpg", b"c"), ("cls", b"2")]),
            ],
        );
        let options = TarOptions {
            shards: vec![path.clone()],
            dest: dir.path().join("ds"),
            skip_incomplete: false,
        };
        let e = convert_tars(&options, |_, _| {}).unwrap_err().to_string();
        assert!(
            e.contains("s.tar") && e.contains("sample 'k1' has no 'cls' member"),
            "{e}"
        );
        assert!(!options.dest.exists());
        let skip = TarOptions {
            skip_incomplete: true,
            ..options.clone()
        };
        let report = convert_tars(&skip, |_, _| {}).unwrap();
        assert_eq!((report.samples, report.skipped), (2, 1));
        // A shard cut short: named, and nothing left behind.
        let bytes = std::fs::read(&path).unwrap();
        let cut = dir.path().join("cut.tar");
        std::fs::write(&cut, &bytes[..700]).unwrap();
        let cut_options = TarOptions {
            shards: vec![cut],
            dest: dir.path().join("cut-ds"),
            skip_incomplete: false,
        };
        let e = convert_tars(&cut_options, |_, _| {})
            .unwrap_err()
            .to_string();
        assert!(e.contains("cut.tar"), "{e}");
        assert!(!cut_options.dest.exists());
    }
}
