//! `ckptfs diff --keys`: the keys added, removed and changed between two checkpoints, per
//! backend and column family. Each backend whose files differ is written out of the store
//! (every object verified) into a private temporary directory, once per side, opened
//! read-only with RocksDB (never created: a directory without `CURRENT` is refused) and
//! both sides' sorted key streams are merged; its directories are removed before the next
//! backend, so the disk holds one backend's two versions at a time.
//!
//! - A backend whose file lists are the same on both sides (the same names and content) has
//!   the same keys: it is not opened ([`KeyComparison::SameFiles`]).
//! - A backend without a `CURRENT` file on either side is no RocksDB directory (Flink's
//!   `_flink/0`, the job's `_metadata` and operator state): skipped
//!   ([`KeyComparison::NotRocksDb`]).
//! - A backend in one checkpoint only: all its keys are added (or removed).
//!
//! Each side is opened with the options of its newest `OPTIONS` file (unknown options
//! ignored, as `ldb --try_load_options --ignore_unknown_options` does; RocksDB's built-in
//! merge operators such as Flink's `stringappendtest` come with it), so merged values (a
//! Flink list state) are compared as RocksDB reads them. Keys are compared bytewise; a side
//! whose keys do not come in bytewise order (a custom comparator) is refused rather than
//! misreported. Counts are always exact (every key is read); at most `limit` changes are
//! listed per backend and column family ([`ColumnFamilyKeys::listed_all`] says whether all
//! are).
//!
//! Keys and values are shown as Rust's byte-string escaping ([`escape`]: printable ASCII as
//! is, `\t`, `\r`, `\n`, `\\`, `\'`, `\"`, every other byte as `\xNN`), values cut at
//! [`VALUE_SHOWN`] bytes. Flink's keys are binary (key-group prefix, then the serialized
//! key and namespace) and show as such.

use std::cmp::Ordering;
use std::path::Path;

use rocksdb::{ColumnFamilyDescriptor, IteratorMode, Options, DB};
use serde::Serialize;

use super::{DiffReport, Presence};
use crate::catalog::{BackendSnapshot, Manifest};
use crate::error::{Error, IoContext, Result};
use crate::store::ObjectStore;

/// The listing bound per backend and column family when the user gives none.
pub const DEFAULT_LIMIT: usize = 1000;
/// Bytes of a value shown; its length is always given.
pub const VALUE_SHOWN: usize = 256;

/// How a backend's keys were compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyComparison {
    /// Both sides (or the one there is) opened and every key read.
    Iterated,
    /// The same files on both sides, so the same keys: not opened.
    SameFiles,
    /// No `CURRENT` file on either side: not a RocksDB directory.
    NotRocksDb,
}

/// A backend's keys compared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BackendKeys {
    /// How.
    pub comparison: KeyComparison,
    /// Per column family of either side, sorted by name (empty unless
    /// [`KeyComparison::Iterated`]).
    pub column_families: Vec<ColumnFamilyKeys>,
}

/// The keys of one column family compared.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ColumnFamilyKeys {
    /// The column family's name.
    pub column_family: String,
    /// Keys only in B.
    pub added: u64,
    /// Keys only in A.
    pub removed: u64,
    /// Keys in both, with other values.
    pub changed: u64,
    /// Keys in both, the same value.
    pub unchanged: u64,
    /// The first `limit` changes in key order.
    pub listed: Vec<KeyChange>,
    /// True if `listed` holds every change.
    pub listed_all: bool,
}

/// What happened to a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Only in B.
    Added,
    /// Only in A.
    Removed,
    /// In both, another value.
    Changed,
}

/// One key added, removed or changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyChange {
    /// What happened to it.
    pub change: Change,
    /// The key, escaped ([`escape`]).
    pub key: String,
    /// Its value in A, escaped, at most [`VALUE_SHOWN`] bytes of it; absent if added.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub a: Option<String>,
    /// The length of its value in A.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub a_bytes: Option<u64>,
    /// Its value in B, as `a`; absent if removed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub b: Option<String>,
    /// The length of its value in B.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub b_bytes: Option<u64>,
}

