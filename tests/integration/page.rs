//! The daemon's page (`--metrics-listen`'s `/`), `du --history` and `du --svg`, on the
//! real Flink job's checkpoints (tests/fixtures/flink/job1). The page is loaded by a real
//! browser (Debian's headless Chromium, which `scripts/env.sh` installs) from a live
//! daemon following the job; its figures are read out of the DOM Chromium built and
//! checked against `ckptfs du --json`, which tests/integration/du.rs checks against the
//! restored files. The SVG `du --svg` writes is read with an XML parser and its drawing
//! checked against the figures it says it draws. The per-operator Prometheus series
//! against du of the newest checkpoint.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use quick_xml::events::Event;
use serde_json::Value;

use crate::common::moto::free_port;
use crate::common::mounted::{ckptfs, ok, Mounted};
use crate::flink::fixture;

const JOB: &str = "a312c9034e3e0d2016dae60431b4c9dc";

/// One element of a document: its name, attributes and the text inside it.
#[derive(Debug, Clone)]
struct Element {
    name: String,
    attrs: BTreeMap<String, String>,
    text: String,
}

impl Element {
    fn attr(&self, name: &str) -> &str {
        self.attrs
            .get(name)
            .unwrap_or_else(|| panic!("no {name} in {self:?}"))
    }

    fn num(&self, name: &str) -> u64 {
        self.attr(name)
            .parse()
            .unwrap_or_else(|e| panic!("{name} of {self:?}: {e}"))
    }

    fn float(&self, name: &str) -> f64 {
        self.attr(name).parse().unwrap()
    }
}

/// HTML's void elements: never closed, so never open around text.
const VOID: &[&str] = &["meta", "br", "link", "img", "input", "hr", "wbr", "source"];

/// Every element of `doc`, in document order. `strict`: the document must be well-formed
/// XML (the SVG file); otherwise HTML as Chromium serializes its DOM.
fn elements(doc: &str, strict: bool) -> Vec<Element> {
    let mut reader = quick_xml::Reader::from_str(doc);
    reader.config_mut().check_end_names = strict;
    let mut out: Vec<Element> = Vec::new();
    let mut open: Vec<usize> = Vec::new();
    let text = |out: &mut Vec<Element>, open: &[usize], s: &str| {
        for i in open {
            out[*i].text.push_str(s);
        }
    };
    loop {
        match reader.read_event() {
            Err(e) => panic!(
                "not a well-formed document at {}: {e}",
                reader.buffer_position()
            ),
            Ok(Event::Eof) => break,
            Ok(ev @ (Event::Start(_) | Event::Empty(_))) => {
                let (e, empty) = match &ev {
                    Event::Start(e) => (e, false),
                    Event::Empty(e) => (e, true),
                    _ => unreachable!(),
                };
                let name = String::from_utf8(e.name().as_ref().to_vec()).unwrap();
                let attrs = e
                    .attributes()
                    .map(|a| {
                        let a = a.unwrap();
                        (
                            String::from_utf8(a.key.as_ref().to_vec()).unwrap(),
                            a.normalized_value(quick_xml::XmlVersion::Implicit1_0)
                                .unwrap()
                                .into_owned(),
                        )
                    })
                    .collect();
                // In HTML a void element never opens (in the SVG file, nothing is void).
                let opens = !empty && (strict || !VOID.contains(&name.as_str()));
                out.push(Element {
                    name,
                    attrs,
                    text: String::new(),
                });
                if opens {
                    open.push(out.len() - 1);
                }
            }
            Ok(Event::End(_)) => {
                open.pop();
            }
            Ok(Event::Text(t)) => text(&mut out, &open, &t.decode().unwrap()),
            Ok(Event::GeneralRef(r)) => {
                let name = r.decode().unwrap();
                let c = match name.as_ref() {
                    "lt" => "<".to_string(),
                    "gt" => ">".to_string(),
                    "amp" => "&".to_string(),
                    "quot" => "\"".to_string(),
                    "apos" | "#39" => "'".to_string(),
                    "nbsp" => "\u{a0}".to_string(),
                    other => panic!("entity {other}"),
                };
                text(&mut out, &open, &c);
            }
            Ok(_) => {}
        }
    }
    assert!(!strict || open.is_empty(), "unclosed elements");
    out
}

fn by_id<'a>(els: &'a [Element], id: &str) -> &'a Element {
    let found: Vec<&Element> = els
        .iter()
        .filter(|e| e.attrs.get("id").map(String::as_str) == Some(id))
        .collect();
    assert_eq!(found.len(), 1, "one #{id}");
    found[0]
}

/// The elements after `#id` named `name` with attribute `has`, up to the next element
/// with an id of its own at the same level: good enough for the rows of one table or the
/// shapes of one plot, since their own elements carry no id.
fn inside<'a>(els: &'a [Element], id: &str, name: &str, has: &str) -> Vec<&'a Element> {
    let at = els
        .iter()
        .position(|e| e.attrs.get("id").map(String::as_str) == Some(id))
        .unwrap_or_else(|| panic!("no #{id}"));
    els[at + 1..]
        .iter()
        .take_while(|e| !e.attrs.contains_key("id"))
        .filter(|e| e.name == name && e.attrs.contains_key(has))
        .collect()
}

