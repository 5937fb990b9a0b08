//! [`S3Records`]: records as small objects, written with conditional PUTs.

use std::sync::Arc;
use std::time::SystemTime;

use futures::StreamExt;
use object_store::{
    ObjectStore as _, ObjectStoreExt as _, PutMode, PutOptions, PutPayload, UpdateVersion,
};

use super::remote::{remote_error, Remote, GET_CONCURRENCY};
use crate::error::{Error, ErrorKind, Result};
use crate::store::conditional::{read_back, ReadBack};
use crate::store::layout;
use crate::store::records::{Put, Record, Records};

/// Records as small objects beside the objects, written with conditional PUTs.
pub struct S3Records {
    remote: Arc<Remote>,
}

impl S3Records {
    /// The records under `remote`'s prefix; connects to nothing.
    pub fn new(remote: Arc<Remote>) -> Self {
        S3Records { remote }
    }

    /// Refuse a server that ignores conditional writes (`If-None-Match: *`, `If-Match`):
    /// on it, nothing would fence a second writer. Probes with a record of its own.
    pub fn check_conditional_writes(&self) -> Result<()> {
        let key = format!("probe-{}.json", std::process::id());
        let refuse = |what: &str| {
            Err(Error::Invalid(format!(
                "{} ignores conditional writes ({what}): ckptfs cannot keep a second writer \
                 out of a store there, and refuses to write to it",
                self.remote.url("")
            )))
        };
        let _ = self.delete(&key);
        self.put(&key, b"1", Put::Create)?;
        let checked = match self.put(&key, b"2", Put::Create) {
            Err(e) if e.kind() == ErrorKind::Exists => match self.put(
                &key,
                b"3",
                Put::Update(Some("\"ckptfs-probe-no-such-etag\"".into())),
            ) {
                Err(e) if e.kind() == ErrorKind::Conflict => Ok(()),
                Ok(_) => refuse("If-Match"),
                Err(e) => Err(e),
            },
            Ok(_) => refuse("If-None-Match"),
            Err(e) => Err(e),
        };
        let _ = self.delete(&key);
        checked
    }

    /// A conditional put the server refused may have been our own, landed before a retry
    /// (a timeout, then "exists" or "changed"): its version if the record holds our bytes,
    /// `refused` if it holds none or another's. A record that cannot be read is an I/O
    /// error (see [`read_back`]).
    fn refused_put(&self, key: &str, bytes: &[u8], refused: Error) -> Result<Option<String>> {
        match read_back(self, key, bytes) {
            Ok(ReadBack::Landed { version }) => Ok(version),
            Ok(ReadBack::Absent | ReadBack::Other(_)) => Err(refused),
            Err(e) => Err(Error::io(
                format!(
                    "write {}: refused as changed, and it cannot be read back to tell \
                     whether by this writer's own earlier attempt",
                    self.remote.url(key)
                ),
                std::io::Error::other(e.to_string()),
            )),
        }
    }
}

impl S3Records {
    async fn get_async(&self, key: &str) -> Result<Option<Record>> {
        let what = format!("read {}", self.remote.url(key));
        let got = match self.remote.client.get(&self.remote.key(key)).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(remote_error(&what, e)),
        };
        let version = got.meta.e_tag.clone();
        let modified = Some(SystemTime::from(got.meta.last_modified));
        let bytes = got.bytes().await.map_err(|e| remote_error(&what, e))?;
        Ok(Some(Record {
            bytes: bytes.to_vec(),
            version,
            modified,
        }))
    }
}

impl Records for S3Records {
    fn get(&self, key: &str) -> Result<Option<Record>> {
        self.remote.block_on(self.get_async(key))
    }

    fn get_many(&self, keys: &[String]) -> Vec<Result<Option<Record>>> {
        self.remote.block_on(
            futures::stream::iter(keys)
                .map(|key| self.get_async(key))
                .buffered(GET_CONCURRENCY)
                .collect(),
        )
    }

    fn put(&self, key: &str, bytes: &[u8], mode: Put) -> Result<Option<String>> {
        let what = format!("write {}", self.remote.url(key));
        let mode = match mode {
            Put::Overwrite | Put::Update(None) => PutMode::Overwrite,
            Put::Create => PutMode::Create,
            Put::Update(Some(e_tag)) => PutMode::Update(UpdateVersion {
                e_tag: Some(e_tag),
                version: None,
            }),
        };
        let options = PutOptions {
            mode,
            ..Default::default()
        };
        let result = self.remote.block_on(self.remote.client.put_opts(
            &self.remote.key(key),
            PutPayload::from(bytes.to_vec()),
            options,
        ));
        match result {
            Ok(put) => Ok(put.e_tag),
            Err(
                e @ (object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. }),
            ) => self.refused_put(key, bytes, remote_error(&what, e)),
            Err(e) => Err(remote_error(&what, e)),
        }
    }

    fn delete(&self, key: &str) -> Result<()> {
        match self
            .remote
            .block_on(self.remote.client.delete(&self.remote.key(key)))
        {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(remote_error(&format!("delete {}", self.remote.url(key)), e)),
        }
    }

    fn list(&self, dir: &str) -> Result<Vec<String>> {
        Ok(self
            .remote
            .list_under(dir)?
            .into_iter()
            .map(|(name, _)| name)
            .filter(|name| !name.contains('/'))
            .collect())
    }

    fn has_dir(&self, _dir: &str) -> bool {
        true
    }

    fn create_dir(&self, _dir: &str) -> Result<()> {
        Ok(())
    }

    fn describe(&self, key: &str) -> String {
        self.remote.url(key)
    }

    fn versioned(&self) -> bool {
        true
    }

    /// A small record written and read back: its modification time is the store's now
    /// (to the second on most servers; callers allow for that).
    fn store_now(&self) -> Result<Option<SystemTime>> {
        let key = self.remote.key(CLOCK);
        let what = format!("read the clock of {}", self.remote.url(""));
        self.remote.block_on(async {
            self.remote
                .client
                .put(&key, PutPayload::from_static(b"{}"))
                .await
                .map_err(|e| remote_error(&what, e))?;
            let meta = self
                .remote
                .client
                .head(&key)
                .await
                .map_err(|e| remote_error(&what, e))?;
            Ok(Some(SystemTime::from(meta.last_modified)))
        })
    }
}

/// The record [`Records::store_now`] writes to read the store's clock.
const CLOCK: &str = layout::CLOCK;
