//! Apache Flink's checkpoint metadata (`chk-N/_metadata`), read as Flink 1.15 to 2.3 write it
//! (metadata versions 3 to 7): which operators hold keyed state, and for each subtask of
//! each the RocksDB files of its incremental snapshot, by their original names.
//!
//! The format is Java's `DataOutputStream` (big-endian, strings in modified UTF-8), written
//! by Flink's `MetadataV2V3SerializerBase` and its subclasses; the facts and their sources are
//! in the project's notes (`shared/notes/flink-checkpoints.md`). Everything a checkpoint
//! holds is parsed (handles carry no length, so nothing can be skipped unread); what ckptfs
//! does not turn into RocksDB directories (operator state, channel state, master state) is
//! kept as it is found or refused with the reason, never guessed at.

use crate::error::{Error, Result};

/// `Checkpoints.HEADER_MAGIC_NUMBER`.
pub const MAGIC: u32 = 0x4960_672D;
/// The metadata versions this reader knows.
pub const VERSIONS: std::ops::RangeInclusive<u32> = 3..=7;
const MASTER_STATE_MAGIC: u32 = 0xC96B_1696;

/// One `_metadata` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata {
    /// The metadata format version (one of [`VERSIONS`]).
    pub version: u32,
    /// The Flink checkpoint's id (its `chk-<id>` directory).
    pub checkpoint_id: u64,
    /// Master states (rare): kept as their bytes.
    pub master_states: Vec<Vec<u8>>,
    /// The operators as `_metadata` lists them, in its order.
    pub operators: Vec<OperatorState>,
}

/// One operator's state, as `_metadata` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorState {
    /// Version 5 on: the operator's name, that of its chain of operators (`my-op,
    /// Filter`); `None` when empty, and before version 5.
    pub name: Option<String>,
    /// Version 5 on: the operator's uid; `None` when the job set none, and before version
    /// 5.
    pub uid: Option<String>,
    /// The 32-hex operator id (as Flink's UI and logs show it).
    pub id: String,
    /// The number of subtasks the operator ran with.
    pub parallelism: u32,
    /// Its maximum parallelism: the number of key groups its keyed state is split into.
    pub max_parallelism: u32,
    /// The state of the operator's coordinator (on the job manager), if it has one.
    pub coordinator_state: Option<StreamHandle>,
    /// The subtasks with state (finished ones are left out).
    pub subtasks: Vec<SubtaskState>,
}

/// One subtask's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubtaskState {
    /// The subtask's index, from 0.
    pub index: u32,
    /// Operator state the state backend manages (list and broadcast state).
    pub managed_operator_state: Option<OperatorStateHandle>,
    /// Operator state the operator wrote itself.
    pub raw_operator_state: Option<OperatorStateHandle>,
    /// Keyed state the state backend manages: where a RocksDB backend's snapshot is.
    pub managed_keyed: Option<KeyedHandle>,
    /// Keyed state the operator wrote itself (heap timers, for one).
    pub raw_keyed: Option<KeyedHandle>,
}

/// Keyed state of a subtask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyedHandle {
    /// A RocksDB incremental snapshot (types 5 and 11): every file of the native checkpoint.
    Incremental(IncrementalHandle),
    /// A full snapshot by key groups (types 3, 7, 12: heap state, canonical savepoints):
    /// not a RocksDB directory.
    KeyGroups {
        /// The handle's type byte (3, 7 or 12).
        type_byte: u8,
        /// The first key group.
        start: u32,
        /// The number of key groups.
        count: u32,
        /// The stream that holds them.
        handle: Option<StreamHandle>,
    },
}

/// `IncrementalRemoteKeyedStateHandle`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncrementalHandle {
    /// The Flink checkpoint that created this handle.
    pub checkpoint_id: u64,
    /// The identity (a UUID) of the RocksDB keyed state backend that took the snapshot.
    pub backend_id: String,
    /// The first key group of the subtask's range.
    pub key_group_start: u32,
    /// The number of key groups in the range.
    pub key_group_count: u32,
    /// Flink's own meta data of the backend (`KeyedBackendSerializationProxy`): not a
    /// RocksDB file, needed to give the state back to Flink.
    pub meta: StreamHandle,
    /// SST files, by their RocksDB names.
    pub shared: Vec<(String, StreamHandle)>,
    /// MANIFEST, CURRENT, OPTIONS (and whatever else the native checkpoint held).
    pub private: Vec<(String, StreamHandle)>,
}

