//! What a follower of Flink's checkpoints (`mount --flink`) keeps of its listing between
//! looks, so that a look costs a listing of each job's directory and a look into a few of
//! its `chk-N/`, however many it holds.
//!
//! Flink makes `chk-N/` when it triggers checkpoint N and writes its `_metadata` last, as
//! the checkpoint completes; ids only grow, and once a checkpoint completes Flink aborts
//! the older ones still pending. So a `chk-N/` without `_metadata` is in flight only among
//! a job's newest; older ones are failed or aborted checkpoints whose directories Flink
//! left (a crash, a failed delete), which may number thousands. A look therefore looks
//! into every `chk-N/` it has not seen before, and into the newest [`NEWEST_LOOKED`] of
//! each job, for a `_metadata`; an older one seen without it is looked into again in turn,
//! [`OLD_LOOKED`] of them a look. A completed checkpoint's `_metadata` is looked at every
//! look (its size and mtime, what tells a follower it was written again): Flink keeps few.

use std::collections::HashMap;

use crate::error::{ErrorKind, Result};
use crate::source::{join, EntryKind, FileStamp, Tree};

/// The name of a Flink checkpoint's metadata file, in its `chk-N/` directory.
pub const METADATA: &str = "_metadata";

/// `N` of a `chk-N` name.
pub(crate) fn chk_number(name: &str) -> Option<u64> {
    // Digits only, no leading zero: the one spelling Flink writes (`chk-+5` and `chk-05`
    // would parse as 5 and be read as `chk-5/`).
    let n = name.strip_prefix("chk-")?;
    let plain =
        !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && (n == "0" || !n.starts_with('0'));
    plain.then(|| n.parse().ok()).flatten()
}

/// The newest `chk-N/` of a job, by id, looked into at every look: those a checkpoint in
/// flight can be in (Flink's `execution.checkpointing.max-concurrent-checkpoints` is 1 by
/// default).
pub const NEWEST_LOOKED: usize = 16;
/// How many older `chk-N/` seen without `_metadata` a look looks into again, in turn.
pub const OLD_LOOKED: usize = 64;

/// The `chk-N/` of each job directory seen without a `_metadata`, kept from one look to
/// the next. A fresh one (`Listing::default()`) looks into every `chk-N/`, as a one-off
/// import does.
#[derive(Debug, Default)]
pub struct Listing {
    jobs: HashMap<String, JobListing>,
}

#[derive(Debug, Default)]
struct JobListing {
    /// The `chk-N` seen without a `_metadata`, ascending.
    empty: Vec<u64>,
    /// The id of the last old empty one looked into again: the next look goes on after it.
    cursor: u64,
}

impl Listing {
    /// Forget the job directories not in `jobs` (gone from the source).
    pub(crate) fn keep_jobs(&mut self, jobs: &[String]) {
        self.jobs.retain(|dir, _| jobs.contains(dir));
    }

