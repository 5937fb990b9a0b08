//! Copies of objects larger than one part (1 GiB), made by the object store in parts: a
//! multipart upload created with `x-amz-checksum-algorithm: SHA256`, one `UploadPartCopy`
//! per part of `1 << part_log2` bytes (the last one shorter), four at a time, then
//! `CompleteMultipartUpload`. No byte passes through this host. (One `CopyObject` copies up
//! to 5 GiB, but a request that copies gigabytes outlasts the client's timeout.)
//!
//! The object store computes the SHA-256 of each part as it copies it, and of the whole a
//! "composite" checksum: the SHA-256 of the parts' SHA-256s. That is a function of the bytes
//! and the part size alone, so the copy is named by it
//! ([`Digest::Sha256Parts`](crate::store::Digest::Sha256Parts)), and every reader checks
//! it by hashing the same parts. The part size is fixed (not chosen by the object's size), so
//! the same bytes always get the same id.

use base64::Engine as _;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use percent_encoding::utf8_percent_encode;

use super::copy::{accepted, decode_sha256, generic, Answer, Copied, CopySource, QUERY_ENCODE_SET};
use super::remote::Remote;
use crate::store::ObjectId;

/// Parts copied at once.
const PARTS_AT_ONCE: usize = 4;

/// One part copied: its ETag and, if the object store gave it, its SHA-256.
struct Part {
    etag: String,
    sha256: Option<[u8; 32]>,
}

impl Remote {
    /// Copy `copy` (`size` bytes) to `to_key` of this bucket in parts, named by the
    /// composite SHA-256 the object store computed. On failure the upload is aborted (one
    /// left behind by a crash is aborted by the staging sweep, `staging.rs`).
    pub(super) async fn copy_parts(
        &self,
        copy: &CopySource<'_>,
        to_key: &str,
        size: u64,
    ) -> object_store::Result<Copied> {
        let url = self.key_url(to_key);
        let created = self
            .send(
                || {
                    http::Request::builder()
                        .method(http::Method::POST)
                        .uri(format!("{url}?uploads"))
                        .header("x-amz-checksum-algorithm", "SHA256")
                },
                Bytes::new(),
            )
            .await?;
        let answer = Answer::parse(&created.body)?;
        if !created.status.is_success() || answer.upload_id.is_none() {
            accepted(created.status, &answer, copy)?;
            return Err(generic("S3 created a multipart upload without an UploadId"));
        }
        let upload_id = answer.upload_id.unwrap_or_default();
        let upload = format!(
            "{url}?uploadId={}",
            utf8_percent_encode(&upload_id, QUERY_ENCODE_SET)
        );
        let copied = self.copy_into_upload(copy, &url, &upload, size).await;
        if copied.is_err() {
            let aborted = self
                .send(
                    || {
                        http::Request::builder()
                            .method(http::Method::DELETE)
                            .uri(&upload)
                    },
                    Bytes::new(),
                )
                .await;
            if !aborted.is_ok_and(|a| a.status.is_success()) {
                log::warn!("the multipart copy to {to_key} was not aborted: its parts stay");
            }
        }
        copied
    }

