//! The control file's stream: lines written (possibly split across writes) run in order,
//! one JSON answer line per command; readers park until their answer is ready; unread
//! answers are bounded.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::seam::{Checkpoints, ControlLines};
use crate::control::protocol::{self, answer_line, Failure};
use crate::control::{self};
use ckptfs_core::error::{Error, Result};
use ckptfs_core::fsutil::lock;

/// Longest control line accepted (a put of a large value fits; a stray binary stream not).
pub const MAX_LINE: usize = 4 << 20;

/// Most answers a control handle keeps unread. A handle opened write-only keeps none (no
/// one can read them); a reading handle that falls this far behind gets ENOBUFS on write
/// until it reads, so a producer that never reads cannot grow the daemon without bound.
pub const MAX_UNREAD_ANSWERS: usize = 65_536;

/// One open control handle: the text of a line not finished yet, and the answers in
/// command order.
#[derive(Default)]
pub(super) struct ControlStream {
    pub(super) state: Mutex<ControlState>,
    /// Opened write-only: answers are not kept.
    discard_answers: bool,
    /// Directories staged by `import` lines for this handle's next `checkpoint`.
    imports: Mutex<control::StagedImports>,
}

/// A reader parked until the next answer is ready.
pub type ReadCallback = Box<dyn FnOnce(Result<Vec<u8>>) + Send>;

#[derive(Default)]
pub(super) struct ControlState {
    /// Answer slots; `None` until the command has finished.
    pub(super) slots: VecDeque<Option<String>>,
    /// Slot index of the front of `slots` (answers already read are popped).
    pub(super) base: usize,
    /// Unread remainder of a line a reader only took part of.
    pub(super) partial: Vec<u8>,
    /// Written text after the last newline: the start of a line the next write completes.
    pub(super) unfinished: Vec<u8>,
    pub(super) waiting: VecDeque<(u32, ReadCallback)>,
}

impl ControlState {
    /// One answer line per read: what `head -n1` expects. `None` if the next one is not
    /// ready yet; an empty vector at the end of the stream.
    pub(super) fn take(&mut self, size: u32) -> Option<Vec<u8>> {
        if self.partial.is_empty() {
            match self.slots.front() {
                None => return Some(Vec::new()),
                Some(None) => return None,
                Some(Some(_)) => {
                    let line = self.slots.pop_front().flatten().unwrap_or_default();
                    self.base += 1;
                    self.partial = line.into_bytes();
                    self.partial.push(b'\n');
                }
            }
        }
        let n = (size as usize).min(self.partial.len());
        Some(self.partial.drain(..n).collect())
    }

    /// Wake the parked readers that can now be answered.
    pub(super) fn deliverable(&mut self) -> Vec<(ReadCallback, Vec<u8>)> {
        let mut out = Vec::new();
        while let Some((size, _)) = self.waiting.front() {
            match self.take(*size) {
                Some(data) => {
                    let (_, callback) = self.waiting.pop_front().expect("front exists");
                    out.push((callback, data));
                }
                None => break,
            }
        }
        out
    }
}

impl ControlStream {
    /// The stream of a handle just opened; `discard_answers` if nobody can read them (the
    /// handle was opened write-only).
    pub(super) fn new(discard_answers: bool) -> Self {
        ControlStream {
            discard_answers,
            ..ControlStream::default()
        }
    }

    fn push_answers(&self, answers: Vec<Option<String>>) {
        if self.discard_answers {
            return;
        }
        let ready = {
            let mut st = lock(&self.state);
            st.slots.extend(answers);
            st.deliverable()
        };
        for (callback, data) in ready {
            callback(Ok(data));
        }
    }

    /// Write control commands. Lines run when complete: text after the last newline waits
    /// for the next write (or the close), so a line split across writes runs once, whole.
    /// The complete lines of a write are parsed and validated first: one bad line fails the
    /// write with EINVAL, nothing runs, and the error is the handle's next answer.
    pub(super) fn write(
        self: &Arc<Self>,
        control: &dyn ControlLines,
        checkpoints: &Arc<dyn Checkpoints>,
        data: &[u8],
    ) -> Result<usize> {
        // `carried`: how much of `complete` earlier writes handed over.
        let (complete, carried) = {
            let mut st = lock(&self.state);
            // Only the new bytes can hold the last newline: no rescans of old text.
            match data.iter().rposition(|b| *b == b'\n') {
                Some(end) => {
                    let mut text = std::mem::take(&mut st.unfinished);
                    let carried = text.len();
                    text.extend_from_slice(&data[..=end]);
                    st.unfinished = data[end + 1..].to_vec();
                    (text, carried)
                }
                None => {
                    st.unfinished.extend_from_slice(data);
                    (Vec::new(), 0)
                }
            }
        };
        if lock(&self.state).unfinished.len() > MAX_LINE {
            lock(&self.state).unfinished.clear();
            let e = Error::Invalid(format!(
                "a control line is longer than {MAX_LINE} bytes; nothing of it runs"
            ));
            checkpoints.record_error(e.to_string());
            self.push_answers(vec![Some(answer_line(&Err(Failure::of(&e))))]);
            return Err(e);
        }
        if !complete.is_empty() {
            if let Err(e) = self.run_lines(control, checkpoints, &complete) {
                // ENOBUFS asks for a retry of the same write: what earlier writes carried
                // over stays pending. Any other refusal judged the line that carried text
                // belongs to: it is dropped with it (else every later line would be glued
                // to a line that can never parse).
                lock(&self.state).unfinished = if e.errno() == libc::ENOBUFS {
                    complete[..carried].to_vec()
                } else {
                    Vec::new()
                };
                return Err(e);
            }
        }
        Ok(data.len())
    }

