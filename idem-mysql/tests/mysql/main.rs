//! MariaDB-specific tests of `MySqlStore`, against the real server at
//! `IDEM_MYSQL_URL`: races and lock queues the claim statement must
//! survive, round trips counted by the server, names, corrupt rows, pools
//! and killed connections.

#[path = "../support/mod.rs"]
mod support;

mod names_and_rows;
mod pools_and_faults;
mod races;
mod round_trips;
mod tx;

use std::time::Duration;

use idem_mysql::sqlx::{self, MySqlConnection};

pub(crate) use idem_testing::races::{in_flight, MINUTE};

/// The connection ids of transactions waiting on a lock whose statement
/// mentions `table`, as InnoDB reports them.
pub(crate) async fn lock_waiters(conn: &mut MySqlConnection, table: &str) -> Vec<u64> {
    sqlx::query_scalar(
        "SELECT trx_mysql_thread_id FROM information_schema.INNODB_TRX \
         WHERE trx_state = 'LOCK WAIT' AND LOCATE(?, trx_query) > 0",
    )
    .bind(table)
    .fetch_all(&mut *conn)
    .await
    .unwrap()
}

/// Waits until a statement on `table` is blocked on a lock, and returns the
/// id of its connection.
pub(crate) async fn until_waiting(conn: &mut MySqlConnection, table: &str) -> u64 {
    // InnoDB refreshes what INNODB_TRX shows only when it was last read
    // more than 0.1 s ago, so faster polling would read a stale copy forever.
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        if let Some(id) = lock_waiters(conn, table).await.first() {
            return *id;
        }
    }
    panic!("no statement on {table} ever waited on a lock");
}
