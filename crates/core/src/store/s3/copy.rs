//! Server-side copies between buckets of one endpoint: S3's `CopyObject`, with the SHA-256
//! the object store computes over the copy (`x-amz-checksum-algorithm: SHA256`); above
//! 1 GiB, a multipart upload of `UploadPartCopy` parts (`copy_parts.rs`).
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
use bytes::Bytes;
use futures::StreamExt;
use object_store::aws::AwsAuthorizer;
use object_store::client::{HttpRequest, HttpRequestBody};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use super::remote::{remote_error, Remote};
use crate::error::{Error, Result};
use crate::store::ObjectId;

/// The largest object the object store copies at all (S3's largest object, 5 TiB): the
/// largest file an import or an export copies without reading it.
pub const MAX_COPY: u64 = 5 << 40;

/// How keys are encoded in a URL path and in `x-amz-copy-source`: everything but RFC 3986's
/// unreserved characters and `/` (object_store's `STRICT_PATH_ENCODE_SET`, which is also
/// what SigV4 signs for S3).
const KEY_ENCODE_SET: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// How a query value (an upload id) is encoded: everything but the unreserved characters.
pub(super) const QUERY_ENCODE_SET: &AsciiSet = &KEY_ENCODE_SET.add(b'/');

/// The largest answer read into memory (a CopyObjectResult or an error is a few hundred
/// bytes).
const MAX_ANSWER: usize = 64 << 10;

/// How many times a request is sent at most: again after a transport failure or a 5xx (a
/// copy is idempotent: it writes the same bytes again).
const COPY_ATTEMPTS: u32 = 5;

/// The first pause before sending a request again; doubled each time.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);

/// What the object store answered for a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    /// The id the copy's bytes have, from the checksum the object store computed as it
    /// copied them: the SHA-256 of the whole bytes (one CopyObject), or of their parts'
    /// SHA-256s (a copy in parts); `None` if it computed none (a server without
    /// `x-amz-checksum-algorithm`).
    pub id: Option<ObjectId>,
    /// The copy's ETag, as S3 spells it (with its quotes).
    pub etag: String,
}

impl Copied {
    /// The id of the copy of `what`, or an error saying the object store computed no
    /// checksum: a caller that names the copy by it needs it.
    pub fn id(&self, what: &str) -> Result<ObjectId> {
        self.id.ok_or_else(|| {
            Error::Invalid(format!(
                "the object store computed no SHA-256 of its copy of {what} (a server \
                 without x-amz-checksum-algorithm: SHA256): it cannot be named without \
                 reading it"
            ))
        })
    }
}

/// An answer from the object store: its status and (bounded) body.
pub(super) struct Answered {
    pub(super) status: http::StatusCode,
    pub(super) body: Vec<u8>,
}

/// Server-side copies from another bucket (or this one) of the same endpoint.
impl Remote {
    /// Copy object `from_key` of `source`'s bucket (`size` bytes) to `to_key` of this
    /// bucket (whole keys, as [`Remote::full_key`] gives them) inside the object store:
    /// one CopyObject request up to 1 GiB, a multipart upload of UploadPartCopy parts of
    /// 1 GiB above (up to [`MAX_COPY`]), signed with this remote's credentials, which must read
    /// the source and write here. No byte of the object passes through this host. The
    /// object store computes the copy's checksum, returned in [`Copied`].
    ///
    /// With `if_match` (an ETag, as listed), S3 copies only if the source still has it.
    /// Transport failures and 5xx answers are sent again (up to 5 times, with backoff).
    ///
    /// Errors ([`Error::ObjectStore`], whose kind says which): the source (or a bucket)
    /// missing is [`crate::error::ErrorKind::NotFound`]; a source whose ETag is no longer
    /// `if_match` is [`crate::error::ErrorKind::Conflict`] ("the source changed"); access
    /// denied and anything else [`crate::error::ErrorKind::Io`]. An answer without a
    /// checksum is not an error ([`Copied::id`] is), and the copy has then landed at
    /// `to_key`: the caller removes what it does not keep.
    pub fn copy_from(
        &self,
        source: &Remote,
        from_key: &str,
        to_key: &str,
        size: u64,
        if_match: Option<&str>,
    ) -> Result<Copied> {
        let what = format!(
            "copy s3://{}/{from_key} to s3://{}/{to_key}",
            source.bucket, self.bucket
        );
        let fail = |e: object_store::Error| remote_error(&what, e);
        let copy = CopySource::new(&source.bucket, from_key, if_match);
        if size > MAX_COPY {
            return Err(Error::Invalid(format!(
                "{what}: {size} bytes is more than the object store copies ({MAX_COPY})"
            )));
        }
        if size > self.copier.single_max {
            return self
                .block_on(self.copy_parts(&copy, to_key, size))
                .map_err(fail);
        }
        let url = self.key_url(to_key);
        let answered = self
            .block_on(self.send(
                || {
                    copy.headers(http::Request::builder().method(http::Method::PUT).uri(&url))
                        .header("x-amz-checksum-algorithm", "SHA256")
                },
                Bytes::new(),
            ))
            .map_err(fail)?;
        let answer = Answer::parse(&answered.body).map_err(fail)?;
        let etag = accepted(answered.status, &answer, &copy).map_err(fail)?;
        let id = answer
            .checksum_sha256
            .as_deref()
            .and_then(decode_sha256)
            .map(ObjectId::from_sha256);
        Ok(Copied { id, etag })
    }

