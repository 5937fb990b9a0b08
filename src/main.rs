//! The `ckptfs` command line: [`cli`] defines it, [`commands`] runs each subcommand,
//! [`client`] talks to a mount's daemon.

mod cli;
mod client;
mod commands;

use std::process::ExitCode;

use clap::Parser;

use ckptfs_core::error::Error;

fn main() -> ExitCode {
    #[cfg(feature = "failpoints")]
    let _failpoints = ckptfs_core::failpoint::setup();
    let args = match cli::fstab::invocation() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let cli = cli::Cli::parse_from(&args);
    let default_level = match cli.command {
        cli::Command::Mount(_) | cli::Command::Serve(_) => "info",
        _ => "warn",
    };
    if !matches!(cli.command, cli::Command::Mount(_) | cli::Command::Serve(_)) {
        // `ckptfs diff ... | head`: a reader that is gone ends the command quietly, as it
        // ends `cat` (Rust ignores SIGPIPE, and printing would panic). Not for the daemon,
        // whose sockets and pipes must not kill it.
        // SAFETY: setting a signal's disposition to its default, before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default_level))
        .init();
    match commands::run(cli.command, &args) {
        Ok(code) => code,
        // `ckptfs scan DIR | head` is not an error.
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::BrokenPipe => {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ckptfs: error: {e}");
            ExitCode::from(1)
        }
    }
}
