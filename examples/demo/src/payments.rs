//! Charges kept in the store's own database, written in the same
//! transaction as the idempotency record: the payments API on SQLite,
//! PostgreSQL and MariaDB.
//!
//! A charge and the outcome recorded for its key commit together
//! (`execute_in_tx`), so a server killed at any moment leaves both or
//! neither: a retry then replays the charge, or makes it for the first
//! time. `GET /payments` reads the table, so the ledger outlives restarts.
//! On Redis and in memory the charge cannot share a transaction with the
//! record; there the simulated gateway deduplicates on a key derived from
//! the payment's key instead (see [`Gateway`](crate::Gateway)).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::store::{StoreKind, StoreSpec};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idem_core::store::{Store, StoreError};
use idem_core::{Error, Idempotent};
use idem_mysql::MySqlStore;
use idem_postgres::PostgresStore;
use idem_sqlite::SqliteStore;

use crate::app::{self, parse_payment, problem, PaymentRequest, IDEMPOTENT_REPLAYED, NAMESPACE};
use crate::ledger::Charge;

const CHARGES: &str = "idem_demo_charges";

/// Where charges are kept when they live in the store's database.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum ChargeBook {
    /// The SQLite file of the store.
    Sqlite {
        /// The store, whose writer runs each charge in its transaction.
        store: SqliteStore,
        /// The file, read by `GET /payments` through a connection of its
        /// own.
        path: PathBuf,
    },
    /// The PostgreSQL database of the store.
    Postgres(PostgresStore),
    /// The MariaDB database of the store.
    MySql(MySqlStore),
}

