//! One writer per store on object storage: a lease record (`lease.json`) taken and renewed
//! with conditional PUTs.
//!
//! A `flock` fences daemons of one host only. On object storage the writer holds a lease
//! that names it; it renews the lease every third of the lease time, each renewal
//! conditional on the version it wrote last, so a renewal that finds the lease changed
//! (taken over) fails. The lease is for liveness, to decide who may become the writer; it
//! does not make the writes safe on its own: the commit of every catalog change is a
//! conditional write of `ckptfs.json` that a takeover invalidates (see `docs/fencing.md`).
//!
//! No decision compares two hosts' clocks:
//! - A holder may write for [`VALID_FRACTION`] of the lease time after *sending* its last
//!   renewal that landed, measured on `CLOCK_BOOTTIME` (which, unlike the monotonic clock,
//!   goes on during a suspend).
//! - A contender takes a lease over only when it was released, when its holder is provably
//!   dead (same host and boot, the process is gone), when the store's own clock says the
//!   record was last written more than the lease time (plus [`CLOCK_SLACK`]) ago, or when
//!   the contender has watched the record stay unchanged for that long on its own clock.
//!   Each of these happens after the holder stopped writing, whatever the clocks' offsets.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};
use crate::fsutil::{boot_now, lock, now_unix_ms, wait_timeout};
use crate::store::records::{Put, Record, Records};

const KEY: &str = crate::store::layout::LEASE;

/// How long a lease lasts without renewal (renewed every third of it).
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// The shortest lease time accepted (a renewal a second).
pub const MIN_TTL: Duration = Duration::from_secs(3);
/// The longest lease time accepted (a dead writer's lease can hold the store up that long).
pub const MAX_TTL: Duration = Duration::from_secs(3600);
/// The part of the lease time a holder writes for after sending its last landed renewal.
const VALID_FRACTION: f64 = 0.8;
/// Allowance for the store's clock granularity (`Last-Modified` is to the second) when a
/// contender judges a record's age by it.
const CLOCK_SLACK: Duration = Duration::from_secs(2);

#[derive(Debug, Serialize, Deserialize)]
struct LeaseRecord {
    /// Who holds it: host and process id, for messages.
    holder: String,
    /// This holding's unique token (a restarted daemon on the same host is another holder).
    token: String,
    /// When it expires unless renewed, by the holder's clock, in milliseconds since the Unix
    /// epoch: shown to people, never used to decide (clocks differ). 0: released.
    expires_unix_ms: u64,
    /// The lease time the holder renews within.
    #[serde(default)]
    ttl_ms: u64,
    /// The holder's host, boot, pid namespace, pid and process start time: a contender on
    /// the same host and boot can tell that the holder is dead.
    #[serde(default)]
    host: String,
    #[serde(default)]
    boot_id: String,
    #[serde(default)]
    pid_ns: String,
    #[serde(default)]
    pid: u32,
    #[serde(default)]
    start_ticks: u64,
    /// Renewals so far: every write of the record has new bytes (and a new ETag).
    #[serde(default)]
    renewal: u64,
}

/// Who and what this process is, as a lease names it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ProcessIdentity {
    host: String,
    boot_id: String,
    pid_ns: String,
    pid: u32,
    start_ticks: u64,
}

impl ProcessIdentity {
    fn current() -> ProcessIdentity {
        let pid = std::process::id();
        ProcessIdentity {
            host: nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_else(|| "unknown-host".into()),
            boot_id: std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
            pid_ns: std::fs::read_link("/proc/self/ns/pid")
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default(),
            pid,
            start_ticks: process_start_ticks(pid).unwrap_or(0),
        }
    }
}

