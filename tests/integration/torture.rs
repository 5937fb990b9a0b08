//! The fault campaign: kill the checkpointing process at every failpoint of a checkpoint,
//! a drop, a restore and recovery, and at random instants; after each death check that
//! nothing reported complete is lost, fsck finds nothing missing or corrupt, recovery
//! leaves no orphan, reference counts equal a recount, and every retained checkpoint
//! restores to exactly the data of its round. Trials alternate between the `flush` and
//! `wal` checkpoint modes.
//!
//! Needs the cargo feature `failpoints` (scripts/test and scripts/torture enable it).
//! `CKPTFS_TORTURE_TRIALS` sets the number of trials (default 40, the CI's short mode: every
//! failpoint twice);
//! `scripts/torture` runs the long campaign and prints the summary table.

use crate::common::*;
use ckptfs_core::workload::{current_round, expected_after};
use ckptfs_core::{Engine, EngineConfig};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const KEYS: u32 = 1500;

const VALUE_SIZE: usize = 64;

const BACKENDS: [&str; 2] = ["A/0", "B/1"];
/// The application database the workload imports (never hosted).
const IMPORTED: &str = "App/0";

const RETAIN: u32 = 3;

/// A deterministic generator (no wall-clock randomness: a failing trial can be rerun).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Round of each backend in a checkpoint.
type Rounds = BTreeMap<String, u64>;

/// What one run of the workload said before it died.
struct Run {
    /// Checkpoint id and the round of each backend, for every checkpoint the workload
    /// reported complete.
    reported: Vec<(u64, Rounds)>,
    killed: bool,
    failpoint_hit: bool,
    stderr: String,
}

/// Trials alternate between the checkpoint modes (one store sees both, as a user switching
/// modes would make it).
fn mode_of(trial: usize) -> &'static str {
    if trial % 2 == 1 {
        "wal"
    } else {
        "flush"
    }
}

fn workload(
    store: &Path,
    mode: &str,
    failpoint: Option<&str>,
    kill_after: Option<Duration>,
) -> Run {
    workload_then(store, mode, failpoint, kill_after, &mut || {})
}

/// Run the workload until it dies (or `kill_after`), then call `at_death` at once.
fn workload_then(
    store: &Path,
    mode: &str,
    failpoint: Option<&str>,
    kill_after: Option<Duration>,
    at_death: &mut dyn FnMut(),
) -> Run {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ckptfs"));
    command
        .arg("workload")
        .arg(store)
        .args(["--backend", BACKENDS[0], "--backend", BACKENDS[1]])
        .args(["--rounds", "40", "--keys", &KEYS.to_string()])
        .args(["--value-size", &VALUE_SIZE.to_string()])
        .args(["--retain", &RETAIN.to_string()])
        .args(["--compact-every", "3", "--restore-every", "4"])
        .args(["--checkpoint-mode", mode])
        .arg(format!("--import={}={}-app", IMPORTED, store.display()))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match failpoint {
        Some(spec) => command.env("FAILPOINTS", spec),
        None => command.env_remove("FAILPOINTS"),
    };
    let mut child = command.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut reported = Vec::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // "round R: checkpoint M files=... rounds=A/0:R,B/1:R"
            let words: Vec<&str> = line.split_whitespace().collect();
            if words.first() == Some(&"round") && words.get(2) == Some(&"checkpoint") {
                let rounds = words
                    .iter()
                    .find_map(|w| w.strip_prefix("rounds="))
                    .unwrap()
                    .split(',')
                    .map(|pair| {
                        let (b, r) = pair.split_once(':').unwrap();
                        (b.to_string(), r.parse().unwrap())
                    })
                    .collect();
                reported.push((words[3].parse().unwrap(), rounds));
            }
        }
        reported
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let deadline = Instant::now() + kill_after.unwrap_or(Duration::from_secs(60));
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            child.kill().unwrap();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    at_death();
    let reported = out.join().unwrap();
    let stderr = err.join().unwrap();
    let failpoint_hit = stderr.contains("failpoint ");
    assert!(
        status.success() || status.signal() == Some(libc::SIGKILL),
        "workload failed without being killed: {status:?}\n{stderr}"
    );
    Run {
        reported,
        killed: status.signal() == Some(libc::SIGKILL),
        failpoint_hit,
        stderr,
    }
}