impl ChargeBook {
    /// Creates the charges table if it is missing.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        match self {
            ChargeBook::Sqlite { path, .. } => {
                let path = path.clone();
                sqlite_blocking(move || {
                    let conn = rusqlite::Connection::open(&path)?;
                    conn.busy_timeout(Duration::from_secs(5))?;
                    conn.execute_batch(&format!(
                        "CREATE TABLE IF NOT EXISTS {CHARGES} (seq INTEGER PRIMARY KEY, \
                         id TEXT NOT NULL, idempotency_key TEXT NOT NULL, amount INTEGER NOT NULL, \
                         currency TEXT NOT NULL, created_at TEXT NOT NULL)"
                    ))
                })
                .await
            }
            ChargeBook::Postgres(store) => {
                // Under an advisory lock: two servers starting at once
                // would otherwise race on the catalog.
                sqlx::raw_sql(&format!(
                    "SELECT pg_advisory_xact_lock(hashtextextended('{CHARGES}', 0)); \
                     CREATE TABLE IF NOT EXISTS {CHARGES} (seq bigserial PRIMARY KEY, \
                     id text NOT NULL, idempotency_key text NOT NULL, amount int8 NOT NULL, \
                     currency text NOT NULL, created_at text NOT NULL)"
                ))
                .execute(store.pool())
                .await
                .map(drop)
                .map_err(|e| StoreError::backend("postgres", e))
            }
            ChargeBook::MySql(store) => {
                // One `CREATE TABLE IF NOT EXISTS`: MariaDB serializes it
                // on the table's metadata lock, so servers starting at once
                // do not race. InnoDB, so the charge rolls back with its
                // transaction.
                sqlx::raw_sql(&format!(
                    "CREATE TABLE IF NOT EXISTS {CHARGES} (seq BIGINT AUTO_INCREMENT PRIMARY KEY, \
                     id VARCHAR(64) NOT NULL, idempotency_key VARCHAR(1024) NOT NULL, \
                     amount BIGINT NOT NULL, currency VARCHAR(16) NOT NULL, \
                     created_at VARCHAR(64) NOT NULL) ENGINE = InnoDB"
                ))
                .execute(store.pool())
                .await
                .map(drop)
                .map_err(|e| StoreError::backend("mysql", e))
            }
        }
    }

    /// The store the idempotency records are kept in.
    pub fn store(&self) -> Arc<dyn Store> {
        match self {
            ChargeBook::Sqlite { store, .. } => Arc::new(store.clone()),
            ChargeBook::Postgres(store) => Arc::new(store.clone()),
            ChargeBook::MySql(store) => Arc::new(store.clone()),
        }
    }

    /// Every charge made, oldest first.
    pub async fn charges(&self) -> Result<Vec<Charge>, StoreError> {
        let select = format!(
            "SELECT id, idempotency_key, amount, currency, created_at FROM {CHARGES} ORDER BY seq"
        );
        match self {
            ChargeBook::Sqlite { path, .. } => {
                let path = path.clone();
                sqlite_blocking(move || {
                    let conn = rusqlite::Connection::open(&path)?;
                    conn.busy_timeout(Duration::from_secs(5))?;
                    let mut rows = conn.prepare(&select)?;
                    let charges = rows.query_map([], |row| {
                        Ok(Charge {
                            id: row.get(0)?,
                            idempotency_key: row.get(1)?,
                            amount: row.get(2)?,
                            currency: row.get(3)?,
                            created_at: row.get(4)?,
                        })
                    })?;
                    charges.collect()
                })
                .await
            }
            ChargeBook::Postgres(store) => {
                let rows: Vec<Row> = sqlx::query_as(&select)
                    .fetch_all(store.pool())
                    .await
                    .map_err(|e| StoreError::backend("postgres", e))?;
                Ok(rows.into_iter().map(charge_of).collect())
            }
            ChargeBook::MySql(store) => {
                let rows: Vec<Row> = sqlx::query_as(&select)
                    .fetch_all(store.pool())
                    .await
                    .map_err(|e| StoreError::backend("mysql", e))?;
                Ok(rows.into_iter().map(charge_of).collect())
            }
        }
    }

    /// Charges `payment` under `key` once: the charge row and the outcome
    /// recorded for `key` commit in one transaction.
    async fn charge(
        &self,
        idem: &Idempotent,
        key: &str,
        payment: &PaymentRequest,
        latency: Duration,
    ) -> Result<(Charge, bool), Error<String>> {
        let charge = Charge::new(key, payment.amount, &payment.currency);
        let made_here = charge.id.clone();
        let insert = format!(
            "INSERT INTO {CHARGES} (id, idempotency_key, amount, currency, created_at) \
             VALUES ($1, $2, $3, $4, $5)"
        );
        let charged = match self {
            ChargeBook::Sqlite { store, .. } => {
                // The closure runs on the store's writer thread and holds
                // every other caller while it runs, so the gateway's
                // latency is spent before it, not inside.
                tokio::time::sleep(latency).await;
                store
                    .execute_in_batch(idem, key, payment, move |conn| {
                        conn.execute(
                            &insert,
                            rusqlite::params![
                                charge.id,
                                charge.idempotency_key,
                                charge.amount,
                                charge.currency,
                                charge.created_at
                            ],
                        )
                        .map_err(|e| e.to_string())?;
                        Ok(charge)
                    })
                    .await
            }
            ChargeBook::Postgres(store) => {
                store
                    .execute_in_tx(idem, key, payment, move |tx| {
                        Box::pin(async move {
                            tokio::time::sleep(latency).await;
                            sqlx::query(&insert)
                                .bind(&charge.id)
                                .bind(&charge.idempotency_key)
                                .bind(charge.amount)
                                .bind(&charge.currency)
                                .bind(&charge.created_at)
                                .execute(&mut *tx)
                                .await
                                .map_err(|e| e.to_string())?;
                            Ok(charge)
                        })
                    })
                    .await
            }
            ChargeBook::MySql(store) => {
                // MariaDB's placeholders are `?`.
                let insert = format!(
                    "INSERT INTO {CHARGES} (id, idempotency_key, amount, currency, created_at) \
                     VALUES (?, ?, ?, ?, ?)"
                );
                store
                    .execute_in_tx(idem, key, payment, move |tx| {
                        Box::pin(async move {
                            tokio::time::sleep(latency).await;
                            sqlx::query(&insert)
                                .bind(&charge.id)
                                .bind(&charge.idempotency_key)
                                .bind(charge.amount)
                                .bind(&charge.currency)
                                .bind(&charge.created_at)
                                .execute(&mut *tx)
                                .await
                                .map_err(|e| e.to_string())?;
                            Ok(charge)
                        })
                    })
                    .await
            }
        }?;
        // A replay returns the charge an earlier request made.
        let replayed = charged.id != made_here;
        Ok((charged, replayed))
    }
}

/// A charge row as the SQL servers return it: id, key, amount, currency,
/// time.
type Row = (String, String, i64, String, String);

fn charge_of((id, idempotency_key, amount, currency, created_at): Row) -> Charge {
    Charge {
        id,
        idempotency_key,
        amount,
        currency,
        created_at,
    }
}

