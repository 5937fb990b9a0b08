//! The daemon's metrics as text for Prometheus: what `.ckptfs/metrics` shows and what
//! `ckptfs mount --metrics-listen ADDR` serves at `/metrics` (see `docs/metrics.md`).
//!
//! The text is the OpenMetrics 1.0 text format (the standardised Prometheus text
//! exposition format; Prometheus scrapes it as is), encoded by prometheus-client. Every
//! scrape builds a fresh registry from the engine: the counters it keeps since it opened
//! ([`crate::coordinator::counters`]) and gauges read from its status at that instant, so
//! nothing here holds state of its own and nothing runs between scrapes. The daemon serves
//! the same text over HTTP (`--metrics-listen`, in the ckptfs crate).

use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

use crate::commands::{du, history};
use crate::coordinator::counters::Counters;
use crate::coordinator::{Engine, EngineStatus};

/// The HTTP content type of the text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The metrics of this engine now, as OpenMetrics text (ending in `# EOF`).
pub fn render(engine: &Engine) -> String {
    let status = engine.status();
    let mut registry = Registry::with_prefix("ckptfs");
    register_daemon(&mut registry, engine, &status);
    register_checkpoints(&mut registry, engine.counters(), &status);
    register_store(&mut registry, &status);
    register_operators(&mut registry, &status);
    register_compaction(&mut registry, &status);
    register_imports(&mut registry, engine.counters(), &status);
    register_flink(&mut registry, engine);
    register_errors(&mut registry, engine.counters());
    let mut text = String::new();
    // Writing into a String cannot fail; an encoder error would leave the text cut short,
    // which a scraper reports (no `# EOF`).
    if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &registry) {
        log::error!("cannot encode the metrics: {e}");
    }
    text
}

fn register_daemon(registry: &mut Registry, engine: &Engine, status: &EngineStatus) {
    let labels = vec![
        ("version", env!("CARGO_PKG_VERSION").to_string()),
        ("store", engine.location().to_string()),
        ("checkpoint_mode", status.checkpoint_mode.to_string()),
        ("read_only", engine.is_read_only().to_string()),
    ];
    registry.register(
        "daemon",
        "The daemon: its version, store, checkpoint mode, and whether it is a read-only view",
        Info::new(labels),
    );
}

fn register_checkpoints(registry: &mut Registry, counters: &Counters, status: &EngineStatus) {
    registry.register(
        "checkpoints_completed",
        "Checkpoints committed since the daemon started",
        counters.checkpoints_completed.clone(),
    );
    registry.register(
        "checkpoints_failed",
        "Checkpoints that got an id and did not commit, since the daemon started",
        counters.checkpoints_failed.clone(),
    );
    registry.register_with_unit(
        "checkpoint_duration",
        "Duration of each phase of the committed checkpoints",
        Unit::Seconds,
        counters.checkpoint_seconds.clone(),
    );
    registry.register_with_unit(
        "checkpoint_uploaded",
        "Bytes the committed checkpoints stored (files, chunks, file lists, adopted \
         materializations)",
        Unit::Bytes,
        counters.bytes_uploaded.clone(),
    );
    registry.register_with_unit(
        "checkpoint_copied",
        "Of the bytes the committed checkpoints stored, those the object store copied from \
         the source itself",
        Unit::Bytes,
        counters.bytes_copied.clone(),
    );
    registry.register_with_unit(
        "checkpoint_reused",
        "Bytes of the committed checkpoints' files that were stored already",
        Unit::Bytes,
        counters.bytes_reused.clone(),
    );
    registry.register(
        "checkpoints_in_flight",
        "Checkpoints begun and not yet committed or failed",
        ConstGauge::new(status.in_flight.len() as i64),
    );
    registry.register(
        "checkpoints_retained",
        "Checkpoints in the store (those `ckptfs ls` lists)",
        ConstGauge::new(status.checkpoints.len() as i64),
    );
    let latest = status.checkpoints.last().map_or(0, |m| m.completed_unix_ms);
    registry.register_with_unit(
        "latest_checkpoint_timestamp",
        "When the newest retained checkpoint completed, unix time (0: none)",
        Unit::Seconds,
        ConstGauge::new(latest as f64 / 1000.0),
    );
}

