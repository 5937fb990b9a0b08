//! The S3 store's parts over a real S3 server (moto_server, see `moto.rs`).

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use object_store::{ObjectStoreExt as _, PutPayload};

use super::moto;
use super::transfer::UploadBody;
use super::{Remote, S3Objects, S3Options, S3Records, PART_SIZE};
use crate::error::{Error, ErrorKind, Result};
use crate::store::records::{Put, Records};
use crate::store::{layout, ObjectId, ObjectStore, WriteFence};

/// Objects of a new bucket, cached in a directory of their own.
fn new_objects(remote: &Arc<Remote>) -> (S3Objects, tempfile::TempDir) {
    let cache = tempfile::tempdir().unwrap();
    let options = S3Options {
        upload_concurrency: 2,
        cache_size: 1 << 30,
    };
    let objects = S3Objects::new(remote.clone(), options, &cache.path().join("cache")).unwrap();
    (objects, cache)
}

/// Put `bytes` at `name` below the store's prefix, as another writer would.
fn put_raw(remote: &Remote, name: &str, bytes: &[u8]) {
    remote
        .block_on(
            remote
                .client
                .put(&remote.key(name), PutPayload::from(bytes.to_vec())),
        )
        .unwrap();
}

/// The size of `name` below the store's prefix, `None` if there is no such key.
fn size_at(remote: &Remote, name: &str) -> Option<u64> {
    remote.size_of(&remote.full_key(name)).unwrap()
}

fn object_name(id: &ObjectId) -> String {
    layout::object_key(&id.to_hex())
}

/// Bytes that differ from part to part (a part uploaded twice, or out of order, shows).
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(2_654_435_761) as u8 ^ seed ^ (i >> 20) as u8)
        .collect()
}

#[test]
fn an_upload_above_part_size_round_trips_and_is_refused_when_it_does_not_hash_to_its_id() {
    let remote = moto::remote();
    let (objects, _cache) = new_objects(&remote);
    let bytes = pattern(2 * PART_SIZE + 12_345, 7);

    // From a file (read in parts) and from memory: the same object, in three parts.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("big");
    std::fs::write(&src, &bytes).unwrap();
    let staged = objects.stage(&src).unwrap();
    let id = staged.id;
    assert_eq!(id, ObjectId::from_hash(blake3::hash(&bytes)));
    assert_eq!(staged.size, bytes.len() as u64);
    objects.publish(staged).unwrap();
    let again = objects.stage_bytes(&bytes).unwrap();
    assert_eq!(again.id, id);
    objects.publish(again).unwrap();
    assert_eq!(
        size_at(&remote, &object_name(&id)),
        Some(bytes.len() as u64)
    );
    let mut back = Vec::new();
    objects.open(&id).unwrap().read_to_end(&mut back).unwrap();
    assert!(back == bytes, "the object read back differs");

    // Bytes that are not the id's: refused, and nothing lands under the id's key.
    let other = ObjectId::from_hash(blake3::hash(b"something else"));
    for body in [UploadBody::Bytes(&bytes), UploadBody::Bytes(&bytes[..1000])] {
        let e = objects.upload(&other, body).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
        assert!(e.to_string().contains("does not hash to it"), "{e}");
    }
    assert_eq!(size_at(&remote, &object_name(&other)), None);
}