/// `chromium --headless` with the flags this machine's closed network needs, and a
/// profile of its own; its stdout.
fn chromium(args: &[&str], url: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new("timeout")
        .arg("120")
        .arg("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(url)
        .output()
        .expect("run chromium (scripts/env.sh installs Debian's chromium)");
    assert!(
        out.status.success(),
        "chromium {args:?} {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn json_of(args: &[&str]) -> Value {
    serde_json::from_str(&ok(ckptfs(args))).unwrap()
}

/// What `du --history` must say of each operator and state, computed from `du --json`:
/// per checkpoint, the sums over the operator's subtasks (zeros where it is absent).
fn sums_by_operator(du: &Value) -> BTreeMap<(String, Option<String>), Vec<[u64; 5]>> {
    let checkpoints = du["checkpoints"].as_array().unwrap();
    let mut out: BTreeMap<(String, Option<String>), Vec<[u64; 5]>> = BTreeMap::new();
    let fields = |v: &Value| -> [u64; 5] {
        ["files", "bytes", "new", "shared", "exclusive"].map(|f| v[f].as_u64().unwrap())
    };
    for (i, c) in checkpoints.iter().enumerate() {
        for b in c["backends"].as_array().unwrap() {
            let (op, _) = b["backend"].as_str().unwrap().rsplit_once('/').unwrap();
            let mut add = |key: (String, Option<String>), v: [u64; 5]| {
                let row = out
                    .entry(key)
                    .or_insert_with(|| vec![[0; 5]; checkpoints.len()]);
                for (r, x) in row[i].iter_mut().zip(v) {
                    *r += x;
                }
            };
            add((op.to_string(), None), fields(b));
            for s in b["states"].as_array().unwrap() {
                add(
                    (
                        op.to_string(),
                        Some(s["state"].as_str().unwrap().to_string()),
                    ),
                    fields(s),
                );
            }
        }
    }
    out
}

fn usage_row(v: &Value) -> [u64; 5] {
    ["files", "bytes", "new", "shared", "exclusive"].map(|f| v[f].as_u64().unwrap())
}

/// The plot's drawing against its figures: each checkpoint's bars (`stored-plot`) and
/// each state's area (`states-plot`, stacked in document order) drawn at the scale the
/// plot states; returns the figures: checkpoint id -> (new, shared), and (operator,
/// state) -> bytes per checkpoint.
#[allow(clippy::type_complexity)]
fn check_plot(
    els: &[Element],
) -> (
    BTreeMap<u64, (u64, u64)>,
    BTreeMap<(String, String), Vec<u64>>,
) {
    let stored = by_id(els, "stored-plot");
    let (base, per_px) = (
        stored.float("data-base-y"),
        stored.float("data-bytes-per-px"),
    );
    let mut bars = BTreeMap::new();
    let groups = inside(els, "stored-plot", "g", "data-new");
    // A time x axis: each checkpoint drawn where its time is, at the scale the plot says,
    // its time never before the one of the checkpoint before it.
    let (x0, t0, px_per_ms) = (
        stored.float("data-x0"),
        stored.num("data-t0-ms"),
        stored.float("data-px-per-ms"),
    );
    let mut previous = 0;
    for g in &groups {
        let t = g.num("data-time-ms");
        assert!(t >= previous, "{g:?}");
        previous = t;
        if px_per_ms > 0.0 {
            let want = x0 + (t - t0) as f64 * px_per_ms;
            assert!((g.float("data-x") - want).abs() < 0.01, "{g:?}: {want}");
        }
    }
    let rects = inside(els, "stored-plot", "rect", "class");
    assert_eq!(rects.len(), 2 * groups.len());
    for (g, pair) in groups.iter().zip(rects.chunks(2)) {
        let (new, shared) = (g.num("data-new"), g.num("data-shared"));
        let (s, n) = (pair[0], pair[1]);
        assert_eq!((s.attr("class"), n.attr("class")), ("shared", "new"));
        let close = |a: f64, b: f64| (a - b).abs() < 0.02;
        assert!(close(s.float("height"), shared as f64 / per_px), "{s:?}");
        assert!(close(n.float("height"), new as f64 / per_px), "{n:?}");
        assert!(close(s.float("y") + s.float("height"), base), "{s:?}");
        assert!(
            close(n.float("y") + n.float("height"), s.float("y")),
            "{n:?}"
        );
        assert!(base - n.float("y") <= stored.float("data-base-y"));
        bars.insert(g.num("data-id"), (new, shared));
    }
    let states = by_id(els, "states-plot");
    let (base, per_px) = (
        states.float("data-base-y"),
        states.float("data-bytes-per-px"),
    );
    let paths = inside(els, "states-plot", "path", "data-bytes");
    let n = bars.len();
    let mut below = vec![0u64; n];
    let mut areas = BTreeMap::new();
    for p in paths {
        let bytes: Vec<u64> = p
            .attr("data-bytes")
            .split(' ')
            .map(|v| v.parse().unwrap())
            .collect();
        assert_eq!(bytes.len(), n);
        // M(left) then one point per checkpoint on the top edge.
        let ys: Vec<f64> = p
            .attr("d")
            .split(' ')
            .filter(|t| t.starts_with('M') || t.starts_with('L'))
            .map(|t| t[1..].split_once(',').unwrap().1.parse().unwrap())
            .collect();
        assert_eq!(ys.len(), 2 * (n + 2), "{p:?}");
        for i in 0..n {
            let top = below[i] + bytes[i];
            let want = base - top as f64 / per_px;
            assert!((ys[1 + i] - want).abs() < 0.01, "{p:?} at {i}: {want}");
            let bottom = base - below[i] as f64 / per_px;
            assert!((ys[2 * n + 2 - i] - bottom).abs() < 0.01, "{p:?} at {i}");
            below[i] = top;
        }
        areas.insert(
            (
                p.attr("data-operator").to_string(),
                p.attr("data-state").to_string(),
            ),
            bytes,
        );
    }
    (bars, areas)
}

/// The plot's figures against `du --history --json`.
fn check_plot_figures(els: &[Element], history: &Value) {
    let (bars, areas) = check_plot(els);
    let checkpoints = history["checkpoints"].as_array().unwrap();
    let want_bars: BTreeMap<u64, (u64, u64)> = checkpoints
        .iter()
        .map(|c| {
            (
                c["id"].as_u64().unwrap(),
                (
                    c["total"]["new"].as_u64().unwrap(),
                    c["total"]["shared"].as_u64().unwrap(),
                ),
            )
        })
        .collect();
    assert_eq!(bars, want_bars);
    let want_areas: BTreeMap<(String, String), Vec<u64>> = history["states"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                (
                    s["operator"].as_str().unwrap().to_string(),
                    s["state"].as_str().unwrap().to_string(),
                ),
                s["usage"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|u| u["bytes"].as_u64().unwrap())
                    .collect(),
            )
        })
        .collect();
    assert!(
        want_areas.len() <= 24,
        "the fixture draws every state apart"
    );
    assert_eq!(areas, want_areas);
}

