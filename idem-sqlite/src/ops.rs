//! The store's operations as SQL on the writer's connection, and the
//! decoding of rows back into records.
//!
//! Deadlines are unix time in microseconds on this machine's clock, read
//! once per operation: they must outlive the process (a reopened file keeps
//! its leases), so a monotonic clock would not do.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_core::store::{Insert, NewRecord, Record, Reset, State, Token};
use idem_core::Fingerprint;
use rusqlite::{params, Connection, OptionalExtension, Row};

use crate::error::Failure;

// Claims an absent key, or one whose record is past retention, in one
// statement; a live record is left alone.
pub(crate) const CLAIM: &str = "INSERT INTO idem_records \
    (key, token, fingerprint, state, payload, lease_until, retain_until) \
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
    ON CONFLICT (key) DO UPDATE SET token = excluded.token, \
    fingerprint = excluded.fingerprint, state = excluded.state, \
    payload = excluded.payload, lease_until = excluded.lease_until, \
    retain_until = excluded.retain_until \
    WHERE idem_records.retain_until <= ?8";

const SELECT_LIVE: &str = "SELECT token, fingerprint, state, payload, lease_until, \
    retain_until FROM idem_records WHERE key = ?1 AND retain_until > ?2";

// State 0 is `InFlight`: only a live in-flight record holding the expected
// token may change.
const SWAP: &str = "UPDATE idem_records SET token = ?1, fingerprint = ?2, state = ?3, \
    payload = ?4, lease_until = ?5, retain_until = ?6 \
    WHERE key = ?7 AND token = ?8 AND state = 0 AND retain_until > ?9";

const TAKE_OVER: &str = "UPDATE idem_records SET token = ?1, fingerprint = ?2, state = ?3, \
    payload = ?4, lease_until = ?5, retain_until = ?6 \
    WHERE key = ?7 AND token = ?8 AND state = 0 AND retain_until > ?9 \
    AND (lease_until IS NULL OR lease_until <= ?9)";

const REMOVE: &str = "DELETE FROM idem_records \
    WHERE key = ?1 AND token = ?2 AND state = 0 AND retain_until > ?3";

// A reset reads the live record's state, then deletes it if it is settled;
// the writer's transaction holds the write lock between the two.
const LIVE_STATE: &str = "SELECT state FROM idem_records WHERE key = ?1 AND retain_until > ?2";

const DELETE_KEY: &str = "DELETE FROM idem_records WHERE key = ?1";

// The index on retain_until finds the expired rows; LIMIT bounds how long
// one purge holds the write lock.
const PURGE: &str = "DELETE FROM idem_records WHERE rowid IN \
    (SELECT rowid FROM idem_records WHERE retain_until <= ?1 LIMIT ?2)";

// A duration too long to add (say `Duration::MAX`) means "as long as the
// clock can count": a century, as in `MemoryStore`.
const LONGEST: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A record to write, owned so that it can cross to the writer thread.
#[derive(Debug)]
pub(crate) struct Owned {
    token: Token,
    fingerprint: Fingerprint,
    state: State,
    payload: Vec<u8>,
    lease: Option<Duration>,
    retention: Duration,
}

impl From<&NewRecord<'_>> for Owned {
    fn from(record: &NewRecord<'_>) -> Owned {
        Owned {
            token: record.token,
            fingerprint: record.fingerprint,
            state: record.state,
            payload: record.payload.to_vec(),
            lease: record.lease,
            retention: record.retention,
        }
    }
}

/// One operation, as the writer thread runs it.
#[derive(Debug)]
pub(crate) enum Op {
    Insert {
        key: String,
        record: Owned,
    },
    Swap {
        key: String,
        expected: Token,
        record: Owned,
        take_over: bool,
    },
    Remove {
        key: String,
        expected: Token,
    },
    Load {
        key: String,
    },
    Reset {
        key: String,
    },
    Purge {
        limit: usize,
    },
    /// The bench's baseline statements.
    #[cfg(feature = "raw-protocol")]
    Raw(crate::raw::RawOp),
    /// A lease's work and its fenced completion, in one savepoint.
    Work(crate::group::TxWork),
    /// A caller's transaction: the writer serves only it until it ends.
    Session(crate::tx::Session),
    /// A read across records, for operators.
    Inspect(crate::inspect::Query),
}