    /// Copy the parts of `copy` into the upload at `upload` (the URL with its id), complete
    /// it, and read the checksum of the whole.
    async fn copy_into_upload(
        &self,
        copy: &CopySource<'_>,
        url: &str,
        upload: &str,
        size: u64,
    ) -> object_store::Result<Copied> {
        let part_log2 = self.copier.part_log2;
        let part_size = 1u64 << part_log2;
        let count = size.div_ceil(part_size).max(1);
        let parts: Vec<Part> = futures::stream::iter(1..=count)
            .map(|n| {
                let first = (n - 1) * part_size;
                let last = (n * part_size).min(size).saturating_sub(1);
                self.copy_part(copy, upload, n, first, last)
            })
            .buffered(PARTS_AT_ONCE)
            .try_collect()
            .await?;
        let completed = self
            .send(
                || {
                    http::Request::builder()
                        .method(http::Method::POST)
                        .uri(upload)
                },
                Bytes::from(completion(&parts)),
            )
            .await?;
        let answer = Answer::parse(&completed.body)?;
        let etag = accepted(completed.status, &answer, copy)?;
        // The SHA-256 of the parts' SHA-256s: from the answer, else from a HEAD that asks
        // for it, else computed from the parts' own (each the object store's).
        let of_parts = parts
            .iter()
            .map(|p| p.sha256)
            .collect::<Option<Vec<_>>>()
            .map(|sums| <sha2::Sha256 as sha2::Digest>::digest(sums.concat()).into());
        let told = match answer.checksum_sha256.clone() {
            Some(sum) => Some((sum, answer.checksum_type.clone())),
            None => self.attributes_checksum(url, &etag).await?,
        };
        let told = told
            .map(|(sum, kind)| {
                composite(&sum, kind.as_deref(), count).ok_or_else(|| {
                    generic(format!(
                        "S3 gave the checksum {sum:?} for a copy in {count} parts: not a \
                         SHA-256 of {count} parts' SHA-256s"
                    ))
                })
            })
            .transpose()?;
        if let (Some(told), Some(of_parts)) = (told, of_parts) {
            if told != of_parts {
                return Err(generic(
                    "S3's checksum of a copy in parts is not the SHA-256 of its parts' \
                     SHA-256s",
                ));
            }
        }
        let id = told
            .or(of_parts)
            .and_then(|hash| ObjectId::from_sha256_parts(hash, part_log2));
        Ok(Copied { id, etag })
    }

    /// Copy bytes `first..=last` of `copy` as part `n` of `upload`.
    async fn copy_part(
        &self,
        copy: &CopySource<'_>,
        upload: &str,
        n: u64,
        first: u64,
        last: u64,
    ) -> object_store::Result<Part> {
        let (base, query) = upload.split_once('?').unwrap_or((upload, ""));
        let url = format!("{base}?partNumber={n}&{query}");
        let answered = self
            .send(
                || {
                    copy.headers(http::Request::builder().method(http::Method::PUT).uri(&url))
                        .header("x-amz-copy-source-range", format!("bytes={first}-{last}"))
                },
                Bytes::new(),
            )
            .await?;
        let answer = Answer::parse(&answered.body)?;
        let etag = accepted(answered.status, &answer, copy)?;
        let sha256 = answer.checksum_sha256.as_deref().and_then(decode_sha256);
        Ok(Part { etag, sha256 })
    }

    /// The checksum of the object at `url` that `GetObjectAttributes` answers, with its
    /// type, if the object there still has `etag`.
    async fn attributes_checksum(
        &self,
        url: &str,
        etag: &str,
    ) -> object_store::Result<Option<(String, Option<String>)>> {
        let answered = self
            .send(
                || {
                    http::Request::builder()
                        .method(http::Method::GET)
                        .uri(format!("{url}?attributes"))
                        .header("x-amz-object-attributes", "ETag,Checksum")
                },
                Bytes::new(),
            )
            .await?;
        let text = std::str::from_utf8(&answered.body).unwrap_or_default();
        let attributes: Attributes = match quick_xml::de::from_str(text) {
            Ok(attributes) if answered.status.is_success() => attributes,
            _ => {
                return Err(generic(format!(
                    "S3 answered {} to GetObjectAttributes of the copy just completed",
                    answered.status
                )))
            }
        };
        if attributes.etag.as_deref().map(unquoted) != Some(unquoted(etag)) {
            return Err(generic(
                "the copy just completed was replaced before its checksum was read",
            ));
        }
        Ok(attributes
            .checksum
            .and_then(|c| c.sha256.map(|sum| (sum, c.kind))))
    }
}

/// Bounds on the listing of multipart uploads in progress ([`Remote::stale_uploads`]).
const MAX_UPLOAD_PAGES: usize = 1000;

