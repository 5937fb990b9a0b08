//! The Flink follower's wake-up where its source is a local directory: inotify says when a
//! `_metadata` is written (or moved into place) in a checkpoint's directory, and the
//! follower looks at once instead of at its next poll. The poll stays, as the fallback for
//! whatever inotify misses (a directory made and filled before its watch was added, an
//! overflowed queue, more directories than [`MAX_WATCHES`]) and for object storage.
//!
//! Watched: the root (`mount --flink SRC`), the directories in it (jobs, or a job's
//! `chk-N/`) and theirs (a job's `chk-N/`), never `shared/` or `taskowned/` (thousands of
//! files and no `_metadata`). Nothing is read through a watch: an event only sets the
//! follower's flag, and the follower reads the source as it always does, through its
//! confined tree. Watches never follow a link below the root (`IN_DONT_FOLLOW`,
//! `IN_ONLYDIR`); a root that cannot be watched (no inotify watches left) leaves the poll
//! alone, and an overflowed queue re-watches the tree.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

/// The most directories watched at once; past it, the poll alone finds new checkpoints.
pub const MAX_WATCHES: usize = 4096;
/// How deep below the root directories are watched (the root is 0): a root of jobs'
/// directories holds `<job>/chk-N/`.
const DEPTH: usize = 2;
/// How long a wait for events lasts before the watcher checks whether to stop.
const WAIT_MS: u16 = 200;

/// inotify on a Flink checkpoint root, setting `due` whenever a checkpoint may have
/// completed.
pub struct Watcher {
    inotify: Inotify,
    root: PathBuf,
    watched: HashMap<WatchDescriptor, (PathBuf, usize)>,
    due: Arc<AtomicBool>,
}

