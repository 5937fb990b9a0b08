//! The daemon's metrics, end to end on a real mount: `.ckptfs/metrics` and
//! `--metrics-listen`'s `GET /metrics` are read with the reference OpenMetrics parser
//! (Python's prometheus_client, which `scripts/test` installs) and checked against what
//! `ckptfs ls` and `.ckptfs/status` say.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::moto::free_port;
use crate::common::mounted::*;

/// One sample of a scrape, as the parser read it.
#[derive(Debug, Clone, serde::Deserialize)]
pub(crate) struct Sample {
    /// The metric family (`ckptfs_checkpoints_completed` for the sample
    /// `ckptfs_checkpoints_completed_total`).
    family: String,
    #[serde(rename = "type")]
    kind: String,
    pub(crate) name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A scrape read by the parser: every sample by name and labels.
#[derive(Debug)]
pub(crate) struct Scrape {
    pub(crate) samples: Vec<Sample>,
}

/// Parses OpenMetrics text strictly (an unknown type, a counter sample without `_total`, a
/// histogram without its `+Inf` bucket or with decreasing buckets, a missing `# EOF`:
/// each is an error) and prints the samples as JSON.
const PARSER: &str = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
samples = []
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        samples.append({"family": family.name, "type": family.type, "name": s.name,
                        "labels": s.labels, "value": s.value})
print(json.dumps(samples))
"#;

pub(crate) fn parse(text: &str) -> Scrape {
    let mut child = Command::new("python3")
        .args(["-c", PARSER])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python3 (scripts/test installs what these tests need)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("No module named 'prometheus_client'"),
        "Python's prometheus_client is missing: `. scripts/env.sh && \
         ckptfs_install_prometheus_client` (scripts/test does it)"
    );
    assert!(
        out.status.success(),
        "the OpenMetrics parser refused the text: {stderr}\n{text}"
    );
    Scrape {
        samples: serde_json::from_slice(&out.stdout).unwrap(),
    }
}

impl Scrape {
    /// The value of the sample `name` with exactly these labels.
    pub(crate) fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let found: Vec<&Sample> = self
            .samples
            .iter()
            .filter(|s| s.name == name && s.labels == labels)
            .collect();
        assert_eq!(found.len(), 1, "{name} {labels:?} in {:#?}", self.samples);
        found[0].value
    }

    fn value(&self, name: &str) -> f64 {
        self.get(name, &[])
    }

    pub(crate) fn kind_of(&self, family: &str) -> &str {
        &self
            .samples
            .iter()
            .find(|s| s.family == family)
            .unwrap_or_else(|| panic!("no family {family}"))
            .kind
    }
}

/// `GET path` over HTTP/1.0 (the server closes the connection after its answer): the
/// status code, the content type and the body.
pub(crate) fn http_get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("a complete answer");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let content_type = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    (status, content_type, body.to_string())
}

fn read_file_scrape(m: &Mounted) -> Scrape {
    parse(&std::fs::read_to_string(m.mnt.join(".ckptfs/metrics")).unwrap())
}

