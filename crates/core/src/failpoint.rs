//! Failpoints for the fault campaign: named steps of a checkpoint, a drop, a restore and
//! recovery where the test harness (`tests/integration/torture.rs`) can make the process die.
//!
//! Compiled in only with the cargo feature `failpoints`; without it [`failpoint!`] expands
//! to nothing. With it, the `FAILPOINTS` environment variable configures them in the
//! syntax of the `fail` crate, e.g. `FAILPOINTS='store::after-publish=2*off->return'`:
//! the third time that step is reached, the process kills itself with SIGKILL, exactly as
//! `kill -9` would, leaving whatever is on disk at that instant.

/// Mark a step where the fault campaign may kill the process.
#[macro_export]
macro_rules! failpoint {
    ($name:literal) => {
        #[cfg(feature = "failpoints")]
        $crate::failpoint::reached($name);
    };
}

/// Every failpoint in the code, for the harness to iterate over.
pub const ALL: &[&str] = &[
    "checkpoint::after-sync",
    "store::staged-before-fsync",
    "store::before-publish",
    "store::after-publish",
    "fsutil::before-rename",
    "fsutil::after-rename",
    "checkpoint::before-commit",
    "checkpoint::after-commit",
    "checkpoint::after-register",
    "retention::between-drops",
    "drop::after-manifest-removed",
    "drop::mid-delete",
    "restore::after-prepare",
    "restore::mid-swap",
    "restore::after-swap",
    "open::before-sweep",
    "open::mid-sweep",
];

/// Called at a failpoint: dies if it is configured to (action `return`); other actions of
/// the `fail` crate (`sleep`, `pause`, `panic`, `print`) work as documented there.
#[cfg(feature = "failpoints")]
pub fn reached(name: &str) {
    if fail::eval(name, |_| ()).is_some() {
        eprintln!("ckptfs: failpoint {name}: killing the process");
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        // SIGKILL cannot be caught; should raise fail, stop anyway without cleanup.
        std::process::abort();
    }
}

/// Read `FAILPOINTS` from the environment; the returned guard keeps them configured.
#[cfg(feature = "failpoints")]
pub fn setup() -> fail::FailScenario<'static> {
    fail::FailScenario::setup()
}
