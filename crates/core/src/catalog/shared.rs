//! The in-memory shapes of a backend's files and list chain, shared between checkpoints.
//!
//! With 10,000 retained checkpoints the daemon holds 10,000 snapshots of every backend, and
//! consecutive snapshots differ in a few files. [`Files`] keeps a snapshot's entries in
//! blocks of about [`BLOCK`], cut where the names say (not at fixed positions), and reuses
//! every block of the snapshot it was built against that did not change (a new SST sorts
//! near the end, among the newest; a compaction removes a few runs of older ones: the
//! blocks around them are new, the rest are shared); [`Chain`] is a linked list, so a delta list's chain is one node
//! on its base's chain. Measured with the scale benchmark (time-ordered keys, 4 backends):
//! the per-checkpoint file slices and chains were about 3 KB of the 10 KB a checkpoint
//! cost in memory.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use super::FileEntry;
use crate::store::ObjectId;

/// Entries per block of [`Files`], on average: a block ends after an entry whose name
/// hashes to a boundary (one name in `BLOCK`), or at [`MAX_BLOCK`] entries.
pub const BLOCK: usize = 16;
/// The most entries in a block.
const MAX_BLOCK: usize = 4 * BLOCK;

/// Whether a block ends after the entry named `name`. Bounds that depend on the names alone
/// survive files added or removed elsewhere: a compaction that drops the oldest SSTs shifts
/// every later entry, and blocks cut at fixed positions then shared nothing (with 1,000
/// checkpoints of 4,000 SSTs each, a sliding window of 1,000 new ones a checkpoint, they
/// were about 40 MB of a daemon's memory).
fn ends_block(name: &str) -> bool {
    // FNV-1a, its top bits.
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    hash >> (64 - BLOCK.trailing_zeros()) == 0
}

/// `sorted` cut into blocks (see [`ends_block`]).
fn cut(sorted: &[Arc<FileEntry>]) -> Vec<&[Arc<FileEntry>]> {
    let mut blocks = Vec::with_capacity(sorted.len() / BLOCK + 1);
    let mut start = 0;
    for (i, entry) in sorted.iter().enumerate() {
        if i + 1 - start == MAX_BLOCK || ends_block(&entry.name) {
            blocks.push(&sorted[start..=i]);
            start = i + 1;
        }
    }
    if start < sorted.len() {
        blocks.push(&sorted[start..]);
    }
    blocks
}

/// A backend's files, sorted by name, in blocks shared with earlier snapshots.
#[derive(Clone, Default)]
pub struct Files {
    blocks: Arc<[Arc<[Arc<FileEntry>]>]>,
    len: usize,
}

impl Files {
    /// `sorted` (by name) as blocks, reusing the blocks of `like` that hold the same
    /// entries (and `like` itself when nothing changed).
    pub fn new(sorted: Vec<Arc<FileEntry>>, like: Option<&Files>) -> Files {
        let same = |a: &[Arc<FileEntry>], b: &[Arc<FileEntry>]| {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| Arc::ptr_eq(x, y) || x == y)
        };
        // `like`'s blocks by the name they start with.
        let old: HashMap<&str, &Arc<[Arc<FileEntry>]>> = like
            .map(|l| {
                l.blocks
                    .iter()
                    .filter_map(|b| Some((b.first()?.name.as_str(), b)))
                    .collect()
            })
            .unwrap_or_default();
        let blocks: Vec<Arc<[Arc<FileEntry>]>> = cut(&sorted)
            .into_iter()
            .map(|block| match old.get(block[0].name.as_str()) {
                Some(known) if same(known, block) => Arc::clone(known),
                _ => block.into(),
            })
            .collect();
        if let Some(like) = like {
            if like.blocks.len() == blocks.len()
                && like
                    .blocks
                    .iter()
                    .zip(&blocks)
                    .all(|(a, b)| Arc::ptr_eq(a, b))
            {
                return like.clone();
            }
        }
        Files {
            blocks: blocks.into(),
            len: sorted.len(),
        }
    }

    /// The entries, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<FileEntry>> + Clone + '_ {
        self.blocks.iter().flat_map(|b| b.iter())
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there is no entry.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many leading blocks `self` and `other` share (the same allocations, so the same
    /// entries at the same places).
    pub fn shared_blocks(&self, other: &Files) -> usize {
        self.blocks
            .iter()
            .zip(other.blocks.iter())
            .take_while(|(a, b)| Arc::ptr_eq(a, b))
            .count()
    }

    /// The entries after the first `blocks` blocks.
    pub fn iter_after(&self, blocks: usize) -> impl Iterator<Item = &Arc<FileEntry>> + '_ {
        self.blocks[blocks.min(self.blocks.len())..]
            .iter()
            .flat_map(|b| b.iter())
    }

    /// The same allocation (an unchanged backend's snapshot): equal without a look inside.
    pub fn ptr_eq(&self, other: &Files) -> bool {
        Arc::ptr_eq(&self.blocks, &other.blocks)
    }
}

