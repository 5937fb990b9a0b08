//! Helpers for the object-storage tests: engine configs for a bucket, what it holds, mounts
//! with an S3 environment, daemons by pid, short leases.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use ckptfs_core::catalog::Catalog;
use ckptfs_core::store::{Location, ObjectId, OpenedStore};
use ckptfs_core::{BackendName, EngineConfig};

use super::moto::moto;
use super::mounted::{ok, BIN};
use super::{name, Kv};

pub fn s3_config(url: &str, state: &Path, backends: &[&str]) -> EngineConfig {
    let mut config = EngineConfig::new(Location::parse(url).unwrap());
    config.state = Some(state.to_path_buf());
    config.backends = backends.iter().map(|b| name(b)).collect();
    config.backend_options = ckptfs_core::backend::BackendOptions {
        write_buffer_size: Some(64 * 1024),
        ..Default::default()
    };
    config
}

/// What the bucket holds under the store's `objects/`.
pub fn stored(url: &str) -> BTreeSet<ObjectId> {
    let opened = OpenedStore::open(&Location::parse(url).unwrap()).unwrap();
    opened.objects.list().unwrap().into_iter().collect()
}

/// The objects the store's manifests reference (objects and file lists).
pub fn referenced(url: &str) -> BTreeSet<ObjectId> {
    let opened = OpenedStore::open(&Location::parse(url).unwrap()).unwrap();
    let catalog = Catalog::new(opened.records.clone(), opened.objects.clone());
    catalog
        .load_all()
        .unwrap()
        .values()
        .flat_map(|m| m.object_refs().collect::<Vec<_>>())
        .collect()
}

/// Restore checkpoint `id` from the URL with `ckptfs_core::commands::restore` and read every backend.
pub fn restored(url: &str, id: u64) -> BTreeMap<BackendName, Kv> {
    let dest = tempfile::tempdir().unwrap();
    let out = dest.path().join("out");
    let location = Location::parse(url).unwrap();
    ckptfs_core::commands::restore::restore_checkpoint(&location, id, &out, |_| {}).unwrap();
    let mut result = BTreeMap::new();
    for operator in std::fs::read_dir(&out).unwrap() {
        let operator = operator.unwrap();
        for subtask in std::fs::read_dir(operator.path()).unwrap() {
            let subtask = subtask.unwrap();
            let backend: BackendName = format!(
                "{}/{}",
                operator.file_name().to_str().unwrap(),
                subtask.file_name().to_str().unwrap()
            )
            .parse()
            .unwrap();
            let kv = ckptfs_core::backend::scan_dir(&subtask.path())
                .unwrap()
                .into_iter()
                .collect();
            result.insert(backend, kv);
        }
    }
    result
}

pub fn ckptfs_with_env(args: &[&str], env: &[(&str, String)]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap()
}

pub struct Mount {
    pub mnt: std::path::PathBuf,
}

impl Mount {
    pub fn new(
        url: &str,
        mnt: &Path,
        state: &Path,
        extra: &[&str],
        env: &[(&str, String)],
    ) -> Mount {
        std::fs::create_dir_all(mnt).unwrap();
        let mut args = vec![
            "mount",
            url,
            mnt.to_str().unwrap(),
            "--state",
            state.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        ok(ckptfs_with_env(&args, env));
        Mount {
            mnt: mnt.to_path_buf(),
        }
    }

    pub fn m(&self) -> &str {
        self.mnt.to_str().unwrap()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new(BIN)
            .args(["umount", self.m(), "--timeout", "30"])
            .output();
        let _ = Command::new("fusermount3")
            .arg("-uz")
            .arg(&self.mnt)
            .output();
    }
}

/// The pid of the daemon serving `mnt` (from its status file).
pub fn daemon_pid(mnt: &Path) -> i32 {
    let status: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(mnt.join(".ckptfs/status")).unwrap())
            .unwrap();
    status["pid"].as_i64().unwrap() as i32
}

pub fn signal(pid: i32, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).unwrap();
}

/// Referenced objects missing from the store, and whether every checkpoint restores.
pub fn assert_whole(url: &str) {
    let missing: Vec<ObjectId> = referenced(url).difference(&stored(url)).copied().collect();
    assert!(
        missing.is_empty(),
        "referenced objects missing: {missing:?}"
    );
    let opened = OpenedStore::open(&Location::parse(url).unwrap()).unwrap();
    let catalog = Catalog::new(opened.records.clone(), opened.objects.clone());
    for id in catalog.list_ids().unwrap().0 {
        restored(url, id);
    }
}

pub const SHORT_LEASE: &[&str] = &["--lease-ttl", "3s", "--orphan-grace", "3s"];

/// A writer (backend Op/0, lease 3 s, one key written) that reaches the store through an
/// HTTP proxy, in a new bucket.
pub struct Proxied {
    pub url: String,
    pub proxy: super::moto::HttpProxy,
    pub env: Vec<(&'static str, String)>,
    /// The writer's mount options, for another daemon of the same store.
    pub args: Vec<&'static str>,
    pub writer: Mount,
}

impl Proxied {
    pub fn start(dir: &Path) -> Proxied {
        let moto = moto();
        let url = moto.store();
        let proxy = super::moto::HttpProxy::start(moto.port);
        let env = super::moto::env_for(proxy.port);
        let mut args = vec!["--backend", "Op/0"];
        args.extend_from_slice(SHORT_LEASE);
        let writer = Mount::new(&url, &dir.join("ma"), &dir.join("sa"), &args, &env);
        ok(ckptfs_with_env(
            &["put", writer.m(), "Op/0", "k1", "v1"],
            &env,
        ));
        Proxied {
            url,
            proxy,
            env,
            args,
            writer,
        }
    }
}
