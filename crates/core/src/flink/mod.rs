//! Apache Flink's own checkpoints as a source of backends: [`metadata`] reads a
//! `_metadata` file, [`import`] turns a completed checkpoint into backends to import (the
//! engine's side, labels and following a job, is `coordinator/flink.rs`). Nothing writes
//! `_metadata` back for Flink.

pub mod import;
pub mod metadata;
