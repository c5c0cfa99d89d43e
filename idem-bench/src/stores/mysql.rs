//! MariaDB: `MySqlStore` against its bare claim and complete statements on
//! the same sqlx pool, with round trips from the pool's own session
//! counters.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{Fingerprint, Idempotent, Store};
use idem_mysql::{raw, MySqlStore};
use sqlx::{Executor, Row};

use crate::bench::{Bench, Contestant, Counters, Kind};
use crate::fixture::{self, BoxError, LEASE, RETENTION};
use crate::protocols::IdemRow;
use crate::report::Report;
use crate::runner::{Outcome, Protocol};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The MariaDB rows and their shared pool.
pub(crate) struct MySqlBench {
    store: MySqlStore,
}

impl std::fmt::Debug for MySqlBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlBench")
            .field("table", &self.store.table())
            .finish_non_exhaustive()
    }
}

impl MySqlBench {
    /// Connects the store's pool (sqlx's defaults, as `connect` gives a
    /// user) and creates a table for this run.
    pub(crate) async fn connect(url: &str, tag: &str) -> Result<MySqlBench, BoxError> {
        let store = tokio::time::timeout(CONNECT_TIMEOUT, MySqlStore::connect(url))
            .await
            .map_err(|_| "no answer within 5 s")??
            .with_table(&format!("idem_bench_{tag}"))?;
        store.migrate().await?;
        Ok(MySqlBench { store })
    }

    /// Prepared statements executed so far on every connection of the
    /// pool. The server is shared, so its global counters would count other
    /// clients too; each session's own `Com_stmt_execute` counts only this
    /// pool's statements, and the `SHOW` that reads it, sent as text, is
    /// not one of them.
    async fn read_counters(&self) -> Result<Counters, BoxError> {
        let pool = self.store.pool();
        let mut held = Vec::new();
        for _ in 0..pool.size() {
            match tokio::time::timeout(Duration::from_millis(200), pool.acquire()).await {
                Ok(conn) => held.push(conn?),
                Err(_) => break,
            }
        }
        let mut total = 0_u64;
        for conn in &mut held {
            // A bare string goes as text, not as a prepared statement.
            let row = (&mut **conn)
                .fetch_one("SHOW SESSION STATUS LIKE 'Com_stmt_execute'")
                .await?;
            let value: String = row.try_get(1)?;
            total += value.parse::<u64>()?;
        }
        Ok(Counters::from([("stmt".to_owned(), total)]))
    }
}

#[async_trait]
impl Bench for MySqlBench {
    fn store(&self) -> &'static str {
        "mysql"
    }

    fn contestants(&self) -> Vec<Contestant> {
        let raw: Arc<dyn Protocol> = Arc::new(Raw {
            store: self.store.clone(),
            fingerprint: fixture::fingerprint(),
            payload: fixture::outcome_payload(),
        });
        let store: Arc<dyn Store> = Arc::new(self.store.clone());
        let idem: Arc<dyn Protocol> = Arc::new(IdemRow::new(Idempotent::from_arc(store)));
        let statements = |d: &Counters| d.get("stmt").copied().unwrap_or(0);
        vec![
            Contestant {
                kind: Kind::Raw,
                make: Box::new(move || raw.clone()),
                fresh: false,
                round_trips: statements,
            },
            Contestant {
                kind: Kind::Idem,
                make: Box::new(move || idem.clone()),
                fresh: false,
                round_trips: statements,
            },
        ]
    }

    async fn tidy(&self) -> Result<(), BoxError> {
        Ok(())
    }

    async fn counters(&self) -> Result<Option<Counters>, BoxError> {
        Ok(self.read_counters().await.ok())
    }

    async fn finish(&self, _report: &mut Report) -> Result<(), BoxError> {
        let table = self.store.table();
        // The name was built by this harness and validated by the store.
        sqlx::raw_sql(&format!("DROP TABLE IF EXISTS `{table}`"))
            .execute(self.store.pool())
            .await?;
        Ok(())
    }
}

/// The store's own claim and complete statements, bare (the helper
/// idem-mysql keeps for this comparison).
struct Raw {
    store: MySqlStore,
    fingerprint: Fingerprint,
    payload: Vec<u8>,
}

#[async_trait]
impl Protocol for Raw {
    async fn op(&self, key: &str) -> Result<Outcome, BoxError> {
        let token = fixture::token();
        let (token, fingerprint) = (token.as_bytes(), self.fingerprint.as_bytes());
        match raw::claim(&self.store, key, token, fingerprint, LEASE, RETENTION).await? {
            raw::Claimed::Inserted => {
                let done = raw::complete(
                    &self.store,
                    key,
                    token,
                    fingerprint,
                    &self.payload,
                    RETENTION,
                )
                .await?;
                if done {
                    Ok(Outcome::Ran)
                } else {
                    Err("raw completion lost its claim".into())
                }
            }
            raw::Claimed::Found { state: 0, .. } => Ok(Outcome::InProgress),
            raw::Claimed::Found { .. } => Ok(Outcome::Replayed),
        }
    }
}