    /// Parse, validate and run complete lines.
    fn run_lines(
        self: &Arc<Self>,
        control: &dyn ControlLines,
        checkpoints: &Arc<dyn Checkpoints>,
        text: &[u8],
    ) -> Result<()> {
        let commands = crate::control::checked_commands(
            text,
            |c| control.validate(c),
            |e| checkpoints.record_error(e),
        );
        let commands = match commands {
            Ok(c) => c,
            Err(e) => {
                self.push_answers(vec![Some(answer_line(&Err(Failure::of(&e))))]);
                // The write as a whole is refused (EINVAL); its answer says the rule's
                // errno and kind.
                return Err(Error::Invalid(e.to_string()));
            }
        };
        let first = self.reserve(commands.len())?;
        if self.discard_answers {
            // Nobody reads these answers: a command refused later (a busy checkpoint, a
            // failed write) must at least show in status.
            let checkpoints = checkpoints.clone();
            control.execute(
                commands,
                Arc::new(move |_, answer: protocol::Answer| {
                    if let Err(failure) = answer {
                        checkpoints
                            .record_error(format!("control command refused: {}", failure.error));
                    }
                }),
                &self.imports,
            );
            return Ok(());
        }
        let weak = Arc::downgrade(self);
        let answer: control::AnswerSink = Arc::new(move |index, answer| {
            if let Some(stream) = weak.upgrade() {
                let ready = {
                    let mut st = lock(&stream.state);
                    if let Some(slot) = (first + index)
                        .checked_sub(st.base)
                        .and_then(|i| st.slots.get_mut(i))
                    {
                        *slot = Some(answer_line(&answer));
                    }
                    st.deliverable()
                };
                for (callback, data) in ready {
                    callback(Ok(data));
                }
            }
        });
        control.execute(commands, answer, &self.imports);
        Ok(())
    }

    /// Room for the answers of `n` commands: the slot index of the first (ENOBUFS if the
    /// handle would hold too many unread).
    fn reserve(&self, n: usize) -> Result<usize> {
        let mut st = lock(&self.state);
        if !self.discard_answers && st.slots.len() + n > MAX_UNREAD_ANSWERS {
            return Err(Error::io(
                format!(
                    "this handle holds {} unread answers (at most {MAX_UNREAD_ANSWERS}); \
                     read them before writing more",
                    st.slots.len()
                ),
                std::io::Error::from_raw_os_error(libc::ENOBUFS),
            ));
        }
        let first = st.base + st.slots.len();
        if !self.discard_answers {
            st.slots.extend(std::iter::repeat_n(None, n));
        }
        Ok(first)
    }

    /// Read the next answer: `reply` is called now, or once the answer is ready.
    pub(super) fn read(&self, size: u32, reply: ReadCallback) {
        let mut st = lock(&self.state);
        match st.take(size) {
            Some(data) => {
                drop(st);
                reply(Ok(data));
            }
            None => st.waiting.push_back((size, reply)),
        }
    }

    /// The handle is closed: a last line without a newline (`echo -n checkpoint > ctl`)
    /// runs now, and readers still parked (another thread of the process) get end-of-file.
    pub(super) fn close(
        self: &Arc<Self>,
        control: &dyn ControlLines,
        checkpoints: &Arc<dyn Checkpoints>,
    ) {
        let rest = std::mem::take(&mut lock(&self.state).unfinished);
        if !rest.is_empty() {
            let _ = self.run_lines(control, checkpoints, &rest);
        }
        let waiting: Vec<_> = lock(&self.state).waiting.drain(..).collect();
        for (_, callback) in waiting {
            callback(Ok(Vec::new()));
        }
    }
}
