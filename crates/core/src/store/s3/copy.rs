//! Server-side copies between buckets of one endpoint: S3's `CopyObject`, with the SHA-256
//! the object store computes over the copy (`x-amz-checksum-algorithm: SHA256`).
//!
//! `object_store` copies only within one bucket and returns no checksum, so this sends the
//! request itself, through the pieces `object_store` makes public: the client's credential
//! provider (`AmazonS3::credentials`: environment, web identity, instance metadata), its
//! SigV4 signer ([`AwsAuthorizer`]) and its HTTP client. The URL is built as
//! `AmazonS3Builder::build` builds it (path style with an endpoint, virtual-hosted for AWS
//! unless configured otherwise), and keys are encoded as it encodes them.
//!
//! Not covered: S3 Express One Zone buckets (session credentials) and SSE-C objects (the
//! copy-source key headers); their copies fail with S3's error.

use std::time::Duration;

use base64::Engine as _;
use futures::StreamExt;
use object_store::aws::AwsAuthorizer;
use object_store::client::{HttpRequest, HttpRequestBody};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use super::remote::{remote_error, Remote};
use crate::error::{Error, Result};

/// The largest object one CopyObject request copies (5 GiB); larger ones need a multipart
/// upload of UploadPartCopy parts.
pub const MAX_COPY_OBJECT: u64 = 5 << 30;

/// How keys are encoded in a URL path and in `x-amz-copy-source`: everything but RFC 3986's
/// unreserved characters and `/` (object_store's `STRICT_PATH_ENCODE_SET`, which is also
/// what SigV4 signs for S3).
const KEY_ENCODE_SET: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// The largest answer read into memory (a CopyObjectResult or an error is a few hundred
/// bytes).
const MAX_ANSWER: usize = 64 << 10;

/// How many times a copy is sent at most: again after a transport failure or a 5xx (a copy
/// is idempotent: it writes the same bytes again).
const COPY_ATTEMPTS: u32 = 5;

/// The first pause before sending a copy again; doubled each time.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);

/// What the object store answered for a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    /// The SHA-256 of the copy's whole bytes, as the object store computed it; `None` if it
    /// computed none (a server without `x-amz-checksum-algorithm`) or another kind (a
    /// multipart object's checksum of its parts' checksums).
    pub sha256: Option<[u8; 32]>,
    /// The copy's ETag, as S3 spells it (with its quotes).
    pub etag: String,
}

impl Copied {
    /// The SHA-256 of the copy of `what`, or an error saying the object store computed
    /// none: a caller that names the copy by it needs it.
    pub fn whole_sha256(&self, what: &str) -> Result<[u8; 32]> {
        self.sha256.ok_or_else(|| {
            Error::Invalid(format!(
                "the object store computed no SHA-256 of its copy of {what} (a server \
                 without x-amz-checksum-algorithm: SHA256): it cannot be named without \
                 reading it"
            ))
        })
    }
}

/// Server-side copies from another bucket (or this one) of the same endpoint.
impl Remote {
    /// Copy object `from_key` of `source`'s bucket to `to_key` of this bucket (whole keys,
    /// as [`Remote::full_key`] gives them) inside the object store: one CopyObject request
    /// (up to [`MAX_COPY_OBJECT`] bytes), signed with this remote's credentials,
    /// which must read the source and write here. No byte of the object passes through
    /// this host. The object store computes the copy's SHA-256, returned in [`Copied`].
    ///
    /// With `if_match` (an ETag, as listed), S3 copies only if the source still has it.
    /// Transport failures and 5xx answers are sent again (up to 5 times, with backoff).
    ///
    /// Errors ([`Error::ObjectStore`], whose kind says which): the source (or a bucket)
    /// missing is [`crate::error::ErrorKind::NotFound`]; a source whose ETag is no longer
    /// `if_match` is [`crate::error::ErrorKind::Conflict`] ("the source changed"); access
    /// denied and anything else [`crate::error::ErrorKind::Io`]. An answer without a
    /// SHA-256 is an error, and the copy may then have landed at `to_key`: the caller
    /// removes what it does not keep.
    pub fn copy_from(
        &self,
        source: &Remote,
        from_key: &str,
        to_key: &str,
        if_match: Option<&str>,
    ) -> Result<Copied> {
        let what = format!(
            "copy s3://{}/{from_key} to s3://{}/{to_key}",
            source.bucket, self.bucket
        );
        let fail = |e: object_store::Error| remote_error(&what, e);
        let (status, body) = self
            .block_on(self.send_copy(&source.bucket, from_key, to_key, if_match))
            .map_err(fail)?;
        let answer = Answer::parse(&body).map_err(fail)?;
        let source_url = format!("s3://{}/{from_key}", source.bucket);
        copied(status, answer, &source_url, if_match).map_err(fail)
    }

