//! Flink's own names in the tree: `flink/<job-id>/chk-<N> -> ../../cp-M` for every retained
//! checkpoint imported from a Flink checkpoint (its manifest's [`FlinkLabel`] names the job
//! and `N`), so that Flink's checkpoint 1234 is found without reading JSON.
//!
//! ```text
//! flink/                      ino FLINK (1<<30), only while a Flink checkpoint is retained
//! └── <job-id>/               ino FLINK + 1 + k, k the job's number in this daemon
//!     └── chk-<N> -> ../../cp-M   ino LINKS | M
//! ```
//!
//! The picture is built from the retained manifests once per change of the set of
//! checkpoints (the root's generation) and the kernel is told to forget what went away.
//! `flink/` is absent (not an empty directory) while no Flink checkpoint is retained, so a
//! mount of a store that never imported one looks as before. The same Flink checkpoint held
//! twice (imported, rolled back, imported again) links to the newest ckptfs checkpoint. A
//! job restored under the same job id (a later line, whose ids go on from the restored
//! checkpoint's) shows its latest line: `chk-N` is what Flink's `chk-N` last was, and the
//! earlier line's checkpoints it superseded keep their `cp-M` only ([`latest_line`]).
//! Nothing here is writable: the links go when their checkpoints are dropped (`rmdir
//! cp-M`, retention).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::attr::{Attr, DirEntry, Invalidator, Kind, Owner, ROOT};
use super::seam::Checkpoints;
use ckptfs_core::catalog::Manifest;
use ckptfs_core::error::{Error, Result};
use ckptfs_core::fsutil::lock;

/// `flink/` in the mount's root.
pub const FLINK_DIR_NAME: &str = "flink";
/// The inode of `flink/`. Inodes below 1<<32 are the tree's own (a checkpoint's are
/// `N << 32 | index`); the flink subtree takes [1<<30, 1<<32).
pub const FLINK: u64 = 1 << 30;
/// The first inode of a job's directory (`FLINK + 1 + k`).
const JOBS: u64 = FLINK + 1;
/// The inodes of the links: `LINKS | M` links to `cp-M` (M < 2^31, as for every `cp-N`).
const LINKS: u64 = 1 << 31;

/// What `flink/` shows, as the retained checkpoints were at one generation.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Picture {
    /// By job: by Flink checkpoint id, the ckptfs checkpoint and its completion time (ms).
    jobs: BTreeMap<String, BTreeMap<u64, (u64, u64)>>,
    /// By ckptfs checkpoint linked to: the job and Flink checkpoint.
    by_cp: BTreeMap<u64, (String, u64)>,
}

impl Picture {
    /// The picture of `manifests` (oldest first: a later one holding the same Flink
    /// checkpoint wins), each job's latest line only ([`latest_line`]).
    pub(crate) fn of(manifests: &[Arc<Manifest>]) -> Picture {
        let mut jobs: BTreeMap<String, BTreeMap<u64, (u64, u64)>> = BTreeMap::new();
        let mut written: HashMap<u64, u64> = HashMap::new();
        for m in manifests {
            let Some(label) = &m.flink else { continue };
            if !is_entry_name(&label.job) || m.id >= 1 << 31 {
                continue;
            }
            if let Some(t) = label.time_unix_ms {
                written.insert(m.id, t);
            }
            jobs.entry(label.job.clone())
                .or_default()
                .insert(label.checkpoint, (m.id, m.completed_unix_ms));
        }
        for chks in jobs.values_mut() {
            latest_line(chks, &written);
        }
        let by_cp = jobs
            .iter()
            .flat_map(|(job, chks)| {
                chks.iter()
                    .map(move |(n, (cp, _))| (*cp, (job.clone(), *n)))
            })
            .collect();
        Picture { jobs, by_cp }
    }

    fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// The (job, Flink checkpoint) pairs this picture links to `cp-M`.
    pub(crate) fn pairs(&self) -> impl Iterator<Item = (&str, u64, u64)> {
        self.jobs
            .iter()
            .flat_map(|(job, chks)| chks.iter().map(move |(n, (cp, _))| (job.as_str(), *n, *cp)))
    }
}

