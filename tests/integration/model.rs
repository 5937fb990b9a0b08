//! Reference-model property test: random operations against the real engine and a plain
//! in-memory model. After every step the store must match the model exactly.
//!
//! Besides the hosted backends, an application's own RocksDB (written here, never hosted)
//! is imported from its checkpoint directories as backend `ext/0` (`ckptfs import`), at
//! once or begun and left in flight, so imports are crashed, aborted, carried over by later
//! checkpoints, dropped and restored like every other checkpoint.

use crate::common::*;
use ckptfs_core::store::Location;
use ckptfs_core::{BackendName, CheckpointMode, CheckpointPlan, Engine, PendingCheckpoint};
use proptest::prelude::*;
use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::Arc;

const BACKENDS: [&str; 2] = ["op/0", "op/1"];
/// The imported backend: the application's database.
const EXTERNAL: &str = "ext/0";

#[derive(Debug, Clone)]
enum Op {
    Put {
        backend: usize,
        key: u8,
        value: u16,
    },
    Delete {
        backend: usize,
        key: u8,
    },
    Bulk {
        backend: usize,
        start: u8,
        tag: u16,
    },
    Flush {
        backend: usize,
    },
    Compact {
        backend: usize,
    },
    Checkpoint,
    Begin,
    CompleteOldest,
    CompleteNewest,
    AbortOldest,
    DeleteCheckpoint {
        pick: usize,
    },
    SetRetain {
        retain: u32,
    },
    Restore {
        pick: usize,
    },
    Crash {
        uploads: usize,
    },
    Restart,
    /// A checkpoint taken while a writer thread keeps putting keys into one backend.
    CheckpointWhileWriting {
        backend: usize,
    },
    /// Writes to the application's database (imported, never hosted).
    AppPut {
        key: u8,
        value: u16,
    },
    AppDelete {
        key: u8,
    },
    AppBulk {
        start: u8,
        tag: u16,
    },
    /// A checkpoint of the application's database imported as one checkpoint.
    Import,
    /// The same, begun and left in flight: the only checkpoint in flight until it leaves.
    BeginImport,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..2usize, any::<u8>(), any::<u16>()).prop_map(|(backend, key, value)| Op::Put { backend, key, value }),
        2 => (0..2usize, any::<u8>()).prop_map(|(backend, key)| Op::Delete { backend, key }),
        2 => (0..2usize, any::<u8>(), any::<u16>()).prop_map(|(backend, start, tag)| Op::Bulk { backend, start, tag }),
        1 => (0..2usize).prop_map(|backend| Op::Flush { backend }),
        1 => (0..2usize).prop_map(|backend| Op::Compact { backend }),
        3 => Just(Op::Checkpoint),
        2 => Just(Op::Begin),
        1 => Just(Op::CompleteOldest),
        1 => Just(Op::CompleteNewest),
        1 => Just(Op::AbortOldest),
        1 => (0..4usize).prop_map(|pick| Op::DeleteCheckpoint { pick }),
        1 => (1..5u32).prop_map(|retain| Op::SetRetain { retain }),
        1 => (0..4usize).prop_map(|pick| Op::Restore { pick }),
        1 => (0..4usize).prop_map(|uploads| Op::Crash { uploads }),
        1 => Just(Op::Restart),
        2 => (0..2usize).prop_map(|backend| Op::CheckpointWhileWriting { backend }),
        2 => (any::<u8>(), any::<u16>()).prop_map(|(key, value)| Op::AppPut { key, value }),
        1 => any::<u8>().prop_map(|key| Op::AppDelete { key }),
        1 => (any::<u8>(), any::<u16>()).prop_map(|(start, tag)| Op::AppBulk { start, tag }),
        2 => Just(Op::Import),
        1 => Just(Op::BeginImport),
    ]
}

type State = BTreeMap<BackendName, Kv>;

struct Model {
    /// The hosted backends.
    current: State,
    retained: BTreeMap<u64, State>,
    retain: usize,
    /// The application's database.
    app: Kv,
}

