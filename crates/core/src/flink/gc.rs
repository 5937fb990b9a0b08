//! `ckptfs flink-gc SRC`: the files Flink left behind in its own checkpoint directory, and
//! which of them are safe to delete while its jobs run.
//!
//! Flink deletes a checkpoint's files when no retained checkpoint uses them any more, but
//! what an aborted or in-flight checkpoint uploaded before a failover, what a failed delete
//! left, and the checkpoints of jobs that are gone stay for ever (FLINK-24852). A file
//! under SRC is **garbage** when all of these hold:
//!
//! 1. it is below a job's `chk-N/`, `shared/` or `taskowned/` (nothing else is looked at);
//! 2. no completed checkpoint under SRC (or under a root named with `--reference-root`)
//!    names it, and it is not in the directory of a completed checkpoint (one whose
//!    `_metadata` exists);
//! 3. it was last written before the scan began minus the grace, and the grace is at
//!    least the jobs' checkpoint timeout;
//! 4. if it is in a file-merging directory (a subdirectory of `shared/` or `taskowned/`,
//!    where FLIP-306 pools its physical files), its job wrote nothing for the grace (no
//!    file, no directory below the job's directory, nor the directory itself changed), and
//!    no two of its consecutive completed checkpoints are further apart than the grace
//!    minus the checkpoint timeout.
//!
//! Why that is safe against a running job: a checkpoint that completes after the scan read
//! the `_metadata` files was triggered less than the checkpoint timeout before it completes
//! (Flink aborts it otherwise), so every file it uploaded itself is younger than the grace
//! (rule 3); every other file it names is one it re-references from a checkpoint its
//! backend saw confirmed (Flink re-references files of confirmed checkpoints only). Such a
//! checkpoint is either still retained, and the scan read its `_metadata` (rule 2), or it
//! was subsumed, and Flink's own shared-state registry released the files no retained
//! checkpoint names, exactly the ones rule 2 finds. The `_metadata` files are read after
//! the listing (a checkpoint that completed meanwhile is read too), and `--delete` scans a
//! second time just before it deletes and deletes only what both scans judged garbage.
//!
//! A completed checkpoint Flink no longer retains (older than the newest `num_retained` of
//! its job, and older than the grace) is listed apart with what deleting it would free;
//! it is deleted only when asked (`--delete-unretained`), its `_metadata` first, so that it
//! never looks complete half deleted.
//!
//! Why rule 4: with `execution.checkpointing.file-merging.across-checkpoint-boundary`, a
//! physical file stays open in its pool after the checkpoint that wrote it, and the job's
//! later checkpoints append segments to it and name it (Flink's
//! `AcrossCheckpointFileMergingSnapshotManager` returns it to a `PhysicalFilePool` until it
//! reaches `file-merging.max-file-size`). When every segment in it is discarded (an expired
//! checkpoint's, a subsumed one's) it is named by no checkpoint, yet the live job will
//! append to it again: its age says nothing while its job lives. Only the job that opened
//! it ever writes it again (a job restored from it takes it as closed), and a job that
//! lives writes below its directory at every checkpoint it triggers (`chk-N/` made and, if
//! it fails, removed; its segments; its `_metadata`), so a job that wrote nothing for the
//! grace is taken to be gone, provided the grace is longer than the checkpoint interval
//! plus the timeout; where its checkpoints show a longer interval (or a stall), that
//! proviso fails and its files are kept. The layout does not tell across-boundary pools from within-checkpoint
//! ones (which are closed when their checkpoint ends), so rule 4 holds for both.
//!
//! Any `_metadata` that cannot be read or parsed refuses the whole run: the set of files
//! in use is then unknown.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::import::{chk_number, job_dirs, FlinkSource, METADATA};
use super::metadata::{self, KeyedHandle, StreamHandle};
use crate::error::{Error, Result};
use crate::source::{join, EntryKind, Tree, Walked, MAX_METADATA_BYTES};

/// Flink's default `execution.checkpointing.timeout`.
pub const DEFAULT_CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(600);

