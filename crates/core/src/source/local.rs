//! A source on a local filesystem: a directory opened once, every path below it resolved one
//! component at a time with `openat(O_PATH | O_NOFOLLOW)`, so that no symbolic link and no
//! `..` is ever followed, whatever the source's writer renames or swaps in meanwhile.
//!
//! A file is first opened as a path descriptor (`O_PATH`: opening it has no effect on the
//! file, a FIFO does not block, a device is not touched), checked to be a regular file by
//! `fstat`, and only then opened for reading through `/proc/self/fd/N`, which names that
//! inode and no other. The result, [`SourceFile`], is read through its descriptor and checked
//! again by `fstat` after the read.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstat, FileStat, Mode, SFlag};

use super::{checked_relative, refused, Entry, EntryKind, Fetched, FileStamp, Tree};
use crate::error::{Error, IoContext, Result};

/// A local directory as a source's root.
#[derive(Debug)]
pub struct LocalTree {
    /// As named by the user, made absolute (paths a `_metadata` names are compared with it).
    given: PathBuf,
    /// Where it is (symbolic links the user's path goes through resolved once, here).
    canonical: PathBuf,
    /// The directory, as a path descriptor.
    dir: OwnedFd,
}

fn kind_of(stat: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(stat.st_mode & SFlag::S_IFMT.bits())
}

fn kind_name(kind: SFlag) -> &'static str {
    match kind {
        SFlag::S_IFLNK => "a symbolic link",
        SFlag::S_IFDIR => "a directory",
        SFlag::S_IFIFO => "a FIFO",
        SFlag::S_IFSOCK => "a socket",
        SFlag::S_IFCHR => "a character device",
        SFlag::S_IFBLK => "a block device",
        _ => "not a regular file",
    }
}

fn os_error(what: &str, path: &Path, errno: nix::errno::Errno) -> Error {
    Error::io(
        format!("{what} {}", path.display()),
        std::io::Error::from_raw_os_error(errno as i32),
    )
}

impl LocalTree {
    /// The directory the user named (a command's argument: symbolic links on the way to
    /// it are the user's and are followed here, once).
    ///
    /// A link on the way is followed only where nobody but root (or this user) can have
    /// put it: in a directory owned by one of them that no one else may write. A link in
    /// a directory the source's writer controls (SRC's parent, say) could point the root
    /// anywhere: refused (EACCES). The resolved path is then opened one component at a
    /// time from `/` without following links, so none swapped in meanwhile is either.
    pub fn open(path: &Path) -> Result<LocalTree> {
        let given = std::path::absolute(path).ctx("resolve", path)?;
        let (canonical, dir) = open_trusted_dir(&given)?;
        Ok(LocalTree {
            given,
            canonical,
            dir,
        })
    }

    /// Where the root is.
    pub fn path(&self) -> &Path {
        &self.canonical
    }

    fn shown(&self, rel: &str) -> PathBuf {
        if rel.is_empty() {
            self.canonical.clone()
        } else {
            self.canonical.join(rel)
        }
    }