fn register_imports(registry: &mut Registry, counters: &Counters, status: &EngineStatus) {
    registry.register(
        "imports_completed",
        "Directories imported (`ckptfs import`, one per backend) by committed checkpoints \
         since the daemon started",
        counters.imports_completed.clone(),
    );
    registry.register(
        "imports_failed",
        "Directories of import checkpoints that got an id and did not commit, since the \
         daemon started",
        counters.imports_failed.clone(),
    );
    registry.register_with_unit(
        "import_read",
        "Bytes the committed imports read from their directories",
        Unit::Bytes,
        counters.import_read_bytes.clone(),
    );
    registry.register(
        "import_unread_files",
        "Files the committed imports re-referenced by their source without reading them",
        counters.import_unread_files.clone(),
    );
    registry.register(
        "flink_refused",
        "Flink checkpoints the follower refused for what they are (read again only once \
         their _metadata changes), since the daemon started",
        counters.flink_refused.clone(),
    );
    registry.register(
        "external_backends",
        "Backends whose state is imported, not hosted",
        ConstGauge::new(status.external.len() as i64),
    );
}

/// The Flink imports' counters, and for a daemon that follows a job its health
/// ([`Engine::follower_health`]): when it last looked, Flink's newest checkpoint then, the
/// lag.
fn register_flink(registry: &mut Registry, engine: &Engine) {
    let counters = engine.counters();
    registry.register(
        "flink_imports_completed",
        "Flink checkpoints imported (by the follower, or import-flink through the daemon) \
         since the daemon started",
        counters.flink_imports_completed.clone(),
    );
    registry.register(
        "flink_imports_failed",
        "Flink checkpoint imports that failed, refused ones included, each try counted, \
         since the daemon started",
        counters.flink_imports_failed.clone(),
    );
    registry.register_with_unit(
        "flink_import_duration",
        "Duration of each committed Flink checkpoint import: its _metadata and files read, \
         its objects stored, its commit",
        Unit::Seconds,
        counters.flink_import_seconds.clone(),
    );
    let Some(health) = engine.follower_health() else {
        return;
    };
    registry.register(
        "flink_follower",
        "The Flink checkpoints this daemon follows (mount --flink SRC)",
        Info::new(vec![("source", health.source.clone())]),
    );
    let seconds = |ms: Option<u64>| ConstGauge::new(ms.unwrap_or(0) as f64 / 1000.0);
    registry.register_with_unit(
        "flink_last_look_timestamp",
        "When the follower's last look that could list Flink's checkpoints ended, unix \
         time (0: none yet)",
        Unit::Seconds,
        seconds(health.looked_unix_ms),
    );
    let newest = health.newest.as_ref();
    registry.register(
        "flink_newest_checkpoint_id",
        "Flink's newest completed checkpoint (chk-N) at the last look (0: none)",
        ConstGauge::new(newest.map_or(0, |n| n.checkpoint as i64)),
    );
    registry.register_with_unit(
        "flink_newest_checkpoint_timestamp",
        "When Flink completed that checkpoint (its _metadata written), unix time (0: none \
         or not known)",
        Unit::Seconds,
        seconds(newest.and_then(|n| n.time_unix_ms)),
    );
    registry.register(
        "flink_lag_checkpoints",
        "Checkpoints the store was behind Flink's newest after the last look (0: it holds \
         it)",
        ConstGauge::new(health.lag_checkpoints as i64),
    );
    registry.register_with_unit(
        "flink_lag",
        "How much older the store's newest Flink checkpoint was than Flink's newest after \
         the last look, by Flink's times (0: it holds it)",
        Unit::Seconds,
        seconds(Some(health.lag_ms)),
    );
}

fn register_store(registry: &mut Registry, status: &EngineStatus) {
    registry.register(
        "store_objects",
        "Stored objects the retained checkpoints reference",
        ConstGauge::new(status.objects as i64),
    );
    registry.register_with_unit(
        "store",
        "Bytes of the stored objects the retained checkpoints reference (file lists not \
         sized)",
        Unit::Bytes,
        ConstGauge::new(status.referenced_bytes as i64),
    );
}

/// Most operators with a series of their own; the smaller ones are summed under
/// [`REST`]. A Flink job has a handful of keyed operators: the bound only guards a
/// scraper against a store with very many.
pub const MAX_OPERATOR_SERIES: usize = 100;
/// Most (operator, state) pairs with a series of their own (the largest by bytes); the
/// others are summed into one series labelled [`REST`] for both.
pub const MAX_STATE_SERIES: usize = 50;
/// The label of the series that sums what the bounds above leave out.
pub const REST: &str = "(rest)";

