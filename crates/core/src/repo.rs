//! One way to open a store, in each of the three ways a store is used:
//!
//! - [`Repo::reader`]: the offline commands (`restore`, `fsck`, `ls`/`status` of a store,
//!   `graph`) read a store as it is and create nothing in it; on object storage the
//!   objects they fetch are cached in a temporary directory that goes with the `Repo`.
//! - [`Repo::follower`]: a read-only view (`mount --read-only`) follows a store another
//!   daemon writes: no lock, no lease, nothing written or deleted; its cache is in its
//!   state directory.
//! - [`Repo::writer`]: the daemon (the engine) becomes the store's only writer: the store's
//!   lock, or on object storage its lease, with the catalog and the object deletes fenced
//!   by it; its state directory locked too.
//!
//! Each decides what the path or prefix holds before creating anything in it: a path that
//! is no store is refused, and a writer refuses a store that looks incomplete, so that a
//! refused start never leaves something that makes the next one look fine. The names
//! inside a store are in [`crate::store::layout`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::catalog::Catalog;
use crate::error::{Error, IoContext, Result};
use crate::fsutil::{create_private_dir_all, is_real_dir, make_private};
use crate::lease::Lease;
use crate::lock::{DirLock, StoreLock};
use crate::store::layout::{self, CHECKPOINTS, META};
use crate::store::records::{LocalRecords, Records};
use crate::store::s3::{Remote, S3Objects, S3Options, S3Records};
use crate::store::{LocalStore, Location, ObjectStore, OpenedStore};

/// An opened store: its objects, its records and the catalog over them.
pub struct Repo {
    /// Where the store is.
    pub location: Location,
    /// The store's objects (content-addressed).
    pub objects: Arc<dyn ObjectStore>,
    /// The store's named records: metadata, manifests, quarantine, lease.
    pub records: Arc<dyn Records>,
    /// The catalog of checkpoints over those records and objects.
    pub catalog: Catalog,
    /// A reader's raw opening, which holds its temporary cache of fetched objects.
    _raw: Option<OpenedStore>,
}

/// What makes this process the store's only writer, held as long as it writes.
pub enum Writer {
    /// A local store's lock file.
    Lock(#[allow(dead_code)] StoreLock),
    /// The lease of a store on object storage, renewed in the background.
    Lease(#[allow(dead_code)] Lease),
}

/// A daemon's state directory (the live databases, staging, the cache), locked: the store
/// lock does not cover a state directory shared by mistake with a daemon of another store.
pub struct StateDir {
    /// The directory, resolved (no symbolic link in it).
    pub path: PathBuf,
    /// Its lock, held as long as this is.
    pub lock: DirLock,
}

impl StateDir {
    /// Create (owner-only), resolve and lock a state directory.
    pub fn lock(path: &Path) -> Result<StateDir> {
        create_private_dir_all(path)?;
        // The roots may be links the user chose; everything inside them is checked.
        let resolved = std::fs::canonicalize(path).ctx("resolve", path)?;
        make_private(&resolved)?;
        let lock = DirLock::acquire_for(&resolved, "state directory")?;
        Ok(StateDir {
            path: resolved,
            lock,
        })
    }
}

/// How a writer opens a store (from the engine's configuration).
pub struct WriterOptions<'a> {
    /// The state directory (default `STORE/state` for a local store; required on object
    /// storage).
    pub state: Option<&'a Path>,
    /// The checkpoint the backends are to start from: the store must have checkpoints.
    pub restore_from: Option<u64>,
    /// Object storage: how long the lease lasts unless renewed.
    pub lease_ttl: std::time::Duration,
    /// Object storage: how long to wait for a lease another daemon holds; zero fails at
    /// once.
    pub lease_wait: std::time::Duration,
    /// Object storage: uploads in flight and the read cache's size.
    pub s3: &'a S3Options,
}

/// A store opened by its writer. Fields drop in order: the state directory's lock is
/// released before the store's lock or lease (a daemon that then takes the store finds the
/// state directory free).
pub struct OpenedWriter {
    /// The store.
    pub repo: Repo,
    /// The state directory, locked.
    pub state: StateDir,
    /// Whether the store held objects before (a store with objects and no metadata is
    /// incomplete, never new).
    pub had_objects: bool,
    /// What makes this process the writer; the last field, so it is released last.
    pub writer: Writer,
}

/// Refuse paths that are not a ckptfs store, before creating anything in them. A store
/// whose `ckptfs.json` was lost still counts (its manifests are the source of truth).
pub fn check_is_store(store: &Path) -> Result<()> {
    if !store.join(META).is_file() && !store.join(CHECKPOINTS).is_dir() {
        return Err(Error::NotFound(format!(
            "{} is not a ckptfs store (no ckptfs.json, no checkpoints/)",
            store.display()
        )));
    }
    Ok(())
}

/// Create the store directory if needed (owner-only) and make it owner-only; a path that
/// exists but is no directory is an error. Returns its canonical path (the root may be a
/// link the user chose; links inside the store are refused).
pub fn ensure_store_dir(root: &Path) -> Result<PathBuf> {
    if root.exists() && !root.is_dir() {
        return Err(Error::io(
            format!("store {}", root.display()),
            std::io::Error::from_raw_os_error(libc::ENOTDIR),
        ));
    }
    create_private_dir_all(root)?;
    let root = std::fs::canonicalize(root).ctx("resolve", root)?;
    make_private(&root)?;
    Ok(root)
}

impl Repo {
    fn new(
        location: Location,
        objects: Arc<dyn ObjectStore>,
        records: Arc<dyn Records>,
        raw: Option<OpenedStore>,
    ) -> Repo {
        let catalog = Catalog::new(records.clone(), objects.clone());
        Repo {
            location,
            objects,
            records,
            catalog,
            _raw: raw,
        }
    }