/// What an operation answered.
#[derive(Debug)]
pub(crate) enum Done {
    Insert(Insert),
    Changed(bool),
    Loaded(Option<Record>),
    Reset(Reset),
    Purged(usize),
    Page(idem_core::inspect::Page),
    Stats(idem_core::inspect::Stats),
    #[cfg(feature = "raw-protocol")]
    Claimed(Option<Vec<u8>>),
}

/// Why an operation failed. A statement error may have spoiled the
/// transaction it ran in; a bad row spoils nothing, since no operation
/// writes after reading one.
#[derive(Debug)]
pub(crate) enum OpError {
    Statement(rusqlite::Error),
    Bad(Failure),
}

impl From<rusqlite::Error> for OpError {
    fn from(error: rusqlite::Error) -> OpError {
        OpError::Statement(error)
    }
}

impl Op {
    /// Whether the operation only reads, so it needs no write lock.
    pub(crate) fn is_read(&self) -> bool {
        matches!(self, Op::Load { .. } | Op::Inspect(_))
    }

    /// Whether leaving the operation undone is as good as doing it when
    /// nobody awaits its answer: claims and reads.
    pub(crate) fn is_skippable(&self) -> bool {
        match self {
            // A session nobody holds any more has nothing to run.
            Op::Insert { .. } | Op::Load { .. } | Op::Inspect(_) | Op::Session(_) => true,
            Op::Swap { take_over, .. } => *take_over,
            Op::Remove { .. } | Op::Reset { .. } | Op::Purge { .. } | Op::Work(_) => false,
            #[cfg(feature = "raw-protocol")]
            Op::Raw(raw) => raw.is_skippable(),
        }
    }

    /// The key whose waiters a committed `Changed(true)` answer of this
    /// operation wakes: a completion or failure, a release, a settle in the
    /// caller's transaction. Renewals, durable steps and claims wake nobody.
    pub(crate) fn wakes(&self) -> Option<&str> {
        match self {
            Op::Swap { key, record, .. } if record.state != State::InFlight => Some(key),
            Op::Remove { key, .. } => Some(key),
            Op::Work(work) => work.settles(),
            _ => None,
        }
    }

    /// Runs the operation inside the caller's open transaction.
    pub(crate) fn run(&self, conn: &Connection) -> Result<Done, OpError> {
        let now = now();
        match self {
            Op::Insert { key, record } => {
                // Reading first costs a first execution one cheap lookup and
                // saves a replay (the common case) a write attempt. The
                // transaction holds the write lock, so nothing comes between.
                if let Some(found) = load(conn, key, now)? {
                    return Ok(Done::Insert(Insert::Found(found)));
                }
                let claimed = conn.prepare_cached(CLAIM)?.execute(params![
                    key,
                    record.token.as_bytes(),
                    record.fingerprint.stored(),
                    record.state.as_u8(),
                    record.payload,
                    record.lease.map(|lease| after(now, lease)),
                    after(now, record.retention),
                    now,
                ])?;
                if claimed == 1 {
                    Ok(Done::Insert(Insert::Inserted))
                } else {
                    // Only a damaged file keeps a row that is live to the
                    // claim but absent to the read before it.
                    Err(OpError::Bad(Failure::BadRow(format!(
                        "the record under {key:?} is live to an insert but absent to a read"
                    ))))
                }
            }
            Op::Swap {
                key,
                expected,
                record,
                take_over,
            } => {
                let sql = if *take_over { TAKE_OVER } else { SWAP };
                let changed = conn.prepare_cached(sql)?.execute(params![
                    record.token.as_bytes(),
                    record.fingerprint.stored(),
                    record.state.as_u8(),
                    record.payload,
                    record.lease.map(|lease| after(now, lease)),
                    after(now, record.retention),
                    key,
                    expected.as_bytes(),
                    now,
                ])?;
                Ok(Done::Changed(changed == 1))
            }
            Op::Remove { key, expected } => {
                let removed =
                    conn.prepare_cached(REMOVE)?
                        .execute(params![key, expected.as_bytes(), now])?;
                Ok(Done::Changed(removed == 1))
            }
            Op::Load { key } => Ok(Done::Loaded(load(conn, key, now)?)),
            Op::Reset { key } => {
                let state: Option<i64> = conn
                    .prepare_cached(LIVE_STATE)?
                    .query_row(params![key, now], |row| row.get(0))
                    .optional()?;
                let Some(code) = state else {
                    return Ok(Done::Reset(Reset::Absent));
                };
                let state = u8::try_from(code).ok().and_then(State::from_u8);
                match state {
                    Some(State::InFlight) => Ok(Done::Reset(Reset::InFlight)),
                    Some(settled) => {
                        conn.prepare_cached(DELETE_KEY)?.execute(params![key])?;
                        Ok(Done::Reset(Reset::Deleted(settled)))
                    }
                    None => Err(OpError::Bad(Failure::BadRow(format!(
                        "the record under {key:?} has state code {code}, which is no known state"
                    )))),
                }
            }
            Op::Purge { limit } => {
                let limit = i64::try_from(*limit).unwrap_or(i64::MAX);
                let purged = conn.prepare_cached(PURGE)?.execute(params![now, limit])?;
                Ok(Done::Purged(purged))
            }
            #[cfg(feature = "raw-protocol")]
            Op::Raw(raw) => raw.run(conn, now),
            Op::Work(work) => crate::group::run(conn, work),
            Op::Session(session) => crate::tx::serve(conn, session),
            Op::Inspect(query) => query.run(conn, now),
        }
    }
}

