//! The command line's reference: every subcommand and option that `--help` shows is in the
//! man page.

use crate::common::cli::text;
use crate::common::mounted::ckptfs;

/// Every subcommand and every long option that `--help` shows is in man/ckptfs.8.
#[test]
fn the_man_page_documents_every_subcommand_and_option() {
    let man = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/man/ckptfs.8"))
        .unwrap()
        .replace("\\-", "-");
    let help = text(&ckptfs(&["--help"]).stdout);
    let subcommands: Vec<String> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect();
    assert!(subcommands.len() >= 4, "{help}");
    for sub in &subcommands {
        assert!(
            man.contains(&format!(".B ckptfs {sub}")),
            "man page lacks subcommand {sub}"
        );
        let sub_help = text(&ckptfs(&[sub, "--help"]).stdout);
        for word in sub_help.split_whitespace() {
            let option = word.trim_end_matches([',', '.']);
            let option = option.split(['=', '[', '<']).next().unwrap();
            if option.starts_with("--")
                && option.len() > 2
                && option != "--help"
                && option != "--version"
            {
                assert!(man.contains(option), "man page lacks {option} of {sub}");
            }
        }
    }
}

/// A command whose reader is gone (`ckptfs ls STORE | head -0`) ends as `cat` does, by
/// SIGPIPE, not with a panic's message and exit 101.
#[test]
fn a_closed_pipe_ends_a_command_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    crate::common::mounted::ok(ckptfs(&[
        "import-flink",
        crate::flink::fixture().to_str().unwrap(),
        store.to_str().unwrap(),
    ]));
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ckptfs"))
        .args(["ls", store.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{:?} {stderr}",
        out.status
    );
}
