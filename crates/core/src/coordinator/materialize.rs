//! The synchronous phase of one backend, and `wal` mode's materializations.
//!
//! In `flush` mode a checkpoint flushes the memtables and stores the SSTs that are new: its
//! upload follows what flushes and compactions rewrote. In `wal` mode it does not flush: it
//! names the SSTs, MANIFEST, CURRENT and OPTIONS of the backend's last *materialization*
//! (a checkpoint that adopted the SST set RocksDB had then) plus every WAL file written since,
//! which stock RocksDB replays when it opens the directory. WAL files only grow and are
//! stored as chunks, so a checkpoint uploads about what the workload wrote since the
//! previous one; SSTs that compaction creates and deletes between two materializations are
//! never uploaded. The first checkpoint of a lineage (after a start or a restore)
//! materializes itself; later, once `interval` has passed since the last materialization
//! or the WAL since it reached `wal_bytes` (which bounds what opening a checkpoint
//! replays), the next one is prepared in the background (its files stored and pinned) and
//! adopted by the first checkpoint after it is ready.
//!
//! WAL files RocksDB no longer needs itself are kept in its archive (`db/archive/`) until a
//! newer materialization is confirmed; a checkpoint hard-links the ones it needs during its
//! synchronous phase, so pruning the archive never takes a file from under it.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ingest::{ChunkedPrefix, Ingest, PendingBackend};
use super::state::Lineages;
use super::Engine;
use crate::backend::{wal_number, CheckpointMode, StagedFile};
use crate::catalog::{BackendSnapshot, CheckpointStats, FileEntry};
use crate::error::Result;
use crate::fsutil::{create_private_dir_all, remove_tree};
use crate::names::BackendName;
use crate::store::ObjectId;

/// When a `wal` mode checkpoint materializes.
#[derive(Debug, Clone, Copy)]
pub struct MaterializePolicy {
    /// At the first checkpoint this long after the previous materialization.
    pub interval: Duration,
    /// At the first checkpoint after one whose WAL (since the materialization) reached this
    /// many bytes in a backend.
    pub wal_bytes: u64,
    /// Prepare a due materialization in the background (its SSTs stored while checkpoints
    /// go on on top of the previous one; the next checkpoint after it is ready adopts it)
    /// instead of in the asynchronous phase of the checkpoint that found it due.
    pub background: bool,
}

impl Default for MaterializePolicy {
    fn default() -> Self {
        MaterializePolicy {
            interval: Duration::from_secs(10 * 60),
            wal_bytes: 256 << 20,
            background: true,
        }
    }
}

/// The newest confirmed materialization of a backend's current lineage.
#[derive(Debug, Clone)]
struct Materialization {
    pub checkpoint: u64,
    pub lineage: String,
    /// Its files other than WAL files (SSTs, MANIFEST, CURRENT, OPTIONS).
    pub files: Vec<Arc<FileEntry>>,
    /// WAL files numbered from here on are replayed on top of it.
    pub wal_from: u64,
    pub at: Instant,
    /// WAL bytes of the newest checkpoint built on it (the size trigger).
    pub wal_bytes: u64,
}

/// A materialization prepared in the background: its files stored and pinned, waiting for
/// the next checkpoint of the backend to adopt it.
struct Prepared {
    mat: Materialization,
    pins: Vec<ObjectId>,
    /// Bytes it stored.
    uploaded: u64,
}

/// `wal` mode's part of the engine's state (under its lock): each backend's newest confirmed
/// materialization, the ones being prepared in the background or waiting to be adopted,
/// and how far each WAL file was cut into chunks.
#[derive(Default)]
pub(super) struct WalState {
    /// The newest confirmed materialization of each backend.
    materializations: HashMap<BackendName, Materialization>,
    /// Backends whose materialization is being prepared in the background.
    preparing: BTreeSet<BackendName>,
    /// The prepared ones, waiting for a checkpoint to adopt them.
    prepared: HashMap<BackendName, Prepared>,
    /// Per backend (and its lineage): how far each of its WAL files was cut into chunks by
    /// the newest checkpoint that stored it.
    pub prefixes: HashMap<BackendName, (String, HashMap<String, Arc<ChunkedPrefix>>)>,
}