impl Remote {
    /// The multipart uploads in progress to keys under `prefix` (a whole key prefix)
    /// started more than `grace` ago (by the object store's clock; or of unknown age):
    /// each key and upload id. The listing is paged, at most 1,000 pages.
    pub(super) fn stale_uploads(
        &self,
        prefix: &str,
        grace: std::time::Duration,
    ) -> crate::error::Result<Vec<(String, String)>> {
        let what = format!("list the uploads under s3://{}/{prefix}", self.bucket);
        let fail = |e: object_store::Error| super::remote::remote_error(&what, e);
        let base = format!(
            "{}?uploads&prefix={}",
            self.copier.bucket_url,
            utf8_percent_encode(prefix, QUERY_ENCODE_SET)
        );
        let mut found = Vec::new();
        let mut marker: Option<(String, String)> = None;
        for _ in 0..MAX_UPLOAD_PAGES {
            let url = match &marker {
                None => base.clone(),
                Some((key, id)) => format!(
                    "{base}&key-marker={}&upload-id-marker={}",
                    utf8_percent_encode(key, QUERY_ENCODE_SET),
                    utf8_percent_encode(id, QUERY_ENCODE_SET)
                ),
            };
            let answered = self
                .block_on(self.send(
                    || http::Request::builder().method(http::Method::GET).uri(&url),
                    Bytes::new(),
                ))
                .map_err(fail)?;
            let text = std::str::from_utf8(&answered.body).unwrap_or_default();
            let page: Uploads = match quick_xml::de::from_str(text) {
                Ok(page) if answered.status.is_success() => page,
                _ => {
                    return Err(fail(generic(format!(
                        "S3 answered {} to ListMultipartUploads",
                        answered.status
                    ))))
                }
            };
            let now = std::time::SystemTime::now();
            for upload in &page.uploads {
                if upload.key.starts_with(prefix) && stale(upload.initiated.as_deref(), now, grace)
                {
                    found.push((upload.key.clone(), upload.upload_id.clone()));
                }
            }
            match (page.truncated, page.next_key, page.next_upload_id) {
                (Some(true), Some(key), Some(id)) => marker = Some((key, id)),
                _ => return Ok(found),
            }
        }
        Ok(found)
    }

    /// Abort the multipart upload `upload_id` to `key` (a whole key): its parts are
    /// deleted. One that is gone already is not an error.
    pub(super) fn abort_upload(&self, key: &str, upload_id: &str) -> crate::error::Result<()> {
        let url = format!(
            "{}?uploadId={}",
            self.key_url(key),
            utf8_percent_encode(upload_id, QUERY_ENCODE_SET)
        );
        let what = format!("abort the upload {upload_id} to s3://{}/{key}", self.bucket);
        let answered = self
            .block_on(self.send(
                || {
                    http::Request::builder()
                        .method(http::Method::DELETE)
                        .uri(&url)
                },
                Bytes::new(),
            ))
            .map_err(|e| super::remote::remote_error(&what, e))?;
        if answered.status.is_success() || answered.status == http::StatusCode::NOT_FOUND {
            Ok(())
        } else {
            Err(super::remote::remote_error(
                &what,
                generic(format!("S3 answered {}", answered.status)),
            ))
        }
    }
}

/// True for an upload begun at `initiated` (S3's `2026-12-05T03:00:00.000Z`) more than
/// `grace` before `now`, or whose start S3 did not say.
fn stale(initiated: Option<&str>, now: std::time::SystemTime, grace: std::time::Duration) -> bool {
    initiated
        .and_then(|t| humantime::parse_rfc3339_weak(t.trim().trim_end_matches('Z')).ok())
        .is_none_or(|t| now.duration_since(t).unwrap_or_default() >= grace)
}