/// `du --history --json` is `du --json` per checkpoint, summed per operator and state;
/// the table says the same; `du --svg` writes a well-formed SVG drawing those figures.
#[test]
fn du_history_and_svg_match_du_per_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    ok(ckptfs(&["import-flink", fixture().to_str().unwrap(), s]));
    let du = json_of(&["du", s, "--json"]);
    let history = json_of(&["du", s, "--history", "--json"]);
    let checkpoints = du["checkpoints"].as_array().unwrap();
    assert_eq!(checkpoints.len(), 3);
    for (c, h) in checkpoints
        .iter()
        .zip(history["checkpoints"].as_array().unwrap())
    {
        for field in ["id", "completed_unix_ms", "flink", "total"] {
            assert_eq!(c[field], h[field], "{field}");
        }
    }
    assert_eq!(history["checkpoints"].as_array().unwrap().len(), 3);
    let sums = sums_by_operator(&du);
    let mut listed = BTreeMap::new();
    for o in history["operators"].as_array().unwrap() {
        let usage: Vec<[u64; 5]> = o["usage"]
            .as_array()
            .unwrap()
            .iter()
            .map(usage_row)
            .collect();
        listed.insert((o["operator"].as_str().unwrap().to_string(), None), usage);
    }
    for st in history["states"].as_array().unwrap() {
        let usage: Vec<[u64; 5]> = st["usage"]
            .as_array()
            .unwrap()
            .iter()
            .map(usage_row)
            .collect();
        listed.insert(
            (
                st["operator"].as_str().unwrap().to_string(),
                Some(st["state"].as_str().unwrap().to_string()),
            ),
            usage,
        );
    }
    assert_eq!(listed, sums);
    // The fixture's operators: two keyed ones and Flink's own files.
    let operators: Vec<&str> = history["operators"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["operator"].as_str().unwrap())
        .collect();
    assert!(
        operators.contains(&"counter") && operators.contains(&"_flink"),
        "{operators:?}"
    );

    // The table: a legend, then one row per checkpoint whose columns follow the legend.
    let table = ok(ckptfs(&["du", s, "--history"]));
    let lines: Vec<&str> = table.lines().collect();
    let head = lines
        .iter()
        .position(|l| l.trim_start().starts_with("ID "))
        .unwrap();
    let keys: Vec<&str> = lines[head].split_whitespace().skip(5).collect();
    let legend: Vec<(String, String)> = lines[1..head]
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (key, name) = l.trim_start().split_once(' ').unwrap();
            (key.to_string(), name.trim().to_string())
        })
        .collect();
    assert_eq!(
        keys,
        legend.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>()
    );
    let mut operator = String::new();
    let columns: Vec<Vec<u64>> = legend
        .iter()
        .map(|(key, name)| {
            let state = if key.chars().all(|c| c.is_ascii_uppercase()) {
                operator = name.clone();
                None
            } else {
                Some(name.clone())
            };
            sums[&(operator.clone(), state)]
                .iter()
                .map(|u| u[1])
                .collect()
        })
        .collect();
    // Sizes for people (KiB, MiB), bytes in --json: each is a number and its unit.
    let human = ckptfs::units::human_bytes;
    for (i, c) in checkpoints.iter().enumerate() {
        let row: Vec<&str> = lines[head + 1 + i].split_whitespace().collect();
        assert_eq!(row[0], c["id"].to_string());
        let mut want: Vec<String> = ["bytes", "new", "shared"]
            .iter()
            .map(|f| human(c["total"][f].as_u64().unwrap()))
            .collect();
        want.extend(columns.iter().map(|col| human(col[i])));
        let want = want.join(" ");
        assert_eq!(row[2..], want.split_whitespace().collect::<Vec<_>>()[..]);
    }

    // --svg alone writes the file and prints nothing.
    let svg_path = dir.path().join("history.svg");
    let printed = ok(ckptfs(&["du", s, "--svg", svg_path.to_str().unwrap()]));
    assert!(printed.is_empty(), "{printed}");
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.starts_with("<?xml"), "{svg}");
    let els = elements(&svg, true);
    assert_eq!(els[0].name, "svg");
    assert_eq!(els[0].attr("xmlns"), "http://www.w3.org/2000/svg");
    assert_eq!(els[0].attr("data-checkpoints"), "1 2 3");
    check_plot_figures(&els, &history);
    // Nothing from elsewhere: no script, link or external reference.
    assert!(!els
        .iter()
        .any(|e| e.name == "script" || e.attrs.contains_key("href")));

    // An ID with --history is refused (a history is of every checkpoint).
    let out = ckptfs(&["du", s, "2", "--history"]);
    assert_eq!(out.status.code(), Some(2));
}

