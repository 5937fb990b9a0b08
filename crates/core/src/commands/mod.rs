//! The offline commands: each works on a store directly, without a daemon (a store no
//! daemon holds, or one read while a daemon writes it), one file each: [`restore`] writes a
//! checkpoint out, [`fsck`] checks and repairs a store, [`graph`] draws its checkpoints and
//! objects, [`du`] counts what each checkpoint holds and shares ([`history`]: per operator
//! and state over the checkpoints), [`diff`] what changed between two, [`export_flink`] gives
//! a checkpoint imported from Flink back to Flink.

pub mod diff;
pub mod du;
pub mod export_flink;
pub mod fsck;
pub mod graph;
pub mod history;
pub mod restore;
