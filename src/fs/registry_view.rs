//! `.ckptfs/registry` as it is read: the objects' histories are worked out at open, their
//! rows ([`ckptfs_core::views::RegistryRow`]) written as the reader gets to them.

use super::seam::Checkpoints;
use ckptfs_core::catalog::history::{object_histories, ObjectHistory};
use ckptfs_core::store::ObjectId;
use ckptfs_core::views;

/// `.ckptfs/registry` as it is read: the objects' histories are worked out at open, their
/// rows written as the reader gets to them, so a reader of the head waits only for the
/// histories, not for every row (122,883 rows take a release daemon 1 s to write).
#[derive(Default)]
pub(super) struct RegistryStream {
    rows: Vec<(ObjectId, ObjectHistory)>,
    counts: std::collections::BTreeMap<ObjectId, u32>,
    /// The next row to write.
    next: usize,
    /// Text written and not yet read past, starting at byte `start` of the view.
    window: Vec<u8>,
    start: u64,
}

impl RegistryStream {
    /// The view of the objects of `checkpoints`, opened now.
    pub(super) fn open(checkpoints: &dyn Checkpoints) -> RegistryStream {
        let counts = checkpoints.reference_counts();
        // Each object's referencing checkpoints as runs of consecutive retained ones: with
        // thousands of checkpoints, a list of every one would be millions of numbers.
        let checkpoints_now = checkpoints.checkpoints();
        let rows = object_histories(checkpoints_now.iter().map(|m| &**m))
            .into_iter()
            .collect();
        RegistryStream {
            rows,
            counts,
            next: 0,
            window: Vec::new(),
            start: 0,
        }
    }

    /// Bytes `offset..offset + size` of the registry view, writing rows as far as needed
    /// (from the first row again if the reader went back before the text still held).
    pub(super) fn read(
        &mut self,
        checkpoints: &dyn Checkpoints,
        offset: u64,
        size: u64,
    ) -> Vec<u8> {
        if offset < self.start {
            self.next = 0;
            self.window.clear();
            self.start = 0;
        }
        loop {
            let end = self.start + self.window.len() as u64;
            let skip = (offset.min(end) - self.start) as usize;
            self.window.drain(..skip);
            self.start += skip as u64;
            if end >= offset + size || self.next == self.rows.len() {
                break;
            }
            let (id, row) = &self.rows[self.next];
            row_of(checkpoints, &mut self.window, id, row, &self.counts);
            self.next += 1;
        }
        let from = ((offset - self.start) as usize).min(self.window.len());
        let to = (from + size as usize).min(self.window.len());
        self.window[from..to].to_vec()
    }
}

/// One row of the registry view (one row per stored object: 100,000 and more, so written
/// as the reader gets to them).
fn row_of(
    checkpoints: &dyn Checkpoints,
    out: &mut Vec<u8>,
    id: &ObjectId,
    history: &ObjectHistory,
    counts: &std::collections::BTreeMap<ObjectId, u32>,
) {
    // File lists are not sized in the manifests: the store knows.
    let size = history.size.unwrap_or_else(|| {
        checkpoints
            .object_store()
            .local_path(id)
            .and_then(|p| std::fs::symlink_metadata(p).ok())
            .map_or(0, |m| m.len())
    });
    let refcount = counts.get(id).copied().unwrap_or(0);
    let row = views::RegistryRow::of(*id, history, size, refcount);
    // Into a vector, a row of strings and numbers cannot fail to serialise.
    let _ = serde_json::to_writer(&mut *out, &row);
    out.push(b'\n');
}
