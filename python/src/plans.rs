//! Plans of batches beyond a sampler's: token-budget micro-batches, batch-size ramps,
//! mixtures weighed in tokens, and the manifest of any step of a described run
//! (`zr_common::{budget, schedule, token_mix, provenance}`).

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::{one_of, Mixture};

/// Token-budget micro-batches of examples of known lengths (`zr_common::budget`).
#[pyclass(module = "zrecord._zrecord", frozen)]
pub(crate) struct TokenBudget {
    inner: zr_common::TokenBudget,
    /// The epoch plan read last.
    plans: std::sync::Mutex<Option<(u64, zr_common::budget::EpochPlan)>>,
}

#[pymethods]
impl TokenBudget {
    #[new]
    #[pyo3(signature = (lengths, max_tokens, cost, lookahead, ranks, accumulation, remainder, too_long, seed))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        lengths: PyReadonlyArray1<'_, u64>,
        max_tokens: u64,
        cost: &str,
        lookahead: usize,
        ranks: u32,
        accumulation: u32,
        remainder: &str,
        too_long: &str,
        seed: u64,
    ) -> PyResult<TokenBudget> {
        use zr_common::budget::{Cost, Remainder, TooLong};
        let cost = one_of(
            "cost",
            cost,
            &[("padded", Cost::Padded), ("packed", Cost::Packed)],
        )?;
        let remainder = one_of(
            "remainder",
            remainder,
            &[
                ("carry", Remainder::Carry),
                ("pad", Remainder::Pad),
                ("drop", Remainder::Drop),
            ],
        )?;
        let too_long = one_of(
            "too_long",
            too_long,
            &[("refuse", TooLong::Refuse), ("skip", TooLong::Skip)],
        )?;
        let config = zr_common::BudgetConfig {
            max_tokens,
            cost,
            lookahead,
            ranks,
            accumulation,
            remainder,
            too_long,
            seed,
        };
        let lengths = lengths.as_slice()?.to_vec();
        let inner = zr_common::TokenBudget::new(lengths, config)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(TokenBudget {
            inner,
            plans: std::sync::Mutex::new(None),
        })
    }

    /// Examples left out for being longer than the budget.
    fn skipped(&self) -> u64 {
        self.inner.skipped()
    }

    /// Micro-batches epoch `epoch` gives the run (padding included, a dropped step not).
    fn epoch_len(&self, py: Python<'_>, epoch: u64) -> u64 {
        let plan = py.detach(|| self.inner.epoch(epoch));
        self.inner.run_length(plan.len())
    }

    /// Rank `rank`'s micro-batches of the step from (`epoch`, `micro`) — each an array of
    /// example indices, or None for padding — and where the next step starts.
    #[allow(clippy::type_complexity)]
    fn step<'py>(
        &self,
        py: Python<'py>,
        epoch: u64,
        micro: u64,
        rank: u32,
    ) -> (Vec<Option<Bound<'py, PyArray1<u64>>>>, u64, u64) {
        let state = zr_common::BudgetState { epoch, micro };
        let (mine, next) = py.detach(|| {
            let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
            self.inner.step(state, rank, &mut plans)
        });
        let arrays = mine
            .into_iter()
            .map(|m| m.map(|examples| PyArray1::from_vec(py, examples)))
            .collect();
        (arrays, next.epoch, next.micro)
    }
}

/// A rank's batches under a global batch-size schedule (`zr_common::schedule`); states
/// cross as JSON.
#[pyclass(module = "zrecord._zrecord", frozen)]
pub(crate) struct RampSampler {
    inner: zr_common::RampSampler,
}

fn json_error(e: serde_json::Error) -> PyErr {
    PyValueError::new_err(format!("not a ramp sampler's state: {e}"))
}

#[pymethods]
impl RampSampler {
    /// `schedule`: {"Ramp": {"start", "increment", "samples", "global"}} or {"Stages":
    /// [[from_sample, size], ...]} as JSON.
    #[new]
    fn new(len: u64, seed: u64, rank: u64, ranks: u64, schedule: &str) -> PyResult<RampSampler> {
        let schedule: zr_common::BatchSchedule = serde_json::from_str(schedule)
            .map_err(|e| PyValueError::new_err(format!("not a batch schedule: {e}")))?;
        let inner = zr_common::RampSampler::new(len, seed, rank, ranks, schedule)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(RampSampler { inner })
    }

