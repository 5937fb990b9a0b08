//! A source in a bucket: the keys under one prefix. A key outside it is never asked for,
//! whatever a `_metadata` names: another tenant's prefix of the same bucket is not the
//! source's to give.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::{checked_relative, join, refused, Entry, EntryKind, Fetched, FileStamp, Tree, Walked};
use crate::error::{Error, IoContext, Result};
use crate::store::s3::{Remote, Within};

/// The keys below one prefix of a bucket, as a [`Tree`]: `/` separates the levels.
pub struct S3Tree {
    remote: Arc<Remote>,
    /// Without a trailing `/`; empty: the whole bucket.
    prefix: String,
}

impl S3Tree {
    /// The tree of `remote`'s bucket below `prefix` (slashes around it ignored; "": the
    /// whole bucket). `remote`'s own prefix is not used: keys are whole keys.
    pub fn new(remote: Arc<Remote>, prefix: &str) -> S3Tree {
        S3Tree {
            remote,
            prefix: prefix.trim_matches('/').to_string(),
        }
    }

    /// The bucket's name.
    pub fn bucket(&self) -> &str {
        self.remote.bucket()
    }

    /// The key prefix of directory `rel` ("" is the root): empty, or ending in `/`.
    fn dir_prefix(&self, rel: &str) -> Result<String> {
        let dir = if rel.is_empty() {
            self.prefix.clone()
        } else {
            self.key(rel)?
        };
        Ok(if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        })
    }

    /// The key of `rel`, checked.
    fn key(&self, rel: &str) -> Result<String> {
        checked_relative(&self.show(rel), rel)?;
        Ok(join(&self.prefix, rel))
    }
}

impl Tree for S3Tree {
    fn describe(&self) -> String {
        format!("s3://{}/{}", self.remote.bucket(), self.prefix)
    }

