//! The S3 front door (`--s3-listen ADDR`): every retained checkpoint readable by any S3
//! client (the AWS CLI, boto3, rclone, Flink's S3 filesystems), read-only, with no FUSE
//! and nothing copied first. The S3 protocol (SigV4, the XML, the errors) is `s3s`'s;
//! here are the bucket's layout ([`bucket`]), the calls ([`service`]) and the verified
//! bodies ([`body`]).
//!
//! It runs as the metrics endpoint does: hyper's HTTP/1 server on a tokio runtime in a
//! thread of its own, bound before the engine opens, at most [`MAX_CONNECTIONS`]
//! connections at once (the rest wait in the listen queue), a request's headers within
//! the idle timeout and an answer taken by the client within the write timeout
//! ([`crate::http::WriteDeadline`]). Every call that would write is refused
//! before its body is read.

pub mod body;
pub mod bucket;
pub mod service;

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::fs::seam::Checkpoints;
use crate::http::{serve_connections, Endpoint, Limits};
use ckptfs_core::error::{Error, Result};

/// Connections served at once; further ones wait in the listen queue until one ends.
pub const MAX_CONNECTIONS: usize = 64;

/// A request that would write (any method but GET and HEAD: refused) is read whole first
/// when its body is at most this long, so that the refusal reaches the client: closing a
/// connection with unread bytes in it resets it, and the client may lose the answer. A
/// longer one is answered at once and its connection closed (a client that asked for
/// `100-continue` has sent nothing yet).
pub const DRAIN_LIMIT: u64 = 256 << 10;

/// The bucket's name unless `--s3-bucket` says another.
pub const DEFAULT_BUCKET: &str = "ckptfs";

/// The environment variables holding the door's key, when no `--s3-credentials` file is
/// given.
pub const ENV_ACCESS_KEY: &str = "CKPTFS_S3_ACCESS_KEY_ID";
/// See [`ENV_ACCESS_KEY`].
pub const ENV_SECRET_KEY: &str = "CKPTFS_S3_SECRET_ACCESS_KEY";

/// The key requests are signed with.
#[derive(Clone)]
pub struct Credentials {
    /// The access key id.
    pub access_key: String,
    /// The secret.
    pub secret_key: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, secret hidden)", self.access_key)
    }
}

/// What `--s3-*` asks of the door.
#[derive(Debug, Clone)]
pub struct DoorConfig {
    /// Where it listens.
    pub listen: SocketAddr,
    /// The bucket's name.
    pub bucket: String,
    /// The key requests must be signed with (none: anonymous reads only).
    pub credentials: Option<Credentials>,
    /// Unsigned requests may read.
    pub anonymous: bool,
}

/// `--s3-listen`'s address: `IP:PORT`, or `PORT` alone for 127.0.0.1.
pub fn parse_listen(arg: &str) -> std::result::Result<SocketAddr, String> {
    if let Ok(port) = arg.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    arg.parse().map_err(|_| {
        format!("{arg:?} is not IP:PORT or PORT (e.g. 127.0.0.1:9000, [::1]:9000, 9000)")
    })
}

