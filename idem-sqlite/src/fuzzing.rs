//! Entry points for the fuzz targets in `idem-fuzz`; not a stable API.

use std::time::Duration;

use idem_core::store::{NewRecord, Record, StoreError};
use rusqlite::Connection;

use crate::error::Failure;
use crate::ops::{Done, Op, OpError, Owned};

/// An in-memory database with the store's table.
pub fn open() -> Result<Connection, StoreError> {
    let conn = Connection::open_in_memory()
        .map_err(|error| Failure::Sqlite(error.into()).into_store_error())?;
    crate::schema::migrate(&conn, Duration::from_secs(1)).map_err(Failure::into_store_error)?;
    Ok(conn)
}

/// Writes `record` under `key` as the store's insert does.
pub fn insert(conn: &Connection, key: &str, record: &NewRecord<'_>) -> Result<(), StoreError> {
    let op = Op::Insert {
        key: key.to_owned(),
        record: Owned::from(record),
    };
    op.run(conn).map(|_: Done| ()).map_err(store_error)
}

/// Reads the live record under `key` at `now` (unix microseconds) as the
/// store reads every record: `Ok(None)` when there is none.
pub fn load(conn: &Connection, key: &str, now: i64) -> Result<Option<Record>, StoreError> {
    crate::ops::load(conn, key, now).map_err(store_error)
}

fn store_error(error: OpError) -> StoreError {
    match error {
        OpError::Statement(error) => Failure::Sqlite(error.into()).into_store_error(),
        OpError::Bad(failure) => failure.into_store_error(),
    }
}
