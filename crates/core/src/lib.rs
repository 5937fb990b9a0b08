//! ckptfs-core: the engine of ckptfs, with no mount, no command line and no terminal in it.
//!
//! The layers, top to bottom: [`coordinator`] runs checkpoints across the hosted
//! [`backend`]s, records them in the [`catalog`], counts references in the [`registry`] and
//! keeps bytes in the [`store`]; a store is opened (as its writer, a reader or a follower)
//! by [`repo`], and on object storage one writer at a time holds the [`lease`]. The
//! [`commands`] (restore, fsck, graph, export-flink) work on a store without a daemon.
//! [`views`] are the typed pictures of a store the mount shows and the command line reads;
//! [`metrics`] renders the engine's counters for Prometheus. The product around it (the
//! FUSE tree, the control protocol, the daemon, the command line) is the `ckptfs` crate.

pub mod backend;
pub mod catalog;
pub mod commands;
pub mod compaction;
pub mod coordinator;
pub mod error;
pub mod failpoint;
pub mod flink;
pub mod fsutil;
pub mod import;
pub mod lease;
pub mod lock;
pub mod metrics;
pub mod names;
pub mod percent;
pub mod policy;
pub mod registry;
pub mod repo;
pub mod source;
pub mod store;
pub mod views;
pub mod workload;

pub use backend::{BackendOptions, CheckpointMode, WriteOp};
pub use coordinator::{CheckpointPlan, Engine, EngineConfig, MaterializePolicy, PendingCheckpoint};
pub use error::{Error, ErrorKind, Result};
pub use names::BackendName;
