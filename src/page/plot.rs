//! The history drawn as SVG, built as plain text: what each checkpoint stored new and
//! shares with earlier ones (stacked bars), and the bytes of each operator's states over
//! the checkpoints (a stacked area, the states of one operator in shades of its colour).
//! `ckptfs du --svg` writes it to a file; the daemon's page shows it inline.
//!
//! Every figure drawn is also in an attribute (`data-new`, `data-shared` on each
//! checkpoint's bars, `data-bytes` on each state's area, one value per checkpoint) and
//! each plot says its scale (`data-base-y`, `data-bytes-per-px`), so a reader (a test)
//! can check both the figures and what was drawn of them. No script, no font but the
//! viewer's own sans-serif.

use std::fmt::Write;

use ckptfs_core::commands::du::Usage;
use ckptfs_core::commands::history::History;

use super::{escape, human_bytes};

const WIDTH: f64 = 960.0;
const LEFT: f64 = 80.0;
const PLOT_WIDTH: f64 = 600.0;
const LEGEND_X: f64 = LEFT + PLOT_WIDTH + 30.0;
const STORED_TOP: f64 = 50.0;
const STORED_HEIGHT: f64 = 170.0;
const STATES_TOP: f64 = STORED_TOP + STORED_HEIGHT + 80.0;
const STATES_HEIGHT: f64 = 260.0;
const LEGEND_LINE: f64 = 16.0;
/// Most state series drawn apart; the smaller ones (by their largest value) are summed
/// into one area, `(rest)`, so a job with hundreds of states still draws in bounded size.
pub const MAX_SERIES: usize = 24;
/// The label of the series that sums the states past [`MAX_SERIES`].
pub const REST: &str = "(rest)";

/// Hues of the operators, in order (the states of one share its hue).
const HUES: [u32; 10] = [210, 30, 120, 0, 270, 180, 330, 60, 90, 240];
const NEW_COLOUR: &str = "#e8743b";
const SHARED_COLOUR: &str = "#7b9fc7";

/// One area of the states plot.
struct Series<'a> {
    operator: &'a str,
    state: &'a str,
    bytes: Vec<u64>,
    colour: String,
}

/// The history as an SVG document (no XML declaration: [`svg_file`] adds it).
pub fn history_svg(h: &History) -> String {
    let n = h.checkpoints.len();
    let series = series(h);
    let mut operators: Vec<&str> = series.iter().map(|s| s.operator).collect();
    operators.dedup();
    let legend_height = (series.len() + operators.len()) as f64 * LEGEND_LINE;
    let height = (STATES_TOP + STATES_HEIGHT + 50.0).max(STATES_TOP + legend_height + 20.0);
    let ids: Vec<String> = h.checkpoints.iter().map(|c| c.id.to_string()).collect();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"history-plot\" width=\"{WIDTH}\" \
         height=\"{height}\" viewBox=\"0 0 {WIDTH} {height}\" font-family=\"sans-serif\" \
         font-size=\"12\" data-checkpoints=\"{}\">",
        ids.join(" ")
    );
    out.push_str("<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n");
    if n == 0 {
        let _ = writeln!(
            out,
            "<text x=\"{LEFT}\" y=\"{STORED_TOP}\">No checkpoint retained yet.</text>\n</svg>"
        );
        return out;
    }
    stored_plot(&mut out, h);
    states_plot(&mut out, h, &series);
    out.push_str("</svg>\n");
    out
}

/// [`history_svg`] as a file's content.
pub fn svg_file(h: &History) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n{}",
        history_svg(h)
    )
}

/// Where the checkpoints are drawn along the x axis: by time, so that a stall (a job
/// that stopped checkpointing, a follower that fell behind) shows as a gap.
struct Xs {
    /// Each checkpoint's time (ms since the Unix epoch): Flink's, for a checkpoint
    /// imported from Flink, else when ckptfs committed it; never before the previous
    /// checkpoint's (one imported out of order is drawn beside the one before it).
    times: Vec<u64>,
    /// Each checkpoint's centre.
    xs: Vec<f64>,
    /// The width of a bar.
    bar: f64,
    /// The scale: x = `x0` + (time - `t0`) * `px_per_ms`; 0 where every checkpoint has the
    /// same time and they are spread evenly instead.
    x0: f64,
    t0: u64,
    px_per_ms: f64,
}

