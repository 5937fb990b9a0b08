//! An object's bytes as a response body, verified as they are read, as the mount verifies:
//!
//! - a whole stored object is hashed as it streams and its last piece is held back until
//!   the hash and size match: a damaged object ends the response with an error (the
//!   connection is cut short of its Content-Length), and the client never receives the
//!   whole of wrong bytes as good;
//! - a range of a stored object is served once the whole object was verified (once per
//!   daemon and object, as the mount does at first open; concurrent ranges of one object
//!   wait for one verification);
//! - a file stored as chunks is read chunk by chunk, each verified against its id before
//!   any of its bytes go out;
//! - a generated file comes from memory.
//!
//! The reading runs on a blocking thread, at most [`PIECES_AHEAD`] pieces ahead of the
//! client: what a slow client holds is bounded.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use s3s::{s3_error, S3Result};

use super::bucket::{Content, Found};
use crate::fs::seam::Checkpoints;
use ckptfs_core::error::{Error, Result};
use ckptfs_core::fsutil::lock;
use ckptfs_core::store::chunks::Chunks;
use ckptfs_core::store::ObjectId;

/// The size of the pieces a body is sent in.
pub const PIECE: usize = 1 << 20;
/// Pieces read ahead of what the client took.
pub const PIECES_AHEAD: usize = 4;

/// The byte range a request asks for within `size` bytes, and its Content-Range if it is
/// not the whole object.
pub fn range_of(
    asked: Option<&s3s::dto::Range>,
    size: u64,
) -> S3Result<(Range<u64>, Option<String>)> {
    let Some(asked) = asked else {
        return Ok((0..size, None));
    };
    let range = asked
        .check(size)
        .map_err(|_| s3_error!(InvalidRange, "the object has {size} bytes"))?;
    let content_range = format!("bytes {}-{}/{size}", range.start, range.end - 1);
    Ok((range, Some(content_range)))
}

/// Objects this door verified whole, and a lock per object being verified.
#[derive(Default)]
pub struct Verified(Mutex<HashMap<ObjectId, Arc<Mutex<bool>>>>);

impl Verified {
    /// Verify `object` (of `size` bytes) unless it was; one verification at a time each.
    fn once(&self, checkpoints: &dyn Checkpoints, object: &ObjectId, size: u64) -> Result<()> {
        let slot = lock(&self.0).entry(*object).or_default().clone();
        let mut done = lock(&slot);
        if !*done {
            checkpoints.object_store().verify(object, size)?;
            *done = true;
        }
        Ok(())
    }

    fn mark(&self, object: &ObjectId) {
        let slot = lock(&self.0).entry(*object).or_default().clone();
        *lock(&slot) = true;
    }
}

/// A body's pieces as they are read (an error ends it).
pub struct Pieces {
    rx: tokio::sync::mpsc::Receiver<io::Result<Bytes>>,
}

