//! What a store holds, read through a mount or from the store directly: `ls` (the
//! retained checkpoints), `status` (the daemon's or the store's), `graph` (checkpoints and
//! the objects they reference), `du` (what each checkpoint holds, adds and shares).

use std::io::Write;
use std::path::Path;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, UNIX_EPOCH};

use ckptfs::units::human_bytes;
use ckptfs_core::error::Error;
use ckptfs_core::store::Location;
use ckptfs_core::views::{CheckpointRow, Status, StoreStatus};

use crate::client::{read_checkpoints, read_status, served_status, store_checkpoints, Target};

/// A time of the status files, as RFC 3339.
pub fn when(ms: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// The retained checkpoints, a table or JSON.
pub fn ls(path: &Path, json: bool) -> Result<ExitCode, Error> {
    // A serving daemon's view, through its socket; else a mount's, or the store's.
    let (checkpoints, external) = if let Some(status) = served_status(path)? {
        (status.checkpoints, status.external)
    } else {
        match Target::of(path)? {
            Target::Mount(mountpoint) => (
                read_checkpoints(&mountpoint)?,
                read_status(&mountpoint)?.external,
            ),
            Target::Store(location) => {
                let (repo, manifests) = store_checkpoints(&location)?;
                let external = repo
                    .catalog
                    .load_meta()?
                    .map(|m| m.external.iter().map(|b| b.to_string()).collect())
                    .unwrap_or_default();
                (manifests.iter().map(CheckpointRow::of).collect(), external)
            }
        }
    };
    if json {
        let text = serde_json::to_string(&checkpoints)
            .map_err(|e| Error::Invalid(format!("cannot write the list as JSON: {e}")))?;
        println!("{text}");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:>6}  {:<20}  {:>6}  {:>10}  {:>10}  {:>9}  {:>9}  FLINK",
        "ID", "COMPLETED", "FILES", "BYTES", "UPLOADED", "SYNC_MS", "ASYNC_MS"
    );
    for c in checkpoints {
        println!(
            "{:>6}  {:<20}  {:>6}  {:>10}  {:>10}  {:>9.1}  {:>9.1}  {}",
            c.id,
            when(c.completed_unix_ms),
            c.files,
            human_bytes(c.bytes),
            human_bytes(c.bytes_uploaded),
            c.sync_ms,
            c.async_ms,
            flink_name(c.flink.as_ref()),
        );
    }
    if !external.is_empty() {
        println!("external backends (imported): {}", external.join(", "));
    }
    Ok(ExitCode::SUCCESS)
}

/// The FLINK column of `ls`: the job id's first 8 characters, `…` if it is longer, and
/// Flink's checkpoint (`a312c903…/chk-6`, as `flink/<job>/chk-6` in the mount); `-` for a
/// checkpoint not imported from Flink.
pub fn flink_name(label: Option<&ckptfs_core::catalog::FlinkLabel>) -> String {
    let Some(label) = label else {
        return "-".into();
    };
    let short: String = label.job.chars().take(8).collect();
    let more = if label.job.chars().count() > 8 {
        "…"
    } else {
        ""
    };
    format!("{short}{more}/chk-{}", label.checkpoint)
}

/// `status` of a store without a daemon: its settings, checkpoints, size and, on object
/// storage, who holds its lease.
fn store_status(location: &Location) -> Result<StoreStatus, Error> {
    let (repo, manifests) = store_checkpoints(location)?;
    let meta = repo.catalog.load_meta()?;
    let lease = ckptfs_core::lease::holder(repo.records.as_ref())?;
    Ok(StoreStatus::build(
        location,
        meta.as_ref(),
        &manifests,
        lease,
    ))
}