/// Keep of one job's checkpoints (Flink id -> ckptfs checkpoint, ...) those of its latest
/// line: a job restored under the same job id writes checkpoints with ids going on from
/// the restored one's, so a checkpoint whose `_metadata` Flink wrote after that of one with
/// a higher id supersedes it (and every higher id of the earlier line): `chk-N` then names
/// what Flink's `chk-N` last was, and the ids below the restored one, the later line's own
/// history, stay. `written` is each checkpoint's Flink time (ms); one without it (imported
/// by a build that did not record it) supersedes nothing and is superseded by nothing.
/// Linear in the job's checkpoints after their sort.
fn latest_line(chks: &mut BTreeMap<u64, (u64, u64)>, written: &HashMap<u64, u64>) {
    // From the highest id down: a checkpoint is superseded when one with a lower id was
    // written later, i.e. when its time is below the latest time of the lower ids.
    let times: Vec<(u64, Option<u64>)> = chks
        .iter()
        .map(|(n, (cp, _))| (*n, written.get(cp).copied()))
        .collect();
    let mut latest_below = Vec::with_capacity(times.len());
    let mut latest: Option<u64> = None;
    for (_, t) in &times {
        latest_below.push(latest);
        latest = latest.max(*t);
    }
    for ((n, t), below) in times.iter().zip(latest_below) {
        if matches!((t, below), (Some(t), Some(b)) if b > *t) {
            chks.remove(n);
        }
    }
}

/// A name a directory entry may have (a job's name in a label comes from the store).
fn is_entry_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name.len() <= 255
        && !name.contains('/')
        && !name.contains('\0')
}

/// `chk-N` with N in canonical decimal, as Flink names its directories.
pub(crate) fn parse_chk(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("chk-")?;
    let canonical = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'));
    canonical.then(|| digits.parse().ok()).flatten()
}

/// The link text of `cp-M` from `flink/<job>/`.
fn target(cp: u64) -> String {
    format!("../../cp-{cp}")
}

/// What the subtree remembers: the picture of the current generation, the last one the
/// kernel was told about, and the job numbers (stable for the daemon's life: a job's inode
/// does not change while it is shown).
#[derive(Default)]
struct Seen {
    picture: Option<(u64, Arc<Picture>)>,
    /// The picture at the last [`FlinkNames::changed`] (or the first one built): what the
    /// kernel may hold entries of.
    told: Option<Arc<Picture>>,
    job_numbers: HashMap<String, u64>,
    jobs: Vec<String>,
}

impl Seen {
    fn job_ino(&mut self, job: &str) -> u64 {
        if let Some(k) = self.job_numbers.get(job) {
            return JOBS + k;
        }
        let k = self.jobs.len() as u64;
        self.jobs.push(job.to_string());
        self.job_numbers.insert(job.to_string(), k);
        JOBS + k
    }

    fn job_of(&self, ino: u64) -> Option<String> {
        let k = ino.checked_sub(JOBS)?;
        self.jobs.get(usize::try_from(k).ok()?).cloned()
    }
}

/// Whether `ino` is in the flink subtree (`flink/`, a job's directory, a link).
pub(super) fn is_flink_ino(ino: u64) -> bool {
    (FLINK..1 << 32).contains(&ino)
}

/// Whether `ino` is a directory of the flink subtree.
pub(super) fn is_flink_dir(ino: u64) -> bool {
    (FLINK..LINKS).contains(&ino)
}

/// The `flink/` subtree, a part of the inode table ([`super::inode::Inodes`]): its
/// operations take the table's generation (bumped whenever the set of checkpoints
/// changes), from which the picture is rebuilt.
pub(super) struct FlinkNames {
    checkpoints: Arc<dyn Checkpoints>,
    owner: Owner,
    seen: Mutex<Seen>,
}

impl FlinkNames {
    /// The subtree over `checkpoints`, its entries owned by `owner`.
    pub(super) fn new(checkpoints: Arc<dyn Checkpoints>, owner: Owner) -> Self {
        FlinkNames {
            checkpoints,
            owner,
            seen: Mutex::default(),
        }
    }

