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

/// The README's five-minute tour runs as written, line by line under `set -euo pipefail`,
/// with its paths moved into a temporary directory (and this build's binary for the
/// `cargo build` it starts with): every command exits 0, and the answers it shows are
/// the ones it prints.
#[test]
fn the_readme_tour_runs_as_written() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let tour: String = readme
        .lines()
        .skip_while(|l| !l.starts_with("## A five-minute tour"))
        .skip_while(|l| *l != "```sh")
        .skip(1)
        .take_while(|l| *l != "```")
        .filter(|l| !l.starts_with(". scripts/env.sh") && !l.starts_with("cargo build"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(tour.contains("$ckptfs diff /mnt/ckpt"), "{tour}");
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().display().to_string();
    let script = tour
        .replace(
            "ckptfs=$CARGO_TARGET_DIR/debug/ckptfs",
            "ckptfs=\"$CKPTFS_BIN\"",
        )
        .replace("/tmp/", &format!("{t}/"))
        .replace("/srv/ckpt", &format!("{t}/srv/ckpt"))
        .replace("/mnt/ckpt", &format!("{t}/mnt/ckpt"));
    assert!(
        !script.contains(" /mnt") && !script.contains(" /srv"),
        "{script}"
    );
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("set -euo pipefail\n{script}"))
        .current_dir(dir.path())
        .env("CKPTFS_BIN", crate::common::mounted::BIN)
        .output()
        .unwrap();
    // Unmounted by the tour itself; if it stopped early, here.
    let _ = ckptfs(&["umount", &format!("{t}/mnt/ckpt")]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "the tour failed: {stderr}\n{stdout}");
    // What the mount says of itself, and nothing else (`head -n1 <&3` added "cannot seek").
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.starts_with("ckptfs: mounted (daemon pid "))
        .collect();
    assert!(said.is_empty(), "the tour printed errors: {stderr}");
    assert!(stdout.contains("user:42\tclicks=7"), "{stdout}");
    assert!(stdout.contains(r#"{"ok":true,"id":2,"#), "{stdout}");
    assert_eq!(stdout.lines().last(), Some("clean"), "{stdout}");
}

/// `scripts/demo` runs to its end (it exited 141: `scan | head` under `pipefail`) and
/// leaves its mount up, which this test takes down.
#[test]
fn the_demo_runs_to_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let demo = dir.path().join("demo");
    let out = std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/demo"))
        .arg(&demo)
        .env("CKPTFS_BIN", crate::common::mounted::BIN)
        .output()
        .unwrap();
    let _ = ckptfs(&["umount", demo.join("mnt").to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "the demo exited {:?}: {}\n{stdout}",
        out.status.code(),
        text(&out.stderr)
    );
    assert!(stdout.contains("Unmount when done:"), "{stdout}");
}

/// `ckptfs completions bash` is a script bash sources, whose completion of `ckptfs imp`
/// offers the two import commands and of `ckptfs mount S M --allow` the option; zsh's
/// and fish's scripts are printed too.
#[test]
fn completions_complete_subcommands_and_options() {
    let script = crate::common::mounted::ok(ckptfs(&["completions", "bash"]));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ckptfs.bash");
    std::fs::write(&path, script).unwrap();
    let complete = |words: &str| -> Vec<String> {
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!(
                r#"source "$0"; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1));
                _ckptfs ckptfs "${{COMP_WORDS[COMP_CWORD]}}" "${{COMP_WORDS[COMP_CWORD-1]}}";
                printf '%s\n' "${{COMPREPLY[@]}}""#
            ))
            .arg(&path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout).lines().map(str::to_string).collect()
    };
    let mut imports = complete("ckptfs imp");
    imports.sort();
    assert_eq!(imports, vec!["import", "import-flink"]);
    assert!(complete("ckptfs mount s m --allow").contains(&"--allow-other".to_string()));
    for shell in ["zsh", "fish"] {
        let script = crate::common::mounted::ok(ckptfs(&["completions", shell]));
        assert!(script.contains("import-flink"), "{shell}: {script}");
    }
}

/// Errors of everyday mistakes say what to do: a restore of a checkpoint the store does
/// not hold lists those it holds; `umount` of a directory that is no mount says there is
/// nothing to unmount (it suggested mounting it); `--metrics-listen 9100` names IP:PORT.
#[test]
fn everyday_mistakes_say_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    crate::common::cli::workload(&store, "2");
    let err = |args: &[&str]| {
        let out = ckptfs(args);
        assert!(!out.status.success(), "{args:?}");
        text(&out.stderr)
    };
    let s = store.to_str().unwrap();
    let restored = dir.path().join("r");
    let said = err(&["restore", s, "999", restored.to_str().unwrap()]);
    assert!(
        said.contains("no such checkpoint: 999") && said.contains("it holds 1, 2"),
        "{said}"
    );
    assert!(!restored.exists());
    let said = err(&["umount", s]);
    assert!(said.contains("nothing to unmount"), "{said}");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let said = err(&[
        "mount",
        s,
        mnt.to_str().unwrap(),
        "--metrics-listen",
        "9100",
    ]);
    assert!(said.contains("127.0.0.1:9100"), "{said}");
}