/// The checks after a death; returns the number of checkpoints verified.
fn check(store: &Path, reported: &BTreeMap<u64, Rounds>, problems: &mut Vec<String>) -> usize {
    // Before any recovery: nothing referenced is missing or corrupt.
    let report = ckptfs_core::commands::fsck::fsck(store, false, |_| {}).unwrap();
    if !report.missing.is_empty() || !report.corrupt.is_empty() {
        problems.push(format!("fsck before recovery: {report:?}"));
    }
    // Recovery, then the store must be exactly what the manifests reference.
    let engine = Engine::open(EngineConfig::new(store)).unwrap();
    let counts = engine.reference_counts();
    let recounted = recount(&engine.checkpoints());
    if counts != recounted {
        problems.push("reference counts differ from a recount".into());
    }
    let referenced: BTreeSet<_> = recounted.keys().copied().collect();
    let stored: BTreeSet<_> = engine.object_store().list().unwrap().into_iter().collect();
    if referenced != stored {
        problems.push(format!(
            "after recovery: {} orphans, {} missing",
            stored.difference(&referenced).count(),
            referenced.difference(&stored).count()
        ));
    }
    let retained: Vec<u64> = engine.checkpoints().iter().map(|m| m.id).collect();
    drop(engine);
    // A checkpoint reported complete is only ever gone by retention: then at least
    // `RETAIN` newer checkpoints are retained.
    for &id in reported.keys() {
        let newer = retained.iter().filter(|r| **r > id).count();
        if !retained.contains(&id) && newer < RETAIN as usize {
            problems.push(format!(
                "checkpoint {id} was reported complete but is gone (retained {retained:?})"
            ));
        }
    }
    for &id in &retained {
        for (backend, contents) in restored_contents(store, id) {
            let pairs: Vec<_> = contents.clone().into_iter().collect();
            let Some(round) = current_round(&pairs).unwrap() else {
                problems.push(format!("checkpoint {id} {backend}: no round key"));
                continue;
            };
            if let Some(&said) = reported.get(&id).and_then(|r| r.get(&backend.to_string())) {
                if said != round {
                    problems.push(format!(
                        "checkpoint {id} {backend}: holds round {round}, was reported as {said}"
                    ));
                }
            }
            if contents != expected_after(&backend, round, KEYS, VALUE_SIZE) {
                problems.push(format!(
                    "checkpoint {id} {backend}: wrong data for round {round}"
                ));
            }
        }
    }
    let report = ckptfs_core::commands::fsck::fsck(store, false, |_| {}).unwrap();
    if !report.is_clean() {
        problems.push(format!("fsck after recovery: {report:?}"));
    }
    retained.len()
}

/// Forget reported checkpoints that retention dropped since.
fn forget_dropped(store: &Path, reported: &mut BTreeMap<u64, Rounds>) {
    let alive: BTreeSet<u64> = ckptfs_core::repo::Repo::reader(&store.into())
        .map(|r| r.catalog)
        .unwrap()
        .load_all()
        .unwrap()
        .into_keys()
        .collect();
    reported.retain(|id, _| alive.contains(id));
}