    /// The URL of `key` (a whole key) in this bucket.
    pub(super) fn key_url(&self, key: &str) -> String {
        format!(
            "{}/{}",
            self.copier.bucket_url,
            utf8_percent_encode(key, KEY_ENCODE_SET)
        )
    }

    /// Send the request `request` builds (with `body`), signed, again after a transport
    /// failure, a 5xx or an S3 error that says to (a copy can fail after a 200, with an
    /// `<Error>` body): the last answer.
    pub(super) async fn send(
        &self,
        request: impl Fn() -> http::request::Builder,
        body: Bytes,
    ) -> object_store::Result<Answered> {
        let mut pause = FIRST_BACKOFF;
        let mut attempt = 1;
        loop {
            let built = request();
            let what = built
                .uri_ref()
                .map(|uri| {
                    format!(
                        "{} {}",
                        built.method_ref().cloned().unwrap_or_default(),
                        uri
                    )
                })
                .unwrap_or_default();
            let signed = self.signed(built, body.clone()).await.map_err(generic)?;
            let last = attempt == COPY_ATTEMPTS;
            match self.copier.http.execute(signed).await {
                Ok(response) => {
                    let status = response.status();
                    let body = read_bounded(response.into_body()).await?;
                    let again = status.is_server_error()
                        || Answer::parse(&body)
                            .ok()
                            .and_then(|a| a.code)
                            .is_some_and(|code| RETRIED_CODES.contains(&code.as_str()));
                    if !again || last {
                        return Ok(Answered { status, body });
                    }
                    log::warn!("{what} answered {status}; sending it again");
                }
                Err(e) if last => return Err(generic(e)),
                Err(e) => log::warn!("{what} failed ({e}); sending it again"),
            }
            tokio::time::sleep(pause).await;
            pause *= 2;
            attempt += 1;
        }
    }

    /// The request `builder` makes with `body`, signed now (each attempt signs again: the
    /// signature holds the time, and credentials expire).
    async fn signed(
        &self,
        builder: http::request::Builder,
        body: Bytes,
    ) -> std::result::Result<HttpRequest, Box<dyn std::error::Error + Send + Sync>> {
        let mut request = builder
            .header(http::header::CONTENT_LENGTH, body.len().to_string())
            .body(HttpRequestBody::from(body))?;
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

/// The object a copy reads: `x-amz-copy-source` and its condition.
pub(super) struct CopySource<'a> {
    /// `bucket/key`, encoded.
    header: String,
    /// The source's URL, for messages.
    pub(super) url: String,
    pub(super) if_match: Option<&'a str>,
}

impl<'a> CopySource<'a> {
    fn new(bucket: &str, key: &str, if_match: Option<&'a str>) -> Self {
        CopySource {
            header: format!("{bucket}/{}", utf8_percent_encode(key, KEY_ENCODE_SET)),
            url: format!("s3://{bucket}/{key}"),
            if_match,
        }
    }

