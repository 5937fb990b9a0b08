//! The identity RocksDB writes into every SST: its table properties hold the id of the
//! database session that wrote it (`rocksdb.creating.session.identity`, unique per session) and the
//! file's number in that session (`rocksdb.original.file.number`). With the database id and
//! the file's size, that names one SST's content for good: BackupEngine's
//! `kUseDbSessionId` naming of shared files rests on the same pair. ckptfs re-references
//! an imported SST without reading it only when this identity matches (device, inode, size
//! and modification time do not identify a file's content: `cp -p`, `rsync -t` and a
//! directory recreated on a filesystem that reuses inodes all keep them).
//!
//! Reading it costs three small reads at the file's end, never its data blocks: the footer
//! (the last 48 or 53 bytes, in the formats of RocksDB's `table/format.cc`: the legacy one,
//! `format_version` 1 to 5, and 6 on, whose footer gives only the meta-index block's size),
//! the meta-index block (which names the properties block) and the properties block (a
//! block of sorted key/value entries with restart points, never compressed).

use super::local::SourceFile;
use crate::error::Result;

const LEGACY_MAGIC: u64 = 0xdb47_7524_8b80_fb57;
const MAGIC: u64 = 0x88e2_41b7_85f4_cff7;
/// A block's trailer: its compression type and a 4-byte checksum.
const TRAILER: u64 = 5;
/// The longest footer (format 1 on).
const FOOTER: u64 = 53;
const LEGACY_FOOTER: u64 = 48;
/// The meta-index and properties blocks are small; a larger one is no SST ckptfs reads.
const MAX_META_BLOCK: u64 = 1 << 20;

/// `rocksdb.creating.db.identity`, `rocksdb.creating.session.identity` and
/// `rocksdb.original.file.number`, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The id of the database that wrote the file.
    pub db_id: String,
    /// The id of the database session that wrote it.
    pub session_id: String,
    /// The file's number in that session.
    pub file_number: u64,
    /// The file's length in bytes when opened (not a table property).
    pub size: u64,
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sst:{}:{}:{}:{}",
            self.db_id, self.session_id, self.file_number, self.size
        )
    }
}

/// Whether a recorded source is an SST's identity (see [`Identity`]'s `Display`).
pub fn is_identity(source: &str) -> bool {
    source.starts_with("sst:")
}

/// What ckptfs reads from an SST's properties block: its identity and the column family
/// it belongs to (`rocksdb.column.family.name`), each `None` if absent or unreadable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Properties {
    /// Its identity (see [`Identity`]).
    pub identity: Option<Identity>,
    /// The name of its column family (for Flink, the state's name).
    pub column_family: Option<String>,
}

/// The identity of an SST held open, `None` if it has none that ckptfs can read (not a
/// block-based table, a RocksDB older than 6.x that wrote no session id, a damaged file):
/// such a file is read each time.
pub fn identity(file: &SourceFile) -> Result<Option<Identity>> {
    Ok(properties(file)?.identity)
}

/// The [`Properties`] of an SST held open (three small reads at its end).
pub fn properties(file: &SourceFile) -> Result<Properties> {
    parse(file.stamp.size, &|offset, len| file.read_at(offset, len))
}

/// The [`Properties`] of an SST that is bytes `[start, start + size)` of a file held open
/// (a segment of a file-merging Flink checkpoint): three small reads at the range's end,
/// none outside it.
pub fn properties_in(file: &SourceFile, start: u64, size: u64) -> Result<Properties> {
    parse(size, &|offset, len| {
        let len = len.min(size.saturating_sub(offset) as usize);
        file.read_at(start + offset, len)
    })
}

/// The [`Properties`] of an SST on object storage, read by three small ranged GETs at its
/// end (only while it is the version looked up), never its data blocks.
pub fn properties_of_remote(file: &crate::store::s3::RemoteFile) -> Result<Properties> {
    parse(file.size, &|offset, len| {
        file.remote.read_range_of(file, offset, len)
    })
}

