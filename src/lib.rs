//! ckptfs: the product around the engine (`ckptfs-core`): the mounted tree ([`fs`], with
//! fuser only in `fs/fuse.rs`), the control protocol ([`control`]), the daemon that serves
//! a mount or a store and its periodic tasks ([`daemon`]), its HTTP endpoints ([`http`]):
//! the metrics ([`metrics_http`]) with the page ([`page`]), and the S3 door ([`s3door`]);
//! the backoff for busy answers ([`retry`]). The command line is the binary: `main.rs`
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