/// Bytes as Rust writes a byte string's content (`<[u8]>::escape_ascii`).
pub fn escape(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}

fn shown(value: &[u8]) -> (Option<String>, Option<u64>) {
    let cut = &value[..value.len().min(VALUE_SHOWN)];
    (Some(escape(cut)), Some(value.len() as u64))
}

/// A RocksDB directory opened read-only, with its column families.
struct Opened {
    db: DB,
    families: Vec<String>,
}

/// Open the RocksDB directory `dir` read-only (never created), every column family its
/// MANIFEST lists, with the options of its `OPTIONS` file where it has one. RocksDB's info
/// LOG goes to `log_dir`.
fn open(dir: &Path, log_dir: &Path) -> Result<Opened> {
    if !dir.join("CURRENT").is_file() {
        return Err(Error::NotFound(format!(
            "{} is not a RocksDB directory (no CURRENT file)",
            dir.display()
        )));
    }
    let at =
        |e: rocksdb::Error| Error::from(e).context(format!("open {} read-only", dir.display()));
    let loaded = Options::load_latest(
        dir,
        rocksdb::Env::new().map_err(at)?,
        true,
        rocksdb::Cache::new_lru_cache(8 << 20),
    );
    let (mut options, mut loaded) = match loaded {
        Ok(found) => found,
        // No OPTIONS file (or one RocksDB cannot read): RocksDB's defaults, no merge operator.
        Err(e) => {
            log::warn!(
                "{}: no usable OPTIONS file ({e}): default options",
                dir.display()
            );
            (Options::default(), Vec::new())
        }
    };
    options.create_if_missing(false);
    options.create_missing_column_families(false);
    options.set_db_log_dir(log_dir);
    options.set_wal_dir(dir);
    let families = DB::list_cf(&options, dir).map_err(at)?;
    loaded.retain(|d| families.iter().any(|f| f == d.name()));
    let missing: Vec<ColumnFamilyDescriptor> = families
        .iter()
        .filter(|f| !loaded.iter().any(|d| d.name() == f.as_str()))
        .map(|f| ColumnFamilyDescriptor::new(f, Options::default()))
        .collect();
    loaded.extend(missing);
    let db = DB::open_cf_descriptors_read_only(&options, dir, loaded, false).map_err(at)?;
    Ok(Opened { db, families })
}

/// A key and its value.
type Entry = (Box<[u8]>, Box<[u8]>);

/// One side's keys of one column family, in order; empty if it lacks the family.
fn entries<'a>(
    side: Option<&'a Opened>,
    family: &str,
) -> Box<dyn Iterator<Item = Result<Entry>> + 'a> {
    let Some(opened) = side else {
        return Box::new(std::iter::empty());
    };
    let Some(cf) = opened.db.cf_handle(family) else {
        return Box::new(std::iter::empty());
    };
    let mut last: Option<Box<[u8]>> = None;
    let family = family.to_string();
    Box::new(
        opened
            .db
            .iterator_cf(&cf, IteratorMode::Start)
            .map(move |item| {
                let (k, v) = item.map_err(|e| {
                    Error::from(e).context(format!("read column family {family:?}"))
                })?;
                if last.as_ref().is_some_and(|l| l[..] >= k[..]) {
                    return Err(Error::Invalid(format!(
                        "column family {family:?}: keys not in bytewise order (a custom \
                         comparator?): cannot compare"
                    )));
                }
                last = Some(k.clone());
                Ok((k, v))
            }),
    )
}