#[test]
fn kill_at_every_failpoint_and_at_random_instants() {
    let trials: usize = std::env::var("CKPTFS_TORTURE_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let seed: u64 = std::env::var("CKPTFS_TORTURE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_c0de);
    let mut rng = Rng(seed | 1);
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let mut store = dir.path().join("store-0");
    let mut reported: BTreeMap<u64, Rounds> = BTreeMap::new();
    let mut hits: BTreeMap<&str, usize> = BTreeMap::new();
    let (mut random_kills, mut verified, mut unkilled) = (0, 0, 0);
    let mut problems = Vec::new();
    for trial in 0..trials {
        if trial > 0 && trial % 25 == 0 {
            // A fresh store now and then keeps trials fast and covers first checkpoints.
            store = dir.path().join(format!("store-{trial}"));
            reported.clear();
        }
        // Every failpoint in turn, with a random number of passes before it fires; every
        // fourth trial a kill at a random instant instead.
        let run = if trial % 4 == 3 {
            random_kills += 1;
            workload(
                &store,
                mode_of(trial),
                None,
                Some(Duration::from_millis(100 + rng.below(1500))),
            )
        } else {
            let failpoint = ckptfs_core::failpoint::ALL
                [(trial - trial / 4) % ckptfs_core::failpoint::ALL.len()];
            if failpoint.starts_with("open::") && store.join("objects").is_dir() {
                // Give recovery something to sweep: an object no manifest references.
                let hex = format!("{:016x}", rng.next()).repeat(4);
                let shard = store.join("objects").join(&hex[..2]);
                std::fs::create_dir_all(&shard).unwrap();
                std::fs::write(shard.join(&hex), b"orphan").unwrap();
            }
            let passes = if failpoint.starts_with("open::") {
                0
            } else {
                rng.below(4)
            };
            let spec = format!("{failpoint}={passes}*off->return");
            let run = workload(&store, mode_of(trial), Some(&spec), None);
            if run.failpoint_hit {
                *hits.entry(failpoint).or_default() += 1;
            }
            run
        };
        // A run that was not killed ran all its rounds (the failpoint lay beyond them);
        // it is checked all the same.
        if !run.killed {
            unkilled += 1;
        }
        // A restore rolls checkpoint ids forward but contents back; the ids reported stay
        // true to what each checkpoint holds.
        let run_ids: Vec<u64> = run.reported.iter().map(|(id, _)| *id).collect();
        let run_stderr = run.stderr.clone();
        reported.extend(run.reported);
        let before = problems.len();
        verified += check(&store, &reported, &mut problems);
        if problems.len() > before {
            eprintln!("trial {trial}: {:?}", &problems[before..]);
            eprintln!("  its run reported {run_ids:?}\n{run_stderr}");
        }
        forget_dropped(&store, &mut reported);
    }
    let hit_total: usize = hits.values().sum();
    eprintln!("\nfault campaign (seed {seed})");
    eprintln!("| trials | failpoint kills | random kills | failpoints hit | checkpoints verified | problems | seconds |");
    eprintln!("|---|---|---|---|---|---|---|");
    eprintln!(
        "| {trials} | {hit_total} | {random_kills} | {}/{} | {verified} | {} | {:.0} |",
        hits.len(),
        ckptfs_core::failpoint::ALL.len(),
        problems.len(),
        started.elapsed().as_secs_f64()
    );
    for (name, n) in &hits {
        eprintln!("  {name}: {n}");
    }
    eprintln!("  runs that finished without being killed: {unkilled}");
    assert!(problems.is_empty(), "{problems:#?}");
    if trials >= ckptfs_core::failpoint::ALL.len() * 2 {
        let missed: Vec<_> = ckptfs_core::failpoint::ALL
            .iter()
            .filter(|f| !hits.contains_key(*f))
            .collect();
        assert!(missed.is_empty(), "failpoints never reached: {missed:?}");
    }
}

/// A loop-mounted ext4 image: the disk that loses power.
struct Disk {
    image: PathBuf,
    mnt: PathBuf,
    device: Option<String>,
}

impl Disk {
    fn create(dir: &Path) -> Disk {
        let image = dir.join("disk.img");
        let file = std::fs::File::create(&image).unwrap();
        file.set_len(512 << 20).unwrap();
        run("mkfs.ext4", &["-q", "-F", image.to_str().unwrap()]);
        let mnt = dir.join("disk");
        std::fs::create_dir_all(&mnt).unwrap();
        let mut disk = Disk {
            image,
            mnt,
            device: None,
        };
        disk.attach();
        let mut canary = std::fs::File::create(disk.canary()).unwrap();
        std::io::Write::write_all(&mut canary, &[b'0'; 4096]).unwrap();
        canary.sync_all().unwrap();
        disk
    }

    /// A durable 4 KiB file that each trial overwrites in place without fsync: an
    /// overwrite needs no journal transaction, so after a cut it must read as before.
    /// This is the proof that the cut really drops unsynced data.
    fn canary(&self) -> PathBuf {
        self.mnt.join("canary")
    }