/// A process's start time in clock ticks since boot (`/proc/PID/stat`, field 22); `None`
/// if there is no such process, or only its zombie (killed, not reaped yet).
fn process_start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count from its end.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    if matches!(fields.next(), Some("Z" | "X" | "x")) {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

impl LeaseRecord {
    /// True if the holder is provably dead: it ran on this host, in this boot and pid
    /// namespace, and its process is gone (or the pid now belongs to a later process).
    fn holder_is_dead(&self, me: &ProcessIdentity) -> bool {
        let same_place = !self.boot_id.is_empty()
            && !self.pid_ns.is_empty()
            && self.pid != 0
            && self.host == me.host
            && self.boot_id == me.boot_id
            && self.pid_ns == me.pid_ns;
        same_place
            && self.pid != me.pid
            && process_start_ticks(self.pid).is_none_or(|t| t != self.start_ticks)
    }
}

struct Shared {
    records: Arc<dyn Records>,
    me: ProcessIdentity,
    holder: String,
    token: String,
    ttl: Duration,
    renewals: std::sync::atomic::AtomicU64,
    /// The version of the lease record as this holder last wrote it.
    version: Mutex<Option<String>>,
    /// Until when this holder may write, on the boot clock ([`boot_now`]).
    valid_until: Mutex<Duration>,
    lost: AtomicBool,
}

/// A held lease; renewed by a thread until dropped, then released.
pub struct Lease {
    shared: Arc<Shared>,
    stop: Arc<(Mutex<bool>, Condvar)>,
    renewer: Option<JoinHandle<()>>,
}

/// The check every write to the store makes first: is this process still the writer?
#[derive(Clone)]
pub struct Fence(Arc<Shared>);

impl Fence {
    /// Fail ([`Error::Conflict`]) if this process may not write: its lease was lost
    /// (taken over, or another writer found in a conditional commit), or it could not be
    /// renewed within its validity.
    pub fn check(&self) -> Result<()> {
        let shared = &self.0;
        if shared.lost.load(Ordering::SeqCst) {
            return Err(Error::Conflict(format!(
                "the lease on {} was lost (taken over by another daemon?): this daemon no \
                 longer writes to the store",
                shared.records.describe(KEY)
            )));
        }
        if boot_now() > *lock(&shared.valid_until) {
            return Err(Error::Conflict(format!(
                "the lease on {} could not be renewed in time: this daemon does not write \
                 to the store until it is",
                shared.records.describe(KEY)
            )));
        }
        Ok(())
    }

    /// Note that another writer has taken the store (a conditional commit found it
    /// changed): nothing more is written, whatever the lease record says.
    pub fn lose(&self) {
        self.0.lost.store(true, Ordering::SeqCst);
    }
}

impl crate::store::WriteFence for Fence {
    fn check(&self) -> Result<()> {
        Fence::check(self)
    }

    /// The part of the lease time beyond the holder's validity (it may write for
    /// [`VALID_FRACTION`] of it after sending its last renewal that landed): a request sent
    /// at the last valid instant and abandoned after this ends before a takeover can begin.
    fn request_budget(&self) -> Option<Duration> {
        Some(self.0.ttl.mul_f64(1.0 - VALID_FRACTION))
    }
}

/// Where a daemon that waits for a lease says so, besides its log (the `ckptfs mount`
/// that started it prints it): set once by the program.
static WAIT_NOTICE: std::sync::OnceLock<fn(&str)> = std::sync::OnceLock::new();

/// Tell `notice` when a lease is waited for (the first time, per acquisition).
pub fn on_wait(notice: fn(&str)) {
    let _ = WAIT_NOTICE.set(notice);
}

/// Who holds the lease of the store in `records`, and until when by the holder's clock
/// (milliseconds since the Unix epoch; 0 when released). `None` where there is no lease
/// record (a local store, or one no daemon wrote to).
pub fn holder(records: &dyn Records) -> Result<Option<(String, u64)>> {
    Ok(records
        .get(KEY)?
        .and_then(|r| serde_json::from_slice::<LeaseRecord>(&r.bytes).ok())
        .map(|r| (r.holder, r.expires_unix_ms)))
}

/// Check a lease time given by the user.
pub fn validate_ttl(ttl: Duration) -> Result<Duration> {
    if ttl < MIN_TTL || ttl > MAX_TTL {
        return Err(Error::Invalid(format!(
            "lease time {} is out of range: it must be between {} and {} (the lease is \
             renewed every third of it)",
            humantime::format_duration(ttl),
            humantime::format_duration(MIN_TTL),
            humantime::format_duration(MAX_TTL)
        )));
    }
    Ok(ttl)
}

/// What a contender makes of the lease record it read.
enum Verdict {
    /// Take it with this write; why, for the log, and whether that is worth a warning (a
    /// holder that did not release it: crashed, stopped renewing).
    Take(Put, String, Warn),
    /// Someone holds it: who, and how long at most until it can be taken over.
    Held(String, Duration),
}

/// Whether taking a lease is worth a warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Warn {
    /// A new lease, or one its holder released at a clean stop: the ordinary case.
    No,
    /// A holder that did not release it (crashed, killed, or stopped renewing).
    Yes,
}

