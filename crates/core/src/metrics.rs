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
    }
}
