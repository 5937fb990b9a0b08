//! ckptfs: the product around the engine (`ckptfs-core`): the mounted tree ([`fs`], with
//! fuser only in `fs/fuse.rs`), the control protocol ([`control`]), the daemon that serves
//! a mount and its periodic tasks ([`daemon`]), its metrics endpoint ([`metrics_http`]), the
//! page it serves ([`page`]) and the backoff for busy answers ([`retry`]). The command line is the binary: `main.rs`
//! over `cli/`, `client/` and `commands/`.

pub mod control;
pub mod daemon;
pub mod fs;
pub mod http;
pub mod metrics_http;
pub mod page;
pub mod retry;
pub mod s3door;
pub mod units;
