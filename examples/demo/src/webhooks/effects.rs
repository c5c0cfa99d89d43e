//! Where the webhooks demo's handler makes its effect: a row in a table of
//! the idempotency store's own database, written in the same transaction
//! as the outcome recorded for the event.
//!
//! The table has no unique constraint on the event: a second row for an
//! event would be a repeated effect, and the demo counts them. What keeps
//! it at one is `execute_in_tx` — the row and the record commit together,
//! so a worker killed at any moment leaves both or neither.

use std::path::PathBuf;
use std::time::Duration;

use idem_core::store::StoreError;
use idem_core::{Error, Idempotent};
use idem_inbox::worker::event_key;
use idem_inbox::Event;
use idem_postgres::PostgresStore;
use idem_sqlite::SqliteStore;
use sha2::{Digest, Sha256};

const EFFECTS: &str = "idem_demo_webhook_effects";

/// The namespace of the effect's own record, apart from the worker's.
const EFFECT_NAMESPACE: &str = "idem-demo-webhook-effects";

/// The effects table, in the store's database.
#[derive(Debug, Clone)]
pub(crate) enum EffectBook {
    Sqlite { store: SqliteStore, path: PathBuf },
    Postgres(PostgresStore),
}

impl EffectBook {
    /// The store of `inbox`'s database, with the effects table created.
    pub(crate) async fn open(inbox: &crate::webhooks::InboxSpec) -> Result<EffectBook, StoreError> {
        let book = match inbox {
            crate::webhooks::InboxSpec::Sqlite(dir) => {
                let path = dir.join("effects.db");
                EffectBook::Sqlite {
                    store: SqliteStore::open(&path).await?,
                    path,
                }
            }
            crate::webhooks::InboxSpec::Postgres(url) => {
                let store = PostgresStore::connect(url).await?;
                store.migrate().await?;
                EffectBook::Postgres(store)
            }
        };
        let create = |serial: &str| {
            format!(
                "CREATE TABLE IF NOT EXISTS {EFFECTS} (seq {serial} PRIMARY KEY, \
                 source TEXT NOT NULL, event_id TEXT NOT NULL, attempt INTEGER NOT NULL)"
            )
        };
        match &book {
            EffectBook::Sqlite { path, .. } => {
                let (path, create) = (path.clone(), create("INTEGER"));
                blocking(move || {
                    let conn = rusqlite::Connection::open(&path)?;
                    conn.busy_timeout(Duration::from_secs(10))?;
                    conn.execute_batch(&create)
                })
                .await?;
            }
            EffectBook::Postgres(store) => {
                // Under an advisory lock: a worker child and its parent may
                // start at once and race on the catalog.
                sqlx::raw_sql(&format!(
                    "SELECT pg_advisory_xact_lock(hashtextextended('{EFFECTS}', 0)); {}",
                    create("bigserial")
                ))
                .execute(store.pool())
                .await
                .map_err(|e| StoreError::backend("postgres", e))?;
            }
        }
        Ok(book)
    }

    /// The idempotency front of this database, for the worker.
    pub(crate) fn idem(&self, lease: Duration) -> Idempotent {
        let idem = match self {
            EffectBook::Sqlite { store, .. } => Idempotent::new(store.clone()),
            EffectBook::Postgres(store) => Idempotent::new(store.clone()),
        };
        idem.with_lease(lease)
    }

    /// Makes `event`'s effect once: the row and the outcome recorded for
    /// the event commit together; a replay makes no row.
    pub(crate) async fn make(&self, event: &Event, lease: Duration) -> Result<(), Error<String>> {
        let idem = self
            .idem(lease)
            .with_namespace(EFFECT_NAMESPACE)
            .scoped(event.source.clone());
        let key = event_key(&event.id);
        let digest = hex(&Sha256::digest(&event.payload));
        let insert =
            format!("INSERT INTO {EFFECTS} (source, event_id, attempt) VALUES ($1, $2, $3)");
        let (source, id, attempt) = (
            event.source.clone(),
            event.id.clone(),
            i64::from(event.attempt),
        );
        match self {
            EffectBook::Sqlite { store, .. } => {
                store
                    .execute_in_batch(&idem, &key, &digest, move |conn| {
                        conn.execute(&insert, rusqlite::params![source, id, attempt])
                            .map(drop)
                            .map_err(|e| e.to_string())
                    })
                    .await
            }
            EffectBook::Postgres(store) => {
                store
                    .execute_in_tx(&idem, &key, &digest, move |tx| {
                        Box::pin(async move {
                            sqlx::query(&insert)
                                .bind(&source)
                                .bind(&id)
                                .bind(attempt)
                                .execute(&mut *tx)
                                .await
                                .map(drop)
                                .map_err(|e| e.to_string())
                        })
                    })
                    .await
            }
        }
    }

    /// How many effect rows each event of `source` has.
    pub(crate) async fn counts(
        &self,
        source: &str,
    ) -> Result<std::collections::HashMap<String, u64>, StoreError> {
        let select =
            format!("SELECT event_id, COUNT(*) FROM {EFFECTS} WHERE source = $1 GROUP BY event_id");
        let rows: Vec<(String, i64)> = match self {
            EffectBook::Sqlite { path, .. } => {
                let (path, source) = (path.clone(), source.to_owned());
                blocking(move || {
                    let conn = rusqlite::Connection::open(&path)?;
                    conn.busy_timeout(Duration::from_secs(10))?;
                    let mut statement = conn.prepare(&select)?;
                    let rows =
                        statement.query_map([source], |row| Ok((row.get(0)?, row.get(1)?)))?;
                    rows.collect()
                })
                .await?
            }
            EffectBook::Postgres(store) => sqlx::query_as(&select)
                .bind(source)
                .fetch_all(store.pool())
                .await
                .map_err(|e| StoreError::backend("postgres", e))?,
        };
        Ok(rows
            .into_iter()
            .map(|(id, n)| (id, u64::try_from(n).unwrap_or(0)))
            .collect())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> rusqlite::Result<T> + Send + 'static,
) -> Result<T, StoreError> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result.map_err(|e| StoreError::backend("sqlite", e)),
        Err(join) => Err(StoreError::backend("sqlite", join.to_string())),
    }
}
