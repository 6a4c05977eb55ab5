//! The move a router runs, as `zr cluster add-shard` / `drain-shard` and their progress
//! report it: started once per change (the same command again joins the move under way;
//! another change is refused while it runs, naming both), the copy counted as it goes, how
//! it ended, and how a move recorded in the cluster record reads to an operator. The router
//! performs the move (`moveplan` decides its steps); this keeps what it tells.

use zr_proto::wire::{self, MoveReport};

use crate::cluster::{MapChange, MapMove};

/// What a move command does, given the move this router runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Start {
    /// Nothing runs here: run it (its report is started).
    Run,
    /// The same change runs here already: the command joins it.
    Joined,
}

/// A point in a move at which the router's `stop_moves_at` stops it, as if the router died
/// there: for tests of restarting a move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoveStep {
    /// The move is recorded; nothing is copied.
    Recorded,
    /// The first copy (writes going on) is done.
    Copied,
    /// The new map is published; no node switched.
    Published,
    /// One node switched.
    SwitchedOne,
}

/// The move this router runs, or ran last; see the module documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoveRun {
    /// Its report so far (`None`: no move ran here).
    report: Option<MoveReport>,
    /// Bytes a second each node gaining slots copies their files at (0: as fast as it can):
    /// the last command's.
    rate: u64,
    /// Where moves stop with an error, as if their router died there (fault injection for
    /// tests; `None`: they run to their end).
    pub stop_at: Option<MoveStep>,
}

impl Default for MoveRun {
    fn default() -> Self {
        MoveRun {
            report: None,
            rate: wire::MOVE_RATE_DEFAULT,
            stop_at: None,
        }
    }
}

/// Whether the move `report` tells of still runs.
fn runs(report: &MoveReport) -> bool {
    !report.done && report.error.is_none()
}

/// Where `moving` goes, for messages: "to map version N (add a shard)".
pub fn target(moving: &MapMove) -> String {
    let change = moving
        .to
        .changes
        .last()
        .map_or_else(String::new, ToString::to_string);
    format!("to map version {} ({change})", moving.to.version)
}

/// The map change a client asked for, as the cluster record keeps it.
pub fn recorded(change: wire::MapChange) -> MapChange {
    match change {
        wire::MapChange::AddShard => MapChange::AddShard,
        wire::MapChange::DrainShard(shard) => MapChange::DrainShard(shard),
    }
}

impl MoveRun {
    /// A command for `change` at `rate` bytes a second: the rate is taken (running a
    /// command again changes it), and the move is run, joined, or refused with the reason
    /// while a move of another change runs here.
    pub fn start(&mut self, change: wire::MapChange, rate: u64) -> Result<Start, String> {
        self.rate = rate;
        if let Some(running) = self.report.as_ref().filter(|m| runs(m)) {
            if running.change == Some(change) {
                return Ok(Start::Joined);
            }
            return Err(format!(
                "another move ({}) is under way; this one ({}) was not started: run it again once that one has ended",
                running.change.map_or_else(String::new, |c| recorded(c).to_string()),
                recorded(change)
            ));
        }
        self.report = Some(MoveReport {
            change: Some(change),
            ..MoveReport::default()
        });
        Ok(Start::Run)
    }

    /// The copy rate of the last command.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Whether a move runs here.
    pub fn running(&self) -> bool {
        self.report.as_ref().is_some_and(runs)
    }

    /// The move copies to map `version` of a cluster of `records`, `total` records to
    /// write in all: its report starts counting (keeping the change it makes).
    pub fn copying(&mut self, version: u64, records: u64, total: u64) {
        let change = self.report.as_ref().and_then(|m| m.change);
        self.report = Some(MoveReport {
            version,
            records,
            staged_total: total,
            change,
            ..MoveReport::default()
        });
    }

    /// `staged` more records written into the slots nodes gain, `moved` of them from other
    /// shards.
    pub fn staged(&mut self, staged: u64, moved: u64) {
        if let Some(report) = self.report.as_mut() {
            report.staged += staged;
            report.moved += moved;
        }
    }

    /// The move of `change` ended with `outcome`: its report, or why it stopped (the report
    /// so far keeps what it did).
    pub fn ended(&mut self, change: wire::MapChange, outcome: Result<MoveReport, String>) {
        let mut report = match outcome {
            Ok(report) => report,
            Err(error) => {
                let mut report = self.report.take().unwrap_or_default();
                report.error = Some(error);
                report
            }
        };
        report.change = Some(change);
        self.report = Some(report);
    }

    /// The report of the move under way here, or of the last one.
    pub fn report(&self) -> Option<MoveReport> {
        self.report.clone()
    }