/// Wait until `check` holds, polling, for at most a minute.
fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    crate::metrics::http_get(addr, path)
}

/// A daemon following the real Flink job: the page, as Chromium loads it, shows every
/// figure `du --json` and `du --history --json` give, the job and its lag, and no error;
/// it is self-contained; a screenshot of it is taken (and written to docs/page.png with
/// CKPTFS_UPDATE_DOCS=1).
#[test]
fn the_page_in_chromium_shows_what_du_counts() {
    let dir = tempfile::tempdir().unwrap();
    let (store, mnt) = (dir.path().join("store"), dir.path().join("mnt"));
    std::fs::create_dir(&mnt).unwrap();
    // The job's checkpoints an hour ago: 4, a minute later 5, and after a stall of nine
    // minutes 6 (the plot's time axis shows the stall as a gap).
    let job = dir.path().join("flink").join(JOB);
    std::fs::create_dir(dir.path().join("flink")).unwrap();
    crate::flink::cp_a(&fixture(), &job);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let flink_time = |n: u64| now_ms - 3_600_000 + [0, 60_000, 600_000][n as usize - 4];
    for n in [4, 5, 6] {
        crate::metrics::set_mtime_ms(&job.join(format!("chk-{n}/_metadata")), flink_time(n));
    }
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
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
    wait_for("the job's three checkpoints", || {
        json_of(&["ls", m.mnt(), "--json"])
            .as_array()
            .unwrap()
            .len()
            == 3
    });
    wait_for("the follower's look after them", || {
        let (_, _, page) = get(addr, "/");
        page.contains("data-lag-checkpoints=\"0\"")
    });
    ok(ckptfs(&["pin", m.mnt(), "2", "before-deploy"]));
    let (code, content_type, source) = get(addr, "/");
    assert_eq!(
        (code, content_type.as_str()),
        (200, "text/html; charset=utf-8")
    );
    // Self-contained: no script, stylesheet, image or font from anywhere.
    for banned in [
        "<script",
        "<link",
        "<img",
        "src=",
        "url(",
        "@import",
        "@font-face",
    ] {
        assert!(!source.contains(banned), "{banned} in the page");
    }

    let url = format!("http://{addr}/");
    let dom = chromium(&["--dump-dom"], &url);
    let els = elements(&dom, false);
    let du = json_of(&["du", m.mnt(), "--json"]);
    let history = json_of(&["du", m.mnt(), "--history", "--json"]);
    let status: Value =
        serde_json::from_str(&std::fs::read_to_string(mnt.join(".ckptfs/status")).unwrap())
            .unwrap();

    let summary = by_id(&els, "summary");
    assert_eq!(summary.num("data-retained"), 3);
    assert_eq!(
        summary.num("data-store-bytes"),
        status["store_bytes"].as_u64().unwrap()
    );
    assert_eq!(
        summary.num("data-objects"),
        status["objects"].as_u64().unwrap()
    );
    assert_eq!(summary.num("data-newest"), 3);
    // The policy and the pins, not just "retain 3".
    assert_eq!(summary.attr("data-policy"), "last=3");
    assert_eq!(summary.num("data-pins"), 1);
    let pin = els
        .iter()
        .find(|e| e.attrs.get("data-pin").map(String::as_str) == Some("before-deploy"))
        .expect("the pin shown");
    assert_eq!(pin.num("data-checkpoint"), 2);
    assert!(
        summary.text.contains("kept by the policy last=3")
            && summary.text.contains("before-deploy → cp-2"),
        "{}",
        summary.text
    );
    // Deduplication: the bytes the checkpoints name (du's, summed) against those stored.
    let named: u64 = du["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["total"]["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(summary.num("data-named-bytes"), named);
    let ratio = named as f64 / status["store_bytes"].as_f64().unwrap();
    assert!((summary.float("data-dedup-ratio") - ratio).abs() < 0.001);
    assert!(
        ratio > 1.5,
        "the fixture's checkpoints share files: {ratio}"
    );
    assert!(
        summary.text.contains(&format!("deduplication {ratio:.1}×")),
        "{}",
        summary.text
    );
    // Ages beside the times.
    let age = |text: &str| text.contains(" ago)") || text.contains("(just now)");
    assert!(age(&summary.text), "{}", summary.text);
    // Reloads itself, with no script.
    let refresh = els
        .iter()
        .find(|e| e.name == "meta" && e.attrs.contains_key("http-equiv"))
        .expect("a refresh");
    assert_eq!(refresh.attr("http-equiv"), "refresh");
    assert_eq!(refresh.attr("content"), "30");

    // Each checkpoint's bytes new and shared, drawn; each state's bytes, drawn; along a
    // time axis, at Flink's times: the stall is a gap nine times the first.
    check_plot_figures(&els, &history);
    let bars = inside(&els, "stored-plot", "g", "data-new");
    let times: Vec<u64> = bars.iter().map(|g| g.num("data-time-ms")).collect();
    assert_eq!(times, [4, 5, 6].map(flink_time));
    let x: Vec<f64> = bars.iter().map(|g| g.float("data-x")).collect();
    assert!(((x[2] - x[1]) / (x[1] - x[0]) - 9.0).abs() < 0.01, "{x:?}");
    let ticks: Vec<&Element> = els
        .iter()
        .filter(|e| e.attrs.get("class").map(String::as_str) == Some("x-tick"))
        .collect();
    assert!(
        ticks.len() >= 4
            && ticks
                .iter()
                .all(|t| t.text.len() == 8 && t.text.contains(':')),
        "clock times under the axis: {ticks:?}"
    );

    // The checkpoints' table: du's totals and the Flink labels.
    let rows = inside(&els, "checkpoint-table", "tr", "data-id");
    let ls = json_of(&["ls", m.mnt(), "--json"]);
    let ls = ls.as_array().unwrap();
    let checkpoints = du["checkpoints"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    for (row, c) in rows.iter().zip(checkpoints.iter().rev()) {
        assert_eq!(row.num("data-id"), c["id"].as_u64().unwrap());
        for f in ["files", "bytes", "new", "shared", "exclusive"] {
            assert_eq!(
                row.num(&format!("data-{f}")),
                c["total"][f].as_u64().unwrap(),
                "{f}"
            );
        }
        assert_eq!(row.attr("data-flink-job"), JOB);
        assert_eq!(
            row.num("data-flink-checkpoint"),
            c["flink"]["checkpoint"].as_u64().unwrap()
        );
        assert!(row.text.contains(&format!("cp-{}", c["id"])), "{row:?}");
        // Each checkpoint's duration, sync and async, as ls gives them.
        let listed = ls
            .iter()
            .find(|l| l["id"] == c["id"])
            .expect("listed by ls");
        for (attr, field) in [("data-sync-us", "sync_ms"), ("data-async-us", "async_ms")] {
            let us = row.num(attr) as f64;
            assert!(
                (us / 1000.0 - listed[field].as_f64().unwrap()).abs() < 0.001,
                "{attr}"
            );
        }
        assert!(row.text.contains(" + "), "{row:?}");
    }

    // The largest states of the newest checkpoint, as du's figures summed over subtasks.
    let sums = sums_by_operator(&du);
    let newest = checkpoints.len() - 1;
    let mut want: Vec<(u64, String, String, [u64; 5], u64)> = sums
        .iter()
        .filter_map(|((op, state), v)| {
            state
                .as_ref()
                .map(|s| (v[newest][1], op.clone(), s.clone(), v[newest], v[0][1]))
        })
        .filter(|w| w.3 != [0; 5])
        .collect();
    want.sort_by(|a, b| b.0.cmp(&a.0).then((&a.1, &a.2).cmp(&(&b.1, &b.2))));
    want.truncate(20);
    let largest = by_id(&els, "largest-states");
    assert_eq!(largest.num("data-checkpoint"), 3);
    let got: Vec<(u64, String, String, [u64; 5], u64)> =
        inside(&els, "largest-states", "tr", "data-state")
            .iter()
            .map(|r| {
                (
                    r.num("data-bytes"),
                    r.attr("data-operator").to_string(),
                    r.attr("data-state").to_string(),
                    ["files", "bytes", "new", "shared", "exclusive"]
                        .map(|f| r.num(&format!("data-{f}"))),
                    r.num("data-oldest-bytes"),
                )
            })
            .collect();
    assert!(!got.is_empty());
    assert_eq!(got, want);
    // Operators by the name Flink gave them, where it gave one other than their directory.
    let names: BTreeMap<String, String> = checkpoints[newest]["backends"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| {
            let (op, _) = b["backend"].as_str().unwrap().rsplit_once('/').unwrap();
            Some((op.to_string(), b["name"].as_str()?.to_string()))
        })
        .filter(|(op, name)| op != name)
        .collect();
    assert!(!names.is_empty(), "the fixture's totals has no uid: a name");
    for r in inside(&els, "largest-states", "tr", "data-state") {
        match names.get(r.attr("data-operator")) {
            Some(name) => {
                assert_eq!(r.attr("data-operator-name"), name);
                assert!(r.text.starts_with(name.as_str()), "{r:?}");
            }
            None => assert!(!r.attrs.contains_key("data-operator-name"), "{r:?}"),
        }
    }

    // The job followed, and no lag: the store holds Flink's newest checkpoint.
    let flink = by_id(&els, "flink");
    assert_eq!(flink.attr("data-followed"), "true");
    assert_eq!(flink.attr("data-flink-job"), JOB);
    assert_eq!(flink.num("data-flink-newest"), 6);
    assert_eq!(flink.attr("data-imported-job"), JOB);
    assert_eq!(flink.num("data-imported-newest"), 6);
    assert_eq!(flink.num("data-lag-checkpoints"), 0);
    assert_eq!(flink.num("data-lag-ms"), 0);
    assert_eq!(flink.attr("data-source"), job.to_str().unwrap());
    // Flink's newest with its own time and age; the imports counted.
    assert_eq!(flink.num("data-flink-newest-unix-ms"), flink_time(6));
    assert!(flink.text.contains(" min ago)"), "{}", flink.text);
    assert!(age(&flink.text), "{}", flink.text);
    assert!(flink.text.contains("Last look at "), "{}", flink.text);
    assert_eq!(flink.num("data-imports-completed"), 3);
    assert_eq!(flink.num("data-imports-failed"), 0);
    assert_eq!(flink.num("data-refused"), 0);
    let error = by_id(&els, "last-error");
    assert!(!error.attrs.contains_key("data-error"), "{error:?}");
    assert_eq!(status["last_error"], Value::Null);

    // The screenshot, as a user sees it.
    let shots = tempfile::tempdir().unwrap();
    let png = shots.path().join("page.png");
    chromium(
        &[
            &format!("--screenshot={}", png.display()),
            "--window-size=1200,1900",
            "--hide-scrollbars",
        ],
        &url,
    );
    let image = std::fs::read(&png).unwrap();
    assert!(image.starts_with(b"\x89PNG\r\n\x1a\n") && image.len() > 10_000);
    if std::env::var_os("CKPTFS_UPDATE_DOCS").is_some() {
        let docs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/page.png");
        std::fs::write(docs, &image).unwrap();
    }

    // Flink completes checkpoint 7, which ckptfs refuses: the page says the store is one
    // checkpoint and 95 s of Flink's time behind, and why 7 is refused.
    let staged = dir.path().join("chk-7");
    std::fs::create_dir(&staged).unwrap();
    std::fs::write(staged.join("_metadata"), b"not a checkpoint's metadata").unwrap();
    crate::metrics::set_mtime_ms(&staged.join("_metadata"), flink_time(6) + 95_000);
    std::fs::rename(&staged, job.join("chk-7")).unwrap();
    wait_for("the refusal of checkpoint 7", || {
        get(addr, "/").2.contains("data-refused=\"1\"")
    });
    let els = elements(&chromium(&["--dump-dom"], &url), false);
    let flink = by_id(&els, "flink");
    assert_eq!(flink.num("data-flink-newest"), 7);
    assert_eq!(flink.num("data-lag-checkpoints"), 1);
    assert_eq!(flink.num("data-lag-ms"), 95_000);
    assert_eq!(flink.num("data-imports-failed"), 1);
    assert!(
        flink
            .text
            .contains("Lag: 1 checkpoint(s), 1 min 35 s of Flink's time behind."),
        "{}",
        flink.text
    );
    let refused = inside(&els, "flink-refused", "li", "data-checkpoint");
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].num("data-checkpoint"), 7);
    assert!(
        refused[0].text.starts_with("Refused: job "),
        "{:?}",
        refused[0]
    );
    let error = by_id(&els, "last-error");
    assert!(
        error.attr("data-error").contains("checkpoint 7"),
        "{error:?}"
    );
    m.umount();
}