impl Xs {
    fn of(h: &History) -> Xs {
        let n = h.checkpoints.len().max(1);
        let mut times: Vec<u64> = Vec::with_capacity(n);
        for c in &h.checkpoints {
            let t = c
                .flink
                .as_ref()
                .and_then(|f| f.time_unix_ms)
                .unwrap_or(c.completed_unix_ms);
            times.push(t.max(times.last().copied().unwrap_or(0)));
        }
        let slot = PLOT_WIDTH / n as f64;
        let pad = (slot / 2.0).min(20.0);
        let (t0, t1) = (
            times.first().copied().unwrap_or(0),
            times.last().copied().unwrap_or(0),
        );
        let (x0, px_per_ms) = if t1 > t0 {
            (LEFT + pad, (PLOT_WIDTH - 2.0 * pad) / (t1 - t0) as f64)
        } else {
            (LEFT + slot / 2.0, 0.0)
        };
        let xs: Vec<f64> = times
            .iter()
            .enumerate()
            .map(|(i, t)| {
                if px_per_ms > 0.0 {
                    x0 + (t - t0) as f64 * px_per_ms
                } else {
                    x0 + i as f64 * slot
                }
            })
            .collect();
        let gap = xs
            .windows(2)
            .map(|w| w[1] - w[0])
            .filter(|g| *g > 0.0)
            .fold(slot, f64::min);
        Xs {
            times,
            xs,
            // Within the plot: the outer bars are `pad` from its edges.
            bar: (gap * 0.8).clamp(1.0, (slot * 0.8).min(2.0 * pad - 2.0).max(1.0)),
            x0,
            t0,
            px_per_ms,
        }
    }

    /// The plot's scale as `data-` attributes.
    fn attrs(&self) -> String {
        format!(
            "data-x0=\"{}\" data-t0-ms=\"{}\" data-px-per-ms=\"{}\"",
            self.x0, self.t0, self.px_per_ms
        )
    }
}

/// A time on the x axis: the clock time when the history spans less than a day, with
/// the date when it spans less than a year, else the date (UTC, as the page says).
fn time_label(ms: u64, span_ms: u64) -> String {
    let t = humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms),
    )
    .to_string();
    // 2026-12-04T21:35:52Z
    if span_ms < 86_400_000 {
        t[11..19].to_string()
    } else if span_ms < 365 * 86_400_000 {
        format!("{} {}", &t[5..10], &t[11..16])
    } else {
        t[..10].to_string()
    }
}

/// Round steps of the time axis, in ms.
const TIME_STEPS: [u64; 20] = [
    1_000,
    2_000,
    5_000,
    10_000,
    15_000,
    30_000,
    60_000,
    120_000,
    300_000,
    600_000,
    900_000,
    1_800_000,
    3_600_000,
    7_200_000,
    10_800_000,
    21_600_000,
    43_200_000,
    86_400_000,
    604_800_000,
    2_592_000_000,
];

/// A "nice" top of the y axis at or above `max` bytes, and its ticks (bytes).
fn axis(max: u64) -> (u64, Vec<u64>) {
    if max == 0 {
        return (1, vec![0]);
    }
    let mut unit: u64 = 1;
    while unit < (1 << 50) && max / unit >= 1024 {
        unit *= 1024;
    }
    let x = max as f64 / unit as f64;
    let raw = x / 4.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude);
    let step_bytes = ((step * unit as f64).round() as u64).max(1);
    let top = max.div_ceil(step_bytes) * step_bytes;
    let ticks = (0..=top / step_bytes).map(|k| k * step_bytes).collect();
    (top, ticks)
}

/// Most characters of a name in the legend (the areas' tooltips give it whole).
const LEGEND_CHARS: usize = 34;

/// `name` cut to [`LEGEND_CHARS`], with an ellipsis where it was cut.
fn legend_name(name: &str) -> String {
    if name.chars().count() <= LEGEND_CHARS {
        return name.to_string();
    }
    let mut cut: String = name.chars().take(LEGEND_CHARS - 1).collect();
    cut.push('…');
    cut
}

