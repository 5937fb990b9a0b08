//! The door's S3 calls, on `s3s`: who may call what ([`ReadOnly`]), and the read calls
//! ([`Door`]): ListBuckets, HeadBucket, GetBucketLocation, ListObjects (V1 and V2),
//! HeadObject and GetObject (with Range and the conditional headers). Every other call is
//! refused with `AccessDenied` before its body is read.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use s3s::access::{S3Access, S3AccessContext};
use s3s::dto::{self, ETag, ETagCondition, Timestamp};
use s3s::{s3_error, S3Request, S3Response, S3Result};

use super::body::{self, Verified};
use super::bucket::{Bucket, Found, Page, Query};
use ckptfs_core::error::Error;

/// The calls the door answers; every other is refused (`AccessDenied`).
pub const READ_CALLS: &[&str] = &[
    "ListBuckets",
    "HeadBucket",
    "GetBucketLocation",
    "ListObjects",
    "ListObjectsV2",
    "HeadObject",
    "GetObject",
];

/// Who may call what: the read calls only, and only signed with the door's key unless
/// anonymous reads are allowed.
pub struct ReadOnly {
    /// Unsigned requests may read too (`--s3-anonymous`).
    pub anonymous: bool,
}

#[async_trait::async_trait]
impl S3Access for ReadOnly {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        let op = cx.s3_op().name();
        if !READ_CALLS.contains(&op) {
            return Err(s3_error!(
                AccessDenied,
                "the ckptfs S3 door is read-only: {op} is refused"
            ));
        }
        if cx.credentials().is_none() && !self.anonymous {
            return Err(s3_error!(
                AccessDenied,
                "a request signed with the door's key is required"
            ));
        }
        Ok(())
    }
}

/// The door's key: a request signed with another access key is refused (AccessDenied).
pub struct DoorKey(pub Option<super::Credentials>);

#[async_trait::async_trait]
impl s3s::auth::S3Auth for DoorKey {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<s3s::auth::SecretKey> {
        match &self.0 {
            Some(key) if key.access_key == access_key => Ok(key.secret_key.clone().into()),
            _ => Err(s3_error!(
                AccessDenied,
                "the request is signed with an access key this door does not know"
            )),
        }
    }
}

/// The read calls over one bucket.
pub struct Door {
    /// The bucket's name.
    pub name: String,
    /// Its keys and objects.
    pub bucket: Arc<Bucket>,
    /// Objects verified whole (for ranged reads).
    pub verified: Arc<Verified>,
    /// When the door started (the bucket's creation date).
    pub started: SystemTime,
}

fn internal(e: impl std::fmt::Display) -> s3s::S3Error {
    s3_error!(InternalError, "{e}")
}

/// Run `f` off the runtime's thread (it reads manifests and objects).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> ckptfs_core::error::Result<T> + Send + 'static,
) -> S3Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(internal)?
        .map_err(internal)
}

/// Whole seconds: what an HTTP date holds.
fn seconds(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn timestamp_seconds(t: &Timestamp) -> i64 {
    let t: time::OffsetDateTime = t.clone().into();
    t.unix_timestamp()
}

fn etag_matches(condition: &ETagCondition, etag: &str, weak: bool) -> bool {
    match condition {
        ETagCondition::Any => true,
        ETagCondition::ETag(ETag::Strong(v)) => v == etag,
        ETagCondition::ETag(ETag::Weak(v)) => weak && v == etag,
    }
}

/// The conditional headers of a GET or HEAD.
pub(crate) struct Conditions<'a> {
    pub if_match: Option<&'a ETagCondition>,
    pub if_unmodified_since: Option<&'a Timestamp>,
    pub if_none_match: Option<&'a ETagCondition>,
    pub if_modified_since: Option<&'a Timestamp>,
}

/// The conditional headers of a GET or HEAD (RFC 9110 13.2.2): 412 or 304, or go on.
fn check_conditions(found: &Found, asked: &Conditions<'_>) -> S3Result<()> {
    let etag = found.content.etag();
    let modified = seconds(found.modified);
    match (asked.if_match, asked.if_unmodified_since) {
        (Some(c), _) if !etag_matches(c, &etag, false) => {
            return Err(s3_error!(PreconditionFailed, "If-Match"));
        }
        (None, Some(t)) if modified > timestamp_seconds(t) => {
            return Err(s3_error!(PreconditionFailed, "If-Unmodified-Since"));
        }
        _ => {}
    }
    match (asked.if_none_match, asked.if_modified_since) {
        (Some(c), _) if etag_matches(c, &etag, true) => Err(s3_error!(NotModified)),
        (None, Some(t)) if modified <= timestamp_seconds(t) => Err(s3_error!(NotModified)),
        _ => Ok(()),
    }
}