/// A contender's watch of the lease record: the version it saw first and when.
struct Watch {
    seen: Option<(Vec<u8>, Duration)>,
}

impl Watch {
    fn judge(
        &mut self,
        records: &dyn Records,
        me: &ProcessIdentity,
        ttl: Duration,
    ) -> Result<Verdict> {
        let looked = boot_now();
        let Some(record) = records.get(KEY)? else {
            return Ok(Verdict::Take(Put::Create, "a new lease".into(), Warn::No));
        };
        let version = Put::Update(record.version.clone());
        let parsed: Option<LeaseRecord> = serde_json::from_slice(&record.bytes).ok();
        if let Some(current) = &parsed {
            if current.expires_unix_ms == 0 {
                return Ok(Verdict::Take(
                    version,
                    format!("the lease released by {}", current.holder),
                    Warn::No,
                ));
            }
            if current.holder_is_dead(me) {
                return Ok(Verdict::Take(
                    version,
                    format!(
                        "the lease of {}, a process of this host that is gone",
                        current.holder
                    ),
                    Warn::Yes,
                ));
            }
        }
        let holder = parsed.as_ref().map_or_else(
            || "an unreadable lease record".to_string(),
            |c| c.holder.clone(),
        );
        let lasts = parsed
            .as_ref()
            .filter(|c| c.ttl_ms > 0)
            .map_or(ttl, |c| Duration::from_millis(c.ttl_ms))
            + CLOCK_SLACK;
        // Its age by the store's clock...
        let by_store = match (record.modified, records.store_now()?) {
            (Some(modified), Some(now)) => now.duration_since(modified).unwrap_or_default(),
            _ => Duration::ZERO,
        };
        // ...and for how long this contender has seen it unchanged, by its own.
        let identity = identity_of(&record);
        let watched = match &self.seen {
            Some((seen, since)) if *seen == identity => looked.saturating_sub(*since),
            _ => {
                self.seen = Some((identity, looked));
                Duration::ZERO
            }
        };
        let age = by_store.max(watched);
        if age >= lasts {
            return Ok(Verdict::Take(
                version,
                format!(
                    "the lease of {holder}, not renewed for {}",
                    humantime::format_duration(Duration::from_secs(age.as_secs()))
                ),
                Warn::Yes,
            ));
        }
        Ok(Verdict::Held(holder, lasts - age))
    }
}

/// What tells one write of the lease record from another: its version, or its bytes.
fn identity_of(record: &Record) -> Vec<u8> {
    match &record.version {
        Some(v) => v.as_bytes().to_vec(),
        None => record.bytes.clone(),
    }
}

