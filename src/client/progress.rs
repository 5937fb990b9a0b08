//! Progress on a terminal: bars and spinners on stderr, hidden when it is not a terminal
//! (scripts and tests read clean output).

use std::time::Duration;

/// How long a bar runs before it shows a time left: the rate of the first moments (opening
/// the store, the first objects) says little of the rest.
pub const ETA_AFTER: Duration = Duration::from_secs(1);

/// The time left to do `len` once `pos` is done after `elapsed`, at the average rate since
/// the start; none before [`ETA_AFTER`] or before anything is done. (indicatif's own `eta`
/// follows a recent rate from the first tick: a 2 s restore began at "eta 76m".)
pub fn time_left(pos: u64, len: u64, elapsed: Duration) -> Option<Duration> {
    if elapsed < ETA_AFTER || pos == 0 {
        return None;
    }
    let rate = pos as f64 / elapsed.as_secs_f64();
    Some(Duration::from_secs_f64(
        len.saturating_sub(pos) as f64 / rate,
    ))
}

/// A duration as a bar shows it: `7s`, `3m05s`, `2h10m`.
pub fn short(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// A progress bar on stderr when it is a terminal; hidden otherwise.
pub fn progress_bar(total: u64, what: &str) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() || total == 0 {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} {bar:40} {bytes}/{total_bytes} {bytes_per_sec} {left}",
        )
        .expect("valid template")
        .with_key(
            "left",
            |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                let left = time_left(state.pos(), state.len().unwrap_or(0), state.elapsed());
                let _ = match left {
                    Some(d) => write!(w, "eta {}", short(d)),
                    None => write!(w, "eta …"),
                };
            },
        ),
    );
    bar.set_message(what.to_string());
    bar
}

/// A spinner on stderr when it is a terminal, saying what runs and for how long; hidden
/// otherwise.
pub fn spinner(what: &str) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
            .expect("valid template"),
    );
    bar.set_message(what.to_string());
    // Drawn now, not at the first tick: a short run shows what it did too.
    bar.tick();
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_time_left_waits_for_a_second_and_follows_the_average_rate() {
        let s = Duration::from_secs;
        // A 2 s restore: nothing said at its start, however slow its first bytes.
        assert_eq!(time_left(1, 100 << 20, Duration::from_millis(300)), None);
        assert_eq!(time_left(0, 100, s(5)), None);
        // Half done in 1 s: 1 s left.
        assert_eq!(time_left(50, 100, s(1)), Some(s(1)));
        assert_eq!(time_left(25, 100, s(10)), Some(s(30)));
        assert_eq!(short(s(7)), "7s");
        assert_eq!(short(s(185)), "3m05s");
        assert_eq!(short(s(7800)), "2h10m");
    }
}
