//! Whether a write of a record landed although it failed: a conditional write refused as
//! changed (or as existing) may be this writer's own earlier attempt, landed before a
//! retry, and a write that failed without an answer may have landed all the same. Only
//! the record itself can tell, by its bytes, which are unique to each write (every write
//! of the store metadata carries a new revision). The object store's conditional put and
//! the catalog's write of the metadata both ask here.

use super::records::{Record, Records};
use crate::error::Result;

/// What a record holds after a write of `bytes` to it failed.
#[derive(Debug)]
pub enum ReadBack {
    /// Exactly the bytes written: the write landed, and this is the record's version.
    Landed {
        /// The record's version now (none on a local store).
        version: Option<String>,
    },
    /// No record of that name.
    Absent,
    /// Other bytes: another write's (another writer's, or an earlier one of this writer's).
    Other(Record),
}

/// Read record `key` back after a write of `bytes` to it failed. An error reading it is
/// returned as it is: whose the record is is then unknown, and callers must not take a
/// refused write for another writer's while it may be their own.
pub fn read_back<R: Records + ?Sized>(records: &R, key: &str, bytes: &[u8]) -> Result<ReadBack> {
    Ok(match records.get(key)? {
        Some(record) if record.bytes == bytes => ReadBack::Landed {
            version: record.version,
        },
        Some(record) => ReadBack::Other(record),
        None => ReadBack::Absent,
    })
}
