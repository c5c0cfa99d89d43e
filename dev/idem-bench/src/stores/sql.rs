//! What the MariaDB and PostgreSQL benches share: the bare protocol, the
//! bare protocol with its effect in a transaction, and `execute_in_tx`
//! with the same effect. Each store supplies its statements through
//! [`SqlStore`], implemented once for both by `sql_store!`; the
//! contestants are written once. What the bench and the scale target do
//! around them is written once too, in `sql_bench`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use idem_core::store::{Store, TxFuture};
use idem_core::{Fingerprint, Idempotent};
use sqlx::{Database, Pool, Transaction};

use crate::bench::{Contestant, Counters, Kind};
use crate::fixture::{self, BoxError, LEASE, RETENTION};
use crate::protocols::IdemRow;
use crate::runner::{Outcome, Protocol};
use crate::stores::target::CONNECT_TIMEOUT;

/// A claim's answer, from the store's `raw` module.
pub(crate) enum Claimed {
    /// The row was inserted: this caller owns the key.
    Inserted,
    /// A row was there, in flight.
    InFlight,
    /// A row was there, settled: a replay.
    Settled,
}

/// A SQL store as the bench drives it: its bare claim and completions
/// (the helpers its crate keeps for this comparison), its transactions,
/// the business insert and its `execute_in_tx`.
#[async_trait]
pub(crate) trait SqlStore: Clone + Send + Sync + 'static {
    /// The sqlx database the store runs on.
    type Db: Database;

    /// Connects to `url` (at most [`CONNECT_TIMEOUT`]) on the table `table`.
    async fn open(url: &str, table: &str) -> Result<Self, BoxError>;

    /// Creates the table if it is not there.
    async fn migrate(&self) -> Result<(), BoxError>;

    /// The table's name, unquoted.
    fn table(&self) -> String;

    /// The store's pool.
    fn pool(&self) -> &Pool<Self::Db>;

    /// Runs `sql` as text on the pool.
    async fn raw(&self, sql: &str) -> Result<(), sqlx::Error>;

    /// The one integer the query `sql` returns.
    async fn scalar(&self, sql: &str) -> Result<i64, sqlx::Error>;

    /// The bare claim, with the bench's lease and retention.
    async fn claim(
        &self,
        key: &str,
        token: &[u8; 16],
        fingerprint: &[u8; 32],
    ) -> Result<Claimed, sqlx::Error>;

    /// The bare completion, on the pool.
    async fn complete(
        &self,
        key: &str,
        token: &[u8; 16],
        fingerprint: &[u8; 32],
        payload: &[u8],
    ) -> Result<bool, sqlx::Error>;

    /// The bare completion, on a transaction's connection.
    async fn complete_in(
        &self,
        conn: &mut <Self::Db as Database>::Connection,
        key: &str,
        token: &[u8; 16],
        fingerprint: &[u8; 32],
        payload: &[u8],
    ) -> Result<bool, sqlx::Error>;

    /// A transaction on the store's pool, as sqlx opens it.
    async fn begin(&self) -> Result<Transaction<'static, Self::Db>, sqlx::Error>;

    /// The business write: `insert` with the key and an amount.
    async fn charge(
        conn: &mut <Self::Db as Database>::Connection,
        insert: &str,
        key: &str,
    ) -> Result<(), sqlx::Error>;

    /// The store's `execute_in_tx`.
    async fn in_tx<F>(
        &self,
        idem: &Idempotent,
        key: &str,
        body: &fixture::Order,
        work: F,
    ) -> Result<String, idem_core::Error<sqlx::Error>>
    where
        F: for<'c> FnOnce(
                &'c mut <Self::Db as Database>::Connection,
            ) -> TxFuture<'c, Result<String, sqlx::Error>>
            + Send
            + 'static;
}

