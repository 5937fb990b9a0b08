//! What the benchmark examples share: a deterministic workload of incompressible values,
//! and a few measurements.
#![allow(dead_code)]

use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::Value;

pub const VALUE_SIZE: usize = 1024;
pub const KEY_SIZE: usize = 16;

/// A bijective 64-bit mixer (the SplitMix64 finalizer): key `i` lands at a uniformly spread,
/// unpredictable point of the key space, so writing `0..n` in order is random-order writing.
pub fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

pub fn key(i: u64) -> Vec<u8> {
    let k = format!("{:016x}", mix(i)).into_bytes();
    debug_assert_eq!(k.len(), KEY_SIZE);
    k
}

/// VALUE_SIZE pseudo-random bytes (xorshift64*), which snappy cannot compress.
pub fn value(backend: u32, i: u64, round: u64) -> Vec<u8> {
    let mut state = mix(i ^ (u64::from(backend) << 40) ^ (round << 56)) | 1;
    let mut out = Vec::with_capacity(VALUE_SIZE);
    while out.len() < VALUE_SIZE {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let word = state.wrapping_mul(0x2545_f491_4f6c_dd1d);
        let take = (VALUE_SIZE - out.len()).min(8);
        out.extend_from_slice(&word.to_le_bytes()[..take]);
    }
    out
}

/// Bytes of every regular file under `dir`.
pub fn tree_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

/// Nearest-rank percentile of `sorted` (ascending), `p` in 0..=100.
pub fn percentile<T: Copy + Default>(sorted: &[T], p: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Errors of the benchmark programs: a message naming what failed.
pub type Result<T> = std::result::Result<T, String>;

pub trait Context<T> {
    fn ctx(self, what: impl Display) -> Result<T>;
}

impl<T, E: Display> Context<T> for std::result::Result<T, E> {
    fn ctx(self, what: impl Display) -> Result<T> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

/// A ckptfs mount, unmounted when dropped unless `unmount` did it.
pub struct Mount {
    bin: PathBuf,
    pub mnt: PathBuf,
    /// The daemon's pid (`pid` of MNT/.ckptfs/status).
    pub pid: u32,
    mounted: bool,
}

impl Mount {
    /// `BIN mount STORE MNT [EXTRA]` (MNT created if missing): the mount and its time.
    pub fn new(bin: &Path, store: &Path, mnt: &Path, extra: &[String]) -> Result<(Mount, f64)> {
        std::fs::create_dir_all(mnt).ctx(format!("create the mountpoint {}", mnt.display()))?;
        let t = Instant::now();
        let out = Command::new(bin)
            .arg("mount")
            .arg(store)
            .arg(mnt)
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| {
                format!(
                    "cannot run {}: {e} (build it with `cargo build --bin ckptfs`, or set \
                     CKPTFS_BIN)",
                    bin.display()
                )
            })?;
        let seconds = t.elapsed().as_secs_f64();
        if !out.status.success() {
            return Err(format!(
                "`ckptfs mount {} {}` failed ({}):\n{}",
                store.display(),
                mnt.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let mut mount = Mount {
            bin: bin.to_path_buf(),
            mnt: mnt.to_path_buf(),
            pid: 0,
            mounted: true,
        };
        mount.pid = mount.status()?["pid"]
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .ok_or("MNT/.ckptfs/status names no pid")?;
        Ok((mount, seconds))
    }

    /// MNT/.ckptfs/status.
    pub fn status(&self) -> Result<Value> {
        let path = self.mnt.join(".ckptfs/status");
        serde_json::from_str(
            &std::fs::read_to_string(&path).ctx(format!("read {}", path.display()))?,
        )
        .ctx(format!("read {}", path.display()))
    }

    /// The rows of `.ckptfs/checkpoints`, oldest first.
    pub fn rows(&self) -> Result<Vec<Value>> {
        let path = self.mnt.join(".ckptfs/checkpoints");
        let text = std::fs::read_to_string(&path).ctx(format!("read {}", path.display()))?;
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).ctx(format!("a row of {}", path.display())))
            .collect()
    }

    /// A field of the daemon's /proc/PID/FILE (`rchar:` of io: all its threads, exited ones
    /// included; `VmHWM:` of status).
    pub fn proc_field(&self, file: &str, field: &str) -> Option<u64> {
        let text = std::fs::read_to_string(format!("/proc/{}/{file}", self.pid)).ok()?;
        let rest = text.lines().find_map(|l| l.strip_prefix(field))?;
        rest.split_whitespace().next()?.parse().ok()
    }

    /// `BIN umount MNT`: its time.
    pub fn unmount(&mut self) -> Result<f64> {
        self.mounted = false;
        let t = Instant::now();
        let out = Command::new(&self.bin)
            .arg("umount")
            .arg(&self.mnt)
            .stdin(Stdio::null())
            .output()
            .ctx("run ckptfs umount")?;
        let seconds = t.elapsed().as_secs_f64();
        if !out.status.success() {
            return Err(format!(
                "`ckptfs umount {}` failed ({}):\n{}",
                self.mnt.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(seconds)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new(&self.bin)
                .arg("umount")
                .arg(&self.mnt)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// The ckptfs binary: CKPTFS_BIN, else `PROFILE/ckptfs` in CARGO_TARGET_DIR, else in the
/// package's target/.
pub fn ckptfs_bin(profile: &str) -> PathBuf {
    if let Some(bin) = std::env::var_os("CKPTFS_BIN") {
        return bin.into();
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => manifest.join(dir),
        None => manifest.join("target"),
    };
    target.join(profile).join("ckptfs")
}

/// This process's resident set (VmRSS), in KiB; 0 where /proc says nothing.
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}