/// Merge one column family's two key streams.
fn compare_family(
    a: Option<&Opened>,
    b: Option<&Opened>,
    family: &str,
    limit: usize,
) -> Result<ColumnFamilyKeys> {
    let mut out = ColumnFamilyKeys {
        column_family: family.to_string(),
        ..ColumnFamilyKeys::default()
    };
    let list = |out: &mut ColumnFamilyKeys, change: KeyChange| {
        if out.listed.len() < limit {
            out.listed.push(change);
        }
    };
    let (mut xs, mut ys) = (entries(a, family), entries(b, family));
    let (mut x, mut y) = (xs.next().transpose()?, ys.next().transpose()?);
    loop {
        let order = match (&x, &y) {
            (None, None) => break,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some((ka, _)), Some((kb, _))) => ka.cmp(kb),
        };
        match order {
            Ordering::Less => {
                let (k, v) = x.take().expect("compared");
                out.removed += 1;
                let (a, a_bytes) = shown(&v);
                let change = KeyChange {
                    change: Change::Removed,
                    key: escape(&k),
                    a,
                    a_bytes,
                    b: None,
                    b_bytes: None,
                };
                list(&mut out, change);
                x = xs.next().transpose()?;
            }
            Ordering::Greater => {
                let (k, v) = y.take().expect("compared");
                out.added += 1;
                let (b, b_bytes) = shown(&v);
                let change = KeyChange {
                    change: Change::Added,
                    key: escape(&k),
                    a: None,
                    a_bytes: None,
                    b,
                    b_bytes,
                };
                list(&mut out, change);
                y = ys.next().transpose()?;
            }
            Ordering::Equal => {
                let (k, va) = x.take().expect("compared");
                let (_, vb) = y.take().expect("compared");
                if va == vb {
                    out.unchanged += 1;
                } else {
                    out.changed += 1;
                    let ((a, a_bytes), (b, b_bytes)) = (shown(&va), shown(&vb));
                    let change = KeyChange {
                        change: Change::Changed,
                        key: escape(&k),
                        a,
                        a_bytes,
                        b,
                        b_bytes,
                    };
                    list(&mut out, change);
                }
                x = xs.next().transpose()?;
                y = ys.next().transpose()?;
            }
        }
    }
    out.listed_all = out.listed.len() as u64 == out.added + out.removed + out.changed;
    Ok(out)
}

fn has_current(snapshot: Option<&BackendSnapshot>) -> bool {
    snapshot.is_some_and(|s| s.files.iter().any(|f| f.name == "CURRENT"))
}

/// Write `snapshot` (if any) to `dir` and open it.
fn write_out(
    objects: &dyn ObjectStore,
    snapshot: Option<&BackendSnapshot>,
    dir: &Path,
    log_dir: &Path,
) -> Result<Option<Opened>> {
    let Some(snapshot) = snapshot.filter(|s| has_current(Some(*s))) else {
        return Ok(None);
    };
    crate::coordinator::materialize(objects, snapshot, dir, &mut |_| {})?;
    open(dir, log_dir).map(Some)
}