/// The man page's SYNOPSIS and each subcommand's `--help` give the same options: every
/// option the SYNOPSIS gives a subcommand is one its `--help` shows (a removed or renamed
/// option does not linger), and every option `--help` shows is in the SYNOPSIS.
#[test]
fn the_man_page_synopsis_and_help_give_the_same_options() {
    let man = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/man/ckptfs.8"))
        .unwrap()
        .replace("\\-", "-");
    let long_options = |text: &str| -> std::collections::BTreeSet<String> {
        text.split(|c: char| c.is_whitespace() || "[]=<>,.|".contains(c))
            .map(|w| w.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '-'))
            .filter(|w| w.starts_with("--") && w.len() > 2 && *w != "--help" && *w != "--version")
            .map(str::to_string)
            .collect()
    };
    let mut synopsis: std::collections::BTreeMap<String, String> = Default::default();
    let mut sub = String::new();
    for line in man
        .lines()
        .skip_while(|l| *l != ".SH SYNOPSIS")
        .take_while(|l| *l != ".SH DESCRIPTION")
    {
        if let Some(name) = line.strip_prefix(".B ckptfs ") {
            sub = name.split_whitespace().next().unwrap().to_string();
        } else if !sub.is_empty() {
            let text = synopsis.entry(sub.clone()).or_default();
            text.push_str(line);
            text.push('\n');
        }
    }
    assert!(synopsis.len() > 15, "{:?}", synopsis.keys());
    let mut checked = 0;
    for (name, given) in &synopsis {
        let in_man = long_options(given);
        // The options `--help` lists: its lines that begin with one (not its prose). An
        // alias (`--retain`) is shown in an option's text.
        let help = text(&ckptfs(&[name, "--help"]).stdout);
        let mentioned = long_options(&help);
        let listed: String = help
            .lines()
            .filter(|l| l.trim_start().starts_with('-'))
            .filter_map(|l| l.split_whitespace().find(|w| w.starts_with("--")))
            .map(|w| format!("{w}\n"))
            .collect();
        let in_help = long_options(&listed);
        for option in &in_man {
            assert!(
                mentioned.contains(option),
                "the man page's SYNOPSIS gives {name} {option}, which its --help does not show"
            );
        }
        for option in &in_help {
            assert!(
                in_man.contains(option),
                "{name} --help shows {option}, which the man page's SYNOPSIS does not give it"
            );
        }
        checked += in_man.len();
    }
    assert!(checked > 50, "only {checked} options found in the SYNOPSIS");
}

/// Every positional argument of every subcommand says what it is in `-h` (STORE,
/// MOUNTPOINT and CHECKPOINT were bare names).
#[test]
fn every_argument_has_help() {
    let help = text(&ckptfs(&["--help"]).stdout);
    let subcommands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(subcommands.len() > 15, "{subcommands:?}");
    for sub in subcommands {
        let short = text(&ckptfs(&[sub, "-h"]).stdout);
        for line in short
            .lines()
            .skip_while(|l| *l != "Arguments:")
            .skip(1)
            .take_while(|l| !l.is_empty())
        {
            let words: Vec<&str> = line.split_whitespace().collect();
            assert!(words.len() > 1, "{sub}: {line:?} has no help\n{short}");
        }
    }
}