    /// The picture of `generation`, built if the set of checkpoints changed.
    fn picture(&self, generation: u64) -> Arc<Picture> {
        if let Some((at, picture)) = &lock(&self.seen).picture {
            if *at == generation {
                return picture.clone();
            }
        }
        let picture = Arc::new(Picture::of(&self.checkpoints.checkpoints()));
        let mut seen = lock(&self.seen);
        seen.picture = Some((generation, picture.clone()));
        seen.told.get_or_insert_with(|| picture.clone());
        picture
    }

    /// Whether the root shows `flink/` now.
    pub(super) fn shown(&self, generation: u64) -> bool {
        !self.picture(generation).is_empty()
    }

    /// The root's `flink` entry, if shown.
    pub(super) fn root_entry(&self, generation: u64) -> Result<Option<DirEntry>> {
        if !self.shown(generation) {
            return Ok(None);
        }
        Ok(Some(DirEntry {
            name: FLINK_DIR_NAME.into(),
            attr: self.getattr(generation, FLINK)?,
        }))
    }

    /// `stat` of an inode of the subtree.
    pub(super) fn getattr(&self, generation: u64, ino: u64) -> Result<Attr> {
        let picture = self.picture(generation);
        let gone = || Error::NotFound(format!("inode {ino}"));
        if ino == FLINK {
            if picture.is_empty() {
                return Err(Error::NotFound("no Flink checkpoint is retained".into()));
            }
            let nlink = 2 + picture.jobs.len() as u32;
            return Ok(self.owner.fixed(FLINK, Kind::Dir, 0, 0o555, nlink));
        }
        if ino >= LINKS {
            let cp = ino - LINKS;
            let (_, _, completed) = self.link(&picture, cp).ok_or_else(gone)?;
            let len = target(cp).len() as u64;
            return Ok(self
                .owner
                .attr(ino, Kind::Symlink, len, 0o777, 1, ms(completed)));
        }
        let job = lock(&self.seen).job_of(ino).ok_or_else(gone)?;
        let chks = picture.jobs.get(&job).ok_or_else(gone)?;
        let newest = chks.values().map(|(_, at)| *at).max().unwrap_or(0);
        Ok(self.owner.attr(ino, Kind::Dir, 0, 0o555, 2, ms(newest)))
    }

    /// The job and Flink checkpoint linking to `cp-M`, and its time, if `cp-M` is retained
    /// with that label (a picture may be a moment old).
    fn link(&self, picture: &Picture, cp: u64) -> Option<(String, u64, u64)> {
        let (job, n) = picture.by_cp.get(&cp)?;
        let manifest = self.checkpoints.manifest(cp)?;
        let label = manifest.flink.as_ref()?;
        (label.job == *job && label.checkpoint == *n)
            .then(|| (job.clone(), *n, manifest.completed_unix_ms))
    }

    /// The entry `name` of directory `parent` of the subtree.
    pub(super) fn lookup(&self, generation: u64, parent: u64, name: &str) -> Result<Attr> {
        let missing = || Error::NotFound(name.to_string());
        let picture = self.picture(generation);
        if parent == FLINK {
            if !picture.jobs.contains_key(name) {
                return Err(missing());
            }
            let ino = lock(&self.seen).job_ino(name);
            return self.getattr(generation, ino);
        }
        let job = lock(&self.seen).job_of(parent).ok_or_else(missing)?;
        let n = parse_chk(name).ok_or_else(missing)?;
        let (cp, _) = picture
            .jobs
            .get(&job)
            .and_then(|chks| chks.get(&n))
            .ok_or_else(missing)?;
        self.getattr(generation, LINKS | cp)
    }

    /// The entries of a directory of the subtree: the jobs by name, a job's links by
    /// Flink's checkpoint id.
    pub(super) fn readdir(&self, generation: u64, ino: u64) -> Result<Vec<DirEntry>> {
        let picture = self.picture(generation);
        if ino == FLINK {
            let mut out = Vec::new();
            for job in picture.jobs.keys() {
                let ino = lock(&self.seen).job_ino(job);
                if let Ok(attr) = self.getattr(generation, ino) {
                    out.push(DirEntry {
                        name: job.clone(),
                        attr,
                    });
                }
            }
            return Ok(out);
        }
        let job = lock(&self.seen)
            .job_of(ino)
            .ok_or_else(|| Error::NotFound(format!("inode {ino}")))?;
        let chks = picture
            .jobs
            .get(&job)
            .ok_or_else(|| Error::NotFound(format!("inode {ino}")))?;
        Ok(chks
            .iter()
            .map(|(n, (cp, completed))| DirEntry {
                name: format!("chk-{n}"),
                attr: self.owner.attr(
                    LINKS | cp,
                    Kind::Symlink,
                    target(*cp).len() as u64,
                    0o777,
                    1,
                    ms(*completed),
                ),
            })
            .collect())
    }

