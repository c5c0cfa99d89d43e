//! The whole conformance kit against SqliteStore, each case on a fresh
//! temporary file.

use idem_conformance::Fixture;
use idem_sqlite::SqliteStore;

async fn factory() -> Fixture {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("idem.db");
    let store = SqliteStore::open(&path).await.expect("a new file opens");
    // The directory, and the file in it, go when the case is over.
    Fixture::new(store, dir).with_stored_count(move || {
        let path = path.clone();
        // Straight from the file, on a connection of its own: through the
        // store an expired row looks absent whether a purge deleted it or
        // not.
        async move {
            let conn = rusqlite::Connection::open_with_flags(
                &path,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
            )
            .expect("the store's file opens to read");
            let rows: i64 = conn
                .query_row("SELECT count(*) FROM idem_records", [], |row| row.get(0))
                .expect("the records table counts");
            usize::try_from(rows).expect("a row count is never negative")
        }
    })
}

idem_conformance::store_tests!(factory);

/// The whole kit again, through a near cache in front of the store.
mod near_cache {
    async fn factory() -> idem_conformance::Fixture {
        super::factory().await.with_near_cache()
    }

    idem_conformance::store_tests!(factory);
}