/// The contestants both SQL stores run, in the report's order: the raw
/// protocol and `execute`, then each with `insert` (a business row) in
/// the transaction that records the outcome.
pub(crate) fn contestants<S: SqlStore + Store>(
    store: &S,
    insert: String,
    round_trips: fn(&Counters) -> u64,
) -> Vec<Contestant> {
    let shared: Arc<dyn Store> = Arc::new(store.clone());
    let protocols: [(Kind, Arc<dyn Protocol>); 4] = [
        (
            Kind::Raw,
            Arc::new(Raw {
                store: store.clone(),
                fingerprint: fixture::fingerprint(),
                payload: fixture::outcome_payload(),
            }),
        ),
        (
            Kind::Idem,
            Arc::new(IdemRow::new(Idempotent::from_arc(shared.clone()))),
        ),
        (
            Kind::RawTx,
            Arc::new(RawTx {
                store: store.clone(),
                fingerprint: fixture::fingerprint(),
                payload: fixture::outcome_payload(),
                insert: insert.clone(),
            }),
        ),
        (
            Kind::IdemTx,
            Arc::new(IdemTx {
                store: store.clone(),
                idem: Idempotent::from_arc(shared).with_retention(RETENTION),
                body: fixture::Order::sample(),
                outcome: fixture::outcome(),
                insert,
            }),
        ),
    ];
    protocols
        .into_iter()
        .map(|(kind, protocol)| Contestant {
            kind,
            make: Box::new(move || protocol.clone()),
            fresh: false,
            round_trips,
        })
        .collect()
}

/// [`SqlStore`] for the store `$store` of crate `$krate`, whose `raw`
/// module and `execute_in_tx` have the same shape in both SQL stores.
macro_rules! sql_store {
    ($krate:ident, $store:ident, $db:ident, $conn:ident) => {
        #[async_trait]
        impl SqlStore for $krate::$store {
            type Db = sqlx::$db;

            async fn open(url: &str, table: &str) -> Result<Self, BoxError> {
                let store = tokio::time::timeout(CONNECT_TIMEOUT, $krate::$store::connect(url))
                    .await
                    .map_err(|_| "no answer within 5 s")??;
                Ok(store.with_table(table)?)
            }

            async fn migrate(&self) -> Result<(), BoxError> {
                Ok($krate::$store::migrate(self).await?)
            }

            fn table(&self) -> String {
                $krate::$store::table(self)
            }

            fn pool(&self) -> &Pool<sqlx::$db> {
                $krate::$store::pool(self)
            }

            async fn raw(&self, sql: &str) -> Result<(), sqlx::Error> {
                sqlx::raw_sql(sql).execute(SqlStore::pool(self)).await?;
                Ok(())
            }

            async fn scalar(&self, sql: &str) -> Result<i64, sqlx::Error> {
                sqlx::query_scalar(sql)
                    .fetch_one(SqlStore::pool(self))
                    .await
            }

            async fn claim(
                &self,
                key: &str,
                token: &[u8; 16],
                fingerprint: &[u8; 32],
            ) -> Result<Claimed, sqlx::Error> {
                use $krate::raw::{claim, Claimed as Answer};
                Ok(
                    match claim(self, key, token, fingerprint, LEASE, RETENTION).await? {
                        Answer::Inserted => Claimed::Inserted,
                        Answer::Found { state: 0, .. } => Claimed::InFlight,
                        Answer::Found { .. } => Claimed::Settled,
                    },
                )
            }

            async fn complete(
                &self,
                key: &str,
                token: &[u8; 16],
                fingerprint: &[u8; 32],
                payload: &[u8],
            ) -> Result<bool, sqlx::Error> {
                $krate::raw::complete(self, key, token, fingerprint, payload, RETENTION).await
            }

            async fn complete_in(
                &self,
                conn: &mut sqlx::$conn,
                key: &str,
                token: &[u8; 16],
                fingerprint: &[u8; 32],
                payload: &[u8],
            ) -> Result<bool, sqlx::Error> {
                $krate::raw::complete_in(conn, self, key, token, fingerprint, payload, RETENTION)
                    .await
            }

            async fn begin(&self) -> Result<Transaction<'static, sqlx::$db>, sqlx::Error> {
                SqlStore::pool(self).begin().await
            }

            async fn charge(
                conn: &mut sqlx::$conn,
                insert: &str,
                key: &str,
            ) -> Result<(), sqlx::Error> {
                sqlx::query(insert)
                    .bind(key)
                    .bind(1250_i64)
                    .execute(conn)
                    .await?;
                Ok(())
            }

            async fn in_tx<F>(
                &self,
                idem: &Idempotent,
                key: &str,
                body: &fixture::Order,
                work: F,
            ) -> Result<String, idem_core::Error<sqlx::Error>>
            where
                F: for<'c> FnOnce(&'c mut sqlx::$conn) -> TxFuture<'c, Result<String, sqlx::Error>>
                    + Send
                    + 'static,
            {
                self.execute_in_tx(idem, key, body, work).await
            }
        }
    };
}