/// What a store or a job names is shown as text, never as markup: a Flink source whose
/// path holds HTML, reported in the last error, is text in the DOM Chromium builds.
#[test]
fn the_page_shows_hostile_names_as_text() {
    let dir = tempfile::tempdir().unwrap();
    let (store, mnt) = (dir.path().join("store"), dir.path().join("mnt"));
    std::fs::create_dir(&mnt).unwrap();
    let hostile = dir.path().join("<img src=x onerror=alert(1)>&\"'");
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let m = Mounted::at(
        &store,
        &mnt,
        &[
            "--flink",
            hostile.to_str().unwrap(),
            "--metrics-listen",
            &addr.to_string(),
        ],
    );
    wait_for("the follower's error", || {
        get(addr, "/")
            .2
            .contains("id=\"last-error\" class=\"error\"")
    });
    let els = elements(
        &chromium(&["--dump-dom"], &format!("http://{addr}/")),
        false,
    );
    assert!(!els.iter().any(|e| e.name == "img" || e.name == "script"));
    let error = by_id(&els, "last-error");
    let shown = hostile.display().to_string();
    assert!(error.attr("data-error").contains(&shown), "{error:?}");
    assert!(error.text.contains(&shown), "{error:?}");
    // With when it was recorded.
    assert!(
        error.num("data-error-unix-ms") > 1_600_000_000_000,
        "{error:?}"
    );
    assert!(error.text.contains(" ago)") || error.text.contains("(just now)"));
    assert_eq!(by_id(&els, "flink").attr("data-source"), shown);
    assert_eq!(by_id(&els, "summary").num("data-retained"), 0);
    m.umount();
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Prometheus: one series per operator (and per operator and state) with the newest
/// checkpoint's bytes and files as du counts them, summed over the subtasks.
#[test]
fn metrics_give_each_operators_bytes_in_the_newest_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (store, mnt) = (dir.path().join("store"), dir.path().join("mnt"));
    std::fs::create_dir(&mnt).unwrap();
    ok(ckptfs(&[
        "import-flink",
        fixture().to_str().unwrap(),
        path_str(&store),
    ]));
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let m = Mounted::at(&store, &mnt, &["--metrics-listen", &addr.to_string()]);
    let du = json_of(&["du", m.mnt(), "--json"]);
    let sums = sums_by_operator(&du);
    let newest = du["checkpoints"].as_array().unwrap().len() - 1;
    let (code, _, text) = get(addr, "/metrics");
    assert_eq!(code, 200);
    let scrape = crate::metrics::parse(&text);
    let file =
        crate::metrics::parse(&std::fs::read_to_string(mnt.join(".ckptfs/metrics")).unwrap());
    assert_eq!(scrape.kind_of("ckptfs_operator_bytes"), "gauge");
    let mut operators = 0;
    let mut states = 0;
    for ((op, state), v) in &sums {
        let [files, bytes, ..] = v[newest];
        if files == 0 {
            continue;
        }
        match state {
            None => {
                operators += 1;
                let labels = [("operator", op.as_str())];
                assert_eq!(scrape.get("ckptfs_operator_bytes", &labels), bytes as f64);
                assert_eq!(scrape.get("ckptfs_operator_files", &labels), files as f64);
                assert_eq!(file.get("ckptfs_operator_bytes", &labels), bytes as f64);
            }
            Some(s) => {
                states += 1;
                let labels = [("operator", op.as_str()), ("state", s.as_str())];
                assert_eq!(scrape.get("ckptfs_state_bytes", &labels), bytes as f64);
            }
        }
    }
    // Nothing else: one series per operator, one per state, no subtask or file.
    let count = |name: &str| scrape.samples.iter().filter(|s| s.name == name).count();
    assert_eq!(count("ckptfs_operator_bytes"), operators);
    assert_eq!(count("ckptfs_operator_files"), operators);
    assert_eq!(count("ckptfs_state_bytes"), states);
    assert!(operators >= 3 && states > operators, "{operators} {states}");
    m.umount();
}