/// Refuse a non-loopback address unless `public` was given: the door serves every
/// retained checkpoint, over plain HTTP, to whoever holds the key (or to anyone, with
/// `--s3-anonymous`).
pub fn check_exposure(addr: SocketAddr, public: bool) -> Result<()> {
    let loopback = match addr.ip() {
        IpAddr::V4(ip) => ip.is_loopback(),
        IpAddr::V6(ip) => {
            ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    };
    if loopback || public {
        return Ok(());
    }
    Err(Error::Invalid(format!(
        "--s3-listen {addr} is not a loopback address: the S3 door serves every retained \
         checkpoint over plain HTTP to other hosts; add --s3-listen-public to mean it \
         (see docs/security.md), or listen on 127.0.0.1"
    )))
}

/// The key in `path`: lines `access_key_id = ...` and `secret_access_key = ...` (`aws_`
/// before each is accepted, as in an AWS credentials file of one profile; `#` comments and
/// `[profile]` lines are ignored). Refused if others may read the file.
pub fn read_credentials(path: &Path) -> Result<Credentials> {
    use std::os::unix::fs::MetadataExt;
    let bad = |why: String| Error::Invalid(format!("--s3-credentials {}: {why}", path.display()));
    let meta = std::fs::metadata(path)
        .map_err(|e| Error::io(format!("--s3-credentials {}", path.display()), e))?;
    if meta.mode() & 0o077 != 0 {
        return Err(bad(format!(
            "group or others may read it (mode {:o}): chmod 600 it",
            meta.mode() & 0o777
        )));
    }
    if meta.len() > 64 << 10 {
        return Err(bad("larger than 64 KiB: not a credentials file".into()));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(format!("--s3-credentials {}", path.display()), e))?;
    let (mut access, mut secret) = (None, None);
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with('[') {
            continue;
        }
        let (name, value) = line
            .split_once('=')
            .ok_or_else(|| bad(format!("{line:?} is not NAME = VALUE")))?;
        let slot = match name.trim().trim_start_matches("aws_") {
            "access_key_id" => &mut access,
            "secret_access_key" => &mut secret,
            other => return Err(bad(format!("unknown setting {other:?}"))),
        };
        if slot.replace(value.trim().to_string()).is_some() {
            return Err(bad(format!(
                "{} is given twice (one key per file)",
                name.trim()
            )));
        }
    }
    match (access, secret) {
        (Some(access_key), Some(secret_key))
            if !access_key.is_empty() && !secret_key.is_empty() =>
        {
            Ok(Credentials {
                access_key,
                secret_key,
            })
        }
        _ => Err(bad(
            "it needs both access_key_id and secret_access_key".into()
        )),
    }
}

/// The key in [`ENV_ACCESS_KEY`] and [`ENV_SECRET_KEY`], if set (both or neither).
pub fn env_credentials() -> Result<Option<Credentials>> {
    let get = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
    match (get(ENV_ACCESS_KEY), get(ENV_SECRET_KEY)) {
        (Some(access_key), Some(secret_key)) => Ok(Some(Credentials {
            access_key,
            secret_key,
        })),
        (None, None) => Ok(None),
        _ => Err(Error::Invalid(format!(
            "set both {ENV_ACCESS_KEY} and {ENV_SECRET_KEY}, or neither"
        ))),
    }
}

/// Bind the door's address (its error names the option and the address).
pub fn bind(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr).map_err(|e| Error::io(format!("--s3-listen {addr}"), e))
}

/// The door, serving until dropped.
pub struct S3Door(Endpoint);

impl S3Door {
    /// Serve `checkpoints` on `listener` (from [`bind`]) in a thread of its own.
    pub fn start(
        listener: TcpListener,
        config: &DoorConfig,
        checkpoints: Arc<dyn Checkpoints>,
    ) -> Result<S3Door> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("s3-door")
            // A body's reader holds one while its client reads; lookups take one briefly.
            .max_blocking_threads(2 * MAX_CONNECTIONS)
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| Error::io("start the S3 door", e))?;
        let door = service::Door {
            name: config.bucket.clone(),
            bucket: Arc::new(bucket::Bucket::new(checkpoints)),
            verified: Arc::default(),
            started: std::time::SystemTime::now(),
        };
        let mut builder = s3s::service::S3ServiceBuilder::new(door);
        // Always set, even with no key: without an auth provider s3s checks no access.
        builder.set_auth(service::DoorKey(config.credentials.clone()));
        builder.set_access(service::ReadOnly {
            anonymous: config.anonymous,
        });
        let s3 = builder.build();
        let limits = Limits::from_env();
        let endpoint = Endpoint::start(
            WHAT,
            "s3-door",
            listener,
            runtime,
            move |listener, stopped| {
                serve_connections(
                    WHAT,
                    listener,
                    limits,
                    MAX_CONNECTIONS,
                    stopped,
                    move || Drained(s3.clone()),
                )
            },
        )?;
        log::info!(
            "S3 door at http://{}, bucket {} ({})",
            endpoint.local_addr(),
            config.bucket,
            match (&config.credentials, config.anonymous) {
                (Some(_), true) => "signed and anonymous reads",
                (Some(_), false) => "signed reads",
                (None, _) => "anonymous reads",
            }
        );
        Ok(S3Door(endpoint))
    }

    /// The address it listens on (the port chosen, for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.0.local_addr()
    }
}

