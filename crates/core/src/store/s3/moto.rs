//! A real S3-compatible server for the core's unit tests: `moto_server` (Python package
//! `moto[server]`, which `scripts/test` installs) on 127.0.0.1, one per test binary, started
//! as the integration tests start theirs (tests/integration/common/moto.rs). A test that
//! needs it fails when it is missing: it is never skipped.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::remote::Remote;

static PORT: OnceLock<u16> = OnceLock::new();
static BUCKETS: AtomicU64 = AtomicU64::new(0);

/// The server's port, started at first use, with the standard AWS environment (credentials,
/// region) set for the clients of this process.
pub(crate) fn port() -> u16 {
    *PORT.get_or_init(|| {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        super::moto_server::start(port);
        // Set once, before any client of this binary reads them (edition 2021).
        for (key, value) in [
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_REGION", "us-east-1"),
        ] {
            std::env::set_var(key, value);
        }
        port
    })
}

/// The endpoint of the server, `http://127.0.0.1:PORT`.
pub(crate) fn endpoint() -> String {
    format!("http://127.0.0.1:{}", port())
}

/// A new, empty bucket's name (created with a plain, unsigned request, which moto accepts).
pub(crate) fn bucket() -> String {
    let port = port();
    let n = BUCKETS.fetch_add(1, Ordering::SeqCst);
    let bucket = format!("ckptfs-unit-{}-{n}", std::process::id());
    super::moto_server::create_bucket(port, &bucket);
    bucket
}

/// A connection to `s3://<a new bucket>/store`.
pub(crate) fn remote() -> Arc<Remote> {
    Remote::connect_to(&bucket(), "store", Some(&endpoint())).unwrap()
}
