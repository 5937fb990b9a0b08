//! Files stored as a list of chunk objects.
//!
//! An append-only file (RocksDB's MANIFEST and write-ahead log) only grows between checkpoints:
//! cut into fixed-size chunks aligned to the file's start, every chunk but the last is
//! unchanged from the previous checkpoint and already stored, so a checkpoint stores the
//! bytes appended since the previous one plus at most one partial chunk, and re-references
//! the rest by content.

use serde::{Deserialize, Serialize};

use super::{ObjectId, ObjectStore};
use crate::error::{Error, Result};

/// Chunked files up to this size are assembled and verified whole when they are read
/// (the mount then serves them from memory); larger ones are read chunk by chunk.
pub const MAX_ASSEMBLED: u64 = 4 << 20;
/// The largest chunk size accepted from a manifest.
const MAX_CHUNK_SIZE: u32 = 64 << 20;

/// How a chunked file is stored: chunk objects of `size` bytes each (the last one shorter).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub struct Chunks {
    /// The chunk size in bytes: 1 to 64 MiB in a manifest that validates.
    pub size: u32,
    /// The chunk objects, in file order.
    pub ids: Vec<ObjectId>,
}

impl Chunks {
    /// Cut `bytes` into chunks of `size`: the chunk list and each chunk's bytes.
    pub fn split(bytes: &[u8], size: u32) -> (Chunks, Vec<&[u8]>) {
        let pieces: Vec<&[u8]> = bytes.chunks(size as usize).collect();
        let ids = pieces
            .iter()
            .map(|p| ObjectId::from_hash(blake3::hash(p)))
            .collect();
        (Chunks { size, ids }, pieces)
    }

    /// The length of chunk `index` of a file of `file_size` bytes.
    pub fn len_of(&self, index: usize, file_size: u64) -> u64 {
        let start = index as u64 * self.size as u64;
        (file_size - start).min(self.size as u64)
    }