    /// The `chk-N/` of job directory `job_dir` (whose entries are `entries`, as
    /// [`Tree::list_kinds`] gave them) that hold a `_metadata`, by id, each with its
    /// `_metadata`'s stamp (`None` where it is refused: a link, not a regular file; reading
    /// it says why). Apart from those looked into, linear in the entries.
    pub(crate) fn checkpoints(
        &mut self,
        tree: &dyn Tree,
        job_dir: &str,
        entries: &[(String, EntryKind)],
    ) -> Result<Vec<(u64, Option<FileStamp>)>> {
        let mut ids: Vec<u64> = entries
            .iter()
            .filter(|(_, kind)| *kind == EntryKind::Dir)
            .filter_map(|(name, _)| chk_number(name))
            .collect();
        ids.sort_unstable();
        let job = self.jobs.entry(job_dir.to_string()).or_default();
        // Below this id, a chk-N seen empty waits for its turn.
        let newest = ids
            .len()
            .checked_sub(NEWEST_LOOKED)
            .map_or(0, |first| ids[first]);
        let old = &job.empty[..job.empty.partition_point(|id| *id < newest)];
        let mut again: Vec<u64> = Vec::new();
        if !old.is_empty() {
            let from = old.partition_point(|id| *id <= job.cursor);
            again.extend((0..old.len().min(OLD_LOOKED)).map(|i| old[(from + i) % old.len()]));
            job.cursor = *again.last().expect("at least one");
            again.sort_unstable();
        }
        let mut empty = Vec::with_capacity(job.empty.len());
        let mut known = job.empty.iter().peekable();
        let mut out = Vec::new();
        for id in ids {
            while known.next_if(|k| **k < id).is_some() {}
            let seen_empty = known.next_if_eq(&&id).is_some();
            if id < newest && seen_empty && again.binary_search(&id).is_err() {
                empty.push(id);
                continue;
            }
            match tree.stamp(&join(job_dir, &format!("chk-{id}/{METADATA}"))) {
                Ok(None) => empty.push(id),
                Ok(Some(stamp)) => out.push((id, Some(stamp))),
                Err(e) if e.kind() == ErrorKind::Refused => out.push((id, None)),
                Err(e) => return Err(e),
            }
        }
        job.empty = empty;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::counting::CountingTree;

    /// A look: the ids found, and how many files it looked at.
    fn look(listing: &mut Listing, tree: &CountingTree) -> (Vec<u64>, u64) {
        let before = tree.counts().0;
        let entries = tree.list_kinds("").unwrap();
        let ids = listing
            .checkpoints(tree, "", &entries)
            .unwrap()
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        (ids, tree.counts().0 - before)
    }

    /// 20,000 `chk-N/` without `_metadata` (failed and aborted checkpoints) and a few
    /// completed ones: the first look looks into each, later ones into the newest, the
    /// completed ones and 64 of the old empty ones in turn; a checkpoint that completes is
    /// found at the next look if it is among the newest or new, within a round of the old
    /// ones otherwise.
    #[test]
    fn a_look_into_many_empty_checkpoint_directories_costs_a_listing() {
        let dir = tempfile::tempdir().unwrap();
        let job = dir.path();
        for n in 1..=20_000u64 {
            std::fs::create_dir(job.join(format!("chk-{n}"))).unwrap();
        }
        for n in [10, 19_990] {
            std::fs::write(job.join(format!("chk-{n}/{METADATA}")), b"m").unwrap();
        }
        std::fs::create_dir(job.join("shared")).unwrap();
        let tree = CountingTree::open(job);
        let mut listing = Listing::default();
        assert_eq!(look(&mut listing, &tree), (vec![10, 19_990], 20_000));
        let bound = (NEWEST_LOOKED + OLD_LOOKED + 1) as u64;
        for _ in 0..5 {
            let (ids, stamps) = look(&mut listing, &tree);
            assert_eq!(ids, [10, 19_990]);
            assert!(stamps <= bound, "{stamps} files looked at");
        }
        // The newest completes: found at once.
        std::fs::write(job.join(format!("chk-20000/{METADATA}")), b"m").unwrap();
        let (ids, stamps) = look(&mut listing, &tree);
        assert_eq!(ids, [10, 19_990, 20_000]);
        assert!(stamps <= bound, "{stamps} files looked at");
        // A new one, made since the last look: looked into at once, whatever its id.
        std::fs::create_dir(job.join("chk-0")).unwrap();
        std::fs::write(job.join(format!("chk-0/{METADATA}")), b"m").unwrap();
        assert_eq!(look(&mut listing, &tree).0, [0, 10, 19_990, 20_000]);
        // An old one that completes is found within a round of the old ones.
        std::fs::write(job.join(format!("chk-5000/{METADATA}")), b"m").unwrap();
        let round = 20_000 / OLD_LOOKED + 1;
        let mut looks = 0;
        while !look(&mut listing, &tree).0.contains(&5000) {
            looks += 1;
            assert!(looks <= round, "not found in {looks} looks");
        }
        // Gone from the directory: forgotten.
        assert!(listing.jobs[""].empty.contains(&7));
        std::fs::remove_dir(job.join("chk-7")).unwrap();
        look(&mut listing, &tree);
        assert!(!listing.jobs[""].empty.contains(&7));
        assert!(listing.jobs[""].empty.windows(2).all(|w| w[0] < w[1]));
    }
}