/// What a run judges by.
#[derive(Debug, Clone)]
pub struct GcOptions {
    /// Files written less than this long before the scan began are never garbage.
    pub grace: Duration,
    /// The jobs' `execution.checkpointing.timeout`: the grace may not be shorter.
    pub checkpoint_timeout: Duration,
    /// Flink's `execution.checkpointing.num-retained`: per job, the newest this many
    /// completed checkpoints are the ones Flink retains.
    pub num_retained: usize,
    /// When the scan begins (the clock, a parameter for tests).
    pub now: SystemTime,
}

impl GcOptions {
    /// The options refused with the reason, if they are unsafe or void.
    pub fn check(&self) -> Result<()> {
        if self.grace < self.checkpoint_timeout {
            return Err(Error::Invalid(format!(
                "--grace {} is shorter than the checkpoint timeout {}: a checkpoint in \
                 flight may still name a younger file (give --checkpoint-timeout as the \
                 jobs set execution.checkpointing.timeout, 10 min by default)",
                humantime::format_duration(self.grace),
                humantime::format_duration(self.checkpoint_timeout)
            )));
        }
        if self.num_retained == 0 {
            return Err(Error::Invalid(
                "--num-retained 0: Flink retains at least one completed checkpoint".into(),
            ));
        }
        Ok(())
    }

    fn cutoff(&self) -> SystemTime {
        self.now.checked_sub(self.grace).unwrap_or(UNIX_EPOCH)
    }
}

/// Why a file is garbage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    /// In the `chk-N/` of a checkpoint that never completed (no `_metadata`): aborted, or
    /// in flight when its job failed over.
    InFlight,
    /// In `shared/` or `taskowned/`, named by no completed checkpoint.
    Unreferenced,
    /// Named only by completed checkpoints Flink no longer retains (deleted with them).
    Unretained,
}

impl Reason {
    /// As the table shows it.
    pub fn describe(self) -> &'static str {
        match self {
            Reason::InFlight => "in the directory of a checkpoint that never completed",
            Reason::Unreferenced => "named by no completed checkpoint",
            Reason::Unretained => "named only by checkpoints Flink no longer retains",
        }
    }
}

/// One file judged garbage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GcFile {
    /// Its path below SRC.
    pub path: String,
    /// Its bytes.
    pub bytes: u64,
    /// When it was last written (milliseconds since 1970).
    pub modified_unix_ms: u64,
    /// Why it is garbage.
    pub reason: Reason,
    /// The job directory it is in.
    pub job: String,
    /// For [`Reason::InFlight`] and a checkpoint's own files: the checkpoint.
    pub checkpoint: Option<u64>,
    /// As listed, to check that it is still that file when it is deleted.
    #[serde(skip)]
    seen: Walked,
}

/// Files and bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Count {
    /// Files.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
}

impl Count {
    fn add(&mut self, bytes: u64) {
        self.files += 1;
        self.bytes += bytes;
    }
}

/// One job directory under SRC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobSummary {
    /// The directory's name (the job id), "" when SRC is the job's directory itself.
    pub job: String,
    /// Its completed checkpoints, oldest first.
    pub completed: Vec<u64>,
    /// Those Flink retains (the newest `num_retained`, and any younger than the grace).
    pub retained: Vec<u64>,
    /// `chk-N/` directories without `_metadata`.
    pub incomplete: Vec<u64>,
    /// When anything below its directory (or the directory itself) was last written
    /// (milliseconds since 1970; 0: unknown).
    pub last_written_unix_ms: u64,
    /// The longest time between two of its consecutive completed checkpoints, in
    /// milliseconds (0: fewer than two).
    pub checkpoints_apart_ms: u64,
    /// Whether it wrote within the grace (or when is unknown), or its checkpoints came
    /// further apart than the grace minus the checkpoint timeout: the files of its
    /// file-merging directories are then kept.
    pub writing: bool,
}

/// A completed checkpoint Flink no longer retains.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unretained {
    /// Its job directory.
    pub job: String,
    /// The job's id: its directory's name (SRC's own name when SRC is the job's
    /// directory).
    pub job_id: String,
    /// The checkpoint's id.
    pub checkpoint: u64,
    /// Its directory below SRC.
    pub path: String,
    /// When its `_metadata` was written (milliseconds since 1970).
    pub completed_unix_ms: u64,
    /// Its own directory's files.
    pub own: Count,
    /// Files in `shared/` that it names and no retained checkpoint does (freed once every
    /// unretained checkpoint naming them is deleted).
    pub shared: Count,
}

