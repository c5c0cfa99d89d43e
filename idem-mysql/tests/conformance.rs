//! The whole conformance kit against the real MariaDB at `IDEM_MYSQL_URL`,
//! each case on a fresh table of its own that is dropped when the case
//! ends.

mod support;

use idem_conformance::Fixture;

/// A store on a new, migrated table, with a small pool of its own: every
/// case runs on its own tokio runtime, and a sqlx connection cannot outlive
/// the runtime that opened it, so pools are not shared between cases.
///
/// The kit's cases cannot skip one by one, so an unreachable server skips
/// the whole binary with the reason printed (and fails it under `CI`).
async fn factory() -> Fixture {
    idem_testing::Server::MySql.require_for_binary();
    let Some(pool) = support::pool(8).await else {
        panic!("MariaDB answers but refuses a pool; see the message above");
    };
    let (store, guard) = support::store_in(pool).await;
    Fixture::new(store, guard)
}

idem_conformance::store_tests!(factory);

/// The whole kit again, through a near cache in front of the store.
mod near_cache {
    async fn factory() -> idem_conformance::Fixture {
        super::factory().await.with_near_cache()
    }

    idem_conformance::store_tests!(factory);
}
