//! A daemon mounted for a test, and the helpers the real-mount tests share.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const BIN: &str = env!("CARGO_BIN_EXE_ckptfs");

pub fn ckptfs(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run ckptfs")
}

pub fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn errno_of(result: std::io::Result<impl Sized>) -> i32 {
    match result {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.raw_os_error().expect("an OS error"),
    }
}

pub struct Mounted {
    _dir: Option<tempfile::TempDir>,
    pub root: PathBuf,
    pub store: PathBuf,
    pub mnt: PathBuf,
}

impl Mounted {
    pub fn new(args: &[&str]) -> Mounted {
        Self::with_env(args, &[])
    }

    /// A daemon started with `env` added to its environment (e.g. `FAILPOINTS`).
    pub fn with_env(args: &[&str], env: &[(&str, &str)]) -> Mounted {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let m = Mounted {
            store: root.join("store"),
            mnt: root.join("mnt"),
            root,
            _dir: Some(dir),
        };
        std::fs::create_dir(&m.mnt).unwrap();
        m.mount_with_env(args, env);
        m
    }

    /// Mount `store` at `mnt` (an existing directory); `root` is `mnt`'s parent.
    pub fn at(store: &Path, mnt: &Path, args: &[&str]) -> Mounted {
        let m = Mounted {
            store: store.to_path_buf(),
            mnt: mnt.to_path_buf(),
            root: mnt.parent().unwrap().to_path_buf(),
            _dir: None,
        };
        m.mount(args);
        m
    }

    /// [`Mounted::at`] with `env` added to the daemon's environment.
    pub fn at_with_env(store: &Path, mnt: &Path, args: &[&str], env: &[(&str, &str)]) -> Mounted {
        let m = Mounted {
            store: store.to_path_buf(),
            mnt: mnt.to_path_buf(),
            root: mnt.parent().unwrap().to_path_buf(),
            _dir: None,
        };
        m.mount_with_env(args, env);
        m
    }

    pub fn mount(&self, args: &[&str]) {
        self.mount_with_env(args, &[]);
    }

    fn mount_with_env(&self, args: &[&str], env: &[(&str, &str)]) {
        let mut all = vec![
            "mount",
            self.store.to_str().unwrap(),
            self.mnt.to_str().unwrap(),
        ];
        all.extend_from_slice(args);
        ok(Command::new(BIN)
            .args(&all)
            .envs(env.iter().copied())
            .output()
            .expect("run ckptfs"));
        assert!(
            self.mnt.join(".ckptfs/ctl").exists(),
            "mount returned before it was ready"
        );
    }

    pub fn umount(&self) {
        ok(ckptfs(&["umount", self.mnt.to_str().unwrap()]));
        assert!(!self.mnt.join(".ckptfs").exists());
    }

    pub fn mnt(&self) -> &str {
        self.mnt.to_str().unwrap()
    }

    pub fn put(&self, backend: &str, key: &str, value: &str) {
        ok(ckptfs(&["put", self.mnt(), backend, key, value]));
    }

    /// Load `keys` keys with 200-byte values into `backend` through `ckptfs load`.
    pub fn load_keys(&self, backend: &str, keys: u32) {
        let data: String = (0..keys)
            .map(|i| format!("key{i:06}\t{}\n", "x".repeat(200)))
            .collect();
        let file = self.root.join("load.tsv");
        std::fs::write(&file, data).unwrap();
        ok(ckptfs(&[
            "load",
            self.mnt(),
            backend,
            file.to_str().unwrap(),
        ]));
    }

    /// `cp -r MNT/cp-ID DEST`; true if it succeeded.
    pub fn copy_out(&self, id: u64, dest: &Path) -> bool {
        Command::new("cp")
            .arg("-r")
            .arg(self.mnt.join(format!("cp-{id}")))
            .arg(dest)
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap()
            .success()
    }

    pub fn checkpoint(&self) -> u64 {
        ok(ckptfs(&["checkpoint", self.mnt()]))
            .trim()
            .parse()
            .unwrap()
    }