/// What a scan found.
#[derive(Debug, Clone, Serialize)]
pub struct GcPlan {
    /// SRC as the user named it.
    pub source: String,
    /// When the scan began (milliseconds since 1970).
    pub scanned_unix_ms: u64,
    /// The grace, in seconds.
    pub grace_s: f64,
    /// The checkpoint timeout it was given, in seconds.
    pub checkpoint_timeout_s: f64,
    /// Flink's retained checkpoints per job, as judged.
    pub num_retained: usize,
    /// Every job directory.
    pub jobs: Vec<JobSummary>,
    /// Every file looked at (below the jobs' `chk-N/`, `shared/`, `taskowned/`).
    pub scanned: Count,
    /// The garbage, by path.
    pub garbage: Vec<GcFile>,
    /// Its total.
    pub garbage_total: Count,
    /// Files named by no completed checkpoint but younger than the grace: kept.
    pub young: Count,
    /// Files in file-merging directories named by no retained checkpoint, older than the
    /// grace, of jobs that wrote within the grace: kept (their pools may append to them).
    pub pooled: Count,
    /// Completed checkpoints Flink no longer retains, oldest first.
    pub unretained: Vec<Unretained>,
    /// What deleting every unretained checkpoint deletes (their directories and the shared
    /// files only they name), by path.
    pub unretained_files: Vec<GcFile>,
    /// Its total.
    pub unretained_total: Count,
    /// Entries left alone, and why (links, other kinds of files).
    pub left_alone: Vec<(String, String)>,
    /// Files the completed checkpoints name outside SRC (not SRC's to judge).
    pub outside: u64,
    /// Completed checkpoints that name files SRC no longer has.
    pub broken: Vec<Broken>,
}

/// A completed checkpoint that names files that are gone: it cannot be restored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Broken {
    /// Its job directory.
    pub job: String,
    /// Its id.
    pub checkpoint: u64,
    /// How many of the files it names are missing.
    pub missing: u64,
}

/// What `--delete` did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GcDone {
    /// Files deleted.
    pub deleted: Count,
    /// Judged garbage by the first scan but not by the second (named or written meanwhile):
    /// kept.
    pub kept_by_second_scan: u64,
    /// Gone before they were deleted (Flink deleted them meanwhile).
    pub gone: u64,
    /// Directories of incomplete or deleted checkpoints removed once empty.
    pub dirs_removed: u64,
    /// Files not deleted: the path and the error.
    pub failed: Vec<(String, String)>,
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Where each listed file is, relative to its job directory.
enum Place {
    /// In `chk-N/`.
    Checkpoint(u64),
    /// In `shared/` or `taskowned/`; `true`: in a subdirectory of it (file merging's).
    Shared(bool),
    /// Anywhere else: not looked at.
    Elsewhere,
}

fn place_of(below_job: &str) -> Place {
    let first = below_job.split('/').next().unwrap_or("");
    if let Some(n) = chk_number(first) {
        return Place::Checkpoint(n);
    }
    match first {
        "shared" | "taskowned" => Place::Shared(below_job.matches('/').count() >= 2),
        _ => Place::Elsewhere,
    }
}

/// When anything below job directory `scan` was last written, the job directory's own
/// time (`dir_modified`: an entry made or removed in it, such as a failed checkpoint's
/// `chk-N/`) included; `None` if no time is known.
fn last_written(scan: &JobScan, dir_modified: Option<SystemTime>) -> Option<SystemTime> {
    scan.files
        .iter()
        .filter_map(|w| w.modified)
        .chain(dir_modified)
        .max()
}

struct JobScan {
    dir: String,
    files: Vec<Walked>,
    /// `chk-N` directories listed.
    checkpoints: BTreeSet<u64>,
}

/// The files of one completed checkpoint's `_metadata`, below the main tree.
struct Named {
    job: String,
    checkpoint: u64,
    completed: SystemTime,
    files: BTreeSet<String>,
    /// The last names of the files it names outside the main tree.
    outside: Vec<String>,
}