type Labels = Vec<(&'static str, String)>;

/// Per operator (and per state, bounded) the newest retained checkpoint's files and bytes
/// as `ckptfs du` counts them, summed over the operator's subtasks: one series per
/// operator, never per file or subtask. Reads the newest manifest only (du's `files` and
/// `bytes` need no other checkpoint).
fn register_operators(registry: &mut Registry, status: &EngineStatus) {
    let bytes = Family::<Labels, Gauge>::default();
    let files = Family::<Labels, Gauge>::default();
    let state_bytes = Family::<Labels, Gauge>::default();
    let newest = status
        .checkpoints
        .last()
        .and_then(|m| du::usage_of([m.as_ref()], None))
        .and_then(|r| r.checkpoints.into_iter().next());
    if let Some(c) = newest {
        let mut operators: Vec<(&str, du::Usage)> = history::by_operator(&c)
            .into_iter()
            .map(|(op, (usage, _))| (op, usage))
            .collect();
        operators.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.cmp(b.0)));
        for (n, (operator, usage)) in operators.iter().enumerate() {
            let name = if n < MAX_OPERATOR_SERIES {
                operator
            } else {
                REST
            };
            let labels = vec![("operator", name.to_string())];
            bytes.get_or_create(&labels).inc_by(usage.bytes as i64);
            files.get_or_create(&labels).inc_by(usage.files as i64);
        }
        for (n, s) in history::largest_states(&c).iter().enumerate() {
            let (operator, state) = if n < MAX_STATE_SERIES {
                (s.operator.as_str(), s.state.as_str())
            } else {
                (REST, REST)
            };
            let labels = vec![
                ("operator", operator.to_string()),
                ("state", state.to_string()),
            ];
            state_bytes
                .get_or_create(&labels)
                .inc_by(s.usage.bytes as i64);
        }
    }
    registry.register_with_unit(
        "operator",
        "Bytes of each operator's files in the newest retained checkpoint, all its subtasks \
         (`ckptfs du`'s bytes; operators past the 100 largest summed as \"(rest)\")",
        Unit::Bytes,
        bytes,
    );
    registry.register(
        "operator_files",
        "Files of each operator in the newest retained checkpoint, all its subtasks",
        files,
    );
    registry.register_with_unit(
        "state",
        "Bytes of each state (RocksDB column family) of each operator in the newest \
         retained checkpoint, all subtasks; past the 50 largest summed as \"(rest)\"",
        Unit::Bytes,
        state_bytes,
    );
}

fn register_compaction(registry: &mut Registry, status: &EngineStatus) {
    let (files, bytes) = status.small_file_compactions;
    registry.register(
        "small_file_compaction_files",
        "Small SSTs merged by small-file compaction since the daemon started",
        ConstCounter::new(files),
    );
    registry.register_with_unit(
        "small_file_compaction",
        "Bytes of the small SSTs merged by small-file compaction since the daemon started",
        Unit::Bytes,
        ConstCounter::new(bytes),
    );
}