    /// The parent of a directory of the subtree.
    pub(super) fn parent(ino: u64) -> u64 {
        if ino == FLINK {
            ROOT
        } else {
            FLINK
        }
    }

    /// The target of a link of the subtree: `../../cp-M`.
    pub(super) fn readlink(&self, generation: u64, ino: u64) -> Result<String> {
        let cp = ino
            .checked_sub(LINKS)
            .ok_or_else(|| Error::Invalid("not a symbolic link".into()))?;
        self.link(&self.picture(generation), cp)
            .ok_or_else(|| Error::NotFound(format!("cp-{cp}")))?;
        Ok(target(cp))
    }

    /// After the set of checkpoints changed (the generation was bumped to `generation`):
    /// take the new picture and have the kernel forget the links, jobs and `flink/` that
    /// went away (told with no lock held: the kernel may wait for a lookup that needs one).
    pub(super) fn changed(&self, generation: u64, invalidator: Option<&Arc<dyn Invalidator>>) {
        let now = self.picture(generation);
        let (mut entries, mut inodes) = (Vec::new(), Vec::new());
        {
            let mut seen = lock(&self.seen);
            let before = seen.told.replace(now.clone());
            let Some(before) = before.filter(|b| **b != *now) else {
                return;
            };
            for (job, n, cp) in before.pairs() {
                let kept = now.jobs.get(job).and_then(|c| c.get(&n)).map(|(c, _)| *c);
                if kept != Some(cp) {
                    entries.push((seen.job_ino(job), format!("chk-{n}")));
                    inodes.push(LINKS | cp);
                }
            }
            for job in before.jobs.keys().chain(now.jobs.keys()) {
                if !now.jobs.contains_key(job) {
                    entries.push((FLINK, job.clone()));
                }
                inodes.push(seen.job_ino(job));
            }
        }
        if now.is_empty() {
            entries.push((ROOT, FLINK_DIR_NAME.to_string()));
        }
        inodes.push(FLINK);
        if let Some(inv) = invalidator {
            for (parent, name) in &entries {
                inv.entry(*parent, name);
            }
            for ino in inodes {
                inv.inode(ino);
            }
        }
    }
}

fn ms(unix_ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(unix_ms)
}

#[cfg(test)]
mod tests {
    use super::super::double::Double;
    use super::super::DirCache;
    use super::*;

    /// A double holding checkpoints 1..=5: 1 hosted, 2 and 3 Flink's chk-7 and chk-8 of job
    /// A, 4 Flink's chk-9 of job B (restored from A), 5 hosted.
    fn double() -> Arc<Double> {
        let double = Double::with_checkpoints(5);
        double.label(2, "a".repeat(32).as_str(), 7);
        double.label(3, "a".repeat(32).as_str(), 8);
        double.label(4, "b".repeat(32).as_str(), 9);
        double
    }

    /// A job's first line, Flink's chk-1..6 as cp-1..6, and a later line restored from
    /// chk-3 under the same job id, its chk-4 and chk-5 as cp-7 and cp-8: `chk-N` names the
    /// later line's 4 and 5 and the history below them; the first line's 5 (replaced) and 6
    /// (superseded) keep their cp-M only. Without Flink's times nothing is superseded.
    #[test]
    fn a_later_line_of_a_job_supersedes_the_ids_it_went_on_from() {
        let line = |with_times: bool| {
            let (mut chks, mut written) = (BTreeMap::new(), HashMap::new());
            for (n, cp) in (1..=6).map(|n| (n, n)).chain([(4, 7), (5, 8)]) {
                chks.insert(n, (cp, 0));
                if with_times {
                    written.insert(cp, cp * 10);
                }
            }
            latest_line(&mut chks, &written);
            chks.iter()
                .map(|(n, (cp, _))| (*n, *cp))
                .collect::<Vec<_>>()
        };
        assert_eq!(line(true), [(1, 1), (2, 2), (3, 3), (4, 7), (5, 8)]);
        assert_eq!(
            line(false),
            [(1, 1), (2, 2), (3, 3), (4, 7), (5, 8), (6, 6)]
        );
    }

