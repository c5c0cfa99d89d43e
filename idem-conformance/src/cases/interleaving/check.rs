//! The invariants a schedule must keep, checked against the recorded store
//! calls, the runs of the work and every caller's answer.
//!
//! Every check is sound under any scheduling delay: a call's effect
//! happened somewhere between its recorded start and end, so a check only
//! fires when every such placement breaks the rule. A call whose caller was
//! dropped before the answer is in doubt: it may have taken effect at any
//! time after its start, or never. Checks that need something to have
//! happened count it as possible; checks that fire on something happening
//! count only what surely did.

use std::time::Duration;

use idem_core::store::{Record, State, Token};
use idem_core::Fingerprint;
use serde_json::Value;
use tokio::time::Instant;

use super::recorder::{Call, Op};
use super::schedule::{body, Schedule};

/// How much earlier than asked a store may end a lease (clock granularity).
const TOLERANCE: Duration = Duration::from_millis(5);

/// One run of the work: who ran it, on which key, from when.
#[derive(Debug, Clone)]
pub(super) struct Run {
    pub(super) caller: usize,
    pub(super) key: u8,
    pub(super) start: Instant,
}

/// What a caller was told.
#[derive(Debug, Clone)]
pub(super) enum Answer {
    /// A value; `own` when this caller's work produced it.
    Value {
        value: Value,
        own: bool,
    },
    /// A work error; `own` when this caller's work returned it.
    Failure {
        error: Value,
        own: bool,
    },
    Mismatch,
    InProgress,
    LeaseLost,
    /// The caller was dropped before it was told anything.
    Cancelled,
    /// A stalled owner released the key.
    Released,
    /// Anything a correct store never causes.
    Unexpected(String),
}

/// What one schedule left behind, for [`violations`].
pub(super) struct Evidence<'a> {
    pub(super) schedule: &'a Schedule,
    /// Storage key of each of the schedule's client keys.
    pub(super) keys: &'a [String],
    pub(super) answers: &'a [Answer],
    pub(super) runs: &'a [Run],
    pub(super) ops: &'a [Op],
    /// The record under each key once every caller was done.
    pub(super) finals: &'a [Option<Record>],
}

/// A call that surely granted the key.
fn is_grant(op: &Op) -> bool {
    op.changed == Some(true) && matches!(op.call, Call::Insert | Call::TakeOver)
}

/// A call that granted the key, or may have (it is in doubt).
fn may_grant(op: &Op) -> bool {
    op.changed != Some(false) && matches!(op.call, Call::Insert | Call::TakeOver)
}

/// A call that surely, or possibly, changed the record.
fn may_change(op: &Op) -> bool {
    op.changed != Some(false)
}

fn written_token(op: &Op) -> Option<Token> {
    op.written.as_ref().map(|w| w.token)
}

fn written_state(op: &Op) -> Option<State> {
    op.written.as_ref().map(|w| w.state)
}

/// A call by which the holder of `token` let the key go, surely or possibly:
/// it settled, released, or was taken over.
fn may_let_go(op: &Op, token: Token) -> bool {
    may_change(op)
        && op.expected == Some(token)
        && match op.call {
            Call::Remove | Call::TakeOver => true,
            Call::Swap => written_state(op) != Some(State::InFlight),
            _ => false,
        }
}

/// A call by which the holder of `token` surely let the key go.
fn lets_go(op: &Op, token: Token) -> bool {
    op.changed == Some(true) && may_let_go(op, token)
}

/// Every broken invariant, as a sentence.
pub(super) fn violations(evidence: &Evidence<'_>) -> Vec<String> {
    let mut found = Vec::new();
    for op in evidence.ops {
        if let Some(error) = &op.error {
            found.push(format!(
                "the store failed on {:?} of {}: {error}",
                op.call, op.key
            ));
        }
    }
    for (k, key) in evidence.keys.iter().enumerate() {
        let ops: Vec<&Op> = evidence.ops.iter().filter(|op| op.key == *key).collect();
        one_owner_per_lease(k, &ops, &mut found);
        stale_tokens_change_nothing(k, &ops, &mut found);
        final_record_is_the_last_settled(k, &ops, evidence.finals[k].as_ref(), &mut found);
    }
    runs_hold_the_key(evidence, &mut found);
    answers_fit_one_history(evidence, &mut found);
    found
}