impl PartialEq for Files {
    fn eq(&self, other: &Files) -> bool {
        self.ptr_eq(other) || (self.len == other.len && self.iter().eq(other.iter()))
    }
}

impl Eq for Files {}

impl fmt::Debug for Files {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// The list objects a backend's files are read from, newest first: a list, then its base,
/// and so on. Prepending shares the rest.
#[derive(Clone, Default)]
pub struct Chain(Option<Arc<Link>>);

struct Link {
    id: ObjectId,
    len: usize,
    next: Chain,
}

impl Chain {
    /// `id` in front of this chain (a delta on the list this chain starts with).
    pub fn push(&self, id: ObjectId) -> Chain {
        Chain(Some(Arc::new(Link {
            id,
            len: self.len() + 1,
            next: self.clone(),
        })))
    }

    /// The newest list (the one a manifest names).
    pub fn first(&self) -> Option<ObjectId> {
        self.0.as_ref().map(|l| l.id)
    }

    /// The number of lists in the chain.
    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |l| l.len)
    }

    /// True for no list at all (files listed inline in the manifest).
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// The lists' ids, newest first.
    pub fn iter(&self) -> impl Iterator<Item = ObjectId> + '_ {
        std::iter::successors(self.0.as_deref(), |l| l.next.0.as_deref()).map(|l| l.id)
    }

    /// This chain is one list in front of `base` (the same allocation).
    pub fn extends(&self, base: &Chain) -> bool {
        match (&self.0, &base.0) {
            (Some(link), Some(b)) => link.next.0.as_ref().is_some_and(|n| Arc::ptr_eq(n, b)),
            _ => false,
        }
    }

    /// True if list `id` is in the chain.
    pub fn contains(&self, id: &ObjectId) -> bool {
        self.iter().any(|l| l == *id)
    }
}

impl FromIterator<ObjectId> for Chain {
    /// Ids newest first.
    fn from_iter<I: IntoIterator<Item = ObjectId>>(iter: I) -> Self {
        let ids: Vec<ObjectId> = iter.into_iter().collect();
        ids.into_iter()
            .rev()
            .fold(Chain::default(), |chain, id| chain.push(id))
    }
}

impl PartialEq for Chain {
    fn eq(&self, other: &Chain) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) if Arc::ptr_eq(a, b) => true,
            _ => self.len() == other.len() && self.iter().eq(other.iter()),
        }
    }
}

impl Eq for Chain {}