/// The [`Properties`] of a file ckptfs wrote itself at `path` (inlined or downloaded).
pub fn properties_at(path: &std::path::Path) -> Result<Properties> {
    use crate::error::IoContext;
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path).ctx("open", path)?;
    let size = file.metadata().ctx("stat", path)?.len();
    parse(size, &|offset, len| {
        let mut out = vec![0u8; len];
        let mut done = 0;
        while done < len {
            match file
                .read_at(&mut out[done..], offset + done as u64)
                .ctx("read", path)?
            {
                0 => break,
                n => done += n,
            }
        }
        out.truncate(done);
        Ok(out)
    })
}

/// Reads `len` bytes at an offset (fewer at the end of the file).
type ReadAt<'a> = dyn Fn(u64, usize) -> Result<Vec<u8>> + 'a;

fn parse(size: u64, read_at: &ReadAt<'_>) -> Result<Properties> {
    let none = Properties::default();
    if size < LEGACY_FOOTER {
        return Ok(none);
    }
    let tail_len = FOOTER.min(size);
    let tail = read_at(size - tail_len, tail_len as usize)?;
    if tail.len() as u64 != tail_len {
        // Shorter than when it was opened: being written; read in full, never trusted.
        return Ok(none);
    }
    let Some(metaindex) = metaindex_handle(&tail, size) else {
        return Ok(none);
    };
    let Some(block) = read_block(read_at, metaindex, size)? else {
        return Ok(none);
    };
    let Some(properties) = entries(&block)
        .into_iter()
        .find(|(k, _)| k == b"rocksdb.properties")
        .and_then(|(_, v)| handle(&mut &v[..]))
    else {
        return Ok(none);
    };
    let Some(block) = read_block(read_at, properties, size)? else {
        return Ok(none);
    };
    let mut db_id = None;
    let mut session_id = None;
    let mut file_number = None;
    let mut column_family = None;
    for (key, value) in entries(&block) {
        match &key[..] {
            b"rocksdb.creating.db.identity" => db_id = String::from_utf8(value).ok(),
            b"rocksdb.creating.session.identity" => session_id = String::from_utf8(value).ok(),
            b"rocksdb.original.file.number" => file_number = varint(&mut &value[..]),
            b"rocksdb.column.family.name" => column_family = String::from_utf8(value).ok(),
            _ => {}
        }
    }
    let plain = |s: &String| {
        !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    let identity = match (db_id, session_id, file_number) {
        (Some(db_id), Some(session_id), Some(file_number))
            if plain(&session_id) && (db_id.is_empty() || plain(&db_id)) =>
        {
            Some(Identity {
                db_id,
                session_id,
                file_number,
                size,
            })
        }
        _ => None,
    };
    // A file written without a column family (SstFileWriter) has an empty name; a name is
    // shown and kept in manifests: printable, and short.
    let column_family = column_family
        .filter(|c| !c.is_empty() && c.len() <= MAX_KEY && !c.chars().any(char::is_control));
    Ok(Properties {
        identity,
        column_family,
    })
}

/// (offset, size) of a block.
type Handle = (u64, u64);

/// The meta-index block's handle, from the footer at the end of `tail` (a file of `size`
/// bytes).
fn metaindex_handle(tail: &[u8], size: u64) -> Option<Handle> {
    if tail.len() < LEGACY_FOOTER as usize {
        return None;
    }
    let magic = u64::from_le_bytes(tail[tail.len() - 8..].try_into().ok()?);
    if magic == LEGACY_MAGIC {
        let footer = &tail[tail.len() - LEGACY_FOOTER as usize..];
        return handle(&mut &footer[..]);
    }
    if magic != MAGIC || tail.len() < FOOTER as usize {
        return None;
    }
    let footer = &tail[tail.len() - FOOTER as usize..];
    let version = u32::from_le_bytes(footer[41..45].try_into().ok()?);
    if version < 6 {
        // The checksum type, then the meta-index and index handles.
        return handle(&mut &footer[1..]);
    }
    // The checksum type, an extended magic, the footer's checksum, the base context
    // checksum, then the meta-index block's size: it ends where the footer begins.
    if footer[1..5] != [0x3e, 0x00, 0x7a, 0x00] {
        return None;
    }
    let meta_size = u32::from_le_bytes(footer[13..17].try_into().ok()?) as u64;
    let offset = (size - FOOTER).checked_sub(meta_size + TRAILER)?;
    Some((offset, meta_size))
}

/// A block's contents, if it is uncompressed and within the file and the size bound.
fn read_block(read_at: &ReadAt<'_>, (offset, len): Handle, size: u64) -> Result<Option<Vec<u8>>> {
    if len > MAX_META_BLOCK
        || offset
            .checked_add(len + TRAILER)
            .is_none_or(|end| end > size)
    {
        return Ok(None);
    }
    let bytes = read_at(offset, (len + 1) as usize)?;
    if bytes.len() as u64 != len + 1 || bytes[len as usize] != 0 {
        // Short, or compressed (RocksDB writes these blocks uncompressed).
        return Ok(None);
    }
    Ok(Some(bytes[..len as usize].to_vec()))
}

/// The longest key, and the most entries, read from a meta block: property names are
/// short and few; a block built to make each entry copy a huge key is cut short.
const MAX_KEY: usize = 256;
const MAX_ENTRIES: usize = 1024;

/// The key/value entries of a block (delta-encoded keys, restart points at the end);
/// whatever does not decode, a key over [`MAX_KEY`] bytes or more than [`MAX_ENTRIES`]
/// entries ends the list.
fn entries(block: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    if block.len() < 4 {
        return out;
    }
    let restarts = u32::from_le_bytes(block[block.len() - 4..].try_into().expect("4 bytes"));
    // The top bit marks a data block's hash index; these blocks have none.
    let restarts = (restarts & 0x7fff_ffff) as usize;
    let Some(end) = restarts
        .checked_mul(4)
        .and_then(|r| block.len().checked_sub(4 + r))
    else {
        return out;
    };
    let mut rest = &block[..end];
    let mut key: Vec<u8> = Vec::new();
    while !rest.is_empty() {
        let (Some(shared), Some(unshared), Some(value_len)) =
            (varint(&mut rest), varint(&mut rest), varint(&mut rest))
        else {
            break;
        };
        let (shared, unshared, value_len) =
            (shared as usize, unshared as usize, value_len as usize);
        if shared > key.len()
            || unshared.saturating_add(value_len) > rest.len()
            || shared + unshared > MAX_KEY
            || out.len() >= MAX_ENTRIES
        {
            break;
        }
        key.truncate(shared);
        key.extend_from_slice(&rest[..unshared]);
        let value = rest[unshared..unshared + value_len].to_vec();
        rest = &rest[unshared + value_len..];
        out.push((key.clone(), value));
    }
    out
}

fn handle(input: &mut &[u8]) -> Option<Handle> {
    Some((varint(input)?, varint(input)?))
}

/// A little-endian base-128 varint of at most 64 bits.
fn varint(input: &mut &[u8]) -> Option<u64> {
    let mut out = 0u64;
    for (i, byte) in input.iter().enumerate().take(10) {
        out |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            *input = &input[i + 1..];
            return Some(out);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::LocalTree;

    /// SSTs written by this build's RocksDB (format_version 6 and the legacy 5, by option).
    fn ssts(dir: &std::path::Path, format_version: i32, rounds: usize) -> Vec<String> {
        let mut options = rocksdb::Options::default();
        options.create_if_missing(true);
        let mut table = rocksdb::BlockBasedOptions::default();
        table.set_format_version(format_version);
        options.set_block_based_table_factory(&table);
        let db = rocksdb::DB::open(&options, dir).unwrap();
        for round in 0..rounds {
            for i in 0..100 {
                db.put(format!("k{i}"), format!("v{round}")).unwrap();
            }
            db.flush().unwrap();
        }
        drop(db);
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".sst"))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn every_sst_has_a_distinct_identity_in_each_format() {
        for format_version in [2, 5, 6] {
            let dir = tempfile::tempdir().unwrap();
            let names = ssts(dir.path(), format_version, 3);
            assert_eq!(names.len(), 3, "{names:?}");
            let tree = LocalTree::open(dir.path()).unwrap();
            let ids: Vec<Identity> = names
                .iter()
                .map(|n| {
                    identity(&tree.open_file(n).unwrap().unwrap())
                        .unwrap()
                        .unwrap()
                })
                .collect();
            for (id, name) in ids.iter().zip(&names) {
                assert_eq!(
                    id.file_number,
                    name.trim_end_matches(".sst").parse::<u64>().unwrap()
                );
                assert!(!id.session_id.is_empty());
                assert!(is_identity(&id.to_string()));
            }
            let props = properties(&tree.open_file(&names[0]).unwrap().unwrap()).unwrap();
            assert_eq!(props.column_family.as_deref(), Some("default"));
            let at = properties_at(&dir.path().join(&names[0])).unwrap();
            assert_eq!(at, props);
            assert_ne!(ids[0], ids[1]);
            // Copied (cp -p keeps size and mtime): the same identity, the same bytes.
            let copy = dir.path().join("copy.sst");
            std::fs::copy(dir.path().join(&names[0]), &copy).unwrap();
            let copied = identity(&tree.open_file("copy.sst").unwrap().unwrap()).unwrap();
            assert_eq!(copied.as_ref(), Some(&ids[0]));
        }
    }

    #[test]
    fn what_is_no_sst_has_no_identity() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("short"), b"x").unwrap();
        std::fs::write(dir.path().join("zeros"), vec![0u8; 4096]).unwrap();
        let mut fake = vec![0xffu8; 200];
        fake[192..].copy_from_slice(&MAGIC.to_le_bytes());
        std::fs::write(dir.path().join("fake"), &fake).unwrap();
        let tree = LocalTree::open(dir.path()).unwrap();
        for name in ["short", "zeros", "fake"] {
            let file = tree.open_file(name).unwrap().unwrap();
            assert_eq!(identity(&file).unwrap(), None, "{name}");
        }
    }

    #[test]
    fn a_block_of_huge_repeated_keys_is_cut_short() {
        // One 512 KiB key, then entries that each share all of it: each would copy it.
        let mut block = Vec::new();
        let put_varint = |out: &mut Vec<u8>, mut v: u64| loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        };
        put_varint(&mut block, 0);
        put_varint(&mut block, 512 << 10);
        put_varint(&mut block, 0);
        block.extend(std::iter::repeat_n(b'k', 512 << 10));
        for _ in 0..100_000 {
            put_varint(&mut block, 512 << 10);
            put_varint(&mut block, 0);
            put_varint(&mut block, 0);
        }
        block.extend_from_slice(&0u32.to_le_bytes());
        assert!(entries(&block).is_empty());
        // Short keys are read as usual, up to the cap.
        let mut small = Vec::new();
        for i in 0..2000u32 {
            let key = format!("k{i:05}");
            put_varint(&mut small, 0);
            put_varint(&mut small, key.len() as u64);
            put_varint(&mut small, 0);
            small.extend_from_slice(key.as_bytes());
        }
        small.extend_from_slice(&0u32.to_le_bytes());
        assert_eq!(entries(&small).len(), MAX_ENTRIES);
    }

    #[test]
    fn a_footer_shorter_than_its_magic_is_no_footer() {
        assert_eq!(metaindex_handle(&[0u8; 8], 100), None);
        assert_eq!(metaindex_handle(&[], 100), None);
    }

    #[test]
    fn varints_decode_and_stop_at_ten_bytes() {
        assert_eq!(varint(&mut &[0x96, 0x01][..]), Some(150));
        assert_eq!(varint(&mut &[0xff; 11][..]), None);
        assert_eq!(varint(&mut &[][..]), None);
    }
}
