//! Retention: what keeps a checkpoint (the store's policy, pins and leases, an unfinished
//! restore's target) and what drops it, and deleting the objects nothing references any
//! more (after a drop, a released pin, or as orphans of failed uploads).

use std::collections::{BTreeMap, HashMap};

use super::{CatalogWrites, Engine, State};
use crate::catalog::StoreMeta;
use crate::error::{Error, Result};
use crate::policy::{Candidate, Decision, Policy};
use crate::store::ObjectId;

impl Engine {
    /// Drop a retained checkpoint: its manifest goes, then every object no other retained
    /// checkpoint references.
    pub fn delete_checkpoint(&self, id: u64) -> Result<()> {
        self.check_writable()?;
        let writes = self.catalog_writes();
        let st = self.state();
        st.flight.check_droppable(id)?;
        st.held.retained(id)?;
        if self.restore_pending() == Some(id) {
            return Err(Error::Busy(format!(
                "checkpoint {id} is the target of an unfinished restore; it is kept until \
                 a restart finishes the restore"
            )));
        }
        check_unpinned(&st.meta, id, crate::fsutil::now_unix_ms())?;
        drop(st);
        self.drop_checkpoint(&writes, id)
    }

    /// The checkpoint an unfinished restore (a failed swap) still needs, if any.
    fn restore_pending(&self) -> Option<u64> {
        super::restore::read_restore_intent(&self.inner.state_dir)
            .ok()
            .flatten()
    }

    /// Keep the newest `retain` checkpoints (at least 1) and nothing by time: the policy
    /// `--keep-last N` ([`Engine::set_policy`]); applied at once.
    pub fn set_retain(&self, retain: u32) -> Result<()> {
        self.set_policy(Policy::last(retain)).map(|_| ())
    }

    /// Replace the store's retention policy (every rule: one not given is off) and apply
    /// it at once; returns what it decided for each checkpoint, newest first.
    pub fn set_policy(&self, policy: Policy) -> Result<Vec<Decision>> {
        self.check_writable()?;
        let policy = policy.validate()?;
        let writes = self.catalog_writes();
        self.change_meta(|meta| {
            meta.retain = policy.last;
            meta.keep = policy.by_time.clone();
            Ok(())
        })?;
        self.apply_policy(&writes)
    }

    /// What `policy` (the store's own when `None`) decides for each retained checkpoint,
    /// newest first: which rules keep it, or that it would be dropped. Changes nothing.
    pub fn forget_plan(&self, policy: Option<&Policy>) -> Vec<Decision> {
        let pending = self.restore_pending();
        let st = self.state();
        let own = st.meta.policy();
        let mut pins: HashMap<u64, Vec<String>> = HashMap::new();
        for (name, id) in &st.meta.pins {
            pins.entry(*id).or_default().push(name.clone());
        }
        let candidates: Vec<Candidate> = st
            .held
            .manifests
            .values()
            .map(|m| Candidate {
                id: m.id,
                time_ms: m.time_ms(),
                pins: pins.remove(&m.id).unwrap_or_default(),
                restore: pending == Some(m.id),
            })
            .collect();
        crate::policy::apply(policy.unwrap_or(&own), &candidates)
    }

    /// Pin checkpoint `id` as `name`: no policy drops it and `delete` refuses it until it
    /// is unpinned. A name already pinned moves to `id`.
    pub fn pin(&self, id: u64, name: &str) -> Result<()> {
        self.check_writable()?;
        crate::catalog::meta::valid_pin_name(name)?;
        let writes = self.catalog_writes();
        self.state().held.retained(id)?;
        self.change_meta(|meta| {
            check_pin_room(meta, name)?;
            meta.pins.insert(name.to_string(), id);
            // A pin made by hand does not expire, even under a lease's name.
            meta.pin_expires.remove(name);
            Ok(())
        })?;
        // A pin that moved leaves its old checkpoint to the policy.
        self.apply_retention(&writes)
    }

