//! [`Remote::upload_from`]: what a writer fills, uploaded without a copy on disk (one PUT,
//! or a multipart upload once more than a part is written).

use object_store::path::Path as Key;
use object_store::{ObjectStoreExt as _, PutPayload};

use super::remote::{remote_error, Remote};
use crate::error::{Error, Result};

/// Objects above this size are uploaded in parts of this size, several at once.
pub const PART_SIZE: usize = 8 << 20;

impl Remote {
    /// What `fill` writes, uploaded as object `key` (a key below the bucket, not the
    /// store's prefix), without a copy anywhere but in memory: one PUT when it is at most
    /// [`PART_SIZE`] bytes, else a multipart upload of [`PART_SIZE`] parts, a few in
    /// flight. When `fill` fails (a source that does not match its checksum finds out at
    /// its end), or an upload does, nothing is left under `key`: the multipart upload is
    /// aborted, the single PUT never sent.
    pub fn upload_from(
        &self,
        key: &str,
        fill: impl FnOnce(&mut dyn std::io::Write) -> Result<()>,
    ) -> Result<()> {
        let mut upload = Upload {
            remote: self,
            key: Key::from(key),
            what: format!("upload s3://{}/{key}", self.bucket),
            pending: Vec::new(),
            parts: None,
            failed: None,
        };
        let filled = fill(&mut upload);
        match (filled, upload.failed.take()) {
            (Ok(()), None) => upload.finish(),
            // The upload's own error is the cause of the write error `fill` saw.
            (_, Some(e)) | (Err(e), None) => {
                upload.abort();
                Err(e)
            }
        }
    }
}

/// An upload in progress ([`Remote::upload_from`]): what is written is held until a part's
/// worth is in, then handed to a multipart upload (started by the first full part).
struct Upload<'a> {
    remote: &'a Remote,
    key: Key,
    what: String,
    /// Written, not handed over yet: less than a part, or the whole object if it stays
    /// that small.
    pending: Vec<u8>,
    parts: Option<object_store::WriteMultipart>,
    /// Why a write failed (kept whole: the writer sees it as an `io::Error`).
    failed: Option<Error>,
}

impl Upload<'_> {
    /// Hand the pending bytes to the multipart upload, starting it first if need be.
    fn send_part(&mut self) -> Result<()> {
        let (remote, key, what) = (self.remote, &self.key, &self.what);
        let part = std::mem::take(&mut self.pending);
        let parts = &mut self.parts;
        remote.block_on(async {
            if parts.is_none() {
                let upload = remote
                    .client
                    .put_multipart(key)
                    .await
                    .map_err(|e| remote_error(what, e))?;
                *parts = Some(object_store::WriteMultipart::new_with_chunk_size(
                    upload, PART_SIZE,
                ));
            }
            if let Some(writer) = parts.as_mut() {
                writer
                    .wait_for_capacity(4)
                    .await
                    .map_err(|e| remote_error(what, e))?;
                writer.put(bytes::Bytes::from(part));
            }
            Ok(())
        })
    }

    fn finish(mut self) -> Result<()> {
        let (remote, what) = (self.remote, &self.what);
        match self.parts.take() {
            None => {
                let payload = PutPayload::from(std::mem::take(&mut self.pending));
                remote
                    .block_on(remote.client.put(&self.key, payload))
                    .map(|_| ())
                    .map_err(|e| remote_error(what, e))
            }
            Some(mut writer) => {
                let rest = std::mem::take(&mut self.pending);
                remote.block_on(async {
                    writer.put(bytes::Bytes::from(rest));
                    writer
                        .finish()
                        .await
                        .map(|_| ())
                        .map_err(|e| remote_error(what, e))
                })
            }
        }
    }

    fn abort(mut self) {
        if let Some(writer) = self.parts.take() {
            if let Err(e) = self.remote.block_on(writer.abort()) {
                // Its parts stay in the bucket, unseen, until a lifecycle rule
                // (AbortIncompleteMultipartUpload) removes them.
                log::warn!(
                    "{}: the multipart upload could not be aborted: {e}",
                    self.what
                );
            }
        }
    }
}

impl std::io::Write for Upload<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.failed.is_some() {
            return Err(std::io::Error::other("the upload failed"));
        }
        // A full part goes out only once more follows: an object of exactly one part's
        // size is one PUT.
        if self.pending.len() == PART_SIZE && !buf.is_empty() {
            if let Err(e) = self.send_part() {
                let message = e.to_string();
                self.failed = Some(e);
                return Err(std::io::Error::other(message));
            }
        }
        let n = buf.len().min(PART_SIZE - self.pending.len());
        self.pending.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