impl futures::Stream for Pieces {
    type Item = io::Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

/// What a reader thread reads from.
enum Source {
    Bytes(Bytes),
    Whole(File, ObjectId),
    Part(File),
    Chunks(Chunks),
}

/// Open `found`'s bytes `range` for reading (the errors a client should get as an error
/// status come here: a missing object, a range of a damaged one) and start reading them.
pub fn open(
    checkpoints: Arc<dyn Checkpoints>,
    verified: Arc<Verified>,
    found: Found,
    range: Range<u64>,
) -> Result<Pieces> {
    let store = checkpoints.object_store();
    let size = found.content.size();
    let source = match &found.content {
        Content::Generated(bytes) => Source::Bytes(Bytes::copy_from_slice(
            &bytes[range.start as usize..range.end as usize],
        )),
        Content::Stored {
            chunks: Some(chunks),
            ..
        } => {
            chunks.validate(size)?;
            Source::Chunks((**chunks).clone())
        }
        Content::Stored { object, .. } if range == (0..size) => {
            Source::Whole(store.open(object)?, *object)
        }
        Content::Stored { object, .. } => {
            verified
                .once(&*checkpoints, object, size)
                .inspect_err(|e| record(&*checkpoints, &found, e))?;
            Source::Part(store.open(object)?)
        }
    };
    let (tx, rx) = tokio::sync::mpsc::channel(PIECES_AHEAD);
    tokio::task::spawn_blocking(move || {
        let sent = read(&*checkpoints, &verified, source, &found, range, &tx);
        if let Err(e) = sent {
            record(&*checkpoints, &found, &e);
            let _ = tx.blocking_send(Err(io::Error::other(e.to_string())));
        }
    });
    Ok(Pieces { rx })
}

/// Log and record what kept `found` from being served.
fn record(checkpoints: &dyn Checkpoints, found: &Found, e: &Error) {
    let msg = format!("S3 door: cannot serve {}: {e}", found.path);
    log::error!("{msg}");
    checkpoints.record_error(msg);
}

/// A client that went away: nothing more to read for it.
struct Gone;

impl From<Gone> for Error {
    fn from(_: Gone) -> Error {
        Error::io("send", io::Error::from(io::ErrorKind::BrokenPipe))
    }
}

fn send(
    tx: &tokio::sync::mpsc::Sender<io::Result<Bytes>>,
    piece: Bytes,
) -> std::result::Result<(), Gone> {
    tx.blocking_send(Ok(piece)).map_err(|_| Gone)
}

/// Read `range` of `source` into `tx`, verifying as the module says. A client that went
/// away ends it quietly.
fn read(
    checkpoints: &dyn Checkpoints,
    verified: &Verified,
    source: Source,
    found: &Found,
    range: Range<u64>,
    tx: &tokio::sync::mpsc::Sender<io::Result<Bytes>>,
) -> Result<()> {
    let size = found.content.size();
    let quiet = |r: std::result::Result<(), Gone>| -> Result<bool> { Ok(r.is_err()) };
    match source {
        Source::Bytes(bytes) => {
            let _ = send(tx, bytes);
        }
        Source::Part(file) => {
            let mut at = range.start;
            while at < range.end {
                let n = ((range.end - at) as usize).min(PIECE);
                let mut buf = vec![0u8; n];
                file.read_exact_at(&mut buf, at)
                    .map_err(|e| Error::io(format!("read {}", found.path), e))?;
                if quiet(send(tx, Bytes::from(buf)))? {
                    return Ok(());
                }
                at += n as u64;
            }
        }
        Source::Chunks(chunks) => {
            let store = checkpoints.object_store();
            let mut at = range.start;
            while at < range.end {
                let index = (at / chunks.size as u64) as usize;
                let start = index as u64 * chunks.size as u64;
                let chunk = chunks.read_chunk(store, index, size)?;
                let from = (at - start) as usize;
                let to = ((range.end - start) as usize).min(chunk.len());
                let chunk = Bytes::from(chunk).slice(from..to);
                at = start + to as u64;
                if quiet(send(tx, chunk))? {
                    return Ok(());
                }
            }
        }
        Source::Whole(file, object) => {
            if whole(file, &object, size, found, tx)? {
                verified.mark(&object);
            }
        }
    }
    Ok(())
}

/// Stream a whole stored object, hashing it, its last piece (the one that reaches the
/// size the checkpoint says) held back until the end of the file is read and the hash
/// and size are checked. False if the client went away first.
fn whole(
    mut file: File,
    object: &ObjectId,
    size: u64,
    found: &Found,
    tx: &tokio::sync::mpsc::Sender<io::Result<Bytes>>,
) -> Result<bool> {
    use std::io::Read;
    let mut hasher = object.hasher();
    let mut held: Option<Bytes> = None;
    let mut total = 0u64;
    loop {
        // Not zeroed first: read_to_end fills the spare capacity as it is.
        let mut buf = Vec::with_capacity(PIECE);
        let filled = (&mut file)
            .take(PIECE as u64)
            .read_to_end(&mut buf)
            .map_err(|e| Error::io(format!("read {}", found.path), e))?;
        if filled == 0 {
            break;
        }
        total += filled as u64;
        if total > size {
            return Err(Error::Corrupt(format!(
                "object {object} has more than the {size} bytes its checkpoint says"
            )));
        }
        hasher.update(&buf);
        if total < size {
            if send(tx, Bytes::from(buf)).is_err() {
                return Ok(false);
            }
        } else {
            // The last piece the object should have: held until the hash says it is.
            held = Some(Bytes::from(buf));
        }
    }
    if total != size {
        return Err(Error::Corrupt(format!(
            "object {object} has {total} bytes, expected {size}"
        )));
    }
    if hasher.finalize() != *object {
        return Err(Error::Corrupt(format!(
            "object {object} does not match its checksum"
        )));
    }
    if let Some(piece) = held {
        if send(tx, piece).is_err() {
            return Ok(false);
        }
    }
    Ok(true)
}