/// The door, in messages.
const WHAT: &str = "S3 door";

/// The S3 service, a refused request's small body read first ([`DRAIN_LIMIT`]).
#[derive(Clone)]
struct Drained(s3s::service::S3Service);

impl hyper::service::Service<http::Request<hyper::body::Incoming>> for Drained {
    type Response = s3s::HttpResponse;
    type Error = s3s::HttpError;
    type Future = std::pin::Pin<
        Box<
            dyn std::future::Future<Output = std::result::Result<Self::Response, Self::Error>>
                + Send,
        >,
    >;

    fn call(&self, req: http::Request<hyper::body::Incoming>) -> Self::Future {
        use http_body_util::BodyExt;
        let s3 = self.0.clone();
        Box::pin(async move {
            let reads = matches!(*req.method(), http::Method::GET | http::Method::HEAD);
            let small = req
                .headers()
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                .is_some_and(|n| n <= DRAIN_LIMIT);
            if reads || !small {
                return s3.call(req.map(s3s::Body::from)).await;
            }
            let (parts, body) = req.into_parts();
            let limited = http_body_util::Limited::new(body, DRAIN_LIMIT as usize).collect();
            let bytes = match tokio::time::timeout(Duration::from_secs(5), limited).await {
                Ok(Ok(collected)) => collected.to_bytes(),
                // Too slow or broken: answered all the same, with no body.
                _ => bytes::Bytes::new(),
            };
            s3.call(http::Request::from_parts(parts, s3s::Body::from(bytes)))
                .await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_default_to_loopback_and_others_must_be_meant() {
        assert_eq!(
            parse_listen("9000").unwrap(),
            "127.0.0.1:9000".parse().unwrap()
        );
        assert_eq!(parse_listen("[::1]:9").unwrap(), "[::1]:9".parse().unwrap());
        assert!(parse_listen("localhost:9000").is_err());
        for ok in [
            "127.0.0.1:1",
            "127.3.2.1:1",
            "[::1]:1",
            "[::ffff:127.0.0.1]:1",
        ] {
            check_exposure(ok.parse().unwrap(), false).unwrap();
        }
        for public in ["0.0.0.0:1", "10.0.0.1:1", "[::]:1"] {
            let e = check_exposure(public.parse().unwrap(), false).unwrap_err();
            assert!(e.to_string().contains("--s3-listen-public"), "{e}");
            check_exposure(public.parse().unwrap(), true).unwrap();
        }
    }

    #[test]
    fn a_credentials_file_holds_one_key_and_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        let write = |text: &str, mode: u32| {
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write(
            "[default]\naws_access_key_id = AK\n# c\naws_secret_access_key=SK \n",
            0o600,
        );
        let c = read_credentials(&path).unwrap();
        assert_eq!((c.access_key.as_str(), c.secret_key.as_str()), ("AK", "SK"));
        assert!(!format!("{c:?}").contains("SK"));
        write("access_key_id = AK\nsecret_access_key = SK\n", 0o644);
        assert!(read_credentials(&path)
            .unwrap_err()
            .to_string()
            .contains("chmod 600"));
        for bad in [
            "access_key_id = AK\n",
            "access_key_id = AK\nsecret_access_key = SK\n[b]\naccess_key_id = X\n",
            "token = x\n",
            "just words\n",
        ] {
            write(bad, 0o600);
            assert!(read_credentials(&path).is_err(), "{bad}");
        }
    }
}