    fn list(&self, rel: &str) -> Result<Vec<Entry>> {
        let listing = self.dir_prefix(rel)?;
        let mut out = Vec::new();
        for (key, size, modified) in self.remote.list_keys(&listing, true)? {
            let is_dir = key.ends_with('/');
            let Some(name) = key
                .strip_prefix(&listing)
                .map(|n| n.trim_end_matches('/'))
                .filter(|n| !n.is_empty() && !n.contains('/'))
            else {
                continue;
            };
            out.push(Entry {
                name: name.to_string(),
                kind: if is_dir {
                    EntryKind::Dir
                } else {
                    EntryKind::File
                },
                size,
                modified,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn size_of(&self, rel: &str) -> Result<Option<u64>> {
        self.remote.size_of(&self.key(rel)?)
    }

    fn stamp(&self, rel: &str) -> Result<Option<FileStamp>> {
        Ok(self
            .remote
            .stamp_of(&self.key(rel)?)?
            .map(|(size, modified)| FileStamp {
                size,
                modified: Some(modified),
            }))
    }

    fn read(&self, rel: &str, limit: u64) -> Result<Vec<u8>> {
        let key = self.key(rel)?;
        // One GET: its size from the answer, nothing past `limit + 1` bytes asked for.
        match self.remote.get_within(&key, limit)? {
            Within::Bytes(bytes) => Ok(bytes),
            Within::Larger(Some(size)) => Err(refused(
                self.show(rel),
                format!("{size} bytes, more than the {limit} ckptfs reads of such a file"),
                libc::EINVAL,
            )),
            Within::Larger(None) => Err(refused(
                self.show(rel),
                format!("more than the {limit} bytes ckptfs reads of such a file"),
                libc::EINVAL,
            )),
        }
    }

    fn fetch(&self, rel: &str, staging: &Path, name: &str, limit: u64) -> Result<Fetched> {
        let key = self.key(rel)?;
        crate::fsutil::create_private_dir_all(staging)?;
        let path = staging.join(name);
        match self.remote.download(&key, &path, limit)? {
            Some(_) => Ok(Fetched::Downloaded(path)),
            None => Err(super::refused(
                format!("s3://{}/{key}", self.remote.bucket()),
                format!("more than the {limit} bytes its handle says"),
                libc::EINVAL,
            )),
        }
    }

    fn fetch_segment(
        &self,
        rel: &str,
        start: u64,
        size: u64,
        staging: &Path,
        name: &str,
    ) -> Result<Fetched> {
        let key = self.key(rel)?;
        crate::fsutil::create_private_dir_all(staging)?;
        let path = staging.join(name);
        if size == 0 {
            // No byte to ask for (a ranged GET of none is refused).
            crate::fsutil::create_new_private()
                .open(&path)
                .ctx("create", &path)?;
            return Ok(Fetched::Downloaded(path));
        }
        let end = start.checked_add(size).ok_or_else(|| {
            super::refused(self.show(rel), "a segment past 2^64 bytes", libc::EINVAL)
        })?;
        match self
            .remote
            .download_range(&key, &path, Some(start..end), size)?
        {
            Some(n) if n == size => Ok(Fetched::Downloaded(path)),
            // The object ends before the segment does (a ranged GET past the end gives
            // what there is): refused here, by what is wrong.
            Some(n) => {
                let _ = std::fs::remove_file(&path);
                Err(super::refused(
                    format!("s3://{}/{key}", self.remote.bucket()),
                    format!(
                        "it ends before bytes {start}..{end} of the checkpoint's metadata \
                         ({n} of them read)"
                    ),
                    libc::EINVAL,
                ))
            }
            None => Err(super::refused(
                format!("s3://{}/{key}", self.remote.bucket()),
                format!("more than the {size} bytes of its segment"),
                libc::EINVAL,
            )),
        }
    }

    fn locate(&self, uri: &str) -> Option<String> {
        let (bucket, key) = ["s3://", "s3a://", "s3p://"]
            .iter()
            .find_map(|scheme| uri.strip_prefix(scheme))
            .and_then(|rest| rest.split_once('/'))?;
        if bucket != self.remote.bucket() {
            return None;
        }
        let rel = if self.prefix.is_empty() {
            key
        } else {
            key.strip_prefix(&self.prefix)?.strip_prefix('/')?
        };
        checked_relative(&uri, rel).ok().map(str::to_string)
    }

    /// One flat listing of every key below `rel` (no request per directory: a Flink
    /// directory of 100,000 files is 100 pages of 1,000 keys). Every key is a file; the
    /// "directories" between are listed too, as the keys imply them.
    fn walk(&self, rel: &str) -> Result<Vec<Walked>> {
        let listing = self.dir_prefix(rel)?;
        let mut out = Vec::new();
        let mut dirs = std::collections::BTreeSet::new();
        for (key, size, modified) in self.remote.list_keys(&listing, false)? {
            let Some(below) = key.strip_prefix(&listing).filter(|n| !n.is_empty()) else {
                continue;
            };
            // A key that is no plain path (`a//b`, `../x`) names nothing a `_metadata`
            // can name either: listed as something that is not a file, never deleted.
            let plain = checked_relative(&below, below).is_ok();
            let path = join(rel, below);
            if out.len() >= super::MAX_WALK_ENTRIES {
                return Err(refused(
                    self.show(rel),
                    format!("more than {} keys", super::MAX_WALK_ENTRIES),
                    libc::E2BIG,
                ));
            }
            if plain {
                let mut at = rel.to_string();
                for part in below.split('/').collect::<Vec<_>>().split_last().unwrap().1 {
                    at = join(&at, part);
                    dirs.insert(at.clone());
                }
            }
            out.push(Walked {
                rel: path,
                kind: if plain {
                    EntryKind::File
                } else {
                    EntryKind::Other
                },
                size,
                modified,
            });
        }
        out.extend(dirs.into_iter().map(|rel| Walked {
            rel,
            kind: EntryKind::Dir,
            size: 0,
            modified: None,
        }));
        out.sort_by(|a, b| a.rel.cmp(&b.rel));
        Ok(out)
    }

    fn remove_file(&self, rel: &str, seen: &Walked) -> Result<bool> {
        // Looked up first: gone already, or another object under the name since it was
        // listed (S3 has no conditional delete of a general purpose bucket's object; a
        // Flink file's name is a fresh UUID, never written twice).
        let key = self.key(rel)?;
        match self.remote.size_of(&key)? {
            None => Ok(false),
            Some(size) if size != seen.size => Err(refused(
                self.show(rel),
                "written since it was listed: not deleted",
                libc::EAGAIN,
            )),
            Some(_) => self.remote.delete_key(&key).map(|()| true),
        }
    }

    fn remove_files(&self, files: &[(&str, &Walked)]) -> Vec<Result<bool>> {
        // A checkpoint's `_metadata` is the one name a job writes again (a job restored
        // under the same id counts its checkpoints from the restored one's on): each is
        // looked up first, alone. Every other name is a fresh UUID: deleted in bulk.
        let is_metadata = |rel: &str| rel.rsplit('/').next() == Some("_metadata");
        let keys: Vec<Option<Result<String>>> = files
            .iter()
            .map(|(rel, _)| (!is_metadata(rel)).then(|| self.key(rel)))
            .collect();
        let bulk: Vec<String> = keys
            .iter()
            .filter_map(|k| k.as_ref().and_then(|k| k.as_ref().ok()).cloned())
            .collect();
        let mut failed: HashMap<String, Error> =
            self.remote.delete_keys(&bulk).into_iter().collect();
        files
            .iter()
            .zip(keys)
            .map(|((rel, seen), key)| match key {
                None => self.remove_file(rel, seen),
                Some(key) => {
                    let key = key?;
                    match failed.remove(&key) {
                        Some(e) => Err(e),
                        None => Ok(true),
                    }
                }
            })
            .collect()
    }

    fn remove_empty_dir(&self, _rel: &str) -> Result<bool> {
        Ok(false)
    }

    fn remote_file(&self, rel: &str) -> Result<Option<crate::store::s3::RemoteFile>> {
        self.remote.remote_file(&self.key(rel)?)
    }

    fn remote(&self) -> Option<&Arc<Remote>> {
        Some(&self.remote)
    }

    fn immutable_name(&self, rel: &str) -> Option<String> {
        Some(format!(
            "s3://{}/{}",
            self.remote.bucket(),
            join(&self.prefix, rel)
        ))
    }
}
