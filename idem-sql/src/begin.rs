//! Beginning a transaction so that a cancelled caller cannot leave it open
//! on a pooled connection.

use sqlx::{Database, Pool, Transaction};

/// Begins a transaction on `pool`, as `pool.begin()` does, but in a task of
/// its own, so that the caller's future may be dropped at any point.
///
/// Why: sqlx 0.8 counts a connection's transaction only once the server has
/// answered its `BEGIN`. A `pool.begin()` future dropped while that answer
/// is on its way — a worker shut down, a request whose client went away —
/// sends no `ROLLBACK`, and the connection goes back to the pool inside an
/// open transaction: every later statement on it joins that transaction,
/// never commits, and holds its locks until the connection closes. Here the
/// `BEGIN` completes in its own task whatever happens to the caller; a
/// transaction nobody takes any more is dropped there, counted, and so
/// rolled back before its connection is used again.
///
/// Must be called within a tokio runtime.
pub async fn begin<DB: Database>(pool: &Pool<DB>) -> Result<Transaction<'static, DB>, sqlx::Error> {
    let pool = pool.clone();
    match tokio::spawn(async move { pool.begin().await }).await {
        Ok(begun) => begun,
        Err(join) => Err(sqlx::Error::Io(std::io::Error::other(format!(
            "beginning a transaction failed: {join}"
        )))),
    }
}