fn register_errors(registry: &mut Registry, counters: &Counters) {
    registry.register(
        "errors",
        "Errors recorded for status (its last_error) since the daemon started, failed \
         checkpoints included",
        counters.errors.clone(),
    );
    let last = counters.last_error_unix_ms().unwrap_or(0);
    registry.register_with_unit(
        "last_error_timestamp",
        "When the last error was recorded, unix time (0: none since the daemon started)",
        Unit::Seconds,
        ConstGauge::new(last as f64 / 1000.0),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The samples of a scrape by name and labels: a strict enough reading for unit tests
    /// (the end-to-end test reads it with a real Prometheus parser).
    fn samples(text: &str) -> std::collections::BTreeMap<String, f64> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' '))
            .map(|(name, value)| (name.to_string(), value.parse().unwrap()))
            .collect()
    }

    #[test]
    fn a_scrape_shows_the_engine_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = crate::EngineConfig::new(dir.path().join("store"));
        config.backends = vec!["A/0".parse().unwrap()];
        config.retain = Some(2);
        let engine = Engine::open(config).unwrap();
        let before = samples(&render(&engine));
        assert_eq!(before["ckptfs_checkpoints_completed_total"], 0.0);
        assert_eq!(
            before["ckptfs_checkpoint_duration_seconds_count{phase=\"sync\"}"],
            0.0
        );
        assert_eq!(before["ckptfs_last_error_timestamp_seconds"], 0.0);
        for i in 0..3 {
            engine
                .put(&"A/0".parse().unwrap(), b"k", i.to_string().as_bytes())
                .unwrap();
            engine.checkpoint().unwrap();
        }
        engine.begin_checkpoint().unwrap().abort();
        let text = render(&engine);
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(text.contains("# TYPE ckptfs_checkpoint_duration_seconds histogram"));
        assert!(text.contains("# UNIT ckptfs_store_bytes bytes"));
        let after = samples(&text);
        let status = engine.status();
        assert_eq!(after["ckptfs_checkpoints_completed_total"], 3.0);
        assert_eq!(after["ckptfs_checkpoints_failed_total"], 1.0);
        assert_eq!(after["ckptfs_checkpoints_retained"], 2.0);
        assert_eq!(after["ckptfs_checkpoints_in_flight"], 0.0);
        assert_eq!(after["ckptfs_store_objects"], status.objects as f64);
        assert_eq!(after["ckptfs_store_bytes"], status.referenced_bytes as f64);
        for phase in ["sync", "async"] {
            let count = format!("ckptfs_checkpoint_duration_seconds_count{{phase=\"{phase}\"}}");
            let inf = format!(
                "ckptfs_checkpoint_duration_seconds_bucket{{le=\"+Inf\",phase=\"{phase}\"}}"
            );
            assert_eq!(after[&count], 3.0, "{text}");
            assert_eq!(after[&inf], 3.0, "{text}");
        }
        let uploaded: u64 = status
            .checkpoints
            .iter()
            .map(|m| m.stats.bytes_uploaded)
            .sum();
        // The first checkpoint, no longer retained, uploaded some too.
        assert!(after["ckptfs_checkpoint_uploaded_bytes_total"] > uploaded as f64);
        assert!(after["ckptfs_last_error_timestamp_seconds"] > 1.6e9);
        assert_eq!(after["ckptfs_errors_total"], 1.0);
        // The newest checkpoint's bytes and files, per operator and per state.
        let newest = status.checkpoints.last().unwrap();
        let (files, bytes) = newest.backends[0]
            .files
            .iter()
            .fold((0, 0), |(n, b), f| (n + 1, b + f.size));
        assert!(bytes > 0);
        assert_eq!(after["ckptfs_operator_bytes{operator=\"A\"}"], bytes as f64);
        assert_eq!(after["ckptfs_operator_files{operator=\"A\"}"], files as f64);
        let states: f64 = after
            .iter()
            .filter(|(k, _)| k.starts_with("ckptfs_state_bytes{operator=\"A\","))
            .map(|(_, v)| v)
            .sum();
        assert_eq!(states, bytes as f64);
        assert!(
            text.contains("# TYPE ckptfs_operator_bytes gauge"),
            "{text}"
        );
        let info = text
            .lines()
            .find(|l| l.starts_with("ckptfs_daemon_info{"))
            .unwrap();
        assert!(info.contains("checkpoint_mode=\"flush\""), "{info}");
        assert!(info.contains("read_only=\"false\""), "{info}");
        // No Flink job followed: no follower series, the import counters at 0.
        assert!(!text.contains("ckptfs_flink_lag"), "{text}");
        assert_eq!(after["ckptfs_flink_imports_failed_total"], 0.0);
    }

    /// A follower's look: Flink's newest checkpoint (6, with its time), the lag behind it
    /// before and after the store imports it.
    #[test]
    fn a_follower_shows_its_look_and_lag() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(crate::EngineConfig::new(dir.path().join("store"))).unwrap();
        engine.follow_flink_from("/flink/job".into());
        let before = samples(&render(&engine));
        assert_eq!(before["ckptfs_flink_last_look_timestamp_seconds"], 0.0);
        assert_eq!(
            before["ckptfs_flink_follower_info{source=\"/flink/job\"}"],
            1.0
        );
        let newest = crate::coordinator::FlinkNewest {
            job: "job".into(),
            checkpoint: 6,
            time_unix_ms: Some(1_700_000_000_500),
        };
        engine.note_look(Some((newest, false)));
        let after = samples(&render(&engine));
        assert_eq!(after["ckptfs_flink_newest_checkpoint_id"], 6.0);
        assert_eq!(
            after["ckptfs_flink_newest_checkpoint_timestamp_seconds"],
            1_700_000_000.5
        );
        assert_eq!(after["ckptfs_flink_lag_checkpoints"], 6.0);
        let look = after["ckptfs_flink_last_look_timestamp_seconds"];
        assert!(look > 1.7e9, "{look}");
        // Nothing imported: the time since Flink's newest.
        let lag = after["ckptfs_flink_lag_seconds"];
        assert!(
            (lag - (look - 1_700_000_000.5)).abs() < 1e-3,
            "{lag} {look}"
        );
    }
}