    /// A path descriptor of `rel` (no component a link), with its `fstat`; `None` if a
    /// component does not exist.
    fn resolve(&self, rel: &str) -> Result<Option<(OwnedFd, FileStat)>> {
        let shown = self.shown(rel);
        if rel.is_empty() {
            let fd = self.dir.try_clone().ctx("open", &shown)?;
            let stat = fstat(&fd).map_err(|e| os_error("stat", &shown, e))?;
            return Ok(Some((fd, stat)));
        }
        checked_relative(&shown.display(), rel)?;
        let mut parts = rel.split('/').peekable();
        let mut at: Option<OwnedFd> = None;
        while let Some(part) = parts.next() {
            let base = at.as_ref().map_or(self.dir.as_fd(), |fd| fd.as_fd());
            let fd = match open_component(base, part) {
                Ok(fd) => fd,
                Err(nix::errno::Errno::ENOENT) => return Ok(None),
                Err(nix::errno::Errno::EXDEV) => {
                    return Err(refused(
                        shown.display(),
                        format!(
                            "{part} is a mount point: ckptfs reads a source within the \
                             filesystem of its root (another one mounted inside, such as a \
                             FUSE filesystem of the writer's, could stall or feed any read)"
                        ),
                        libc::EXDEV,
                    ))
                }
                Err(e) => return Err(os_error("open", &shown, e)),
            };
            let stat = fstat(&fd).map_err(|e| os_error("stat", &shown, e))?;
            let kind = kind_of(&stat);
            if kind == SFlag::S_IFLNK {
                return Err(refused(
                    shown.display(),
                    "a symbolic link: ckptfs follows no link in a source",
                    libc::ELOOP,
                ));
            }
            if parts.peek().is_none() {
                return Ok(Some((fd, stat)));
            }
            if kind != SFlag::S_IFDIR {
                return Ok(None);
            }
            at = Some(fd);
        }
        unreachable!("a checked path has a last component")
    }

    /// The devices `/proc/locks` may name `rel` by, and its inode (it is not opened for
    /// reading: closing a descriptor of a file would drop every POSIX lock this process
    /// holds on it); `None` if it does not exist. The devices are its `st_dev` and the
    /// device of the mount that holds it (`/proc/self/mountinfo`, found by `statx`'s mount
    /// id): they differ on a btrfs subvolume, whose files have a device of their own while
    /// locks are listed by the filesystem's.
    pub fn lock_identity(&self, rel: &str) -> Result<Option<(Vec<u64>, u64)>> {
        let Some((fd, stat)) = self.resolve(rel)? else {
            return Ok(None);
        };
        let mut devs = vec![stat.st_dev];
        if let Some(dev) = mount_device(&fd).filter(|d| *d != stat.st_dev) {
            devs.push(dev);
        }
        Ok(Some((devs, stat.st_ino)))
    }

    /// Regular file `rel`, opened for reading; `None` if it does not exist.
    pub fn open_file(&self, rel: &str) -> Result<Option<SourceFile>> {
        let Some((fd, stat)) = self.resolve_file(rel)? else {
            return Ok(None);
        };
        let shown = self.shown(rel);
        // The inode the path descriptor holds, opened for reading; O_NONBLOCK as a second
        // guard (it changes nothing for a regular file).
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
            .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .ctx("open", &shown)?;
        let meta = file.metadata().ctx("stat", &shown)?;
        if meta.dev() != stat.st_dev || meta.ino() != stat.st_ino || !meta.is_file() {
            return Err(Error::Invalid(format!(
                "{} changed while it was opened",
                shown.display()
            )));
        }
        Ok(Some(SourceFile {
            stamp: Stamp::of(&meta),
            file,
            path: shown,
        }))
    }

    /// A path descriptor of regular file `rel`, with its `fstat`; `None` if it does not
    /// exist; a link (ELOOP) or any other kind of file (EINVAL) refused.
    fn resolve_file(&self, rel: &str) -> Result<Option<(OwnedFd, FileStat)>> {
        let Some((fd, stat)) = self.resolve(rel)? else {
            return Ok(None);
        };
        let kind = kind_of(&stat);
        if kind != SFlag::S_IFREG {
            return Err(refused(
                self.shown(rel).display(),
                format!("{}: ckptfs reads regular files only", kind_name(kind)),
                if kind == SFlag::S_IFLNK {
                    libc::ELOOP
                } else {
                    libc::EINVAL
                },
            ));
        }
        Ok(Some((fd, stat)))
    }