impl WalState {
    /// A materialization is being prepared in the background.
    pub fn is_preparing(&self) -> bool {
        !self.preparing.is_empty()
    }

    /// The checkpoint each backend's newest confirmed materialization is.
    pub fn confirmed(&self) -> Vec<(BackendName, u64)> {
        self.materializations
            .iter()
            .map(|(name, m)| (name.clone(), m.checkpoint))
            .collect()
    }

    /// After checkpoint `id` was committed, for one of its backends: remember what it
    /// materialized (or how much WAL it carried on top of a materialization). Returns the
    /// WAL number below which the backend's archive can be pruned.
    pub fn committed(
        &mut self,
        lineages: &Lineages,
        id: u64,
        started: Instant,
        part: &PendingBackend,
        snapshot: &BackendSnapshot,
    ) -> Option<u64> {
        let wal_bytes: u64 = part
            .files
            .iter()
            .filter(|f| wal_number(&f.name).is_some())
            .map(|f| f.size)
            .sum();
        let current = lineages.is_current(&part.name, &part.lineage);
        let Some(wal_from) = part.materializes else {
            if let Some(m) = self.materializations.get_mut(&part.name) {
                if m.lineage == part.lineage {
                    m.wal_bytes = m.wal_bytes.max(wal_bytes);
                }
            }
            return None;
        };
        let newer = self
            .materializations
            .get(&part.name)
            .is_none_or(|m| m.lineage != part.lineage || m.checkpoint < id);
        if !(newer && current) {
            return None;
        }
        let files = snapshot
            .files
            .iter()
            .filter(|f| wal_number(&f.name).is_none())
            .cloned()
            .collect();
        self.materializations.insert(
            part.name.clone(),
            Materialization {
                checkpoint: id,
                lineage: part.lineage.clone(),
                files,
                wal_from,
                at: started,
                wal_bytes,
            },
        );
        Some(wal_from)
    }
}

/// What a checkpoint builds on (see [`Engine::choose_base`]).
struct BaseChoice {
    /// The materialization, and whether it is a prepared one adopted now (with the bytes
    /// it stored).
    on_top_of: Option<(Materialization, Option<u64>)>,
    /// Start preparing the next materialization in the background.
    prepare: bool,
}

/// One backend's part of a checkpoint after its synchronous phase.
pub(super) struct StagedBackend {
    pub lineage: String,
    /// Files to store (all of them, or only the WAL files on top of a materialization).
    pub files: Vec<StagedFile>,
    /// Files named as they are from the materialization (pinned during the sync phase).
    pub kept: Vec<Arc<FileEntry>>,
    /// `wal` mode: this checkpoint materializes; WAL files from this number on belong to
    /// the checkpoints that follow.
    pub materializes: Option<u64>,
    /// Bytes a background materialization this checkpoint adopts stored before.
    pub uploaded_before: u64,
}

