//! The source of `scripts/bench-s3-copy`: a Flink job's checkpoint directory made of real
//! RocksDB databases, written to a local directory for the script to upload (issue 43).
//!
//! The job is the fixture's (tests/fixtures/flink/job1/chk-4/_metadata, a real Flink 2.3
//! job): its keyed subtasks (totals/0, totals/1, counter/0, counter/1) each get a RocksDB
//! database of their own with the column families the job's state has, about DB_MIB / 4 of
//! incompressible values (1 KiB) in one of them, written as sorted SSTs of 64 MiB (RocksDB's
//! default target file size) with `SstFileWriter` and ingested. Auto compactions are off, so
//! that what each checkpoint adds is what its writes flushed. Then CHECKPOINTS checkpoints:
//! chk-1 is the whole database; each later one first overwrites CHANGE_PERMILLE per mille of
//! each database's keys (chosen at random, seeded) and flushes.
//!
//! Each checkpoint is laid out as Flink lays out an incremental RocksDB checkpoint: RocksDB's
//! checkpoint of each database is taken (`Checkpoint::create_checkpoint`), each SST not seen
//! before becomes `OUT/JOB/shared/<uuid>` (a hard link, no copy), the private files (CURRENT,
//! MANIFEST, OPTIONS) are inline when at most 20 KiB (Flink's default inline threshold) and
//! else files in `shared/` too, and `OUT/JOB/chk-N/_metadata` is the fixture's with each
//! keyed subtask's handle replaced by one naming these files by `SRC_URI/shared/<uuid>` (an
//! `s3://` URI), through `ckptfs_core::flink::metadata` (checked by parsing it back). The
//! databases are removed at the end: the hard links keep the SSTs.
//!
//! `OUT/plan.tsv` lists, in the order to upload them, each checkpoint's new files: `N`,
//! the path under `OUT/JOB/`, its bytes, and its kind (`sst`, `private` or `metadata`).
//!
//! Usage: `bench_s3_copy OUT SRC_URI DB_MIB CHECKPOINTS CHANGE_PERMILLE` (SRC_URI the
//! job's directory as ckptfs will read it, ending in the job's 32-hex id).

mod common;

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use ckptfs_core::flink::metadata::{self, KeyedHandle, StreamHandle};
use common::{mix, Context, Result, VALUE_SIZE};
use rocksdb::{ColumnFamilyDescriptor, Options, SstFileWriter, DB};

/// The target size of the SSTs the load writes: RocksDB's default `target_file_size_base`.
const SST_BYTES: u64 = 64 << 20;
/// Flink's default `execution.checkpointing.data-inline-threshold` (20 KiB).
const INLINE_THRESHOLD: usize = 20 << 10;
/// The fixture's max parallelism: one byte of key group in front of each key.
const MAX_PARALLELISM: u64 = 128;

/// One keyed subtask's database.
struct Subtask {
    backend_id: String,
    key_group_start: u32,
    key_group_count: u32,
    /// The column family its values go to, one of those the job's state has.
    column_family: &'static str,
    db: DB,
    dir: PathBuf,
    keys: u64,
    /// SSTs already in `shared/`: RocksDB name -> (uuid, bytes).
    shared: HashMap<String, (String, u64)>,
}

fn key(sub: &Subtask, i: u64) -> Vec<u8> {
    // Sorted by i: the key group grows with it, then the index (Flink's key layout: the
    // key group's byte, then the serialized key).
    let group = u64::from(sub.key_group_start) + i * u64::from(sub.key_group_count) / sub.keys;
    let mut k = vec![group as u8];
    k.extend_from_slice(format!("{i:016x}").as_bytes());
    k
}

fn value(seed: u64, i: u64, round: u64) -> Vec<u8> {
    common::value((seed & 0xffff) as u32, i, round)
}

/// A uuid-shaped name for `shared/`, deterministic.
fn uuid(n: u64) -> String {
    let (a, b) = (mix(n ^ 0x5eed), mix(!n));
    format!(
        "{:08x}-{:04x}-4{:03x}-a{:03x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        b >> 52,
        b & 0xffff_ffff_ffff
    )
}

struct Job {
    out: PathBuf,
    job: String,
    src_uri: String,
    plan: std::fs::File,
    names: u64,
}

impl Job {
    fn new_name(&mut self) -> String {
        self.names += 1;
        uuid(self.names)
    }
    fn plan(&mut self, n: u64, rel: &str, bytes: u64, kind: &str) -> Result<()> {
        writeln!(self.plan, "{n}\t{rel}\t{bytes}\t{kind}").ctx("write plan.tsv")
    }
}