    /// The entries of directory `rel` as readdir gives them: each name (checked to be
    /// UTF-8) and its type where the filesystem records it; with the directory's descriptor
    /// and its path for messages.
    #[allow(clippy::type_complexity)]
    fn dir_entries(
        &self,
        rel: &str,
    ) -> Result<(OwnedFd, PathBuf, Vec<(String, Option<nix::dir::Type>)>)> {
        let shown = self.shown(rel);
        let Some((fd, stat)) = self.resolve(rel)? else {
            return Err(os_error(
                "read directory",
                &shown,
                nix::errno::Errno::ENOENT,
            ));
        };
        if kind_of(&stat) != SFlag::S_IFDIR {
            return Err(os_error(
                "read directory",
                &shown,
                nix::errno::Errno::ENOTDIR,
            ));
        }
        // The directory the descriptor holds (not whatever is at its path now).
        let mut dir = nix::dir::Dir::openat(
            &fd,
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| os_error("read directory", &shown, e))?;
        let mut out = Vec::new();
        for entry in dir.iter() {
            let entry = entry.map_err(|e| os_error("read directory", &shown, e))?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let Ok(name) = std::str::from_utf8(name) else {
                return Err(refused(
                    shown
                        .join(std::ffi::OsStr::from_bytes(entry.file_name().to_bytes()))
                        .display(),
                    "a name that is not UTF-8",
                    libc::EINVAL,
                ));
            };
            out.push((name.to_string(), entry.file_type()));
        }
        Ok((fd, shown, out))
    }

    /// `rel` below the root as an absolute path, `None` if it is not below it.
    fn below(&self, abs: &str) -> Option<String> {
        let abs = Path::new(abs);
        [&self.canonical, &self.given].into_iter().find_map(|root| {
            let rest = abs.strip_prefix(root).ok()?;
            let rest = rest.to_str()?;
            // Lexically below, and plain (no `..` climbing back out).
            checked_relative(&rest, rest).ok().map(str::to_string)
        })
    }
}

/// The directory `given` (absolute) names, with symbolic links on the way followed only as
/// [`LocalTree::open`] says (where nobody but root or this user can have put them): where
/// it is, and a path descriptor of it opened one component at a time from `/` without
/// following links, so that none swapped in meanwhile is either. A source's root, and the
/// directory an export writes into (`export-flink DEST`'s parent), are reached so.
pub fn open_trusted_dir(given: &Path) -> Result<(PathBuf, OwnedFd)> {
    let canonical = resolve_trusted(given)?;
    let mut dir = nix::fcntl::open(
        "/",
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| os_error("open", Path::new("/"), e))?;
    for part in canonical.components().skip(1) {
        let next = openat(
            &dir,
            part.as_os_str(),
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| os_error("open", &canonical, e))?;
        let stat = fstat(&next).map_err(|e| os_error("stat", &canonical, e))?;
        if kind_of(&stat) != SFlag::S_IFDIR {
            return Err(refused(
                canonical.display(),
                format!(
                    "{} on the way is {} (changed while it was opened?)",
                    part.as_os_str().to_string_lossy(),
                    kind_name(kind_of(&stat))
                ),
                libc::ELOOP,
            ));
        }
        dir = next;
    }
    Ok((canonical, dir))
}

/// `given` (absolute) resolved as the kernel would, `..` and links included, following a
/// link only where it lies in a directory owned by root or this user and writable by no
/// one else (see [`LocalTree::open`]).
pub fn resolve_trusted(given: &Path) -> Result<PathBuf> {
    resolve_links(given, 0)
}

/// Links followed at most on the way to one path (the kernel's limit).
const MAX_LINKS: usize = 40;

fn resolve_links(given: &Path, followed: usize) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    use std::path::Component;
    let me = nix::unistd::geteuid().as_raw();
    let mut at = PathBuf::from("/");
    for part in given.components() {
        match part {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                at.pop();
            }
            Component::Normal(name) => {
                let next = at.join(name);
                let meta = std::fs::symlink_metadata(&next).ctx("open", given)?;
                if !meta.file_type().is_symlink() {
                    at = next;
                    continue;
                }
                let parent = std::fs::metadata(&at).ctx("stat", &at)?;
                let trusted = (parent.uid() == 0 || parent.uid() == me)
                    && parent.permissions().mode() & 0o022 == 0;
                if !trusted {
                    return Err(refused(
                        next.display(),
                        format!(
                            "a symbolic link in {}, which others may write: ckptfs follows a \
                             link on the way to a source or an export's destination only in \
                             a directory only root can change; name the directory it points \
                             to",
                            at.display()
                        ),
                        libc::EACCES,
                    ));
                }
                if followed >= MAX_LINKS {
                    return Err(refused(
                        given.display(),
                        format!("more than {MAX_LINKS} symbolic links on the way"),
                        libc::ELOOP,
                    ));
                }
                // Trusted: where it points, resolved in turn (its own links included).
                let target = at.join(std::fs::read_link(&next).ctx("read", &next)?);
                at = resolve_links(&target, followed + 1)?;
            }
        }
    }
    Ok(at)
}