impl Lease {
    /// Take the lease of the store in `records`, waiting up to `wait` for a live holder's
    /// lease to end; fails naming the holder if it does not.
    pub fn acquire(records: Arc<dyn Records>, ttl: Duration, wait: Duration) -> Result<Lease> {
        let me = ProcessIdentity::current();
        let holder = format!("{} pid {}", me.host, me.pid);
        let token = blake3::hash(
            format!(
                "{holder} {} {:?} {:?}",
                now_unix_ms(),
                boot_now(),
                std::thread::current().id()
            )
            .as_bytes(),
        )
        .to_hex()[..16]
            .to_string();
        let shared = Arc::new(Shared {
            records,
            me,
            holder,
            token,
            ttl,
            renewals: std::sync::atomic::AtomicU64::new(0),
            version: Mutex::new(None),
            valid_until: Mutex::new(Duration::ZERO),
            lost: AtomicBool::new(false),
        });
        let deadline = boot_now() + wait;
        let mut watch = Watch { seen: None };
        let mut told = false;
        loop {
            let started = boot_now();
            match watch.judge(shared.records.as_ref(), &shared.me, ttl)? {
                Verdict::Take(mode, why, warn) => {
                    match shared.records.put(KEY, &shared.record(), mode) {
                        Ok(version) => {
                            let store = shared.records.describe("");
                            match warn {
                                Warn::Yes => log::warn!("took over {why} on {store}"),
                                Warn::No => log::info!("took {why} on {store}"),
                            }
                            *lock(&shared.version) = version;
                            *lock(&shared.valid_until) = started + ttl.mul_f64(VALID_FRACTION);
                            break;
                        }
                        // Someone else wrote it meanwhile: look again.
                        Err(e) if matches!(e.kind(), ErrorKind::Exists | ErrorKind::Conflict) => {
                            watch.seen = None;
                        }
                        Err(e) => return Err(e),
                    }
                }
                Verdict::Held(holder, left) => {
                    let now = boot_now();
                    if now >= deadline {
                        return Err(Error::Locked {
                            what: "store",
                            path: shared.records.describe(""),
                            holder: format!(
                                " (lease held by {holder}; it can be taken over in {:.0} s \
                                 unless renewed: stop that daemon, or wait longer with \
                                 --lease-wait)",
                                left.as_secs_f64().ceil()
                            ),
                        });
                    }
                    if !told {
                        let msg = format!(
                            "the lease of {} is held by {holder}: waiting up to {} for it \
                             (it can be taken over in {:.0} s unless renewed)",
                            shared.records.describe(""),
                            humantime::format_duration(Duration::from_secs(
                                (deadline - now).as_secs()
                            )),
                            left.as_secs_f64().ceil()
                        );
                        log::warn!("{msg}");
                        if let Some(notice) = WAIT_NOTICE.get() {
                            notice(&msg);
                        }
                        told = true;
                    }
                    std::thread::sleep(left.min(deadline - now).min(Duration::from_secs(1)));
                }
            }
        }
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let renewer = {
            let (shared, stop) = (shared.clone(), stop.clone());
            std::thread::Builder::new()
                .name("ckptfs-lease".into())
                .spawn(move || renew_loop(&shared, &stop))
                .map_err(|e| Error::io("start the lease thread", e))?
        };
        Ok(Lease {
            shared,
            stop,
            renewer: Some(renewer),
        })
    }

    /// The fence of this lease, for the catalog and the object store to check before each
    /// write.
    pub fn fence(&self) -> Fence {
        Fence(self.shared.clone())
    }
}

impl Shared {
    fn record(&self) -> Vec<u8> {
        let expires = now_unix_ms() + self.ttl.as_millis() as u64;
        self.record_expiring(expires)
    }

    fn record_expiring(&self, expires_unix_ms: u64) -> Vec<u8> {
        let renewal = self.renewals.fetch_add(1, Ordering::SeqCst) + 1;
        serde_json::to_vec_pretty(&LeaseRecord {
            holder: self.holder.clone(),
            token: self.token.clone(),
            expires_unix_ms,
            ttl_ms: self.ttl.as_millis() as u64,
            host: self.me.host.clone(),
            boot_id: self.me.boot_id.clone(),
            pid_ns: self.me.pid_ns.clone(),
            pid: self.me.pid,
            start_ticks: self.me.start_ticks,
            renewal,
        })
        .expect("serializes")
    }

    fn renew(&self) -> Result<()> {
        let started = boot_now();
        let version = lock(&self.version).clone();
        let written = match self.records.put(KEY, &self.record(), Put::Update(version)) {
            Ok(version) => version,
            // A renewal whose response was lost may have landed before the retry that was
            // refused: the lease is still ours if the record holds our token (every
            // takeover writes its own).
            Err(e) if matches!(e.kind(), ErrorKind::Conflict | ErrorKind::Exists) => {
                match self.records.get(KEY)? {
                    Some(record)
                        if serde_json::from_slice::<LeaseRecord>(&record.bytes)
                            .is_ok_and(|r| r.token == self.token && r.expires_unix_ms != 0) =>
                    {
                        log::info!("the lease renewal landed before its retry was refused");
                        record.version
                    }
                    _ => return Err(Error::Conflict(e.to_string())),
                }
            }
            Err(e) => return Err(e),
        };
        *lock(&self.version) = written;
        *lock(&self.valid_until) = started + self.ttl.mul_f64(VALID_FRACTION);
        Ok(())
    }
}

