//! The plan of a Flink import: the completed checkpoints of a source listed once
//! ([`completed`]), and each one's `_metadata` read once, for the engine
//! ([`crate::Engine::import_flink`]) and both callers of `import-flink` (the command line
//! and a daemon's control line) to share.
//!
//! - `import-flink` once ([`Plan::checked`]) reads every `_metadata`, parses it and checks
//!   its layout before the store is touched, so that a bad one is refused with nothing
//!   imported. What it checked is what is imported: the bytes read are kept, and the
//!   import parses those, never a later version of the file. They are kept within
//!   [`MAX_HELD_BYTES`] in all (a root of many jobs); beyond, a checkpoint keeps only their
//!   BLAKE3 hash and is read again when imported, refused unless the bytes are the same.
//! - A follower's look ([`Plan::listed`]) reads a `_metadata` only when it imports its
//!   checkpoint (most looks import nothing).
//!
//! Either way each [`Completed`] keeps the stamp (size, mtime) the listing saw before its
//! file was read: what tells a follower that Flink wrote the file again.

use std::borrow::Cow;

use super::import::{completed, layout, Completed, FlinkSource};
use super::metadata;
use crate::error::{Error, Result};

/// The most bytes of `_metadata` a [`Plan::checked`] keeps between its check and the
/// import (4 jobs' worth of large checkpoints; the fixture job's are 20 KiB each).
pub const MAX_HELD_BYTES: u64 = 64 << 20;

/// The completed checkpoints an import goes through, in order ([`completed`]), each with
/// its `_metadata` as read, where it was.
pub struct Plan {
    checkpoints: Vec<Planned>,
}

/// One completed checkpoint of a [`Plan`].
pub struct Planned {
    /// Where it is and what the listing saw of its `_metadata`.
    pub completed: Completed,
    read: Read,
}

/// What a plan keeps of a checkpoint's `_metadata`.
enum Read {
    /// Not read yet (a follower's look): read when imported.
    Unread,
    /// Read and checked: the bytes imported.
    Held(Vec<u8>),
    /// Read and checked, then let go (past [`MAX_HELD_BYTES`]): the hash of the bytes
    /// checked, which the bytes read again at the import must have.
    Hashed(blake3::Hash),
}

impl Plan {
    /// The plan of `import-flink` once: every completed checkpoint of `src`, each
    /// `_metadata` read, parsed and its layout checked ([`layout`]), so that a bad one is
    /// refused before the store is touched.
    pub fn checked(src: &FlinkSource) -> Result<Plan> {
        Self::checked_holding(src, MAX_HELD_BYTES)
    }

    /// [`Plan::checked`], keeping at most `limit` bytes of `_metadata`.
    fn checked_holding(src: &FlinkSource, limit: u64) -> Result<Plan> {
        let mut held = 0u64;
        let mut checkpoints = Vec::new();
        for completed in completed(src)? {
            let bytes = completed.read_metadata()?;
            check(&completed, &bytes)?;
            let size = bytes.len() as u64;
            let read = if held.saturating_add(size) <= limit {
                held += size;
                Read::Held(bytes)
            } else {
                Read::Hashed(blake3::hash(&bytes))
            };
            checkpoints.push(Planned { completed, read });
        }
        Ok(Plan { checkpoints })
    }

    /// The plan of a follower's look: the checkpoints listed, none read yet.
    pub fn listed(completed: Vec<Completed>) -> Plan {
        Plan {
            checkpoints: completed.into_iter().map(Planned::listed).collect(),
        }
    }

    /// Its checkpoints, in the order they are imported.
    pub fn checkpoints(&self) -> &[Planned] {
        &self.checkpoints
    }
}

impl Planned {
    /// A checkpoint as listed, its `_metadata` read when imported.
    pub fn listed(completed: Completed) -> Planned {
        Planned {
            completed,
            read: Read::Unread,
        }
    }

    /// The `_metadata` to import: the bytes checked, or read now (a follower's, or one let
    /// go past [`MAX_HELD_BYTES`]: refused unless the bytes checked).
    pub fn metadata(&self) -> Result<Cow<'_, [u8]>> {
        match &self.read {
            Read::Held(bytes) => Ok(Cow::Borrowed(bytes)),
            Read::Unread => Ok(Cow::Owned(self.completed.read_metadata()?)),
            Read::Hashed(checked) => {
                let bytes = self.completed.read_metadata()?;
                if blake3::hash(&bytes) != *checked {
                    return Err(Error::Invalid(format!(
                        "{} changed after it was checked; not imported (import again)",
                        self.completed
                            .source
                            .tree()
                            .show(&self.completed.metadata_path())
                    )));
                }
                Ok(Cow::Owned(bytes))
            }
        }
    }
}