/// The device (`major:minor` in `/proc/self/mountinfo`) of the mount holding `fd`, by its
/// mount id; `None` where the kernel does not tell (before Linux 5.8).
fn mount_device(fd: &OwnedFd) -> Option<u64> {
    // SAFETY: statx writes the one struct given; the path is empty (AT_EMPTY_PATH: `fd`
    // itself).
    let mut buf: libc::statx = unsafe { std::mem::zeroed() };
    let done = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_MNT_ID,
            &mut buf,
        )
    };
    if done != 0 || buf.stx_mask & libc::STATX_MNT_ID == 0 {
        return None;
    }
    let id = buf.stx_mnt_id.to_string();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounts.lines().find_map(|line| {
        let mut fields = line.split(' ');
        if fields.next()? != id {
            return None;
        }
        let (major, minor) = fields.nth(1)?.split_once(':')?;
        Some(libc::makedev(major.parse().ok()?, minor.parse().ok()?))
    })
}

/// One component below `base`, as a path descriptor: no link followed (`O_NOFOLLOW`: a
/// link is opened as itself, for the caller to refuse) and no mount point crossed
/// (`RESOLVE_NO_XDEV`: EXDEV, before anything of the mounted filesystem is asked). Before
/// Linux 5.6 (no `openat2`), mount points are crossed.
fn open_component(base: std::os::fd::BorrowedFd<'_>, part: &str) -> nix::Result<OwnedFd> {
    use nix::fcntl::{openat2, OpenHow, ResolveFlag};
    let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let how = OpenHow::new()
        .flags(flags)
        .resolve(ResolveFlag::RESOLVE_NO_XDEV | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    match openat2(base, part, how) {
        Err(nix::errno::Errno::ENOSYS) => openat(base, part, flags, Mode::empty()),
        opened => opened,
    }
}

impl Tree for LocalTree {
    fn describe(&self) -> String {
        self.canonical.display().to_string()
    }

    fn list(&self, rel: &str) -> Result<Vec<Entry>> {
        let (fd, shown, entries) = self.dir_entries(rel)?;
        let mut out = Vec::new();
        for (name, _) in entries {
            // lstat, relative to the descriptor.
            let stat = match nix::sys::stat::fstatat(
                &fd,
                name.as_str(),
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            ) {
                Ok(stat) => stat,
                Err(nix::errno::Errno::ENOENT) => continue, // deleted meanwhile
                Err(e) => return Err(os_error("stat", &shown.join(&name), e)),
            };
            let (kind, size) = match kind_of(&stat) {
                SFlag::S_IFREG => (EntryKind::File, stat.st_size as u64),
                SFlag::S_IFDIR => (EntryKind::Dir, 0),
                _ => (EntryKind::Other, 0),
            };
            out.push(Entry {
                name,
                kind,
                size,
                modified: Some(mtime_of(&stat)),
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn list_kinds(&self, rel: &str) -> Result<Vec<(String, EntryKind)>> {
        let (fd, shown, entries) = self.dir_entries(rel)?;
        let mut out = Vec::with_capacity(entries.len());
        for (name, known) in entries {
            use nix::dir::Type;
            let kind = match known {
                Some(Type::File) => EntryKind::File,
                Some(Type::Directory) => EntryKind::Dir,
                Some(_) => EntryKind::Other,
                // The filesystem records no type: lstat, relative to the descriptor.
                None => match nix::sys::stat::fstatat(
                    &fd,
                    name.as_str(),
                    nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                ) {
                    Ok(stat) => match kind_of(&stat) {
                        SFlag::S_IFREG => EntryKind::File,
                        SFlag::S_IFDIR => EntryKind::Dir,
                        _ => EntryKind::Other,
                    },
                    Err(nix::errno::Errno::ENOENT) => continue, // deleted meanwhile
                    Err(e) => return Err(os_error("stat", &shown.join(&name), e)),
                },
            };
            out.push((name, kind));
        }
        Ok(out)
    }

    fn size_of(&self, rel: &str) -> Result<Option<u64>> {
        // The path descriptor's fstat: nothing is opened for reading.
        Ok(self.resolve_file(rel)?.map(|(_, stat)| stat.st_size as u64))
    }

    fn stamp(&self, rel: &str) -> Result<Option<FileStamp>> {
        Ok(self.resolve_file(rel)?.map(|(_, stat)| FileStamp {
            size: stat.st_size as u64,
            modified: Some(mtime_of(&stat)),
        }))
    }

    fn read(&self, rel: &str, limit: u64) -> Result<Vec<u8>> {
        let shown = self.shown(rel);
        let file = self
            .open_file(rel)?
            .ok_or_else(|| os_error("read", &shown, nix::errno::Errno::ENOENT))?;
        file.read_all(limit)
    }

    fn fetch(&self, rel: &str, _staging: &Path, _name: &str, _limit: u64) -> Result<Fetched> {
        let shown = self.shown(rel);
        self.open_file(rel)?
            .map(|f| Fetched::Open(std::sync::Arc::new(f)))
            .ok_or_else(|| os_error("open", &shown, nix::errno::Errno::ENOENT))
    }

    fn fetch_segment(
        &self,
        rel: &str,
        _start: u64,
        _size: u64,
        staging: &Path,
        name: &str,
    ) -> Result<Fetched> {
        // Held open whole, unread: the caller reads the range it needs through it.
        self.fetch(rel, staging, name, u64::MAX)
    }

    fn locate(&self, uri: &str) -> Option<String> {
        let path = uri
            .strip_prefix("file://")
            .or_else(|| uri.strip_prefix("file:"))?;
        self.below(path)
    }

    fn immutable_name(&self, _rel: &str) -> Option<String> {
        None
    }

    fn remove_file(&self, rel: &str, seen: &super::Walked) -> Result<bool> {
        let shown = self.shown(rel);
        let Some((parent, name)) = self.parent_of(rel)? else {
            return Ok(false);
        };
        let stat = match nix::sys::stat::fstatat(
            &parent,
            name,
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(stat) => stat,
            Err(nix::errno::Errno::ENOENT) => return Ok(false),
            Err(e) => return Err(os_error("stat", &shown, e)),
        };
        let kind = kind_of(&stat);
        if kind != SFlag::S_IFREG {
            return Err(refused(
                shown.display(),
                format!("{}: ckptfs deletes regular files only", kind_name(kind)),
                libc::EINVAL,
            ));
        }
        if stat.st_size as u64 != seen.size || Some(mtime_of(&stat)) != seen.modified {
            return Err(refused(
                shown.display(),
                "written since it was listed: not deleted",
                libc::EAGAIN,
            ));
        }
        match nix::unistd::unlinkat(&parent, name, nix::unistd::UnlinkatFlags::NoRemoveDir) {
            Ok(()) => Ok(true),
            Err(nix::errno::Errno::ENOENT) => Ok(false),
            Err(e) => Err(os_error("delete", &shown, e)),
        }
    }

    fn remove_empty_dir(&self, rel: &str) -> Result<bool> {
        let shown = self.shown(rel);
        let Some((parent, name)) = self.parent_of(rel)? else {
            return Ok(false);
        };
        match nix::unistd::unlinkat(&parent, name, nix::unistd::UnlinkatFlags::RemoveDir) {
            Ok(()) => Ok(true),
            Err(
                nix::errno::Errno::ENOENT
                | nix::errno::Errno::ENOTEMPTY
                | nix::errno::Errno::EEXIST,
            ) => Ok(false),
            Err(e) => Err(os_error("delete", &shown, e)),
        }
    }
}

/// A file's modification time.
fn mtime_of(stat: &FileStat) -> std::time::SystemTime {
    let since = std::time::Duration::new(stat.st_mtime.max(0) as u64, stat.st_mtime_nsec as u32);
    std::time::UNIX_EPOCH + since
}

impl LocalTree {
    /// The directory holding `rel` (a path descriptor, no component a link) and `rel`'s
    /// last name; `None` if the directory is not there.
    fn parent_of<'r>(&self, rel: &'r str) -> Result<Option<(OwnedFd, &'r str)>> {
        let shown = self.shown(rel);
        checked_relative(&shown.display(), rel)?;
        let (dir, name) = rel.rsplit_once('/').unwrap_or(("", rel));
        let Some((fd, stat)) = self.resolve(dir)? else {
            return Ok(None);
        };
        if kind_of(&stat) != SFlag::S_IFDIR {
            return Ok(None);
        }
        Ok(Some((fd, name)))
    }
}

/// What identifies a version of a file while it is read: device, inode, size and
/// modification time (seconds.nanoseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// The device the file is on (`st_dev`).
    pub dev: u64,
    /// Its inode number.
    pub ino: u64,
    /// Its length in bytes.
    pub size: u64,
    /// Its modification time: seconds since the Unix epoch.
    pub mtime: i64,
    /// The nanoseconds of the modification time (0 to 999,999,999).
    pub mtime_nsec: i64,
}

impl Stamp {
    /// The stamp of a file with this metadata.
    pub fn of(meta: &std::fs::Metadata) -> Stamp {
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec(),
        }
    }
}

impl std::fmt::Display for Stamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{}:{}.{:09}",
            self.dev, self.ino, self.size, self.mtime, self.mtime_nsec
        )
    }
}