impl fmt::Debug for Chain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str) -> Arc<FileEntry> {
        Arc::new(FileEntry {
            name: name.into(),
            object: ObjectId::from_hash(blake3::hash(name.as_bytes())),
            size: 1,
            chunks: None,
            source: None,
            column_family: None,
        })
    }

    /// How many of `b`'s entries are in blocks of `a` (the same allocations).
    fn entries_shared(a: &Files, b: &Files) -> usize {
        b.blocks
            .iter()
            .filter(|x| a.blocks.iter().any(|y| Arc::ptr_eq(x, y)))
            .map(|x| x.len())
            .sum()
    }

    /// A file added near the end shares every block before it; nothing changed shares all.
    #[test]
    fn files_share_unchanged_blocks() {
        let mut names: Vec<String> = (0..50).map(|i| format!("{i:06}.sst")).collect();
        names.push("MANIFEST-000001".into());
        let first: Vec<Arc<FileEntry>> = names.iter().map(|n| entry(n)).collect();
        let a = Files::new(first.clone(), None);
        assert_eq!(a.len(), 51);
        assert!(a.iter().map(|f| &f.name).eq(names.iter()));
        assert!(a
            .blocks
            .iter()
            .all(|b| !b.is_empty() && b.len() <= MAX_BLOCK));
        let same = Files::new(first.clone(), Some(&a));
        assert!(same.ptr_eq(&a));
        let mut second = first.clone();
        second.insert(50, entry("000050.sst"));
        let b = Files::new(second.clone(), Some(&a));
        assert_eq!(b.iter().cloned().collect::<Vec<_>>(), second);
        assert_ne!(a, b);
        // Every block before the one that holds the new entry is shared, in place.
        let at = b
            .blocks
            .iter()
            .position(|x| x.iter().any(|f| f.name == "000050.sst"));
        let at = at.expect("a block holds it");
        assert_eq!(a.shared_blocks(&b), at);
        let before: usize = b.blocks[..at].iter().map(|x| x.len()).sum();
        assert!(before > 0, "the blocks before it hold entries");
        assert!(b.iter_after(at).eq(second[before..].iter()));
        assert_eq!(b.iter_after(b.blocks.len() + 1).count(), 0);
        assert_eq!(Files::new(second, None), b);
    }

    /// The oldest SSTs removed and new ones added (a sliding window, as compactions of
    /// time-ordered keys make): every block but those at the two ends is shared, though
    /// every entry moved. With blocks cut at fixed positions none was.
    #[test]
    fn files_share_blocks_when_entries_move() {
        let window = |from: usize| -> Vec<Arc<FileEntry>> {
            (from..from + 4000)
                .map(|i| entry(&format!("{i:07}.sst")))
                .collect()
        };
        let a = Files::new(window(0), None);
        let interned: std::collections::HashMap<String, Arc<FileEntry>> =
            a.iter().map(|f| (f.name.clone(), f.clone())).collect();
        let moved: Vec<Arc<FileEntry>> = window(1000)
            .into_iter()
            .map(|f| interned.get(&f.name).cloned().unwrap_or(f))
            .collect();
        let b = Files::new(moved.clone(), Some(&a));
        assert!(b.iter().eq(moved.iter()));
        let shared = entries_shared(&a, &b);
        assert!(
            shared >= 3000 - 2 * MAX_BLOCK,
            "{shared} of the 3,000 entries kept are in shared blocks"
        );
        assert!(b.blocks.iter().all(|x| x.len() <= MAX_BLOCK));
    }

    #[test]
    fn chains_prepend_and_compare_by_content() {
        let id = |n: u8| ObjectId::from_hash(blake3::hash(&[n]));
        let base: Chain = [id(2), id(1)].into_iter().collect();
        assert_eq!(base.first(), Some(id(2)));
        let longer = base.push(id(3));
        assert_eq!(longer.len(), 3);
        assert_eq!(longer.iter().collect::<Vec<_>>(), vec![id(3), id(2), id(1)]);
        assert!(longer.contains(&id(1)) && !base.contains(&id(3)));
        assert!(longer.extends(&base) && !base.extends(&longer));
        let equal_copy: Chain = [id(2), id(1)].into_iter().collect();
        assert!(
            !longer.extends(&equal_copy),
            "only the same allocation counts"
        );
        assert_eq!(longer, [id(3), id(2), id(1)].into_iter().collect::<Chain>());
        assert_ne!(longer, base);
        assert!(Chain::default().is_empty() && Chain::default().first().is_none());
    }
}
