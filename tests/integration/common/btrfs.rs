//! A loop-mounted btrfs for the tests that need one.

use std::path::PathBuf;
use std::process::Command;

use super::run;

/// A loop-mounted btrfs, unmounted when dropped: a filesystem that shares extents
/// (`FICLONE`), and whose subvolumes give their files a device of their own (`st_dev`).
pub struct Btrfs {
    pub mnt: PathBuf,
    _dir: tempfile::TempDir,
}

impl Btrfs {
    /// A new filesystem of `size` bytes, mounted.
    pub fn new(size: u64) -> Btrfs {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("btrfs.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(size)
            .unwrap();
        run("mkfs.btrfs", &["-q", image.to_str().unwrap()]);
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        run(
            "mount",
            &["-o", "loop", image.to_str().unwrap(), mnt.to_str().unwrap()],
        );
        Btrfs { mnt, _dir: dir }
    }
}

impl Drop for Btrfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
    }
}

/// `btrfs filesystem du --raw -s PATH`: PATH's bytes, and those only its files use
/// (`Exclusive`: not shared with another file's extents).
pub fn usage(path: &std::path::Path) -> (u64, u64) {
    let out = Command::new("btrfs")
        .args(["filesystem", "du", "--raw", "-s"])
        .arg(path)
        .output()
        .expect("btrfs (btrfs-progs)");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().nth(1).expect("a summary line");
    let mut numbers = line.split_whitespace().map(|n| n.parse::<u64>().unwrap());
    (numbers.next().unwrap(), numbers.next().unwrap())
}