    fn names(entries: Vec<DirEntry>) -> Vec<String> {
        entries.into_iter().map(|e| e.name).collect()
    }

    /// `flink/<job>/chk-N` links to the checkpoint imported from Flink's chk-N of that job,
    /// with stable inodes and `..` where it belongs; the root shows `flink/` after
    /// `latest`.
    #[test]
    fn flink_checkpoints_are_links_by_job_and_checkpoint_id() {
        let (a, b) = ("a".repeat(32), "b".repeat(32));
        let fs = double().fs();
        let root = names(fs.readdir(ROOT).unwrap());
        assert_eq!(&root[..3], [".ckptfs", "latest", "flink"]);
        assert_eq!(fs.getattr(ROOT).unwrap().nlink, 3 + 5 + 1);
        let flink = fs.lookup(ROOT, "flink").unwrap();
        assert_eq!((flink.ino, flink.kind, flink.nlink), (FLINK, Kind::Dir, 4));
        assert_eq!(names(fs.readdir(FLINK).unwrap()), [a.clone(), b.clone()]);
        let job_a = fs.lookup(FLINK, &a).unwrap();
        assert_eq!(fs.parent_of(job_a.ino), FLINK);
        assert_eq!(fs.parent_of(FLINK), ROOT);
        assert_eq!(names(fs.readdir(job_a.ino).unwrap()), ["chk-7", "chk-8"]);
        let link = fs.lookup(job_a.ino, "chk-8").unwrap();
        assert_eq!(link.kind, Kind::Symlink);
        assert_eq!(fs.readlink(link.ino).unwrap(), "../../cp-3");
        assert_eq!(link.size, "../../cp-3".len() as u64);
        assert_eq!(fs.getattr(link.ino).unwrap(), link);
        let job_b = fs.lookup(FLINK, &b).unwrap();
        let link_b = fs.lookup(job_b.ino, "chk-9").unwrap();
        assert_eq!(fs.readlink(link_b.ino).unwrap(), "../../cp-4");
        for bad in ["chk-09", "chk-", "chk-9/", "cp-9", "chk-10"] {
            assert_eq!(
                fs.lookup(job_b.ino, bad).unwrap_err().errno(),
                libc::ENOENT,
                "{bad}"
            );
        }
        assert_eq!(fs.lookup(FLINK, "c").unwrap_err().errno(), libc::ENOENT);
        // The listings change as checkpoints come and go: not cached by the kernel.
        let (fh, cache) = fs.opendir(job_a.ino).unwrap();
        assert_eq!(cache, DirCache::Off);
        let listed = names(fs.readdir_handle(fh).unwrap().to_vec());
        assert_eq!(listed, [".", "..", "chk-7", "chk-8"]);
        fs.releasedir(fh);
        // Nothing in it is writable, and `flink` is no checkpoint to drop.
        assert_eq!(
            fs.rmdir(job_a.ino, "chk-7").unwrap_err().errno(),
            libc::EPERM
        );
        assert_eq!(fs.rmdir(ROOT, "flink").unwrap_err().errno(), libc::EPERM);
    }