/// Compare the keys of every backend of `report` (made by [`super::compare`] from `a` and
/// `b`), reading their files from `objects` into a temporary directory under `scratch`
/// (removed again, whatever happens), listing at most `limit` changes per backend and
/// column family.
pub fn compare(
    objects: &dyn ObjectStore,
    a: &Manifest,
    b: &Manifest,
    report: &mut DiffReport,
    limit: usize,
    scratch: &Path,
) -> Result<()> {
    let work = tempfile::Builder::new()
        .prefix("ckptfs-diff-")
        .tempdir_in(scratch)
        .ctx("create a temporary directory in", scratch)?;
    let log_dir = work.path().join("log");
    crate::fsutil::create_private_dir_all(&log_dir)?;
    for (n, backend) in report.backends.iter_mut().enumerate() {
        let name: crate::names::BackendName = backend.backend.parse()?;
        let (sa, sb) = (a.backend(&name), b.backend(&name));
        if !has_current(sa) && !has_current(sb) {
            backend.keys = Some(BackendKeys {
                comparison: KeyComparison::NotRocksDb,
                column_families: Vec::new(),
            });
            continue;
        }
        if backend.presence == Presence::Both && backend.figures.is_same() {
            backend.keys = Some(BackendKeys {
                comparison: KeyComparison::SameFiles,
                column_families: Vec::new(),
            });
            continue;
        }
        let dir = work.path().join(n.to_string());
        let opened_a = write_out(objects, sa, &dir.join("a"), &log_dir)?;
        let opened_b = write_out(objects, sb, &dir.join("b"), &log_dir)?;
        let mut families: Vec<&String> = opened_a
            .iter()
            .chain(&opened_b)
            .flat_map(|o| &o.families)
            .collect();
        families.sort();
        families.dedup();
        let column_families = families
            .into_iter()
            .map(|family| compare_family(opened_a.as_ref(), opened_b.as_ref(), family, limit))
            .collect::<Result<Vec<_>>>()
            .map_err(|e| e.context(format!("backend {name}")))?;
        drop((opened_a, opened_b));
        crate::fsutil::remove_tree(&dir)?;
        backend.keys = Some(BackendKeys {
            comparison: KeyComparison::Iterated,
            column_families,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values_are_escaped_as_rust_byte_strings() {
        assert_eq!(escape(b"k\n\x00\xff\"a\\"), r#"k\n\x00\xff\"a\\"#);
        let (shown_value, len) = shown(&[b'x'; 300]);
        assert_eq!(shown_value.unwrap().len(), VALUE_SHOWN);
        assert_eq!(len, Some(300));
    }

    fn db_with(dir: &Path, pairs: &[(&str, &[(&str, &str)])]) {
        let mut options = Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        let names: Vec<&str> = pairs.iter().map(|(n, _)| *n).collect();
        let db = DB::open_cf(&options, dir, &names).unwrap();
        for (family, kvs) in pairs {
            let cf = db.cf_handle(family).unwrap();
            for (k, v) in kvs.iter() {
                db.put_cf(cf, k.as_bytes(), v.as_bytes()).unwrap();
            }
            db.flush_cf(cf).unwrap();
        }
    }

    #[test]
    fn two_databases_merge_into_added_removed_changed_and_unchanged_keys() {
        let dir = tempfile::tempdir().unwrap();
        let (pa, pb, log) = (dir.path().join("a"), dir.path().join("b"), dir.path());
        db_with(
            &pa,
            &[
                ("default", &[("a", "1"), ("b", "2"), ("c", "3")]),
                ("gone", &[("g", "")]),
            ],
        );
        db_with(
            &pb,
            &[
                ("default", &[("b", "2"), ("c", "33"), ("d\n", "4")]),
                ("fresh", &[("f1", "x"), ("f2", "y")]),
            ],
        );
        let (a, b) = (open(&pa, log).unwrap(), open(&pb, log).unwrap());
        let d = compare_family(Some(&a), Some(&b), "default", 10).unwrap();
        assert_eq!((d.added, d.removed, d.changed, d.unchanged), (1, 1, 1, 1));
        assert!(d.listed_all);
        let listed: Vec<(Change, &str)> = d
            .listed
            .iter()
            .map(|c| (c.change, c.key.as_str()))
            .collect();
        assert_eq!(
            listed,
            [
                (Change::Removed, "a"),
                (Change::Changed, "c"),
                (Change::Added, "d\\n")
            ]
        );
        assert_eq!(d.listed[1].a.as_deref(), Some("3"));
        assert_eq!(d.listed[1].b.as_deref(), Some("33"));
        assert_eq!(d.listed[1].b_bytes, Some(2));
        let gone = compare_family(Some(&a), Some(&b), "gone", 10).unwrap();
        assert_eq!((gone.removed, gone.added), (1, 0));
        // The limit bounds the listing, never the counts.
        let fresh = compare_family(Some(&a), Some(&b), "fresh", 1).unwrap();
        assert_eq!(
            (fresh.added, fresh.listed.len(), fresh.listed_all),
            (2, 1, false)
        );
        let none = compare_family(None, Some(&b), "default", 0).unwrap();
        assert_eq!((none.added, none.listed.len()), (3, 0));
        // Never created: a directory without CURRENT is refused, and stays empty.
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        assert!(matches!(open(&empty, log), Err(Error::NotFound(_))));
        assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);
    }
}
