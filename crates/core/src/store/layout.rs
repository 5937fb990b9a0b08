//! Every name in a store and in a daemon's state directory, in one place. A store (a
//! directory, or a bucket prefix on object storage) holds:
//!
//! ```text
//! ckptfs.json              the store's metadata (format, retain, next id, backends; on
//!                          object storage also the writer's epoch and pending/void ids)
//! ckptfs.copy.json         its copy, read only to rebuild it when it is lost (settings,
//!                          pins, dropped Flink checkpoints, a next id ahead of its own)
//! checkpoints/N.json       one manifest per retained checkpoint
//! quarantine/              manifests `fsck --repair` set aside (local stores)
//! objects/                 stored files, chunks and file lists, named by BLAKE3
//! tmp/                     objects being staged (local stores)
//! lock                     the writer's lock (local stores)
//! lease.json, clock.json   the writer's lease and the store's clock (object storage)
//! state/                   the default state directory (local stores)
//! ckptfs.log               the daemon's log (local stores; else in the state directory)
//! ```
//!
//! and a state directory holds `backends/<operator>/<subtask>/` (the live RocksDB
//! instances), `staging/` (checkpoints' synchronous phase), `cache/` (objects fetched from
//! object storage), `restore-intent` and its own `lock`.

/// The store's metadata record.
pub const META: &str = "ckptfs.json";
/// The copy of the store's metadata that rebuilds it when it is lost: no commit point. Its
/// name does not contain [`META`]'s, so that nothing matching one names the other.
pub const META_COPY: &str = "ckptfs.copy.json";
/// The directory (key prefix) of the manifests.
pub const CHECKPOINTS: &str = "checkpoints";
/// Where `fsck --repair` moves manifests that cannot be read.
pub const QUARANTINE: &str = "quarantine";
/// The directory (key prefix) of the stored objects.
pub const OBJECTS: &str = "objects";
/// Objects being staged in a local store.
pub const TMP: &str = "tmp";
/// The lock file of a local store or a state directory.
pub const LOCK: &str = "lock";
/// The writer's lease on object storage.
pub const LEASE: &str = "lease.json";
/// The record written to read the store's clock (object storage).
pub const CLOCK: &str = "clock.json";
/// The default state directory inside a local store.
pub const STATE: &str = "state";
/// The background daemon's log, in a local store or the state directory.
pub const LOG: &str = "ckptfs.log";

/// In a state directory: the live RocksDB instances.
pub const BACKENDS: &str = "backends";
/// In a state directory: checkpoints' and materializations' staging areas.
pub const STAGING: &str = "staging";
/// In a state directory: objects fetched from object storage.
pub const CACHE: &str = "cache";
/// In a state directory: the checkpoint a restore is installing.
pub const RESTORE_INTENT: &str = "restore-intent";

/// The key of checkpoint `id`'s manifest.
pub fn manifest_key(id: u64) -> String {
    format!("{CHECKPOINTS}/{}", manifest_name(id))
}

/// The file name of checkpoint `id`'s manifest.
pub fn manifest_name(id: u64) -> String {
    format!("{id}.json")
}

/// The checkpoint id in a manifest file name (`N.json`, N canonical).
pub fn manifest_id(name: &str) -> Option<u64> {
    name.strip_suffix(".json")
        .and_then(|n| n.parse::<u64>().ok())
        .filter(|id| manifest_name(*id) == name)
}

/// The key of an object on object storage.
pub fn object_key(hex: &str) -> String {
    format!("{OBJECTS}/{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_names_round_trip_and_only_canonical_ones_count() {
        assert_eq!(manifest_key(7), "checkpoints/7.json");
        assert_eq!(manifest_id(&manifest_name(42)), Some(42));
        for other in ["07.json", "7.json.bad", "x.json", "7", "-1.json", "+7.json"] {
            assert_eq!(manifest_id(other), None, "{other}");
        }
    }
}
