//! The page the daemon serves at `/` (`mount --metrics-listen ADDR`): what the store
//! holds, for people. Each retained checkpoint's bytes new and shared, each operator's
//! and state's bytes over the checkpoints ([`plot`], server-drawn SVG), the largest
//! states, the Flink job followed and how far behind it the store is, the last error.
//!
//! One HTML document, self-contained: inline CSS, no script, no font or image from
//! elsewhere (the reader's machine may have no internet). Every string from a store or a
//! Flink job (operator uids, state names, job ids, errors) is escaped ([`escape`]); every
//! figure is also in a `data-` attribute of an element with a stable id, so a test reads
//! the figures out of the DOM.
//!
//! `ckptfs du`'s count over every retained checkpoint reads every file entry of every
//! manifest (about 100 ms for 1,000 checkpoints of 100 SSTs: docs/benchmarks.md), and
//! what it draws grows with the history (about 380 B of HTML per retained checkpoint:
//! 6 MiB at 16,000). So [`Page`] renders that part (the plots and the tables) once per
//! change of the set of retained checkpoints and keeps it as [`Bytes`]: every answer until
//! the next change sends the same bytes, reference-counted, never a copy, however many
//! clients are still reading them. Only the status parts (the summary, the Flink job and
//! its lag, the last error, the footer: about 2 KiB whatever the history) are rendered per
//! load, so ages and lags are as of the request.

pub mod plot;

use std::fmt::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, UNIX_EPOCH};

use bytes::Bytes;

use ckptfs_core::commands::du::{self, DuReport, Usage};
use ckptfs_core::commands::history;
use ckptfs_core::coordinator::{Engine, EngineStatus};
use ckptfs_core::fsutil::lock;

use ckptfs_core::fsutil::now_unix_ms as unix_ms_now;

/// The checkpoints listed one by one in the page's table (the plot shows all of them).
pub const TABLE_CHECKPOINTS: usize = 50;
/// The states listed in the largest-states table.
pub const LARGEST_STATES: usize = 20;

/// `s` with the characters HTML and XML give a meaning to replaced by references, for
/// text and for attribute values alike.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

pub use crate::units::human_bytes;