#[test]
fn a_fetch_into_the_cache_verifies_and_refuses_a_changed_or_missing_object() {
    let remote = moto::remote();
    let (objects, _cache) = new_objects(&remote);
    let bytes = pattern(100_000, 1);
    let staged = objects.stage_bytes(&bytes).unwrap();
    let id = staged.id;
    objects.publish(staged).unwrap();
    objects.verify(&id, bytes.len() as u64).unwrap();
    let cached = objects.local_path(&id).expect("cached by the fetch");
    assert!(std::fs::read(cached).unwrap() == bytes);

    // Another writer (or bit rot) changes the object: a fresh cache refuses it, keeping
    // nothing, however often it is asked.
    put_raw(&remote, &object_name(&id), &pattern(100_000, 2));
    let (fresh, cache) = new_objects(&remote);
    for _ in 0..2 {
        let e = fresh.open(&id).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
        assert!(e.to_string().contains("does not match its checksum"), "{e}");
    }
    assert_eq!(fresh.local_path(&id), None);
    let left: Vec<_> = std::fs::read_dir(cache.path().join("cache"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "the cache kept {left:?}");

    // A missing object is said so.
    let missing = ObjectId::from_hash(blake3::hash(b"never stored"));
    let e = fresh.open(&missing).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    assert!(e.to_string().contains("missing from the store"), "{e}");
}

#[test]
fn delete_many_deletes_in_batches_skips_a_missing_key_and_a_staged_object() {
    let remote = moto::remote();
    let (objects, _cache) = new_objects(&remote);
    // 1,001 ids: 999 stored, one never stored, and one stored and staged again.
    let mut ids = Vec::new();
    for n in 0u32..1000 {
        let staged = objects.stage_bytes(&n.to_le_bytes()).unwrap();
        ids.push(staged.id);
        objects.publish(staged).unwrap();
    }
    let staged_again = objects.stage_bytes(&7u32.to_le_bytes()).unwrap();
    let missing = ObjectId::from_hash(blake3::hash(b"never stored"));
    ids.insert(500, missing);
    assert_eq!(ids.len(), 1001);
    assert_eq!(objects.list().unwrap().len(), 1000);

    let failed = objects.delete_many(&ids);
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(objects.list().unwrap(), vec![staged_again.id]);
    objects.publish(staged_again).unwrap();
    assert!(objects.has_objects().unwrap());
}

#[test]
fn list_modified_ignores_stray_keys() {
    let remote = moto::remote();
    let (objects, _cache) = new_objects(&remote);
    assert!(!objects.has_objects().unwrap());
    let staged = objects.stage_bytes(b"an object").unwrap();
    let id = staged.id;
    objects.publish(staged).unwrap();
    let hex = id.to_hex();
    for stray in [
        "objects/not-an-id".to_string(),
        format!("objects/{}", hex.to_uppercase()),
        format!("objects/{hex}.tmp"),
        format!("objects/sub/{hex}"),
    ] {
        put_raw(&remote, &stray, b"stray");
    }
    put_raw(&remote, "checkpoints/1.json", b"{}");
    put_raw(&remote, &format!("objectsx/{hex}"), b"stray");

    let listed = objects.list_modified().unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].0, id);
    assert!(listed[0].1.is_some());
    assert_eq!(objects.list().unwrap(), vec![id]);
}

#[test]
fn records_put_create_only_and_conditional() {
    let remote = moto::remote();
    let records = S3Records::new(remote.clone());
    records.check_conditional_writes().unwrap();
    let key = "checkpoints/1.json";

    // Create-only: the first lands; another's bytes are refused as Exists; the same bytes
    // again (our own write landed before a retry) are taken as landed.
    let first = records.put(key, b"one", Put::Create).unwrap();
    assert!(first.is_some());
    let e = records.put(key, b"two", Put::Create).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Exists, "{e}");
    assert_eq!(records.put(key, b"one", Put::Create).unwrap(), first);
    let got = records.get(key).unwrap().unwrap();
    assert_eq!((got.bytes.as_slice(), &got.version), (&b"one"[..], &first));

    // Conditional: only over the version read.
    let second = records
        .put(key, b"two", Put::Update(first.clone()))
        .unwrap();
    assert!(second.is_some() && second != first);
    let e = records
        .put(key, b"three", Put::Update(first.clone()))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    let e = records
        .put(key, b"three", Put::Update(Some("\"no-such-etag\"".into())))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    assert_eq!(records.get(key).unwrap().unwrap().bytes, b"two");

    // An update of a record that is not there is refused too; an overwrite is not.
    let e = records
        .put("checkpoints/2.json", b"x", Put::Update(second.clone()))
        .unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::Conflict | ErrorKind::NotFound),
        "{e}"
    );
    assert!(records.get("checkpoints/2.json").unwrap().is_none());
    records.put(key, b"four", Put::Overwrite).unwrap();
    assert_eq!(records.get(key).unwrap().unwrap().bytes, b"four");
    let mut listed = records.list("checkpoints").unwrap();
    listed.sort();
    assert_eq!(listed, vec!["1.json".to_string()]);
    records.delete(key).unwrap();
    assert!(records.get(key).unwrap().is_none());
}