    /// Send the CopyObject request, again after a transport failure, a 5xx or an S3 error
    /// that says to (a copy can fail after a 200, with an `<Error>` body): the status and
    /// the body of the last answer.
    async fn send_copy(
        &self,
        source_bucket: &str,
        from_key: &str,
        to_key: &str,
        if_match: Option<&str>,
    ) -> object_store::Result<(http::StatusCode, Vec<u8>)> {
        let copier = &self.copier;
        let url = format!(
            "{}/{}",
            copier.bucket_url,
            utf8_percent_encode(to_key, KEY_ENCODE_SET)
        );
        let copy_source = format!(
            "{source_bucket}/{}",
            utf8_percent_encode(from_key, KEY_ENCODE_SET)
        );
        let mut pause = FIRST_BACKOFF;
        let mut attempt = 1;
        loop {
            let request = self
                .signed_copy(&url, &copy_source, if_match)
                .await
                .map_err(generic)?;
            let last = attempt == COPY_ATTEMPTS;
            match copier.http.execute(request).await {
                Ok(response) => {
                    let status = response.status();
                    let body = read_bounded(response.into_body()).await?;
                    let again = status.is_server_error()
                        || Answer::parse(&body)
                            .ok()
                            .and_then(|a| a.code)
                            .is_some_and(|code| RETRIED_CODES.contains(&code.as_str()));
                    if !again || last {
                        return Ok((status, body));
                    }
                    log::warn!("a copy to {to_key} answered {status}; sending it again");
                }
                Err(e) if last => return Err(generic(e)),
                Err(e) => log::warn!("a copy to {to_key} failed ({e}); sending it again"),
            }
            tokio::time::sleep(pause).await;
            pause *= 2;
            attempt += 1;
        }
    }

    /// The CopyObject request to `url`, signed now (each attempt signs again: the
    /// signature holds the time, and credentials expire).
    async fn signed_copy(
        &self,
        url: &str,
        copy_source: &str,
        if_match: Option<&str>,
    ) -> std::result::Result<HttpRequest, Box<dyn std::error::Error + Send + Sync>> {
        let mut builder = http::Request::builder()
            .method(http::Method::PUT)
            .uri(url)
            .header("x-amz-copy-source", copy_source)
            .header("x-amz-checksum-algorithm", "SHA256")
            .header(http::header::CONTENT_LENGTH, "0");
        if let Some(etag) = if_match {
            builder = builder.header("x-amz-copy-source-if-match", etag);
        }
        let mut request = builder.body(HttpRequestBody::empty())?;
        let copier = &self.copier;
        if copier.sign {
            let credential = self.client.credentials().get_credential().await?;
            AwsAuthorizer::new(&credential, "s3", &copier.region)
                .with_request_payer(copier.request_payer)
                .try_authorize(&mut request, None)?;
        }
        Ok(request)
    }
}

/// S3 error codes that ask for the request to be sent again, whatever the status.
const RETRIED_CODES: [&str; 4] = [
    "InternalError",
    "ServiceUnavailable",
    "SlowDown",
    "RequestTimeout",
];