/// No key is granted to a second owner while the first one's lease holds.
fn one_owner_per_lease(k: usize, ops: &[&Op], found: &mut Vec<String>) {
    for (i, second) in ops.iter().enumerate().filter(|(_, op)| is_grant(op)) {
        for first in ops
            .iter()
            .filter(|op| is_grant(op) && op.ended_before(second.start))
        {
            let Some(holder) = written_token(first) else {
                continue;
            };
            let Some(second_end) = second.end else {
                continue;
            };
            let let_go = ops
                .iter()
                .enumerate()
                .any(|(j, op)| j != i && may_let_go(op, holder) && op.start < second_end);
            if let_go {
                continue;
            }
            // The lease lasts at least from the start of the holder's last
            // claim or renewal that surely came before the second grant.
            let lease_until = ops
                .iter()
                .filter(|op| {
                    op.changed == Some(true)
                        && op.ended_before(second.start)
                        && written_token(op) == Some(holder)
                })
                .filter(|op| written_state(op) == Some(State::InFlight))
                .filter_map(|op| Some(op.start + op.written.as_ref()?.lease?))
                .max();
            if let Some(until) = lease_until {
                if second_end + TOLERANCE < until {
                    found.push(format!(
                        "key {k} was granted by {:?} to caller {:?} while caller {:?}'s lease had {:?} left",
                        second.call,
                        second.caller,
                        first.caller,
                        until - second_end
                    ));
                }
            }
        }
    }
}

/// A token that was superseded, settled or released never changes the
/// record again.
fn stale_tokens_change_nothing(k: usize, ops: &[&Op], found: &mut Vec<String>) {
    for (i, op) in ops.iter().enumerate() {
        let Some(token) = op.expected.filter(|_| op.changed == Some(true)) else {
            continue;
        };
        let Some(granted) = ops
            .iter()
            .find(|g| may_grant(g) && written_token(g) == Some(token))
        else {
            found.push(format!(
                "key {k}: {:?} succeeded with a token the store never granted",
                op.call
            ));
            continue;
        };
        let dead = ops.iter().enumerate().find(|(j, other)| {
            *j != i
                && other.ended_before(op.start)
                && (lets_go(other, token)
                    || (is_grant(other)
                        && written_token(other) != Some(token)
                        && granted.ended_before(other.start)))
        });
        if let Some((_, other)) = dead {
            found.push(format!(
                "key {k}: a stale token changed the record: {:?} by caller {:?} succeeded after {:?} by caller {:?}",
                op.call, op.caller, other.call, other.caller
            ));
        }
    }
}

/// A key settles at most once, and its record is what that settlement
/// wrote, byte for byte.
fn final_record_is_the_last_settled(
    k: usize,
    ops: &[&Op],
    last: Option<&Record>,
    found: &mut Vec<String>,
) {
    let may_settle: Vec<&&Op> = ops
        .iter()
        .filter(|op| {
            may_change(op) && op.call == Call::Swap && written_state(op) != Some(State::InFlight)
        })
        .collect();
    let settled: Vec<&&Op> = may_settle
        .iter()
        .copied()
        .filter(|op| op.changed == Some(true))
        .collect();
    if settled.len() > 1 {
        found.push(format!(
            "key {k} was settled {} times: a final record changed",
            settled.len()
        ));
    }
    let Some(record) = last else {
        if !settled.is_empty() {
            found.push(format!("key {k}: its recorded outcome was lost"));
        }
        return;
    };
    // Of the settlements that surely or possibly happened, the record must
    // hold one's bytes exactly; a sure one is preferred in the message.
    let written = may_settle
        .iter()
        .filter_map(|op| op.written.as_ref())
        .find(|w| w.state == record.state && w.payload == record.payload)
        .or_else(|| settled.last().and_then(|op| op.written.as_ref()))
        .or_else(|| may_settle.last().and_then(|op| op.written.as_ref()));
    match (record.state, written) {
        (State::InFlight, _) => {
            // The owner in the record must have been granted the key, and no
            // grant may have surely come after its own.
            let owner = ops
                .iter()
                .find(|op| may_grant(op) && written_token(op) == Some(record.token));
            let superseded = owner.is_some_and(|owner| {
                ops.iter()
                    .any(|op| is_grant(op) && owner.ended_before(op.start))
            });
            if owner.is_none() || superseded {
                found.push(format!(
                    "key {k}: the record in flight is not the last owner's"
                ));
            }
        }
        (_, None) => found.push(format!(
            "key {k} holds a {:?} record no owner wrote",
            record.state
        )),
        (state, Some(written)) => {
            if state != written.state || record.payload != written.payload {
                found.push(format!(
                    "key {k}: the stored outcome ({state:?}, {} bytes) differs from what was written ({:?}, {} bytes)",
                    record.payload.len(),
                    written.state,
                    written.payload.len()
                ));
            }
        }
    }
}