sql_store!(idem_mysql, MySqlStore, MySql, MySqlConnection);
sql_store!(idem_postgres, PostgresStore, Postgres, PgConnection);

/// The store's own claim and complete statements, bare.
pub(crate) struct Raw<S> {
    pub(crate) store: S,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) payload: Vec<u8>,
}

#[async_trait]
impl<S: SqlStore> Protocol for Raw<S> {
    async fn op(&self, key: &str) -> Result<Outcome, BoxError> {
        let token = fixture::token();
        let (token, fingerprint) = (token.as_bytes(), self.fingerprint.as_bytes());
        match self.store.claim(key, token, fingerprint).await? {
            Claimed::Inserted => {
                let done = self
                    .store
                    .complete(key, token, fingerprint, &self.payload)
                    .await?;
                if done {
                    Ok(Outcome::Ran)
                } else {
                    Err("raw completion lost its claim".into())
                }
            }
            Claimed::InFlight => Ok(Outcome::InProgress),
            Claimed::Settled => Ok(Outcome::Replayed),
        }
    }
}

/// The raw protocol with its effect in one transaction: the bare claim,
/// then `BEGIN`, a business insert, the bare fenced completion, `COMMIT`.
pub(crate) struct RawTx<S> {
    pub(crate) store: S,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) payload: Vec<u8>,
    pub(crate) insert: String,
}

#[async_trait]
impl<S: SqlStore> Protocol for RawTx<S> {
    async fn op(&self, key: &str) -> Result<Outcome, BoxError> {
        let token = fixture::token();
        let (token, fingerprint) = (token.as_bytes(), self.fingerprint.as_bytes());
        match self.store.claim(key, token, fingerprint).await? {
            Claimed::Inserted => {
                let mut tx = self.store.begin().await?;
                S::charge(&mut *tx, &self.insert, key).await?;
                let done = self
                    .store
                    .complete_in(&mut *tx, key, token, fingerprint, &self.payload)
                    .await?;
                if !done {
                    return Err("raw completion lost its claim".into());
                }
                tx.commit().await?;
                Ok(Outcome::Ran)
            }
            Claimed::InFlight => Ok(Outcome::InProgress),
            Claimed::Settled => Ok(Outcome::Replayed),
        }
    }
}

/// `execute_in_tx` with the same business insert.
pub(crate) struct IdemTx<S> {
    pub(crate) store: S,
    pub(crate) idem: Idempotent,
    pub(crate) body: fixture::Order,
    pub(crate) outcome: String,
    pub(crate) insert: String,
}

#[async_trait]
impl<S: SqlStore> Protocol for IdemTx<S> {
    async fn op(&self, key: &str) -> Result<Outcome, BoxError> {
        let ran = Arc::new(AtomicBool::new(false));
        let (flag, insert, outcome, key_row) = (
            Arc::clone(&ran),
            self.insert.clone(),
            self.outcome.clone(),
            key.to_owned(),
        );
        let result = self
            .store
            .in_tx(&self.idem, key, &self.body, move |tx| {
                Box::pin(async move {
                    flag.store(true, Ordering::Relaxed);
                    S::charge(tx, &insert, &key_row).await?;
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
