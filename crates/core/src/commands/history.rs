//! `ckptfs du --history`: each operator's and each state's figures over the retained
//! checkpoints, oldest to newest, read off a [`DuReport`] (so counted by du's rules). The
//! daemon's page and `du --svg` draw the same series.
//!
//! An operator's figures are the sums of its subtasks' (`<operator>/<subtask>` backends),
//! and a state's the sums of that state over the operator's subtasks: an object two
//! subtasks both hold counts in each (du counts an object once per backend). A series has
//! one value per checkpoint; a checkpoint without that operator or state gives zeros.

use std::collections::BTreeMap;

use serde::Serialize;

use super::du::{CheckpointUsage, DuReport, Usage};
use crate::catalog::FlinkLabel;

/// The operator of a backend named `<operator>/<subtask>` (the name itself if it has no `/`).
pub fn operator_of(backend: &str) -> &str {
    backend.rsplit_once('/').map_or(backend, |(op, _)| op)
}

impl Usage {
    /// Add `other`'s figures to these.
    pub fn add(&mut self, other: &Usage) {
        self.files += other.files;
        self.bytes += other.bytes;
        self.new += other.new;
        self.shared += other.shared;
        self.exclusive += other.exclusive;
    }
}

/// One retained checkpoint of the history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HistoryCheckpoint {
    /// The checkpoint's id.
    pub id: u64,
    /// When its files were stored, in milliseconds since the Unix epoch.
    pub completed_unix_ms: u64,
    /// The Flink checkpoint it was imported from, if it was.
    pub flink: Option<FlinkLabel>,
    /// Its total (du's `total`: an object in several backends counted once).
    pub total: Usage,
}

/// An operator's figures, one per checkpoint of [`History::checkpoints`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OperatorSeries {
    /// The operator (a Flink uid or operator id, or a hosted backend's operator).
    pub operator: String,
    /// The sums of its subtasks' figures, per checkpoint.
    pub usage: Vec<Usage>,
}

/// A state of an operator, one value per checkpoint of [`History::checkpoints`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StateSeries {
    /// The operator.
    pub operator: String,
    /// The state (du's state: a column family, `(other)` or `?`).
    pub state: String,
    /// The sums of the state's figures over the operator's subtasks, per checkpoint.
    pub usage: Vec<Usage>,
}

/// The history: the checkpoints, oldest first, and the series over them, sorted by
/// operator (then state).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct History {
    /// The retained checkpoints, oldest first.
    pub checkpoints: Vec<HistoryCheckpoint>,
    /// Every operator any of them holds.
    pub operators: Vec<OperatorSeries>,
    /// Every (operator, state) any of them holds.
    pub states: Vec<StateSeries>,
}

/// The sums over each operator's subtasks of one checkpoint: operator -> (its figures,
/// state -> the state's figures).
pub fn by_operator(c: &CheckpointUsage) -> BTreeMap<&str, (Usage, BTreeMap<&str, Usage>)> {
    let mut out: BTreeMap<&str, (Usage, BTreeMap<&str, Usage>)> = BTreeMap::new();
    for b in &c.backends {
        let (usage, states) = out.entry(operator_of(&b.backend)).or_default();
        usage.add(&b.usage);
        for s in &b.states {
            states.entry(s.state.as_str()).or_default().add(&s.usage);
        }
    }
    out
}

/// The history of `report` (every retained checkpoint, as [`super::du::usage`] gives it).
pub fn history(report: &DuReport) -> History {
    let n = report.checkpoints.len();
    let mut operators: BTreeMap<&str, Vec<Usage>> = BTreeMap::new();
    let mut states: BTreeMap<(&str, &str), Vec<Usage>> = BTreeMap::new();
    for (i, c) in report.checkpoints.iter().enumerate() {
        for (operator, (usage, its_states)) in by_operator(c) {
            operators
                .entry(operator)
                .or_insert_with(|| vec![Usage::default(); n])[i] = usage;
            for (state, usage) in its_states {
                states
                    .entry((operator, state))
                    .or_insert_with(|| vec![Usage::default(); n])[i] = usage;
            }
        }
    }
    History {
        checkpoints: report
            .checkpoints
            .iter()
            .map(|c| HistoryCheckpoint {
                id: c.id,
                completed_unix_ms: c.completed_unix_ms,
                flink: c.flink.clone(),
                total: c.total.clone(),
            })
            .collect(),
        operators: operators
            .into_iter()
            .map(|(operator, usage)| OperatorSeries {
                operator: operator.to_string(),
                usage,
            })
            .collect(),
        states: states
            .into_iter()
            .map(|((operator, state), usage)| StateSeries {
                operator: operator.to_string(),
                state: state.to_string(),
                usage,
            })
            .collect(),
    }
}