/// The rows `ckptfs ls --json` lists.
fn listed(m: &Mounted) -> Vec<serde_json::Value> {
    serde_json::from_str(&ok(ckptfs(&["ls", "--json", m.mnt()]))).unwrap()
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The metrics follow the checkpoints: completed ones counted, the retained ones as `ls`
/// lists them, bytes grown by what each checkpoint's row says, a failed checkpoint counted
/// with the time of its error; the file and the HTTP endpoint say the same.
#[test]
fn metrics_follow_checkpoints_and_failures() {
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let m = Mounted::new(&[
        "--backend",
        "A/0",
        "--retain",
        "2",
        "--metrics-listen",
        &addr.to_string(),
    ]);
    let before = read_file_scrape(&m);
    assert_eq!(before.value("ckptfs_checkpoints_completed_total"), 0.0);
    assert_eq!(before.value("ckptfs_checkpoints_retained"), 0.0);
    assert_eq!(before.value("ckptfs_last_error_timestamp_seconds"), 0.0);
    assert_eq!(
        before.get(
            "ckptfs_checkpoint_duration_seconds_count",
            &[("phase", "sync")]
        ),
        0.0
    );

    for i in 0..2 {
        m.load_keys("A/0", 200 + i * 100);
        m.checkpoint();
    }
    let after_two = read_file_scrape(&m);
    m.put("A/0", "another", "value");
    let third = m.checkpoint();
    let after_three = read_file_scrape(&m);

    // Counters and gauges against the engine's own accounts.
    let rows = listed(&m);
    let status = m.status();
    assert_eq!(rows.len(), 2, "retain 2");
    assert_eq!(after_three.value("ckptfs_checkpoints_completed_total"), 3.0);
    assert_eq!(
        after_three.value("ckptfs_checkpoints_retained"),
        rows.len() as f64
    );
    assert_eq!(after_three.value("ckptfs_checkpoints_failed_total"), 0.0);
    assert_eq!(after_three.value("ckptfs_checkpoints_in_flight"), 0.0);
    assert_eq!(
        after_three.value("ckptfs_store_objects"),
        status["objects"].as_f64().unwrap()
    );
    assert_eq!(
        after_three.value("ckptfs_store_bytes"),
        status["store_bytes"].as_f64().unwrap()
    );
    let newest = rows.last().unwrap();
    assert_eq!(newest["id"], third);
    assert_eq!(
        after_three.value("ckptfs_latest_checkpoint_timestamp_seconds"),
        newest["completed_unix_ms"].as_f64().unwrap() / 1000.0
    );
    for phase in ["sync", "async"] {
        let count = after_three.get(
            "ckptfs_checkpoint_duration_seconds_count",
            &[("phase", phase)],
        );
        let inf = after_three.get(
            "ckptfs_checkpoint_duration_seconds_bucket",
            &[("phase", phase), ("le", "+Inf")],
        );
        assert_eq!((count, inf), (3.0, 3.0), "{phase}");
    }
    // The third checkpoint's figures, as its row says, and nothing else.
    let delta = |name: &str| after_three.value(name) - after_two.value(name);
    let field = |name: &str| newest[name].as_f64().unwrap();
    let uploaded = delta("ckptfs_checkpoint_uploaded_bytes_total");
    let reused = delta("ckptfs_checkpoint_reused_bytes_total");
    assert_eq!(
        uploaded,
        field("bytes_uploaded") + field("bytes_uploaded_materialization")
    );
    assert!(field("bytes_uploaded") > 0.0, "{newest}");
    assert!(reused <= field("bytes"), "reused {reused} of {newest}");
    assert!(
        reused >= field("bytes") - field("bytes_uploaded"),
        "reused {reused} of {newest}"
    );
    assert!(
        reused > 0.0,
        "one key more re-references the earlier SSTs: {newest}"
    );
    let sum = |s: &Scrape, phase| {
        s.get(
            "ckptfs_checkpoint_duration_seconds_sum",
            &[("phase", phase)],
        )
    };
    assert!(
        ((sum(&after_three, "sync") - sum(&after_two, "sync")) - field("sync_ms") / 1000.0).abs()
            < 1e-6
    );
    assert!(
        ((sum(&after_three, "async") - sum(&after_two, "async")) - field("async_ms") / 1000.0)
            .abs()
            < 1e-6
    );

    // A checkpoint that fails: the store's staging directory replaced by a file.
    m.put("A/0", "one more", "value");
    let tmp = m.store.join("tmp");
    let away = m.store.join("tmp.away");
    std::fs::rename(&tmp, &away).unwrap();
    std::fs::write(&tmp, b"not a directory").unwrap();
    let started = unix_now();
    let failed = ckptfs(&["checkpoint", m.mnt(), "--wait", "0"]);
    let ended = unix_now();
    std::fs::remove_file(&tmp).unwrap();
    std::fs::rename(&away, &tmp).unwrap();
    assert_eq!(failed.status.code(), Some(1));
    let after_failure = read_file_scrape(&m);
    assert_eq!(after_failure.value("ckptfs_checkpoints_failed_total"), 1.0);
    assert_eq!(
        after_failure.value("ckptfs_checkpoints_completed_total"),
        3.0
    );
    assert_eq!(
        after_failure.value("ckptfs_checkpoint_uploaded_bytes_total"),
        after_three.value("ckptfs_checkpoint_uploaded_bytes_total")
    );
    assert!(after_failure.value("ckptfs_errors_total") >= 1.0);
    let at = after_failure.value("ckptfs_last_error_timestamp_seconds");
    assert!(
        at >= started - 1.0 && at <= ended + 1.0,
        "{started} <= {at} <= {ended}"
    );
    let last_error = m.status()["last_error"].as_str().unwrap().to_string();
    assert!(last_error.contains("failed"), "{last_error}");
    assert_eq!(listed(&m).len(), 2);

    // The next one succeeds; the HTTP endpoint says what the file says.
    m.checkpoint();
    let file = read_file_scrape(&m);
    let (code, content_type, body) = http_get(addr, "/metrics");
    assert_eq!(code, 200);
    assert_eq!(
        content_type,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let http = parse(&body);
    assert_eq!(http.value("ckptfs_checkpoints_completed_total"), 4.0);
    assert_eq!(http.value("ckptfs_checkpoints_failed_total"), 1.0);
    let by_key = |s: &Scrape| -> BTreeMap<(String, Vec<(String, String)>), f64> {
        s.samples
            .iter()
            .map(|x| {
                let labels = x.labels.clone().into_iter().collect();
                ((x.name.clone(), labels), x.value)
            })
            .collect()
    };
    assert_eq!(by_key(&http), by_key(&file));
    assert_eq!(http.kind_of("ckptfs_checkpoints_completed"), "counter");
    assert_eq!(
        http.kind_of("ckptfs_checkpoint_duration_seconds"),
        "histogram"
    );
    assert_eq!(http.kind_of("ckptfs_store_bytes"), "gauge");
    assert_eq!(http.kind_of("ckptfs_daemon"), "info");
    assert_eq!(
        http.get(
            "ckptfs_daemon_info",
            &[
                ("version", env!("CARGO_PKG_VERSION")),
                ("store", m.store.to_str().unwrap()),
                ("checkpoint_mode", "flush"),
                ("read_only", "false"),
            ]
        ),
        1.0
    );
    let (code, _, body) = http_get(addr, "/nothing-here");
    assert_eq!(code, 404);
    assert!(body.contains("/metrics"), "{body}");

    // The file is read-only; the endpoint goes with the daemon.
    assert_eq!(
        errno_of(std::fs::write(m.mnt.join(".ckptfs/metrics"), b"x")),
        libc::EROFS
    );
    m.umount();
    assert!(TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_err());
}

/// An address that cannot be used fails the mount before anything is created: a
/// malformed one as a usage error, a busy one with the option and the address named.
#[test]
fn a_bad_metrics_address_fails_the_mount_before_anything_exists() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mount = |addr: &str| {
        ckptfs(&[
            "mount",
            store.to_str().unwrap(),
            mnt.to_str().unwrap(),
            "--metrics-listen",
            addr,
        ])
    };
    for malformed in ["nonsense", "localhost:9100", "127.0.0.1", "127.0.0.1:99999"] {
        let out = mount(malformed);
        assert_eq!(out.status.code(), Some(2), "{malformed}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--metrics-listen"),
            "{malformed}"
        );
    }
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = mount(&addr);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("--metrics-listen {addr}")) && stderr.contains("in use"),
        "{stderr}"
    );
    // Not a local address.
    let out = mount("192.0.2.1:9100");
    assert_eq!(out.status.code(), Some(1));
    assert!(!store.exists(), "the store was created");
    assert!(!mnt.join(".ckptfs").exists(), "it was mounted");
}

