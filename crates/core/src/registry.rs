//! The shared state registry: which retained checkpoint references which stored object.
//!
//! Pure bookkeeping, no I/O: callers delete what the registry reports as garbage. The
//! reference count of an object is the number of retained checkpoints that reference it;
//! in-flight checkpoints hold *pins* instead, so an object a running checkpoint stored or
//! matched is never garbage under it. Everything here is rebuilt from the manifests at
//! startup ([`Registry::from_checkpoints`]), so the manifests are the only source of truth.
//!
//! A checkpoint's objects are not kept here: its manifest (immutable, in memory) names them
//! again when it is dropped. The registry keeps their number and a digest of their ids per
//! checkpoint, and checks both at the drop: with 10,000 retained checkpoints of hundreds of
//! objects each, a copy of every checkpoint's object list was a tenth of the daemon's
//! memory.

use std::collections::{BTreeMap, BTreeSet};

use hashbrown::HashTable;

use crate::store::ObjectId;

/// One object's counts.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Slot {
    id: ObjectId,
    count: u32,
    pins: u32,
    /// Bytes, where known (files and chunks; file lists are not sized).
    size: u64,
}

/// The reference counts and pins of every live object, and what each retained checkpoint
/// was registered with. An object has a slot while it is referenced or pinned; a slot whose
/// count and pins both reach zero is freed and its object reported as garbage.
#[derive(Debug, Default, Clone)]
pub struct Registry {
    /// Slot numbers, found by their object's id. Only the 4-byte slot is kept per entry
    /// (the id is in the slot): a map from 32-byte ids was 10 MB of a 94 MiB daemon with
    /// 122,870 objects.
    index: HashTable<u32>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Each retained checkpoint's objects (each once): how many, and a digest of their ids.
    checkpoints: BTreeMap<u64, Registered>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Registered {
    objects: u32,
    digest: u64,
}

/// The hash of an id in the index: its first 8 bytes (a cryptographic hash already).
fn hash(id: &ObjectId) -> u64 {
    let mut head = [0u8; 8];
    head.copy_from_slice(&id.as_bytes()[..8]);
    u64::from_le_bytes(head)
}

/// An order-free digest of a set of ids (each once), to check at a drop that a checkpoint
/// names the objects it was registered with.
fn digest(ids: impl Iterator<Item = ObjectId>) -> u64 {
    ids.fold(0u64, |sum, id| sum.wrapping_add(hash(&id)))
}

impl Registry {
    /// A registry of no checkpoint and no object.
    pub fn new() -> Self {
        Self::default()
    }

    /// Recount from the retained checkpoints' object sets.
    pub fn from_checkpoints<I: IntoIterator<Item = ObjectId>>(
        checkpoints: impl IntoIterator<Item = (u64, I)>,
    ) -> Self {
        let mut registry = Registry::new();
        for (id, objects) in checkpoints {
            registry.register_checkpoint(id, objects);
        }
        registry
    }

    fn slot(&self, id: &ObjectId) -> Option<&Slot> {
        self.find(id).map(|s| &self.slots[s as usize])
    }

    fn find(&self, id: &ObjectId) -> Option<u32> {
        self.index
            .find(hash(id), |s| self.slots[*s as usize].id == *id)
            .copied()
    }

    /// The slots of every object the registry keeps alive.
    fn live_slots(&self) -> impl Iterator<Item = &Slot> + '_ {
        self.index.iter().map(|s| &self.slots[*s as usize])
    }