fn renew_loop(shared: &Shared, stop: &(Mutex<bool>, Condvar)) {
    let interval = shared.ttl / 3;
    let mut wait = interval;
    let mut stopped = lock(&stop.0);
    loop {
        stopped = wait_timeout(&stop.1, stopped, wait);
        if *stopped {
            return;
        }
        if shared.lost.load(Ordering::SeqCst) {
            return;
        }
        match shared.renew() {
            Ok(()) => wait = interval,
            Err(e) if e.kind() == ErrorKind::Conflict => {
                shared.lost.store(true, Ordering::SeqCst);
                log::error!(
                    "the lease on {} was taken by another daemon: no longer writing",
                    shared.records.describe(KEY)
                );
                return;
            }
            Err(e) => {
                log::warn!("could not renew the lease: {e} (retrying)");
                wait = interval.min(Duration::from_secs(1));
            }
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        *lock(&self.stop.0) = true;
        self.stop.1.notify_all();
        if let Some(thread) = self.renewer.take() {
            let _ = thread.join();
        }
        if self.shared.lost.load(Ordering::SeqCst) {
            return;
        }
        // Released: the next daemon takes it over at once. Conditional on the version this
        // holder wrote, so a lease taken over meanwhile is left alone.
        let version = lock(&self.shared.version).clone();
        let released = self.shared.record_expiring(0);
        if let Err(e) = self
            .shared
            .records
            .put(KEY, &released, Put::Update(version))
        {
            log::warn!("could not release the lease: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_of_this_process_is_read_and_a_missing_pid_has_none() {
        let me = ProcessIdentity::current();
        assert!(me.start_ticks > 0);
        assert_eq!(process_start_ticks(me.pid), Some(me.start_ticks));
        // Pids are below 2^22 on Linux.
        assert_eq!(process_start_ticks(u32::MAX - 1), None);
    }

    #[test]
    fn a_zombie_counts_as_gone() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Exited, not reaped: only its zombie remains.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while process_start_ticks(pid).is_some() {
            assert!(std::time::Instant::now() < deadline, "no zombie");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(std::fs::metadata(format!("/proc/{pid}")).is_ok());
        child.wait().unwrap();
    }

    #[test]
    fn a_holder_is_dead_only_on_this_host_boot_and_namespace_with_its_process_gone() {
        let me = ProcessIdentity::current();
        let record = |pid: u32, start_ticks: u64, host: &str| LeaseRecord {
            holder: "h".into(),
            token: "t".into(),
            expires_unix_ms: 1,
            ttl_ms: 1000,
            host: host.into(),
            boot_id: me.boot_id.clone(),
            pid_ns: me.pid_ns.clone(),
            pid,
            start_ticks,
            renewal: 1,
        };
        let gone = u32::MAX - 1;
        assert!(record(gone, 5, &me.host).holder_is_dead(&me));
        // Another host's pid says nothing here.
        assert!(!record(gone, 5, "elsewhere").holder_is_dead(&me));
        // A live process with the recorded start time is alive; a reused pid is not it.
        let parent = std::os::unix::process::parent_id();
        let started = process_start_ticks(parent).unwrap();
        assert!(!record(parent, started, &me.host).holder_is_dead(&me));
        assert!(record(parent, started + 1, &me.host).holder_is_dead(&me));
        // Records of older versions (no boot id) are never judged dead.
        let mut old = record(gone, 5, &me.host);
        old.boot_id.clear();
        assert!(!old.holder_is_dead(&me));
    }

    #[test]
    fn lease_times_out_of_range_are_refused() {
        assert!(validate_ttl(Duration::ZERO).is_err());
        assert!(validate_ttl(Duration::from_millis(300)).is_err());
        assert!(validate_ttl(Duration::from_secs(7200)).is_err());
        assert_eq!(
            validate_ttl(Duration::from_secs(30)).unwrap(),
            Duration::from_secs(30)
        );
    }
}
