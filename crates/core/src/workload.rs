//! A deterministic keyed-state workload: the demo's default load and the crash tests' model.
//!
//! Round 0 puts every key; round `r` rewrites about a tenth of the keys and deletes about a
//! twenty-third, as one atomic batch per backend that also records `__round = r`. So the
//! expected contents of any backend after any round can be recomputed from `r` alone.

use std::collections::BTreeMap;

use crate::backend::WriteOp;
use crate::coordinator::Engine;
use crate::error::{Error, Result};
use crate::names::BackendName;

/// The key each round's batch sets to the round's number (decimal), so a backend's
/// contents say which round they are.
pub const ROUND_KEY: &[u8] = b"__round";

fn key(k: u32) -> Vec<u8> {
    format!("key-{k:08}").into_bytes()
}

fn value(backend: &BackendName, k: u32, round: u64, value_size: usize) -> Vec<u8> {
    let mut v = format!("{backend}:{k}:{round}:").into_bytes();
    while v.len() < value_size {
        v.push(b'a' + ((k as u64 + round + v.len() as u64) % 26) as u8);
    }
    v
}

/// The batch of one round.
pub fn round_ops(backend: &BackendName, round: u64, keys: u32, value_size: usize) -> Vec<WriteOp> {
    let mut ops = Vec::new();
    for k in 0..keys {
        if round == 0 || (k as u64 + round) % 10 == 0 {
            ops.push(WriteOp::Put(key(k), value(backend, k, round, value_size)));
        } else if (k as u64 * 7 + round) % 23 == 0 {
            ops.push(WriteOp::Delete(key(k)));
        }
    }
    ops.push(WriteOp::Put(
        ROUND_KEY.to_vec(),
        round.to_string().into_bytes(),
    ));
    ops
}

/// Contents of a backend after rounds `0..=round`, computed without RocksDB.
pub fn expected_after(
    backend: &BackendName,
    round: u64,
    keys: u32,
    value_size: usize,
) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut state = BTreeMap::new();
    for r in 0..=round {
        for op in round_ops(backend, r, keys, value_size) {
            match op {
                WriteOp::Put(k, v) => {
                    state.insert(k, v);
                }
                WriteOp::Delete(k) => {
                    state.remove(&k);
                }
            }
        }
    }
    state
}

/// The last round a backend completed, from its `__round` key.
pub fn current_round(pairs: &[(Vec<u8>, Vec<u8>)]) -> Result<Option<u64>> {
    match pairs.iter().find(|(k, _)| k == ROUND_KEY) {
        None => Ok(None),
        Some((_, v)) => std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.parse().ok())
            .map(Some)
            .ok_or_else(|| Error::Corrupt("__round is not a number".into())),
    }
}

/// Apply the next round to every backend of the engine; returns the highest round applied.
pub fn step(engine: &Engine, keys: u32, value_size: usize) -> Result<u64> {
    Ok(step_each(engine, keys, value_size)?
        .into_iter()
        .map(|(_, round)| round)
        .max()
        .unwrap_or(0))
}

/// The round after the one `__round` holds (0 for a new database).
fn next_round(stored: Option<Vec<u8>>) -> Result<u64> {
    match stored {
        None => Ok(0),
        Some(v) => std::str::from_utf8(&v)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .map(|r| r + 1)
            .ok_or_else(|| Error::Corrupt("__round is not a number".into())),
    }
}

/// Apply the next round to every backend; returns the round each backend is now at (they
/// differ when a crash came between two backends' batches).
pub fn step_each(engine: &Engine, keys: u32, value_size: usize) -> Result<Vec<(BackendName, u64)>> {
    let mut applied = Vec::new();
    for name in engine.backend_names() {
        let round = next_round(engine.get(&name, ROUND_KEY)?)?;
        engine.write(&name, &round_ops(&name, round, keys, value_size))?;
        applied.push((name, round));
    }
    Ok(applied)
}

/// An application's own RocksDB that runs the same rounds (under `name`) and is imported,
/// never hosted: `ckptfs workload --import`, so the fault campaign kills imports too.
pub struct AppDb {
    name: BackendName,
    dir: std::path::PathBuf,
    db: rocksdb::DB,
}

impl AppDb {
    /// Open (or create) the database at `dir/db`; its checkpoints go to `dir/checkpoint`.
    pub fn open(name: BackendName, dir: &std::path::Path) -> Result<AppDb> {
        let mut options = rocksdb::Options::default();
        options.create_if_missing(true);
        options.set_write_buffer_size(256 << 10);
        let db = rocksdb::DB::open(&options, dir.join("db"))?;
        Ok(AppDb {
            name,
            dir: dir.to_path_buf(),
            db,
        })
    }

    /// The backend the database stands for.
    pub fn name(&self) -> &BackendName {
        &self.name
    }

    /// Apply the next round as one batch; returns it.
    pub fn step(&self, keys: u32, value_size: usize) -> Result<u64> {
        let round = next_round(self.db.get(ROUND_KEY)?)?;
        let mut batch = rocksdb::WriteBatch::default();
        for op in round_ops(&self.name, round, keys, value_size) {
            match op {
                WriteOp::Put(k, v) => batch.put(k, v),
                WriteOp::Delete(k) => batch.delete(k),
            }
        }
        self.db.write(batch)?;
        Ok(round)
    }

    /// A fresh RocksDB checkpoint of the database (the previous one removed), as the
    /// application would make for `ckptfs import`.
    pub fn checkpoint(&self) -> Result<std::path::PathBuf> {
        let dest = self.dir.join("checkpoint");
        crate::fsutil::remove_tree(&dest)?;
        rocksdb::checkpoint::Checkpoint::new(&self.db)?.create_checkpoint(&dest)?;
        Ok(dest)
    }
}
