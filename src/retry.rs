//! Waiting out a busy daemon or engine: the one backoff used wherever an EBUSY answer (every
//! checkpoint slot taken, a restore running) is tried again until a deadline, by the
//! command line client and by the daemon's `import-flink`.

use std::time::{Duration, Instant};

use ckptfs_core::error::{Error, Result};

/// The first pause; each later one doubles, up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(20);
const MAX_PAUSE: Duration = Duration::from_millis(500);

/// Pauses between tries, growing, until a deadline.
pub struct Backoff {
    deadline: Instant,
    pause: Duration,
}

impl Backoff {
    /// Tries for `wait` from now.
    pub fn new(wait: Duration) -> Self {
        Backoff {
            deadline: Instant::now() + wait,
            pause: FIRST_PAUSE,
        }
    }

    /// True while a try after the next pause would start before the deadline.
    pub fn has_time(&self) -> bool {
        Instant::now() + self.pause < self.deadline
    }

    /// Sleep before the next try: false, at once, when that try would start after the
    /// deadline.
    pub fn pause(&mut self) -> bool {
        if !self.has_time() {
            return false;
        }
        std::thread::sleep(self.pause);
        self.pause = (self.pause * 2).min(MAX_PAUSE);
        true
    }
}

/// The refusal that a later try may not meet: something in progress excludes this request
/// ([`ckptfs_core::ErrorKind::is_temporary`]; a store locked by another process is not: its holder must
/// let go first).
pub fn is_busy(error: &Error) -> bool {
    error.kind().is_temporary()
}

/// `attempt` until it succeeds, fails otherwise than [`is_busy`], or `wait` has passed.
pub fn while_busy<T>(wait: Duration, mut attempt: impl FnMut() -> Result<T>) -> Result<T> {
    let mut backoff = Backoff::new(wait);
    loop {
        match attempt() {
            Err(e) if is_busy(&e) && backoff.pause() => {}
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_is_tried_again_until_the_deadline_and_nothing_else_is() {
        let mut tries = 0;
        let busy: Result<()> = while_busy(Duration::from_millis(200), || {
            tries += 1;
            Err(Error::Busy("a slot is taken".into()))
        });
        assert!(is_busy(&busy.unwrap_err()));
        assert!(tries > 2, "{tries} tries");
        let mut tries = 0;
        let invalid: Result<()> = while_busy(Duration::from_secs(5), || {
            tries += 1;
            Err(Error::Invalid("no".into()))
        });
        assert!(invalid.is_err());
        assert_eq!(tries, 1);
        let mut tries = 0;
        let done = while_busy(Duration::from_secs(5), || {
            tries += 1;
            if tries < 3 {
                Err(Error::Daemon {
                    errno: libc::EBUSY,
                    kind: Some(ckptfs_core::ErrorKind::Busy),
                    message: "busy".into(),
                })
            } else {
                Ok(tries)
            }
        });
        assert_eq!(done.unwrap(), 3);
    }
}