/// A writer that lost the store.
struct Lost;

impl WriteFence for Lost {
    fn check(&self) -> Result<()> {
        Err(Error::Conflict("the lease is another writer's".into()))
    }
}

#[test]
fn the_staging_sweep_removes_only_staging_keys_older_than_the_grace() {
    let remote = moto::remote();
    let (objects, _cache) = new_objects(&remote);
    let staged = objects.stage_bytes(b"an object").unwrap();
    let id = staged.id;
    objects.publish(staged).unwrap();
    put_raw(&remote, "tmp/1-2-3", b"a copy");
    put_raw(&remote, "tmp/4-5-6", b"another");
    put_raw(&remote, "checkpoints/1.json", b"{}");
    put_raw(&remote, "tmpx/1", b"not staging");
    let tmp = |name: &str| size_at(&remote, &format!("tmp/{name}"));

    // Young: kept (as a copy in flight is).
    assert_eq!(objects.clear_staging().unwrap(), 0);
    assert_eq!(
        objects.sweep_copy_staging(Duration::from_secs(60)).unwrap(),
        0
    );
    assert!(tmp("1-2-3").is_some() && tmp("4-5-6").is_some());

    // A writer that lost the store deletes nothing.
    let (fenced, _cache2) = objects_fenced(&remote);
    let e = fenced.sweep_copy_staging(Duration::ZERO).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    assert!(tmp("1-2-3").is_some() && tmp("4-5-6").is_some());

    // A copy in parts to a staging key that never completed (a crash), and an upload of an
    // object in flight.
    let begin = |name: &str| {
        let url = remote.key_url(&remote.full_key(name));
        let answered = remote
            .block_on(remote.send(
                || {
                    http::Request::builder()
                        .method(http::Method::POST)
                        .uri(format!("{url}?uploads"))
                },
                bytes::Bytes::new(),
            ))
            .unwrap();
        assert_eq!(answered.status, 200);
    };
    begin("tmp/7-8-9");
    begin(&object_name(&id));
    let uploads = || {
        remote
            .stale_uploads(&remote.full_key(""), Duration::ZERO)
            .unwrap()
            .into_iter()
            .map(|(key, _)| key)
            .collect::<Vec<_>>()
    };
    assert_eq!(uploads().len(), 2);

    // Older than the grace: swept (the keys, and the upload to a staging key), and nothing
    // else.
    assert_eq!(objects.sweep_copy_staging(Duration::ZERO).unwrap(), 3);
    assert_eq!((tmp("1-2-3"), tmp("4-5-6")), (None, None));
    assert_eq!(uploads(), [remote.full_key(&object_name(&id))]);
    assert!(size_at(&remote, &object_name(&id)).is_some());
    assert!(size_at(&remote, "checkpoints/1.json").is_some());
    assert!(size_at(&remote, "tmpx/1").is_some());
}

fn objects_fenced(remote: &Arc<Remote>) -> (S3Objects, tempfile::TempDir) {
    let (objects, cache) = new_objects(remote);
    (objects.with_fence(Arc::new(Lost)), cache)
}