/// Every run of the work was preceded by a grant of its key to its caller.
fn runs_hold_the_key(evidence: &Evidence<'_>, found: &mut Vec<String>) {
    for run in evidence.runs {
        let key = &evidence.keys[usize::from(run.key)];
        let granted = evidence.ops.iter().any(|op| {
            is_grant(op)
                && op.key == *key
                && op.caller == Some(run.caller)
                && op.end.is_some_and(|end| end <= run.start)
        });
        if !granted {
            found.push(format!(
                "caller {} ran the work on key {} without holding it",
                run.caller, run.key
            ));
        }
    }
}

/// Every answer fits one history of its key.
fn answers_fit_one_history(evidence: &Evidence<'_>, found: &mut Vec<String>) {
    for (i, (caller, answer)) in evidence
        .schedule
        .callers
        .iter()
        .zip(evidence.answers)
        .enumerate()
    {
        let k = usize::from(caller.key);
        let key = &evidence.keys[k];
        let grants = || {
            evidence
                .ops
                .iter()
                .filter(|op| may_grant(op) && op.key == *key)
        };
        let fingerprint = Fingerprint::of_json(&body(caller.body)).ok();
        let last = evidence.finals[k].as_ref();
        let stored = |state: State| {
            last.filter(|r| r.state == state)
                .and_then(|r| serde_json::from_slice::<Value>(&r.payload).ok())
        };
        let mut fail = |what: String| found.push(format!("caller {i} on key {k}: {what}"));
        match answer {
            Answer::Value { value, own } => {
                if value["key"] != caller.key || value["body"] != caller.body {
                    fail(format!("got another request's outcome {value}"));
                }
                let producer = value["caller"]
                    .as_u64()
                    .and_then(|c| usize::try_from(c).ok());
                if *own && producer != Some(i) {
                    fail(format!("its own run returned someone else's value {value}"));
                }
                if !evidence
                    .runs
                    .iter()
                    .any(|run| Some(run.caller) == producer && usize::from(run.key) == k)
                {
                    fail(format!("was given {value}, which no run produced"));
                }
                if stored(State::Completed).as_ref() != Some(value) {
                    fail(format!(
                        "was given {value}, but the key's record is {last:?}"
                    ));
                }
            }
            Answer::Failure { error, own } => {
                if *own {
                    if error["caller"] != i {
                        fail(format!("its own run returned someone else's error {error}"));
                    }
                } else if error["remember"] != true || stored(State::Failed).as_ref() != Some(error)
                {
                    fail(format!(
                        "was replayed the failure {error}, but the key's record is {last:?}"
                    ));
                }
            }
            Answer::Mismatch => {
                if !grants().any(|g| g.written.as_ref().map(|w| w.fingerprint) != fingerprint) {
                    fail("was told mismatch, but no other body ever claimed the key".to_owned());
                }
            }
            Answer::InProgress => {
                if !grants().any(|g| g.caller != Some(i)) {
                    fail("was told in progress, but nobody else ever held the key".to_owned());
                }
            }
            Answer::LeaseLost => {
                if !grants().any(|g| g.call == Call::TakeOver && g.caller != Some(i)) {
                    fail("was told its lease was lost, but nobody took the key over".to_owned());
                }
            }
            Answer::Cancelled | Answer::Released => {}
            Answer::Unexpected(what) => fail(format!("got {what}")),
        }
    }
}
