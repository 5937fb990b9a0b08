//! Small durable-file helpers shared by the store, the catalog and restore.
//!
//! Everything ckptfs creates in a store or state directory is private to its owner
//! (directories 0700, files 0600) and is created without following symbolic links: a store
//! is written by root, and a link planted in it must never redirect a write elsewhere.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use crate::error::{Error, IoContext, Result};

/// Mode of every directory ckptfs creates in a store or state directory.
pub const PRIVATE_DIR: u32 = 0o700;
/// Mode of every file ckptfs creates in a store or state directory.
pub const PRIVATE_FILE: u32 = 0o600;

/// fsync a directory so that renames and creations inside it are durable.
pub fn fsync_dir(dir: &Path) -> Result<()> {
    // O_DIRECTORY: whatever another user may have put at the path (a FIFO) is not opened.
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)
        .and_then(|d| d.sync_all())
        .ctx("fsync directory", dir)
}

/// Create `dir` and its missing parents owner-only (0700). Existing directories keep
/// their mode; see [`make_private`].
pub fn create_private_dir_all(dir: &Path) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_DIR)
        .create(dir)
        .ctx("create", dir)
}

/// Create `dir` owner-only if missing; refuse it if it is a symbolic link or no directory.
/// For the fixed directories inside a store or state directory: a link planted there must
/// never redirect a write, a rename or a delete elsewhere.
pub fn ensure_real_dir(dir: &Path) -> Result<()> {
    match fs::symlink_metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(meta) if meta.file_type().is_symlink() => Err(Error::Corrupt(format!(
            "{} is a symbolic link; refusing to follow it",
            dir.display()
        ))),
        Ok(_) => Err(Error::io(
            format!("{} is not a directory", dir.display()),
            std::io::Error::from_raw_os_error(libc::ENOTDIR),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fs::DirBuilder::new()
                .mode(PRIVATE_DIR)
                .create(dir)
                .or_else(|e| {
                    // Created meanwhile by someone else: check it again.
                    if e.kind() == std::io::ErrorKind::AlreadyExists {
                        Ok(())
                    } else {
                        Err(e)
                    }
                })
                .ctx("create", dir)?;
            ensure_real_dir_exists(dir)
        }
        Err(e) => Err(Error::io(format!("stat {}", dir.display()), e)),
    }
}

fn ensure_real_dir_exists(dir: &Path) -> Result<()> {
    let meta = fs::symlink_metadata(dir).ctx("stat", dir)?;
    if meta.is_dir() {
        Ok(())
    } else {
        Err(Error::Corrupt(format!(
            "{} is not a real directory",
            dir.display()
        )))
    }
}

/// True if `dir` exists as a real directory (not a link to one).
pub fn is_real_dir(dir: &Path) -> bool {
    fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir())
}

/// Make an existing directory owner-only (0700): the store and state roots, so that no
/// other user can reach what is inside, whatever modes older versions created it with.
pub fn make_private(dir: &Path) -> Result<()> {
    let meta = fs::symlink_metadata(dir).ctx("stat", dir)?;
    if !meta.is_dir() {
        return Err(Error::io(
            format!("{} is not a directory", dir.display()),
            std::io::Error::from_raw_os_error(libc::ENOTDIR),
        ));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode(PRIVATE_DIR)).ctx("chmod", dir)?;
    }
    Ok(())
}

/// Start writing `file`'s dirty pages back to the disk, without waiting
/// (`sync_file_range(SYNC_FILE_RANGE_WRITE)`): its later fsync then waits for less, and
/// the disk writes while the caller goes on. Advisory: a failure shows at the fsync.
pub fn start_writeback(file: &fs::File) {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is open for the duration of the call; no memory is passed.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
    }
}