/// A copy larger than one CopyObject copies is made in parts, named by the SHA-256 of its
/// parts' SHA-256s (as every reader recomputes it), read back whole and checked; a changed
/// object is refused at its fetch. A copy in parts that fails leaves no upload behind.
#[test]
fn a_copy_in_parts_is_named_by_its_parts_checksums_and_checked_when_read() {
    let mut remote = moto::remote();
    // Parts of 8 MiB above 6 MiB, instead of 1 GiB above 1 GiB (moto takes parts of 5 MiB
    // and more, as S3 does).
    let copier = &mut Arc::get_mut(&mut remote).unwrap().copier;
    copier.single_max = 6 << 20;
    copier.part_log2 = 23;
    let source = Remote::connect_to(&moto::bucket(), "", Some(&moto::endpoint())).unwrap();
    let bytes = pattern((20 << 20) + 12_345, 3);
    let key = "job/shared/big.sst";
    source
        .block_on(
            source
                .client
                .put(&key.into(), PutPayload::from(bytes.clone())),
        )
        .unwrap();
    let file = source.remote_file(key).unwrap().unwrap();

    let (objects, _cache) = new_objects(&remote);
    let staged = objects.copy_in(&file).unwrap();
    let id = staged.id;
    assert!(id.to_hex().starts_with("sha256p23-"), "{id}");
    let mut hasher = id.hasher();
    hasher.update(&bytes);
    assert_eq!(
        hasher.finalize(),
        id,
        "not the SHA-256 of 8 MiB parts' SHA-256s"
    );
    objects.publish(staged).unwrap();
    let mut read = Vec::new();
    objects.open(&id).unwrap().read_to_end(&mut read).unwrap();
    assert!(read == bytes, "the copy in parts differs");
    assert_eq!(
        remote
            .list_keys(&remote.full_key("tmp/"), false)
            .unwrap()
            .len(),
        0,
        "the staging copy stayed"
    );

    // The object changed behind ckptfs's back: refused when fetched.
    let (objects, _cache) = new_objects(&remote);
    let mut changed = bytes.clone();
    changed[(9 << 20) + 1] ^= 1;
    put_raw(&remote, &object_name(&id), &changed);
    let e = objects.open(&id).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");

    // A source that is gone: NotFound, and the upload is aborted.
    let e = remote
        .copy_from(
            &source,
            "job/shared/gone.sst",
            &remote.full_key("x"),
            20 << 20,
            None,
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    let uploads = remote
        .block_on(remote.send(
            || {
                http::Request::builder()
                    .method(http::Method::GET)
                    .uri(format!("{}?uploads", remote.copier.bucket_url))
            },
            bytes::Bytes::new(),
        ))
        .unwrap();
    let listed = String::from_utf8(uploads.body).unwrap();
    assert_eq!(uploads.status, 200, "{listed}");
    assert!(!listed.contains("<Upload>"), "an upload was left: {listed}");
}

/// A source file in a bucket is read by one GET within its limit: an empty one, one of
/// exactly the limit, and nothing past it (refused with its size, read no further); a
/// missing one is not found.
#[test]
fn a_source_object_is_read_within_its_limit_and_refused_past_it() {
    use crate::source::{S3Tree, Tree};
    let remote = moto::remote();
    put_raw(&remote, "src/empty", b"");
    put_raw(&remote, "src/ten", &pattern(10, 1));
    put_raw(&remote, "src/eleven", &pattern(11, 2));
    let tree = S3Tree::new(remote.clone(), "store/src");
    assert_eq!(tree.read("empty", 10).unwrap(), b"");
    assert_eq!(tree.read("ten", 10).unwrap(), pattern(10, 1));
    let e = tree.read("eleven", 10).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Refused, "{e}");
    assert!(e.to_string().contains("11 bytes, more than the 10"), "{e}");
    assert!(matches!(
        remote.get_within("store/src/eleven", 10).unwrap(),
        super::Within::Larger(Some(11))
    ));
    let e = tree.read("missing", 10).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(tree.read("../other", 10).is_err());
}
