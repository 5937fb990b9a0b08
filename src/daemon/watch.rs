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
//! confined tree. Watches never follow a link (`IN_DONT_FOLLOW`, `IN_ONLYDIR`).

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
            if self.watched.is_empty() && self.root.is_dir() {
                let root = self.root.clone();
                self.watch_tree(&root, 0);
                // Whatever completed before the watches were there.
                self.due.store(true, Ordering::SeqCst);
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

    fn handle(&mut self, event: nix::sys::inotify::InotifyEvent) {
        if event.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
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
                self.watch_tree(&dir.join(name), depth + 1);
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
    /// [`DEPTH`].
    fn watch_tree(&mut self, dir: &Path, depth: usize) {
        let skipped = dir
            .file_name()
            .is_some_and(|n| n == "shared" || n == "taskowned");
        if self.watched.len() >= MAX_WATCHES || (depth > 0 && skipped) {
            return;
        }
        let flags = AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_ONLYDIR
            | AddWatchFlags::IN_DONT_FOLLOW;
        let Ok(wd) = self.inotify.add_watch(dir, flags) else {
            return; // gone meanwhile, or not a directory: the poll finds what is there
        };
        self.watched.insert(wd, (dir.to_path_buf(), depth));
        if depth >= DEPTH {
            return;
        }
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            // A link is not a directory here (file_type does not follow it).
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                self.watch_tree(&entry.path(), depth + 1);
            }
        }
    }
}