/// A regular file of a source, open for reading: its bytes are read through the descriptor
/// (as `/proc/self/fd/N` by code that opens paths), so renaming, replacing or deleting
/// what is at its path changes nothing that is read.
#[derive(Debug)]
pub struct SourceFile {
    file: std::fs::File,
    /// Where it was found, for messages.
    pub path: PathBuf,
    /// As it was when opened.
    pub stamp: Stamp,
}

impl SourceFile {
    /// Where the process reads it from: the descriptor, by a path.
    pub fn fd_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }

    /// The open file itself.
    pub fn file(&self) -> &std::fs::File {
        &self.file
    }

    /// Its `fstat` now, as a stamp.
    pub fn stamp_now(&self) -> Result<Stamp> {
        Ok(Stamp::of(&self.file.metadata().ctx("stat", &self.path)?))
    }

    /// Fail unless it is as it was when opened (written since: size or mtime changed).
    pub fn check_unchanged(&self) -> Result<()> {
        if self.stamp_now()? != self.stamp {
            return Err(Error::Invalid(format!(
                "{} changed while it was imported; nothing was imported (import a checkpoint \
                 directory, which nobody writes to)",
                self.path.display()
            )));
        }
        Ok(())
    }

    /// Its bytes, refused before anything is read if it holds more than `limit`, and
    /// refused if it changed while read.
    pub fn read_all(&self, limit: u64) -> Result<Vec<u8>> {
        use std::io::Read;
        if self.stamp.size > limit {
            return Err(super::refused(
                self.path.display(),
                format!(
                    "{} bytes, more than the {limit} ckptfs reads of such a file",
                    self.stamp.size
                ),
                libc::EINVAL,
            ));
        }
        let mut out = Vec::with_capacity(self.stamp.size as usize);
        // One byte more than allowed tells a file that grew since.
        (&self.file)
            .take(limit + 1)
            .read_to_end(&mut out)
            .ctx("read", &self.path)?;
        if out.len() as u64 != self.stamp.size {
            return Err(Error::Invalid(format!(
                "{} changed while it was read",
                self.path.display()
            )));
        }
        self.check_unchanged()?;
        Ok(out)
    }

    /// Bytes `[offset, offset + len)` (less at the end of the file).
    pub fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let mut out = vec![0u8; len];
        let mut done = 0;
        while done < len {
            match self
                .file
                .read_at(&mut out[done..], offset + done as u64)
                .ctx("read", &self.path)?
            {
                0 => break,
                n => done += n,
            }
        }
        out.truncate(done);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree_with_files() -> (tempfile::TempDir, LocalTree) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("shared")).unwrap();
        std::fs::write(dir.path().join("shared/a"), b"alpha").unwrap();
        std::fs::write(dir.path().join("top"), b"t").unwrap();
        let tree = LocalTree::open(dir.path()).unwrap();
        (dir, tree)
    }

    #[test]
    fn only_the_regular_file_listed_is_removed() {
        let (dir, tree) = tree_with_files();
        std::os::unix::fs::symlink(dir.path().join("top"), dir.path().join("shared/link")).unwrap();
        let walked = tree.walk("").unwrap();
        let names: Vec<&str> = walked.iter().map(|w| w.rel.as_str()).collect();
        assert_eq!(names, ["shared", "shared/a", "shared/link", "top"]);
        let seen = |rel: &str| walked.iter().find(|w| w.rel == rel).unwrap().clone();
        // Written since it was listed: kept.
        std::fs::write(dir.path().join("shared/a"), b"alpha, longer").unwrap();
        let e = tree.remove_file("shared/a", &seen("shared/a")).unwrap_err();
        assert_eq!(e.errno(), libc::EAGAIN, "{e}");
        assert!(dir.path().join("shared/a").exists());
        // A link is never removed (nor what it points to).
        let e = tree
            .remove_file("shared/link", &seen("shared/a"))
            .unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{e}");
        // As listed: removed; then gone.
        let top = seen("top");
        assert!(tree.remove_file("top", &top).unwrap());
        assert!(!tree.remove_file("top", &top).unwrap());
        // A directory only when empty.
        assert!(!tree.remove_empty_dir("shared").unwrap());
        assert!(dir.path().join("shared").is_dir());
        let e = tree.remove_file("../x", &top).unwrap_err();
        assert_eq!(e.errno(), libc::EACCES, "{e}");
    }

    #[test]
    fn files_below_the_root_are_read() {
        let (_dir, tree) = tree_with_files();
        assert_eq!(tree.read("shared/a", 100).unwrap(), b"alpha");
        assert_eq!(tree.size_of("top").unwrap(), Some(1));
        assert_eq!(tree.size_of("missing").unwrap(), None);
        assert_eq!(tree.size_of("top/x").unwrap(), None);
        let names: Vec<String> = tree.list("").unwrap().into_iter().map(|e| e.name).collect();
        assert_eq!(names, ["shared", "top"]);
    }

    #[test]
    fn links_are_refused_anywhere_on_the_path() {
        let (dir, tree) = tree_with_files();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("link")).unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("etc")).unwrap();
        std::os::unix::fs::symlink("shared", dir.path().join("inner")).unwrap();
        for rel in ["link", "etc/passwd", "inner/a"] {
            let e = tree.read(rel, 100).unwrap_err();
            assert_eq!(e.errno(), libc::ELOOP, "{rel}: {e}");
            assert!(e.to_string().contains("symbolic link"), "{e}");
        }
        let e = tree.read("shared/../top", 100).unwrap_err();
        assert_eq!(e.errno(), libc::EACCES, "{e}");
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let (dir, tree) = tree_with_files();
        nix::unistd::mkfifo(&dir.path().join("fifo"), Mode::S_IRWXU).unwrap();
        let e = tree.read("fifo", 100).unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{e}");
        assert!(e.to_string().contains("FIFO"), "{e}");
        let listed = tree.list("").unwrap();
        assert!(listed
            .iter()
            .any(|e| e.name == "fifo" && e.kind == EntryKind::Other));
    }

    #[test]
    fn a_file_over_the_limit_is_refused_unread() {
        let (dir, tree) = tree_with_files();
        let big = std::fs::File::create(dir.path().join("big")).unwrap();
        big.set_len(3 << 30).unwrap(); // sparse: nothing is written
        let e = tree.read("big", 1 << 20).unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL);
        assert!(e.to_string().contains("3221225472 bytes"), "{e}");
    }

    #[test]
    fn what_is_read_is_the_file_opened_whatever_is_swapped_in() {
        let (dir, tree) = tree_with_files();
        let opened = tree.open_file("shared/a").unwrap().unwrap();
        std::fs::rename(dir.path().join("shared/a"), dir.path().join("shared/moved")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("shared/a")).unwrap();
        assert_eq!(std::fs::read(opened.fd_path()).unwrap(), b"alpha");
        assert_eq!(opened.read_all(100).unwrap(), b"alpha");
        opened.check_unchanged().unwrap();
        std::fs::write(dir.path().join("shared/moved"), b"alpha, longer").unwrap();
        assert!(opened.check_unchanged().is_err());
    }

    #[test]
    fn a_root_is_reached_through_links_only_in_directories_others_cannot_write() {
        use std::os::unix::fs::PermissionsExt;
        let (dir, _) = tree_with_files();
        let links = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(dir.path(), links.path().join("job")).unwrap();
        // In a directory of this user's, 0700: followed.
        let tree = LocalTree::open(&links.path().join("job")).unwrap();
        assert_eq!(tree.path(), std::fs::canonicalize(dir.path()).unwrap());
        assert_eq!(tree.read("top", 10).unwrap(), b"t");
        // Through `..` too.
        let up = links.path().join("job/shared/..");
        assert_eq!(LocalTree::open(&up).unwrap().read("top", 10).unwrap(), b"t");
        // A loop of links ends.
        std::os::unix::fs::symlink("loop", links.path().join("loop")).unwrap();
        let e = LocalTree::open(&links.path().join("loop")).unwrap_err();
        assert_eq!(e.errno(), libc::ELOOP, "{e}");
        // In a directory anyone may write (where the source's writer may have put it).

        std::fs::set_permissions(links.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = LocalTree::open(&links.path().join("job")).unwrap_err();
        assert_eq!(e.errno(), libc::EACCES, "{e}");
        assert!(e.to_string().contains("others may write"), "{e}");
    }

    #[test]
    fn a_mount_inside_the_source_is_not_crossed() {
        let (dir, tree) = tree_with_files();
        let inner = dir.path().join("shared");
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "none"])
            .arg(&inner)
            .status()
            .unwrap();
        assert!(mounted.success());
        std::fs::write(inner.join("a"), b"on tmpfs").unwrap();
        let e = tree.read("shared/a", 100).unwrap_err();
        let _ = std::process::Command::new("umount").arg(&inner).status();
        assert_eq!(e.errno(), libc::EXDEV, "{e}");
        assert!(e.to_string().contains("mount point"), "{e}");
    }

    #[test]
    fn absolute_paths_are_located_below_the_root_only() {
        let (dir, tree) = tree_with_files();
        let root = tree.path().display().to_string();
        assert_eq!(
            tree.locate(&format!("file:{root}/shared/a")).as_deref(),
            Some("shared/a")
        );
        assert_eq!(
            tree.locate(&format!("file://{root}/shared/a")).as_deref(),
            Some("shared/a")
        );
        for outside in [
            "file:/etc/shadow".to_string(),
            format!("file:{root}/../../etc/shadow"),
            format!("file:{root}/shared/../../x"),
            format!("file:{root}"),
            "file:/proc/self/cmdline".into(),
            format!("s3://b{root}/shared/a"),
        ] {
            assert_eq!(tree.locate(&outside), None, "{outside}");
        }
        drop(dir);
    }
}
