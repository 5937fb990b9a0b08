//! The in-memory shapes of a backend's files and list chain, shared between checkpoints.
//!
//! With 10,000 retained checkpoints the daemon holds 10,000 snapshots of every backend, and
//! consecutive snapshots differ in a few files. [`Files`] keeps a snapshot's entries in
//! blocks of [`BLOCK`] and reuses every block of the snapshot it was built against that did
//! not change (a new SST sorts near the end, among the newest, so usually only the last
//! block or two are new); [`Chain`] is a linked list, so a delta list's chain is one node
//! on its base's chain. Measured with the scale benchmark (time-ordered keys, 4 backends):
//! the per-checkpoint file slices and chains were about 3 KB of the 10 KB a checkpoint
//! cost in memory.

use std::fmt;
use std::sync::Arc;

use super::FileEntry;
use crate::store::ObjectId;

/// Entries per block of [`Files`].
pub const BLOCK: usize = 16;

/// A backend's files, sorted by name, in blocks shared with earlier snapshots.
#[derive(Clone, Default)]
pub struct Files {
    blocks: Arc<[Arc<[Arc<FileEntry>]>]>,
    len: usize,
}

impl Files {
    /// `sorted` (by name) as blocks, reusing the blocks of `like` that hold the same
    /// entries at the same place (and `like` itself when nothing changed).
    pub fn new(sorted: Vec<Arc<FileEntry>>, like: Option<&Files>) -> Files {
        let same = |a: &[Arc<FileEntry>], b: &[Arc<FileEntry>]| {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| Arc::ptr_eq(x, y) || x == y)
        };
        let blocks: Vec<Arc<[Arc<FileEntry>]>> = sorted
            .chunks(BLOCK)
            .enumerate()
            .map(|(i, block)| match like.and_then(|l| l.blocks.get(i)) {
                Some(old) if same(old, block) => old.clone(),
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

    /// A file added near the end shares every block before it; nothing changed shares all.
    #[test]
    fn files_share_unchanged_blocks() {
        let mut names: Vec<String> = (0..50).map(|i| format!("{i:06}.sst")).collect();
        names.push("MANIFEST-000001".into());
        let first: Vec<Arc<FileEntry>> = names.iter().map(|n| entry(n)).collect();
        let a = Files::new(first.clone(), None);
        assert_eq!(a.len(), 51);
        assert!(a.iter().map(|f| &f.name).eq(names.iter()));
        let same = Files::new(first.clone(), Some(&a));
        assert!(same.ptr_eq(&a));
        let mut second = first.clone();
        second.insert(50, entry("000050.sst"));
        let b = Files::new(second.clone(), Some(&a));
        assert_eq!(b.iter().cloned().collect::<Vec<_>>(), second);
        assert_ne!(a, b);
        let shared = (0..b.blocks.len())
            .filter(|i| {
                a.blocks
                    .get(*i)
                    .is_some_and(|x| Arc::ptr_eq(x, &b.blocks[*i]))
            })
            .count();
        assert_eq!(shared, 3, "blocks 0-2 (48 entries) shared");
        assert_eq!(a.shared_blocks(&b), 3);
        assert!(b.iter_after(3).eq(second[48..].iter()));
        assert_eq!(b.iter_after(9).count(), 0);
        assert_eq!(Files::new(second, None), b);
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