/// `scripts/install` into a staging root puts the binary, the man page, the mount helper
/// (a link mount(8) runs, which answers as `ckptfs mount`), the systemd unit naming the
/// installed binary and the completions in place.
#[test]
fn the_install_script_puts_everything_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let out = std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/install"))
        .env("DESTDIR", root)
        .env("PREFIX", "/opt/ckptfs")
        .env("CKPTFS_BIN", crate::common::mounted::BIN)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let bin = root.join("opt/ckptfs/bin/ckptfs");
    let version = std::process::Command::new(&bin)
        .arg("--version")
        .output()
        .unwrap();
    assert!(text(&version.stdout).starts_with("ckptfs "));
    let man = std::fs::read_to_string(root.join("opt/ckptfs/share/man/man8/ckptfs.8")).unwrap();
    assert!(
        man.starts_with(".TH CKPTFS 8") || man.contains(".TH CKPTFS"),
        "{}",
        &man[..80]
    );
    let helper = root.join("sbin/mount.fuse.ckptfs");
    assert_eq!(
        std::fs::read_link(&helper).unwrap(),
        std::path::PathBuf::from("/opt/ckptfs/bin/ckptfs")
    );
    let unit = std::fs::read_to_string(root.join("etc/systemd/system/ckptfs.service")).unwrap();
    assert!(
        unit.contains("ExecStart=/opt/ckptfs/bin/ckptfs mount "),
        "{unit}"
    );
    let unit =
        std::fs::read_to_string(root.join("etc/systemd/system/ckptfs-serve.service")).unwrap();
    assert!(
        unit.contains("ExecStart=/opt/ckptfs/bin/ckptfs serve "),
        "{unit}"
    );
    for (path, needle) in [
        (
            "opt/ckptfs/share/bash-completion/completions/ckptfs",
            "_ckptfs",
        ),
        (
            "opt/ckptfs/share/zsh/site-functions/_ckptfs",
            "#compdef ckptfs",
        ),
        (
            "opt/ckptfs/share/fish/vendor_completions.d/ckptfs.fish",
            "complete -c ckptfs",
        ),
    ] {
        let script = std::fs::read_to_string(root.join(path)).unwrap();
        assert!(script.contains(needle), "{path}");
    }
    // The helper's name makes it mount(8)'s: a bad option is refused as by `ckptfs mount`.
    let linked = root.join("mount.fuse.ckptfs");
    std::os::unix::fs::symlink(&bin, &linked).unwrap();
    let refused = std::process::Command::new(&linked)
        .args(["/srv/x", "/mnt/x", "-o", "no_such_option"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("unknown mount option"),
        "{}",
        text(&refused.stderr)
    );
}

/// `args` run by ckptfs on a terminal (a pseudo-terminal `script` gives it): what the
/// terminal showed, stdout and stderr together, escapes and all.
fn on_a_terminal(args: &[&str]) -> String {
    let line: Vec<String> = std::iter::once(crate::common::mounted::BIN)
        .chain(args.iter().copied())
        .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
        .collect();
    let out = std::process::Command::new("script")
        .args(["-qec", &line.join(" "), "/dev/null"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run script (util-linux)");
    assert!(out.status.success(), "{args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The commands that can run long show on a terminal what they do and for how long:
/// export-flink, diff --keys, flink-gc (looking, then deleting); restore's bar gives no
/// time left before it has run a second (a 2 s restore began at "eta 76m"). On a pipe,
/// none of it: stderr stays empty.
#[test]
fn long_commands_show_progress_on_a_terminal_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let s = store.to_str().unwrap();
    let job = crate::flink_gc::fixture_at(&dir.path().join("flink"));
    crate::common::mounted::ok(ckptfs(&["import-flink", job.to_str().unwrap(), s]));
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();

    let shown = on_a_terminal(&["export-flink", s, "3", &path("export-tty")]);
    assert!(shown.contains("exporting checkpoint 3 to "), "{shown}");
    let shown = on_a_terminal(&["diff", s, "1", "3", "--keys"]);
    assert!(
        shown.contains("comparing the keys of cp-1 and cp-3"),
        "{shown}"
    );
    let shown = on_a_terminal(&["flink-gc", job.to_str().unwrap(), "--delete"]);
    assert!(
        shown.contains("looking for what Flink no longer needs in ")
            || shown.contains("deleting garbage in "),
        "{shown}"
    );
    let shown = on_a_terminal(&["restore", s, "3", &path("restored")]);
    assert!(shown.contains("restored checkpoint 3"), "{shown}");
    let minutes = regex_lite_eta(&shown);
    assert!(
        minutes.is_empty(),
        "a time left in minutes for a restore of ms: {minutes:?}"
    );

    // On a pipe: the answers only.
    for args in [
        vec!["export-flink", s, "3", &path("export-pipe")],
        vec!["diff", s, "1", "3", "--keys"],
        vec!["flink-gc", job.to_str().unwrap(), "--delete"],
        vec!["restore", s, "3", &path("restored-pipe")],
    ] {
        let out = ckptfs(&args);
        assert!(out.status.success(), "{args:?}: {out:?}");
        assert!(out.stderr.is_empty(), "{args:?}: {out:?}");
    }
}

/// Every `eta <digits>m` (minutes or more) in `text`.
fn regex_lite_eta(text: &str) -> Vec<String> {
    text.match_indices("eta ")
        .filter_map(|(at, _)| {
            let rest = &text[at + 4..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            let unit = rest[digits.len()..].chars().next();
            (!digits.is_empty() && matches!(unit, Some('m' | 'h')))
                .then(|| format!("eta {digits}{}", unit.unwrap()))
        })
        .collect()
}