async fn sqlite_blocking<T: Send + 'static>(
    read: impl FnOnce() -> rusqlite::Result<T> + Send + 'static,
) -> Result<T, StoreError> {
    match tokio::task::spawn_blocking(read).await {
        Ok(result) => result.map_err(|e| StoreError::backend("sqlite", e)),
        Err(join) => Err(StoreError::backend("sqlite", join.to_string())),
    }
}

#[derive(Debug, Clone)]
struct BookState {
    book: ChargeBook,
    idem: Idempotent,
    latency: Duration,
}

/// The payments API with its charges in `book`: `POST /payments` charges
/// in the same transaction as the idempotency record, `GET /payments`
/// lists the table, `GET /healthz` checks the store. `lease` is how long
/// a killed server's keys stay blocked.
///
/// The answers match [`router`](crate::router)'s: 201 with the charge (and
/// `Idempotent-Replayed: true` on a replay), 409 while the first request
/// runs, 422 for a key reused with another payment, 400 without a key. The
/// fingerprint is taken over the parsed payment, so a retry that differs
/// only in JSON field order or spacing is the same payment. Refusals of
/// malformed payments are not recorded: they are the same on every retry.
pub fn router_in_db(book: ChargeBook, lease: Duration, latency: Duration) -> Router {
    let idem = Idempotent::from_arc(book.store())
        .with_namespace(NAMESPACE)
        .with_lease(lease);
    let store = book.store();
    Router::new()
        .route("/payments", post(create_payment).get(list_payments))
        .with_state(BookState {
            book,
            idem,
            latency,
        })
        .merge(app::health_router(store))
}

async fn create_payment(
    State(state): State<BookState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (key, payment) = match parse_payment(&headers, &body) {
        Ok(parsed) => parsed,
        Err(refusal) => return *refusal,
    };
    match state
        .book
        .charge(&state.idem, &key, &payment, state.latency)
        .await
    {
        Ok((charge, replayed)) => {
            let mut response = (StatusCode::CREATED, Json(charge)).into_response();
            if replayed {
                response
                    .headers_mut()
                    .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            }
            response
        }
        Err(error) => error_response(&error),
    }
}

fn error_response(error: &Error<String>) -> Response {
    match error {
        Error::Mismatch => problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency-key-reused",
            "Idempotency key reused",
            "this idempotency key was used for a different payment; use a new key",
        ),
        Error::InProgress { retry_after } => {
            let mut response = problem(
                StatusCode::CONFLICT,
                "in-progress",
                "Payment in progress",
                "a request with this idempotency key is still in progress; retry later",
            );
            let secs = retry_after.as_secs().max(1).to_string();
            if let Ok(value) = HeaderValue::from_str(&secs) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
            response
        }
        Error::InvalidKey(e) => problem(
            StatusCode::BAD_REQUEST,
            "invalid-idempotency-key",
            "Invalid idempotency key",
            &e.to_string(),
        ),
        other => {
            tracing::warn!(error = %other, "a payment failed");
            problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "Payment not recorded",
                &other.to_string(),
            )
        }
    }
}

async fn list_payments(State(state): State<BookState>) -> Response {
    match state.book.charges().await {
        Ok(charges) => Json(serde_json::json!({ "charges": charges })).into_response(),
        Err(e) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "store-unavailable",
            "Ledger unavailable",
            &e.to_string(),
        ),
    }
}

impl StoreSpec {
    /// The charge book in this store's database, migrated, for the stores
    /// that can write a charge in the same transaction as its record
    /// (SQLite, PostgreSQL and MariaDB); `None` for the others.
    pub async fn open_book(&self) -> Result<Option<ChargeBook>, StoreError> {
        let book = match (self.kind(), self.path()) {
            (StoreKind::Sqlite, Some(path)) => ChargeBook::Sqlite {
                store: SqliteStore::open(path).await?,
                path: path.to_owned(),
            },
            (StoreKind::Postgres, _) => {
                let store = PostgresStore::connect(self.location()).await?;
                store.migrate().await?;
                ChargeBook::Postgres(store)
            }
            (StoreKind::MySql, _) => {
                let store = MySqlStore::connect(self.location()).await?;
                store.migrate().await?;
                ChargeBook::MySql(store)
            }
            _ => return Ok(None),
        };
        book.migrate().await?;
        Ok(Some(book))
    }
}
