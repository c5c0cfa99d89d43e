//! MariaDB: `MySqlStore` against its bare claim and complete statements on
//! the same sqlx pool, with round trips from the pool's own session
//! counters.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::store::Store;
use idem_core::{Fingerprint, Idempotent};
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
        sqlx::raw_sql(&format!(
            "CREATE TABLE IF NOT EXISTS `idem_bench_{tag}_charges` \
             (`key` VARBINARY(1024) NOT NULL, amount BIGINT NOT NULL) ENGINE = InnoDB"
        ))
        .execute(store.pool())
        .await?;
        Ok(MySqlBench { store })
    }

    /// Statements executed so far on every connection of the pool: the
    /// prepared ones, and the `BEGIN`/`COMMIT`/`ROLLBACK` sqlx sends as
    /// text for a transaction. The server is shared, so its global counters
    /// would count other clients too; each session's own `Com_*` counters
    /// count only this pool's statements, and the `SHOW` that reads them is
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
            let rows = (&mut **conn)
                .fetch_all(
                    "SHOW SESSION STATUS WHERE Variable_name IN \
                     ('Com_stmt_execute', 'Com_begin', 'Com_commit', 'Com_rollback')",
                )
                .await?;
            for row in rows {
                let value: String = row.try_get(1)?;
                total += value.parse::<u64>()?;
            }
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
        let idem: Arc<dyn Protocol> = Arc::new(IdemRow::new(Idempotent::from_arc(store.clone())));
        let insert = format!(
            "INSERT INTO `{}_charges` (`key`, amount) VALUES (?, ?)",
            self.store.table()
        );
        let raw_tx: Arc<dyn Protocol> = Arc::new(RawTx {
            store: self.store.clone(),
            fingerprint: fixture::fingerprint(),
            payload: fixture::outcome_payload(),
            insert: insert.clone(),
        });
        let idem_tx: Arc<dyn Protocol> = Arc::new(IdemTx {
            store: self.store.clone(),
            idem: Idempotent::from_arc(store).with_retention(RETENTION),
            body: fixture::Order::sample(),
            outcome: fixture::outcome(),
            insert,
        });
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
            Contestant {
                kind: Kind::RawTx,
                make: Box::new(move || raw_tx.clone()),
                fresh: false,
                round_trips: statements,
            },
            Contestant {
                kind: Kind::IdemTx,
                make: Box::new(move || idem_tx.clone()),
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
        sqlx::raw_sql(&format!(
            "DROP TABLE IF EXISTS `{table}`, `{table}_charges`"
        ))
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

/// The raw protocol with its effect in one transaction: the bare claim,
/// then `BEGIN`, a business insert, the bare token-conditioned complete,
/// `COMMIT`.
struct RawTx {
    store: MySqlStore,
    fingerprint: Fingerprint,
    payload: Vec<u8>,
    insert: String,
}

#[async_trait]
impl Protocol for RawTx {
    async fn op(&self, key: &str) -> Result<Outcome, BoxError> {
        let token = fixture::token();
        let (token, fingerprint) = (token.as_bytes(), self.fingerprint.as_bytes());
        match raw::claim(&self.store, key, token, fingerprint, LEASE, RETENTION).await? {
            raw::Claimed::Inserted => {
                let mut tx = self.store.pool().begin().await?;
                sqlx::query(&self.insert)
                    .bind(key)
                    .bind(1250_i64)
                    .execute(&mut *tx)
                    .await?;
                let done = raw::complete_in(
                    &mut tx,
                    &self.store,
                    key,
                    token,
                    fingerprint,
                    &self.payload,
                    RETENTION,
                )
                .await?;
                if !done {
                    return Err("raw completion lost its claim".into());
                }
                tx.commit().await?;
                Ok(Outcome::Ran)
            }
            raw::Claimed::Found { state: 0, .. } => Ok(Outcome::InProgress),
            raw::Claimed::Found { .. } => Ok(Outcome::Replayed),
        }
    }
}

/// `execute_in_tx` with the same business insert.
struct IdemTx {
    store: MySqlStore,
    idem: Idempotent,
    body: fixture::Order,
    outcome: String,
    insert: String,
}

#[async_trait]
impl Protocol for IdemTx {
    async fn op(&self, key: &str) -> Result<Outcome, BoxError> {
        let ran = Arc::new(AtomicBool::new(false));
        let (flag, insert, outcome, key_row) = (
            Arc::clone(&ran),
            self.insert.clone(),
            self.outcome.clone(),
            key.to_owned(),
        );
        let result: Result<String, idem_core::Error<sqlx::Error>> = self
            .store
            .execute_in_tx(&self.idem, key, &self.body, move |tx| {
                Box::pin(async move {
                    flag.store(true, Ordering::Relaxed);
                    sqlx::query(&insert)
                        .bind(key_row)
                        .bind(1250_i64)
                        .execute(&mut *tx)
                        .await?;
                    Ok(outcome)
                })
            })
            .await;
        match result {
            Ok(_) if ran.load(Ordering::Relaxed) => Ok(Outcome::Ran),
            Ok(_) => Ok(Outcome::Replayed),
            Err(idem_core::Error::InProgress { .. }) => Ok(Outcome::InProgress),
            Err(error) => Err(error.into()),
        }
    }
}