/// A failure of the request itself (transport, signing), as object_store reports one.
fn generic(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> object_store::Error {
    object_store::Error::Generic {
        store: "S3",
        source: e.into(),
    }
}

/// The body of an answer, refused above [`MAX_ANSWER`] bytes.
async fn read_bounded(
    body: object_store::client::HttpResponseBody,
) -> object_store::Result<Vec<u8>> {
    let mut stream = body.bytes_stream();
    let mut out = Vec::new();
    while let Some(piece) = stream.next().await {
        let piece = piece.map_err(generic)?;
        if out.len() + piece.len() > MAX_ANSWER {
            return Err(generic(format!(
                "the answer to a copy is larger than {MAX_ANSWER} bytes"
            )));
        }
        out.extend_from_slice(&piece);
    }
    Ok(out)
}

/// The fields of a `CopyObjectResult` or an `<Error>`, whichever the answer is.
#[derive(Debug, Default, serde::Deserialize)]
struct Answer {
    #[serde(rename = "Code")]
    code: Option<String>,
    #[serde(rename = "Message")]
    message: Option<String>,
    #[serde(rename = "ETag")]
    etag: Option<String>,
    #[serde(rename = "ChecksumSHA256")]
    checksum_sha256: Option<String>,
}

impl Answer {
    /// The answer in `body` (empty: no fields).
    fn parse(body: &[u8]) -> object_store::Result<Answer> {
        let text =
            std::str::from_utf8(body).map_err(|_| generic("the answer to a copy is not UTF-8"))?;
        if text.trim().is_empty() {
            return Ok(Answer::default());
        }
        quick_xml::de::from_str(text)
            .map_err(|e| generic(format!("the answer to a copy is not S3's XML: {e}")))
    }
}

/// The copy `answer` (with `status`) reports, or its error, as object_store reports the
/// same errors (so that [`Error::kind`] sorts them the same way).
fn copied(
    status: http::StatusCode,
    answer: Answer,
    source_url: &str,
    if_match: Option<&str>,
) -> object_store::Result<Copied> {
    if status.is_success() && answer.code.is_none() {
        let etag = answer
            .etag
            .ok_or_else(|| generic("S3 answered the copy without an ETag"))?;
        let sha256 = answer.checksum_sha256.as_deref().and_then(decode_sha256);
        return Ok(Copied { sha256, etag });
    }
    let code = answer.code.unwrap_or_else(|| status.as_str().to_string());
    let said = format!(
        "{status}, {code}: {}",
        answer.message.as_deref().unwrap_or("no message")
    );
    let path = source_url.to_string();
    Err(match code.as_str() {
        "PreconditionFailed" => object_store::Error::Precondition {
            path,
            source: format!(
                "the source changed: its ETag is no longer {} ({said})",
                if_match.unwrap_or("the one listed")
            )
            .into(),
        },
        "NoSuchKey" | "NoSuchBucket" | "404" => object_store::Error::NotFound {
            path,
            source: said.into(),
        },
        "AccessDenied" | "403" => object_store::Error::PermissionDenied {
            path,
            source: format!(
                "access denied: the credentials must read the source and write the \
                 destination ({said})"
            )
            .into(),
        },
        _ if status == http::StatusCode::PRECONDITION_FAILED => object_store::Error::Precondition {
            path,
            source: format!("the source changed ({said})").into(),
        },
        _ => generic(format!("S3 refused the copy: {said}")),
    })
}

/// The 32 bytes of a base64 SHA-256, as S3 spells `ChecksumSHA256`; `None` for anything
/// else (a multipart object's `<base64>-N` is no SHA-256 of the whole object).
fn decode_sha256(b64: &str) -> Option<[u8; 32]> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .ok()?;
    bytes.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_as_copies_or_errors() {
        let ok = br#"<?xml version="1.0" encoding="UTF-8"?>
<CopyObjectResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><LastModified>2026-12-05T00:00:00.000Z</LastModified><ETag>"abc"</ETag><ChecksumSHA256>47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=</ChecksumSHA256></CopyObjectResult>"#;
        let copy = copied(
            http::StatusCode::OK,
            Answer::parse(ok).unwrap(),
            "s3://a/k",
            None,
        )
        .unwrap();
        assert_eq!(copy.etag, "\"abc\"");
        // SHA-256 of nothing.
        assert_eq!(copy.sha256.unwrap()[..4], [0xe3, 0xb0, 0xc4, 0x42]);

        let no_sum = br#"<CopyObjectResult><ETag>"abc"</ETag></CopyObjectResult>"#;
        let copy = copied(
            http::StatusCode::OK,
            Answer::parse(no_sum).unwrap(),
            "s3://a/k",
            None,
        )
        .unwrap();
        assert_eq!(copy.sha256, None);
        let e = copy.whole_sha256("s3://a/k").unwrap_err();
        assert!(e.to_string().contains("computed no SHA-256"), "{e}");

        // S3 may answer 200 with an error.
        let error = br#"<Error><Code>InternalError</Code><Message>sorry</Message></Error>"#;
        let e = copied(
            http::StatusCode::OK,
            Answer::parse(error).unwrap(),
            "s3://a/k",
            None,
        )
        .unwrap_err();
        assert!(matches!(e, object_store::Error::Generic { .. }), "{e}");
        assert!(e.to_string().contains("InternalError: sorry"), "{e}");

        // A source whose ETag is no longer the one listed: a Conflict, saying so.
        let changed = br#"<Error><Code>PreconditionFailed</Code><Message>At least one of the pre-conditions you specified did not hold</Message></Error>"#;
        let e = copied(
            http::StatusCode::PRECONDITION_FAILED,
            Answer::parse(changed).unwrap(),
            "s3://a/k",
            Some("\"abc\""),
        )
        .unwrap_err();
        let e = Error::ObjectStore {
            what: "copy".into(),
            source: e,
        };
        assert_eq!(e.kind(), crate::error::ErrorKind::Conflict, "{e}");
        assert!(e
            .to_string()
            .contains("the source changed: its ETag is no longer \"abc\""));
        let e = copied(
            http::StatusCode::FORBIDDEN,
            Answer::default(),
            "s3://a/k",
            None,
        )
        .unwrap_err();
        assert!(e.to_string().contains("access denied"), "{e}");

        let multipart = br#"<CopyObjectResult><ETag>"x-2"</ETag><ChecksumSHA256>AAAA-2</ChecksumSHA256></CopyObjectResult>"#;
        let copy = copied(
            http::StatusCode::OK,
            Answer::parse(multipart).unwrap(),
            "s3://a/k",
            None,
        )
        .unwrap();
        assert_eq!(
            copy.sha256, None,
            "a multipart checksum is no SHA-256 of the object"
        );
        assert!(Answer::parse(b"<unclosed").is_err() || Answer::parse(b"\xff").is_err());
    }
}