/// A tick's label: [`human_bytes`] without a trailing `.0` (`50 KiB`, `1.5 MiB`).
fn axis_label(bytes: u64) -> String {
    human_bytes(bytes).replace(".0 ", " ")
}

/// The y axis of a plot: ticks with their labels and light grid lines.
fn y_axis(out: &mut String, top: f64, height: f64, max_bytes: u64, ticks: &[u64]) {
    let base = top + height;
    for t in ticks {
        let y = base - *t as f64 * height / max_bytes as f64;
        let _ = writeln!(
            out,
            "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#e4e4e4\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#555\">{}</text>",
            LEFT + PLOT_WIDTH,
            LEFT - 6.0,
            y + 4.0,
            escape(&axis_label(*t))
        );
    }
    let _ = writeln!(
        out,
        "<line x1=\"{LEFT}\" x2=\"{LEFT}\" y1=\"{top}\" y2=\"{base}\" stroke=\"#888\"/>\
         <line x1=\"{LEFT}\" x2=\"{}\" y1=\"{base}\" y2=\"{base}\" stroke=\"#888\"/>",
        LEFT + PLOT_WIDTH
    );
}

/// The x axis: times at round steps (at most about seven), with "UTC" at its end; with
/// every checkpoint at the same time, their ids.
fn x_labels(out: &mut String, h: &History, xs: &Xs, base: f64) {
    let tick = |out: &mut String, x: f64, label: &str| {
        let _ = writeln!(
            out,
            "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{base}\" y2=\"{}\" stroke=\"#888\"/>\
             <text class=\"x-tick\" x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\" \
             fill=\"#555\">{}</text>",
            base + 4.0,
            base + 17.0,
            escape(label)
        );
    };
    if xs.px_per_ms == 0.0 {
        for (c, x) in h.checkpoints.iter().zip(&xs.xs).take(8) {
            tick(out, *x, &format!("cp-{}", c.id));
        }
        return;
    }
    let (t0, t1) = (xs.t0, *xs.times.last().unwrap_or(&xs.t0));
    let span = t1 - t0;
    let step = TIME_STEPS
        .iter()
        .copied()
        .find(|s| span / s <= 6)
        .unwrap_or(span.div_ceil(6).max(1));
    let mut t = t0.div_ceil(step) * step;
    while t <= t1 {
        tick(
            out,
            xs.x0 + (t - t0) as f64 * xs.px_per_ms,
            &time_label(t, span),
        );
        t += step;
    }
    let _ = writeln!(
        out,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"start\" fill=\"#555\">UTC</text>",
        LEFT + PLOT_WIDTH + 4.0,
        base + 17.0
    );
}

fn title(out: &mut String, y: f64, text: &str) {
    let _ = writeln!(
        out,
        "<text x=\"{LEFT}\" y=\"{y}\" font-size=\"14\" font-weight=\"bold\">{}</text>",
        escape(text)
    );
}

