//! Apache Flink's own checkpoints as a source of backends (issue 20, in progress): the
//! `_metadata` reader ([`metadata`]) comes first; importing, following a running job and
//! giving checkpoints back to Flink build on it.

pub mod import;
pub mod metadata;