    /// Every chunk with its length.
    pub fn with_lengths(&self, file_size: u64) -> impl Iterator<Item = (ObjectId, u64)> + '_ {
        self.ids
            .iter()
            .enumerate()
            .map(move |(i, id)| (*id, self.len_of(i, file_size)))
    }

    /// Check that the chunks can hold a file of `file_size` bytes.
    pub fn validate(&self, file_size: u64) -> Result<()> {
        if self.size == 0 || self.size > MAX_CHUNK_SIZE {
            return Err(Error::Invalid(format!("chunk size {}", self.size)));
        }
        let expected = file_size.div_ceil(self.size as u64);
        if self.ids.len() as u64 != expected {
            return Err(Error::Invalid(format!(
                "{} chunks of {} bytes for a file of {file_size} bytes",
                self.ids.len(),
                self.size
            )));
        }
        Ok(())
    }

    /// The whole file, read from its chunks, each verified, and the whole checked against
    /// the file's own hash and size.
    pub fn read(&self, store: &dyn ObjectStore, object: &ObjectId, size: u64) -> Result<Vec<u8>> {
        let mut bytes = Vec::with_capacity(size.min(MAX_ASSEMBLED) as usize);
        self.copy_to(store, object, size, &mut bytes)?;
        Ok(bytes)
    }

    /// Write the whole file to `out` chunk by chunk (one chunk in memory at a time), each
    /// verified, and the whole checked against the file's own hash at the end: a caller
    /// must not use what was written when this fails.
    pub fn copy_to(
        &self,
        store: &dyn ObjectStore,
        object: &ObjectId,
        size: u64,
        out: &mut dyn std::io::Write,
    ) -> Result<()> {
        self.validate(size)?;
        let mut whole = blake3::Hasher::new();
        for index in 0..self.ids.len() {
            let chunk = self.read_chunk(store, index, size)?;
            whole.update(&chunk);
            out.write_all(&chunk)
                .map_err(|e| Error::io("write an assembled file", e))?;
        }
        if ObjectId::from_hash(whole.finalize()) != *object {
            return Err(Error::Corrupt(format!(
                "the chunks of {object} do not add up to its content"
            )));
        }
        Ok(())
    }

    /// Chunk `index` of a file of `file_size` bytes, verified against its id.
    pub fn read_chunk(
        &self,
        store: &dyn ObjectStore,
        index: usize,
        file_size: u64,
    ) -> Result<Vec<u8>> {
        let id = self
            .ids
            .get(index)
            .ok_or_else(|| Error::Invalid(format!("chunk {index} of {}", self.ids.len())))?;
        let len = self.len_of(index, file_size);
        let chunk = store.read_verified(id, len)?;
        if chunk.len() as u64 != len {
            return Err(Error::Corrupt(format!(
                "chunk {id} has {} bytes, expected {len}",
                chunk.len()
            )));
        }
        Ok(chunk)
    }

    /// Bytes `offset..offset + len` of a file of `file_size` bytes, read from the chunks
    /// that hold them (each verified against its id).
    pub fn read_range(
        &self,
        store: &dyn ObjectStore,
        file_size: u64,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>> {
        let end = offset.saturating_add(len).min(file_size);
        let mut out = Vec::with_capacity(end.saturating_sub(offset) as usize);
        let mut pos = offset;
        while pos < end {
            let index = (pos / self.size as u64) as usize;
            let start = index as u64 * self.size as u64;
            let chunk = self.read_chunk(store, index, file_size)?;
            let from = (pos - start) as usize;
            let to = ((end - start) as usize).min(chunk.len());
            out.extend_from_slice(&chunk[from..to]);
            pos = start + to as u64;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Appending to a file changes only its last chunk and adds new ones: the chunks before
    /// are the same objects.
    #[test]
    fn appending_keeps_every_full_chunk() {
        let mut file: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8).collect();
        let size = 16 * 1024;
        let (before, _) = Chunks::split(&file, size);
        file.extend(std::iter::repeat_n(7u8, 300));
        let (after, pieces) = Chunks::split(&file, size);
        assert_eq!(before.ids.len(), 3);
        assert_eq!(after.ids[..2], before.ids[..2]);
        assert_ne!(after.ids[2], before.ids[2]);
        assert_eq!(pieces.concat(), file);
        assert_eq!(after.len_of(2, file.len() as u64), 40_300 - 2 * 16_384);
        after.validate(file.len() as u64).unwrap();
        assert!(after.validate(file.len() as u64 + 20_000).is_err());
    }

    /// Range reads cross chunk boundaries and stop at the end of the file.
    #[test]
    fn ranges_are_read_from_the_chunks_that_hold_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = super::super::LocalStore::open(dir.path()).unwrap();
        let file: Vec<u8> = (0..10_000u32).map(|i| (i % 241) as u8).collect();
        let (chunks, pieces) = Chunks::split(&file, 1024);
        for piece in &pieces {
            store.publish(store.stage_bytes(piece).unwrap()).unwrap();
        }
        let size = file.len() as u64;
        for (offset, len) in [
            (0, 10),
            (1000, 100),
            (1023, 1),
            (1024, 3000),
            (9990, 100),
            (10_000, 5),
            (0, 20_000),
        ] {
            let end = (offset + len).min(file.len());
            let start = offset.min(end);
            assert_eq!(
                chunks
                    .read_range(&store, size, offset as u64, len as u64)
                    .unwrap(),
                file[start..end],
                "offset {offset} len {len}"
            );
        }
    }

    #[test]
    fn reading_checks_every_chunk_and_the_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = super::super::LocalStore::open(dir.path()).unwrap();
        let file: Vec<u8> = (0..20_000u32).map(|i| (i % 13) as u8).collect();
        let object = ObjectId::from_hash(blake3::hash(&file));
        let (chunks, pieces) = Chunks::split(&file, 16 * 1024);
        for piece in &pieces {
            let staged = store.stage_bytes(piece).unwrap();
            store.publish(staged).unwrap();
        }
        assert_eq!(
            chunks.read(&store, &object, file.len() as u64).unwrap(),
            file
        );
        // Chunks that are sound on their own but are not this file's.
        let mut swapped = chunks.clone();
        swapped.ids.swap(0, 1);
        assert!(swapped.read(&store, &object, file.len() as u64).is_err());
        // A damaged chunk.
        let path = store.local_path(&chunks.ids[1]).unwrap();
        std::fs::write(&path, vec![0u8; pieces[1].len()]).unwrap();
        assert!(chunks.read(&store, &object, file.len() as u64).is_err());
    }
}