impl Model {
    /// What a checkpoint beginning now holds: the hosted backends as they are, and every
    /// other backend (`imported` aside) carried over as the newest retained checkpoint
    /// holding it has it.
    fn checkpoint_state(&self, imported: Option<&BackendName>) -> State {
        let mut state = self.current.clone();
        for held in self.retained.values() {
            for (name, kv) in held {
                if !self.current.contains_key(name) && Some(name) != imported {
                    state.insert(name.clone(), kv.clone());
                }
            }
        }
        state
    }

    fn complete(&mut self, id: u64, state: State) {
        self.retained.insert(id, state);
        self.apply_retention();
    }

    fn apply_retention(&mut self) {
        while self.retained.len() > self.retain {
            let oldest = *self.retained.keys().next().unwrap();
            self.retained.remove(&oldest);
        }
    }
}

struct Harness {
    store: Location,
    /// The state directory (object storage); a local store keeps it inside.
    state: Option<std::path::PathBuf>,
    mode: CheckpointMode,
    /// Keys written by writer threads so far (each writes new ones).
    written_by_writers: u32,
    engine: Option<Engine>,
    /// Checkpoints in flight, what each holds, and whether it imports.
    pending: VecDeque<(PendingCheckpoint, State, bool)>,
    model: Model,
    /// The application's database and where its checkpoint directories go.
    app: rocksdb::DB,
    app_dir: std::path::PathBuf,
    /// Checkpoint directories of the application made so far (each import reads a new one).
    app_checkpoints: u32,
}

impl Harness {
    fn open(store: &Location, state: Option<&Path>, mode: CheckpointMode) -> Engine {
        let mut cfg = config(Path::new(""), &BACKENDS);
        cfg.store = store.clone();
        cfg.state = state.map(Path::to_path_buf);
        // On object storage, what a simulated crash uploaded is swept at the next start.
        cfg.orphan_grace = std::time::Duration::ZERO;
        cfg.max_concurrent = 2;
        cfg.backend_options.checkpoint_mode = mode;
        // wal mode: a materialization due after most bulk writes, prepared in the background
        // and adopted by a later checkpoint; checkpoints on top of the previous one between.
        cfg.materialize.wal_bytes = 32 * 1024;
        Engine::open(cfg).unwrap()
    }

    fn engine(&self) -> &Engine {
        self.engine.as_ref().unwrap()
    }

    /// Whether a checkpoint beginning now is refused as busy: both slots are taken, or an
    /// import is in flight.
    fn busy(&self) -> bool {
        self.pending.len() == 2 || self.pending.iter().any(|(_, _, imports)| *imports)
    }

    /// Begin a checkpoint that imports a fresh checkpoint of the application's database;
    /// what it holds. `None`: refused as busy, which only checkpoints in flight explain.
    fn begin_import(&mut self) -> Option<(PendingCheckpoint, State)> {
        let external = name(EXTERNAL);
        self.app_checkpoints += 1;
        let dir = self
            .app_dir
            .join(format!("checkpoint-{}", self.app_checkpoints));
        rocksdb::checkpoint::Checkpoint::new(&self.app)
            .unwrap()
            .create_checkpoint(&dir)
            .unwrap();
        let scanned = ckptfs_core::import::scan(&external, &dir).unwrap();
        match self.engine().begin(CheckpointPlan::Import(vec![scanned])) {
            Ok(p) => {
                assert!(
                    self.pending.is_empty(),
                    "an import began beside checkpoints"
                );
                let mut state = self.model.checkpoint_state(Some(&external));
                state.insert(external, self.model.app.clone());
                Some((p, state))
            }
            Err(ckptfs_core::Error::Busy(_)) => {
                assert!(!self.pending.is_empty(), "an import refused as busy");
                None
            }
            Err(e) => panic!("import failed: {e}"),
        }
    }

