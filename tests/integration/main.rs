//! The integration tests of ckptfs, one binary with a module per subject (one link of
//! RocksDB instead of one per file). Everything here is real: RocksDB instances, store
//! directories, FUSE mounts (root and /dev/fuse are required, here and in CI), an S3 server
//! (moto_server on 127.0.0.1), Debian's ldb and the Python binding rocksdict.
//!
//! One subject: `cargo test --features failpoints --test integration mount::`.

mod common;

mod checkpoints;
mod cli;
mod control;
mod corruption;
mod crash;
mod daemon;
mod diff;
mod du;
mod fencing;
mod flink;
mod flink_export;
mod flink_gc;
mod flink_job_id;
mod flink_mount;
mod flink_roots;
mod import;
mod metrics;
mod model;
mod mount;
mod object_storage;
mod page;
mod policy;
mod restore;
mod s3door;
mod scale;
mod serve;
mod store_safety;
#[cfg(feature = "failpoints")]
mod torture;
mod untrusted;
mod wal_mode;
