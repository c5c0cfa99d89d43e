//! The store side of a step: the right to write one step's outcome inside
//! the store's own transaction.

use std::fmt;

use serde::Serialize;
use tokio::sync::OwnedMutexGuard;

use crate::store::{NewRecord, State, Token};

use super::journal::{Entry, Journal};
use super::step::{Journaled, Steps};

/// The right to record one step's outcome in the journal, held until the
/// write is known to have landed or not. A store's `step_in_tx` gets one
/// from [`PendingStep::writer`](super::PendingStep::writer), writes [`record`](StepWriter::record)
/// with a compare-and-set on [`expected`](StepWriter::expected) inside its
/// transaction, and then calls [`committed`](StepWriter::committed) or
/// [`lost`](StepWriter::lost). Dropped without either (the commit failed
/// and may or may not have landed), it stops the run: later steps are
/// [`StepsError::Interrupted`](crate::StepsError::Interrupted) and a retry resumes from the store.
pub struct StepWriter {
    pub(super) state: OwnedMutexGuard<Journaled>,
    pub(super) steps: Steps,
    pub(super) name: String,
    pub(super) token: Token,
    pub(super) written: Option<Journal>,
}

impl fmt::Debug for StepWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepWriter")
            .field("key", self.steps.key())
            .field("step", &self.name)
            .finish_non_exhaustive()
    }
}

impl StepWriter {
    /// The encoded key the journal is written under.
    pub fn key(&self) -> &str {
        self.steps.key().as_str()
    }

    /// The token the write must find (compare-and-set).
    pub fn expected(&self) -> Token {
        self.state.token
    }

    /// The journal with `outcome` appended as this step's: the payload to
    /// write with [`record`](StepWriter::record).
    pub fn encode<S: Serialize>(&mut self, outcome: &S) -> serde_json::Result<Vec<u8>> {
        let outcome = serde_json::to_value(outcome)?;
        let mut journal = self.state.journal.clone();
        journal.steps.push(Entry {
            name: self.name.clone(),
            outcome,
        });
        let payload = journal.encode();
        self.written = Some(journal);
        Ok(payload)
    }

    /// A copy of what [`encode`](StepWriter::encode) needs, to encode on
    /// another thread (a store's writer thread).
    pub fn encoder(&self) -> StepEncoder {
        StepEncoder {
            journal: self.state.journal.clone(),
            name: self.name.clone(),
        }
    }

    /// The record to write: `InFlight`, `payload`, a fresh token (the token
    /// rotates at every step), the lease renewed.
    pub fn record<'a>(&self, payload: &'a [u8]) -> NewRecord<'a> {
        NewRecord {
            token: self.token,
            ..self.steps.inner.lease.record(State::InFlight, payload)
        }
    }

    /// The write landed: the step is recorded.
    pub fn committed(mut self) {
        if let Some(journal) = self.written.take() {
            self.apply(journal);
        }
    }

    /// The write landed with this payload (as built by a [`StepEncoder`]).
    pub fn committed_with(mut self, payload: &[u8]) {
        match Journal::decode(payload) {
            Ok(journal) => self.apply(journal),
            Err(_) => self.state.stopped = true,
        }
    }

    pub(super) fn apply(&mut self, journal: Journal) {
        self.state.token = self.token;
        self.state.payload = journal.encode();
        self.state.journal = journal;
        self.state.cursor += 1;
        self.written = None;
        // Marks this writer as finished for `Drop`.
        self.name.clear();
    }

    /// The write found another token: the key was taken over. The run
    /// stops; the caller gets [`Error::LeaseLost`](crate::Error::LeaseLost).
    pub fn lost(mut self) {
        self.state.stopped = true;
        self.name.clear();
    }

    /// Nothing was written (the step's work failed and its transaction
    /// rolled back): the journal is as it was and the run may go on.
    pub fn unchanged(mut self) {
        self.name.clear();
    }
}

impl Drop for StepWriter {
    fn drop(&mut self) {
        if !self.name.is_empty() {
            // Whether the write landed is unknown.
            self.state.stopped = true;
        }
    }
}

/// Encodes a step's journal away from its [`StepWriter`] (on a store's
/// writer thread); hand the payload back with
/// [`StepWriter::committed_with`].
#[derive(Debug, Clone)]
pub struct StepEncoder {
    pub(super) journal: Journal,
    pub(super) name: String,
}

impl StepEncoder {
    /// The journal with `outcome` appended as this step's.
    pub fn encode<S: Serialize>(&self, outcome: &S) -> serde_json::Result<Vec<u8>> {
        let mut journal = self.journal.clone();
        journal.steps.push(Entry {
            name: self.name.clone(),
            outcome: serde_json::to_value(outcome)?,
        });
        Ok(journal.encode())
    }
}
