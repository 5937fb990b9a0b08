//! ckptfs: the product around the engine (`ckptfs-core`): the mounted tree ([`fs`], with
//! fuser only in `fs/fuse.rs`), the control protocol ([`control`]), the daemon that serves
//! a mount ([`daemon`]) and its metrics endpoint ([`metrics_http`]). The command line is
//! `main.rs` and `client.rs`.

pub mod control;
pub mod daemon;
pub mod fs;
pub mod metrics_http;