    fn map_catalog(self, f: impl FnOnce(Catalog) -> Catalog) -> Repo {
        Repo {
            catalog: f(self.catalog),
            ..self
        }
    }

    /// Open an existing store to read it, creating nothing in it; refuses what is not a
    /// store (a directory or a bucket prefix without `ckptfs.json` or manifests).
    pub fn reader(location: &Location) -> Result<Repo> {
        if let Location::Local(root) = location {
            check_is_store(root)?;
        }
        let opened = OpenedStore::open(location)?;
        let repo = Repo::new(
            location.clone(),
            opened.objects.clone(),
            opened.records.clone(),
            Some(opened),
        );
        if let Location::S3 { .. } = location {
            if repo.records.get(META)?.is_none() && !repo.catalog.has_manifests()? {
                return Err(Error::NotFound(format!(
                    "{location} is not a ckptfs store (no ckptfs.json, no checkpoints/)"
                )));
            }
        }
        Ok(repo)
    }

    /// Open a store another process may be writing, to follow it: its catalog refuses
    /// writes; fetched objects are cached in `state`.
    pub fn follower(location: &Location, s3: &S3Options, state: &StateDir) -> Result<Repo> {
        let repo = match location {
            Location::Local(root) => {
                check_is_store(root)?;
                Repo::new(
                    location.clone(),
                    Arc::new(LocalStore::open_existing(root)?),
                    Arc::new(LocalRecords::new(root)),
                    None,
                )
            }
            Location::S3 { bucket, prefix } => {
                let remote = Remote::connect(bucket, prefix)?;
                remote.check_bucket()?;
                Repo::new(
                    location.clone(),
                    Arc::new(S3Objects::new(
                        remote.clone(),
                        s3.clone(),
                        &state.path.join(layout::CACHE),
                    )?),
                    Arc::new(S3Records::new(remote)),
                    None,
                )
            }
        };
        Ok(repo.map_catalog(Catalog::read_only))
    }

    /// Open a store (creating it if new) as its only writer: exclusive (a lock, or a lease
    /// on object storage), its state directory locked too, nothing else created yet but the
    /// state directory and, for a local store, its `checkpoints/`.
    pub fn writer(location: &Location, options: WriterOptions<'_>) -> Result<OpenedWriter> {
        match location {
            Location::Local(path) => {
                if let Some(n) = options.restore_from {
                    if !path.join(CHECKPOINTS).is_dir() {
                        return Err(Error::NoSuchCheckpoint(n));
                    }
                }
                let root = ensure_store_dir(path)?;
                let lock = StoreLock::acquire(&root)?;
                // Decide what the store is before creating anything in it: a store whose
                // metadata is missing must never look new (a new store's retention would
                // delete checkpoints), and a refused start must leave nothing that makes
                // the next start look fine.
                let local = LocalStore::open_existing(&root)?;
                let had_objects = local.has_objects()?;
                if had_objects && !is_real_dir(&root.join(CHECKPOINTS)) {
                    return Err(Error::Corrupt(format!(
                        "{} holds objects but no checkpoints/ directory: the store is \
                         incomplete (a partial copy?); refusing to start so that nothing is \
                         deleted",
                        root.display()
                    )));
                }
                let repo = Repo::new(
                    Location::Local(root.clone()),
                    Arc::new(LocalStore::open(&root)?),
                    Arc::new(LocalRecords::new(&root)),
                    None,
                );
                repo.catalog.create_dir()?;
                let state = match options.state {
                    Some(state) => StateDir::lock(state)?,
                    None => StateDir::lock(&root.join(layout::STATE))?,
                };
                Ok(OpenedWriter {
                    repo,
                    writer: Writer::Lock(lock),
                    state,
                    had_objects,
                })
            }
            Location::S3 { bucket, prefix } => {
                let Some(state) = options.state else {
                    return Err(Error::Invalid(format!(
                        "a store on object storage ({location}) needs --state DIR: a local \
                         directory for the live databases and the read cache"
                    )));
                };
                crate::lease::validate_ttl(options.lease_ttl)?;
                let state = StateDir::lock(state)?;
                let remote = Remote::connect(bucket, prefix)?;
                remote.check_bucket()?;
                let s3_records = S3Records::new(remote.clone());
                s3_records.check_conditional_writes()?;
                let records: Arc<dyn Records> = Arc::new(s3_records);
                let lease = Lease::acquire(records.clone(), options.lease_ttl, options.lease_wait)?;
                let objects =
                    S3Objects::new(remote, options.s3.clone(), &state.path.join(layout::CACHE))?
                        .with_fence(Arc::new(lease.fence()));
                let had_objects = objects.has_objects()?;
                let fence = lease.fence();
                let repo = Repo::new(location.clone(), Arc::new(objects), records, None)
                    .map_catalog(|catalog| catalog.with_fence(fence));
                Ok(OpenedWriter {
                    repo,
                    writer: Writer::Lease(lease),
                    state,
                    had_objects,
                })
            }
        }
    }
}