    /// A move the cluster record holds (`moving`), for an operator: published and
    /// switching, copying here (how far), or stopped or run by another router.
    pub fn describe(&self, moving: &MapMove) -> String {
        let what = target(moving);
        if moving.switched_at.is_some() {
            return format!("{what}: published, nodes switching");
        }
        match &self.report {
            Some(report) if report.version == moving.to.version && !report.done => {
                let progress = format!(
                    "{what}: {} of {} records copied",
                    report.staged, report.staged_total
                );
                match &report.error {
                    Some(error) => format!("{progress}; stopped: {error}"),
                    None => progress,
                }
            }
            _ => {
                format!("{what}: stopped or run by another router (run the command again to go on)")
            }
        }
    }

    /// Whether this router finishes the switch of the move the record holds (`moving`):
    /// one whose map is published but whose nodes have not all switched (its router died
    /// there), unless a move runs here (that one finishes it).
    pub fn finishes_stopped_switch(&self, moving: Option<&MapMove>) -> bool {
        !self.running() && moving.is_some_and(|m| m.switched_at.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::MapRecord;

    fn moving_to(version: u64, switched_at: Option<u64>) -> MapMove {
        MapMove {
            to: MapRecord {
                version,
                shards: 2,
                extent_records: 4,
                seed: 1,
                replicas: 1,
                changes: vec![MapChange::AddShard; version as usize - 1],
            },
            switched_at,
            switched_lens: Default::default(),
        }
    }

    #[test]
    fn a_move_runs_once_per_change_and_refuses_another_while_it_runs() {
        let mut run = MoveRun::default();
        assert_eq!(run.rate(), wire::MOVE_RATE_DEFAULT);
        assert!(!run.running());
        let add = wire::MapChange::AddShard;
        let drain = wire::MapChange::DrainShard(1);
        assert_eq!(run.start(add, 100), Ok(Start::Run));
        assert!(run.running());
        // The same command again joins it, at its rate.
        assert_eq!(run.start(add, 200), Ok(Start::Joined));
        assert_eq!(run.rate(), 200);
        let refused = run.start(drain, 300).unwrap_err();
        assert!(
            refused.contains("another move (add a shard)") && refused.contains("drain shard 1"),
            "{refused}"
        );
        // Counted as it copies, keeping the change it makes.
        run.copying(2, 1000, 500);
        run.staged(100, 60);
        run.staged(50, 50);
        let report = run.report().unwrap();
        assert_eq!(
            (report.version, report.records, report.staged_total),
            (2, 1000, 500)
        );
        assert_eq!(
            (report.staged, report.moved, report.change),
            (150, 110, Some(add))
        );
        // Stopped: the report keeps what it did; another change may start now.
        run.ended(add, Err("a node died".into()));
        let stopped = run.report().unwrap();
        assert_eq!(stopped.error.as_deref(), Some("a node died"));
        assert_eq!((stopped.staged, stopped.change), (150, Some(add)));
        assert!(!run.running());
        assert_eq!(run.start(drain, 0), Ok(Start::Run));
        run.ended(
            drain,
            Ok(MoveReport {
                version: 3,
                done: true,
                ..MoveReport::default()
            }),
        );
        let done = run.report().unwrap();
        assert!(done.done && done.change == Some(drain));
        assert!(!run.running());
    }

    #[test]
    fn a_recorded_move_reads_as_published_copying_or_stopped() {
        let mut run = MoveRun::default();
        let copying = moving_to(2, None);
        assert!(run
            .describe(&copying)
            .contains("stopped or run by another router"));
        run.start(wire::MapChange::AddShard, 0).unwrap();
        run.copying(2, 10, 8);
        run.staged(3, 3);
        assert_eq!(
            run.describe(&copying),
            "to map version 2 (add a shard): 3 of 8 records copied"
        );
        // Another version than the one copied here: not this router's.
        assert!(run
            .describe(&moving_to(3, None))
            .contains("stopped or run by another router"));
        run.ended(wire::MapChange::AddShard, Err("stopped".into()));
        assert!(run.describe(&copying).ends_with("; stopped: stopped"));
        let published = moving_to(2, Some(10));
        assert_eq!(
            run.describe(&published),
            "to map version 2 (add a shard): published, nodes switching"
        );
    }

    #[test]
    fn a_stopped_switch_is_finished_unless_a_move_runs_here() {
        let mut run = MoveRun::default();
        let published = moving_to(2, Some(10));
        assert!(run.finishes_stopped_switch(Some(&published)));
        assert!(!run.finishes_stopped_switch(Some(&moving_to(2, None))));
        assert!(!run.finishes_stopped_switch(None));
        run.start(wire::MapChange::AddShard, 0).unwrap();
        assert!(!run.finishes_stopped_switch(Some(&published)));
        run.ended(wire::MapChange::AddShard, Err("stopped".into()));
        assert!(run.finishes_stopped_switch(Some(&published)));
    }
}
