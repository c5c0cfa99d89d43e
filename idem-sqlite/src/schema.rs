//! Opening the connection, its settings, and the one table the store keeps.

use std::path::PathBuf;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use crate::error::Failure;
use crate::writer::Settings;
use crate::Synchronous;

/// The table, its columns as `PRAGMA table_info` reports them (name,
/// declared type, NOT NULL, position in the primary key), and its index.
///
/// STRICT makes SQLite refuse a value of the wrong type, so a row can only
/// go bad in ways the decoder checks for (token length, state code).
/// Deadlines are unix microseconds. No `WITHOUT ROWID`: payloads may be
/// several MiB, and such tables suit small rows only.
const TABLE: &str = "idem_records";
const CREATE: &str = "
    CREATE TABLE IF NOT EXISTS idem_records (
        key          TEXT PRIMARY KEY NOT NULL,
        token        BLOB NOT NULL,
        fingerprint  BLOB NOT NULL,
        state        INTEGER NOT NULL,
        payload      BLOB NOT NULL,
        lease_until  INTEGER,
        retain_until INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX IF NOT EXISTS idem_records_retain_until ON idem_records (retain_until);";
const COLUMNS: [(&str, &str, bool, i64); 7] = [
    ("key", "TEXT", true, 1),
    ("token", "BLOB", true, 0),
    ("fingerprint", "BLOB", true, 0),
    ("state", "INTEGER", true, 0),
    ("payload", "BLOB", true, 0),
    ("lease_until", "INTEGER", false, 0),
    ("retain_until", "INTEGER", true, 0),
];

/// Where the database lives.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    File(PathBuf),
    Memory,
}

impl Target {
    fn describe(&self) -> String {
        match self {
            Target::File(path) => path.display().to_string(),
            Target::Memory => ":memory:".to_owned(),
        }
    }
}

/// Opens the writer's connection in WAL mode with the given settings.
pub(crate) fn connect(target: &Target, settings: &Settings) -> Result<Connection, Failure> {
    let busy_timeout = settings.busy_timeout;
    let name = target.describe();
    let opening = |error| Failure::opening(&name, error, busy_timeout);
    // No URI flag: a path is a path, even one that starts with `file:`.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = match target {
        Target::File(path) => Connection::open_with_flags(path, flags),
        Target::Memory => Connection::open_in_memory_with_flags(flags),
    }
    .map_err(opening)?;
    conn.busy_timeout(busy_timeout).map_err(opening)?;
    // The first statement reads the file header: a file that is not a
    // database fails here.
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(opening)?;
    if matches!(target, Target::File(_)) && !mode.eq_ignore_ascii_case("wal") {
        return Err(Failure::Setting {
            what: format!("{name} stays in {mode} journal mode instead of WAL"),
            source: None,
        });
    }
    set_synchronous(&conn, settings.synchronous)?;
    set_cache_size(&conn, settings.cache_bytes)?;
    conn.set_prepared_statement_cache_capacity(16);
    Ok(conn)
}

pub(crate) fn set_synchronous(conn: &Connection, synchronous: Synchronous) -> Result<(), Failure> {
    let value = match synchronous {
        Synchronous::Full => "FULL",
        Synchronous::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", value)
        .map_err(|error| Failure::Setting {
            what: format!("PRAGMA synchronous = {value}"),
            source: Some(std::sync::Arc::new(error)),
        })
}

/// Sizes the connection's page cache: `PRAGMA cache_size` in KiB (a
/// negative value), at least 1 KiB.
pub(crate) fn set_cache_size(conn: &Connection, bytes: usize) -> Result<(), Failure> {
    let kib = i64::try_from(bytes / 1024).unwrap_or(i64::MAX).max(1);
    conn.pragma_update(None, "cache_size", -kib)
        .map_err(|error| Failure::Setting {
            what: format!("PRAGMA cache_size = -{kib}"),
            source: Some(std::sync::Arc::new(error)),
        })
}

/// Sets how much of the file SQLite may map into memory
/// (`PRAGMA mmap_size`; 0 turns mapping off).
pub(crate) fn set_mmap_size(conn: &Connection, bytes: u64) -> Result<(), Failure> {
    let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
    conn.pragma_update(None, "mmap_size", bytes)
        .map_err(|error| Failure::Setting {
            what: format!("PRAGMA mmap_size = {bytes}"),
            source: Some(std::sync::Arc::new(error)),
        })
}

/// Creates the table and its index unless they exist, and refuses a table
/// of the same name that is not the store's. Idempotent.
pub(crate) fn migrate(conn: &Connection, busy_timeout: Duration) -> Result<(), Failure> {
    let sqlite = |error| Failure::from_sqlite(error, busy_timeout);
    conn.execute_batch("BEGIN IMMEDIATE").map_err(sqlite)?;
    let outcome = check(conn, busy_timeout)
        .and_then(|()| conn.execute_batch(CREATE).map_err(sqlite))
        .and_then(|()| conn.execute_batch("COMMIT").map_err(sqlite));
    if outcome.is_err() && !conn.is_autocommit() {
        // The error above is what the caller needs; a failed rollback adds
        // nothing to it.
        let _ = conn.execute_batch("ROLLBACK");
    }
    outcome
}

/// Compares an existing table of the store's name with the schema.
fn check(conn: &Connection, busy_timeout: Duration) -> Result<(), Failure> {
    let sqlite = |error| Failure::from_sqlite(error, busy_timeout);
    let listed = conn
        .query_row(
            "SELECT type, strict FROM pragma_table_list WHERE schema = 'main' AND name = ?1",
            [TABLE],
            |row| Ok((row.get::<_, String>(0)?, row.get::<_, bool>(1)?)),
        )
        .map(Some)
        .or_else(|error| match error {
            rusqlite::Error::QueryReturnedNoRows => Ok(None),
            other => Err(other),
        })
        .map_err(sqlite)?;
    let Some((kind, strict)) = listed else {
        return Ok(());
    };

    let mut statement = conn
        .prepare("SELECT name, type, \"notnull\", pk FROM pragma_table_info(?1) ORDER BY cid")
        .map_err(sqlite)?;
    let found = statement
        .query_map([TABLE], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, bool>(2)?,
                row.get::<_, i64>(3)?,
            ))
        })
        .and_then(Iterator::collect::<rusqlite::Result<Vec<_>>>)
        .map_err(sqlite)?;

    let matches = kind == "table"
        && strict
        && found.len() == COLUMNS.len()
        && found.iter().zip(COLUMNS).all(|(have, want)| {
            have.0 == want.0
                && have.1.eq_ignore_ascii_case(want.1)
                && have.2 == want.2
                && have.3 == want.3
        });
    if matches {
        return Ok(());
    }
    let columns = found
        .iter()
        .map(|(name, ty, _, _)| format!("{name} {ty}"))
        .collect::<Vec<_>>()
        .join(", ");
    Err(Failure::ForeignSchema {
        table: TABLE,
        found: format!(
            "a {}{kind} with columns ({columns})",
            if strict { "STRICT " } else { "" }
        ),
    })
}