/// A field of `/proc/PID/status` in KiB (`VmRSS`, `VmHWM`).
fn status_kib(pid: i32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {field} of {pid}"))
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap()
}

/// The sockets process `pid` holds open (None once it is gone).
fn sockets_of(pid: i32) -> Option<usize> {
    Some(
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .ok()?
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|l| l.to_string_lossy().starts_with("socket:"))
            .count(),
    )
}

/// A connection to `addr` that takes almost nothing of an answer it does not read: its
/// receive buffer is the smallest the kernel allows, and it asks for segments of 536
/// bytes (the Internet's default), not loopback's 64 KiB, so the daemon's kernel sizes
/// that socket's send buffer for them (tens of KiB, not MiBs). What the daemon cannot
/// write stays in the daemon, as it does for a client across a network.
fn small_window_client(addr: SocketAddr) -> std::net::TcpStream {
    use std::os::fd::FromRawFd;
    let SocketAddr::V4(v4) = addr else {
        panic!("{addr}: IPv4 here")
    };
    // SAFETY: plain socket calls on a descriptor this function owns (the TcpStream closes
    // it), with pointers to values that live across the calls.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "{}", std::io::Error::last_os_error());
        let stream = std::net::TcpStream::from_raw_fd(fd);
        let size: libc::c_int = 4096;
        let set = libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            &size as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        assert_eq!(set, 0, "{}", std::io::Error::last_os_error());
        let mss: libc::c_int = 536;
        let set = libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_MAXSEG,
            &mss as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        assert_eq!(set, 0, "{}", std::io::Error::last_os_error());
        let sin = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: v4.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*v4.ip()).to_be(),
            },
            sin_zero: [0; 8],
        };
        let connected = libc::connect(
            fd,
            &sin as *const libc::sockaddr_in as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        assert_eq!(connected, 0, "{}", std::io::Error::last_os_error());
        stream
    }
}

