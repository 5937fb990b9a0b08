//! ckptfs: incremental RocksDB checkpoints in a deduplicated, reference-counted store.
//!
//! The layers, top to bottom: [`coordinator`] runs checkpoints across the hosted
//! [`backend`]s, records them in the [`catalog`], counts references in the [`registry`] and
//! keeps bytes in the [`store`]. [`restore`] and [`fsck`] work on a store without a daemon.
//! [`views`] are the typed JSON pictures the mount shows and the command line reads.

pub mod backend;
pub mod catalog;
pub mod compaction;
pub mod control;
pub mod coordinator;
pub mod daemon;
pub mod error;
pub mod failpoint;
pub mod fs;
pub mod fsck;
pub mod fsutil;
pub mod graph;
pub mod lease;
pub mod lock;
pub mod metrics;
pub mod names;
pub mod percent;
pub mod registry;
pub mod restore;
pub mod store;
pub mod views;
pub mod workload;

pub use backend::{BackendOptions, CheckpointMode, WriteOp};
pub use coordinator::{Engine, EngineConfig, MaterializePolicy, PendingCheckpoint};
pub use error::{Error, Result};
pub use names::BackendName;
