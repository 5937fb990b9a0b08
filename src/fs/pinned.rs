//! `pinned/`, a part of the inode table: a link per pin to its checkpoint (`pinned/NAME ->
//! ../cp-N`), shown while some retained checkpoint is pinned. A link's inode is given at
//! the first sight of its name and kept while mounted, wherever the pin moves.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::attr::{Attr, DirEntry, Kind, Owner, PIN_LINKS};
use super::flink_names::FLINK;
use super::seam::Checkpoints;
use ckptfs_core::error::{Error, Result};
use ckptfs_core::fsutil::lock;

/// The names of the links in `pinned/`: every pin name seen, in the order seen (the k-th
/// is inode [`PIN_LINKS`] + k, stable while mounted), and each name's place, so that
/// listing 10,000 links costs 10,000 steps, not a search of every name per link.
#[derive(Default)]
struct PinNames {
    names: Vec<String>,
    index: HashMap<String, u64>,
}

impl PinNames {
    /// The inode of the link `pinned/NAME` (given one if the name is new).
    fn ino(&mut self, name: &str) -> u64 {
        if let Some(ino) = self.index.get(name) {
            return *ino;
        }
        let ino = PIN_LINKS + self.names.len() as u64;
        self.names.push(name.to_string());
        self.index.insert(name.to_string(), ino);
        ino
    }

    /// The name of link inode `ino`.
    fn name(&self, ino: u64) -> Option<&str> {
        let k = usize::try_from(ino.checked_sub(PIN_LINKS)?).ok()?;
        self.names.get(k).map(String::as_str)
    }
}

/// True for the inode of a link in `pinned/` (shown or not): below the `flink/` subtree's
/// inodes ([`FLINK`] on).
pub(super) fn is_pin_ino(ino: u64) -> bool {
    (PIN_LINKS..FLINK).contains(&ino)
}

/// The links of `pinned/`.
pub(super) struct Pins {
    checkpoints: Arc<dyn Checkpoints>,
    owner: Owner,
    /// Every pin name seen, in the order seen: the link of the k-th is inode
    /// [`PIN_LINKS`] + k, stable while mounted.
    names: Mutex<PinNames>,
}

impl Pins {
    /// The links of the pins of `checkpoints`, owned by `owner`.
    pub(super) fn new(checkpoints: Arc<dyn Checkpoints>, owner: Owner) -> Self {
        Pins {
            checkpoints,
            owner,
            names: Mutex::default(),
        }
    }

    /// `pinned/` is shown while some retained checkpoint is pinned (as `latest` while
    /// there is a checkpoint).
    pub(super) fn shown(&self) -> bool {
        self.checkpoints
            .pins()
            .values()
            .any(|cp| self.checkpoints.manifest(*cp).is_some())
    }

    /// Every name the kernel may have been shown a link of.
    pub(super) fn names(&self) -> Vec<String> {
        lock(&self.names).names.clone()
    }

    /// The pin a link inode shows, and the retained checkpoint it points to.
    fn pin_of(&self, ino: u64) -> Option<(String, u64)> {
        let name = lock(&self.names).name(ino)?.to_string();
        let cp = self.checkpoints.pinned(&name)?;
        self.checkpoints.manifest(cp).map(|_| (name, cp))
    }

    /// What `stat` shows of link `pinned/NAME`, inode `ino`, to `cp-{cp}`.
    fn attr(&self, ino: u64, cp: u64) -> Attr {
        let len = format!("../cp-{cp}").len() as u64;
        self.owner.fixed(ino, Kind::Symlink, len, 0o777, 1)
    }

    /// `stat` of link inode `ino`.
    pub(super) fn getattr(&self, ino: u64) -> Result<Attr> {
        let (_, cp) = self
            .pin_of(ino)
            .ok_or_else(|| Error::NotFound(format!("inode {ino}")))?;
        Ok(self.attr(ino, cp))
    }

    /// The link `pinned/NAME`, while its checkpoint is retained.
    pub(super) fn lookup(&self, name: &str) -> Result<Attr> {
        let missing = || Error::NotFound(name.to_string());
        let cp = self.checkpoints.pinned(name).ok_or_else(missing)?;
        if self.checkpoints.manifest(cp).is_none() {
            return Err(missing());
        }
        let ino = lock(&self.names).ino(name);
        Ok(self.attr(ino, cp))
    }

    /// The target of link inode `ino`: `../cp-N`.
    pub(super) fn readlink(&self, ino: u64) -> Result<String> {
        let (_, cp) = self
            .pin_of(ino)
            .ok_or_else(|| Error::NotFound(format!("inode {ino}")))?;
        Ok(format!("../cp-{cp}"))
    }

    /// The links of `pinned/`: the pins once, and each link's inode from its name (not one
    /// search each).
    pub(super) fn readdir(&self) -> Vec<DirEntry> {
        let shown: Vec<(String, u64)> = self
            .checkpoints
            .pins()
            .into_iter()
            .filter(|(_, cp)| self.checkpoints.manifest(*cp).is_some())
            .collect();
        let mut names = lock(&self.names);
        shown
            .into_iter()
            .map(|(name, cp)| {
                let attr = self.attr(names.ino(&name), cp);
                DirEntry { name, attr }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::attr::PINNED;
    use super::*;

    /// A pin's link keeps the inode it was first given, whatever pins come after it.
    #[test]
    fn pin_links_keep_their_inodes_in_the_order_seen() {
        let mut pins = PinNames::default();
        assert_eq!(pins.ino("b"), PIN_LINKS);
        assert_eq!(pins.ino("a"), PIN_LINKS + 1);
        assert_eq!(pins.ino("b"), PIN_LINKS);
        assert_eq!(pins.name(PIN_LINKS + 1), Some("a"));
        assert_eq!(pins.name(PIN_LINKS + 2), None);
        assert_eq!(pins.name(PIN_LINKS - 1), None);
        assert!(is_pin_ino(PIN_LINKS + 2) && !is_pin_ino(FLINK) && !is_pin_ino(PINNED));
    }
}