/// A time as RFC 3339 (seconds).
fn when(ms: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// How long before `now_ms` `then_ms` was, for people: `just now`, `42 s ago`,
/// `3 min ago`, `5 h ago`, `12 d ago` (a time after `now_ms`: `in the future`, a clock
/// that differs).
pub fn ago(now_ms: u64, then_ms: u64) -> String {
    if then_ms > now_ms + 1_000 {
        return "in the future".into();
    }
    let s = now_ms.saturating_sub(then_ms) / 1000;
    match s {
        0 => "just now".into(),
        1..=119 => format!("{s} s ago"),
        120..=7_199 => format!("{} min ago", s / 60),
        7_200..=172_799 => format!("{} h ago", s / 3600),
        _ => format!("{} d ago", s / 86_400),
    }
}

/// A time with its age: `2026-12-04T21:35:52Z (3 min ago)`, the age in a `<span
/// class="age">`.
fn when_ago(now_ms: u64, ms: u64) -> String {
    format!(
        "{} <span class=\"age\">({})</span>",
        when(ms),
        ago(now_ms, ms)
    )
}

/// A duration in milliseconds for people: `0.4 ms`, `12 ms`, `1.4 s`, `3 min 5 s`.
pub fn human_ms(ms: f64) -> String {
    if ms < 10.0 {
        format!("{ms:.1} ms")
    } else if ms < 1000.0 {
        format!("{ms:.0} ms")
    } else if ms < 60_000.0 {
        format!("{:.1} s", ms / 1000.0)
    } else {
        let s = (ms / 1000.0).round() as u64;
        format!("{} min {} s", s / 60, s % 60)
    }
}

/// The pins named in the summary (the others are counted): the part rendered per load
/// stays small whatever the number of pins.
pub const PINS_SHOWN: usize = 10;

/// How often the page reloads itself (`<meta http-equiv="refresh">`: no script).
pub const REFRESH_SECONDS: u32 = 30;

/// `s` as [`Bytes`] in an allocation of its length (a `String`'s spare capacity would
/// stay allocated as long as the bytes live).
fn exact(s: String) -> Bytes {
    Bytes::from(s.into_bytes().into_boxed_slice())
}

/// What is kept between loads: du over the retained checkpoints `ids`, drawn.
struct Drawn {
    ids: Vec<u64>,
    /// The bytes the retained checkpoints name, each counted in every checkpoint that
    /// names it (du's `bytes`, summed): what the store would hold without deduplication.
    named: u64,
    /// The history's plots, the largest states and the checkpoints' table, as HTML.
    html: Bytes,
}

/// The page as it is answered, in three parts sent one after the other: the status parts
/// rendered for this load (`head`, `foot`) and, between them, the part drawn from du's
/// figures, shared with every other load until the retained checkpoints change.
pub struct Rendered {
    /// From the document's start to the last error.
    pub head: Bytes,
    /// The history's plots, the largest states, the checkpoints' table (shared).
    pub drawn: Bytes,
    /// The footer and the document's end.
    pub foot: Bytes,
}

/// The page of one daemon: its engine (with what its Flink follower saw), the cached
/// figures.
pub struct Page {
    engine: Engine,
    drawn: Mutex<Option<Arc<Drawn>>>,
}

impl Page {
    /// The page of `engine`.
    pub fn new(engine: Engine) -> Page {
        Page {
            engine,
            drawn: Mutex::new(None),
        }
    }

    /// du's figures of the checkpoints in `status` drawn, counted and drawn again only if
    /// they changed. Loads that find them changed wait for the one that draws them (the
    /// lock is held meanwhile), then share its bytes.
    fn drawn(&self, status: &EngineStatus) -> Arc<Drawn> {
        let ids: Vec<u64> = status.checkpoints.iter().map(|m| m.id).collect();
        let mut cached = lock(&self.drawn);
        if let Some(d) = cached.as_ref().filter(|d| d.ids == ids) {
            return d.clone();
        }
        // The previous drawing goes first: answers still being sent keep their own
        // reference to its bytes, nothing else holds them.
        *cached = None;
        let report =
            du::usage_of(status.checkpoints.iter().map(|m| m.as_ref()), None).unwrap_or(DuReport {
                checkpoints: Vec::new(),
            });
        let named = report.checkpoints.iter().map(|c| c.total.bytes).sum();
        let history = history::history(&report);
        let svg = plot::history_svg(&history);
        drop(history);
        let mut html = String::with_capacity(svg.len() + 64 * 1024);
        let _ = write!(
            html,
            "<section id=\"history\"><h2>History</h2>\n{svg}</section>\n"
        );
        drop(svg);
        largest_states(&mut html, &report);
        checkpoints(&mut html, &report, status);
        let d = Arc::new(Drawn {
            ids,
            named,
            html: exact(html),
        });
        *cached = Some(d.clone());
        drop(cached);
        // What counting freed (with a million stored objects, about 75 MiB) goes back to
        // the system, not kept until the next checkpoint's trim.
        ckptfs_core::fsutil::release_free_memory();
        d
    }

    /// The page now, in its parts (see [`Rendered`]).
    pub fn render(&self) -> Rendered {
        let started = Instant::now();
        let status = self.engine.status();
        let drawn = self.drawn(&status);
        let mut out = String::with_capacity(8 * 1024);
        let store = self.engine.location().to_string();
        let _ = write!(
            out,
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
             <meta http-equiv=\"refresh\" content=\"{REFRESH_SECONDS}\">\
             <title>ckptfs: {}</title><style>{STYLE}</style></head><body>\n",
            escape(&store)
        );
        self.summary(&mut out, &status, &store, drawn.named);
        self.flink(&mut out, &status);
        self.last_error(&mut out, &status);
        let mut foot = String::with_capacity(512);
        let _ = write!(
            foot,
            "<footer id=\"rendered\" data-render-us=\"{}\" data-refresh-s=\"{REFRESH_SECONDS}\">\
             Drawn at {} by ckptfs {}, again every {REFRESH_SECONDS} s; times are UTC; \
             the metrics are at <a href=\"/metrics\">/metrics</a>.</footer>\n</body></html>\n",
            started.elapsed().as_micros(),
            when(unix_ms_now()),
            env!("CARGO_PKG_VERSION"),
        );
        Rendered {
            head: exact(out),
            drawn: Bytes::clone(&drawn.html),
            foot: exact(foot),
        }
    }

    fn summary(&self, out: &mut String, status: &EngineStatus, store: &str, named: u64) {
        let now = unix_ms_now();
        let newest = status.checkpoints.last();
        let policy = self.engine.policy().to_rules().join(" ");
        let pins = self.engine.pins();
        let ratio = if status.referenced_bytes > 0 {
            named as f64 / status.referenced_bytes as f64
        } else {
            1.0
        };
        let pinned = if pins.is_empty() {
            "; nothing pinned".to_string()
        } else {
            let mut shown: Vec<String> = pins
                .iter()
                .take(PINS_SHOWN)
                .map(|(name, cp)| {
                    format!(
                        "<span class=\"pin\" data-pin=\"{n}\" data-checkpoint=\"{cp}\">\
                         <code>{n}</code> &rarr; cp-{cp}</span>",
                        n = escape(name)
                    )
                })
                .collect();
            if pins.len() > PINS_SHOWN {
                shown.push(format!(
                    "and {} more (<code>ls pinned/</code>)",
                    pins.len() - PINS_SHOWN
                ));
            }
            format!(
                "; pinned, kept whatever the policy says: {}",
                shown.join(", ")
            )
        };
        let newest_line = match newest {
            None => "none yet".to_string(),
            Some(m) => format!(
                "cp-{} at {}, which took {} (sync {}, async {})",
                m.id,
                when_ago(now, m.completed_unix_ms),
                human_ms((m.stats.sync_micros + m.stats.async_micros) as f64 / 1000.0),
                human_ms(m.stats.sync_micros as f64 / 1000.0),
                human_ms(m.stats.async_micros as f64 / 1000.0),
            ),
        };
        let _ = write!(
            out,
            "<header><h1>ckptfs</h1><p id=\"store\" data-store=\"{s}\">Store <code>{s}</code>{}</p>\
             </header>\n<section id=\"summary\" data-retained=\"{}\" data-retain=\"{}\" \
             data-policy=\"{p}\" data-pins=\"{}\" data-store-bytes=\"{}\" \
             data-named-bytes=\"{named}\" data-dedup-ratio=\"{ratio:.3}\" data-objects=\"{}\" \
             data-in-flight=\"{}\" data-newest=\"{}\" data-newest-unix-ms=\"{}\"><dl>\
             <dt>Checkpoints retained</dt><dd>{}, kept by the policy <code>{p}</code>{pinned}</dd>\
             <dt>Stored</dt><dd>{} in {} objects, for {} the checkpoints name: \
             deduplication {ratio:.1}&times;</dd>\
             <dt>Newest</dt><dd>{newest_line}</dd>\
             <dt>In flight</dt><dd>{}</dd>\
             <dt>Backends</dt><dd>{} hosted, {} imported; checkpoint mode {}</dd></dl></section>\n",
            if self.engine.is_read_only() {
                " (a read-only view)"
            } else {
                ""
            },
            status.checkpoints.len(),
            status.retain,
            pins.len(),
            status.referenced_bytes,
            status.objects,
            status.in_flight.len(),
            newest.map_or(String::new(), |m| m.id.to_string()),
            newest.map_or(0, |m| m.completed_unix_ms),
            status.checkpoints.len(),
            escape(&human_bytes(status.referenced_bytes)),
            status.objects,
            escape(&human_bytes(named)),
            if status.in_flight.is_empty() {
                "none".to_string()
            } else {
                status
                    .in_flight
                    .iter()
                    .map(|id| format!("cp-{id}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            status.backends.len(),
            status.external.len(),
            status.checkpoint_mode,
            s = escape(store),
            p = escape(&policy),
        );
    }

    /// The Flink job followed (or the newest imported, for a store that is not
    /// following one): Flink's newest checkpoint with its age, the newest imported, the
    /// lag ([`Engine::follower_health`], as the metrics say it), when the follower last
    /// looked, the imports that failed and those refused.
    fn flink(&self, out: &mut String, status: &EngineStatus) {
        let imported = status
            .checkpoints
            .iter()
            .rev()
            .find_map(|m| m.flink.as_ref().map(|f| (f, m.completed_unix_ms)));
        let health = self.engine.follower_health();
        let now = unix_ms_now();
        let mut attrs = String::new();
        let mut lines = Vec::new();
        let _ = write!(attrs, " data-followed=\"{}\"", health.is_some());
        match &health {
            Some(h) => {
                let _ = write!(attrs, " data-source=\"{}\"", escape(&h.source));
                lines.push(format!(
                    "Following <code>{}</code> (<code>mount --flink</code>).",
                    escape(&h.source)
                ));
                match h.looked_unix_ms {
                    Some(at) => {
                        let _ = write!(attrs, " data-looked-unix-ms=\"{at}\"");
                        lines.push(format!("Last look at {}.", when_ago(now, at)));
                    }
                    None => {
                        lines.push("No look at the job's checkpoints has succeeded yet.".into())
                    }
                }
                match &h.newest {
                    Some(n) => {
                        let _ = write!(
                            attrs,
                            " data-flink-job=\"{}\" data-flink-newest=\"{}\" \
                             data-flink-newest-unix-ms=\"{}\"",
                            escape(&n.job),
                            n.checkpoint,
                            n.time_unix_ms.unwrap_or(0)
                        );
                        lines.push(format!(
                            "Flink's newest completed checkpoint: job <code>{}</code> \
                             checkpoint {}, completed {}.",
                            escape(&n.job),
                            n.checkpoint,
                            n.time_unix_ms
                                .map_or("at a time the source does not say".into(), |t| {
                                    format!("at {}", when_ago(now, t))
                                })
                        ));
                        let _ = write!(
                            attrs,
                            " data-lag-checkpoints=\"{}\" data-lag-ms=\"{}\"",
                            h.lag_checkpoints, h.lag_ms
                        );
                        lines.push(if h.lag_checkpoints == 0 {
                            "Lag: none, the store holds Flink's newest checkpoint.".into()
                        } else {
                            format!(
                                "<strong class=\"lagging\">Lag: {} checkpoint(s), {} of \
                                 Flink's time behind.</strong>",
                                h.lag_checkpoints,
                                human_ms(h.lag_ms as f64)
                            )
                        });
                    }
                    None => lines.push("Flink has completed no checkpoint yet.".into()),
                }
            }
            None => lines.push(
                "This daemon follows no Flink job (<code>ckptfs mount --flink SRC</code> \
                 does)."
                    .into(),
            ),
        }
        match imported {
            Some((label, at)) => {
                let age = now.saturating_sub(at) / 1000;
                let _ = write!(
                    attrs,
                    " data-imported-job=\"{}\" data-imported-newest=\"{}\" \
                     data-imported-age-s=\"{age}\"",
                    escape(&label.job),
                    label.checkpoint
                );
                lines.push(format!(
                    "Newest imported: job <code>{}</code> checkpoint {}, stored at {}.",
                    escape(&label.job),
                    label.checkpoint,
                    when_ago(now, at)
                ));
            }
            None => lines.push("No checkpoint imported from Flink is retained.".into()),
        }
        let counters = self.engine.counters();
        let (done, failed) = (
            counters.flink_imports_completed.get(),
            counters.flink_imports_failed.get(),
        );
        let refused = self.engine.flink_refused();
        let _ = write!(
            attrs,
            " data-imports-completed=\"{done}\" data-imports-failed=\"{failed}\" \
             data-refused=\"{}\"",
            refused.len()
        );
        lines.push(format!(
            "Imports since the daemon started: {done} committed, {failed} failed \
             (each try counted; the table below gives each checkpoint's duration)."
        ));
        let refused_list = refused_list(&refused);
        let _ = writeln!(
            out,
            "<section id=\"flink\"{attrs}><h2>Flink</h2><p>{}</p>{refused_list}</section>",
            lines.join("<br>")
        );
    }

    /// The last error, with when it was recorded.
    fn last_error(&self, out: &mut String, status: &EngineStatus) {
        match &status.last_error {
            Some(e) => {
                let at = self.engine.counters().last_error_unix_ms();
                let _ = writeln!(
                    out,
                    "<section id=\"last-error\" class=\"error\" data-error=\"{e}\" \
                     data-error-unix-ms=\"{}\"><h2>Last error</h2><p>{}</p><pre>{e}</pre>\
                     </section>",
                    at.unwrap_or(0),
                    at.map_or(
                        "When: at start (found while opening the store).".into(),
                        |t| { format!("At {}.", when_ago(unix_ms_now(), t)) }
                    ),
                    e = escape(e)
                );
            }
            None => out.push_str(
                "<section id=\"last-error\"><h2>Last error</h2><p>None since the daemon \
                 started.</p></section>\n",
            ),
        }
    }
}

/// The first 10 checkpoints the follower refuses, with why, as a list (empty: none).
fn refused_list(refused: &[ckptfs_core::coordinator::FlinkRefused]) -> String {
    let mut refused_list = String::new();
    if !refused.is_empty() {
        refused_list.push_str("<ul id=\"flink-refused\">");
        for r in refused.iter().take(10) {
            let _ = write!(
                refused_list,
                "<li data-job=\"{j}\" data-checkpoint=\"{c}\">Refused: job <code>{j}</code> \
                 checkpoint {c}: {}</li>",
                escape(&r.reason),
                j = escape(&r.job),
                c = r.checkpoint
            );
        }
        if refused.len() > 10 {
            let _ = write!(
                refused_list,
                "<li>and {} more (<code>ckptfs status</code>)</li>",
                refused.len() - 10
            );
        }
        refused_list.push_str("</ul>");
    }
    refused_list
}

/// `data-` attributes of a figure set, with a prefix.
fn usage_attrs(u: &Usage) -> String {
    format!(
        "data-files=\"{}\" data-bytes=\"{}\" data-new=\"{}\" data-shared=\"{}\" \
         data-exclusive=\"{}\"",
        u.files, u.bytes, u.new, u.shared, u.exclusive
    )
}

fn usage_cells(u: &Usage) -> String {
    format!(
        "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
        u.files,
        escape(&human_bytes(u.bytes)),
        escape(&human_bytes(u.new)),
        escape(&human_bytes(u.shared)),
        escape(&human_bytes(u.exclusive)),
    )
}

/// The newest checkpoint's largest states, with their bytes in the oldest retained one.
fn largest_states(out: &mut String, report: &DuReport) {
    let (Some(oldest), Some(newest)) = (report.checkpoints.first(), report.checkpoints.last())
    else {
        return;
    };
    let before: std::collections::BTreeMap<(String, String), u64> = history::largest_states(oldest)
        .into_iter()
        .map(|s| ((s.operator, s.state), s.usage.bytes))
        .collect();
    let _ = writeln!(
        out,
        "<section id=\"largest\"><h2>Largest states in cp-{}</h2>\
         <table id=\"largest-states\" data-checkpoint=\"{}\"><thead><tr><th>Operator</th>\
         <th>State</th><th>Files</th><th>Bytes</th><th>New</th><th>Shared</th>\
         <th>Exclusive</th><th>In cp-{}</th></tr></thead><tbody>",
        newest.id, newest.id, oldest.id
    );
    // The names Flink gave the operators (where it did), by their directory.
    let names = newest.flink.as_ref().map(|f| &f.operators);
    for s in history::largest_states(newest).iter().take(LARGEST_STATES) {
        let was = before
            .get(&(s.operator.clone(), s.state.clone()))
            .copied()
            .unwrap_or(0);
        let name = names.and_then(|n| n.get(&s.operator));
        let (name_attr, shown) = match name {
            Some(name) if *name != s.operator => (
                format!(" data-operator-name=\"{}\"", escape(name)),
                format!(
                    "{} <span class=\"uid\">({})</span>",
                    escape(name),
                    escape(&s.operator)
                ),
            ),
            _ => (String::new(), escape(&s.operator)),
        };
        let _ = writeln!(
            out,
            "<tr data-operator=\"{o}\"{name_attr} data-state=\"{st}\" {} \
             data-oldest-bytes=\"{was}\"><td>{shown}</td><td>{st}</td>{}<td>{}</td></tr>",
            usage_attrs(&s.usage),
            usage_cells(&s.usage),
            escape(&human_bytes(was)),
            o = escape(&s.operator),
            st = escape(&s.state),
        );
    }
    out.push_str("</tbody></table></section>\n");
}

/// The newest [`TABLE_CHECKPOINTS`] checkpoints, newest first.
fn checkpoints(out: &mut String, report: &DuReport, status: &EngineStatus) {
    let n = report.checkpoints.len();
    // Each checkpoint's phases, from its manifest.
    let took: std::collections::HashMap<u64, (u64, u64)> = status
        .checkpoints
        .iter()
        .rev()
        .take(TABLE_CHECKPOINTS)
        .map(|m| (m.id, (m.stats.sync_micros, m.stats.async_micros)))
        .collect();
    let _ = writeln!(
        out,
        "<section id=\"checkpoints\"><h2>Checkpoints</h2>{}\
         <table id=\"checkpoint-table\"><thead><tr><th>Checkpoint</th><th>Completed</th>\
         <th>Flink</th><th>Took (sync + async)</th><th>Files</th><th>Bytes</th><th>New</th>\
         <th>Shared</th><th>Exclusive</th></tr></thead><tbody>",
        if n > TABLE_CHECKPOINTS {
            format!(
                "<p>The newest {TABLE_CHECKPOINTS} of {n}; the plot shows all of them, \
                 <code>ckptfs du</code> lists them.</p>"
            )
        } else {
            String::new()
        }
    );
    for c in report.checkpoints.iter().rev().take(TABLE_CHECKPOINTS) {
        let (flink_attrs, flink) = match &c.flink {
            Some(f) => (
                format!(
                    " data-flink-job=\"{}\" data-flink-checkpoint=\"{}\"",
                    escape(&f.job),
                    f.checkpoint
                ),
                format!("{} / {}", escape(&f.job), f.checkpoint),
            ),
            None => (String::new(), String::new()),
        };
        let (sync, asyn) = took.get(&c.id).copied().unwrap_or((0, 0));
        let _ = writeln!(
            out,
            "<tr data-id=\"{id}\" {} data-sync-us=\"{sync}\" data-async-us=\"{asyn}\"{flink_attrs}>\
             <td>cp-{id}</td><td>{}</td><td>{flink}</td><td>{} ({} + {})</td>{}</tr>",
            usage_attrs(&c.total),
            when(c.completed_unix_ms),
            human_ms((sync + asyn) as f64 / 1000.0),
            human_ms(sync as f64 / 1000.0),
            human_ms(asyn as f64 / 1000.0),
            usage_cells(&c.total),
            id = c.id,
        );
    }
    out.push_str("</tbody></table></section>\n");
}

const STYLE: &str = "body{font-family:sans-serif;margin:1.5em auto;max-width:1000px;\
color:#222;padding:0 1em}h1{margin:0 0 .2em}h2{font-size:1.15em;margin:1.4em 0 .5em}\
code{font-size:.95em}dl{display:grid;grid-template-columns:max-content auto;gap:.2em 1em}\
dt{color:#666}dd{margin:0}table{border-collapse:collapse;width:100%;font-size:.9em}\
th,td{text-align:right;padding:.2em .5em;border-bottom:1px solid #e4e4e4}\
th:first-child,td:first-child,#largest-states td:nth-child(2),\
#largest-states th:nth-child(2),#checkpoint-table td:nth-child(3),\
#checkpoint-table th:nth-child(3){text-align:left}\
.error pre{background:#fdecea;color:#8a1c10;padding:.6em;white-space:pre-wrap}\
.age,.uid{color:#777}.lagging{color:#8a1c10}.pin code{font-weight:bold}\
svg{max-width:100%;height:auto}footer{margin-top:2em;color:#888;font-size:.85em}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_leaves_no_markup() {
        assert_eq!(
            escape("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
        assert_eq!(human_bytes(812), "812 B");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
    }

    #[test]
    fn ages_and_durations_read_as_people_say_them() {
        let now = 1_700_000_000_000;
        assert_eq!(ago(now, now - 400), "just now");
        assert_eq!(ago(now, now - 42_000), "42 s ago");
        assert_eq!(ago(now, now - 180_000), "3 min ago");
        assert_eq!(ago(now, now - 5 * 3_600_000), "5 h ago");
        assert_eq!(ago(now, now - 12 * 86_400_000), "12 d ago");
        assert_eq!(ago(now, now + 60_000), "in the future");
        assert_eq!(human_ms(0.44), "0.4 ms");
        assert_eq!(human_ms(12.3), "12 ms");
        assert_eq!(human_ms(1_400.0), "1.4 s");
        assert_eq!(human_ms(185_000.0), "3 min 5 s");
    }
}
