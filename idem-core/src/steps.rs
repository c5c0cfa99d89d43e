//! Durable steps: a multi-step operation under one key that resumes after
//! a crash where it stopped.
//!
//! # Where the steps are kept, and why
//!
//! The journal of recorded steps is the **payload of the key's `InFlight`
//! record** (the design reserves that payload for "the progress of durable
//! steps"). Every write of it is a [`Store::swap`](crate::store::Store::swap) fenced by the owner's
//! token, so the [`Store`](crate::store::Store) trait is unchanged and every store that passes
//! the conformance kit holds steps:
//!
//! * *Recording a step* is one `swap` that keeps the record `InFlight`,
//!   writes the journal with the new step appended and renews the lease:
//!   one atomic operation, one round trip, refused to a stale owner.
//! * *The token rotates at every recorded step.* The swap expects the
//!   current token and writes a fresh one. A taker-over reads the journal
//!   from the record its claim found and takes over **from that record's
//!   token**, so its takeover succeeds only if no step was recorded since
//!   it read: the journal it resumes from is the one its takeover
//!   replaced, never an older one (the read-then-take-over race). Without
//!   the rotation a paused owner could record a step after the read and let
//!   its lease lapse again before the takeover, and the step would run
//!   twice.
//! * *The heartbeat writes the journal too*: a renewal is a `swap` and
//!   replaces the payload, so the steps' own heartbeat renews with the
//!   current journal (and the current token). Renewals and step records
//!   are serialized by one lock, so a renewal never writes an older journal
//!   over a newer one.
//! * *A takeover* writes the journal it found, with the takeover counted,
//!   in the same `take_over` (one atomic operation). Past
//!   [`Durable::with_max_takeovers`](crate::Durable::with_max_takeovers) takeovers (default
//!   [`DEFAULT_MAX_TAKEOVERS`]) that same `take_over` settles the key as
//!   `Failed` with the history ([`Poisoned`]) instead, so a poison
//!   operation that kills its worker cannot loop forever.
//!
//! The cost in round trips (counted in `idem-bench`): the claim and the
//! completion as for [`Idempotent::execute`](crate::Idempotent::execute), plus **one swap per recorded
//! step**; a replayed step costs nothing (the journal came with the claim).
//!
//! # What each kind of step guarantees across crashes
//!
//! * [`Steps::step`](crate::Steps::step): a step whose outcome is recorded is never run again
//!   under this key; one that crashes (or whose record is lost) after it
//!   ran is run again by the taker-over. Its effect is **at least once**
//!   across crashes — at most once per crash.
//! * [`Steps::remote`](crate::Steps::remote): the same, and the work gets a key derived from the
//!   operation's key and the step's name ([`Lease::derive_key`](crate::Lease::derive_key)); a remote
//!   idempotent API dedupes the re-run, so the effect is **exactly once**.
//! * A step inside a SQL transaction (`step_in_tx` in `idem-postgres` and
//!   `idem-sqlite`): the journal swap runs in the transaction that holds
//!   the step's business writes, so both commit or neither does: **exactly
//!   once**. Those crates build on [`Steps::begin_step`](crate::Steps::begin_step) and
//!   [`StepWriter`].
//!
//! # Rules for the work
//!
//! * Steps run one after another, each awaited before the next starts;
//!   their order is the journal's order.
//! * The code between steps must be deterministic given the steps'
//!   outcomes: a resumed run must reach the same steps in the same order.
//!   A run whose step names or order differ from the recorded ones fails
//!   with [`StepsError::Diverged`](crate::StepsError::Diverged) (the code
//!   changed under a running operation) instead of guessing; so does a run
//!   that finishes before reaching every recorded step.
//! * A step that fails (`Err`) is not recorded. When the work returns an
//!   error the key is not released (that would forget the recorded steps):
//!   its lease is cut to the shortest, so the next call takes it over at
//!   once and resumes after the last recorded step. Such a hand-over is not
//!   counted as a takeover.
//! * Every call for a key runs it through durable steps: a plain
//!   [`Idempotent::execute`](crate::Idempotent::execute) that takes such a key over starts from an
//!   empty payload and would run every step again.
//! * Waiting ([`Idempotent::with_wait`](crate::Idempotent::with_wait)) does not apply: a live key is
//!   [`Error::InProgress`](crate::Error::InProgress) at once.

use serde::{Deserialize, Serialize};

pub(crate) mod durable;
mod journal;
pub(crate) mod step;
mod writer;

pub use step::{PendingStep, StepStart};
pub use writer::{StepEncoder, StepWriter};

/// How many times a key may be taken over (its owner crashed or stalled
/// past its lease) before it is settled as failed.
pub const DEFAULT_MAX_TAKEOVERS: u32 = 10;

/// The history kept with a key settled as failed after too many takeovers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Poisoned {
    /// How many times the key had been taken over.
    pub takeovers: u32,
    /// The names of the steps recorded by then, in order.
    pub steps: Vec<String>,
}