fn open(dir: &Path, families: &[&str]) -> Result<DB> {
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    opts.set_disable_auto_compactions(true);
    let cfs = families
        .iter()
        .map(|cf| ColumnFamilyDescriptor::new(*cf, Options::default()));
    DB::open_cf_descriptors(&opts, dir, cfs).ctx(format!("open {}", dir.display()))
}

/// Load `sub` with its keys: sorted SSTs of about [`SST_BYTES`], ingested.
fn load(sub: &Subtask, seed: u64) -> Result<()> {
    let cf = sub
        .db
        .cf_handle(sub.column_family)
        .ok_or("no column family")?;
    let per_sst = (SST_BYTES / (VALUE_SIZE as u64 + 17)).max(1);
    let mut i = 0;
    let mut n = 0;
    while i < sub.keys {
        let path = sub.dir.join(format!("load-{n}.sst"));
        let opts = Options::default();
        let mut w = SstFileWriter::create(&opts);
        w.open(&path).ctx("SstFileWriter::open")?;
        let end = (i + per_sst).min(sub.keys);
        for j in i..end {
            w.put(key(sub, j), value(seed, j, 0))
                .ctx("SstFileWriter::put")?;
        }
        w.finish().ctx("SstFileWriter::finish")?;
        let mut ingest = rocksdb::IngestExternalFileOptions::default();
        ingest.set_move_files(true);
        sub.db
            .ingest_external_file_cf_opts(cf, &ingest, vec![&path])
            .ctx("ingest")?;
        i = end;
        n += 1;
    }
    Ok(())
}

/// Overwrite `permille` per mille of `sub`'s keys (distinct, at random) and flush.
fn change(sub: &Subtask, seed: u64, round: u64, permille: u64) -> Result<()> {
    let cf = sub
        .db
        .cf_handle(sub.column_family)
        .ok_or("no column family")?;
    let count = (sub.keys * permille / 1000).max(1);
    let mut picked = std::collections::HashSet::new();
    let mut r = mix(seed ^ (round << 32)) | 1;
    let mut batch = rocksdb::WriteBatch::default();
    let mut wo = rocksdb::WriteOptions::default();
    wo.disable_wal(true);
    while (picked.len() as u64) < count {
        r = mix(r);
        let i = r % sub.keys;
        if picked.insert(i) {
            batch.put_cf(cf, key(sub, i), value(seed, i, round));
            if batch.len() >= 4096 {
                sub.db
                    .write_opt(std::mem::take(&mut batch), &wo)
                    .ctx("write")?;
            }
        }
    }
    sub.db.write_opt(batch, &wo).ctx("write")?;
    sub.db.flush_cf(cf).ctx("flush")
}

