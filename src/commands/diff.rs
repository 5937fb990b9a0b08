//! `ckptfs diff`: what changed between two checkpoints, as a table or one JSON document
//! (the types of `ckptfs_core::commands::diff`).

use std::path::Path;
use std::process::ExitCode;

use ckptfs::units::human_bytes;
use ckptfs_core::commands::diff::keys::{self, BackendKeys, Change, KeyComparison};
use ckptfs_core::commands::diff::{self as core_diff, DiffReport, Figures, Presence, Side};
use ckptfs_core::error::Error;

use super::show::{backend_text, printable, when};
use crate::client::{progress, store_checkpoints, Target};

/// Compare checkpoints `a` and `b` of the store at (or behind) `path`; with `keys`, their
/// keys too, listing at most that many changes per backend and column family.
pub fn diff(
    path: &Path,
    a: u64,
    b: u64,
    json: bool,
    keys: Option<usize>,
) -> Result<ExitCode, Error> {
    let store = Target::of(path)?.store()?;
    let (repo, manifests) = store_checkpoints(&store)?;
    let shown = store.to_string();
    let (ma, mb) = (
        core_diff::find(&manifests, a, &shown)?,
        core_diff::find(&manifests, b, &shown)?,
    );
    let mut report = core_diff::compare(ma, mb);
    if let Some(limit) = keys {
        let spinner = progress::spinner(&format!(
            "comparing the keys of cp-{a} and cp-{b} (each backend's files restored and read)"
        ));
        keys::compare(
            repo.objects.as_ref(),
            ma,
            mb,
            &mut report,
            limit,
            &std::env::temp_dir(),
        )?;
        spinner.finish_and_clear();
    }
    if json {
        let text = serde_json::to_string(&report)
            .map_err(|e| Error::Invalid(format!("cannot write the report as JSON: {e}")))?;
        println!("{text}");
    } else {
        print_table(&report);
    }
    Ok(ExitCode::SUCCESS)
}

fn side_text(side: &Side) -> String {
    let label = side.flink.as_ref().map_or_else(String::new, |f| {
        format!(" (flink job {} checkpoint {})", f.job, f.checkpoint)
    });
    format!("cp-{} {}{label}", side.id, when(side.completed_unix_ms))
}

fn print_table(report: &DiffReport) {
    println!("from {}", side_text(&report.a));
    println!("to   {}", side_text(&report.b));
    let names: Vec<String> = report
        .backends
        .iter()
        .map(|d| {
            let where_ = match d.presence {
                Presence::Both => "",
                Presence::OnlyA => " [only in A]",
                Presence::OnlyB => " [only in B]",
            };
            format!("{}{where_}", backend_text(&d.backend, d.name.as_deref()))
        })
        .collect();
    let width = names
        .iter()
        .map(|n| n.chars().count())
        .chain(report.backends.iter().flat_map(|d| {
            d.states
                .iter()
                .map(|s| printable(&s.state).chars().count() + 2)
        }))
        .chain(["BACKEND".len(), "total".len()])
        .max()
        .unwrap_or(0);
    let row = |name: &str, f: &Figures| {
        let pad = " ".repeat(width.saturating_sub(name.chars().count()));
        println!(
            "  {name}{pad}  {:>6} {:>10}  {:>7} {:>10}  {:>7} {:>10} {:>10}  {:>6} {:>10}",
            f.files_added,
            human_bytes(f.bytes_added),
            f.files_removed,
            human_bytes(f.bytes_removed),
            f.files_changed,
            human_bytes(f.bytes_changed_a),
            human_bytes(f.bytes_changed_b),
            f.files_unchanged,
            human_bytes(f.bytes_unchanged),
        );
    };
    println!(
        "  {:<width$}  {:>6} {:>10}  {:>7} {:>10}  {:>7} {:>10} {:>10}  {:>6} {:>10}",
        "BACKEND",
        "ADDED",
        "BYTES",
        "REMOVED",
        "BYTES",
        "CHANGED",
        "BYTES_A",
        "BYTES_B",
        "SAME",
        "BYTES"
    );
    for (d, name) in report.backends.iter().zip(&names) {
        row(name, &d.figures);
        for s in &d.states {
            row(&format!("  {}", printable(&s.state)), &s.figures);
            for f in &s.added {
                println!("      + {} ({})", f.name, human_bytes(f.bytes));
            }
            for f in &s.removed {
                println!("      - {} ({})", f.name, human_bytes(f.bytes));
            }
            for f in &s.changed {
                println!(
                    "      ~ {} ({} -> {})",
                    f.name,
                    human_bytes(f.bytes_a),
                    human_bytes(f.bytes_b)
                );
            }
        }
        if let Some(k) = &d.keys {
            print_keys(k);
        }
    }
    row("total", &report.total);
}

/// Bytes of a value the table shows (the JSON has up to [`keys::VALUE_SHOWN`]).
const TABLE_VALUE_BYTES: usize = 32;

/// The start of `escaped` (as [`keys::escape`] writes bytes) that stands for at most `max`
/// bytes, never cutting an escape, and how many bytes it stands for.
fn first_bytes(escaped: &str, max: usize) -> (&str, usize) {
    let text = escaped.as_bytes();
    let (mut at, mut bytes) = (0, 0);
    while at < text.len() && bytes < max {
        at += match (text[at], text.get(at + 1)) {
            (b'\\', Some(b'x')) => 4,
            (b'\\', _) => 2,
            _ => 1,
        };
        bytes += 1;
    }
    let at = at.min(text.len());
    (&escaped[..at], bytes)
}

fn print_keys(k: &BackendKeys) {
    match k.comparison {
        KeyComparison::SameFiles => println!("    keys: the same files, the same keys"),
        KeyComparison::NotRocksDb => println!("    keys: not a RocksDB directory, not compared"),
        KeyComparison::Iterated => {}
    }
    for cf in &k.column_families {
        println!(
            "    keys of {}: {} added, {} removed, {} changed, {} unchanged",
            printable(&cf.column_family),
            cf.added,
            cf.removed,
            cf.changed,
            cf.unchanged
        );
        for c in &cf.listed {
            let value = |v: &Option<String>, n: Option<u64>| {
                let v = v.as_deref().unwrap_or_default();
                let (cut, bytes) = first_bytes(v, TABLE_VALUE_BYTES);
                match n {
                    Some(n) if n as usize > bytes => format!("{cut}... ({n} bytes)"),
                    _ => cut.to_string(),
                }
            };
            match c.change {
                Change::Added => println!("      + {}  {}", c.key, value(&c.b, c.b_bytes)),
                Change::Removed => println!("      - {}  {}", c.key, value(&c.a, c.a_bytes)),
                Change::Changed => println!(
                    "      ~ {}  {} -> {}",
                    c.key,
                    value(&c.a, c.a_bytes),
                    value(&c.b, c.b_bytes)
                ),
            }
        }
        if !cf.listed_all {
            let more = cf.added + cf.removed + cf.changed - cf.listed.len() as u64;
            println!("      ... {more} more changes not listed (raise --limit)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_cut_between_escapes() {
        let escaped = keys::escape(b"ab\x00\ncd");
        assert_eq!(first_bytes(&escaped, 3), ("ab\\x00", 3));
        assert_eq!(first_bytes(&escaped, 4), ("ab\\x00\\n", 4));
        assert_eq!(first_bytes(&escaped, 99), (escaped.as_str(), 6));
    }
}