/// Where the bytes of one file are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamHandle {
    /// In `_metadata` itself (files up to the inline threshold, 20 KiB by default).
    Inline(Vec<u8>),
    /// A file, by absolute URI (`file:/…/shared/<uuid>`, `s3://…`). `at`: where the path
    /// is in `_metadata` (its length prefix), so that an export can write another.
    File {
        /// The file's absolute URI.
        path: String,
        /// Its length in bytes.
        size: u64,
        /// The offset in `_metadata` of the path's length prefix.
        at: usize,
        /// The whole handle's bytes in `_metadata`, its type byte first.
        span: Span,
    },
    /// A file in the checkpoint's own directory (the one holding `_metadata`): Flink
    /// resolves the path against that directory (an export names `../shared/<file>`).
    Relative {
        /// The file's path relative to that directory.
        path: String,
        /// Its length in bytes.
        size: u64,
        /// The offset in `_metadata` of the path's length prefix.
        at: usize,
        /// The whole handle's bytes in `_metadata`, its type byte first.
        span: Span,
    },
    /// A range of a file shared by several (file merging, FLIP-306: one physical file
    /// holds the logical files of several handles, one after the other).
    Segment {
        /// The absolute URI of the file that holds the range.
        path: String,
        /// Where the range begins in it, in bytes.
        start: u64,
        /// The range's length in bytes.
        size: u64,
        /// The whole handle's bytes in `_metadata`, its type byte first.
        span: Span,
    },
    /// A segment of no bytes (file merging): nothing to read.
    EmptySegment,
}

impl StreamHandle {
    /// Its length in bytes.
    pub fn size(&self) -> u64 {
        match self {
            StreamHandle::Inline(bytes) => bytes.len() as u64,
            StreamHandle::File { size, .. }
            | StreamHandle::Relative { size, .. }
            | StreamHandle::Segment { size, .. } => *size,
            StreamHandle::EmptySegment => 0,
        }
    }
}

/// Where a handle's bytes are in `_metadata`: `[start, end)`.
pub type Span = std::ops::Range<usize>;