/// Scan `src` (every job under it) and judge each file; deletes nothing.
pub fn plan(src: &FlinkSource, options: &GcOptions) -> Result<GcPlan> {
    options.check()?;
    let tree = src.tree();
    let cutoff = options.cutoff();
    let dirs = job_dirs(tree.as_ref())?;
    if dirs.is_empty() {
        return Err(Error::Invalid(format!(
            "{} holds no Flink job's checkpoints (no chk-N/ or shared/, nor job directories \
             named by a 32-hex job id): give execution.checkpointing.dir",
            src.describe()
        )));
    }
    // 1. The listing, before any `_metadata` is read.
    let scans = scan_jobs(tree.as_ref(), &dirs)?;
    let dir_times = job_dir_times(tree.as_ref(), &dirs)?;
    // 2. Every completed checkpoint's `_metadata`, and what names files elsewhere.
    let (named, outside) = read_completed(tree.as_ref(), &scans)?;
    let listed: BTreeSet<&str> = scans
        .iter()
        .flat_map(|scan| scan.files.iter().map(|w| w.rel.as_str()))
        .collect();
    refuse_a_moved_job(src, &named, &listed)?;
    let broken = broken_checkpoints(tree.as_ref(), &named, &listed);
    let referenced_elsewhere = referenced_elsewhere(src, options)?;
    // 3. Retained: per job the newest `num_retained`, and any younger than the grace.
    let kept = Retention::of(&scans, &named, &dir_times, &referenced_elsewhere, options);
    // 4. Every listed file judged.
    let mut plan = GcPlan {
        source: src.describe(),
        scanned_unix_ms: unix_ms(options.now),
        grace_s: options.grace.as_secs_f64(),
        checkpoint_timeout_s: options.checkpoint_timeout.as_secs_f64(),
        num_retained: options.num_retained,
        jobs: Vec::new(),
        scanned: Count::default(),
        garbage: Vec::new(),
        garbage_total: Count::default(),
        young: Count::default(),
        pooled: Count::default(),
        unretained: Vec::new(),
        unretained_files: Vec::new(),
        unretained_total: Count::default(),
        left_alone: Vec::new(),
        outside,
        broken,
    };
    let counts = judge_files(&mut plan, &scans, &kept, cutoff);
    // 5. The unretained checkpoints, what each holds alone, and the totals.
    summarize(&mut plan, src, &kept.unretained, &counts);
    plan.jobs = kept.jobs;
    Ok(plan)
}

/// Step 1: each job directory's files, and its `chk-N` directories.
fn scan_jobs(tree: &dyn Tree, dirs: &[String]) -> Result<Vec<JobScan>> {
    let mut scans = Vec::new();
    for dir in dirs {
        let files = tree.walk(dir)?;
        let prefix_len = prefix_len(dir);
        let checkpoints = files
            .iter()
            .filter(|w| w.kind == EntryKind::Dir && !w.rel[prefix_len..].contains('/'))
            .filter_map(|w| chk_number(&w.rel[prefix_len..]))
            .collect();
        scans.push(JobScan {
            dir: dir.clone(),
            files,
            checkpoints,
        });
    }
    Ok(scans)
}

/// The length of `dir/` in a path below it (0 for the root).
fn prefix_len(dir: &str) -> usize {
    if dir.is_empty() {
        0
    } else {
        dir.len() + 1
    }
}

/// Each job directory's own time, from a listing of the root (SRC itself, when it is the
/// job's directory, has none: the times of what is below it are used).
fn job_dir_times(tree: &dyn Tree, dirs: &[String]) -> Result<BTreeMap<String, Option<SystemTime>>> {
    if !dirs.iter().any(|d| !d.is_empty()) {
        return Ok(BTreeMap::new());
    }
    Ok(tree
        .list("")?
        .into_iter()
        .filter(|e| e.kind == EntryKind::Dir)
        .map(|e| (e.name, e.modified))
        .collect())
}

/// Step 2: every completed checkpoint's `_metadata`, looked for again in every `chk-N/`
/// listed (one may have completed since); with how many files they name outside SRC.
fn read_completed(tree: &dyn Tree, scans: &[JobScan]) -> Result<(Vec<Named>, u64)> {
    let mut named = Vec::new();
    let mut outside = 0u64;
    for scan in scans {
        for &n in &scan.checkpoints {
            let rel = join(&scan.dir, &format!("chk-{n}/{METADATA}"));
            let listed = scan.files.iter().find(|w| w.rel == rel);
            let at = listed.and_then(|w| w.modified);
            if let Some(found) = read_named(tree, tree, &scan.dir, n, &rel, at)? {
                outside += found.1;
                named.push(found.0);
            }
        }
    }
    Ok((named, outside))
}

