//! The control file's stream: lines written (possibly split across writes) run in order,
//! one JSON answer line per command; readers park until their answer is ready; unread
//! answers are bounded.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::{CkptFs, MAX_LINE, MAX_UNREAD_ANSWERS};
use crate::control::protocol::{self, answer_line, Failure};
use crate::control::{self};
use ckptfs_core::error::{Error, Result};
use ckptfs_core::fsutil::lock;

/// Answers of one open control handle, in command order.
#[derive(Default)]
pub(super) struct ControlStream {
    pub(super) state: Mutex<ControlState>,
    /// Opened write-only: answers are not kept.
    pub(super) discard_answers: bool,
    /// Directories staged by `import` lines for this handle's next `checkpoint`.
    pub(super) imports: Mutex<control::StagedImports>,
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

pub(super) fn push_answers(stream: &Arc<ControlStream>, answers: Vec<Option<String>>) {
    if stream.discard_answers {
        return;
    }
    let ready = {
        let mut st = lock(&stream.state);
        st.slots.extend(answers);
        st.deliverable()
    };
    for (callback, data) in ready {
        callback(Ok(data));
    }
}

impl CkptFs {
    /// Write control commands. Lines run when complete: text after the last newline waits
    /// for the next write (or the close), so a line split across writes runs once, whole.
    /// The complete lines of a write are parsed and validated first: one bad line fails the
    /// write with EINVAL, nothing runs, and the error is the handle's next answer.
    pub fn write(&self, fh: u64, data: &[u8]) -> Result<usize> {
        let stream = self.control_stream(fh)?;
        // `carried`: how much of `complete` earlier writes handed over.
        let (complete, carried) = {
            let mut st = lock(&stream.state);
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
        if lock(&stream.state).unfinished.len() > MAX_LINE {
            lock(&stream.state).unfinished.clear();
            let e = Error::Invalid(format!(
                "a control line is longer than {MAX_LINE} bytes; nothing of it runs"
            ));
            self.checkpoints.record_error(e.to_string());
            push_answers(&stream, vec![Some(answer_line(&Err(Failure::of(&e))))]);
            return Err(e);
        }
        if !complete.is_empty() {
            if let Err(e) = self.run_lines(&stream, &complete) {
                // ENOBUFS asks for a retry of the same write: what earlier writes carried
                // over stays pending. Any other refusal judged the line that carried text
                // belongs to: it is dropped with it (else every later line would be glued
                // to a line that can never parse).
                lock(&stream.state).unfinished = if e.errno() == libc::ENOBUFS {
                    complete[..carried].to_vec()
                } else {
                    Vec::new()
                };
                return Err(e);
            }
        }
        Ok(data.len())
    }

    /// Parse, validate and run complete lines on behalf of a control handle.
    pub(super) fn run_lines(&self, stream: &Arc<ControlStream>, text: &[u8]) -> Result<()> {
        let commands = crate::control::checked_commands(
            text,
            |c| self.control.validate(c),
            |e| self.checkpoints.record_error(e),
        );
        let commands = match commands {
            Ok(c) => c,
            Err(e) => {
                push_answers(stream, vec![Some(answer_line(&Err(Failure::of(&e))))]);
                // The write as a whole is refused (EINVAL); its answer says the rule's
                // errno and kind.
                return Err(Error::Invalid(e.to_string()));
            }
        };
        let first = {
            let mut st = lock(&stream.state);
            if !stream.discard_answers && st.slots.len() + commands.len() > MAX_UNREAD_ANSWERS {
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
            if !stream.discard_answers {
                st.slots.extend(std::iter::repeat_n(None, commands.len()));
            }
            first
        };
        if stream.discard_answers {
            // Nobody reads these answers: a command refused later (a busy checkpoint, a
            // failed write) must at least show in status.
            let checkpoints = self.checkpoints.clone();
            self.control.execute(
                commands,
                Arc::new(move |_, answer: protocol::Answer| {
                    if let Err(failure) = answer {
                        checkpoints
                            .record_error(format!("control command refused: {}", failure.error));
                    }
                }),
                &stream.imports,
            );
            return Ok(());
        }
        let weak = Arc::downgrade(stream);
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
        self.control.execute(commands, answer, &stream.imports);
        Ok(())
    }
}