/// Operator (non-keyed) state of a subtask: the handle that holds it, with its offsets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorStateHandle {
    /// The handle's type byte: 4, or 17 for a file-merging segment.
    pub type_byte: u8,
    /// For type 17: where its type byte is in `_metadata`, and the span of what type 4
    /// lacks (the task-owned and shared directories, and whether it is empty), so that
    /// it can be given back as type 4 naming a plain file ([`file_merging_undone`]).
    pub merged: Option<(usize, Span)>,
    /// Each named state: its name, its distribution mode (0 split, 1 union, 2 broadcast)
    /// and the offsets of its partitions in `handle`'s stream.
    pub states: Vec<(String, u8, Vec<u64>)>,
    /// The stream that holds the states.
    pub handle: Option<StreamHandle>,
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("Flink checkpoint metadata: {what}"))
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| bad(format!("ends early (at byte {}, {n} more wanted)", self.at)))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn i32(&mut self) -> Result<i32> {
        Ok(i32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    /// A count or size that must not be negative.
    fn count(&mut self, what: &str) -> Result<u32> {
        let n = self.i32()?;
        u32::try_from(n).map_err(|_| bad(format!("negative {what} {n}")))
    }
    /// A count of items that take at least `min_bytes` each: no more than the bytes left
    /// can hold (a damaged count is refused before it is looped over).
    fn items(&mut self, what: &str, min_bytes: usize) -> Result<u32> {
        let n = self.count(what)?;
        let left = self.bytes.len() - self.at;
        if n as usize > left / min_bytes.max(1) {
            return Err(bad(format!(
                "{what} {n} at byte {}: more than the {left} bytes left can hold",
                self.at
            )));
        }
        Ok(n)
    }
    fn size(&mut self, what: &str) -> Result<u64> {
        let n = self.i64()?;
        u64::try_from(n).map_err(|_| bad(format!("negative {what} {n}")))
    }
    /// `DataInput.readUTF`: a u16 length, then Java's modified UTF-8.
    fn utf(&mut self) -> Result<String> {
        let len = u16::from_be_bytes(self.take(2)?.try_into().expect("2 bytes")) as usize;
        let raw = self.take(len)?;
        cesu8::from_java_cesu8(raw)
            .map(|s| s.into_owned())
            .map_err(|_| {
                bad(format!(
                    "a string at byte {} is not modified UTF-8",
                    self.at
                ))
            })
    }
    fn optional_utf(&mut self) -> Result<Option<String>> {
        Ok(Some(self.utf()?).filter(|s| !s.is_empty()))
    }
}

/// Parse a `_metadata` file's bytes.
pub fn parse(bytes: &[u8]) -> Result<Metadata> {
    let mut r = Reader { bytes, at: 0 };
    let magic = r.i32()? as u32;
    if magic != MAGIC {
        // Its bytes are not echoed: they may be anything (a file a link pointed at).
        return Err(bad(format!(
            "not a Flink checkpoint's _metadata (it does not begin with Flink's magic \
             number {MAGIC:08x})"
        )));
    }
    let version = r.i32()? as u32;
    if !VERSIONS.contains(&version) {
        return Err(bad(format!(
            "version {version}, which ckptfs does not read (it reads {} to {}: Flink 1.15 to 2.3)",
            VERSIONS.start(),
            VERSIONS.end()
        )));
    }
    let checkpoint_id = r.size("checkpoint id")?;
    let mut master_states = Vec::new();
    for _ in 0..r.items("number of master states", 8)? {
        if r.i32()? as u32 != MASTER_STATE_MAGIC {
            return Err(bad("a master state without its magic number"));
        }
        let len = r.count("master state length")? as usize;
        master_states.push(r.take(len)?.to_vec());
    }
    let mut operators = Vec::new();
    for _ in 0..r.items("number of operators", 24)? {
        operators.push(operator(&mut r, version)?);
    }
    // Version 4 on: Java-serialized checkpoint properties follow; not needed.
    Ok(Metadata {
        version,
        checkpoint_id,
        master_states,
        operators,
    })
}

fn operator(r: &mut Reader<'_>, version: u32) -> Result<OperatorState> {
    let (name, uid) = if version >= 5 {
        (r.optional_utf()?, r.optional_utf()?)
    } else {
        (None, None)
    };
    let lower = r.i64()?;
    let upper = r.i64()?;
    let id = format!("{:016x}{:016x}", lower as u64, upper as u64);
    let parallelism = r.count("parallelism")?;
    let max_parallelism = r.count("max parallelism")?;
    let coordinator_state = stream(r)?;
    let mut subtasks = Vec::new();
    let n = r.i32()?;
    let left = (r.bytes.len() - r.at) / 4;
    if n > 0 && n as usize > left {
        return Err(bad(format!(
            "{n} subtask states at byte {}: more than the bytes left can hold",
            r.at
        )));
    }
    // -1: a fully finished operator, nothing follows.
    for _ in 0..n.max(0) {
        let index = r.i32()?;
        if index < 0 {
            continue; // a finished subtask: no state
        }
        subtasks.push(subtask(r, version, index as u32, &id)?);
    }
    Ok(OperatorState {
        name,
        uid,
        id,
        parallelism,
        max_parallelism,
        coordinator_state,
        subtasks,
    })
}

fn subtask(r: &mut Reader<'_>, version: u32, index: u32, operator: &str) -> Result<SubtaskState> {
    let managed_operator_state = match r.i32()? {
        0 => None,
        _ => operator_state(r)?,
    };
    let raw_operator_state = match r.i32()? {
        0 => None,
        _ => operator_state(r)?,
    };
    let managed_keyed = keyed(r)?;
    let raw_keyed = keyed(r)?;
    let input_channels = r.count("input channel states")?;
    let output_channels = r.count("output channel states")?;
    if input_channels + output_channels > 0 {
        return Err(bad(format!(
            "operator {operator} subtask {index} holds in-flight channel state (an unaligned \
             checkpoint), which ckptfs does not import"
        )));
    }
    if version >= 7 && r.u8()? != 0 {
        r.i64()?; // the checkpoint the state was taken from
    }
    Ok(SubtaskState {
        index,
        managed_operator_state,
        raw_operator_state,
        managed_keyed,
        raw_keyed,
    })
}

fn stream(r: &mut Reader<'_>) -> Result<Option<StreamHandle>> {
    let begin = r.at;
    let type_byte = r.u8()?;
    Ok(Some(match type_byte {
        0 => return Ok(None),
        1 => {
            r.utf()?; // the path it would have had
            let len = r.count("inline state length")? as usize;
            StreamHandle::Inline(r.take(len)?.to_vec())
        }
        2 => {
            let size = r.size("file size")?;
            let at = r.at;
            let path = r.utf()?;
            StreamHandle::File {
                path,
                size,
                at,
                span: begin..r.at,
            }
        }
        6 => {
            let at = r.at;
            let path = r.utf()?;
            let size = r.size("file size")?;
            StreamHandle::Relative {
                at,
                path,
                size,
                span: begin..r.at,
            }
        }
        15 => {
            let start = r.size("segment offset")?;
            let size = r.size("segment size")?;
            r.i32()?; // scope
            let path = r.utf()?;
            r.utf()?; // logical file id
            StreamHandle::Segment {
                path,
                start,
                size,
                span: begin..r.at,
            }
        }
        16 => StreamHandle::EmptySegment,
        other => {
            return Err(bad(format!(
                "stream state handle of type {other}, which ckptfs does not know"
            )))
        }
    }))
}

/// Operator state handles (types 4 and 17): names, distribution modes and offsets.
fn operator_state(r: &mut Reader<'_>) -> Result<Option<OperatorStateHandle>> {
    let type_at = r.at;
    let type_byte = r.u8()?;
    if type_byte == 0 {
        return Ok(None);
    }
    if type_byte != 4 && type_byte != 17 {
        return Err(bad(format!(
            "operator state handle of type {type_byte}, which ckptfs does not know"
        )));
    }
    let mut states = Vec::new();
    for _ in 0..r.items("number of operator states", 7)? {
        let name = r.utf()?;
        let mode = r.u8()?;
        let offsets = (0..r.items("number of offsets", 8)?)
            .map(|_| r.size("offset"))
            .collect::<Result<Vec<_>>>()?;
        states.push((name, mode, offsets));
    }
    let mut merged = None;
    if type_byte == 17 {
        let from = r.at;
        r.utf()?; // task-owned directory
        r.utf()?; // shared directory
        r.u8()?; // empty
        merged = Some((type_at, from..r.at));
    }
    let handle = stream(r)?;
    if merged.is_some()
        && !matches!(
            handle,
            Some(StreamHandle::Segment { .. } | StreamHandle::EmptySegment)
        )
    {
        // Flink's own reader checks the same.
        return Err(bad(
            "file-merging operator state whose stream is not a segment",
        ));
    }
    Ok(Some(OperatorStateHandle {
        type_byte,
        merged,
        states,
        handle,
    }))
}

fn keyed(r: &mut Reader<'_>) -> Result<Option<KeyedHandle>> {
    let type_byte = r.u8()?;
    Ok(Some(match type_byte {
        0 => return Ok(None),
        5 | 11 => {
            let checkpoint_id = r.size("checkpoint id")?;
            let backend_id = r.utf()?;
            let key_group_start = r.count("key group")?;
            let key_group_count = r.count("number of key groups")?;
            if type_byte == 11 {
                r.i64()?; // the bytes this checkpoint added
            }
            let meta = stream(r)?.ok_or_else(|| bad("an incremental handle without meta data"))?;
            let mut files = |what: &str| -> Result<Vec<(String, StreamHandle)>> {
                (0..r.items(what, 3)?)
                    .map(|_| {
                        let name = r.utf()?;
                        let handle = stream(r)?
                            .ok_or_else(|| bad(format!("file {name} without a handle")))?;
                        Ok((name, handle))
                    })
                    .collect()
            };
            let shared = files("number of shared files")?;
            let private = files("number of private files")?;
            if type_byte == 11 {
                r.utf()?; // the handle's id
            }
            KeyedHandle::Incremental(IncrementalHandle {
                checkpoint_id,
                backend_id,
                key_group_start,
                key_group_count,
                meta,
                shared,
                private,
            })
        }
        3 | 7 | 12 => {
            let start = r.count("key group")?;
            let count = r.items("number of key groups", 8)?;
            for _ in 0..count {
                r.i64()?;
            }
            let handle = stream(r)?;
            if type_byte == 12 {
                r.utf()?;
            }
            KeyedHandle::KeyGroups {
                type_byte,
                start,
                count,
                handle,
            }
        }
        8 | 14 => {
            return Err(bad(
                "changelog state (state.changelog.enabled): ckptfs imports RocksDB's \
                 incremental checkpoints only",
            ))
        }
        other => {
            return Err(bad(format!(
                "keyed state handle of type {other}, which ckptfs does not know"
            )))
        }
    }))
}

/// `bytes` (a `_metadata` file) with the paths at the given offsets (the `at` of
/// [`StreamHandle::File`] and [`StreamHandle::Relative`] as [`parse`] read them) replaced:
/// the same checkpoint, naming its files elsewhere. Nothing else changes (handles carry no
/// lengths of what they hold, so a longer or shorter path moves the rest unharmed).
pub fn with_paths(bytes: &[u8], mut paths: Vec<(usize, String)>) -> Result<Vec<u8>> {
    paths.sort_by_key(|(at, _)| *at);
    let mut out = Vec::with_capacity(bytes.len() + paths.len() * 64);
    let mut from = 0;
    for (at, path) in paths {
        let old = bytes
            .get(at..at + 2)
            .filter(|_| at >= from)
            .map(|len| u16::from_be_bytes([len[0], len[1]]) as usize)
            .ok_or_else(|| bad(format!("no path at byte {at}")))?;
        let encoded = cesu8::to_java_cesu8(&path);
        let len = u16::try_from(encoded.len())
            .map_err(|_| bad(format!("path {path} is longer than 65535 bytes")))?;
        out.extend_from_slice(&bytes[from..at]);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&encoded);
        from = at + 2 + old;
        if from > bytes.len() {
            return Err(bad(format!("the path at byte {at} ends past the end")));
        }
    }
    out.extend_from_slice(&bytes[from..]);
    Ok(out)
}