    /// Rank `rank` of `ranks` over `mixture`'s stream (its global batch 1), `schedule` as
    /// for a dataset.
    #[staticmethod]
    fn over_mixture(
        mixture: &Mixture,
        rank: u64,
        ranks: u64,
        schedule: &str,
    ) -> PyResult<RampSampler> {
        let schedule: zr_common::BatchSchedule = serde_json::from_str(schedule)
            .map_err(|e| PyValueError::new_err(format!("not a batch schedule: {e}")))?;
        let inner =
            zr_common::RampSampler::over_mixture(mixture.inner.clone(), rank, ranks, schedule)
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(RampSampler { inner })
    }

    /// This rank's part of the step at `state` — each position's dataset and record — and
    /// the state after it.
    #[allow(clippy::type_complexity)]
    fn step_sources<'py>(
        &self,
        py: Python<'py>,
        state: &str,
    ) -> PyResult<(Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i64>>, String)> {
        let state: zr_common::RampState = serde_json::from_str(state).map_err(json_error)?;
        let (sources, records, next) = self.inner.step_sources(&state);
        let next = serde_json::to_string(&next).map_err(json_error)?;
        Ok((
            PyArray1::from_vec(py, sources.into_iter().map(i64::from).collect()),
            PyArray1::from_vec(py, records.into_iter().map(|r| r as i64).collect()),
            next,
        ))
    }

    /// The state before the first step.
    fn start(&self) -> PyResult<String> {
        serde_json::to_string(&self.inner.start()).map_err(json_error)
    }

    /// This rank's indices of the step at `state`, and the state after it.
    fn step<'py>(
        &self,
        py: Python<'py>,
        state: &str,
    ) -> PyResult<(Bound<'py, PyArray1<u64>>, String)> {
        let state: zr_common::RampState = serde_json::from_str(state).map_err(json_error)?;
        let (indices, next) = self.inner.step(&state);
        let next = serde_json::to_string(&next).map_err(json_error)?;
        Ok((PyArray1::from_vec(py, indices), next))
    }

    /// Takes up `state`: (the state, the first step the schedule changes at, if any).
    fn resume(&self, state: &str) -> PyResult<(String, Option<u64>)> {
        let state: zr_common::RampState = serde_json::from_str(state).map_err(json_error)?;
        let resumed = self
            .inner
            .resume(&state)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let state = serde_json::to_string(&resumed.state).map_err(json_error)?;
        Ok((state, resumed.changes_at))
    }

    /// The global batch of the step after `samples` consumed.
    fn global_batch(&self, samples: u64) -> u64 {
        self.inner.schedule().global_batch(samples)
    }
}

/// Global batch `step` of the run `run` (run.json's text) describes: every rank's part, as
/// (rank, slot, dataset, record, the record a blocklist replaced or None, the dataset's
/// epoch).
#[pyfunction]
#[allow(clippy::type_complexity)]
pub(crate) fn explain(
    run: &str,
    step: u64,
) -> PyResult<Vec<(u64, u64, u32, u64, Option<u64>, u64)>> {
    let run = run_of(run)?;
    Ok(run
        .manifest(step)
        .into_iter()
        .map(|e| (e.rank, e.slot, e.dataset, e.record, e.replaced, e.epoch))
        .collect())
}

/// The steps in `[start, end)` of the run `run` describes that read `record` of `dataset`.
#[pyfunction]
pub(crate) fn explain_grep(
    run: &str,
    dataset: u32,
    record: u64,
    start: u64,
    end: u64,
) -> PyResult<Vec<u64>> {
    Ok(run_of(run)?.grep(dataset, record, start..end))
}