/// The metrics docs/metrics.md lists (its table's first column) with their types.
fn documented() -> BTreeMap<String, String> {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/metrics.md"),
    )
    .unwrap();
    let table = doc
        .split("## The metrics")
        .nth(1)
        .unwrap()
        .split("\n## ")
        .next()
        .unwrap();
    table
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            Some((name.to_string(), cells[2].to_string()))
        })
        .collect()
}

/// A scrape's metrics as docs/metrics.md names them (a counter's `_total`, an info's
/// `_info`), with their types.
fn exported(scrape: &Scrape) -> BTreeMap<String, String> {
    scrape
        .samples
        .iter()
        .map(|s| {
            let name = match s.kind.as_str() {
                "counter" => format!("{}_total", s.family),
                "info" => format!("{}_info", s.family),
                _ => s.family.clone(),
            };
            (name, s.kind.clone())
        })
        .collect()
}

/// Set the modification time of `path` to `ms` since the Unix epoch.
pub(crate) fn set_mtime_ms(path: &std::path::Path, ms: u64) {
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(UNIX_EPOCH + Duration::from_millis(ms))
        .unwrap();
}

/// A daemon following a copy of the real Flink job: its scrape, read by the reference
/// parser, has every metric docs/metrics.md lists and no other; the follower's series say
/// Flink's newest checkpoint (id and time), the last look, three imports and no lag; once
/// Flink completes a checkpoint 7 that ckptfs refuses, a lag of one checkpoint and of
/// 7's time less 6's, and the failed import counted.
#[test]
fn the_follower_metrics_say_how_far_behind_flink_the_store_is() {
    const JOB: &str = "a312c9034e3e0d2016dae60431b4c9dc";
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("flink").join(JOB);
    std::fs::create_dir(dir.path().join("flink")).unwrap();
    let copied = Command::new("cp")
        .arg("-a")
        .arg(crate::flink::fixture())
        .arg(&job)
        .status()
        .unwrap();
    assert!(copied.success());
    // Flink completed 4, 5 and 6 ten seconds apart, an hour ago.
    let t0 = (unix_now() as u64 - 3600) * 1000 + 250;
    let time_of = |n: u64| t0 + (n - 4) * 10_000;
    for n in [4, 5, 6] {
        set_mtime_ms(&job.join(format!("chk-{n}/_metadata")), time_of(n));
    }
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let (store, mnt) = (dir.path().join("store"), dir.path().join("mnt"));
    std::fs::create_dir(&mnt).unwrap();
    let started = unix_now();
    let m = Mounted::at(
        &store,
        &mnt,
        &[
            "--flink",
            job.to_str().unwrap(),
            "--metrics-listen",
            &addr.to_string(),
        ],
    );
    let scrape = || {
        let (code, _, body) = http_get(addr, "/metrics");
        assert_eq!(code, 200);
        parse(&body)
    };
    let wait_for = |what: &str, check: &dyn Fn(&Scrape) -> bool| -> Scrape {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let s = scrape();
            if check(&s) {
                return s;
            }
            assert!(std::time::Instant::now() < deadline, "waiting for {what}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let caught_up = wait_for("the three imports and a look after them", &|s| {
        s.value("ckptfs_flink_imports_completed_total") == 3.0
            && s.value("ckptfs_flink_lag_checkpoints") == 0.0
    });

    // Every documented metric is exported, with its documented type, and nothing else.
    let documented = documented();
    assert!(documented.len() > 30, "{documented:?}");
    assert_eq!(exported(&caught_up), documented);

    // The follower's series.
    let s = &caught_up;
    assert_eq!(
        s.get(
            "ckptfs_flink_follower_info",
            &[("source", job.to_str().unwrap())]
        ),
        1.0
    );
    assert_eq!(s.value("ckptfs_flink_newest_checkpoint_id"), 6.0);
    assert_eq!(
        s.value("ckptfs_flink_newest_checkpoint_timestamp_seconds"),
        time_of(6) as f64 / 1000.0
    );
    assert_eq!(s.value("ckptfs_flink_lag_seconds"), 0.0);
    let look = s.value("ckptfs_flink_last_look_timestamp_seconds");
    assert!(look >= started && look <= unix_now(), "{started} {look}");
    assert_eq!(s.value("ckptfs_flink_imports_failed_total"), 0.0);
    assert_eq!(
        s.get("ckptfs_flink_import_duration_seconds_count", &[]),
        3.0
    );
    assert!(s.get("ckptfs_flink_import_duration_seconds_sum", &[]) > 0.0);
    let status = m.status();
    assert_eq!(status["flink_follower"]["newest"]["checkpoint"], 6);
    assert_eq!(status["flink_follower"]["lag_checkpoints"], 0);

    // Flink completes checkpoint 7, which ckptfs refuses: one behind, by 7's time less 6's.
    let staged = dir.path().join("chk-7");
    std::fs::create_dir(&staged).unwrap();
    std::fs::write(staged.join("_metadata"), b"not a checkpoint's metadata").unwrap();
    set_mtime_ms(&staged.join("_metadata"), time_of(6) + 95_500);
    std::fs::rename(&staged, job.join("chk-7")).unwrap();
    let behind = wait_for("a look at checkpoint 7", &|s| {
        s.value("ckptfs_flink_newest_checkpoint_id") == 7.0
    });
    assert_eq!(behind.value("ckptfs_flink_lag_checkpoints"), 1.0);
    assert_eq!(behind.value("ckptfs_flink_lag_seconds"), 95.5);
    assert_eq!(
        behind.value("ckptfs_flink_newest_checkpoint_timestamp_seconds"),
        (time_of(6) + 95_500) as f64 / 1000.0
    );
    assert_eq!(behind.value("ckptfs_flink_imports_failed_total"), 1.0);
    assert_eq!(behind.value("ckptfs_flink_refused_total"), 1.0);
    assert_eq!(behind.value("ckptfs_flink_imports_completed_total"), 3.0);
    assert!(behind.value("ckptfs_flink_last_look_timestamp_seconds") >= look);
    assert_eq!(exported(&behind), documented);
    m.umount();
}