    /// Hold checkpoint `id` with a lease named `name` until `expires_unix_ms` (a pin that
    /// expires, see [`StoreMeta::pin_expires`]): taken, or moved later, but only where
    /// that moves it by more than `slack_ms` (a refresh writes the metadata at most that
    /// often). A pin of that name that does not expire (made by hand) is left as it is,
    /// and so is a lease on another checkpoint. Returns whether the metadata changed.
    pub fn lease(&self, id: u64, name: &str, expires_unix_ms: u64, slack_ms: u64) -> Result<bool> {
        let due = |meta: &StoreMeta| match meta.pins.get(name) {
            None => true,
            Some(on) => {
                *on == id
                    && meta
                        .pin_expires
                        .get(name)
                        .is_some_and(|at| at.saturating_add(slack_ms) < expires_unix_ms)
            }
        };
        if !due(&self.state().meta) {
            return Ok(false);
        }
        self.check_writable()?;
        crate::catalog::meta::valid_pin_name(name)?;
        let _writes = self.catalog_writes();
        self.state().held.retained(id)?;
        let mut changed = false;
        self.change_meta(|meta| {
            if !due(meta) {
                return Ok(());
            }
            check_pin_room(meta, name)?;
            meta.pins.insert(name.to_string(), id);
            meta.pin_expires.insert(name.to_string(), expires_unix_ms);
            changed = true;
            Ok(())
        })?;
        Ok(changed)
    }

    /// Remove the pins whose expiry ([`StoreMeta::pin_expires`]) is at or before
    /// `now_unix_ms`, and apply the policy to what they held; returns their names and
    /// checkpoints.
    pub fn expire_pins(&self, now_unix_ms: u64) -> Result<Vec<(String, u64)>> {
        let expired = |meta: &StoreMeta| -> Vec<(String, u64)> {
            meta.pin_expires
                .iter()
                .filter(|(_, at)| **at <= now_unix_ms)
                .filter_map(|(name, _)| meta.pins.get(name).map(|id| (name.clone(), *id)))
                .collect()
        };
        if expired(&self.state().meta).is_empty() || self.is_read_only() {
            return Ok(Vec::new());
        }
        let writes = self.catalog_writes();
        let mut gone = Vec::new();
        self.change_meta(|meta| {
            gone = expired(meta);
            for (name, _) in &gone {
                meta.pins.remove(name);
                meta.pin_expires.remove(name);
            }
            Ok(())
        })?;
        self.apply_retention(&writes)?;
        Ok(gone)
    }

    /// When each pin that expires does, in milliseconds since the Unix epoch.
    pub fn pin_expires(&self) -> BTreeMap<String, u64> {
        self.state().meta.pin_expires.clone()
    }

    /// Remove the pin `name`; returns the checkpoint it was on. The checkpoint is then
    /// left to the policy, which applies at once.
    pub fn unpin(&self, name: &str) -> Result<u64> {
        self.check_writable()?;
        let writes = self.catalog_writes();
        let mut was = 0;
        self.change_meta(|meta| {
            was = meta
                .pins
                .remove(name)
                .ok_or_else(|| Error::NotFound(format!("no pin named {name:?}")))?;
            meta.pin_expires.remove(name);
            Ok(())
        })?;
        self.apply_retention(&writes)?;
        Ok(was)
    }

    /// The pins: name -> checkpoint.
    pub fn pins(&self) -> BTreeMap<String, u64> {
        self.state().meta.pins.clone()
    }

    /// The checkpoint pinned as `name`, if any.
    pub fn pinned(&self, name: &str) -> Option<u64> {
        self.state().meta.pins.get(name).copied()
    }

    /// Drop the checkpoints the store's policy does not keep (never a pinned one, nor the
    /// target of an unfinished restore).
    pub(super) fn apply_retention(&self, writes: &CatalogWrites<'_>) -> Result<()> {
        // No more checkpoints than the newest `last`: every one is kept, whatever the
        // other rules and the times say (the check after most commits, with no plan made).
        {
            let st = self.state();
            if st.held.manifests.len() <= st.meta.retain as usize {
                return Ok(());
            }
        }
        self.apply_policy(writes).map(|_| ())
    }