/// The handle of `sub` at checkpoint `n`: its files in `shared/` (new ones linked there),
/// as Flink 2.3 writes an `IncrementalRemoteKeyedStateHandle` (type 11); `meta` is the
/// fixture's handle of Flink's meta data, kept as it is.
fn handle(job: &mut Job, sub: &mut Subtask, n: u64, meta: &[u8]) -> Result<Vec<u8>> {
    let cp = sub.dir.with_extension(format!("cp{n}"));
    rocksdb::checkpoint::Checkpoint::new(&sub.db)
        .and_then(|c| c.create_checkpoint(&cp))
        .ctx("create_checkpoint")?;
    let mut files: Vec<(String, PathBuf)> = std::fs::read_dir(&cp)
        .ctx("read checkpoint")?
        .map(|e| e.map(|e| (e.file_name().to_string_lossy().into_owned(), e.path())))
        .collect::<std::io::Result<_>>()
        .ctx("read checkpoint")?;
    files.sort();
    let (mut shared, mut private) = (Vec::new(), Vec::new());
    let mut added = 0;
    for (name, path) in files {
        if name.ends_with(".sst") {
            if !sub.shared.contains_key(&name) {
                let uuid = job.new_name();
                let rel = format!("shared/{uuid}");
                std::fs::hard_link(&path, job.out.join(&job.job).join(&rel)).ctx("link")?;
                let bytes = std::fs::metadata(&path).ctx("stat")?.len();
                job.plan(n, &rel, bytes, "sst")?;
                added += bytes;
                sub.shared.insert(name.clone(), (uuid, bytes));
            }
            let (uuid, bytes) = &sub.shared[&name];
            let uri = format!("{}/shared/{uuid}", job.src_uri);
            shared.push((name, metadata::file_handle(&uri, *bytes).ctx("handle")?));
        } else {
            let bytes = std::fs::read(&path).ctx("read")?;
            if bytes.len() <= INLINE_THRESHOLD {
                let mut h = vec![1u8];
                utf(&mut h, &format!("inline-{name}"));
                h.extend_from_slice(&(bytes.len() as i32).to_be_bytes());
                h.extend_from_slice(&bytes);
                private.push((name, h));
            } else {
                let uuid = job.new_name();
                let rel = format!("shared/{uuid}");
                std::fs::write(job.out.join(&job.job).join(&rel), &bytes).ctx("write")?;
                job.plan(n, &rel, bytes.len() as u64, "private")?;
                let uri = format!("{}/{rel}", job.src_uri);
                private.push((
                    name,
                    metadata::file_handle(&uri, bytes.len() as u64).ctx("handle")?,
                ));
            }
        }
    }
    std::fs::remove_dir_all(&cp).ctx("remove checkpoint")?;
    let mut h = vec![11u8];
    h.extend_from_slice(&(n as i64).to_be_bytes());
    utf(&mut h, &sub.backend_id);
    h.extend_from_slice(&(sub.key_group_start as i32).to_be_bytes());
    h.extend_from_slice(&(sub.key_group_count as i32).to_be_bytes());
    h.extend_from_slice(&(added as i64).to_be_bytes());
    h.extend_from_slice(meta);
    for list in [shared, private] {
        h.extend_from_slice(&(list.len() as i32).to_be_bytes());
        for (name, stream) in list {
            utf(&mut h, &name);
            h.extend_from_slice(&stream);
        }
    }
    utf(&mut h, &job.new_name());
    Ok(h)
}

