//! The three stores' record decoding.

use std::cell::RefCell;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_core::store::{NewRecord, Record, State, StoreError, StoreErrorKind, Token};
use idem_core::Fingerprint;
use rusqlite::types::Value;
use rusqlite::{params, Connection};

use crate::input::{Reader, Writer};

/// Records of every state and shape, as the stores are asked to write them.
fn samples() -> Vec<NewRecord<'static>> {
    const LONG: &[u8] = &[0xab; 300];
    let record = |state, payload: &'static [u8], lease, retention| NewRecord {
        token: Token::from_bytes([0x5a; 16]),
        // Every other record has a fingerprint of a later scheme.
        fingerprint: Fingerprint::of_bytes(payload).with_scheme(1 + payload.len() as u8 % 2),
        state,
        payload,
        lease,
        retention,
    };
    let secs = Duration::from_secs;
    vec![
        record(State::InFlight, b"", Some(secs(30)), secs(86_400)),
        record(State::InFlight, b"", Some(Duration::ZERO), secs(1)),
        record(State::InFlight, b"step", Some(secs(5)), secs(2)),
        record(
            State::InFlight,
            b"",
            Some(Duration::from_micros(1)),
            secs(1),
        ),
        record(State::Completed, b"{\"id\":\"ch_1\"}", None, secs(3_600)),
        record(State::Completed, LONG, None, Duration::from_millis(1)),
        record(State::Failed, b"\x00\xffdeclined", None, secs(60)),
        record(State::Completed, b"", None, Duration::MAX),
    ]
}

fn assert_corrupt(error: &StoreError) {
    assert_eq!(error.kind(), StoreErrorKind::Corrupt, "{error}");
}

/// What every decoded record must be: a lease exactly when in flight, and
/// some retention left.
fn assert_well_formed(record: &Record) {
    assert_eq!(
        record.lease_remaining.is_some(),
        record.state == State::InFlight,
        "a lease exactly when in flight: {record:?}"
    );
    assert!(!record.retention_remaining.is_zero(), "{record:?}");
}

// ---------------------------------------------------------------- Redis

/// The Redis binary record. Input: the server's clock in ms (`i64`), the
/// key's `PTTL` (`i64`), then the value.
pub fn redis_record(data: &[u8]) {
    let mut input = Reader(data);
    let (Some(now_ms), Some(pttl)) = (input.i64(), input.i64()) else {
        return;
    };
    let value = input.rest();
    let record = match idem_redis::fuzzing::decode(value.to_vec(), now_ms, pttl) {
        Ok(record) => record,
        Err(error) => return assert_corrupt(&error),
    };
    assert_well_formed(&record);
    assert_eq!(record.payload, value[value.len() - record.payload.len()..]);
    // A record of the layouts this build writes (3 and 4), live, with its
    // lease inside its retention: written again at the same server time
    // with the durations it was read with, it is the value it was read
    // from.
    let stamped = matches!(value.first(), Some(3 | 4));
    let now = u64::try_from(now_ms).ok().filter(|&ms| ms <= MAX_MS);
    let (Some(now), true) = (now, stamped) else {
        return;
    };
    let within = record.retention_remaining.as_millis() <= u128::from(MAX_MS)
        && record
            .lease_remaining
            .is_none_or(|lease| !lease.is_zero() && lease <= record.retention_remaining);
    if record.retention_remaining > Duration::from_millis(1) && within {
        let encoded = idem_redis::fuzzing::encode(
            &NewRecord {
                token: record.token,
                fingerprint: record.fingerprint,
                state: record.state,
                payload: &record.payload,
                lease: record.lease_remaining,
                retention: record.retention_remaining,
            },
            now,
        );
        assert_eq!(encoded, value, "{record:?}");
    }
}

/// A century, the longest duration the Redis store writes.
const MAX_MS: u64 = 100 * 365 * 24 * 3600 * 1000;

/// Values from the Redis store's encoder written at a server time, each
/// read back then, halfway to its retention deadline and past it.
pub(crate) fn redis_seeds() -> Vec<Vec<u8>> {
    const WRITTEN: i64 = 1_800_000_000_000;
    samples()
        .iter()
        .flat_map(|record| {
            let value = idem_redis::fuzzing::encode(record, WRITTEN as u64);
            let retention = i64::try_from(record.retention.as_millis()).unwrap_or(i64::MAX);
            [0, retention / 2, retention.saturating_add(1)].map(|after| {
                let mut input = Writer::default();
                input
                    .put(&WRITTEN.saturating_add(after).to_be_bytes())
                    .put(&0_i64.to_be_bytes())
                    .put(&value);
                input.0
            })
        })
        .collect()
}

