//! One writer per store on object storage: a lease record (`lease.json`) taken and renewed
//! with conditional PUTs.
//!
//! A `flock` fences daemons of one host only. On object storage the writer holds a lease
//! that names it and the time it expires; it renews the lease well before that time, each
//! renewal conditional on the version it wrote last, so a renewal that finds the lease
//! changed (taken over) fails. Another daemon refuses to start while the lease is live
//! and takes it over once it has expired. A writer that cannot renew in time, or finds
//! its lease taken, stops writing: every catalog write checks the lease first.
//!
//! Expiry compares the writer's clock with the reader's: hosts must keep their clocks
//! within a small fraction of the lease time of each other (NTP does).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::fsutil::{lock, now_unix_ms};
use crate::store::records::{Put, Records};

const KEY: &str = "lease.json";

/// How long a lease lasts without renewal (renewed every third of it).
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

#[derive(Debug, Serialize, Deserialize)]
struct LeaseRecord {
    /// Who holds it: host and process id, for the error of a refused start.
    holder: String,
    /// This holding's unique token (a restarted daemon on the same host is another holder).
    token: String,
    /// When it expires unless renewed, in milliseconds since the Unix epoch.
    expires_unix_ms: u64,
}

struct Shared {
    records: Arc<dyn Records>,
    holder: String,
    token: String,
    ttl: Duration,
    /// The version of the lease record as this holder last wrote it.
    version: Mutex<Option<String>>,
    /// Until when this holder may write: the last successful renewal plus the lease time,
    /// less a margin, on this host's monotonic clock.
    valid_until: Mutex<Instant>,
    lost: AtomicBool,
}

/// A held lease; renewed by a thread until dropped, then released.
pub struct Lease {
    shared: Arc<Shared>,
    stop: Arc<(Mutex<bool>, Condvar)>,
    renewer: Option<JoinHandle<()>>,
}

/// The check every catalog write makes first: is this process still the writer?
#[derive(Clone)]
pub struct Fence(Arc<Shared>);

impl Fence {
    pub fn check(&self) -> Result<()> {
        let shared = &self.0;
        if shared.lost.load(Ordering::SeqCst) {
            return Err(Error::Conflict(format!(
                "the lease on {} was lost (taken over by another daemon?): this daemon no \
                 longer writes to the store",
                shared.records.describe(KEY)
            )));
        }
        if Instant::now() > *lock(&shared.valid_until) {
            return Err(Error::Conflict(format!(
                "the lease on {} could not be renewed in time: this daemon does not write \
                 to the store until it is",
                shared.records.describe(KEY)
            )));
        }
        Ok(())
    }
}

/// Who holds the lease of the store in `records`, and until when (milliseconds since the
/// Unix epoch; in the past when released or expired). `None` where there is no lease
/// record (a local store, or one no daemon wrote to).
pub fn holder(records: &dyn Records) -> Result<Option<(String, u64)>> {
    Ok(records
        .get(KEY)?
        .and_then(|r| serde_json::from_slice::<LeaseRecord>(&r.bytes).ok())
        .map(|r| (r.holder, r.expires_unix_ms)))
}

impl Lease {
    /// Take the lease of the store in `records`, or fail naming the live holder.
    pub fn acquire(records: Arc<dyn Records>, ttl: Duration) -> Result<Lease> {
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "unknown-host".into());
        let holder = format!("{host} pid {}", std::process::id());
        let token = blake3::hash(
            format!(
                "{holder} {} {:?}",
                now_unix_ms(),
                std::time::SystemTime::now()
            )
            .as_bytes(),
        )
        .to_hex()[..16]
            .to_string();
        let shared = Arc::new(Shared {
            records,
            holder,
            token,
            ttl,
            version: Mutex::new(None),
            valid_until: Mutex::new(Instant::now()),
            lost: AtomicBool::new(false),
        });
        let started = Instant::now();
        let existing = shared.records.get(KEY)?;
        let mode = match existing {
            None => Put::Create,
            Some(record) => {
                let current: Option<LeaseRecord> = serde_json::from_slice(&record.bytes).ok();
                match current {
                    Some(current) if current.expires_unix_ms > now_unix_ms() => {
                        let left = current.expires_unix_ms - now_unix_ms();
                        return Err(Error::Locked {
                            what: "store",
                            path: shared.records.describe(""),
                            holder: format!(
                                " (lease held by {}, expires in {:.1} s unless renewed)",
                                current.holder,
                                left as f64 / 1000.0
                            ),
                        });
                    }
                    Some(current) => {
                        log::warn!(
                            "taking over the expired lease of {} on {}",
                            current.holder,
                            shared.records.describe("")
                        );
                        Put::Update(record.version)
                    }
                    None => {
                        log::warn!("replacing an unreadable lease record");
                        Put::Update(record.version)
                    }
                }
            }
        };
        let version = shared
            .records
            .put(KEY, &shared.record(), mode)
            .map_err(|e| match e {
                Error::Exists(_) | Error::Conflict(_) => Error::Locked {
                    what: "store",
                    path: shared.records.describe(""),
                    holder: " (another daemon took the lease at the same moment)".into(),
                },
                e => e,
            })?;
        *lock(&shared.version) = version;
        *lock(&shared.valid_until) = started + ttl.mul_f64(0.8);
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

    pub fn fence(&self) -> Fence {
        Fence(self.shared.clone())
    }
}

impl Shared {
    fn record(&self) -> Vec<u8> {
        self.record_expiring(now_unix_ms() + self.ttl.as_millis() as u64)
    }

    fn record_expiring(&self, expires_unix_ms: u64) -> Vec<u8> {
        serde_json::to_vec_pretty(&LeaseRecord {
            holder: self.holder.clone(),
            token: self.token.clone(),
            expires_unix_ms,
        })
        .expect("serializes")
    }

    fn renew(&self) -> Result<()> {
        let started = Instant::now();
        let version = lock(&self.version).clone();
        let written = self
            .records
            .put(KEY, &self.record(), Put::Update(version))?;
        *lock(&self.version) = written;
        *lock(&self.valid_until) = started + self.ttl.mul_f64(0.8);
        Ok(())
    }
}

fn renew_loop(shared: &Shared, stop: &(Mutex<bool>, Condvar)) {
    let interval = shared.ttl / 3;
    let mut stopped = lock(&stop.0);
    loop {
        stopped = stop
            .1
            .wait_timeout(stopped, interval)
            .unwrap_or_else(|p| p.into_inner())
            .0;
        if *stopped {
            return;
        }
        match shared.renew() {
            Ok(()) => {}
            Err(Error::Conflict(_)) => {
                shared.lost.store(true, Ordering::SeqCst);
                log::error!(
                    "the lease on {} was taken by another daemon: no longer writing",
                    shared.records.describe(KEY)
                );
                return;
            }
            Err(e) => log::warn!("could not renew the lease: {e} (retrying)"),
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
        // Released: expired now, so the next daemon takes it over at once.
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
