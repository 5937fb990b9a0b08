//! What a server-side copy (`copy.rs`, `copy_parts.rs`) needs that `object_store` keeps
//! inside its client (the HTTP client, the region and the bucket's URL, built as
//! `AmazonS3Builder::build` builds them), and the sizes copies are made in.

use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::client::{HttpClient, HttpConnector, ReqwestConnector};
use object_store::ClientOptions;

use crate::error::{Error, Result};

/// The size of a part, `1 << PART_LOG2` bytes (1 GiB): S3 takes parts of 5 MiB to 5 GiB and
/// at most 10,000 of them, so 1 GiB parts copy any object up to its largest, 5 TiB; and one
/// part's copy takes seconds (tens at 20 MB/s), well within the copier's timeout.
pub(super) const PART_LOG2: u8 = 30;

/// The largest object copied by one CopyObject request: one part of a copy in parts
/// (1 GiB). S3 copies up to 5 GiB in one request, but a request that copies gigabytes takes
/// minutes, beyond the client's timeout, and a copy in parts copies four parts at once.
pub(super) const MAX_COPY_OBJECT: u64 = 1 << PART_LOG2;

/// What a CopyObject request needs that `object_store` keeps inside its client.
pub(super) struct Copier {
    pub(super) http: HttpClient,
    pub(super) region: String,
    /// The URL of the bucket: keys follow it after a `/`.
    pub(super) bucket_url: String,
    pub(super) sign: bool,
    pub(super) request_payer: bool,
    /// The largest object copied by one CopyObject; larger ones are copied in parts.
    pub(super) single_max: u64,
    /// Parts of copies in parts are `1 << part_log2` bytes.
    pub(super) part_log2: u8,
}

impl Copier {
    /// The copier of the bucket `builder` names, configured as the client built from it
    /// (its timeouts: [`Remote::connect_to`](super::Remote::connect_to)'s; plain http if `allow_http`).
    pub(super) fn new(builder: &AmazonS3Builder, allow_http: bool) -> Result<Copier> {
        let config = |key: AmazonS3ConfigKey| builder.get_config_value(&key);
        // As object_store reads a boolean (and `AWS_REQUEST_PAYER=requester`).
        let yes = |key: AmazonS3ConfigKey| {
            config(key).is_some_and(|v| {
                let v = v.to_ascii_lowercase();
                ["1", "true", "on", "yes", "y", "requester"].contains(&v.as_str())
            })
        };
        let bucket = config(AmazonS3ConfigKey::Bucket).unwrap_or_default();
        let region = config(AmazonS3ConfigKey::Region).unwrap_or_else(|| "us-east-1".into());
        // As AmazonS3Builder::build: the S3 endpoint before the generic one; an endpoint
        // for virtual-hosted requests names the bucket already.
        let endpoint =
            config(AmazonS3ConfigKey::S3Endpoint).or_else(|| config(AmazonS3ConfigKey::Endpoint));
        let bucket_url = match (endpoint, yes(AmazonS3ConfigKey::VirtualHostedStyleRequest)) {
            (Some(endpoint), true) => endpoint,
            (Some(endpoint), false) => format!("{}/{bucket}", endpoint.trim_end_matches('/')),
            (None, true) => format!("https://{bucket}.s3.{region}.amazonaws.com"),
            (None, false) => format!("https://s3.{region}.amazonaws.com/{bucket}"),
        };
        let options = ClientOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            // A copy of one part (1 GiB) takes seconds, or a minute at 20 MB/s.
            .with_timeout(Duration::from_secs(300))
            .with_allow_http(allow_http);
        let http = ReqwestConnector::default()
            .connect(&options)
            .map_err(|e| Error::Invalid(format!("s3://{bucket}: {e}")))?;
        Ok(Copier {
            http,
            region,
            bucket_url: bucket_url.trim_end_matches('/').to_string(),
            sign: !yes(AmazonS3ConfigKey::SkipSignature),
            request_payer: yes(AmazonS3ConfigKey::RequestPayer),
            single_max: test_parts().map_or(MAX_COPY_OBJECT, |(max, _)| max),
            part_log2: test_parts().map_or(PART_LOG2, |(_, log2)| log2),
        })
    }
}

/// In builds with failpoints (the tests'), `CKPTFS_TEST_COPY_PARTS=<largest single copy>,
/// <part size log2>` copies objects above a few MiB in parts of a few MiB, so that tests
/// copy in parts without gigabytes.
fn test_parts() -> Option<(u64, u8)> {
    if !cfg!(feature = "failpoints") {
        return None;
    }
    let value = std::env::var("CKPTFS_TEST_COPY_PARTS").ok()?;
    let (max, log2) = value.split_once(',')?;
    Some((max.parse().ok()?, log2.parse().ok()?))
}
