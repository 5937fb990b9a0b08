//! Copies into the store inside the object store ([`ObjectStore::stage_copy`]), through a
//! staging key under `tmp/`, and the sweep of staging keys left behind.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use super::foreign::RemoteFile;
use super::objects::S3Objects;
use crate::error::{Error, Result};
use crate::store::{layout, ObjectStore, Staged};

/// Staging keys of copies: `tmp/<unique>` below the store's prefix, never under
/// `objects/` (whose keys are all ids).
static COPY_SEQUENCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl S3Objects {
    /// A key below the store's prefix that no other stage uses: `tmp/<pid>-<nanos>-<n>`.
    fn copy_staging_key(&self) -> String {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let n = COPY_SEQUENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.remote.full_key(&format!(
            "{}/{}-{nanos}-{n}",
            layout::TMP,
            std::process::id()
        ))
    }

    /// Copy `file` into the store inside the object store, named by the SHA-256 the object
    /// store computes (of the whole, or of its parts' above 1 GiB): first to a staging key
    /// (which gives the hash), then from there to the object's key, then the staging key
    /// is deleted. No byte passes through this host.
    pub(super) fn copy_in(&self, file: &RemoteFile) -> Result<Staged> {
        if !self.remote.can_copy_from(&file.remote) {
            return Err(Error::Invalid(format!(
                "{} is on another endpoint than {}: the object store cannot copy it",
                file.uri(),
                self.describe()
            )));
        }
        let staging = self.copy_staging_key();
        let first = self.remote.copy_from(
            &file.remote,
            &file.key,
            &staging,
            file.size,
            file.etag.as_deref(),
        );
        let result = first.and_then(|copied| {
            let id = copied.id(&file.uri()).inspect_err(|e| {
                // Such an endpoint never will: the next try reads the files instead.
                self.copies_named
                    .store(false, std::sync::atomic::Ordering::Relaxed);
                log::warn!("{e}; files are read and uploaded from now on");
            })?;
            let key = self.remote.full_key(&Self::object_name(&id));
            self.begin_stage(id);
            let second = self
                .remote
                .copy_from(&self.remote, &staging, &key, file.size, Some(&copied.etag))
                .and_then(|again| {
                    if again.id == Some(id) {
                        Ok(())
                    } else {
                        Err(Error::Corrupt(format!(
                            "the object store copied {} as {} and then as {:?}",
                            file.uri(),
                            id,
                            again.id
                        )))
                    }
                });
            match second {
                Ok(()) => Ok(Staged {
                    id,
                    size: file.size,
                    tmp: PathBuf::new(),
                    file: None,
                }),
                Err(e) => {
                    self.end_stage(&id);
                    Err(e)
                }
            }
        });
        // Best effort: a staging key left behind is swept with the orphans.
        if let Err(e) = self.remote.delete_key(&staging) {
            log::warn!(
                "staging copy s3://{}/{staging} not deleted: {e}",
                self.remote.bucket
            );
        }
        result
    }

    /// Delete staging copies (`tmp/`) older than `grace` (the store's: the orphan grace),
    /// and abort copies in parts to staging keys begun longer ago (their parts are not
    /// keys, and S3 keeps them until aborted): a copy in flight is younger, and an
    /// interrupted one is an orphan once older. The count of both.
    pub(super) fn sweep_copy_staging(&self, grace: Duration) -> Result<usize> {
        let mut swept = 0;
        let staging = self.remote.full_key(&format!("{}/", layout::TMP));
        for (key, upload_id) in self.remote.stale_uploads(&staging, grace)? {
            self.check_fence()?;
            self.remote.abort_upload(&key, &upload_id)?;
            swept += 1;
        }
        for (name, modified) in self.remote.list_under(layout::TMP)? {
            if crate::store::is_young(Some(modified), grace) {
                continue;
            }
            self.check_fence()?;
            self.remote
                .delete_key(&self.remote.full_key(&format!("{}/{name}", layout::TMP)))?;
            swept += 1;
        }
        Ok(swept)
    }
}