impl Engine {
    /// The synchronous phase of one backend: its files staged in `dir` (which must not
    /// exist yet) and, in `wal` mode, the materialization they build on, pinned.
    pub(super) fn stage_backend(
        &self,
        name: &BackendName,
        dir: &Path,
        started: Instant,
        pins: &mut Vec<ObjectId>,
    ) -> Result<StagedBackend> {
        let policy = self.inner.materialize;
        let staged = self.with_backend(name, |b| {
            let lineage = b.lineage().to_string();
            if self.inner.backend_options.checkpoint_mode == CheckpointMode::Flush {
                return Ok(StagedBackend {
                    lineage,
                    files: b.checkpoint_into(dir, 0)?,
                    kept: Vec::new(),
                    materializes: None,
                    uploaded_before: 0,
                });
            }
            let base = self.choose_base(name, &lineage, started, &policy, pins);
            if base.prepare {
                // Started here, whatever happens to this checkpoint: `preparing` is set.
                let (engine, name) = (self.clone(), name.clone());
                std::thread::spawn(move || engine.prepare_materialization(name));
            }
            let flush_at = match base.on_top_of {
                Some((mat, adopted)) => {
                    // The WAL files written since the materialization, linked (no native
                    // checkpoint: its SSTs, MANIFEST and copied WAL would go unused).
                    let linked = b.link_wals(dir, mat.wal_from);
                    // A newer materialization confirmed meanwhile may have pruned some of
                    // these from the archive before they were linked: then materialize.
                    // (Pruning starts only after it is recorded, so if it is not recorded
                    // yet, every link above was made first.)
                    let pruned = self
                        .state()
                        .wal
                        .materializations
                        .get(name)
                        .is_some_and(|m| m.lineage == lineage && m.wal_from > mat.wal_from);
                    match linked {
                        Ok(files) if !pruned && !files.is_empty() => {
                            return Ok(StagedBackend {
                                lineage,
                                files,
                                kept: mat.files,
                                materializes: adopted.map(|_| mat.wal_from),
                                uploaded_before: adopted.unwrap_or(0),
                            });
                        }
                        Ok(_) => log::info!(
                            "backend {name}: materializing: no WAL file from {} on",
                            mat.wal_from
                        ),
                        Err(e) => log::info!("backend {name}: materializing: {e}"),
                    }
                    remove_tree(dir)?;
                    u64::MAX
                }
                // Flush only when the WAL a materialization would carry is already large.
                None => policy.wal_bytes,
            };
            let files = b.checkpoint_into(dir, flush_at)?;
            // Materialize: this checkpoint's own files, whatever RocksDB has now.
            let materializes = first_wal(&files);
            Ok(StagedBackend {
                lineage,
                files,
                kept: Vec::new(),
                materializes: Some(materializes),
                uploaded_before: 0,
            })
        })?;
        Ok(staged)
    }

    /// What a `wal` mode checkpoint of `name` builds on: a materialization prepared in the
    /// background (adopted: its pins move into `pins`), else the newest confirmed one (its
    /// objects pinned into `pins`); `None` when this checkpoint must materialize itself.
    /// Also says whether to start preparing the next materialization in the background.
    fn choose_base(
        &self,
        name: &BackendName,
        lineage: &str,
        started: Instant,
        policy: &MaterializePolicy,
        pins: &mut Vec<ObjectId>,
    ) -> BaseChoice {
        let mut st = self.state();
        if let Some(prepared) = st.wal.prepared.remove(name) {
            if prepared.mat.lineage == lineage {
                pins.extend(prepared.pins);
                return BaseChoice {
                    on_top_of: Some((prepared.mat, Some(prepared.uploaded))),
                    prepare: false,
                };
            }
            // Of an earlier lineage (a restore came between): useless now.
            self.release_pins(&mut st, prepared.pins);
        }
        let Some(mat) = st
            .wal
            .materializations
            .get(name)
            .filter(|m| m.lineage == lineage)
            .cloned()
        else {
            return BaseChoice {
                on_top_of: None,
                prepare: false,
            };
        };
        let due =
            started.duration_since(mat.at) >= policy.interval || mat.wal_bytes >= policy.wal_bytes;
        if due && !policy.background {
            return BaseChoice {
                on_top_of: None,
                prepare: false,
            };
        }
        let objects: Vec<ObjectId> = mat
            .files
            .iter()
            .flat_map(|f| f.stored())
            .map(|(id, _)| id)
            .collect();
        if !objects.iter().all(|id| st.can_share(id)) {
            return BaseChoice {
                on_top_of: None,
                prepare: false,
            };
        }
        for id in objects {
            st.held.registry.pin(id);
            pins.push(id);
        }
        let prepare = due && st.wal.preparing.insert(name.clone());
        BaseChoice {
            on_top_of: Some((mat, None)),
            prepare,
        }
    }