    fn apply(&mut self, op: &Op) {
        let names: Vec<BackendName> = BACKENDS.iter().map(|b| name(b)).collect();
        match op {
            Op::Put {
                backend,
                key,
                value,
            } => {
                let (k, v) = (vec![*key], value.to_le_bytes().to_vec());
                self.engine().put(&names[*backend], &k, &v).unwrap();
                self.model
                    .current
                    .get_mut(&names[*backend])
                    .unwrap()
                    .insert(k, v);
            }
            Op::Delete { backend, key } => {
                self.engine().delete(&names[*backend], &[*key]).unwrap();
                self.model
                    .current
                    .get_mut(&names[*backend])
                    .unwrap()
                    .remove(&vec![*key]);
            }
            Op::Bulk {
                backend,
                start,
                tag,
            } => {
                let ops: Vec<ckptfs_core::WriteOp> = (0..400u32)
                    .map(|i| {
                        let k = format!("bulk{:05}", *start as u32 * 100 + i).into_bytes();
                        let v = format!("{tag}-{}", "y".repeat(200)).into_bytes();
                        ckptfs_core::WriteOp::Put(k, v)
                    })
                    .collect();
                self.engine().write(&names[*backend], &ops).unwrap();
                let kv = self.model.current.get_mut(&names[*backend]).unwrap();
                for o in ops {
                    if let ckptfs_core::WriteOp::Put(k, v) = o {
                        kv.insert(k, v);
                    }
                }
            }
            Op::Flush { backend } => self.engine().flush(&names[*backend]).unwrap(),
            Op::Compact { backend } => self.engine().compact(&names[*backend]).unwrap(),
            Op::Checkpoint => {
                let state = self.model.checkpoint_state(None);
                match self.engine().checkpoint() {
                    Ok(m) => {
                        assert!(!self.busy(), "a checkpoint began beside an import");
                        self.model.complete(m.id, state)
                    }
                    Err(ckptfs_core::Error::Busy(_)) => assert!(self.busy()),
                    Err(e) => panic!("checkpoint failed: {e}"),
                }
            }
            Op::Begin => {
                let state = self.model.checkpoint_state(None);
                match self.engine().begin_checkpoint() {
                    Ok(p) => {
                        assert!(!self.busy(), "a checkpoint began beside an import");
                        self.pending.push_back((p, state, false))
                    }
                    Err(ckptfs_core::Error::Busy(_)) => assert!(self.busy()),
                    Err(e) => panic!("begin failed: {e}"),
                }
            }
            Op::CompleteOldest | Op::CompleteNewest => {
                let next = if matches!(op, Op::CompleteOldest) {
                    self.pending.pop_front()
                } else {
                    self.pending.pop_back()
                };
                if let Some((p, state, _)) = next {
                    let m = p.complete().unwrap();
                    self.model.complete(m.id, state);
                }
            }
            Op::AbortOldest => {
                if let Some((p, _, _)) = self.pending.pop_front() {
                    p.abort();
                }
            }
            Op::DeleteCheckpoint { pick } => {
                let ids: Vec<u64> = self.model.retained.keys().copied().collect();
                if let Some(&id) = ids.get(*pick) {
                    self.engine().delete_checkpoint(id).unwrap();
                    self.model.retained.remove(&id);
                } else {
                    let err = self.engine().delete_checkpoint(10_000).unwrap_err();
                    assert!(matches!(err, ckptfs_core::Error::NoSuchCheckpoint(_)));
                }
            }
            Op::SetRetain { retain } => {
                self.engine().set_retain(*retain).unwrap();
                self.model.retain = *retain as usize;
                self.model.apply_retention();
            }
            Op::Restore { pick } => {
                let ids: Vec<u64> = self.model.retained.keys().copied().collect();
                if let Some(&id) = ids.get(*pick) {
                    match self.engine().restore_backends(id) {
                        // The hosted backends roll back; imported ones are not hosted.
                        Ok(()) => {
                            let restored = &self.model.retained[&id];
                            for (name, kv) in self.model.current.iter_mut() {
                                *kv = restored[name].clone();
                            }
                        }
                        Err(ckptfs_core::Error::Busy(_)) => assert!(!self.pending.is_empty()),
                        Err(e) => panic!("restore failed: {e}"),
                    }
                }
            }
            Op::Crash { uploads } => {
                // The process dies during the upload of the oldest in-flight checkpoint (or
                // between operations): nothing of the in-flight checkpoints may survive.
                if let Some((p, _, _)) = self.pending.pop_front() {
                    p.simulate_crash(*uploads);
                }
                for (p, _, _) in self.pending.drain(..) {
                    p.simulate_crash(0);
                }
                // A background materialization holds the engine until it ends (a real
                // crash would end it too; in process it cannot be killed).
                self.engine().wait_background();
                self.engine = None;
                self.engine = Some(Self::open(&self.store, self.state.as_deref(), self.mode));
            }
            Op::CheckpointWhileWriting { backend } => {
                use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
                let key = |i: u32| format!("w{i:08}").into_bytes();
                let first = self.written_by_writers;
                let (stop, done) = (
                    Arc::new(AtomicBool::new(false)),
                    Arc::new(AtomicU32::new(0)),
                );
                let writer = {
                    let (engine, name) = (self.engine().clone(), names[*backend].clone());
                    let (stop, done) = (stop.clone(), done.clone());
                    std::thread::spawn(move || {
                        let mut i = 0;
                        while !stop.load(Ordering::Relaxed) && i < 3000 {
                            engine.put(&name, &key(first + i), b"w").unwrap();
                            i += 1;
                            done.store(i, Ordering::SeqCst);
                        }
                    })
                };
                while done.load(Ordering::SeqCst) < 10 {
                    std::thread::yield_now();
                }
                let before = self.model.checkpoint_state(None);
                let acknowledged = done.load(Ordering::SeqCst);
                let result = self.engine().checkpoint();
                stop.store(true, Ordering::Relaxed);
                writer.join().unwrap();
                let written = done.load(Ordering::SeqCst);
                self.written_by_writers += written;
                let kv = self.model.current.get_mut(&names[*backend]).unwrap();
                for i in 0..written {
                    kv.insert(key(first + i), b"w".to_vec());
                }
                match result {
                    Ok(m) => {
                        // The checkpoint holds a prefix of the writes, at least those
                        // acknowledged before it began: find it, then the model is exact.
                        let restored = restored_contents(&self.store, m.id);
                        let mut state = before;
                        let kv = state.get_mut(&names[*backend]).unwrap();
                        let n = (0..written)
                            .take_while(|i| {
                                restored[&names[*backend]].contains_key(&key(first + i))
                            })
                            .count() as u32;
                        assert!(
                            n >= acknowledged,
                            "{n} writes kept, {acknowledged} acknowledged"
                        );
                        for i in 0..n {
                            kv.insert(key(first + i), b"w".to_vec());
                        }
                        assert_eq!(restored, state, "checkpoint {} is not a prefix", m.id);
                        self.model.complete(m.id, state);
                    }
                    Err(ckptfs_core::Error::Busy(_)) => assert!(self.busy()),
                    Err(e) => panic!("checkpoint failed: {e}"),
                }
            }
            Op::AppPut { key, value } => {
                let (k, v) = (vec![*key], value.to_le_bytes().to_vec());
                self.app.put(&k, &v).unwrap();
                self.model.app.insert(k, v);
            }
            Op::AppDelete { key } => {
                self.app.delete([*key]).unwrap();
                self.model.app.remove(&vec![*key]);
            }
            Op::AppBulk { start, tag } => {
                let mut batch = rocksdb::WriteBatch::default();
                for i in 0..400u32 {
                    let k = format!("app{:05}", *start as u32 * 100 + i).into_bytes();
                    let v = format!("{tag}-{}", "z".repeat(200)).into_bytes();
                    batch.put(&k, &v);
                    self.model.app.insert(k, v);
                }
                self.app.write(batch).unwrap();
            }
            Op::Import => {
                if let Some((p, state)) = self.begin_import() {
                    let (m, reports) = p.complete_with_imports().unwrap();
                    assert_eq!(reports.len(), 1);
                    self.model.complete(m.id, state);
                }
            }
            Op::BeginImport => {
                if let Some((p, state)) = self.begin_import() {
                    self.pending.push_back((p, state, true));
                }
            }
            Op::Restart => {
                self.pending.clear();
                self.engine().wait_background();
                self.engine = None;
                self.engine = Some(Self::open(&self.store, self.state.as_deref(), self.mode));
            }
        }
    }

