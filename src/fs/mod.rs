//! The mounted tree as plain Rust. The FUSE operations are in one place, `ops.rs`
//! ([`CkptFs`]), over the tree's typed parts: the inode table (`inode.rs`, with the `flink/`
//! subtree in `flink_names.rs`, `pinned/` in `pinned.rs` and checkpoint trees in `tree.rs`) and the open handles
//! (`handles.rs`, with the control stream in `control_stream.rs` and the registry view in
//! `registry_view.rs`); what they all show is in `attr.rs`, the engine behind them in
//! `seam.rs`. No fuser types here but in `fuse.rs`, the thin adapter, so everything is
//! testable without a mount. The generated files' content is typed in
//! [`ckptfs_core::views`].
//!
//! ```text
//! /                       root (ino 1)
//! ├── .ckptfs/            ino 2
//! │   ├── ctl             ino 3, 0600: control commands in, JSON answers out
//! │   ├── status          ino 4, 0444: JSON picture of the daemon
//! │   ├── registry        ino 5, 0444: JSON lines, one per stored object
//! │   ├── checkpoints     ino 7, 0444: JSON lines, one per retained checkpoint
//! │   └── metrics         ino 8, 0444: the daemon's metrics for Prometheus (metrics.rs)
//! ├── latest -> cp-N      ino 6
//! ├── pinned/             ino 9
//! │   └── NAME -> ../cp-N ino 2^24 + k, one per pin (`ckptfs pin`)
//! ├── flink/              ino 1<<30, while a Flink checkpoint is retained (flink_names.rs)
//! │   └── <job-id>/chk-<N> -> ../../cp-M
//! └── cp-N/               ino N<<32, one per retained checkpoint (see tree.rs)
//! ```

mod attr;
mod control_stream;
#[cfg(test)]
pub(crate) mod double;
pub(crate) mod flink_names;
pub mod fuse;
mod handles;
mod inode;
mod ops;
mod pinned;
mod registry_view;
pub mod seam;
pub mod tree;

pub use attr::{
    Attr, DirEntry, Invalidator, Kind, CHECKPOINTS, CTL, LATEST, META_DIR, METRICS, PINNED,
    PIN_LINKS, REGISTRY, ROOT, STATUS,
};
pub use control_stream::{ReadCallback, MAX_LINE, MAX_UNREAD_ANSWERS};
pub use inode::{parse_checkpoint_dir, DirCache, TREE_CACHE};
pub use ops::{CkptFs, OpenedAs};
