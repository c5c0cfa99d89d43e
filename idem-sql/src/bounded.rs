//! One statement on a connection of the pool, bounded in time, and a
//! connection that did not answer closed rather than given back.
//!
//! A pool takes back a connection whose statement was abandoned (timed out
//! or cancelled) only after a ping on it answers; on a half-open
//! connection (requests arrive, no reply ever comes back) that ping waits
//! forever and holds the connection's place, so a few stalls would empty
//! the pool for good. A connection abandoned here is detached instead: its
//! socket is closed and the pool opens a new one in its place.

use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::Database;

/// Runs one statement on a connection of a pool, waiting for the
/// connection and for the answer together at most a timeout, after which
/// the call fails with a timed-out I/O error and the connection is closed.
/// A call dropped while it waits closes the connection too.
///
/// `bounded!(pool, timeout, |connection| future)`: `future` is the
/// statement's future on `connection` (a `&mut` connection), not awaited.
/// A macro rather than a function taking a closure: the statement's
/// future borrows the connection, which a closure can only express with a
/// higher-ranked bound that defeats the `Send` checks of the callers.
#[macro_export]
macro_rules! bounded {
    ($pool:expr, $timeout:expr, |$connection:ident| $statement:expr) => {{
        let timeout: ::std::time::Duration = $timeout;
        let deadline = $crate::__private::tokio::time::Instant::now() + timeout;
        match $crate::__private::tokio::time::timeout_at(deadline, $pool.acquire()).await {
            Err(_) => Err($crate::bounded::timed_out(timeout, false)),
            Ok(Err(error)) => Err(error),
            Ok(Ok(connection)) => {
                let mut held = $crate::bounded::Held::new(connection);
                let answer = {
                    let $connection = held.connection();
                    $crate::__private::tokio::time::timeout_at(deadline, $statement).await
                };
                match answer {
                    Ok(answer) => {
                        held.give_back();
                        answer
                    }
                    Err(_) => Err($crate::bounded::timed_out(timeout, true)),
                }
            }
        }
    }};
}

/// A connection checked out for one statement: given back when the
/// statement answered, detached and closed when dropped before.
#[doc(hidden)]
#[derive(Debug)]
pub struct Held<DB: Database>(Option<PoolConnection<DB>>);

impl<DB: Database> Held<DB> {
    #[doc(hidden)]
    pub fn new(connection: PoolConnection<DB>) -> Held<DB> {
        Held(Some(connection))
    }

    /// The connection.
    #[doc(hidden)]
    pub fn connection(&mut self) -> &mut DB::Connection {
        match self.0.as_mut() {
            Some(connection) => connection,
            None => unreachable!("a held connection is given back only by value"),
        }
    }

    /// Gives the connection back to the pool, which closes it if an error
    /// broke it.
    #[doc(hidden)]
    pub fn give_back(mut self) {
        drop(self.0.take());
    }
}

impl<DB: Database> Drop for Held<DB> {
    fn drop(&mut self) {
        if let Some(connection) = self.0.take() {
            drop(connection.detach());
        }
    }
}

/// The error of a statement that ran out of time: waiting for a
/// connection (nothing was sent) or for the answer (`sent`: the statement
/// may or may not have been applied).
#[doc(hidden)]
pub fn timed_out(timeout: Duration, sent: bool) -> sqlx::Error {
    let what = if sent {
        "for the answer; the connection is closed and the statement may or may not have been applied"
    } else {
        "for a connection; nothing was sent"
    };
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("waited {timeout:?} {what}"),
    ))
}