/// Clients that ask for the page and never read (issue 42): they hold one copy of the
/// page's large part between them, not one each; at most 64 are served at once (the
/// daemon's sockets counted while they wait); each is dropped by the daemon once its
/// answer has not been taken within the write timeout (1.5 s here), its answer cut short;
/// a scrape of /metrics that came during the flood is answered; a kept-alive connection
/// with no next request is closed after the idle timeout (1 s here).
#[test]
fn clients_that_never_read_hold_one_page_between_them() {
    use std::io::{Read, Write};
    const CHECKPOINTS: &str = "300";
    const CLIENTS: usize = 150;
    // MAX_CONNECTIONS of src/metrics_http.rs.
    const CAP: usize = 64;
    let dir = tempfile::tempdir().unwrap();
    let (store, mnt) = (dir.path().join("store"), dir.path().join("mnt"));
    std::fs::create_dir(&mnt).unwrap();
    let started = Instant::now();
    ok(ckptfs(&[
        "workload",
        path_str(&store),
        "--rounds",
        CHECKPOINTS,
        "--retain",
        CHECKPOINTS,
        "--keys",
        "20",
        "--value-size",
        "10",
        "--compact-every",
        "0",
        "--backend",
        "A/0",
    ]));
    eprintln!("{CHECKPOINTS} checkpoints made in {:?}", started.elapsed());
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let m = Mounted::at_with_env(
        &store,
        &mnt,
        &["--metrics-listen", &addr.to_string()],
        &[
            ("CKPTFS_HTTP_WRITE_TIMEOUT_MS", "1500"),
            ("CKPTFS_HTTP_IDLE_TIMEOUT_MS", "1000"),
        ],
    );
    let pid = crate::common::mounted::daemon_pid(&m);
    // The first load counts du and draws; the next one is what every client gets.
    let (code, _, first) = get(addr, "/");
    assert_eq!(code, 200);
    assert!(first.contains(&format!("data-retained=\"{CHECKPOINTS}\"")));
    let body = get(addr, "/").2;
    let page = body.len() as u64;
    let drawn = body.find("<footer").unwrap() - body.find("<section id=\"history\"").unwrap();
    eprintln!("the page: {page} B, {drawn} B of them drawn from du's figures");
    // The daemon's own sockets (the least of a few looks: the connection of the last load
    // may still be closing).
    let sockets = (0..5)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(100));
            sockets_of(pid).unwrap()
        })
        .min()
        .unwrap();
    // The peak of RSS counted from here (VmHWM reset).
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    let before = status_kib(pid, "VmRSS");

    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let most_sockets = {
        let watching = watching.clone();
        std::thread::spawn(move || {
            let mut most = 0;
            while watching.load(std::sync::atomic::Ordering::Relaxed) {
                let Some(now) = sockets_of(pid) else { break };
                most = most.max(now);
                std::thread::sleep(Duration::from_millis(20));
            }
            most
        })
    };
    let mut clients: Vec<std::net::TcpStream> = (0..CLIENTS)
        .map(|_| {
            let mut c = small_window_client(addr);
            write!(c, "GET / HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
            c
        })
        .collect();
    // A scrape while they wait: answered once slots free up.
    let scrape = std::thread::spawn(move || get(addr, "/metrics"));
    // Every client's answer begins (peeked, never read): past the first 64, only as the
    // daemon drops earlier ones.
    for c in &clients {
        c.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let mut byte = [0u8; 1];
        assert_eq!(c.peek(&mut byte).unwrap(), 1);
    }
    let peak = status_kib(pid, "VmHWM");
    eprintln!("every answer begun after {:?}", started.elapsed());
    let grew = peak.saturating_sub(before) * 1024;
    let held = page * CLIENTS as u64;
    eprintln!(
        "page {page} B, {CLIENTS} clients that never read: RSS {before} KiB, peak {peak} KiB, \
         grew {grew} B = {:.3} x page x clients",
        grew as f64 / held as f64
    );
    assert!(
        grew < held / 5,
        "RSS grew by {grew} B with {CLIENTS} clients holding a page of {page} B each"
    );
    let (code, _, text) = scrape.join().unwrap();
    assert_eq!(code, 200);
    crate::metrics::parse(&text);
    // The daemon closes every stuck connection: its sockets back to what they were.
    wait_for("the stuck connections closed", || {
        sockets_of(pid).unwrap() <= sockets
    });
    watching.store(false, std::sync::atomic::Ordering::Relaxed);
    let most = most_sockets.join().unwrap();
    eprintln!(
        "every stuck connection closed after {:?}",
        started.elapsed()
    );
    eprintln!("the daemon's sockets: {sockets} before, at most {most} during");
    assert!(
        most <= sockets + CAP,
        "{most} sockets open at once, {sockets} before"
    );
    // Each answer was cut short: the client reads what the kernel held, then the end (or
    // a reset, which says as much).
    for c in &mut clients {
        let mut got = Vec::new();
        if let Err(e) = c.read_to_end(&mut got) {
            assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
            continue;
        }
        let text = String::from_utf8_lossy(&got);
        let (head, body) = text.split_once("\r\n\r\n").expect("the answer's head");
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .expect("content-length")
            .parse()
            .unwrap();
        assert!(body.len() < length, "{} of {length} bytes", body.len());
    }
    drop(clients);
    eprintln!("every answer read to its end after {:?}", started.elapsed());

    // A kept-alive connection with no next request is closed.
    let mut idle = std::net::TcpStream::connect(addr).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    write!(idle, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        let n = idle.read(&mut buf).unwrap();
        assert!(n > 0, "closed before the answer's end");
        got.extend_from_slice(&buf[..n]);
        if got.ends_with(b"# EOF\n") {
            break;
        }
    }
    assert_eq!(
        idle.read(&mut buf).unwrap(),
        0,
        "the idle connection was not closed"
    );
    m.umount();
}