/// A moved or copied job directory: its checkpoints name the original's files, which its
/// own shared/ holds under the same names. Judged by its paths, every file would look
/// unreferenced: refused.
fn refuse_a_moved_job(src: &FlinkSource, named: &[Named], listed: &BTreeSet<&str>) -> Result<()> {
    for n in named {
        let copies = n
            .outside
            .iter()
            .filter(|name| listed.contains(join(&join(&n.job, "shared"), name).as_str()))
            .count();
        if copies > 0 {
            return Err(Error::Invalid(format!(
                "{}: checkpoint {} names {copies} files outside {} that its shared/ holds \
                 under the same names: the directory was moved or copied, and its \
                 checkpoints name the original's files; nothing was deleted",
                src.tree().show(&n.job),
                n.checkpoint,
                src.describe()
            )));
        }
    }
    Ok(())
}

/// Checkpoints that name files no longer there (Flink deleted them, or they were lost):
/// they cannot be restored, whatever is deleted now.
fn broken_checkpoints(tree: &dyn Tree, named: &[Named], listed: &BTreeSet<&str>) -> Vec<Broken> {
    let mut broken = Vec::new();
    for n in named {
        let missing = n
            .files
            .iter()
            .filter(|file| {
                !listed.contains(file.as_str()) && tree.size_of(file).ok().flatten().is_none()
            })
            .count() as u64;
        if missing > 0 {
            broken.push(Broken {
                job: n.job.clone(),
                checkpoint: n.checkpoint,
                missing,
            });
        }
    }
    broken
}

/// The files below SRC that the checkpoints under the reference roots name.
fn referenced_elsewhere(src: &FlinkSource, options: &GcOptions) -> Result<BTreeSet<String>> {
    let tree = src.tree();
    let mut referenced = BTreeSet::new();
    for also in src.also_trees() {
        for dir in job_dirs(also.as_ref())? {
            for entry in also.list(&dir)? {
                let Some(n) = chk_number(&entry.name).filter(|_| entry.kind == EntryKind::Dir)
                else {
                    continue;
                };
                let rel = join(&dir, &format!("chk-{n}/{METADATA}"));
                let now = Some(options.now);
                if let Some((found, _)) =
                    read_named(also.as_ref(), tree.as_ref(), &dir, n, &rel, now)?
                {
                    referenced.extend(found.files);
                }
            }
        }
    }
    Ok(referenced)
}

/// Step 3: what each job retains.
struct Retention<'a> {
    /// Each job's summary.
    jobs: Vec<JobSummary>,
    /// Every file a retained checkpoint (or one under a reference root) names.
    retained_files: BTreeSet<&'a str>,
    /// The completed checkpoints not retained.
    unretained: Vec<&'a Named>,
    /// Every file those name.
    unretained_files: BTreeSet<&'a str>,
    /// Each completed checkpoint (job, id): retained or not.
    completed: BTreeMap<(String, u64), bool>,
    /// The jobs that may still be writing (rule 4).
    writing: BTreeSet<String>,
}

