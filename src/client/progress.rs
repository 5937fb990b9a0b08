//! Progress on a terminal: bars and spinners on stderr, hidden when it is not a terminal
//! (scripts and tests read clean output).

use std::time::Duration;

/// A progress bar on stderr when it is a terminal; hidden otherwise.
pub fn progress_bar(total: u64, what: &str) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() || total == 0 {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} {bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("valid template"),
    );
    bar.set_message(what.to_string());
    bar
}

/// A spinner on stderr when it is a terminal; hidden otherwise.
pub fn spinner(what: &str) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_message(what.to_string());
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}