    /// [`Engine::apply_retention`], returning the decisions it carried out.
    fn apply_policy(&self, writes: &CatalogWrites<'_>) -> Result<Vec<Decision>> {
        let plan = self.forget_plan(None);
        if self.inner.read_only {
            return Ok(plan);
        }
        let mut victims: Vec<u64> = plan.iter().filter(|d| !d.kept()).map(|d| d.id).collect();
        victims.sort_unstable();
        for victim in victims {
            self.drop_checkpoint(writes, victim)?;
            crate::failpoint!("retention::between-drops");
        }
        Ok(plan)
    }

    /// Drop a checkpoint: commit the drop in the catalog, then forget its references and
    /// delete what nothing else references.
    fn drop_checkpoint(&self, _writes: &CatalogWrites<'_>, id: u64) -> Result<()> {
        // A checkpoint imported from Flink is remembered as dropped: never imported again.
        let flink = self
            .state()
            .held
            .manifests
            .get(&id)
            .and_then(|m| m.flink.clone());
        if self.inner.catalog.commits_in_meta() {
            // Object storage: the drop commits as a conditional write of the metadata that
            // voids the id (a writer that lost the store cannot make it); the manifest goes
            // after, and is void even if that fails.
            let mut meta = {
                let st = self.state();
                let mut meta = st.meta.clone();
                meta.make_void(id);
                meta.compact_void(
                    st.held
                        .manifests
                        .keys()
                        .copied()
                        .chain(st.flight.ids())
                        .filter(|m| *m != id),
                );
                meta
            };
            if let Some(label) = &flink {
                meta.record_flink_drop(label);
            }
            self.inner.catalog.save_meta(&meta)?;
            self.state().meta = meta;
            if let Err(e) = self.inner.catalog.remove(id) {
                log::warn!("checkpoint {id} is dropped; its void manifest remains: {e}");
            }
        } else {
            if let Some(label) = &flink {
                // Recorded first: a crash before the manifest goes leaves the checkpoint
                // held, and held wins.
                let mut meta = self.state().meta.clone();
                meta.record_flink_drop(label);
                self.inner.catalog.save_meta(&meta)?;
                self.state().meta = meta;
            }
            self.inner.catalog.remove(id)?;
        }
        crate::failpoint!("drop::after-manifest-removed");
        let mut st = self.state();
        let manifest = st.held.manifests.remove(&id);
        let garbage = st
            .held
            .registry
            .drop_checkpoint(id, manifest.iter().flat_map(|m| m.object_refs()))
            .unwrap_or_default();
        self.delete_objects(&st, &garbage);
        log::info!("dropped checkpoint {id}; deleted {} objects", garbage.len());
        Ok(())
    }

    /// Release pins (of a checkpoint, a restore, a prepared materialization); delete what
    /// nothing keeps alive any more.
    pub(super) fn release_pins(&self, st: &mut State, pins: impl IntoIterator<Item = ObjectId>) {
        let mut garbage = Vec::new();
        for pin in pins {
            garbage.extend(st.held.registry.unpin(&pin));
        }
        self.delete_objects(st, &garbage);
    }

    /// Delete unreferenced objects older than the grace period (on object storage, where
    /// an upload can land for a checkpoint that then fails); returns how many. Objects
    /// that are live, pinned by an in-flight checkpoint, kept for recovery, or still being
    /// uploaded are never touched.
    pub fn sweep_orphans(&self) -> Result<usize> {
        if self.inner.deletes_frozen {
            return Ok(0);
        }
        self.inner.catalog.check_writer()?;
        let grace = self.inner.orphan_grace;
        // Listed without the lock (a long listing must not stall checkpoints); each
        // candidate is judged under it.
        let old: Vec<ObjectId> = self
            .inner
            .store
            .list_modified()?
            .into_iter()
            // Objects without a time were published under the writer's lock (a local
            // store): never orphans of an upload in flight, left to the start's sweep.
            .filter(|(_, modified)| modified.is_some() && !crate::store::is_young(*modified, grace))
            .map(|(id, _)| id)
            .collect();
        let mut deleted = 0;
        for id in old {
            let st = self.state();
            if !st.held.is_orphan(&id) {
                continue;
            }
            self.inner.store.delete(&id)?;
            deleted += 1;
        }
        Ok(deleted)
    }