/// Per checkpoint, its distinct stored bytes: shared with an earlier checkpoint (below)
/// and new (above).
fn stored_plot(out: &mut String, h: &History) {
    let max = h
        .checkpoints
        .iter()
        .map(|c| c.total.new + c.total.shared)
        .max()
        .unwrap_or(0);
    let (top_bytes, ticks) = axis(max);
    let base = STORED_TOP + STORED_HEIGHT;
    let per_px = top_bytes as f64 / STORED_HEIGHT;
    title(
        out,
        STORED_TOP - 20.0,
        "Stored bytes per checkpoint: new, and shared with an earlier one",
    );
    y_axis(out, STORED_TOP, STORED_HEIGHT, top_bytes, &ticks);
    let xs = Xs::of(h);
    let _ = writeln!(
        out,
        "<g id=\"stored-plot\" data-base-y=\"{base}\" data-bytes-per-px=\"{per_px}\" {}>",
        xs.attrs()
    );
    for (i, c) in h.checkpoints.iter().enumerate() {
        let (x, bar) = (xs.xs[i], xs.bar);
        let shared_h = c.total.shared as f64 / per_px;
        let new_h = c.total.new as f64 / per_px;
        let _ = writeln!(
            out,
            "<g class=\"checkpoint\" data-id=\"{id}\" data-new=\"{new}\" data-shared=\"{shared}\" \
             data-time-ms=\"{}\" data-x=\"{x:.3}\">\
             <title>cp-{id} at {}: {} new, {} shared</title>\
             <rect class=\"shared\" x=\"{:.2}\" y=\"{:.2}\" width=\"{bar:.2}\" height=\"{shared_h:.2}\" fill=\"{SHARED_COLOUR}\"/>\
             <rect class=\"new\" x=\"{:.2}\" y=\"{:.2}\" width=\"{bar:.2}\" height=\"{new_h:.2}\" fill=\"{NEW_COLOUR}\"/></g>",
            xs.times[i],
            super::when(xs.times[i]),
            escape(&human_bytes(c.total.new)),
            escape(&human_bytes(c.total.shared)),
            x - bar / 2.0,
            base - shared_h,
            x - bar / 2.0,
            base - shared_h - new_h,
            id = c.id,
            new = c.total.new,
            shared = c.total.shared,
        );
    }
    out.push_str("</g>\n");
    x_labels(out, h, &xs, base);
    for (k, (label, colour)) in [("new", NEW_COLOUR), ("shared", SHARED_COLOUR)]
        .iter()
        .enumerate()
    {
        let y = STORED_TOP + k as f64 * LEGEND_LINE;
        let _ = writeln!(
            out,
            "<rect x=\"{LEGEND_X}\" y=\"{y}\" width=\"12\" height=\"12\" fill=\"{colour}\"/>\
             <text x=\"{}\" y=\"{}\">{label}</text>",
            LEGEND_X + 18.0,
            y + 10.0
        );
    }
}

/// The series to stack: every (operator, state), or the [`MAX_SERIES`]` - 1` largest and
/// one `(rest)` summing the others; sorted by operator and state, `(rest)` last.
fn series(h: &History) -> Vec<Series<'_>> {
    let n = h.checkpoints.len();
    let bytes = |usage: &[Usage]| usage.iter().map(|u| u.bytes).collect::<Vec<u64>>();
    let mut order: Vec<usize> = (0..h.states.len()).collect();
    let mut rest: Option<Vec<u64>> = None;
    if h.states.len() > MAX_SERIES {
        let peak = |k: &usize| h.states[*k].usage.iter().map(|u| u.bytes).max();
        order.sort_by(|a, b| peak(b).cmp(&peak(a)).then(a.cmp(b)));
        let mut sum = vec![0; n];
        for k in order.split_off(MAX_SERIES - 1) {
            for (s, u) in sum.iter_mut().zip(&h.states[k].usage) {
                *s += u.bytes;
            }
        }
        rest = Some(sum);
        order.sort_unstable();
    }
    let operators: Vec<&str> = h.operators.iter().map(|o| o.operator.as_str()).collect();
    let mut out: Vec<Series> = Vec::new();
    let mut shade = 0;
    for (pos, k) in order.iter().enumerate() {
        let s = &h.states[*k];
        if pos > 0 && h.states[order[pos - 1]].operator != s.operator {
            shade = 0;
        }
        let hue = operators
            .iter()
            .position(|o| *o == s.operator)
            .map_or(0, |p| HUES[p % HUES.len()]);
        let lightness = 35 + (shade * 13) % 45;
        shade += 1;
        out.push(Series {
            operator: &s.operator,
            state: &s.state,
            bytes: bytes(&s.usage),
            colour: format!("hsl({hue},55%,{lightness}%)"),
        });
    }
    if let Some(sum) = rest {
        out.push(Series {
            operator: REST,
            state: REST,
            bytes: sum,
            colour: "#bbbbbb".into(),
        });
    }
    out
}

