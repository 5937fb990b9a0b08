//! fstab and `mount -t fuse.ckptfs`: mount(8) runs `mount.fuse.ckptfs STORE MOUNTPOINT
//! -o OPTIONS`, translated here into the `ckptfs mount` command line. The `-o` options are
//! derived from `mount`'s own clap definition, so every option has its fstab twin.

use std::ffi::OsString;
use std::path::Path;

use clap::CommandFactory;

use super::Cli;

/// The command line to parse: this process's own, or, when mount(8) runs us as
/// `mount.fuse.ckptfs` (or `mount.ckptfs`), its arguments translated into `ckptfs mount`'s.
/// An untranslatable line is refused with the message to print (usage error).
pub fn invocation() -> Result<Vec<OsString>, String> {
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let invoked_as = Path::new(&argv0)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("")
        .to_string();
    if !invoked_as.starts_with("mount.") {
        return Ok(std::env::args_os().collect());
    }
    let command = Cli::command();
    let mount = command
        .find_subcommand("mount")
        .ok_or_else(|| format!("{invoked_as}: no mount subcommand"))?;
    mount_helper_args(std::env::args().skip(1).collect(), mount)
        .map(|args| args.into_iter().map(Into::into).collect())
        .map_err(|e| format!("{invoked_as}: {e}"))
}

/// Options of `-o` that mount(8) passes and that mean nothing to ckptfs.
const GENERIC_MOUNT_OPTIONS: &[&str] = &[
    "rw", "defaults", "auto", "noauto", "user", "users", "nouser", "_netdev", "nofail", "dev",
    "nodev", "suid", "nosuid", "exec", "noexec", "atime", "noatime", "relatime",
];

/// Translate `mount.fuse.ckptfs STORE MOUNTPOINT [-o opt,opt=value,...]` (what mount(8)
/// runs for `mount -t fuse.ckptfs` and fstab lines) into `ckptfs mount ...` arguments.
/// Every long option of `mount` (`mount_command`) is an `-o` option, spelled with `_` or
/// `-`: `key=value` for one that takes a value, `key` for a flag; clap then checks the
/// values as it does on the command line. Generic options of mount(8) are ignored.
pub fn mount_helper_args(
    args: Vec<String>,
    mount_command: &clap::Command,
) -> Result<Vec<String>, String> {
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        if arg == "-o" {
            options.push(it.next().ok_or("-o needs an argument")?);
        } else if let Some(o) = arg.strip_prefix("-o") {
            options.push(o.to_string());
        } else if arg == "-n" || arg == "-s" || arg == "-f" || arg == "-v" {
            // mount(8) flags: no mtab, sloppy, fake, verbose.
        } else {
            positional.push(arg);
        }
    }
    let [store, mountpoint] = <[String; 2]>::try_from(positional)
        .map_err(|_| "usage: mount.fuse.ckptfs STORE MOUNTPOINT [-o options]".to_string())?;
    let mut out = vec!["ckptfs".to_string(), "mount".into(), store, mountpoint];
    for option in options
        .iter()
        .flat_map(|o| o.split(','))
        .filter(|o| !o.is_empty())
    {
        let (key, value) = match option.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (option, None),
        };
        let long = key.replace('_', "-");
        let arg = mount_command.get_arguments().find(|a| {
            let aliases = a.get_all_aliases().unwrap_or_default();
            (a.get_long() == Some(long.as_str()) || aliases.contains(&long.as_str()))
                && long != "help"
        });
        match (arg, value) {
            (Some(arg), None) if !arg.get_action().takes_values() => {
                out.push(format!("--{long}"));
            }
            (Some(arg), Some(v)) if arg.get_action().takes_values() => {
                out.push(format!("--{long}"));
                out.push(v.to_string());
            }
            (Some(_), None) => {
                return Err(format!("mount option {key:?} needs a value ({key}=...)"))
            }
            (Some(_), Some(_)) => return Err(format!("mount option {key:?} takes no value")),
            (None, None) if GENERIC_MOUNT_OPTIONS.contains(&key) => {}
            (None, _) => return Err(format!("unknown mount option {option:?}")),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::{CommandFactory, Parser};

    fn helper(options: &str) -> Result<Vec<String>, String> {
        let command = Cli::command();
        let mount = command.find_subcommand("mount").unwrap();
        mount_helper_args(
            vec![
                "s3://bkt/p".into(),
                "/mnt/x".into(),
                "-o".into(),
                options.into(),
            ],
            mount,
        )
    }

    /// Every long option of `ckptfs mount` has its `-o` twin for fstab and `mount -t
    /// fuse.ckptfs` (with `_` for `-`), so no option can be left out of the list again.
    #[test]
    fn every_mount_option_has_its_fstab_twin() {
        let command = Cli::command();
        let mount = command.find_subcommand("mount").unwrap();
        let mut seen = 0;
        for arg in mount.get_arguments() {
            let Some(long) = arg.get_long().filter(|l| *l != "help") else {
                continue;
            };
            let key = long.replace('-', "_");
            let (option, expected) = if arg.get_action().takes_values() {
                (
                    format!("{key}=V"),
                    vec![format!("--{long}"), "V".to_string()],
                )
            } else {
                (key.clone(), vec![format!("--{long}")])
            };
            let out = helper(&option).unwrap_or_else(|e| panic!("-o {option}: {e}"));
            assert_eq!(out[4..], expected[..], "-o {option}");
            seen += 1;
        }
        assert!(seen > 20, "only {seen} options");
    }

    /// What the helper makes of an fstab line is a command line clap accepts; generic
    /// options are ignored, unknown ones and misused ones refused.
    #[test]
    fn fstab_options_parse_as_a_mount_command() {
        let out = helper(
            "state=/var/lib/ckptfs,backend=Op/0,backend=Op/1,lease_ttl=10s,lease-wait=20s,\
             orphan_grace=1h,upload_concurrency=4,allow_other,_netdev,noauto,rw",
        )
        .unwrap();
        let cli = Cli::try_parse_from(&out).unwrap_or_else(|e| panic!("{out:?}: {e}"));
        let Command::Mount(args) = cli.command else {
            panic!("not a mount: {out:?}");
        };
        assert_eq!(args.daemon.lease_ttl, std::time::Duration::from_secs(10));
        assert_eq!(args.daemon.lease_wait, std::time::Duration::from_secs(20));
        assert!(args.allow_other);
        assert_eq!(args.daemon.backends.len(), 2);
        assert_eq!(args.daemon.upload_concurrency, 4);
        // A read-only view from fstab; clap's rules hold (no backends with read_only).
        let view = helper("read_only,cache_size=1GiB").unwrap();
        assert!(matches!(
            Cli::try_parse_from(&view).unwrap().command,
            Command::Mount(args) if args.read_only
        ));
        let both = helper("read_only,backend=Op/0").unwrap();
        assert!(Cli::try_parse_from(&both).is_err());
        assert!(helper("no_such_option=1").unwrap_err().contains("unknown"));
        assert!(helper("retain").unwrap_err().contains("needs a value"));
        // The policy's rules, the old `retain` (an alias of keep_last) among them.
        let keep = helper("retain=5,keep_daily=7,keep-within=36h").unwrap();
        let Command::Mount(args) = Cli::try_parse_from(&keep).unwrap().command else {
            panic!("not a mount: {keep:?}");
        };
        let policy = args.daemon.keep.policy().unwrap().unwrap();
        assert_eq!(policy.to_rules(), ["last=5", "daily=7", "within=1day12h"]);
        assert!(helper("read_only=yes")
            .unwrap_err()
            .contains("takes no value"));
    }
}
