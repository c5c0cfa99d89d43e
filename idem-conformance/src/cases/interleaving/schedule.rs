//! What the interleaving suite generates: schedules of callers racing over
//! a few keys.

use proptest::collection::vec;
use proptest::prelude::{prop_oneof, Just, Strategy};
use serde_json::{json, Value};

/// One generated run: callers that start at their own time and act.
#[derive(Debug, Clone)]
pub(super) struct Schedule {
    pub(super) callers: Vec<Caller>,
}

/// One caller: which key and body it sends, when, and what its work does.
#[derive(Debug, Clone)]
pub(super) struct Caller {
    /// One of three client keys, so callers share keys and also use their
    /// own.
    pub(super) key: u8,
    /// One of two bodies, so some callers reuse a key for another request.
    pub(super) body: u8,
    /// When it calls, in milliseconds from the start. Like every time here,
    /// it is generated against a 150 ms lease and scaled with the lease the
    /// run uses.
    pub(super) start_ms: u16,
    /// How long its work runs, in milliseconds; past the lease, only the
    /// heartbeat keeps the key.
    pub(super) work_ms: u16,
    /// How many times it calls again, a little later, when told the key is
    /// in progress, as a client retrying would.
    pub(super) retries: u8,
    pub(super) act: Act,
}

/// What a caller's work ends in.
#[derive(Debug, Clone, Copy)]
pub(super) enum Act {
    /// Returns a value of some size.
    Succeed { pad: u16 },
    /// Returns an error; the key is released.
    FailReleased,
    /// Returns an error the caller asked to remember.
    FailRemembered,
    /// The call is dropped after this many milliseconds: a crash mid-work.
    Cancel { after_ms: u16 },
    /// Claims through the begin/Lease API and holds the key without a
    /// heartbeat past its lease, then completes (or releases): a stalled
    /// owner, whose late call must not touch a key taken over meanwhile.
    Stall { extra_ms: u16, release: bool },
}

impl Caller {
    /// The client key it sends.
    pub(super) fn client_key(&self) -> String {
        format!("interleaved-{}", self.key)
    }

    /// The request body it sends.
    pub(super) fn body(&self) -> Value {
        body(self.body)
    }
}

/// Request body number `n`.
pub(super) fn body(n: u8) -> Value {
    json!({"order": n, "amount": 100 + u32::from(n)})
}

/// The value caller `index`'s work returns. It names its caller, key and
/// body, so every answer can be traced to the run that produced it.
pub(super) fn outcome(index: usize, caller: &Caller, pad: u16) -> Value {
    json!({
        "caller": index,
        "key": caller.key,
        "body": caller.body,
        "pad": "x".repeat(usize::from(pad)),
    })
}

/// The error caller `index`'s work returns.
pub(super) fn failure(index: usize, caller: &Caller, remember: bool) -> Value {
    json!({"caller": index, "key": caller.key, "body": caller.body, "remember": remember})
}

fn act() -> impl Strategy<Value = Act, Tree: Send> {
    prop_oneof![
        4 => (0..3000u16).prop_map(|pad| Act::Succeed { pad }),
        1 => Just(Act::FailReleased),
        1 => Just(Act::FailRemembered),
        2 => (0..250u16).prop_map(|after_ms| Act::Cancel { after_ms }),
        3 => (0..300u16, proptest::bool::weighted(0.3))
            .prop_map(|(extra_ms, release)| Act::Stall { extra_ms, release }),
    ]
}

fn caller() -> impl Strategy<Value = Caller, Tree: Send> {
    (0..3u8, 0..2u8, 0..300u16, 0..350u16, 0..4u8, act()).prop_map(
        |(key, body, start_ms, work_ms, retries, act)| Caller {
            key,
            body,
            start_ms,
            work_ms,
            retries,
            act,
        },
    )
}

/// Schedules of 2 to 8 callers.
pub(super) fn schedules() -> impl Strategy<Value = Schedule, Tree: Send> {
    vec(caller(), 2..=8).prop_map(|callers| Schedule { callers })
}