/// A page of `ListMultipartUploads`.
#[derive(Debug, Default, serde::Deserialize)]
struct Uploads {
    #[serde(rename = "Upload", default)]
    uploads: Vec<Upload>,
    #[serde(rename = "IsTruncated")]
    truncated: Option<bool>,
    #[serde(rename = "NextKeyMarker")]
    next_key: Option<String>,
    #[serde(rename = "NextUploadIdMarker")]
    next_upload_id: Option<String>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct Upload {
    #[serde(rename = "Key")]
    key: String,
    #[serde(rename = "UploadId")]
    upload_id: String,
    #[serde(rename = "Initiated")]
    initiated: Option<String>,
}

/// What `GetObjectAttributes` answers (the fields asked for).
#[derive(Debug, Default, serde::Deserialize)]
struct Attributes {
    #[serde(rename = "ETag")]
    etag: Option<String>,
    #[serde(rename = "Checksum")]
    checksum: Option<AttributesChecksum>,
}

#[derive(Debug, Default, serde::Deserialize)]
struct AttributesChecksum {
    #[serde(rename = "ChecksumSHA256")]
    sha256: Option<String>,
    #[serde(rename = "ChecksumType")]
    kind: Option<String>,
}

/// An ETag without its quotes (`GetObjectAttributes` gives it bare).
fn unquoted(etag: &str) -> &str {
    etag.trim().trim_matches('"')
}

/// The body of a CompleteMultipartUpload of `parts` (numbered from 1, in order).
fn completion(parts: &[Part]) -> String {
    let mut xml =
        String::from("<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">");
    for (i, part) in parts.iter().enumerate() {
        xml.push_str(&format!(
            "<Part><PartNumber>{}</PartNumber><ETag>{}</ETag>",
            i + 1,
            escape(&part.etag)
        ));
        if let Some(sum) = part.sha256 {
            let b64 = base64::engine::general_purpose::STANDARD.encode(sum);
            xml.push_str(&format!("<ChecksumSHA256>{b64}</ChecksumSHA256>"));
        }
        xml.push_str("</Part>");
    }
    xml.push_str("</CompleteMultipartUpload>");
    xml
}

/// `text` as XML character data.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The 32 bytes of a composite checksum of `count` parts: `<base64 SHA-256>-<count>`, or
/// the base64 alone where its type (`kind`) says `COMPOSITE`.
fn composite(sum: &str, kind: Option<&str>, count: u64) -> Option<[u8; 32]> {
    match sum.trim().rsplit_once('-') {
        Some((b64, parts)) => (parts.parse::<u64>().ok()? == count)
            .then(|| decode_sha256(b64))
            .flatten(),
        None => (kind == Some("COMPOSITE"))
            .then(|| decode_sha256(sum))
            .flatten(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_composite_checksum_is_read_only_as_one_of_its_count_of_parts() {
        let sum = "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=";
        let three = composite(&format!("{sum}-3"), None, 3).unwrap();
        assert_eq!(three[..2], [0xe3, 0xb0]);
        assert_eq!(composite(sum, Some("COMPOSITE"), 3), Some(three));
        assert_eq!(composite(&format!("{sum}-2"), Some("COMPOSITE"), 3), None);
        // A checksum of the whole object, or of unknown kind, is no checksum of parts.
        assert_eq!(composite(sum, Some("FULL_OBJECT"), 3), None);
        assert_eq!(composite(sum, None, 3), None);
        assert_eq!(composite(&format!("{sum}-x"), None, 3), None);
        assert_eq!(composite("AAAA-3", None, 3), None);
    }

    #[test]
    fn an_upload_is_stale_once_begun_longer_ago_than_the_grace() {
        let now = humantime::parse_rfc3339("2026-12-05T03:00:00Z").unwrap();
        let hour = std::time::Duration::from_secs(3600);
        assert!(!stale(Some("2026-12-05T02:30:00.000Z"), now, hour));
        assert!(stale(Some("2026-12-05T01:59:59.000Z"), now, hour));
        // In the future (clocks apart): young.
        assert!(!stale(Some("2026-12-05T04:00:00.000Z"), now, hour));
        // Unknown: stale (a copy takes seconds; one begun before the grace is abandoned).
        assert!(stale(None, now, hour));
        assert!(stale(Some("yesterday"), now, hour));
    }

    #[test]
    fn the_completion_names_each_part_with_its_checksum() {
        let parts = [
            Part {
                etag: "\"a\"".into(),
                sha256: Some([0; 32]),
            },
            Part {
                etag: "\"<b>\"".into(),
                sha256: None,
            },
        ];
        let xml = completion(&parts);
        assert!(xml.contains("<Part><PartNumber>1</PartNumber><ETag>\"a\"</ETag><ChecksumSHA256>AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=</ChecksumSHA256></Part>"), "{xml}");
        assert!(
            xml.contains("<Part><PartNumber>2</PartNumber><ETag>\"&lt;b&gt;\"</ETag></Part>"),
            "{xml}"
        );
    }
}
