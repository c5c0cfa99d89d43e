//! The journal a durable run keeps in its key's record: the steps passed
//! and their outcomes, the takeovers counted, and a poisoned key's history.

use serde::{Deserialize, Serialize};

use crate::Error;

use super::Poisoned;
use crate::StepsError;

// Marks a payload as a step journal, with the version of its layout.
pub(super) const JOURNAL_VERSION: u32 = 1;

/// The payload of a poisoned key's `Failed` record.
#[derive(Serialize, Deserialize)]
pub(super) struct PoisonedRecord {
    pub(super) idem_poisoned: Poisoned,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct Journal {
    pub(super) idem_steps: u32,
    pub(super) takeovers: u32,
    #[serde(default)]
    pub(super) handed_over: bool,
    pub(super) steps: Vec<Entry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Entry {
    pub(super) name: String,
    pub(super) outcome: serde_json::Value,
}

impl Journal {
    pub(super) fn fresh() -> Journal {
        Journal {
            idem_steps: JOURNAL_VERSION,
            ..Journal::default()
        }
    }

    /// An empty payload is a key claimed by a plain call or a fresh claim.
    pub(super) fn decode(payload: &[u8]) -> serde_json::Result<Journal> {
        if payload.is_empty() {
            return Ok(Journal::fresh());
        }
        serde_json::from_slice(payload)
    }

    pub(super) fn encode(&self) -> Vec<u8> {
        // A journal holds strings and JSON values only: it always encodes.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

pub(super) fn replay_failure<E>(payload: &[u8]) -> Error<E> {
    if let Ok(record) = serde_json::from_slice::<PoisonedRecord>(payload) {
        return Error::Steps(StepsError::Poisoned(record.idem_poisoned));
    }
    match serde_json::from_slice(payload) {
        Ok(value) => Error::Remembered(value),
        Err(e) => Error::Decode(e),
    }
}
