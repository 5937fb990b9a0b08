//! Apache Flink's own checkpoints: [`metadata`] reads a `_metadata` file (and writes it
//! with its files elsewhere), [`import`] turns a completed checkpoint into backends to
//! import (the engine's side, labels and following a job, is `coordinator/flink.rs`;
//! [`listing`] is what a follower keeps of Flink's directories between its looks),
//! [`export`] gives an imported checkpoint back to Flink as a checkpoint directory, [`gc`]
//! finds what Flink left behind in its own checkpoint directory.

pub mod export;
pub mod gc;
pub mod import;
pub mod listing;
pub mod metadata;