    /// `builder` with the headers that name the source, and its condition.
    pub(super) fn headers(&self, builder: http::request::Builder) -> http::request::Builder {
        let builder = builder.header("x-amz-copy-source", &self.header);
        match self.if_match {
            Some(etag) => builder.header("x-amz-copy-source-if-match", etag),
            None => builder,
        }
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
pub(super) fn generic(
    e: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> object_store::Error {
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

/// The fields of a `CopyObjectResult`, `CopyPartResult`, `InitiateMultipartUploadResult`,
/// `CompleteMultipartUploadResult` or `<Error>`, whichever the answer is.
#[derive(Debug, Default, serde::Deserialize)]
pub(super) struct Answer {
    #[serde(rename = "Code")]
    code: Option<String>,
    #[serde(rename = "Message")]
    message: Option<String>,
    #[serde(rename = "ETag")]
    pub(super) etag: Option<String>,
    #[serde(rename = "ChecksumSHA256")]
    pub(super) checksum_sha256: Option<String>,
    #[serde(rename = "ChecksumType")]
    pub(super) checksum_type: Option<String>,
    #[serde(rename = "UploadId")]
    pub(super) upload_id: Option<String>,
}

impl Answer {
    /// The answer in `body` (empty: no fields).
    pub(super) fn parse(body: &[u8]) -> object_store::Result<Answer> {
        let text =
            std::str::from_utf8(body).map_err(|_| generic("the answer to a copy is not UTF-8"))?;
        if text.trim().is_empty() {
            return Ok(Answer::default());
        }
        quick_xml::de::from_str(text)
            .map_err(|e| generic(format!("the answer to a copy is not S3's XML: {e}")))
    }
}

/// The ETag of the copy `answer` (with `status`) reports, or its error, as object_store
/// reports the same errors (so that [`Error::kind`] sorts them the same way).
pub(super) fn accepted(
    status: http::StatusCode,
    answer: &Answer,
    copy: &CopySource<'_>,
) -> object_store::Result<String> {
    if status.is_success() && answer.code.is_none() {
        return answer
            .etag
            .clone()
            .ok_or_else(|| generic("S3 answered the copy without an ETag"));
    }
    let code = answer
        .code
        .clone()
        .unwrap_or_else(|| status.as_str().to_string());
    let said = format!(
        "{status}, {code}: {}",
        answer.message.as_deref().unwrap_or("no message")
    );
    let path = copy.url.clone();
    Err(match code.as_str() {
        "PreconditionFailed" => object_store::Error::Precondition {
            path,
            source: format!(
                "the source changed: its ETag is no longer {} ({said})",
                copy.if_match.unwrap_or("the one listed")
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
pub(super) fn decode_sha256(b64: &str) -> Option<[u8; 32]> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .ok()?;
    bytes.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer_to(status: http::StatusCode, body: &[u8], if_match: Option<&str>) -> Result<String> {
        let copy = CopySource::new("a", "k", if_match);
        accepted(status, &Answer::parse(body).unwrap(), &copy).map_err(|source| {
            Error::ObjectStore {
                what: "copy".into(),
                source,
            }
        })
    }

    #[test]
    fn answers_are_read_as_copies_or_errors() {
        let ok = br#"<?xml version="1.0" encoding="UTF-8"?>
<CopyObjectResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><LastModified>2026-12-05T00:00:00.000Z</LastModified><ETag>"abc"</ETag><ChecksumSHA256>47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=</ChecksumSHA256></CopyObjectResult>"#;
        assert_eq!(
            answer_to(http::StatusCode::OK, ok, None).unwrap(),
            "\"abc\""
        );
        // SHA-256 of nothing.
        let sum = Answer::parse(ok).unwrap().checksum_sha256.unwrap();
        assert_eq!(decode_sha256(&sum).unwrap()[..4], [0xe3, 0xb0, 0xc4, 0x42]);

        let copy = Copied {
            id: None,
            etag: "\"abc\"".into(),
        };
        let e = copy.id("s3://a/k").unwrap_err();
        assert!(e.to_string().contains("computed no SHA-256"), "{e}");

        // S3 may answer 200 with an error.
        let error = br#"<Error><Code>InternalError</Code><Message>sorry</Message></Error>"#;
        let e = answer_to(http::StatusCode::OK, error, None).unwrap_err();
        assert!(e.to_string().contains("InternalError: sorry"), "{e}");
        assert_eq!(e.kind(), crate::error::ErrorKind::Io, "{e}");

        // A source whose ETag is no longer the one listed: a Conflict, saying so.
        let changed = br#"<Error><Code>PreconditionFailed</Code><Message>At least one of the pre-conditions you specified did not hold</Message></Error>"#;
        let e = answer_to(
            http::StatusCode::PRECONDITION_FAILED,
            changed,
            Some("\"abc\""),
        )
        .unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::Conflict, "{e}");
        assert!(e
            .to_string()
            .contains("the source changed: its ETag is no longer \"abc\""));
        let e = answer_to(http::StatusCode::FORBIDDEN, b"", None).unwrap_err();
        assert!(e.to_string().contains("access denied"), "{e}");
        let e = answer_to(http::StatusCode::NOT_FOUND, b"", None).unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::NotFound, "{e}");

        // A multipart checksum is no SHA-256 of the object.
        assert_eq!(
            decode_sha256("47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=-2"),
            None
        );
        assert!(Answer::parse(b"<unclosed").is_err() || Answer::parse(b"\xff").is_err());
    }
}
