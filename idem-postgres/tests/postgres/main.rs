//! PostgreSQL-specific tests of `PostgresStore`, against the real server at
//! `IDEM_POSTGRES_URL`: races the claim statement must survive, round trips
//! counted by the server, names, corrupt rows, pools and lost connections.

#[path = "../support/mod.rs"]
mod support;

mod legacy;
mod names_and_rows;
mod pools_and_faults;
mod races;
mod round_trips;
mod tx;
mod waking;

use std::time::Duration;

use idem_core::{Fingerprint, NewRecord, State, Token};

/// An in-flight record as a claim writes it.
pub(crate) fn in_flight(token: Token, lease: Duration, retention: Duration) -> NewRecord<'static> {
    NewRecord {
        token,
        fingerprint: Fingerprint::of_bytes(b"request"),
        state: State::InFlight,
        payload: &[],
        lease: Some(lease),
        retention,
    }
}

/// A lease or retention that outlasts any test.
pub(crate) const MINUTE: Duration = Duration::from_secs(60);