// ------------------------------------------------------------- PostgreSQL

/// The PostgreSQL row. Input: token and fingerprint (one-byte lengths),
/// state (`i16`), payload (two-byte length), a lease flag byte, the lease
/// left and the retention left (`i64` microseconds).
pub fn postgres_row(data: &[u8]) {
    sql_row(
        data,
        |token, fingerprint, state, payload, lease_left, retain_left| {
            Some(idem_postgres::fuzzing::decode_columns(
                token,
                fingerprint,
                state,
                payload,
                lease_left,
                retain_left,
            ))
        },
    );
}

/// The MariaDB row, in the same input layout as [`postgres_row`]; a state
/// that a `TINYINT` column cannot hold is no row the store can read.
pub fn mysql_row(data: &[u8]) {
    sql_row(
        data,
        |token, fingerprint, state, payload, lease_left, retain_left| {
            let state = i8::try_from(state).ok()?;
            Some(idem_mysql::fuzzing::decode_columns(
                token,
                fingerprint,
                state,
                payload,
                lease_left,
                retain_left,
            ))
        },
    );
}

/// The columns a SQL store reads, decoded by `decode` (`None`: no row of
/// the store's table holds these values), then checked: refused as corrupt,
/// or read back exactly.
fn sql_row(
    data: &[u8],
    decode: impl FnOnce(
        &[u8],
        &[u8],
        i16,
        Vec<u8>,
        Option<i64>,
        i64,
    ) -> Option<Result<Record, StoreError>>,
) {
    let mut input = Reader(data);
    let columns = (|| {
        let token = input.short()?;
        let fingerprint = input.short()?;
        let state = input.i16()?;
        let payload = input.long()?;
        let has_lease = input.u8()? % 2 == 1;
        let lease_left = input.i64()?;
        let retain_left = input.i64()?;
        Some((
            token,
            fingerprint,
            state,
            payload,
            has_lease.then_some(lease_left),
            retain_left,
        ))
    })();
    let Some((token, fingerprint, state, payload, lease_left, retain_left)) = columns else {
        return;
    };
    // The store reads only live rows: the query keeps those with retention
    // left.
    if retain_left <= 0 {
        return;
    }
    let Some(decoded) = decode(
        token,
        fingerprint,
        state,
        payload.to_vec(),
        lease_left,
        retain_left,
    ) else {
        return;
    };
    let record = match decoded {
        Ok(record) => record,
        Err(error) => return assert_corrupt(&error),
    };
    assert_well_formed(&record);
    let micros = |left: Duration| i64::try_from(left.as_micros()).expect("read from an i64");
    assert_eq!(record.token.as_bytes(), token);
    assert_eq!(record.fingerprint.stored(), fingerprint);
    assert_eq!(i16::from(record.state.as_u8()), state);
    assert_eq!(record.payload, payload);
    assert_eq!(micros(record.retention_remaining), retain_left);
    if let Some(lease) = record.lease_remaining {
        // A missing or passed deadline reads as a lapsed lease.
        assert_eq!(micros(lease), lease_left.unwrap_or(0).max(0));
    }
}

/// Rows as the PostgreSQL store binds them, with their durations left.
pub(crate) fn postgres_seeds() -> Vec<Vec<u8>> {
    sql_seeds(idem_postgres::fuzzing::micros)
}

/// Rows as the MariaDB store binds them, with their durations left.
pub(crate) fn mysql_seeds() -> Vec<Vec<u8>> {
    sql_seeds(idem_mysql::fuzzing::micros)
}

fn sql_seeds(micros: fn(Duration) -> i64) -> Vec<Vec<u8>> {
    samples()
        .iter()
        .map(|record| {
            let mut input = Writer::default();
            input
                .short(record.token.as_bytes())
                .short(record.fingerprint.stored())
                .put(&i16::from(record.state.as_u8()).to_be_bytes())
                .long(record.payload)
                .put(&[u8::from(record.lease.is_some())])
                .put(&record.lease.map_or(0, micros).to_be_bytes())
                .put(&micros(record.retention).to_be_bytes());
            input.0
        })
        .collect()
}

// ----------------------------------------------------------------- SQLite

thread_local! {
    static SQLITE: RefCell<Option<Connection>> = const { RefCell::new(None) };
}

const KEY: &str = "fuzz";

const COLUMNS: &str = "token, fingerprint, state, payload, lease_until, retain_until";