    pub fn status(&self) -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(self.mnt.join(".ckptfs/status")).unwrap())
            .unwrap()
    }

    /// Every retained checkpoint's id, from `.ckptfs/checkpoints`.
    pub fn checkpoint_ids(&self) -> Vec<u64> {
        std::fs::read_to_string(self.mnt.join(".ckptfs/checkpoints"))
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["id"]
                    .as_u64()
                    .unwrap()
            })
            .collect()
    }

    /// Checkpoint `id` as JSON with every backend's files resolved (see [`manifest_json`]).
    pub fn manifest(&self, id: u64) -> serde_json::Value {
        super::manifest_json(&self.store, id)
    }

    pub fn root_names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.mnt)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.mnt.join(".ckptfs").exists() {
            let _ = ckptfs(&["umount", self.mnt.to_str().unwrap(), "--timeout", "30"]);
        }
        let _ = Command::new("fusermount3")
            .arg("-uz")
            .arg(&self.mnt)
            .output();
    }
}

pub fn scan(dir: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    ckptfs_core::backend::scan_dir(dir)
        .unwrap()
        .into_iter()
        .collect()
}

pub fn kv(pairs: &[(&str, &str)]) -> BTreeMap<Vec<u8>, Vec<u8>> {
    pairs
        .iter()
        .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

pub struct Ctl(pub std::fs::File);

impl Ctl {
    pub fn open(m: &Mounted) -> Ctl {
        Ctl(std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(m.mnt.join(".ckptfs/ctl"))
            .unwrap())
    }
    pub fn send(&mut self, text: &str) -> std::io::Result<()> {
        self.0
            .write(text.as_bytes())
            .map(|n| assert_eq!(n, text.len()))
    }
    pub fn answer(&mut self) -> serde_json::Value {
        // One answer line per read.
        let mut buf = vec![0u8; 4096];
        let n = self.0.read(&mut buf).unwrap();
        assert!(
            n > 0 && buf[n - 1] == b'\n',
            "{:?}",
            String::from_utf8_lossy(&buf[..n])
        );
        serde_json::from_slice(&buf[..n]).unwrap()
    }
}

/// A size-limited tmpfs that fills like a real disk; unmounted on drop.
pub struct SmallFs {
    pub path: PathBuf,
}

impl SmallFs {
    pub fn new(path: PathBuf, size: &str) -> SmallFs {
        std::fs::create_dir_all(&path).unwrap();
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(&path)
            .status()
            .unwrap();
        assert!(status.success(), "mount tmpfs");
        SmallFs { path }
    }

    pub fn resize(&self, size: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.path)
            .status()
            .unwrap();
        assert!(status.success(), "remount tmpfs");
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// Values that do not compress, so their size on disk is what was written.
pub fn noise(seed: u64, len: usize) -> String {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect()
}

pub fn load(
    m: &Mounted,
    backend: &str,
    keys: std::ops::Range<u32>,
    value_len: usize,
) -> std::io::Result<()> {
    let mut ctl = Ctl::open(m);
    for chunk in keys.collect::<Vec<_>>().chunks(200) {
        let lines: String = chunk
            .iter()
            .map(|k| format!("put {backend} key{k:07} {}\n", noise(*k as u64, value_len)))
            .collect();
        ctl.send(&lines)?;
        for _ in chunk {
            let answer = ctl.answer();
            if answer["ok"] != true {
                return Err(std::io::Error::other(answer.to_string()));
            }
        }
    }
    Ok(())
}

pub fn store_files(store: &Path, sub: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut pending = vec![store.join(sub)];
    while let Some(dir) = pending.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                pending.push(p);
            } else {
                out.push(p.strip_prefix(store).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

pub fn daemon_pid(m: &Mounted) -> i32 {
    m.status()["pid"].as_i64().unwrap() as i32
}

/// SIGKILL process `pid` and wait until it is gone (at most 30 s): until then it holds its
/// locks, and the kernel may take a moment to tear down a FUSE daemon.
pub fn kill_and_wait(pid: i32) {
    let pid = nix::unistd::Pid::from_raw(pid);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while nix::sys::signal::kill(pid, None).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "{pid} outlived SIGKILL"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