/// Refuse a checkpoint whose `_metadata` (`bytes`) does not parse or has a layout ckptfs
/// does not import, naming it.
fn check(completed: &Completed, bytes: &[u8]) -> Result<()> {
    metadata::parse(bytes)
        .and_then(|parsed| layout(&parsed).map(drop))
        .map_err(|e| {
            Error::Invalid(format!(
                "Flink checkpoint {} of {}: {e}; nothing was imported",
                completed.checkpoint,
                completed.location()
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flink::import::{job_backend, METADATA};
    use crate::source::counting::CountingTree;
    use crate::store::ObjectId;
    use crate::{Engine, EngineConfig};
    use std::sync::Arc;

    const JOB: &str = "a312c9034e3e0d2016dae60431b4c9dc";

    /// The object holding the `_metadata` of each Flink checkpoint the engine holds.
    fn stored_metadata(engine: &Engine) -> Vec<(u64, ObjectId)> {
        engine
            .checkpoints()
            .iter()
            .map(|m| {
                let file = m
                    .backend(&job_backend())
                    .and_then(|b| b.files.iter().find(|f| f.name == METADATA))
                    .expect("a _metadata");
                (m.flink.as_ref().unwrap().checkpoint, file.object)
            })
            .collect()
    }

    /// `import-flink` once reads each `_metadata` once (it read each twice: to check it,
    /// then to import it), and imports the bytes it checked: a `_metadata` written again
    /// after the check (here into bytes that are no `_metadata`) is neither read again nor
    /// imported.
    #[test]
    fn each_metadata_is_read_once_and_imported_as_checked() {
        let dir = tempfile::tempdir().unwrap();
        let job = dir.path().join(JOB);
        crate::flink::copy_of_fixture(&job);
        let tree = Arc::new(CountingTree::open(&job));
        let plan = Plan::checked(&FlinkSource::of_tree(tree.clone())).unwrap();
        assert_eq!(tree.counts().1, 3);
        let metadata = job.join("chk-6").join(METADATA);
        let checked = std::fs::read(&metadata).unwrap();
        std::fs::write(&metadata, b"written again").unwrap();

        let engine = Engine::open(EngineConfig::new(dir.path().join("store"))).unwrap();
        let imported = engine.import_flink(&plan);
        assert!(imported.iter().all(|i| i.result.is_ok()));
        assert_eq!(tree.counts().1, 3, "a _metadata was read again");
        let stored = stored_metadata(&engine);
        assert_eq!(
            stored.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            [4, 5, 6]
        );
        assert_eq!(stored[2].1, ObjectId::from_hash(blake3::hash(&checked)));
    }

    /// Past the bytes a plan keeps, a checkpoint's `_metadata` is let go after the check
    /// and read again when imported: imported when it is the same, refused (EINVAL, naming
    /// the file) when it was written again since.
    #[test]
    fn past_its_limit_a_plan_reads_again_and_refuses_a_metadata_written_since() {
        let dir = tempfile::tempdir().unwrap();
        let job = dir.path().join(JOB);
        crate::flink::copy_of_fixture(&job);
        let metadata_of = |n: u64| job.join(format!("chk-{n}")).join(METADATA);
        let tree = Arc::new(CountingTree::open(&job));
        let limit = std::fs::metadata(metadata_of(4)).unwrap().len();
        let plan = Plan::checked_holding(&FlinkSource::of_tree(tree.clone()), limit).unwrap();
        assert_eq!(tree.counts().1, 3);
        let mut again = std::fs::read(metadata_of(6)).unwrap();
        again.push(0);
        std::fs::write(metadata_of(6), &again).unwrap();

        let engine = Engine::open(EngineConfig::new(dir.path().join("store"))).unwrap();
        let imported = engine.import_flink(&plan);
        let results: Vec<(u64, bool)> = imported
            .iter()
            .map(|i| (i.checkpoint, i.result.is_ok()))
            .collect();
        assert_eq!(results, [(4, true), (5, true), (6, false)]);
        let e = imported[2].result.as_ref().err().unwrap();
        assert_eq!(e.errno(), libc::EINVAL);
        assert!(
            e.to_string()
                .contains("chk-6/_metadata changed after it was checked"),
            "{e}"
        );
        // Checkpoints 5 and 6 read again, 4 not.
        assert_eq!(tree.counts().1, 5);
        assert_eq!(stored_metadata(&engine).len(), 2);
    }
}