    /// The slot of `id`, allocated (with zero counts) if the object is not known.
    fn slot_of(&mut self, id: ObjectId) -> u32 {
        if let Some(slot) = self.find(&id) {
            return slot;
        }
        let fresh = Slot {
            id,
            count: 0,
            pins: 0,
            size: 0,
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = fresh;
                slot
            }
            None => {
                self.slots.push(fresh);
                u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 live objects")
            }
        };
        let slots = &self.slots;
        self.index
            .insert_unique(hash(&id), slot, |s| hash(&slots[*s as usize].id));
        slot
    }

    /// True while the object is referenced by a retained checkpoint or pinned by an
    /// in-flight one; only such objects may be re-referenced.
    pub fn is_live(&self, id: &ObjectId) -> bool {
        self.find(id).is_some()
    }

    /// How many objects are alive (referenced or pinned).
    pub fn live_count(&self) -> usize {
        self.index.len()
    }

    /// True if no object is alive (referenced or pinned): nothing can be shared.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// How many retained checkpoints reference `id` (0 for an unknown object).
    pub fn count(&self, id: &ObjectId) -> u32 {
        self.slot(id).map_or(0, |e| e.count)
    }

    /// How many pins in-flight checkpoints hold on `id` (0 for an unknown object).
    pub fn pins(&self, id: &ObjectId) -> u32 {
        self.slot(id).map_or(0, |e| e.pins)
    }

    /// Reference counts of every object referenced by a retained checkpoint.
    pub fn counts(&self) -> BTreeMap<ObjectId, u32> {
        self.live_slots()
            .filter(|e| e.count > 0)
            .map(|e| (e.id, e.count))
            .collect()
    }

    /// Record the sizes of known objects (for [`Registry::referenced_bytes`]).
    pub fn set_sizes(&mut self, sizes: impl IntoIterator<Item = (ObjectId, u64)>) {
        for (id, size) in sizes {
            if let Some(slot) = self.find(&id) {
                self.slots[slot as usize].size = size;
            }
        }
    }

    /// How many objects retained checkpoints reference.
    pub fn referenced_objects(&self) -> usize {
        self.live_slots().filter(|e| e.count > 0).count()
    }

    /// Bytes of the objects retained checkpoints reference (of those whose size is known).
    pub fn referenced_bytes(&self) -> u64 {
        self.live_slots()
            .filter(|e| e.count > 0)
            .map(|e| e.size)
            .sum()
    }

    /// Every object the registry keeps alive (referenced or pinned).
    pub fn live_objects(&self) -> BTreeSet<ObjectId> {
        self.live_slots().map(|e| e.id).collect()
    }

    /// The registered (retained) checkpoints, ascending.
    pub fn checkpoint_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.checkpoints.keys().copied()
    }

    /// An in-flight checkpoint holds `id` (it stored it, or matched an existing copy).
    pub fn pin(&mut self, id: ObjectId) {
        let slot = self.slot_of(id);
        self.slots[slot as usize].pins += 1;
    }

    /// Release a pin; returns the object if nothing keeps it alive any more.
    pub fn unpin(&mut self, id: &ObjectId) -> Option<ObjectId> {
        let slot = self.find(id)?;
        let entry = &mut self.slots[slot as usize];
        debug_assert!(entry.pins > 0, "unpin of an unpinned object");
        entry.pins = entry.pins.saturating_sub(1);
        self.collect_if_garbage(slot)
    }

    /// A checkpoint completed: +1 on each object it references (once per object, however
    /// many of its files share that content).
    pub fn register_checkpoint(
        &mut self,
        checkpoint: u64,
        objects: impl IntoIterator<Item = ObjectId>,
    ) {
        if self.checkpoints.contains_key(&checkpoint) {
            // Registering the same id twice would double count.
            log::error!("checkpoint {checkpoint} registered twice; kept the first");
            return;
        }
        let mut slots: Vec<u32> = objects.into_iter().map(|id| self.slot_of(id)).collect();
        slots.sort_unstable();
        slots.dedup();
        for slot in &slots {
            self.slots[*slot as usize].count += 1;
        }
        let registered = Registered {
            objects: u32::try_from(slots.len()).expect("fewer than 2^32 objects"),
            digest: digest(slots.iter().map(|s| self.slots[*s as usize].id)),
        };
        self.checkpoints.insert(checkpoint, registered);
    }

    /// A checkpoint is dropped: -1 on each of its objects (`objects`: what its manifest
    /// names, as at registration); returns those now unreferenced and unpinned, which the
    /// caller deletes from the store. `None` for an unknown checkpoint. Objects that do not
    /// match what was registered (a bug) are left alone: a leak that the next start's recount
    /// and sweep repair, never a delete of something still referenced.
    pub fn drop_checkpoint(
        &mut self,
        checkpoint: u64,
        objects: impl IntoIterator<Item = ObjectId>,
    ) -> Option<Vec<ObjectId>> {
        let registered = self.checkpoints.remove(&checkpoint)?;
        let mut slots: Vec<Option<u32>> = objects.into_iter().map(|id| self.find(&id)).collect();
        slots.sort_unstable();
        slots.dedup();
        let slots: Option<Vec<u32>> = slots.into_iter().collect();
        let matches = slots.as_ref().is_some_and(|slots| {
            Registered {
                objects: slots.len() as u32,
                digest: digest(slots.iter().map(|s| self.slots[*s as usize].id)),
            } == registered
        });
        if !matches {
            log::error!(
                "checkpoint {checkpoint} was dropped naming other objects than it was \
                 registered with; its objects are kept until the next start recounts"
            );
            return Some(Vec::new());
        }
        let mut garbage = Vec::new();
        for slot in slots.expect("matched") {
            let entry = &mut self.slots[slot as usize];
            entry.count = entry.count.saturating_sub(1);
            garbage.extend(self.collect_if_garbage(slot));
        }
        Some(garbage)
    }

    /// Checkpoints beyond the newest `retain`, oldest first (the tests' retention; the
    /// engine's is [`crate::policy`]).
    #[cfg(test)]
    fn retention_victims(&self, retain: usize) -> Vec<u64> {
        let excess = self.checkpoints.len().saturating_sub(retain.max(1));
        self.checkpoints.keys().take(excess).copied().collect()
    }

    fn collect_if_garbage(&mut self, slot: u32) -> Option<ObjectId> {
        let entry = &self.slots[slot as usize];
        if entry.count == 0 && entry.pins == 0 && self.find(&entry.id) == Some(slot) {
            let id = entry.id;
            if let Ok(found) = self.index.find_entry(hash(&id), |s| *s == slot) {
                found.remove();
            }
            self.free.push(slot);
            Some(id)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(name: &str) -> ObjectId {
        ObjectId::from_hash(blake3::hash(name.as_bytes()))
    }

    fn set(names: &[&str]) -> BTreeSet<ObjectId> {
        names.iter().map(|n| obj(n)).collect()
    }

    /// Complete a checkpoint the way the coordinator does: register, then retention (the
    /// manifests, `held`, name a dropped checkpoint's objects).
    fn complete(
        reg: &mut Registry,
        held: &mut BTreeMap<u64, BTreeSet<ObjectId>>,
        id: u64,
        names: &[&str],
        retain: usize,
    ) -> Vec<ObjectId> {
        reg.register_checkpoint(id, set(names));
        held.insert(id, set(names));
        let mut deleted = Vec::new();
        for victim in reg.retention_victims(retain) {
            let objects = held.remove(&victim).unwrap();
            deleted.extend(reg.drop_checkpoint(victim, objects).unwrap());
        }
        deleted.sort();
        deleted
    }

    fn counts_by_name(reg: &Registry, names: &[&str]) -> Vec<(String, u32)> {
        let mut out: Vec<(String, u32)> = names
            .iter()
            .filter(|n| reg.count(&obj(n)) > 0)
            .map(|n| (n.to_string(), reg.count(&obj(n))))
            .collect();
        out.sort();
        out
    }

    fn expect(pairs: &[(&str, u32)]) -> Vec<(String, u32)> {
        let mut out: Vec<(String, u32)> = pairs.iter().map(|(n, c)| (n.to_string(), *c)).collect();
        out.sort();
        out
    }

    /// BACKGROUND.md's worked example: retain = 2, one subtask of Operator-2.
    #[test]
    fn worked_example_of_the_design_document() {
        let all = ["s1", "s2", "s3", "s4", "s5", "s123", "s456"];
        let mut reg = Registry::new();
        let held = &mut BTreeMap::new();

        assert!(complete(&mut reg, held, 1, &["s1", "s2"], 2).is_empty());
        assert_eq!(counts_by_name(&reg, &all), expect(&[("s1", 1), ("s2", 1)]));

        assert!(complete(&mut reg, held, 2, &["s1", "s2", "s3", "s4"], 2).is_empty());
        assert_eq!(
            counts_by_name(&reg, &all),
            expect(&[("s1", 2), ("s2", 2), ("s3", 1), ("s4", 1)])
        );

        assert!(complete(&mut reg, held, 3, &["s123", "s4", "s5"], 2).is_empty());
        assert_eq!(
            counts_by_name(&reg, &all),
            expect(&[
                ("s1", 1),
                ("s2", 1),
                ("s3", 1),
                ("s4", 2),
                ("s123", 1),
                ("s5", 1)
            ])
        );
        assert_eq!(reg.checkpoint_ids().collect::<Vec<_>>(), vec![2, 3]);

        let deleted = complete(&mut reg, held, 4, &["s123", "s456"], 2);
        assert_eq!(deleted, {
            let mut d = vec![obj("s1"), obj("s2"), obj("s3")];
            d.sort();
            d
        });
        assert_eq!(
            counts_by_name(&reg, &all),
            expect(&[("s4", 1), ("s5", 1), ("s123", 2), ("s456", 1)])
        );
        assert_eq!(reg.checkpoint_ids().collect::<Vec<_>>(), vec![3, 4]);
        assert!(!reg.is_live(&obj("s1")));
        assert_eq!(reg.live_count(), 4);
        assert_eq!(reg.live_objects().len(), reg.live_count());
    }

    #[test]
    fn a_checkpoint_counts_an_object_once_even_if_two_files_share_it() {
        let mut reg = Registry::new();
        reg.register_checkpoint(1, set(&["x", "x", "y"]));
        assert_eq!(reg.count(&obj("x")), 1);
        assert_eq!(reg.drop_checkpoint(1, set(&["y", "x"])).unwrap().len(), 2);
    }

    #[test]
    fn dropping_an_unknown_checkpoint_changes_nothing() {
        let mut reg = Registry::new();
        reg.register_checkpoint(1, set(&["a"]));
        assert!(reg.drop_checkpoint(7, set(&["a"])).is_none());
        assert_eq!(reg.count(&obj("a")), 1);
    }

    #[test]
    fn pins_keep_objects_alive_until_released() {
        let mut reg = Registry::new();
        reg.pin(obj("a"));
        assert!(reg.is_live(&obj("a")));
        assert_eq!(reg.count(&obj("a")), 0);
        assert_eq!(reg.unpin(&obj("a")), Some(obj("a")));
        assert!(!reg.is_live(&obj("a")));
    }

    #[test]
    fn a_pinned_object_survives_the_drop_of_its_last_checkpoint() {
        let mut reg = Registry::new();
        reg.register_checkpoint(1, set(&["a", "b"]));
        // An in-flight checkpoint 2 matched "a" while checkpoint 1 was retained.
        reg.pin(obj("a"));
        let garbage = reg.drop_checkpoint(1, set(&["a", "b"])).unwrap();
        assert_eq!(garbage, vec![obj("b")]);
        assert!(reg.is_live(&obj("a")));
        // Checkpoint 2 completes: registers, then releases its pin.
        reg.register_checkpoint(2, set(&["a"]));
        assert_eq!(reg.unpin(&obj("a")), None);
        assert_eq!(reg.count(&obj("a")), 1);
    }

    /// Two in-flight checkpoints stored the same content: the first to publish owns the
    /// object, the second finds it live, pins it and discards its copy. Whichever is
    /// confirmed first, the object survives as long as either needs it.
    #[test]
    fn concurrent_duplicate_uploads_resolve_to_one_object() {
        let mut reg = Registry::new();
        let x = obj("x");
        // checkpoint 5 publishes x
        assert!(!reg.is_live(&x));
        reg.pin(x);
        // checkpoint 6 staged the same bytes: it finds x live, discards its copy, pins x
        assert!(reg.is_live(&x));
        reg.pin(x);
        assert_eq!(reg.pins(&x), 2);
        // 6 is confirmed first
        reg.register_checkpoint(6, set(&["x"]));
        assert_eq!(reg.unpin(&x), None);
        // 5 aborts: releases its pin, x stays (6 references it)
        assert_eq!(reg.unpin(&x), None);
        assert_eq!(reg.count(&x), 1);
        assert_eq!(reg.pins(&x), 0);
        // dropping 6 makes it garbage
        assert_eq!(reg.drop_checkpoint(6, set(&["x"])).unwrap(), vec![x]);
    }

    #[test]
    fn an_aborted_checkpoint_leaves_its_uploads_as_garbage() {
        let mut reg = Registry::new();
        reg.pin(obj("new"));
        reg.pin(obj("old"));
        reg.register_checkpoint(1, set(&["old"]));
        assert_eq!(reg.unpin(&obj("new")), Some(obj("new")));
        assert_eq!(reg.unpin(&obj("old")), None);
    }

    #[test]
    fn retention_keeps_the_newest_and_never_less_than_one() {
        let mut reg = Registry::new();
        for id in [3, 1, 2, 7] {
            reg.register_checkpoint(id, set(&[&id.to_string()]));
        }
        assert_eq!(reg.retention_victims(2), vec![1, 2]);
        assert_eq!(reg.retention_victims(0), vec![1, 2, 3]);
        assert!(reg.retention_victims(10).is_empty());
    }

    #[test]
    fn recount_equals_incremental_counts() {
        let mut reg = Registry::new();
        let held = &mut BTreeMap::new();
        complete(&mut reg, held, 1, &["a", "b"], 3);
        complete(&mut reg, held, 2, &["b", "c"], 3);
        complete(&mut reg, held, 3, &["c", "d"], 3);
        complete(&mut reg, held, 4, &["d", "a"], 3);
        let recount = Registry::from_checkpoints(held.clone());
        assert_eq!(recount.counts(), reg.counts());
        assert_eq!(
            recount.checkpoint_ids().collect::<Vec<_>>(),
            reg.checkpoint_ids().collect::<Vec<_>>()
        );
    }

    /// A drop that names other objects than the registration (a bug) deletes nothing, and
    /// a second registration of an id changes no count.
    #[test]
    fn a_drop_naming_other_objects_deletes_nothing() {
        let mut reg = Registry::new();
        reg.register_checkpoint(1, set(&["a", "b"]));
        reg.register_checkpoint(1, set(&["c"]));
        assert_eq!(reg.count(&obj("a")), 1);
        assert!(!reg.is_live(&obj("c")) || reg.count(&obj("c")) == 0);
        for wrong in [set(&["a"]), set(&["a", "c"]), set(&["a", "b", "c"])] {
            let mut copy = reg.clone();
            assert_eq!(copy.drop_checkpoint(1, wrong), Some(vec![]));
            assert!(copy.is_live(&obj("a")) && copy.is_live(&obj("b")));
            assert_eq!(copy.checkpoint_ids().count(), 0);
        }
        let mut garbage = reg.drop_checkpoint(1, set(&["b", "a"])).unwrap();
        garbage.sort();
        assert_eq!(garbage, set(&["a", "b"]).into_iter().collect::<Vec<_>>());
    }
}