impl<'a> Retention<'a> {
    fn of(
        scans: &[JobScan],
        named: &'a [Named],
        dir_times: &BTreeMap<String, Option<SystemTime>>,
        referenced_elsewhere: &'a BTreeSet<String>,
        options: &GcOptions,
    ) -> Retention<'a> {
        let cutoff = options.cutoff();
        let mut by_job: BTreeMap<&str, Vec<&Named>> = BTreeMap::new();
        for n in named {
            by_job.entry(n.job.as_str()).or_default().push(n);
        }
        let mut kept = Retention {
            jobs: Vec::new(),
            retained_files: referenced_elsewhere.iter().map(|s| s.as_str()).collect(),
            unretained: Vec::new(),
            unretained_files: BTreeSet::new(),
            completed: BTreeMap::new(),
            writing: BTreeSet::new(),
        };
        for scan in scans {
            let mut mine = by_job.remove(scan.dir.as_str()).unwrap_or_default();
            mine.sort_by_key(|n| std::cmp::Reverse(n.checkpoint));
            let last = last_written(scan, dir_times.get(&scan.dir).copied().flatten());
            let apart = mine
                .windows(2)
                .filter_map(|w| w[0].completed.duration_since(w[1].completed).ok())
                .max()
                .unwrap_or_default();
            let mut summary = JobSummary {
                job: scan.dir.clone(),
                completed: mine.iter().rev().map(|n| n.checkpoint).collect(),
                retained: Vec::new(),
                incomplete: Vec::new(),
                last_written_unix_ms: last.map(unix_ms).unwrap_or(0),
                checkpoints_apart_ms: apart.as_millis() as u64,
                writing: last.is_none_or(|t| t >= cutoff)
                    || apart + options.checkpoint_timeout > options.grace,
            };
            for (i, n) in mine.iter().enumerate() {
                let retained = i < options.num_retained || n.completed >= cutoff;
                kept.completed
                    .insert((scan.dir.clone(), n.checkpoint), retained);
                if retained {
                    summary.retained.push(n.checkpoint);
                    kept.retained_files
                        .extend(n.files.iter().map(|s| s.as_str()));
                } else {
                    kept.unretained.push(n);
                }
            }
            summary.retained.sort_unstable();
            summary.incomplete = scan
                .checkpoints
                .iter()
                .filter(|n| !kept.completed.contains_key(&(scan.dir.clone(), **n)))
                .copied()
                .collect();
            if summary.writing {
                kept.writing.insert(summary.job.clone());
            }
            kept.jobs.push(summary);
        }
        kept.unretained_files = kept
            .unretained
            .iter()
            .flat_map(|n| n.files.iter().map(|s| s.as_str()))
            .collect();
        kept
    }
}

/// Per unretained checkpoint (job, id): the bytes of its own directory and of the shared
/// files only unretained checkpoints name.
type UnretainedCounts = BTreeMap<(String, u64), (Count, Count)>;

/// Step 4: every listed file judged into `plan`.
fn judge_files(
    plan: &mut GcPlan,
    scans: &[JobScan],
    kept: &Retention<'_>,
    cutoff: SystemTime,
) -> UnretainedCounts {
    let mut counts = UnretainedCounts::new();
    for scan in scans {
        let prefix_len = prefix_len(&scan.dir);
        for file in &scan.files {
            let place = place_of(&file.rel[prefix_len..]);
            if matches!(place, Place::Elsewhere) || file.kind == EntryKind::Dir {
                continue;
            }
            if file.kind != EntryKind::File {
                plan.left_alone
                    .push((file.rel.clone(), "not a regular file (a link?)".into()));
                continue;
            }
            plan.scanned.add(file.size);
            let young = file.modified.is_none_or(|m| m >= cutoff);
            let judged = |reason, checkpoint| GcFile {
                path: file.rel.clone(),
                bytes: file.size,
                modified_unix_ms: file.modified.map(unix_ms).unwrap_or(0),
                reason,
                job: scan.dir.clone(),
                checkpoint,
                seen: file.clone(),
            };
            match place {
                Place::Checkpoint(n) => match kept.completed.get(&(scan.dir.clone(), n)) {
                    Some(true) => {}
                    Some(false) => {
                        counts
                            .entry((scan.dir.clone(), n))
                            .or_default()
                            .0
                            .add(file.size);
                        if !young {
                            plan.unretained_files
                                .push(judged(Reason::Unretained, Some(n)));
                        }
                    }
                    None if young => plan.young.add(file.size),
                    None => plan.garbage.push(judged(Reason::InFlight, Some(n))),
                },
                Place::Shared(merged) => {
                    if kept.retained_files.contains(file.rel.as_str()) {
                        continue;
                    }
                    // Rule 4: a file its job's pool may still append to.
                    let pooled = merged && kept.writing.contains(&scan.dir);
                    if pooled && !young {
                        plan.pooled.add(file.size);
                    } else if kept.unretained_files.contains(file.rel.as_str()) {
                        for n in kept
                            .unretained
                            .iter()
                            .filter(|n| n.files.contains(&file.rel))
                        {
                            counts
                                .entry((n.job.clone(), n.checkpoint))
                                .or_default()
                                .1
                                .add(file.size);
                        }
                        if !young {
                            plan.unretained_files.push(judged(Reason::Unretained, None));
                        }
                    } else if young {
                        plan.young.add(file.size);
                    } else {
                        plan.garbage.push(judged(Reason::Unreferenced, None));
                    }
                }
                Place::Elsewhere => {}
            }
        }
    }
    counts
}

