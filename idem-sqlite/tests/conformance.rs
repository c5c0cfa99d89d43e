//! The whole conformance kit against SqliteStore, each case on a fresh
//! temporary file.

use idem_conformance::Fixture;
use idem_sqlite::SqliteStore;

async fn factory() -> Fixture {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = SqliteStore::open(dir.path().join("idem.db"))
        .await
        .expect("a new file opens");
    // The directory, and the file in it, go when the case is over.
    Fixture::new(store, dir)
}

idem_conformance::store_tests!(factory);

/// The whole kit again, through a near cache in front of the store.
mod near_cache {
    async fn factory() -> idem_conformance::Fixture {
        super::factory().await.with_near_cache()
    }

    idem_conformance::store_tests!(factory);
}