    /// Prepare the next materialization of `name` in the background: RocksDB's native
    /// checkpoint without a flush, its SSTs, MANIFEST, CURRENT and OPTIONS stored (pinned),
    /// kept for the next checkpoint of the backend to adopt.
    fn prepare_materialization(&self, name: BackendName) {
        let started = Instant::now();
        let mut pins = Vec::new();
        let result = self.prepare(&name, started, &mut pins);
        let mut st = self.state();
        st.wal.preparing.remove(&name);
        match result {
            Ok(prepared) if st.lineages.is_current(&name, &prepared.mat.lineage) => {
                log::info!(
                    "backend {name}: materialization prepared in {} ms ({} bytes stored)",
                    started.elapsed().as_millis(),
                    prepared.uploaded
                );
                if let Some(old) = st.wal.prepared.insert(name, prepared) {
                    self.release_pins(&mut st, old.pins);
                }
            }
            Ok(prepared) => self.release_pins(&mut st, prepared.pins),
            Err(e) => {
                log::warn!("backend {name}: preparing a materialization failed: {e}");
                self.release_pins(&mut st, pins);
            }
        }
        drop(st);
        self.inner.slot_freed.notify_all();
    }

    fn prepare(
        &self,
        name: &BackendName,
        started: Instant,
        pins: &mut Vec<ObjectId>,
    ) -> Result<Prepared> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let staging = self
            .inner
            .state_dir
            .join(crate::store::layout::STAGING)
            .join(format!(
                "materialize-{}",
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
        let dir = staging.join(name.rel_path());
        let result = (|| {
            create_private_dir_all(dir.parent().expect("backend paths have a parent"))?;
            let (lineage, files) = self.with_backend(name, |b| {
                Ok((b.lineage().to_string(), b.checkpoint_into(&dir, u64::MAX)?))
            })?;
            let wal_from = first_wal(&files);
            let base = self.state().lineages.base(name).cloned();
            let files = files
                .into_iter()
                .filter(|f| wal_number(&f.name).is_none())
                .collect();
            let part = PendingBackend::new(name.clone(), lineage.clone(), files, base);
            let mut stats = CheckpointStats::default();
            let files =
                Ingest::new(self, self.inner.store.as_ref(), pins, &mut stats).backend(&part)?;
            Ok(Prepared {
                mat: Materialization {
                    checkpoint: 0,
                    lineage,
                    files,
                    wal_from,
                    at: started,
                    wal_bytes: 0,
                },
                pins: std::mem::take(pins),
                uploaded: stats.bytes_uploaded,
            })
        })();
        if let Err(e) = remove_tree(&staging) {
            log::warn!("could not remove {}: {e}", staging.display());
        }
        result
    }

    /// Objects stored by prepared materializations no checkpoint adopted yet (pinned).
    pub fn prepared_objects(&self) -> std::collections::BTreeSet<ObjectId> {
        self.state()
            .wal
            .prepared
            .values()
            .flat_map(|p| p.pins.iter().copied())
            .collect()
    }

    /// Delete archived WAL files no checkpoint to come needs (outside the state lock).
    pub(super) fn prune_wal_archives(&self, prune: &[(BackendName, u64)]) {
        for (name, below) in prune {
            match self.with_backend(name, |b| b.prune_archived_wals(*below)) {
                Ok(0) => {}
                Ok(n) => log::debug!("backend {name}: pruned {n} archived WAL files"),
                Err(e) => log::warn!("backend {name}: could not prune its WAL archive: {e}"),
            }
        }
    }
}

/// The number of the first WAL file of a staged checkpoint: WAL files from it on belong to
/// the checkpoints built on it. Without any WAL, every WAL to come is numbered above every
/// file now.
fn first_wal(files: &[StagedFile]) -> u64 {
    files
        .iter()
        .filter_map(|f| wal_number(&f.name))
        .min()
        .or_else(|| {
            files
                .iter()
                .filter_map(|f| file_number(&f.name))
                .max()
                .map(|n| n + 1)
        })
        .unwrap_or(0)
}

/// The file number of a RocksDB file (`000012.sst`, `MANIFEST-000005`, `OPTIONS-000007`).
fn file_number(name: &str) -> Option<u64> {
    let digits = match name.split_once('-') {
        Some((_, n)) => n,
        None => name.split_once('.')?.0,
    };
    digits.parse().ok()
}