/// Step 5: each unretained checkpoint with what it holds, everything sorted, the totals.
fn summarize(
    plan: &mut GcPlan,
    src: &FlinkSource,
    unretained: &[&Named],
    counts: &UnretainedCounts,
) {
    // A job directory given as SRC is named by its own name (the job id, unless copied).
    let root_name = src
        .describe()
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or("")
        .to_string();
    for n in unretained.iter().rev() {
        let (own, shared) = counts
            .get(&(n.job.clone(), n.checkpoint))
            .copied()
            .unwrap_or_default();
        plan.unretained.push(Unretained {
            job: n.job.clone(),
            job_id: if n.job.is_empty() {
                root_name.clone()
            } else {
                n.job.clone()
            },
            checkpoint: n.checkpoint,
            path: join(&n.job, &format!("chk-{}", n.checkpoint)),
            completed_unix_ms: unix_ms(n.completed),
            own,
            shared,
        });
    }
    plan.unretained
        .sort_by(|a, b| (&a.job, a.checkpoint).cmp(&(&b.job, b.checkpoint)));
    plan.garbage.sort_by(|a, b| a.path.cmp(&b.path));
    plan.unretained_files.sort_by(|a, b| a.path.cmp(&b.path));
    for g in &plan.garbage {
        plan.garbage_total.add(g.bytes);
    }
    for g in &plan.unretained_files {
        plan.unretained_total.add(g.bytes);
    }
}

/// Checkpoint `n`'s `_metadata` at `rel` of `tree`, read and parsed, and the files it
/// names below `main` (with how many it names outside); `None` if it has none (never
/// completed). `completed`: its time, if the listing has it. Anything unreadable or
/// unparsable refuses the run.
fn read_named(
    tree: &dyn Tree,
    main: &dyn Tree,
    job: &str,
    n: u64,
    rel: &str,
    completed: Option<SystemTime>,
) -> Result<Option<(Named, u64)>> {
    let refuse = |e: Error| {
        Error::Invalid(format!(
            "{}: {e}; nothing was deleted (which files its checkpoint uses is unknown)",
            tree.show(rel)
        ))
    };
    let Some(_) = tree.size_of(rel).map_err(refuse)? else {
        return Ok(None);
    };
    let dir = rel.rsplit_once('/').map_or("", |(d, _)| d);
    // Its time, for one written since the listing: from a listing of its directory (a
    // local file's mtime, an object's last modification).
    let completed = match completed {
        Some(at) => at,
        None => tree
            .list(dir)
            .map_err(refuse)?
            .into_iter()
            .find(|e| e.name == METADATA)
            .and_then(|e| e.modified)
            .unwrap_or_else(SystemTime::now),
    };
    let bytes = tree.read(rel, MAX_METADATA_BYTES).map_err(refuse)?;
    let parsed = metadata::parse(&bytes).map_err(refuse)?;
    let mut files = BTreeSet::new();
    let mut outside = 0u64;
    let mut outside_names = Vec::new();
    let mut name = |handle: &StreamHandle| match handle {
        StreamHandle::File { path, .. } | StreamHandle::Segment { path, .. } => {
            match main.locate(path) {
                Some(rel) => {
                    files.insert(rel);
                }
                None => {
                    outside += 1;
                    outside_names.push(path.rsplit('/').next().unwrap_or("").to_string());
                }
            }
        }
        StreamHandle::Relative { path, .. } => {
            if let Ok(rel) = super::import::relative_in(dir, path) {
                files.insert(rel);
            }
        }
        StreamHandle::Inline(_) | StreamHandle::EmptySegment => {}
    };
    for op in &parsed.operators {
        if let Some(h) = &op.coordinator_state {
            name(h);
        }
        for subtask in &op.subtasks {
            for h in [&subtask.managed_operator_state, &subtask.raw_operator_state]
                .into_iter()
                .flatten()
            {
                if let Some(h) = &h.handle {
                    name(h);
                }
            }
            for keyed in [&subtask.managed_keyed, &subtask.raw_keyed]
                .into_iter()
                .flatten()
            {
                match keyed {
                    KeyedHandle::Incremental(h) => {
                        name(&h.meta);
                        for (_, h) in h.shared.iter().chain(&h.private) {
                            name(h);
                        }
                    }
                    KeyedHandle::KeyGroups { handle, .. } => {
                        if let Some(h) = handle {
                            name(h);
                        }
                    }
                }
            }
        }
    }
    Ok(Some((
        Named {
            job: job.to_string(),
            checkpoint: n,
            completed,
            files,
            outside: outside_names,
        },
        outside,
    )))
}