impl Door {
    fn check_bucket(&self, bucket: &str) -> S3Result<()> {
        if bucket == self.name {
            Ok(())
        } else {
            Err(s3_error!(
                NoSuchBucket,
                "this door serves one bucket, {}",
                self.name
            ))
        }
    }

    async fn find(&self, key: &str) -> S3Result<Found> {
        let (bucket, k) = (self.bucket.clone(), key.to_string());
        blocking(move || bucket.find(&k))
            .await?
            .ok_or_else(|| s3_error!(NoSuchKey, "{key}"))
    }

    /// What a GET or HEAD of `key` answers with: the object, once its bucket, its
    /// conditions and the range asked are checked, with the range and its Content-Range.
    async fn located(
        &self,
        bucket: &str,
        key: &str,
        conditions: Conditions<'_>,
        range: Option<&dto::Range>,
    ) -> S3Result<(Found, std::ops::Range<u64>, Option<String>)> {
        self.check_bucket(bucket)?;
        let found = self.find(key).await?;
        check_conditions(&found, &conditions)?;
        let (range, content_range) = body::range_of(range, found.content.size())?;
        Ok((found, range, content_range))
    }

    async fn list(&self, query: Query) -> S3Result<Page> {
        let bucket = self.bucket.clone();
        blocking(move || bucket.list(&query)).await
    }
}

fn max_keys(asked: Option<i32>) -> S3Result<usize> {
    match asked {
        None => Ok(super::bucket::MAX_KEYS),
        Some(n) if n < 0 => Err(s3_error!(InvalidArgument, "max-keys must not be negative")),
        Some(n) => Ok(n as usize),
    }
}

fn contents(page: &Page) -> (dto::ObjectList, dto::CommonPrefixList) {
    let objects = page
        .keys
        .iter()
        .map(|(key, size, etag, modified)| dto::Object {
            key: Some(key.clone()),
            size: Some(*size as i64),
            e_tag: Some(ETag::Strong(etag.clone())),
            last_modified: Some(Timestamp::from(*modified)),
            storage_class: Some(dto::ObjectStorageClass::from_static(
                dto::ObjectStorageClass::STANDARD,
            )),
            ..Default::default()
        })
        .collect();
    let prefixes = page
        .prefixes
        .iter()
        .map(|p| dto::CommonPrefix {
            prefix: Some(p.clone()),
        })
        .collect();
    (objects, prefixes)
}

#[async_trait::async_trait]
impl s3s::S3 for Door {
    async fn list_buckets(
        &self,
        _req: S3Request<dto::ListBucketsInput>,
    ) -> S3Result<S3Response<dto::ListBucketsOutput>> {
        Ok(S3Response::new(dto::ListBucketsOutput {
            buckets: Some(vec![dto::Bucket {
                name: Some(self.name.clone()),
                creation_date: Some(Timestamp::from(self.started)),
                ..Default::default()
            }]),
            ..Default::default()
        }))
    }

    async fn head_bucket(
        &self,
        req: S3Request<dto::HeadBucketInput>,
    ) -> S3Result<S3Response<dto::HeadBucketOutput>> {
        self.check_bucket(&req.input.bucket)?;
        Ok(S3Response::new(dto::HeadBucketOutput::default()))
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<dto::GetBucketLocationInput>,
    ) -> S3Result<S3Response<dto::GetBucketLocationOutput>> {
        self.check_bucket(&req.input.bucket)?;
        // No constraint: us-east-1, what a client assumes of a bucket anywhere else.
        Ok(S3Response::new(dto::GetBucketLocationOutput::default()))
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<dto::ListObjectsV2Input>,
    ) -> S3Result<S3Response<dto::ListObjectsV2Output>> {
        let input = req.input;
        self.check_bucket(&input.bucket)?;
        let max = max_keys(input.max_keys)?;
        let after = match (&input.continuation_token, &input.start_after) {
            (Some(token), _) => Some(token.clone()),
            (None, after) => after.clone().filter(|a| !a.is_empty()),
        };
        let page = self
            .list(Query {
                prefix: input.prefix.clone().unwrap_or_default(),
                delimiter: input.delimiter.clone(),
                after,
                max_keys: max,
            })
            .await?;
        let (objects, prefixes) = contents(&page);
        Ok(S3Response::new(dto::ListObjectsV2Output {
            name: Some(self.name.clone()),
            prefix: input.prefix,
            delimiter: input.delimiter,
            max_keys: Some(max as i32),
            key_count: Some((objects.len() + prefixes.len()) as i32),
            continuation_token: input.continuation_token,
            start_after: input.start_after,
            is_truncated: Some(page.truncated),
            next_continuation_token: page.last.clone().filter(|_| page.truncated),
            contents: Some(objects),
            common_prefixes: Some(prefixes),
            ..Default::default()
        }))
    }

