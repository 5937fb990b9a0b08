//! Apache Flink's own checkpoints: [`metadata`] reads a `_metadata` file (and writes it
//! with its files elsewhere), [`import`] turns a completed checkpoint into backends to
//! import (the engine's side, labels and following a job, is `coordinator/flink.rs`;
//! [`plan`] lists the checkpoints of an import and reads each `_metadata` once; [`listing`]
//! is what a follower keeps of Flink's directories between its looks),
//! [`export`] gives an imported checkpoint back to Flink as a checkpoint directory, [`gc`]
//! finds what Flink left behind in its own checkpoint directory.

pub mod export;
pub mod gc;
pub mod import;
pub mod listing;
pub mod metadata;
pub mod plan;

/// A copy of the Flink fixture's job directory (`tests/fixtures/flink/job1`, a real Flink
/// 2.3 job's) at `to`, for tests that change it.
#[cfg(test)]
pub(crate) fn copy_of_fixture(to: &std::path::Path) {
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/flink/job1");
    assert!(std::process::Command::new("cp")
        .arg("-a")
        .arg(&fixture)
        .arg(to)
        .status()
        .unwrap()
        .success());
}

/// `bytes` (a `_metadata`) with every uploaded file named as `file:<dir>/shared/<name>`.
#[cfg(test)]
pub(crate) fn naming_files_in(bytes: &[u8], dir: &std::path::Path) -> Vec<u8> {
    use metadata::{KeyedHandle, StreamHandle};
    let mut paths = Vec::new();
    for op in metadata::parse(bytes).unwrap().operators {
        for subtask in op.subtasks {
            if let Some(KeyedHandle::Incremental(h)) = subtask.managed_keyed {
                for (_, stream) in h.shared.iter().chain(&h.private) {
                    if let StreamHandle::File { at, path, .. } = stream {
                        let name = path.rsplit('/').next().unwrap();
                        paths.push((*at, format!("file:{}/shared/{name}", dir.display())));
                    }
                }
            }
        }
    }
    assert!(!paths.is_empty());
    metadata::with_paths(bytes, paths).unwrap()
}