pub(crate) fn load(conn: &Connection, key: &str, now: i64) -> Result<Option<Record>, OpError> {
    let mut statement = conn.prepare_cached(SELECT_LIVE)?;
    let decoded = statement
        .query_row(params![key, now], |row| Ok(decode(row, now)))
        .optional()?;
    match decoded {
        None => Ok(None),
        Some(Ok(record)) => Ok(Some(record)),
        Some(Err(reason)) => Err(OpError::Bad(Failure::BadRow(format!(
            "the record under {key:?} {reason}"
        )))),
    }
}

/// Turns a live row into a record, refusing anything the store could not
/// have written.
pub(crate) fn decode(row: &impl Columns, now: i64) -> Result<Record, String> {
    let column = |error: rusqlite::Error| format!("has a column that does not read: {error}");
    let token: Vec<u8> = row.column(0).map_err(column)?;
    let fingerprint: Vec<u8> = row.column(1).map_err(column)?;
    let state: i64 = row.column(2).map_err(column)?;
    let payload: Vec<u8> = row.column(3).map_err(column)?;
    let lease_until: Option<i64> = row.column(4).map_err(column)?;
    let retain_until: i64 = row.column(5).map_err(column)?;

    let bad = |error: idem_core::store::ParseError| format!("is not a record: {error}");
    let token = Token::try_from(token.as_slice()).map_err(bad)?;
    let fingerprint = Fingerprint::try_from(fingerprint.as_slice()).map_err(bad)?;
    let state = u8::try_from(state)
        .ok()
        .and_then(State::from_u8)
        .ok_or_else(|| format!("has state code {state}, which is no known state"))?;
    Ok(Record {
        token,
        fingerprint,
        state,
        payload,
        // A lease only in flight, where a missing deadline has lapsed, as
        // the takeover statement reads it.
        lease_remaining: (state == State::InFlight)
            .then(|| lease_until.map_or(Duration::ZERO, |until| remaining(now, until))),
        retention_remaining: remaining(now, retain_until),
    })
}

/// The columns of a record's row, `token` first.
pub(crate) trait Columns {
    fn column<T: rusqlite::types::FromSql>(&self, index: usize) -> rusqlite::Result<T>;
}

impl Columns for Row<'_> {
    fn column<T: rusqlite::types::FromSql>(&self, index: usize) -> rusqlite::Result<T> {
        self.get(index)
    }
}

/// Now, in unix microseconds. A clock set before 1970 reads as 1970, which
/// only makes records look younger than they are.
fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
        })
}

pub(crate) fn after(now: i64, span: Duration) -> i64 {
    // LONGEST in microseconds fits an i64 with room to spare.
    let span = i64::try_from(span.min(LONGEST).as_micros()).unwrap_or(i64::MAX);
    now.saturating_add(span)
}

fn remaining(now: i64, until: i64) -> Duration {
    Duration::from_micros(u64::try_from(until.saturating_sub(now)).unwrap_or(0))
}