    async fn list_objects(
        &self,
        req: S3Request<dto::ListObjectsInput>,
    ) -> S3Result<S3Response<dto::ListObjectsOutput>> {
        let input = req.input;
        self.check_bucket(&input.bucket)?;
        let max = max_keys(input.max_keys)?;
        let page = self
            .list(Query {
                prefix: input.prefix.clone().unwrap_or_default(),
                delimiter: input.delimiter.clone(),
                after: input.marker.clone().filter(|m| !m.is_empty()),
                max_keys: max,
            })
            .await?;
        let (objects, prefixes) = contents(&page);
        Ok(S3Response::new(dto::ListObjectsOutput {
            name: Some(self.name.clone()),
            prefix: input.prefix,
            delimiter: input.delimiter,
            marker: input.marker,
            max_keys: Some(max as i32),
            is_truncated: Some(page.truncated),
            next_marker: page.last.clone().filter(|_| page.truncated),
            contents: Some(objects),
            common_prefixes: Some(prefixes),
            ..Default::default()
        }))
    }

    async fn head_object(
        &self,
        req: S3Request<dto::HeadObjectInput>,
    ) -> S3Result<S3Response<dto::HeadObjectOutput>> {
        let input = req.input;
        let (found, range, content_range) = self
            .located(
                &input.bucket,
                &input.key,
                Conditions {
                    if_match: input.if_match.as_ref(),
                    if_unmodified_since: input.if_unmodified_since.as_ref(),
                    if_none_match: input.if_none_match.as_ref(),
                    if_modified_since: input.if_modified_since.as_ref(),
                },
                input.range.as_ref(),
            )
            .await?;
        Ok(S3Response::new(dto::HeadObjectOutput {
            accept_ranges: Some("bytes".into()),
            content_length: Some((range.end - range.start) as i64),
            content_range,
            content_type: Some("application/octet-stream".into()),
            e_tag: Some(ETag::Strong(found.content.etag())),
            last_modified: Some(Timestamp::from(found.modified)),
            ..Default::default()
        }))
    }

    async fn get_object(
        &self,
        req: S3Request<dto::GetObjectInput>,
    ) -> S3Result<S3Response<dto::GetObjectOutput>> {
        let input = req.input;
        let (found, range, content_range) = self
            .located(
                &input.bucket,
                &input.key,
                Conditions {
                    if_match: input.if_match.as_ref(),
                    if_unmodified_since: input.if_unmodified_since.as_ref(),
                    if_none_match: input.if_none_match.as_ref(),
                    if_modified_since: input.if_modified_since.as_ref(),
                },
                input.range.as_ref(),
            )
            .await?;
        let (etag, modified) = (found.content.etag(), found.modified);
        let length = range.end - range.start;
        let (bucket, verified) = (self.bucket.clone(), self.verified.clone());
        let stream = tokio::task::spawn_blocking(move || {
            body::open(bucket.checkpoints().clone(), verified, found, range)
        })
        .await
        .map_err(internal)?
        .map_err(|e: Error| {
            log::error!("S3 door: GET {}: {e}", input.key);
            internal(e)
        })?;
        // s3s answers 206 when a Content-Range is given.
        let output = dto::GetObjectOutput {
            accept_ranges: Some("bytes".into()),
            body: Some(dto::StreamingBlob::wrap(stream)),
            content_length: Some(length as i64),
            content_range,
            content_type: Some("application/octet-stream".into()),
            e_tag: Some(ETag::Strong(etag)),
            last_modified: Some(Timestamp::from(modified)),
            ..Default::default()
        };
        Ok(S3Response::new(output))
    }
}
