//! The whole conformance kit against the real MariaDB at `IDEM_MYSQL_URL`,
//! each case on a fresh table of its own that is dropped when the case
//! ends.

mod support;

use idem_conformance::Fixture;

/// A store on a new, migrated table, with a small pool of its own: every
/// case runs on its own tokio runtime, and a sqlx connection cannot outlive
/// the runtime that opened it, so pools are not shared between cases.
async fn factory() -> Fixture {
    let Some(pool) = support::pool(8).await else {
        // The kit has no way to skip a case; say why every case fails.
        panic!(
            "MariaDB at {} is unreachable; set IDEM_MYSQL_URL",
            support::url()
        );
    };
    let (store, guard) = support::store_in(pool).await;
    Fixture::new(store, guard)
}

idem_conformance::store_tests!(factory);
