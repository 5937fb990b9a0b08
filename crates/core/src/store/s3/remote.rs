//! The connection to one bucket and prefix ([`Remote`]): its clients, its runtime, and the
//! keys and URLs of the store's names.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as Key;
use object_store::ObjectStore as _;

use super::copier::Copier;
use crate::error::{Error, Result};
use crate::store::layout;

/// Keys deleted by one request (S3's DeleteObjects takes at most 1,000).
pub(super) const DELETE_BATCH: usize = 1000;

/// How long one delete request may take before it is abandoned without a fence (and the
/// deleting client's own timeout): with one, its request budget
/// ([`WriteFence::request_budget`](crate::store::WriteFence::request_budget): a fifth of the lease
/// time), so that a request sent just after the fence was checked is answered, or
/// abandoned, before another writer can take over.
pub const DELETE_TIMEOUT: Duration = Duration::from_secs(30);

/// Small reads (records, prefetched file lists) in flight at once.
pub(super) const GET_CONCURRENCY: usize = 16;

/// An `object_store` error as ours: the operation and the key in the message, the client's
/// error kept as the source; its kind (a missing object, a create-only or conditional write
/// refused) is [`Error::kind`]'s to tell.
pub(super) fn remote_error(what: &str, source: object_store::Error) -> Error {
    Error::ObjectStore {
        what: what.to_string(),
        source,
    }
}

/// The S3 error code (`NoSuchBucket`, `AccessDenied`, ...) of a failed request: S3 names the
/// kind of every error in the `<Code>` of its XML error response, which `object_store`
/// keeps in the error's text but exposes no other way (no HTTP status for a LIST).
pub(super) fn s3_error_code(e: &object_store::Error) -> Option<String> {
    let mut cause: Option<&dyn std::error::Error> = Some(e);
    while let Some(error) = cause {
        let text = error.to_string();
        if let Some((_, rest)) = text.split_once("<Code>") {
            if let Some((code, _)) = rest.split_once("</Code>") {
                return Some(code.to_string());
            }
        }
        cause = error.source();
    }
    None
}

/// The connection to one bucket and prefix, shared by the objects and the records.
pub struct Remote {
    pub(super) client: AmazonS3,
    /// The client object deletes go through: it never re-sends a request by itself (see
    /// [`S3Objects::delete`](crate::store::ObjectStore::delete)), and gives up on one after
    /// [`DELETE_TIMEOUT`].
    pub(super) deleter: AmazonS3,
    pub(super) runtime: tokio::runtime::Runtime,
    pub(super) bucket: String,
    /// The prefix keys start with: empty or ending in `/`.
    pub(super) prefix: String,
    /// The endpoint it talks to (`None`: AWS's, from the region).
    pub(super) endpoint: Option<String>,
    /// Server-side copies from other buckets ([`Remote::copy_from`]).
    pub(super) copier: Copier,
}

impl Remote {
    /// Connect to `s3://bucket/prefix`, configured from the standard AWS environment
    /// variables (endpoint, region, credentials). Makes no request.
    pub fn connect(bucket: &str, prefix: &str) -> Result<Arc<Remote>> {
        Self::connect_to(bucket, prefix, None)
    }

    /// [`Remote::connect`], to `endpoint` (`http://host:port`) instead of the one the
    /// environment names, if given.
    pub fn connect_to(bucket: &str, prefix: &str, endpoint: Option<&str>) -> Result<Arc<Remote>> {
        let mut base = AmazonS3Builder::from_env().with_bucket_name(bucket);
        // An endpoint the user gave as plain http (a local MinIO or Ceph) is meant.
        let endpoint = endpoint.map(str::to_string).or_else(|| {
            ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"]
                .iter()
                .find_map(|v| std::env::var(v).ok())
        });
        let allow_http = endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://"));
        if let Some(endpoint) = &endpoint {
            base = base.with_endpoint(endpoint);
        }
        let deleter = base
            .clone()
            .with_retry(object_store::RetryConfig {
                max_retries: 0,
                ..object_store::RetryConfig::default()
            })
            .with_client_options(
                object_store::ClientOptions::new()
                    .with_connect_timeout(Duration::from_secs(5))
                    .with_timeout(DELETE_TIMEOUT)
                    .with_allow_http(allow_http),
            )
            .build()
            .map_err(|e| Error::Invalid(format!("s3://{bucket}: {e}")))?;
        let builder = base
            .with_retry(object_store::RetryConfig {
                backoff: object_store::BackoffConfig {
                    init_backoff: Duration::from_millis(100),
                    max_backoff: Duration::from_secs(5),
                    base: 2.0,
                },
                max_retries: 5,
                retry_timeout: Duration::from_secs(30),
            })
            .with_client_options(
                object_store::ClientOptions::new()
                    .with_connect_timeout(Duration::from_secs(5))
                    .with_timeout(Duration::from_secs(120))
                    .with_allow_http(allow_http),
            );
        let copier = Copier::new(&builder, allow_http)?;
        let client = builder
            .build()
            .map_err(|e| Error::Invalid(format!("s3://{bucket}: {e}")))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ckptfs-s3")
            .enable_all()
            .build()
            .map_err(|e| Error::io("start the object storage client", e))?;
        let prefix = prefix.trim_matches('/');
        Ok(Arc::new(Remote {
            client,
            deleter,
            runtime,
            bucket: bucket.to_string(),
            prefix: if prefix.is_empty() {
                String::new()
            } else {
                format!("{prefix}/")
            },
            endpoint,
            copier,
        }))
    }

    /// Fail clearly when the bucket does not exist or cannot be reached (one LIST).
    pub fn check_bucket(&self) -> Result<()> {
        let prefix = self.key(layout::META);
        let listed = self.block_on(async {
            let mut stream = self.client.list(Some(&prefix));
            stream.next().await.transpose()
        });
        match listed {
            Ok(_) => Ok(()),
            Err(e) if s3_error_code(&e).as_deref() == Some("NoSuchBucket") => {
                Err(Error::NotFound(format!(
                    "bucket {} does not exist (create it first; ckptfs never creates buckets)",
                    self.bucket
                )))
            }
            Err(e) => Err(remote_error(&format!("reach {}", self.url("")), e)),
        }
    }

    pub(super) fn key(&self, name: &str) -> Key {
        Key::from(format!("{}{name}", self.prefix))
    }

    pub(super) fn url(&self, name: &str) -> String {
        format!("s3://{}/{}{name}", self.bucket, self.prefix)
    }

    pub(super) fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }

    /// Every key under `dir/`, with its last modification time.
    pub(super) fn list_under(&self, dir: &str) -> Result<Vec<(String, SystemTime)>> {
        let prefix = self.key(dir);
        // Keys come back as `object_store` spells them (characters such as `~`, `#`, `%`
        // or non-ASCII letters percent-encoded): strip the prefix spelled the same way.
        let full = format!("{}/", prefix.as_ref());
        self.block_on(async {
            let mut stream = self.client.list(Some(&prefix));
            let mut out = Vec::new();
            while let Some(meta) = stream.next().await {
                let meta = meta.map_err(|e| remote_error(&format!("list {}", self.url(dir)), e))?;
                let key = meta.location.as_ref();
                if let Some(name) = key.strip_prefix(&full) {
                    out.push((name.to_string(), SystemTime::from(meta.last_modified)));
                }
            }
            Ok(out)
        })
    }
}