impl Watcher {
    /// A watcher of `root` (which may not exist yet: it is watched once it does).
    pub fn new(root: &Path, due: Arc<AtomicBool>) -> nix::Result<Watcher> {
        Ok(Watcher {
            inotify: Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)?,
            root: root.to_path_buf(),
            watched: HashMap::new(),
            due,
        })
    }

    /// Watch events until `stopping` says so.
    pub fn run(mut self, stopping: impl Fn() -> bool) {
        while !stopping() {
            if let Err(e) = self.ensure_watching() {
                // Not a busy loop of attempts: the poll follows from here on.
                log::warn!(
                    "inotify cannot watch {}: {e}; the poll alone follows",
                    self.root.display()
                );
                return;
            }
            let mut fds = [nix::poll::PollFd::new(
                self.inotify.as_fd(),
                nix::poll::PollFlags::POLLIN,
            )];
            match nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(WAIT_MS)) {
                Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
                Ok(_) => {}
                Err(e) => {
                    log::warn!(
                        "inotify on {}: {e}; the poll alone follows",
                        self.root.display()
                    );
                    return;
                }
            }
            loop {
                match self.inotify.read_events() {
                    Ok(events) if !events.is_empty() => {
                        for event in events {
                            self.handle(event);
                        }
                    }
                    Ok(_) | Err(nix::errno::Errno::EAGAIN) => break,
                    Err(e) => {
                        log::warn!(
                            "inotify on {}: {e}; the poll alone follows",
                            self.root.display()
                        );
                        return;
                    }
                }
            }
        }
    }

    /// Watch the tree if nothing of it is watched (at start, once the root exists, after
    /// an overflow), and have the follower look: whatever completed before the watches
    /// were there.
    fn ensure_watching(&mut self) -> nix::Result<()> {
        if self.watched.is_empty() && self.root.is_dir() {
            let root = self.root.clone();
            self.watch_tree(&root, 0)?;
            self.due.store(true, Ordering::SeqCst);
        }
        Ok(())
    }

    fn handle(&mut self, event: nix::sys::inotify::InotifyEvent) {
        if event.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
            // Events were dropped, directories made meanwhile among them: watch the tree
            // again from the root (the next pass of the loop), and look now.
            for wd in std::mem::take(&mut self.watched).into_keys() {
                let _ = self.inotify.rm_watch(wd);
            }
            self.due.store(true, Ordering::SeqCst);
            return;
        }
        if event.mask.contains(AddWatchFlags::IN_IGNORED) {
            // Its directory is gone (Flink deleted a checkpoint it no longer retains).
            self.watched.remove(&event.wd);
            return;
        }
        let (Some(name), Some((dir, depth))) = (&event.name, self.watched.get(&event.wd)) else {
            return;
        };
        let (dir, depth) = (dir.clone(), *depth);
        let made = AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO;
        if event.mask.contains(AddWatchFlags::IN_ISDIR) {
            if event.mask.intersects(made) && depth < DEPTH {
                // Gone meanwhile, or not a directory: the poll finds what is there.
                let _ = self.watch_tree(&dir.join(name), depth + 1);
                // A directory filled before its watch was there is looked at now.
                self.due.store(true, Ordering::SeqCst);
            }
        } else if name == "_metadata"
            && event
                .mask
                .intersects(AddWatchFlags::IN_CLOSE_WRITE | AddWatchFlags::IN_MOVED_TO)
        {
            self.due.store(true, Ordering::SeqCst);
        }
    }

    /// Watch `dir` (at `depth` below the root) and the directories below it down to
    /// [`DEPTH`]; the error is `dir`'s own (one below it is left to the poll). The root is
    /// the administrator's (`--flink`) and may be a link, as the source's tree allows;
    /// nothing below it is followed.
    fn watch_tree(&mut self, dir: &Path, depth: usize) -> nix::Result<()> {
        let skipped = dir
            .file_name()
            .is_some_and(|n| n == "shared" || n == "taskowned");
        if self.watched.len() >= MAX_WATCHES || (depth > 0 && skipped) {
            return Ok(());
        }
        let mut flags = AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_ONLYDIR;
        if depth > 0 {
            flags |= AddWatchFlags::IN_DONT_FOLLOW;
        }
        let wd = self.inotify.add_watch(dir, flags)?;
        self.watched.insert(wd, (dir.to_path_buf(), depth));
        if depth >= DEPTH {
            return Ok(());
        }
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Ok(());
        };
        for entry in entries.flatten() {
            // A link is not a directory here (file_type does not follow it).
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = self.watch_tree(&entry.path(), depth + 1);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::inotify::InotifyEvent;

    fn watcher(root: &Path) -> (Watcher, Arc<AtomicBool>) {
        let due = Arc::new(AtomicBool::new(false));
        (Watcher::new(root, due.clone()).unwrap(), due)
    }

    /// The events waiting, handled as the loop handles them.
    fn drain(w: &mut Watcher) {
        std::thread::sleep(std::time::Duration::from_millis(50));
        while let Ok(events) = w.inotify.read_events() {
            if events.is_empty() {
                break;
            }
            for event in events {
                w.handle(event);
            }
        }
    }

    fn watched_dirs(w: &Watcher) -> std::collections::BTreeSet<PathBuf> {
        w.watched.values().map(|(d, _)| d.clone()).collect()
    }

    #[test]
    fn a_root_given_as_a_link_is_watched_and_nothing_below_is_followed() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir_all(real.join("job/chk-1")).unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, real.join("planted")).unwrap();
        let root = dir.path().join("flink");
        std::os::unix::fs::symlink(&real, &root).unwrap();
        let (mut w, due) = watcher(&root);
        w.ensure_watching().unwrap();
        assert!(due.swap(false, Ordering::SeqCst));
        assert_eq!(
            watched_dirs(&w),
            [root.clone(), root.join("job"), root.join("job/chk-1")].into()
        );
        std::fs::write(real.join("job/chk-1/_metadata"), b"x").unwrap();
        drain(&mut w);
        assert!(due.swap(false, Ordering::SeqCst), "_metadata written: due");
        // What the planted link points at is not watched: a write there wakes nothing.
        std::fs::write(elsewhere.join("_metadata"), b"x").unwrap();
        drain(&mut w);
        assert!(!due.load(Ordering::SeqCst));
    }

    #[test]
    fn an_overflowed_queue_watches_the_tree_again() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("flink");
        std::fs::create_dir_all(root.join("job")).unwrap();
        let (mut w, due) = watcher(&root);
        w.ensure_watching().unwrap();
        due.store(false, Ordering::SeqCst);
        let wd = *w.watched.keys().next().unwrap();
        w.handle(InotifyEvent {
            wd,
            mask: AddWatchFlags::IN_Q_OVERFLOW,
            cookie: 0,
            name: None,
        });
        assert!(due.swap(false, Ordering::SeqCst));
        assert!(w.watched.is_empty());
        // A directory made while events were dropped is watched once the tree is again.
        std::fs::create_dir(root.join("job/chk-7")).unwrap();
        drain(&mut w);
        w.ensure_watching().unwrap();
        assert!(due.swap(false, Ordering::SeqCst));
        assert!(watched_dirs(&w).contains(&root.join("job/chk-7")));
        std::fs::write(root.join("job/chk-7/_metadata"), b"x").unwrap();
        drain(&mut w);
        assert!(due.load(Ordering::SeqCst));
    }
}
