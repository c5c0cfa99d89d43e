//! Guards that clean up what a test made on a shared server when dropped:
//! never a flush or a wipe, only what the test named.

use std::error::Error;
use std::fmt;
use std::time::Duration;

type Job = Box<dyn FnOnce() -> Result<(), Box<dyn Error + Send + Sync>> + Send + Sync>;

/// Runs its cleanup when dropped, on a thread of its own (`Drop` cannot
/// await, and blocking the test's runtime from inside it would deadlock).
/// A cleanup that fails is printed, never a panic: it must not turn a
/// passing test into a failing one.
#[must_use = "the cleanup runs when the guard is dropped"]
pub struct Cleanup {
    what: String,
    job: Option<Job>,
}

impl fmt::Debug for Cleanup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cleanup").field("what", &self.what).finish()
    }
}

impl Cleanup {
    /// Runs `job` when dropped; `what` names it in a failure message.
    pub fn new(
        what: impl Into<String>,
        job: impl FnOnce() -> Result<(), Box<dyn Error + Send + Sync>> + Send + Sync + 'static,
    ) -> Cleanup {
        Cleanup {
            what: what.into(),
            job: Some(Box::new(job)),
        }
    }

    /// Does nothing: for stores with nothing to clean up.
    pub fn none() -> Cleanup {
        Cleanup {
            what: "nothing".to_owned(),
            job: None,
        }
    }

    /// Keeps `value` alive as long as the guard, and drops it with it (a
    /// temporary directory, say).
    pub fn holding<T: Send + Sync + 'static>(value: T) -> Cleanup {
        Cleanup::new("a held value", move || {
            drop(value);
            Ok(())
        })
    }

    /// Deletes every key under `prefix` on the Redis at `url`.
    pub fn redis_prefix(url: &str, prefix: &str) -> Cleanup {
        let (url, prefix) = (url.to_owned(), prefix.to_owned());
        Cleanup::new(format!("delete Redis keys {prefix}*"), move || {
            use redis::Commands;
            let client = redis::Client::open(url.as_str())?;
            let mut connection = client.get_connection_with_timeout(Duration::from_secs(2))?;
            let keys: Vec<Vec<u8>> = connection
                .scan_match::<_, Vec<u8>>(format!("{prefix}*"))?
                .collect::<Result<_, _>>()?;
            for batch in keys.chunks(500) {
                connection.del::<_, ()>(batch)?;
            }
            Ok(())
        })
    }

    /// Runs `statement` (a `DROP TABLE …`) on the PostgreSQL at `url`.
    pub fn postgres(url: &str, statement: String) -> Cleanup {
        let url = url.to_owned();
        Cleanup::new(statement.clone(), move || {
            use sqlx::Connection;
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                let mut conn = sqlx::PgConnection::connect(&url).await?;
                // Separate messages: DROP DATABASE refuses to run in the
                // implicit transaction of a multi-statement message.
                sqlx::raw_sql("SET lock_timeout = '10s'")
                    .execute(&mut conn)
                    .await?;
                sqlx::raw_sql(&statement).execute(&mut conn).await?;
                conn.close().await
            })?;
            Ok(())
        })
    }
}

impl Cleanup {
    /// Runs `statement` on the MariaDB server at `url` when dropped.
    pub fn mysql(url: &str, statement: String) -> Cleanup {
        let url = url.to_owned();
        Cleanup::new(statement.clone(), move || {
            use sqlx::Connection;
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                let mut conn = sqlx::MySqlConnection::connect(&url).await?;
                sqlx::raw_sql("SET SESSION lock_wait_timeout = 10")
                    .execute(&mut conn)
                    .await?;
                sqlx::raw_sql(&statement).execute(&mut conn).await?;
                conn.close().await
            })?;
            Ok(())
        })
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let Some(job) = self.job.take() else { return };
        match std::thread::spawn(job).join() {
            Ok(Ok(())) => {}
            Ok(Err(error)) => eprintln!("cleanup `{}` failed: {error}", self.what),
            Err(_) => eprintln!("cleanup `{}` panicked", self.what),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn the_job_runs_once_on_drop_and_a_failure_is_not_a_panic() {
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&runs);
        let guard = Cleanup::new("count", move || {
            counted.fetch_add(1, Ordering::SeqCst);
            Err("the server is gone".into())
        });
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        drop(guard);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        drop(Cleanup::none());
    }
}