    /// Dropping a checkpoint takes its link away (and the kernel is told), a job with no
    /// link left goes, and `flink/` itself goes with the last Flink checkpoint; a new
    /// import shows up at the next change.
    #[test]
    fn links_come_and_go_with_their_checkpoints() {
        use super::super::ops::tests::Forgotten;
        let (a, b) = ("a".repeat(32), "b".repeat(32));
        let double = double();
        let fs = double.fs();
        let forgotten = Arc::new(Forgotten::default());
        fs.set_invalidator(forgotten.clone());
        let job_a = fs.lookup(FLINK, &a).unwrap().ino;
        let job_b = fs.lookup(FLINK, &b).unwrap().ino;
        let link = fs.lookup(job_a, "chk-8").unwrap().ino;
        fs.rmdir(ROOT, "cp-3").unwrap();
        assert_eq!(fs.lookup(job_a, "chk-8").unwrap_err().errno(), libc::ENOENT);
        assert_eq!(fs.readlink(link).unwrap_err().errno(), libc::ENOENT);
        let told = std::mem::take(&mut *lock(&forgotten.0));
        assert!(told.contains(&(job_a, Some("chk-8".into()))), "{told:?}");
        double.drop_and_tell(4);
        assert_eq!(names(fs.readdir(FLINK).unwrap()), [a]);
        assert_eq!(fs.lookup(FLINK, &b).unwrap_err().errno(), libc::ENOENT);
        assert_eq!(fs.getattr(job_b).unwrap_err().errno(), libc::ENOENT);
        let told = std::mem::take(&mut *lock(&forgotten.0));
        assert!(told.contains(&(FLINK, Some(b.clone()))), "{told:?}");
        double.drop_and_tell(2);
        assert!(!names(fs.readdir(ROOT).unwrap()).contains(&"flink".to_string()));
        assert_eq!(fs.lookup(ROOT, "flink").unwrap_err().errno(), libc::ENOENT);
        let told = std::mem::take(&mut *lock(&forgotten.0));
        assert!(told.contains(&(ROOT, Some("flink".into()))), "{told:?}");
        // A new import of job B: back, under the inode B had.
        double.add(6, vec![("A/0", vec![double.file("CURRENT", b"x\n")])]);
        double.label(6, &b, 10);
        double.tell();
        assert_eq!(fs.lookup(FLINK, &b).unwrap().ino, job_b);
        let link = fs.lookup(job_b, "chk-10").unwrap();
        assert_eq!(fs.readlink(link.ino).unwrap(), "../../cp-6");
    }

    /// `pinned/` and `flink/` side by side: both in the root, their links on inodes of
    /// their own, each leading where it says.
    #[test]
    fn pins_and_flink_names_live_side_by_side() {
        use super::super::{PINNED, PIN_LINKS};
        let double = double();
        lock(&double.pins).insert("before-deploy".into(), 3);
        let fs = double.fs();
        let root = names(fs.readdir(ROOT).unwrap());
        assert_eq!(&root[..4], [".ckptfs", "latest", "pinned", "flink"]);
        assert_eq!(fs.getattr(ROOT).unwrap().nlink, 3 + 5 + 2);
        let pin = fs.lookup(PINNED, "before-deploy").unwrap();
        let job = fs.lookup(FLINK, &"a".repeat(32)).unwrap();
        let link = fs.lookup(job.ino, "chk-8").unwrap();
        assert!((PIN_LINKS..FLINK).contains(&pin.ino), "{}", pin.ino);
        assert!(is_flink_ino(link.ino) && !is_flink_ino(pin.ino));
        assert_eq!(fs.readlink(pin.ino).unwrap(), "../cp-3");
        assert_eq!(fs.readlink(link.ino).unwrap(), "../../cp-3");
        assert_eq!(fs.getattr(link.ino).unwrap().kind, Kind::Symlink);
        assert_eq!(fs.getattr(pin.ino).unwrap().kind, Kind::Symlink);
    }

    /// A store without Flink checkpoints shows no `flink/`.
    #[test]
    fn no_flink_directory_without_flink_checkpoints() {
        let fs = Double::with_checkpoints(2).fs();
        assert_eq!(
            names(fs.readdir(ROOT).unwrap()),
            [".ckptfs", "latest", "cp-1", "cp-2"]
        );
        assert_eq!(fs.lookup(ROOT, "flink").unwrap_err().errno(), libc::ENOENT);
        assert_eq!(fs.getattr(FLINK).unwrap_err().errno(), libc::ENOENT);
        assert_eq!(fs.getattr(ROOT).unwrap().nlink, 3 + 2);
    }

    #[test]
    fn the_same_flink_checkpoint_held_twice_links_to_the_newest() {
        let double = double();
        double.label(5, "a".repeat(32).as_str(), 7);
        let fs = double.fs();
        let job = fs.lookup(FLINK, &"a".repeat(32)).unwrap().ino;
        let link = fs.lookup(job, "chk-7").unwrap();
        assert_eq!(fs.readlink(link.ino).unwrap(), "../../cp-5");
    }
}