/// Runs of consecutive ids as text: "1-9999 10001".
fn runs_text(runs: &[[u64; 2]]) -> String {
    runs.iter()
        .map(|[a, b]| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The daemon's status (a mount, or a serving daemon through its socket) or the store's
/// (read directly).
pub fn status(path: &Path, json: bool) -> Result<ExitCode, Error> {
    if let Some(status) = served_status(path)? {
        if json {
            print!("{}", ckptfs_core::views::to_pretty_text(&status));
        } else {
            print_daemon_status(&status);
        }
        return Ok(ExitCode::SUCCESS);
    }
    match Target::of(path)? {
        Target::Mount(mountpoint) => {
            let status = read_status(&mountpoint)?;
            if json {
                print!("{}", ckptfs_core::views::to_pretty_text(&status));
            } else {
                print_daemon_status(&status);
            }
        }
        Target::Store(location) => {
            let status = store_status(&location)?;
            if json {
                print!("{}", ckptfs_core::views::to_pretty_text(&status));
            } else {
                print_store_status(&status);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Hosted backends, then the imported ones marked `(external)`.
fn backends_text(hosted: &[String], external: &[String]) -> String {
    hosted
        .iter()
        .cloned()
        .chain(external.iter().map(|b| format!("{b} (external)")))
        .collect::<Vec<_>>()
        .join(", ")
}

fn print_daemon_status(status: &Status) {
    println!("store:       {}", status.store);
    println!("daemon pid:  {}", status.pid);
    println!(
        "backends:    {}",
        backends_text(&status.backends, &status.external)
    );
    println!(
        "checkpoints: {} ({} retained, retain {})",
        runs_text(&status.checkpoint_runs),
        status.checkpoints_total,
        status.retain
    );
    print_policy(Some(&status.policy), &status.pins);
    println!(
        "in flight:   {}",
        serde_json::to_string(&status.in_flight).unwrap_or_default()
    );
    println!(
        "store size:  {} ({} bytes) in {} objects",
        human_bytes(status.store_bytes),
        status.store_bytes,
        status.objects
    );
    if let Some(e) = &status.last_error {
        println!("last error:  {e}");
    }
}

fn print_store_status(status: &StoreStatus) {
    println!("store:       {}", status.store);
    let now = std::time::SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    match &status.lease {
        Some(lease) if lease.expires_unix_ms > now => println!(
            "writer:      {} (lease until {})",
            lease.holder,
            when(lease.expires_unix_ms)
        ),
        _ => println!("writer:      none (read directly from the store)"),
    }
    println!(
        "backends:    {}",
        backends_text(
            status.backends.as_deref().unwrap_or_default(),
            &status.external
        )
    );
    println!(
        "checkpoints: {} ({} retained, retain {})",
        runs_text(&status.checkpoint_runs),
        status.checkpoints_total,
        status
            .retain
            .map_or_else(|| "unknown".to_string(), |r| r.to_string())
    );
    print_policy(status.policy.as_ref(), &status.pins);
    println!(
        "store size:  {} ({} bytes) in {} objects",
        human_bytes(status.store_bytes),
        status.store_bytes,
        status.objects
    );
}

/// The retention policy (as `mount` takes it) and the pins, when known.
fn print_policy(rules: Option<&Vec<String>>, pins: &std::collections::BTreeMap<String, u64>) {
    if let Some(policy) = rules
        .and_then(|r| ckptfs_core::policy::Policy::from_rules(r.iter().map(String::as_str)).ok())
    {
        println!("policy:      {policy}");
    }
    if !pins.is_empty() {
        let shown: Vec<String> = pins
            .iter()
            .map(|(name, id)| format!("{name} -> cp-{id}"))
            .collect();
        println!("pins:        {}", shown.join(", "));
    }
}

/// The checkpoints and their objects as Graphviz source, or drawn as SVG by `dot`.
pub fn graph(path: &Path, format: Option<&str>) -> Result<ExitCode, Error> {
    let store = Target::of(path)?.store()?;
    let manifests = store_checkpoints(&store)?.1;
    let dot = ckptfs_core::commands::graph::dot(&manifests);
    let have_dot = std::process::Command::new("dot")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let svg =
        match format {
            Some("svg") if !have_dot => return Err(Error::NotFound(
                "Graphviz `dot` is not installed (apt-get install graphviz), or use --format dot"
                    .into(),
            )),
            Some("svg") => true,
            Some(_) => false,
            None => have_dot,
        };
    if !svg {
        print!("{dot}");
        return Ok(ExitCode::SUCCESS);
    }
    let mut child = std::process::Command::new("dot")
        .arg("-Tsvg")
        .stdin(Stdio::piped())
        .stdout(Stdio::inherit())
        .spawn()
        .map_err(|e| Error::io("run dot", e))?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(dot.as_bytes())
        .map_err(|e| Error::io("write to dot", e))?;
    let status = child.wait().map_err(|e| Error::io("wait for dot", e))?;
    if !status.success() {
        return Err(Error::Invalid(format!("dot failed: {status}")));
    }
    Ok(ExitCode::SUCCESS)
}

/// A backend as the tables show it: `<operator>/<subtask>`, and the operator's name in
/// parentheses when known (its control characters escaped: it comes from a `_metadata`).
pub fn backend_text(backend: &str, name: Option<&str>) -> String {
    match name {
        Some(name) => format!("{backend} ({})", printable(name)),
        None => backend.to_string(),
    }
}

/// `text` with its control characters escaped (`\n`, `\u{1b}`), for a terminal.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Per checkpoint (or checkpoint `id` alone), its backends' files and bytes and what of
/// them is new, shared or exclusive, and the same per state under each backend (indented):
/// a table or JSON.
pub fn du(path: &Path, id: Option<u64>, json: bool) -> Result<ExitCode, Error> {
    let store = Target::of(path)?.store()?;
    let manifests = store_checkpoints(&store)?.1;
    let report = ckptfs_core::commands::du::usage(&manifests, id).ok_or_else(|| {
        Error::NotFound(format!(
            "no checkpoint {} in {store}",
            id.unwrap_or_default()
        ))
    })?;
    if json {
        let text = serde_json::to_string(&report)
            .map_err(|e| Error::Invalid(format!("cannot write the report as JSON: {e}")))?;
        println!("{text}");
        return Ok(ExitCode::SUCCESS);
    }
    let width = report
        .checkpoints
        .iter()
        .flat_map(|c| c.backends.iter())
        .flat_map(|b| {
            std::iter::once(backend_text(&b.backend, b.name.as_deref()).chars().count())
                .chain(b.states.iter().map(|s| s.state.chars().count() + 2))
        })
        .chain(report.checkpoints.iter().flat_map(|c| {
            c.operators.iter().map(|o| {
                "operator ".len() + backend_text(&o.operator, o.name.as_deref()).chars().count()
            })
        }))
        .chain(["BACKEND".len(), "total".len()])
        .max()
        .unwrap_or(0);
    let row = |name: &str, u: &ckptfs_core::commands::du::Usage| {
        // Padded by characters: a state's name may be any UTF-8.
        let pad = " ".repeat(width.saturating_sub(name.chars().count()));
        println!(
            "  {name}{pad}  {:>6}  {:>10}  {:>10}  {:>10}  {:>10}",
            u.files,
            human_bytes(u.bytes),
            human_bytes(u.new),
            human_bytes(u.shared),
            human_bytes(u.exclusive)
        );
    };
    for (n, c) in report.checkpoints.iter().enumerate() {
        if n > 0 {
            println!();
        }
        let label = c.flink.as_ref().map_or_else(String::new, |f| {
            format!("  flink job {} checkpoint {}", f.job, f.checkpoint)
        });
        println!("cp-{}  {}{label}", c.id, when(c.completed_unix_ms));
        println!(
            "  {:<width$}  {:>6}  {:>10}  {:>10}  {:>10}  {:>10}",
            "BACKEND", "FILES", "BYTES", "NEW", "SHARED", "EXCLUSIVE"
        );
        for b in &c.backends {
            row(&backend_text(&b.backend, b.name.as_deref()), &b.usage);
            for s in &b.states {
                row(&format!("  {}", s.state), &s.usage);
            }
        }
        for o in &c.operators {
            row(
                &format!("operator {}", backend_text(&o.operator, o.name.as_deref())),
                &o.usage,
            );
        }
        row("total", &c.total);
    }
    Ok(ExitCode::SUCCESS)
}

/// A short key for the `n`th operator of the history table's legend: A, B, ..., Z, AA, ...
fn operator_key(mut n: usize) -> String {
    let mut key = Vec::new();
    loop {
        key.push(b'A' + (n % 26) as u8);
        if n < 26 {
            break;
        }
        n = n / 26 - 1;
    }
    key.reverse();
    String::from_utf8(key).unwrap_or_default()
}

/// `du --history` and `du --svg FILE`: each operator's and state's figures over the
/// retained checkpoints (a table, or JSON), and/or the same drawn to FILE.
///
/// The table has one row per checkpoint and one column per operator and state (bytes),
/// keyed by a legend above it: a history grows to thousands of checkpoints, which read
/// down a terminal (and through `tail`) but not across it, while a job has a handful of
/// operators and states, whose names (32-hex operator ids) would not fit a column head.
pub fn du_history(
    path: &Path,
    print: bool,
    json: bool,
    svg: Option<&Path>,
) -> Result<ExitCode, Error> {
    use ckptfs_core::commands::{du, history};
    let store = Target::of(path)?.store()?;
    let manifests = store_checkpoints(&store)?.1;
    let report = du::usage(&manifests, None).unwrap_or(du::DuReport {
        checkpoints: Vec::new(),
    });
    let history = history::history(&report);
    if let Some(file) = svg {
        std::fs::write(file, ckptfs::page::plot::svg_file(&history))
            .map_err(|e| Error::io(format!("write {}", file.display()), e))?;
    }
    if !print {
        return Ok(ExitCode::SUCCESS);
    }
    if json {
        let text = serde_json::to_string(&history)
            .map_err(|e| Error::Invalid(format!("cannot write the history as JSON: {e}")))?;
        println!("{text}");
        return Ok(ExitCode::SUCCESS);
    }
    // The columns: (key, values), an operator followed by its states.
    let mut columns: Vec<(String, Vec<u64>)> = Vec::new();
    println!("Size of each operator (all its subtasks) and state, by column:");
    for (k, op) in history.operators.iter().enumerate() {
        let key = operator_key(k);
        println!("  {key:<5} {}", op.operator);
        columns.push((key.clone(), op.usage.iter().map(|u| u.bytes).collect()));
        for (n, s) in history
            .states
            .iter()
            .filter(|s| s.operator == op.operator)
            .enumerate()
        {
            let state_key = format!("{key}{}", n + 1);
            println!("  {state_key:<5}   {}", s.state);
            columns.push((state_key, s.usage.iter().map(|u| u.bytes).collect()));
        }
    }
    println!();
    let widths: Vec<usize> = columns
        .iter()
        .map(|(key, values)| {
            values
                .iter()
                .map(|v| human_bytes(*v).len())
                .chain([key.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut head = format!(
        "{:>6}  {:<20}  {:>10}  {:>10}  {:>10}",
        "ID", "COMPLETED", "BYTES", "NEW", "SHARED"
    );
    for ((key, _), w) in columns.iter().zip(&widths) {
        head.push_str(&format!("  {key:>w$}"));
    }
    println!("{head}");
    for (i, c) in history.checkpoints.iter().enumerate() {
        let mut line = format!(
            "{:>6}  {:<20}  {:>10}  {:>10}  {:>10}",
            c.id,
            when(c.completed_unix_ms),
            human_bytes(c.total.bytes),
            human_bytes(c.total.new),
            human_bytes(c.total.shared)
        );
        for ((_, values), w) in columns.iter().zip(&widths) {
            line.push_str(&format!("  {:>w$}", human_bytes(values[i])));
        }
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}