/// Delete what `plan` judged garbage (and, with `unretained`, the checkpoints Flink no
/// longer retains): scanned a second time first, and only what both scans judged deleted,
/// each file as both listed it (the same size and modification time: on object storage,
/// which has no conditional delete, the second listing is the last look before the
/// delete). A failed delete is reported, never retried blindly; the rest goes on.
pub fn delete(
    src: &FlinkSource,
    first: &GcPlan,
    options: &GcOptions,
    unretained: bool,
) -> Result<GcDone> {
    let second = plan(src, options)?;
    let tree = src.tree();
    let mut done = GcDone::default();
    let doomed = judged_twice(&first.garbage, &second.garbage, &mut done);
    remove_all(tree, &doomed, &mut done);
    let mut dirs: BTreeSet<String> = doomed
        .iter()
        .filter_map(|g| g.checkpoint.map(|n| join(&g.job, &format!("chk-{n}"))))
        .collect();
    if unretained {
        let files = judged_twice(&first.unretained_files, &second.unretained_files, &mut done);
        // Each checkpoint's `_metadata` first: a checkpoint half deleted must not look
        // complete.
        let (metadata, rest): (Vec<&GcFile>, Vec<&GcFile>) = files
            .into_iter()
            .partition(|g| g.checkpoint.is_some() && g.path.rsplit('/').next() == Some(METADATA));
        remove_all(tree, &metadata, &mut done);
        remove_all(tree, &rest, &mut done);
        for u in &first.unretained {
            dirs.insert(u.path.clone());
        }
    }
    // Emptied directories, deepest first.
    let mut all_dirs: Vec<String> = Vec::new();
    for dir in dirs {
        if let Ok(below) = tree.walk(&dir) {
            all_dirs.extend(
                below
                    .into_iter()
                    .filter(|w| w.kind == EntryKind::Dir)
                    .map(|w| w.rel),
            );
        }
        all_dirs.push(dir);
    }
    all_dirs.sort_by_key(|d| std::cmp::Reverse(d.matches('/').count()));
    for dir in all_dirs {
        if matches!(tree.remove_empty_dir(&dir), Ok(true)) {
            done.dirs_removed += 1;
        }
    }
    Ok(done)
}

/// The files of `first` that the second scan judged the same (`again`) and found as the
/// first listed them; the others are counted as kept by the second scan.
fn judged_twice<'a>(first: &'a [GcFile], again: &[GcFile], done: &mut GcDone) -> Vec<&'a GcFile> {
    let again: BTreeMap<&str, &GcFile> = again.iter().map(|g| (g.path.as_str(), g)).collect();
    let mut out = Vec::new();
    for g in first {
        match again.get(g.path.as_str()) {
            Some(second)
                if second.seen.size == g.seen.size && second.seen.modified == g.seen.modified =>
            {
                out.push(g)
            }
            _ => done.kept_by_second_scan += 1,
        }
    }
    out
}

fn remove_all(tree: &Arc<dyn Tree>, files: &[&GcFile], done: &mut GcDone) {
    let listed: Vec<(&str, &Walked)> = files.iter().map(|g| (g.path.as_str(), &g.seen)).collect();
    let results = tree.remove_files(&listed);
    for (g, result) in files.iter().zip(results) {
        match result {
            Ok(true) => done.deleted.add(g.bytes),
            Ok(false) => done.gone += 1,
            Err(e) => done.failed.push((g.path.clone(), e.to_string())),
        }
    }
}