/// Copy all of `from` (from its start) to the end of `to` (an empty file) inside the kernel
/// (`copy_file_range`): no bytes through this process, and extents shared where the
/// filesystem can. `Ok(false)`, with nothing copied, where the kernel cannot (another
/// filesystem type, a filesystem without it): copy by hand then.
pub fn copy_in_kernel(from: &fs::File, to: &fs::File, what: &Path) -> Result<bool> {
    use std::os::fd::AsRawFd;
    let mut copied = 0u64;
    loop {
        // SAFETY: both descriptors are open for the duration of the call; null offsets
        // use (and advance) the files' own.
        let n = unsafe {
            libc::copy_file_range(
                from.as_raw_fd(),
                std::ptr::null_mut(),
                to.as_raw_fd(),
                std::ptr::null_mut(),
                1 << 30,
                0,
            )
        };
        match n {
            0 => return Ok(true),
            n if n > 0 => copied += n as u64,
            _ => {
                let e = std::io::Error::last_os_error();
                let unsupported = matches!(
                    e.raw_os_error(),
                    Some(libc::EXDEV | libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)
                );
                match e.kind() {
                    std::io::ErrorKind::Interrupted => {}
                    _ if unsupported && copied == 0 => return Ok(false),
                    _ => return Err(Error::io(format!("copy to {}", what.display()), e)),
                }
            }
        }
    }
}

/// Make `to` (an empty file) share `from`'s extents (`ioctl(FICLONE)`): a copy that writes
/// no data, on filesystems that share extents (btrfs, XFS with reflink). False, with `to`
/// left empty, where they cannot (another filesystem, ext4, tmpfs, a FUSE mount): copy
/// then.
pub fn reflink(from: &fs::File, to: &fs::File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: both descriptors are open for the duration of the call; FICLONE reads no
    // memory of ours.
    unsafe { libc::ioctl(to.as_raw_fd(), libc::FICLONE, from.as_raw_fd()) == 0 }
}

/// Options for creating a new private file: it must not exist (O_EXCL, which also refuses a
/// symbolic link in its place), mode 0600.
pub fn create_new_private() -> OpenOptions {
    let mut options = OpenOptions::new();
    options
        .write(true)
        .create_new(true)
        .mode(PRIVATE_FILE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    options
}

/// Options for opening (or creating) a private file in place, never through a symbolic link.
pub fn open_private() -> OpenOptions {
    let mut options = OpenOptions::new();
    options
        .mode(PRIVATE_FILE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    options
}

/// Write `bytes` to `path` so that after a crash `path` holds either the old content or the
/// new, never a mix: a new temporary file (O_EXCL, random name, 0600), fsync, rename, fsync
/// of the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{file_name}.tmp-"))
        .permissions(fs::Permissions::from_mode(PRIVATE_FILE))
        .tempfile_in(dir)
        .ctx("create a temporary file in", dir)?;
    let tmp_path = tmp.path().to_path_buf();
    tmp.write_all(bytes).ctx("write", &tmp_path)?;
    tmp.as_file().sync_all().ctx("fsync", &tmp_path)?;
    crate::failpoint!("fsutil::before-rename");
    tmp.persist(path)
        .map_err(|e| Error::io(format!("rename into place {}", path.display()), e.error))?;
    crate::failpoint!("fsutil::after-rename");
    fsync_dir(dir)
}

/// True for the name of a leftover temporary file of [`write_atomic`].
pub fn is_atomic_leftover(name: &str) -> bool {
    name.starts_with('.') && name.contains(".tmp-")
}

/// True if `dir` does not exist or has no entries.
pub fn is_empty_or_missing(dir: &Path) -> Result<bool> {
    match fs::read_dir(dir) {
        Ok(mut entries) => Ok(entries.next().is_none()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(Error::io(format!("read {}", dir.display()), e)),
    }
}

/// Remove a directory tree, treating "already gone" as success.
pub fn remove_tree(dir: &Path) -> Result<()> {
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("remove {}", dir.display()), e)),
    }
}

