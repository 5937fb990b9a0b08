//! `ckptfs graph`: the checkpoints and the stored objects they reference, with reference
//! counts, as Graphviz DOT (the worked example's figure, drawn from a live store).

use std::fmt::Write;

use crate::catalog::history::object_histories;
use crate::catalog::Manifest;

fn escape(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"")
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

/// One node per checkpoint and per stored object; an edge for every reference. Object
/// labels carry the file names they appear as, their size and reference count.
pub fn dot(manifests: &[Manifest]) -> String {
    let objects = object_histories(manifests);
    let mut out = String::new();
    out.push_str(
        "digraph ckptfs {\n  rankdir=LR;\n  node [fontname=\"monospace\", fontsize=10];\n",
    );
    for m in manifests {
        let _ = writeln!(
            out,
            "  \"cp-{id}\" [shape=box, style=filled, fillcolor=\"#dde8ff\", label=\"cp-{id}\\n{files} files, {bytes}\"];",
            id = m.id,
            files = m.stats.files_total,
            bytes = human(m.stats.bytes_total)
        );
    }
    for (id, o) in &objects {
        if !o.list_of.is_empty() {
            // A file list: a small note beside the checkpoints that name it.
            let names: Vec<String> = o
                .list_of
                .iter()
                .map(|b| escape(&format!("{b} file list")))
                .collect();
            let _ = writeln!(
                out,
                "  \"{hex}\" [shape=note, style=filled, fillcolor=\"#fff4d6\", label=\"{shown}\\n{short}\\nrefs={refs}\"];",
                hex = id.to_hex(),
                shown = names.join("\\n"),
                short = id.short(),
                refs = o.count
            );
            continue;
        }
        let names: Vec<String> = o
            .files
            .iter()
            .map(|(b, f)| escape(&format!("{b}/{f}")))
            .collect();
        let shown = if names.len() > 3 {
            format!("{}\\n(+{} more)", names[..3].join("\\n"), names.len() - 3)
        } else {
            names.join("\\n")
        };
        // SST files (shared across checkpoints) in green, private files in grey.
        let sst = o
            .files
            .iter()
            .any(|(_, f)| crate::backend::is_shared_file(f));
        let _ = writeln!(
            out,
            "  \"{hex}\" [shape=ellipse, style=filled, fillcolor=\"{color}\", label=\"{shown}\\n{short} {size}\\nrefs={refs}\"];",
            hex = id.to_hex(),
            color = if sst { "#dff0d8" } else { "#eeeeee" },
            shown = shown,
            short = id.short(),
            size = human(o.size.unwrap_or(0)),
            refs = o.count
        );
    }
    for m in manifests {
        for id in m.objects() {
            let _ = writeln!(out, "  \"cp-{}\" -> \"{}\";", m.id, id.to_hex());
        }
    }
    out.push_str("}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{BackendSnapshot, CheckpointStats, FileEntry, FORMAT};
    use crate::store::ObjectId;

    fn manifest(id: u64, files: &[(&str, &str)]) -> Manifest {
        Manifest {
            format: FORMAT,
            id,
            started_unix_ms: 0,
            completed_unix_ms: 0,
            backends: vec![BackendSnapshot::inline(
                "Operator-2/1".parse().unwrap(),
                "l".into(),
                files
                    .iter()
                    .map(|(name, content)| FileEntry {
                        name: name.to_string(),
                        object: ObjectId::from_hash(blake3::hash(content.as_bytes())),
                        size: content.len() as u64,
                        chunks: None,
                        source: None,
                        column_family: None,
                    })
                    .collect(),
            )],
            stats: CheckpointStats::default(),
            flink: None,
        }
    }

    #[test]
    fn edges_and_counts_match_the_manifests() {
        let ms = vec![
            manifest(
                3,
                &[
                    ("000012.sst", "s123"),
                    ("000009.sst", "s4"),
                    ("000010.sst", "s5"),
                ],
            ),
            manifest(4, &[("000012.sst", "s123"), ("000015.sst", "s456")]),
        ];
        let text = dot(&ms);
        assert_eq!(text.matches(" -> ").count(), 5);
        assert_eq!(text.matches("refs=2").count(), 1);
        assert_eq!(text.matches("refs=1").count(), 3);
        assert!(text.contains("\"cp-3\" [shape=box"));
        assert!(text.contains("Operator-2/1/000012.sst"));
        assert!(!text.contains("\\\\n"), "a line break was escaped: {text}");
        let shared = dot(&[manifest(5, &[("000012.sst", "x")]), {
            let mut m = manifest(6, &[("000012.sst", "x")]);
            m.backends[0].name = "Operator-2/2".parse().unwrap();
            m
        }]);
        assert!(
            shared.contains("Operator-2/1/000012.sst\\nOperator-2/2/000012.sst"),
            "{shared}"
        );
    }
}