/// One state of one checkpoint, summed over the operator's subtasks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StateSize {
    /// The operator.
    pub operator: String,
    /// The state.
    pub state: String,
    /// Its figures.
    #[serde(flatten)]
    pub usage: Usage,
}

/// Checkpoint `c`'s states, largest (by bytes) first, ties by operator and state.
pub fn largest_states(c: &CheckpointUsage) -> Vec<StateSize> {
    let mut out: Vec<StateSize> = by_operator(c)
        .into_iter()
        .flat_map(|(operator, (_, states))| {
            states.into_iter().map(move |(state, usage)| StateSize {
                operator: operator.to_string(),
                state: state.to_string(),
                usage,
            })
        })
        .collect();
    out.sort_by(|a, b| {
        b.usage
            .bytes
            .cmp(&a.usage.bytes)
            .then_with(|| (&a.operator, &a.state).cmp(&(&b.operator, &b.state)))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::du::{BackendUsage, StateUsage};

    fn u(bytes: u64) -> Usage {
        Usage {
            files: 1,
            bytes,
            new: bytes / 2,
            shared: bytes - bytes / 2,
            exclusive: 1,
        }
    }

    fn backend(name: &str, states: &[(&str, u64)]) -> BackendUsage {
        let mut usage = Usage::default();
        let states = states
            .iter()
            .map(|(s, b)| {
                usage.add(&u(*b));
                StateUsage {
                    state: s.to_string(),
                    usage: u(*b),
                }
            })
            .collect();
        BackendUsage {
            backend: name.into(),
            name: None,
            usage,
            states,
        }
    }

    fn checkpoint(id: u64, backends: Vec<BackendUsage>) -> CheckpointUsage {
        CheckpointUsage {
            id,
            completed_unix_ms: id,
            flink: None,
            backends,
            operators: Vec::new(),
            total: u(id),
        }
    }

    #[test]
    fn series_sum_subtasks_and_fill_absent_checkpoints_with_zeros() {
        let report = DuReport {
            checkpoints: vec![
                checkpoint(
                    1,
                    vec![
                        backend("op/0", &[("a", 10), ("b", 4)]),
                        backend("op/1", &[("a", 6)]),
                    ],
                ),
                checkpoint(2, vec![backend("x/y/0", &[("a", 8)])]),
            ],
        };
        let h = history(&report);
        assert_eq!(
            h.checkpoints.iter().map(|c| c.id).collect::<Vec<_>>(),
            [1, 2]
        );
        assert_eq!(h.checkpoints[1].total, u(2));
        let ops: Vec<(&str, Vec<u64>)> = h
            .operators
            .iter()
            .map(|o| {
                (
                    o.operator.as_str(),
                    o.usage.iter().map(|u| u.bytes).collect(),
                )
            })
            .collect();
        assert_eq!(ops, [("op", vec![20, 0]), ("x/y", vec![0, 8])]);
        assert_eq!(h.operators[0].usage[0].files, 3);
        let states: Vec<(&str, &str, Vec<u64>)> = h
            .states
            .iter()
            .map(|s| {
                (
                    s.operator.as_str(),
                    s.state.as_str(),
                    s.usage.iter().map(|u| u.bytes).collect(),
                )
            })
            .collect();
        assert_eq!(
            states,
            [
                ("op", "a", vec![16, 0]),
                ("op", "b", vec![4, 0]),
                ("x/y", "a", vec![0, 8])
            ]
        );
        let largest = largest_states(&report.checkpoints[0]);
        let names: Vec<(&str, u64)> = largest
            .iter()
            .map(|s| (s.state.as_str(), s.usage.bytes))
            .collect();
        assert_eq!(names, [("a", 16), ("b", 4)]);
        let json = serde_json::to_value(&h).unwrap();
        assert_eq!(json["states"][0]["usage"][0]["new"], 8);
        assert_eq!(json["operators"][1]["operator"], "x/y");
    }
}