/// `bytes` (a `_metadata` file) with each span replaced by its bytes: spans are those
/// [`parse`] found (whole handles, or a path's length prefix and bytes), none overlapping.
/// Handles carry no lengths of what they hold, so a longer or shorter handle moves the
/// rest unharmed.
pub fn rewrite(bytes: &[u8], mut edits: Vec<(Span, Vec<u8>)>) -> Result<Vec<u8>> {
    edits.sort_by_key(|(span, _)| (span.start, span.end));
    let grown: usize = edits.iter().map(|(_, b)| b.len()).sum();
    let mut out = Vec::with_capacity(bytes.len() + grown);
    let mut from = 0;
    for (span, with) in edits {
        if span.start < from || span.end < span.start || span.end > bytes.len() {
            return Err(bad(format!(
                "no handle at bytes {}..{} to replace",
                span.start, span.end
            )));
        }
        out.extend_from_slice(&bytes[from..span.start]);
        out.extend_from_slice(&with);
        from = span.end;
    }
    out.extend_from_slice(&bytes[from..]);
    Ok(out)
}

fn utf(out: &mut Vec<u8>, s: &str) -> Result<()> {
    let encoded = cesu8::to_java_cesu8(s);
    let len = u16::try_from(encoded.len())
        .map_err(|_| bad(format!("path {s} is longer than 65535 bytes")))?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&encoded);
    Ok(())
}