    /// Delete objects the registry declared garbage. Called with the state lock held, so no
    /// checkpoint can match or publish the same object meanwhile. A failed delete leaves an
    /// orphan that the next start (or `fsck --repair`) removes.
    fn delete_objects(&self, st: &State, garbage: &[ObjectId]) {
        if self.inner.read_only || garbage.is_empty() {
            return;
        }
        // A daemon that lost the store to another writer deletes nothing: that writer may
        // reference the same content (objects are shared by content) in its checkpoints.
        if let Err(e) = self.inner.catalog.check_writer() {
            log::warn!("keeping {} unreferenced objects: {e}", garbage.len());
            return;
        }
        if self.inner.deletes_frozen && !garbage.is_empty() {
            log::warn!(
                "keeping {} unreferenced objects: deletions are frozen while a manifest is \
                 unreadable or quarantined",
                garbage.len()
            );
            return;
        }
        let ids = st.held.deletable(garbage);
        let failed = self.inner.store.delete_many(&ids);
        for (id, e) in &failed {
            log::warn!("could not delete object {id}: {e}");
        }
        log::info!("deleted {} objects", ids.len() - failed.len());
    }
}

/// Refuse a new pin `name` when the store holds the most pins it keeps (EINVAL); moving a
/// pin that exists is always allowed.
fn check_pin_room(meta: &StoreMeta, name: &str) -> Result<()> {
    let max = crate::catalog::meta::MAX_PINS;
    if meta.pins.len() >= max && !meta.pins.contains_key(name) {
        return Err(Error::Invalid(format!(
            "the store holds {max} pins, the most it keeps: unpin one first"
        )));
    }
    Ok(())
}

/// Refuse to drop checkpoint `id` while a pin holds it (EBUSY), naming each pin, and when a
/// lease among them expires (from `now_unix_ms`).
fn check_unpinned(meta: &StoreMeta, id: u64, now_unix_ms: u64) -> Result<()> {
    let pins = meta.pins_of(id);
    if pins.is_empty() {
        return Ok(());
    }
    let named: Vec<String> = pins
        .iter()
        .map(|name| match meta.pin_expires.get(name) {
            Some(at) => format!(
                "{name} (a lease that expires in {}s)",
                at.saturating_sub(now_unix_ms).div_ceil(1000)
            ),
            None => name.clone(),
        })
        .collect();
    Err(Error::Busy(format!(
        "checkpoint {id} is pinned as {}: unpin it first (ckptfs unpin)",
        named.join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn a_pinned_checkpoint_is_not_dropped_and_the_refusal_names_its_pins() {
        let mut meta = StoreMeta::default();
        check_unpinned(&meta, 4, 0).unwrap();
        meta.pins.insert("release".into(), 4);
        meta.pins.insert("restore-cp-1".into(), 4);
        meta.pins.insert("other".into(), 5);
        meta.pin_expires.insert("restore-cp-1".into(), 10_500);
        let e = check_unpinned(&meta, 4, 1_000).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Busy);
        let e = e.to_string();
        assert!(e.contains("release"), "{e}");
        assert!(
            e.contains("restore-cp-1 (a lease that expires in 10s)"),
            "{e}"
        );
        assert!(!e.contains("other"), "{e}");
        let e = check_unpinned(&meta, 5, 1_000).unwrap_err().to_string();
        assert!(e.contains("checkpoint 5 is pinned as other:"), "{e}");
        check_unpinned(&meta, 6, 1_000).unwrap();
    }

    #[test]
    fn a_full_store_refuses_a_new_pin_and_moves_an_old_one() {
        let mut meta = StoreMeta::default();
        for n in 0..crate::catalog::meta::MAX_PINS {
            check_pin_room(&meta, &format!("p{n}")).unwrap();
            meta.pins.insert(format!("p{n}"), n as u64);
        }
        let e = check_pin_room(&meta, "one-more").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Invalid);
        assert!(e.to_string().contains("unpin one first"), "{e}");
        check_pin_room(&meta, "p0").unwrap();
    }
}