fn run_of(text: &str) -> PyResult<zr_common::provenance::Run> {
    let spec: zr_common::provenance::RunSpec = serde_json::from_str(text)
        .map_err(|e| PyValueError::new_err(format!("not a run description: {e}")))?;
    spec.check()
        .and_then(|spec| spec.run())
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// A token-weighted mixture tree, as JSON, compiled into a record mixture's stages (see
/// `zr_common::token_mix`): returns (stages as [(start, weights)], the global batch the
/// stream ends at or None, each leaf's budget in records or None).
#[pyfunction]
#[allow(clippy::type_complexity)]
pub(crate) fn token_mixture(
    tree: &str,
    seed: u64,
    rank: u64,
    ranks: u64,
    batch: u64,
) -> PyResult<(Vec<(u64, Vec<f64>)>, Option<u64>, Vec<Option<u64>>)> {
    use zr_common::token_mix::{Budget, Source};
    fn source(value: &serde_json::Value) -> Result<Source, String> {
        if let Some(children) = value.get("group").and_then(|g| g.as_array()) {
            let children = children
                .iter()
                .map(|pair| {
                    let weight = pair
                        .get(0)
                        .and_then(|w| w.as_f64())
                        .ok_or("a child without a weight")?;
                    let child = pair.get(1).ok_or("a child without a source")?;
                    Ok((weight, source(child)?))
                })
                .collect::<Result<Vec<_>, String>>()?;
            return Ok(Source::Group(children));
        }
        let len = value
            .get("len")
            .and_then(|l| l.as_u64())
            .ok_or("a leaf without len")?;
        let tokens_per_record = value
            .get("tokens_per_record")
            .and_then(|t| t.as_f64())
            .ok_or("a leaf without tokens_per_record")?;
        let budget = match (
            value.get("tokens").and_then(|t| t.as_u64()),
            value.get("epochs").and_then(|e| e.as_f64()),
        ) {
            (Some(_), Some(_)) => {
                return Err("a leaf with budgets of both tokens and epochs (give one)".into())
            }
            (Some(tokens), None) => Budget::Tokens(tokens),
            (None, Some(epochs)) => Budget::Epochs(epochs),
            (None, None) => Budget::Unlimited,
        };
        Ok(Source::Leaf {
            len,
            tokens_per_record,
            budget,
        })
    }
    let value: serde_json::Value = serde_json::from_str(tree)
        .map_err(|e| PyValueError::new_err(format!("not a mixture tree: {e}")))?;
    let root =
        source(&value).map_err(|what| PyValueError::new_err(format!("mixture tree: {what}")))?;
    let plan = zr_common::token_mix::plan(&root, seed, rank, ranks, batch)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let stages = plan
        .config
        .stages
        .into_iter()
        .map(|s| (s.start, s.weights))
        .collect();
    Ok((stages, plan.end, plan.budgets))
}

/// Text (JSON lines, plain or gzip/zstd, or Parquet files' text column) through a Hugging
/// Face tokenizer into the token stream at `dest`, as `zr convert --jsonl` does: on every
/// core, in the input's order, without the GIL. Returns (documents, tokens, lines skipped,
/// the token type).
#[pyfunction]
#[pyo3(signature = (inputs, tokenizer, dest, text_key="text", eos=None, append=false, skip_bad=false, threads=0, meta_keys=Vec::new()))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn tokenize_jsonl(
    py: Python<'_>,
    inputs: Vec<std::path::PathBuf>,
    tokenizer: std::path::PathBuf,
    dest: std::path::PathBuf,
    text_key: &str,
    eos: Option<String>,
    append: bool,
    skip_bad: bool,
    threads: usize,
    meta_keys: Vec<String>,
) -> PyResult<(u64, u64, u64, String)> {
    let options = zr_ingest::JsonlOptions {
        inputs,
        tokenizer,
        text_key: text_key.to_string(),
        eos,
        dest,
        append,
        skip_bad,
        threads,
        meta_keys,
    };
    let report = py
        .detach(|| zr_ingest::tokenize_jsonl(&options, |_| {}))
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok((
        report.documents,
        report.tokens,
        report.skipped,
        report.dtype,
    ))
}