/// A stream handle of type 2 (a file by absolute URI) as Flink writes it.
pub fn file_handle(uri: &str, size: u64) -> Result<Vec<u8>> {
    let mut out = vec![2u8];
    out.extend_from_slice(&(size as i64).to_be_bytes());
    utf(&mut out, uri)?;
    Ok(out)
}

/// A stream handle of type 6 (a file by its path relative to the directory holding
/// `_metadata`) as Flink writes it.
pub fn relative_handle(path: &str, size: u64) -> Result<Vec<u8>> {
    let mut out = vec![6u8];
    utf(&mut out, path)?;
    out.extend_from_slice(&(size as i64).to_be_bytes());
    Ok(out)
}

/// The edits that turn every file-merging operator state handle (type 17) of `metadata`
/// that names a segment into a plain one (type 4): its type byte and the directories only type 17 has. Its
/// stream, a segment, must be replaced by a file handle in the same rewrite (Flink's
/// reader of type 4 takes any stream, of type 17 only a segment).
pub fn file_merging_undone(metadata: &Metadata) -> Vec<(Span, Vec<u8>)> {
    let mut edits = Vec::new();
    for op in &metadata.operators {
        for subtask in &op.subtasks {
            for state in [&subtask.managed_operator_state, &subtask.raw_operator_state]
                .into_iter()
                .flatten()
            {
                // An empty one names no file (Flink skips it at restore; as type 4 it would
                // have a stream to read): left as it is.
                if matches!(state.handle, Some(StreamHandle::EmptySegment)) {
                    continue;
                }
                if let Some((type_at, dirs)) = &state.merged {
                    edits.push((*type_at..type_at + 1, vec![4u8]));
                    edits.push((dirs.clone(), Vec::new()));
                }
            }
        }
    }
    edits
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(n: u32) -> Vec<u8> {
        let path = format!(
            "{}/../../tests/fixtures/flink/job1/chk-{n}/_metadata",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// The fixture of a real Flink 2.3 job (tests/fixtures/flink/README.md): version 6,
    /// four operators, two with RocksDB incremental state over two subtasks whose key groups
    /// cover 0..128; every file a RocksDB name; CURRENT names a MANIFEST of its subtask.
    #[test]
    fn a_flink_2_3_checkpoint_is_read() {
        for n in [4, 5, 6] {
            let metadata = parse(&fixture(n)).unwrap();
            assert_eq!(metadata.version, 6);
            assert_eq!(metadata.checkpoint_id, n as u64);
            assert_eq!(metadata.operators.len(), 4);
            let counter = metadata
                .operators
                .iter()
                .find(|o| o.uid.as_deref() == Some("counter"))
                .unwrap();
            assert_eq!(counter.id.len(), 32);
            assert_eq!((counter.parallelism, counter.max_parallelism), (2, 128));
            let keyed: Vec<&OperatorState> = metadata
                .operators
                .iter()
                .filter(|o| {
                    o.subtasks
                        .iter()
                        .any(|s| matches!(s.managed_keyed, Some(KeyedHandle::Incremental(_))))
                })
                .collect();
            assert_eq!(keyed.len(), 2, "checkpoint {n}");
            for op in keyed {
                let mut groups = 0;
                for subtask in &op.subtasks {
                    let Some(KeyedHandle::Incremental(h)) = &subtask.managed_keyed else {
                        panic!("subtask {} has no incremental state", subtask.index);
                    };
                    assert_eq!(h.checkpoint_id, n as u64);
                    groups += h.key_group_count;
                    assert!(h.shared.iter().all(|(name, _)| name.ends_with(".sst")));
                    let (_, current) = h.private.iter().find(|(n, _)| n == "CURRENT").unwrap();
                    let StreamHandle::Inline(bytes) = current else {
                        panic!("CURRENT is inline");
                    };
                    let manifest = std::str::from_utf8(bytes).unwrap().trim_end();
                    assert!(h.private.iter().any(|(name, _)| name == manifest));
                }
                assert_eq!(groups, 128);
            }
        }
    }

    /// The file handles of every subtask's incremental keyed state.
    fn keyed_files(m: &mut Metadata) -> Vec<&mut StreamHandle> {
        let mut out = Vec::new();
        for op in &mut m.operators {
            for s in &mut op.subtasks {
                if let Some(KeyedHandle::Incremental(h)) = &mut s.managed_keyed {
                    out.push(&mut h.meta);
                    out.extend(
                        h.shared
                            .iter_mut()
                            .chain(h.private.iter_mut())
                            .map(|(_, f)| f),
                    );
                }
            }
        }
        out
    }

    /// Every file's path rewritten (longer, and non-ASCII): the same checkpoint naming
    /// the new paths, every other field as it was.
    #[test]
    fn paths_are_rewritten_and_nothing_else() {
        const PREFIX: &str = "file:/elsewhere/\u{e9}t\u{e9}/";
        let bytes = fixture(6);
        let mut before = parse(&bytes).unwrap();
        let mut paths = Vec::new();
        for f in keyed_files(&mut before) {
            if let StreamHandle::File { path, at, span, .. }
            | StreamHandle::Relative { path, at, span, .. } = f
            {
                paths.push((*at, format!("{PREFIX}{path}")));
                (*at, *span) = (0, 0..0);
            }
        }
        assert!(paths.len() > 4, "the fixture names files");
        let expected: Vec<String> = paths.iter().map(|(_, p)| p.clone()).collect();
        let mut after = parse(&with_paths(&bytes, paths).unwrap()).unwrap();
        let mut seen = Vec::new();
        for f in keyed_files(&mut after) {
            if let StreamHandle::File { path, at, span, .. }
            | StreamHandle::Relative { path, at, span, .. } = f
            {
                seen.push(path.clone());
                *path = path.trim_start_matches(PREFIX).to_string();
                (*at, *span) = (0, 0..0);
            }
        }
        assert_eq!(seen, expected);
        assert_eq!(after, before);
        // No paths: the same bytes, the trailer (Java-serialized properties) included.
        assert_eq!(with_paths(&bytes, Vec::new()).unwrap(), bytes);
        assert!(with_paths(&bytes, vec![(bytes.len() - 1, "x".into())]).is_err());
    }

    /// Whole handles replaced: every file handle becomes a relative one of the same size,
    /// read back as such, and everything else stays as it was.
    #[test]
    fn handles_are_replaced_whole() {
        let bytes = fixture(6);
        let mut before = parse(&bytes).unwrap();
        let mut edits = Vec::new();
        for f in keyed_files(&mut before) {
            if let StreamHandle::File {
                path, size, span, ..
            } = f
            {
                let name = path.rsplit('/').next().unwrap();
                let rel = format!("../shared/{name}");
                edits.push((span.clone(), relative_handle(&rel, *size).unwrap()));
                *f = StreamHandle::Relative {
                    path: rel,
                    size: *size,
                    at: 0,
                    span: 0..0,
                };
            }
        }
        assert!(edits.len() > 4, "the fixture names files");
        let mut after = parse(&rewrite(&bytes, edits).unwrap()).unwrap();
        for f in keyed_files(&mut after) {
            match f {
                StreamHandle::Relative { at, span, .. } => (*at, *span) = (0, 0..0),
                StreamHandle::Inline(_) => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(after, before);
        assert_eq!(rewrite(&bytes, Vec::new()).unwrap(), bytes);
        // Back to an absolute file handle: the same bytes as Flink's.
        let mut first = parse(&bytes).unwrap();
        let (path, size, span) = keyed_files(&mut first)
            .into_iter()
            .find_map(|f| match f {
                StreamHandle::File {
                    path, size, span, ..
                } => Some((path.clone(), *size, span.clone())),
                _ => None,
            })
            .unwrap();
        assert_eq!(file_handle(&path, size).unwrap(), bytes[span].to_vec());
        // Overlapping spans.
        assert!(rewrite(&bytes, vec![(2..6, Vec::new()), (4..8, Vec::new())]).is_err());
        assert!(rewrite(&bytes, vec![(0..bytes.len() + 1, Vec::new())]).is_err());
    }

    #[test]
    fn damaged_or_foreign_metadata_is_refused() {
        let good = fixture(6);
        assert!(parse(&good[..good.len() / 2]).is_err());
        let mut other_magic = good.clone();
        other_magic[0] ^= 1;
        assert!(parse(&other_magic)
            .unwrap_err()
            .to_string()
            .contains("magic"));
        let mut newer = good.clone();
        newer[4..8].copy_from_slice(&9i32.to_be_bytes());
        assert!(parse(&newer).unwrap_err().to_string().contains("version 9"));
        for cut in (0..good.len()).step_by(997) {
            // Never a panic, whatever the damage.
            let _ = parse(&good[..cut]);
        }
    }
}