/// Lock a mutex, going on with what a panicked holder left (every guarded state here
/// stays consistent between statements).
pub fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// [`lock`] for reading a `RwLock`.
pub fn read<T>(l: &std::sync::RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

/// [`lock`] for writing a `RwLock`.
pub fn write<T>(l: &std::sync::RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

/// Wait on a condition variable with [`lock`]'s guard, going on as [`lock`] does.
pub fn wait<'a, T>(
    c: &std::sync::Condvar,
    guard: std::sync::MutexGuard<'a, T>,
) -> std::sync::MutexGuard<'a, T> {
    c.wait(guard).unwrap_or_else(|p| p.into_inner())
}

/// [`wait`] for at most `timeout`.
pub fn wait_timeout<'a, T>(
    c: &std::sync::Condvar,
    guard: std::sync::MutexGuard<'a, T>,
    timeout: std::time::Duration,
) -> std::sync::MutexGuard<'a, T> {
    c.wait_timeout(guard, timeout)
        .unwrap_or_else(|p| p.into_inner())
        .0
}

/// Call `f` on every item, on up to `workers` scoped threads taking the next item as they
/// are free; the results in the items' order. One worker (or one item) calls it in turn on
/// this thread.
pub fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    workers: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let workers = workers.min(items.len());
    if workers <= 1 {
        return items.iter().map(f).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done = std::sync::Mutex::new(Vec::with_capacity(items.len()));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Some(item) = items.get(i) else {
                    break;
                };
                let result = f(item);
                lock(&done).push((i, result));
            });
        }
    });
    let mut done = done.into_inner().unwrap_or_else(|p| p.into_inner());
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, result)| result).collect()
}

/// Time since boot, suspends included (`CLOCK_BOOTTIME`): what a lease's validity is
/// measured on, since the monotonic clock stops while the host is suspended.
pub fn boot_now() -> std::time::Duration {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME) {
        Ok(t) => std::time::Duration::new(t.tv_sec() as u64, t.tv_nsec() as u32),
        // Not expected on Linux: then the monotonic clock, since the first call.
        Err(_) => {
            static FIRST: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
            FIRST.get_or_init(std::time::Instant::now).elapsed()
        }
    }
}

/// Milliseconds since the Unix epoch, for timestamps in manifests.
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Return memory the allocator holds free to the system (after loading thousands of
/// manifests, or building a large status text), where the allocator supports it.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of glibc's heap.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Raise this process's soft limit of open files to its hard limit (once is enough; a
/// failure leaves the limit as it was).
pub fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the one struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's copy is the whole file.
    #[test]
    fn a_copy_in_the_kernel_is_the_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        fs::write(dir.path().join("a"), &bytes).unwrap();
        let from = fs::File::open(dir.path().join("a")).unwrap();
        let to_path = dir.path().join("b");
        let to = create_new_private().open(&to_path).unwrap();
        assert!(copy_in_kernel(&from, &to, &to_path).unwrap());
        assert_eq!(fs::read(&to_path).unwrap(), bytes);
        // A target not open for writing is an error, not a fallback.
        let again = fs::File::open(dir.path().join("a")).unwrap();
        let read_only = fs::File::open(&to_path).unwrap();
        assert!(copy_in_kernel(&again, &read_only, &to_path).is_err());
    }

    /// A symbolic link planted where a temporary or target file goes is never followed.
    #[test]
    fn atomic_writes_never_follow_planted_links() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, b"precious").unwrap();
        // A fixed temporary name (`NAME.tmp`), and the target itself, as links to the victim.
        std::os::unix::fs::symlink(
            &victim,
            dir.path()
                .join(format!(".m.json.tmp-{}", std::process::id())),
        )
        .unwrap();
        let target = dir.path().join("m.json");
        std::os::unix::fs::symlink(&victim, &target).unwrap();
        write_atomic(&target, b"new").unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        assert_eq!(fs::read(&target).unwrap(), b"new");
        assert!(!fs::symlink_metadata(&target)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(
            fs::metadata(&target).unwrap().permissions().mode() & 0o777,
            PRIVATE_FILE
        );
    }

    #[test]
    fn new_private_files_refuse_links() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, b"precious").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        assert!(create_new_private().open(&link).is_err());
        let err = open_private().write(true).open(&link).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP));
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
    }
}