/// Each state's bytes over the checkpoints, stacked.
fn states_plot(out: &mut String, h: &History, series: &[Series]) {
    let n = h.checkpoints.len();
    let mut below = vec![0u64; n];
    let totals: Vec<u64> = (0..n)
        .map(|i| series.iter().map(|s| s.bytes[i]).sum())
        .collect();
    let (top_bytes, ticks) = axis(totals.iter().copied().max().unwrap_or(0));
    let base = STATES_TOP + STATES_HEIGHT;
    let per_px = top_bytes as f64 / STATES_HEIGHT;
    let y = |bytes: u64| base - bytes as f64 / per_px;
    title(
        out,
        STATES_TOP - 20.0,
        "Bytes per operator and state (all subtasks), over the checkpoints",
    );
    y_axis(out, STATES_TOP, STATES_HEIGHT, top_bytes, &ticks);
    let xs = Xs::of(h);
    let _ = writeln!(
        out,
        "<g id=\"states-plot\" data-base-y=\"{base}\" data-bytes-per-px=\"{per_px}\" {}>",
        xs.attrs()
    );
    let (left, right) = (LEFT, LEFT + PLOT_WIDTH);
    for s in series {
        let upper: Vec<u64> = below.iter().zip(&s.bytes).map(|(b, v)| b + v).collect();
        let mut d = format!("M{left:.1},{:.2}", y(upper[0]));
        for (i, u) in upper.iter().enumerate() {
            let _ = write!(d, " L{:.1},{:.2}", xs.xs[i], y(*u));
        }
        let _ = write!(d, " L{right:.1},{:.2}", y(upper[n - 1]));
        let _ = write!(d, " L{right:.1},{:.2}", y(below[n - 1]));
        for i in (0..n).rev() {
            let _ = write!(d, " L{:.1},{:.2}", xs.xs[i], y(below[i]));
        }
        let _ = write!(d, " L{left:.1},{:.2} Z", y(below[0]));
        let values: Vec<String> = s.bytes.iter().map(u64::to_string).collect();
        let _ = writeln!(
            out,
            "<path class=\"state\" data-operator=\"{}\" data-state=\"{}\" data-bytes=\"{}\" \
             fill=\"{}\" stroke=\"#ffffff\" stroke-width=\"0.5\" d=\"{d}\"><title>{} / {}: \
             {} in the newest</title></path>",
            escape(s.operator),
            escape(s.state),
            values.join(" "),
            s.colour,
            escape(s.operator),
            escape(s.state),
            escape(&human_bytes(s.bytes[n - 1])),
        );
        below = upper;
    }
    out.push_str("</g>\n");
    x_labels(out, h, &xs, base);
    // The legend: top of the stack first, as the areas are drawn; an operator by the name
    // Flink gave it in the newest checkpoint, where it gave one.
    let names = h
        .checkpoints
        .last()
        .and_then(|c| c.flink.as_ref())
        .map(|f| &f.operators);
    let mut line = 0.0;
    let mut operator = None;
    for s in series.iter().rev() {
        if operator != Some(s.operator) {
            operator = Some(s.operator);
            if s.operator != REST {
                let _ = writeln!(
                    out,
                    "<text x=\"{LEGEND_X}\" y=\"{}\" font-weight=\"bold\">{}</text>",
                    STATES_TOP + line * LEGEND_LINE + 10.0,
                    escape(&legend_name(
                        names
                            .and_then(|n| n.get(s.operator))
                            .map_or(s.operator, String::as_str)
                    ))
                );
                line += 1.0;
            }
        }
        let y = STATES_TOP + line * LEGEND_LINE;
        let _ = writeln!(
            out,
            "<rect x=\"{}\" y=\"{y}\" width=\"12\" height=\"12\" fill=\"{}\"/>\
             <text x=\"{}\" y=\"{}\">{}</text>",
            LEGEND_X + 8.0,
            s.colour,
            LEGEND_X + 26.0,
            y + 10.0,
            escape(&legend_name(s.state))
        );
        line += 1.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_axis_covers_the_largest_value_in_round_steps() {
        assert_eq!(axis(0), (1, vec![0]));
        let (top, ticks) = axis(1000);
        assert!((1000..=1250).contains(&top), "{top}");
        assert_eq!(ticks.first(), Some(&0));
        assert_eq!(ticks.last(), Some(&top));
        let (top, ticks) = axis(3 << 20);
        assert_eq!(top, 3 << 20);
        assert_eq!(ticks.len(), 4);
        assert_eq!(axis_label(50 << 10), "50 KiB");
        assert_eq!(legend_name("short"), "short");
        let long = "x".repeat(40);
        assert_eq!(legend_name(&long).chars().count(), LEGEND_CHARS);
        assert!(legend_name(&long).ends_with('…'));
    }
}