/// A Java `writeUTF` of an ASCII string.
fn utf(out: &mut Vec<u8>, s: &str) {
    assert!(s.is_ascii() && s.len() < 65536);
    out.extend_from_slice(&(s.len() as u16).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Where a type-11 keyed handle of `bytes` ends, its type byte at `at`; and the span of its
/// meta data handle. Only the handle types the fixture has (null, inline, file).
fn keyed_handle_end(bytes: &[u8], at: usize) -> Result<(usize, std::ops::Range<usize>)> {
    let mut r = at;
    let u16_at = |r: usize| u16::from_be_bytes([bytes[r], bytes[r + 1]]) as usize;
    let i32_at = |r: usize| i32::from_be_bytes(bytes[r..r + 4].try_into().unwrap());
    let stream = |r: &mut usize| -> Result<()> {
        let t = bytes[*r];
        *r += 1;
        match t {
            0 => {}
            1 => {
                *r += 2 + u16_at(*r);
                *r += 4 + i32_at(*r) as usize;
            }
            2 => *r += 8 + 2 + u16_at(*r + 8),
            other => return Err(format!("the fixture has a handle of type {other}")),
        }
        Ok(())
    };
    if bytes[r] != 11 {
        return Err("not a type-11 handle".into());
    }
    r += 1 + 8; // type, checkpoint id
    r += 2 + u16_at(r); // backend id
    r += 4 + 4 + 8; // key groups, checkpointed size
    let meta_at = r;
    stream(&mut r)?;
    let meta = meta_at..r;
    for _ in 0..2 {
        let n = i32_at(r);
        r += 4;
        for _ in 0..n {
            r += 2 + u16_at(r);
            stream(&mut r)?;
        }
    }
    r += 2 + u16_at(r); // handle id
    Ok((r, meta))
}

/// Where `s` is written (its length prefix) in `bytes`: exactly once.
fn find_utf(bytes: &[u8], s: &str) -> Result<usize> {
    let mut needle = (s.len() as u16).to_be_bytes().to_vec();
    needle.extend_from_slice(s.as_bytes());
    let hits: Vec<usize> = bytes
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle.as_slice())
        .map(|(i, _)| i)
        .collect();
    match hits[..] {
        [at] => Ok(at),
        _ => Err(format!("{s} is in the fixture {} times", hits.len())),
    }
}

fn run(args: &[String]) -> Result<()> {
    let [out, src_uri, db_mib, checkpoints, permille] = args else {
        return Err("usage: bench_s3_copy OUT SRC_URI DB_MIB CHECKPOINTS CHANGE_PERMILLE".into());
    };
    let num = |s: &String| s.parse::<u64>().ctx(format!("not a number: {s}"));
    let (db_mib, checkpoints, permille) = (num(db_mib)?, num(checkpoints)?, num(permille)?);
    let out = PathBuf::from(out);
    let src_uri = src_uri.trim_end_matches('/').to_string();
    let job_id = src_uri.rsplit('/').next().unwrap_or_default().to_string();
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/flink/job1/chk-4/_metadata");
    let template = std::fs::read(&fixture).ctx("read the fixture")?;
    let parsed = metadata::parse(&template).ctx("parse the fixture")?;
    std::fs::create_dir_all(out.join(&job_id).join("shared")).ctx("mkdir")?;
    let mut job = Job {
        plan: std::fs::File::create(out.join("plan.tsv")).ctx("create plan.tsv")?,
        out: out.clone(),
        job: job_id,
        src_uri,
        names: 0,
    };
    // The keyed subtasks, and where each one's handle is in the fixture.
    let mut subs = Vec::new();
    let mut spans = Vec::new();
    let per_db = (db_mib << 20) / 4;
    for op in &parsed.operators {
        let (families, cf): (&[&str], _) = match op.name.as_deref() {
            Some("totals") => (&["default", "sum", "rounds", "recent"], "rounds"),
            Some("counter") => (&["default", "count", "seqs"], "seqs"),
            _ => continue,
        };
        for st in &op.subtasks {
            let Some(KeyedHandle::Incremental(h)) = &st.managed_keyed else {
                continue;
            };
            let at = find_utf(&template, &h.backend_id)? - 9;
            let (end, meta) = keyed_handle_end(&template, at)?;
            spans.push((at..end, template[meta].to_vec()));
            let dir = out.join(format!(
                "db-{}-{}",
                op.name.as_deref().unwrap_or(""),
                st.index
            ));
            subs.push(Subtask {
                backend_id: h.backend_id.clone(),
                key_group_start: h.key_group_start,
                key_group_count: h.key_group_count,
                column_family: cf,
                db: open(&dir, families)?,
                dir,
                keys: (per_db / (VALUE_SIZE as u64 + 17)).max(16),
                shared: HashMap::new(),
            });
        }
    }
    if subs.len() != 4 || u64::from(subs[0].key_group_count) * 2 != MAX_PARALLELISM {
        return Err(format!(
            "the fixture has {} keyed subtasks, not 4",
            subs.len()
        ));
    }
    for (seed, sub) in subs.iter().enumerate() {
        load(sub, seed as u64)?;
    }
    for n in 1..=checkpoints {
        let mut edits = vec![(8..16, (n as i64).to_be_bytes().to_vec())];
        let mut expect = BTreeMap::new();
        for (seed, (sub, (span, meta))) in subs.iter_mut().zip(&spans).enumerate() {
            if n > 1 {
                change(sub, seed as u64, n, permille)?;
            }
            let h = handle(&mut job, sub, n, meta)?;
            expect.insert(sub.backend_id.clone(), sub.shared.len());
            edits.push((span.clone(), h));
        }
        let bytes = metadata::rewrite(&template, edits).ctx("rewrite")?;
        // Parsed back: each subtask names its SSTs, all as files in shared/.
        for op in metadata::parse(&bytes)
            .ctx("parse the new _metadata")?
            .operators
        {
            for st in op.subtasks {
                if let Some(KeyedHandle::Incremental(h)) = st.managed_keyed {
                    let files = h
                        .shared
                        .iter()
                        .filter(|(name, s)| {
                            name.ends_with(".sst") && matches!(s, StreamHandle::File { .. })
                        })
                        .count();
                    if h.checkpoint_id != n || expect.get(&h.backend_id) != Some(&files) {
                        return Err(format!("chk-{n}: {} names {files} SSTs", h.backend_id));
                    }
                }
            }
        }
        let rel = format!("chk-{n}/_metadata");
        let path = out.join(&job.job).join(&rel);
        std::fs::create_dir_all(path.parent().unwrap()).ctx("mkdir")?;
        std::fs::write(&path, &bytes).ctx("write _metadata")?;
        job.plan(n, &rel, bytes.len() as u64, "metadata")?;
    }
    for sub in subs {
        let dir = sub.dir.clone();
        drop(sub);
        std::fs::remove_dir_all(&dir).ctx("remove the database")?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_s3_copy: {e}");
            ExitCode::FAILURE
        }
    }
}