    fn check(&self) {
        let engine = self.engine();
        let retained: Vec<u64> = engine.checkpoints().iter().map(|m| m.id).collect();
        assert_eq!(
            retained,
            self.model.retained.keys().copied().collect::<Vec<_>>()
        );
        assert_eq!(engine.retain() as usize, self.model.retain);
        assert_eq!(snapshot_all(engine), self.model.current);
        if self.pending.is_empty() {
            assert_consistent(engine);
        } else {
            assert_eq!(engine.reference_counts(), recount(&engine.checkpoints()));
        }
        for (id, state) in &self.model.retained {
            assert_eq!(
                &restored_contents(&self.store, *id),
                state,
                "checkpoint {id}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("CKPTFS_MODEL_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(24),
        max_shrink_iters: 200,
        .. ProptestConfig::default()
    })]

    #[test]
    fn engine_matches_the_model(ops in proptest::collection::vec(op(), 1..40)) {
        run(CheckpointMode::Flush, &ops);
    }

    /// The same in `wal` mode: checkpoints without a flush, WAL chunks, materializations.
    #[test]
    fn engine_matches_the_model_in_wal_mode(ops in proptest::collection::vec(op(), 1..40)) {
        run(CheckpointMode::Wal, &ops);
    }
}

proptest! {
    // Each case talks to a real S3-compatible server: fewer of them.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("CKPTFS_MODEL_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(6),
        max_shrink_iters: 50,
        .. ProptestConfig::default()
    })]

    /// The same on object storage (moto_server): uploads several at once, the lease, the
    /// orphan sweep after simulated crashes, restores read through the cache.
    #[test]
    fn engine_matches_the_model_on_object_storage(ops in proptest::collection::vec(op(), 1..30)) {
        let url = crate::common::moto::moto().store();
        run_at(Location::parse(&url).unwrap(), CheckpointMode::Flush, &ops);
    }

    /// And in `wal` mode: WAL and MANIFEST chunks as many small objects.
    #[test]
    fn engine_matches_the_model_on_object_storage_in_wal_mode(
        ops in proptest::collection::vec(op(), 1..30)
    ) {
        let url = crate::common::moto::moto().store();
        run_at(Location::parse(&url).unwrap(), CheckpointMode::Wal, &ops);
    }
}

fn run(mode: CheckpointMode, ops: &[Op]) {
    let dir = tempfile::tempdir().unwrap();
    run_at(Location::Local(dir.path().join("store")), mode, ops);
}

fn run_at(store: Location, mode: CheckpointMode, ops: &[Op]) {
    let dir = tempfile::tempdir().unwrap();
    let state = store.local().is_none().then(|| dir.path().join("state"));
    let engine = Harness::open(&store, state.as_deref(), mode);
    let current = BACKENDS.iter().map(|b| (name(b), Kv::new())).collect();
    let app_dir = dir.path().join("app");
    let mut options = rocksdb::Options::default();
    options.create_if_missing(true);
    let app = rocksdb::DB::open(&options, app_dir.join("db")).unwrap();
    let mut h = Harness {
        store,
        state,
        mode,
        written_by_writers: 0,
        engine: Some(engine),
        pending: VecDeque::new(),
        model: Model {
            current,
            retained: BTreeMap::new(),
            retain: 3,
            app: Kv::new(),
        },
        app,
        app_dir,
        app_checkpoints: 0,
    };
    for op in ops {
        h.apply(op);
        h.check();
    }
    h.pending.clear();
}