/// The SQLite row, written into a real table (column affinities and
/// constraints apply) and read as the store reads it. Input: now (`i64`
/// unix microseconds), then six column values, each a type byte (null,
/// integer, real, text, blob) and its value.
pub fn sqlite_row(data: &[u8]) {
    let mut input = Reader(data);
    let Some(now) = input.i64() else { return };
    let mut values = Vec::with_capacity(6);
    for _ in 0..6 {
        let Some(value) = sql_value(&mut input) else {
            return;
        };
        values.push(value);
    }
    SQLITE.with(|cell| {
        let mut cell = cell.borrow_mut();
        let conn = cell.get_or_insert_with(|| idem_sqlite::fuzzing::open().expect("open"));
        let written = conn.execute(
            &format!("INSERT OR REPLACE INTO idem_records (key, {COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"),
            params![KEY, values[0], values[1], values[2], values[3], values[4], values[5]],
        );
        if written.is_err() {
            // A constraint of the table refused the row: no store reads it.
            return;
        }
        let stored: Vec<Value> = conn
            .query_row(
                &format!("SELECT {COLUMNS} FROM idem_records WHERE key = ?1"),
                [KEY],
                |row| (0..6).map(|i| row.get::<_, Value>(i)).collect(),
            )
            .expect("the row just written");
        match idem_sqlite::fuzzing::load(conn, KEY, now) {
            Ok(Some(record)) => check_sqlite(&record, &stored, now),
            Ok(None) => {}
            Err(error) => assert_corrupt(&error),
        }
    });
}

fn sql_value(input: &mut Reader<'_>) -> Option<Value> {
    Some(match input.u8()? % 5 {
        0 => Value::Null,
        1 => Value::Integer(input.i64()?),
        2 => Value::Real(f64::from_bits(input.u64()?)),
        3 => Value::Text(String::from_utf8_lossy(input.long()?).into_owned()),
        _ => Value::Blob(input.long()?.to_vec()),
    })
}

/// Re-encoded at `now`, the record is the row it was read from: its
/// deadlines `now` plus the time left, a passed or missing lease deadline
/// read as lapsed, a lease deadline on a finished record ignored.
fn check_sqlite(record: &Record, stored: &[Value], now: i64) {
    assert_well_formed(record);
    let micros = |left: Duration| i64::try_from(left.as_micros()).expect("fits");
    let deadline = |until: &Value, left: Duration| match until {
        Value::Integer(until) if *until > now => {
            assert_eq!(until.saturating_sub(now), micros(left), "{record:?}");
        }
        _ => assert!(
            left.is_zero(),
            "a passed or missing deadline leaves nothing: {record:?}"
        ),
    };
    let encoded = [
        Value::Blob(record.token.as_bytes().to_vec()),
        Value::Blob(record.fingerprint.stored().to_vec()),
        Value::Integer(record.state.as_u8().into()),
        Value::Blob(record.payload.clone()),
    ];
    assert_eq!(encoded, stored[..4], "{record:?}");
    match record.lease_remaining {
        Some(left) => deadline(&stored[4], left),
        // A finished record's stray lease deadline is ignored rather than
        // refused: refusing would lose an outcome the work produced.
        None => assert_ne!(record.state, State::InFlight),
    }
    deadline(&stored[5], record.retention_remaining);
}

/// Rows from the SQLite store's own insert, read back as they were written.
pub(crate) fn sqlite_seeds() -> Vec<Vec<u8>> {
    let conn = idem_sqlite::fuzzing::open().expect("open");
    let now = i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_micros(),
    )
    .expect("fits");
    samples()
        .iter()
        .enumerate()
        .map(|(i, record)| {
            let key = format!("seed-{i}");
            idem_sqlite::fuzzing::insert(&conn, &key, record).expect("insert");
            let stored: Vec<Value> = conn
                .query_row(
                    &format!("SELECT {COLUMNS} FROM idem_records WHERE key = ?1"),
                    [&key],
                    |row| (0..6).map(|i| row.get::<_, Value>(i)).collect(),
                )
                .expect("the row just written");
            let mut input = Writer::default();
            input.put(&now.to_be_bytes());
            for value in &stored {
                match value {
                    Value::Null => input.put(&[0]),
                    Value::Integer(n) => input.put(&[1]).put(&n.to_be_bytes()),
                    Value::Real(x) => input.put(&[2]).put(&x.to_bits().to_be_bytes()),
                    Value::Text(text) => input.put(&[3]).long(text.as_bytes()),
                    Value::Blob(bytes) => input.put(&[4]).long(bytes),
                };
            }
            input.0
        })
        .collect()
}