    fn scribble_canary(&self, tag: u8) {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(self.canary())
            .unwrap();
        file.write_all_at(&[tag; 4096], 0).unwrap();
    }

    fn canary_kept(&self, tag: u8) -> bool {
        std::fs::read(self.canary()).unwrap().first() != Some(&tag)
    }

    /// Mount the image (replaying ext4's journal, as after a power cut). commit=60 keeps
    /// ext4 from committing on its own during a trial, and data=writeback keeps a journal
    /// commit (a directory's fsync) from writing files' data along, as XFS does not
    /// either: what is on the image at the cut is what was fsync'd, and whatever
    /// writeback had reached the disk.
    fn attach(&mut self) {
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&self.image)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "losetup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let device = String::from_utf8(out.stdout).unwrap().trim().to_string();
        run(
            "mount",
            &[
                "-o",
                "commit=60,data=writeback",
                &device,
                self.mnt.to_str().unwrap(),
            ],
        );
        self.device = Some(device);
    }

    /// Cut the power: copy the image as the block device holds it now (dirty pages of the
    /// mounted filesystem are not in it), then drop the mounted filesystem and continue
    /// from the copy.
    fn cut_power_copy(&self) -> PathBuf {
        let copy = self.image.with_extension("cut");
        run(
            "cp",
            &[
                "--sparse=always",
                self.image.to_str().unwrap(),
                copy.to_str().unwrap(),
            ],
        );
        copy
    }

    fn replace_with(&mut self, copy: &Path) {
        self.detach();
        std::fs::rename(copy, &self.image).unwrap();
        self.attach();
    }

    fn detach(&mut self) {
        if let Some(device) = self.device.take() {
            let _ = Command::new("umount").arg(&self.mnt).status();
            let _ = Command::new("losetup").args(["-d", &device]).status();
        }
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        self.detach();
    }
}

/// Power loss, not just process death: the store and state live on a loop-mounted ext4;
/// at a random instant the process is killed and the image copied as the block device
/// holds it (without the page cache's dirty data), then the copy is mounted (journal
/// replay) and checked like any other crash. `CKPTFS_POWERLOSS_TRIALS` (default 8).
#[test]
fn power_loss_at_random_instants() {
    let trials: usize = std::env::var("CKPTFS_POWERLOSS_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let dir = tempfile::tempdir().unwrap();
    let mut disk = Disk::create(dir.path());
    let mut rng = Rng(0x0090_77e7_1055_u64 | 1);
    let mut reported: BTreeMap<u64, Rounds> = BTreeMap::new();
    let mut problems = Vec::new();
    let (mut verified, mut lost_canaries, started) = (0, 0, Instant::now());
    for trial in 0..trials {
        let store = disk.mnt.join("store");
        // Settle: everything before this trial is on the image, so only the trial's own
        // writes can be lost.
        run("sync", &["-f", disk.mnt.to_str().unwrap()]);
        let tag = b'a' + (trial % 26) as u8;
        disk.scribble_canary(tag);
        let delay = Duration::from_millis(300 + rng.below(2500));
        let mut copy = None;
        let run = workload_then(&store, mode_of(trial), None, Some(delay), &mut || {
            copy = Some(disk.cut_power_copy());
        });
        disk.replace_with(&copy.expect("copied at death"));
        if disk.canary_kept(tag) {
            lost_canaries += 1;
        }
        reported.extend(run.reported);
        let before = problems.len();
        verified += check(&store, &reported, &mut problems);
        if problems.len() > before {
            eprintln!("power-loss trial {trial}: {:?}", &problems[before..]);
        }
        forget_dropped(&store, &mut reported);
    }
    eprintln!(
        "\npower loss: {trials} cuts, {verified} checkpoints verified, {} problems, \
         unsynced canary writes lost in {lost_canaries} of {trials} cuts, {:.0} s",
        problems.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(
        lost_canaries * 2 >= trials,
        "the cut kept unsynced writes in {} of {trials} trials: it does not model power loss",
        trials - lost_canaries
    );
}
