//! The glue that runs the conformance kit's transaction cases
//! (`idem_conformance::tx_tests!`) on a SQL store: a fixture with a
//! business table, a `StoreTx` that settles through the store's
//! `complete_in` and `fail_in`, and the `TxStore` pass-throughs, generated
//! by [`sql_tx_store!`](crate::sql_tx_store) from what differs between
//! stores (their [`SqlStore`](crate::sql_cases::SqlStore) and a few
//! statements).
//!
//! A macro rather than generic code: `TxStore` lives in idem-conformance,
//! which must not learn of sqlx, and this crate does not depend on it, so
//! neither crate may implement it for the other's types; and the stores'
//! `complete_in`, `fail_in` and `execute_in_tx` are inherent methods of the
//! same names, which a macro calls without a trait to list them in.

/// Defines, in the calling module, a struct `$fixture` (a store of the
/// [`SqlStore`](crate::sql_cases::SqlStore) `$sql` and a business table of
/// its own, both dropped with it, in the fields `store` and `charges`), an
/// `async fn $factory() -> Option<$fixture>` that makes one (or skips), a
/// `StoreTx` named `CompleteIn` on the store's pool, and
/// `idem_conformance::tx::TxStore` for `$fixture`.
///
/// The statements are format strings: `create` makes the business table
/// `{charges}` (a key and an `amount`), `insert` writes the row `{key}`,
/// `{amount}` into it, `rows` selects its keys in order, `usurp` replaces
/// every token in the store's table `{table}`, and `drop_database` drops
/// `{database}`. `copy_table`, given the store and the name of another
/// database, is the statement (run there) that makes a table of the
/// store's name and shape in it.
///
/// The calling crate depends on `idem_conformance` and `serde`, as a store
/// crate running the kit does.
#[macro_export]
macro_rules! sql_tx_store {
    (
        $(#[$meta:meta])*
        struct $fixture:ident for $sql:ty;
        async fn $factory:ident();
        create = $create:literal;
        insert = $insert:literal;
        rows = $rows:literal;
        usurp = $usurp:literal;
        drop_database = $drop_database:literal;
        copy_table = $copy_table:expr;
    ) => {
        $(#[$meta])*
        struct $fixture {
            store: <$sql as $crate::sql_cases::SqlStore>::Store,
            charges: ::std::string::String,
            _guards: ($crate::Cleanup, $crate::Cleanup),
        }

        async fn $factory() -> ::std::option::Option<$fixture> {
            use $crate::sql_cases::SqlStore as _;
            let pool = <$sql>::pool(8).await?;
            let (store, table_guard) = <$sql>::store_in(pool.clone()).await;
            let charges = $crate::unique_name("charges");
            <$sql>::run(&pool, ::std::format!($create, charges = charges)).await;
            ::std::option::Option::Some($fixture {
                _guards: (table_guard, <$sql>::drop_table(&charges)),
                store,
                charges,
            })
        }

        /// A transaction on the store's pool that settles through
        /// `complete_in` and `fail_in`.
        struct CompleteIn {
            store: <$sql as $crate::sql_cases::SqlStore>::Store,
            tx: $crate::__private::sqlx::Transaction<
                'static,
                <$sql as $crate::sql_cases::SqlStore>::Db,
            >,
        }

        impl $crate::__private::idem_core::store::StoreTx for CompleteIn {
            type Conn = $crate::__sql_tx_conn!($sql);

            fn conn(&mut self) -> &mut Self::Conn {
                &mut self.tx
            }

            async fn settle(
                &mut self,
                lease: &$crate::__private::idem_core::Lease,
                state: $crate::__private::idem_core::store::State,
                payload: &[u8],
            ) -> ::std::result::Result<(), $crate::__private::idem_core::Error> {
                // The driver ends the transaction and settles the key
                // itself, so the guard hands the lease straight back.
                let lease = ::std::clone::Clone::clone(lease);
                let done = match state {
                    $crate::__private::idem_core::store::State::Failed => {
                        self.store.fail_in(&mut self.tx, lease, payload).await
                    }
                    _ => self.store.complete_in(&mut self.tx, lease, payload).await,
                };
                done.map(|done| drop(done.into_lease()))
            }

            async fn commit(
                self,
            ) -> ::std::result::Result<(), $crate::__private::idem_core::store::StoreError> {
                self.tx.commit().await.map_err(|e| {
                    $crate::__private::idem_core::store::StoreError::backend(
                        <$sql as $crate::sql_cases::SqlStore>::BACKEND,
                        e,
                    )
                })
            }

            async fn rollback(self) {
                let _ = self.tx.rollback().await;
            }
        }

        impl ::idem_conformance::tx::TxStore for $fixture {
            type Store = <$sql as $crate::sql_cases::SqlStore>::Store;
            type Conn = $crate::__sql_tx_conn!($sql);
            type Tx = CompleteIn;

            fn store(&self) -> &Self::Store {
                &self.store
            }

            async fn open(&self) -> CompleteIn {
                let tx = self.store.pool().begin().await.unwrap();
                CompleteIn {
                    store: ::std::clone::Clone::clone(&self.store),
                    tx,
                }
            }

            fn insert(&self, key: &str, amount: i64) -> ::std::string::String {
                ::std::format!($insert, charges = self.charges, key = key, amount = amount)
            }

            fn run(
                conn: &mut Self::Conn,
                statement: ::std::string::String,
            ) -> $crate::__private::idem_core::store::TxFuture<
                '_,
                ::std::result::Result<(), ::std::string::String>,
            > {
                ::std::boxed::Box::pin(async move {
                    $crate::__private::sqlx::query(&statement)
                        .execute(&mut *conn)
                        .await
                        .map(drop)
                        .map_err(|e| e.to_string())
                })
            }

            async fn rows(&self) -> ::std::vec::Vec<::std::string::String> {
                let sql = ::std::format!($rows, charges = self.charges);
                $crate::__private::sqlx::query_scalar(&sql)
                    .fetch_all(self.store.pool())
                    .await
                    .unwrap()
            }

            fn usurp(&self) -> $crate::__private::idem_core::store::TxFuture<'static, ()> {
                let pool = ::std::clone::Clone::clone(self.store.pool());
                let sql = ::std::format!($usurp, table = self.store.table());
                ::std::boxed::Box::pin(async move {
                    $crate::__private::sqlx::query(&sql)
                        .execute(&pool)
                        .await
                        .unwrap();
                })
            }

            fn execute_in_tx<B, T, E, F>(
                &self,
                idem: &$crate::__private::idem_core::Idempotent,
                key: &str,
                body: &B,
                work: F,
            ) -> impl ::std::future::Future<
                Output = ::std::result::Result<T, $crate::__private::idem_core::Error<E>>,
            > + Send
            where
                B: ::serde::Serialize + Sync + ?Sized,
                T: ::serde::Serialize + ::serde::de::DeserializeOwned + Send + 'static,
                E: Send + 'static,
                F: for<'c> FnOnce(
                        &'c mut Self::Conn,
                    ) -> $crate::__private::idem_core::store::TxFuture<
                        'c,
                        ::std::result::Result<T, E>,
                    > + Send
                    + 'static,
            {
                self.store.execute_in_tx(idem, key, body, work)
            }

            fn execute_in_tx_remembering<B, T, E, R, F>(
                &self,
                idem: &$crate::__private::idem_core::Idempotent,
                key: &str,
                body: &B,
                remember: R,
                work: F,
            ) -> impl ::std::future::Future<
                Output = ::std::result::Result<T, $crate::__private::idem_core::Error<E>>,
            > + Send
            where
                B: ::serde::Serialize + Sync + ?Sized,
                T: ::serde::Serialize + ::serde::de::DeserializeOwned + Send + 'static,
                E: ::serde::Serialize + ::serde::de::DeserializeOwned + Send + 'static,
                R: FnOnce(&E) -> bool + Send + 'static,
                F: for<'c> FnOnce(
                        &'c mut Self::Conn,
                    ) -> $crate::__private::idem_core::store::TxFuture<
                        'c,
                        ::std::result::Result<T, E>,
                    > + Send
                    + 'static,
            {
                self.store
                    .execute_in_tx_remembering(idem, key, body, remember, work)
            }

            async fn complete_outside_a_transaction(
                &self,
                lease: &$crate::__private::idem_core::Lease,
            ) -> ::std::result::Result<(), $crate::__private::idem_core::Error> {
                let mut conn = self.store.pool().acquire().await.unwrap();
                let lease = ::std::clone::Clone::clone(lease);
                let done = self.store.complete_in(&mut conn, lease, b"1").await;
                done.map(|done| drop(done.into_lease()))
            }

            async fn complete_on_another_database(
                &self,
                lease: &$crate::__private::idem_core::Lease,
            ) -> ::std::result::Result<(), $crate::__private::idem_core::Error> {
                use $crate::sql_cases::SqlStore as _;
                let other = $crate::unique_name("idem_other_db");
                <$sql>::run(self.store.pool(), ::std::format!("CREATE DATABASE {other}")).await;
                let _db = <$sql>::cleanup(::std::format!($drop_database, database = other));
                let url = <$sql>::url();
                let other_url = ::std::format!("{}/{other}", &url[..url.rfind('/').unwrap()]);
                // A pool, not a lone connection: its futures are `Send` for
                // any borrow, as this trait's futures must be.
                let pool = $crate::__private::sqlx::pool::PoolOptions::<
                    <$sql as $crate::sql_cases::SqlStore>::Db,
                >::new()
                .max_connections(1)
                .connect(&other_url)
                .await
                .unwrap();
                // The same table in the other database, so only the check
                // can tell.
                let copy_table: fn(
                    &<$sql as $crate::sql_cases::SqlStore>::Store,
                    &str,
                ) -> ::std::string::String = $copy_table;
                <$sql>::run(&pool, copy_table(&self.store, &other)).await;
                let mut tx = pool.begin().await.unwrap();
                let lease = ::std::clone::Clone::clone(lease);
                let completed = self.store.complete_in(&mut tx, lease, b"1").await;
                tx.rollback().await.unwrap();
                pool.close().await;
                completed.map(|done| drop(done.into_lease()))
            }

            fn complete_in<'a>(
                tx: &'a mut CompleteIn,
                lease: $crate::__private::idem_core::Lease,
                payload: &'a [u8],
            ) -> impl ::std::future::Future<
                Output = ::std::result::Result<
                    $crate::__private::idem_core::store::Uncommitted,
                    $crate::__private::idem_core::Error,
                >,
            > + Send + 'a {
                tx.store.complete_in(&mut tx.tx, lease, payload)
            }
        }
    };
}

/// The connection type of the [`SqlStore`](crate::sql_cases::SqlStore)
/// `$sql`'s database, for [`sql_tx_store!`](crate::sql_tx_store).
#[doc(hidden)]
#[macro_export]
macro_rules! __sql_tx_conn {
    ($sql:ty) => {
        <<$sql as $crate::sql_cases::SqlStore>::Db as $crate::__private::sqlx::Database>::Connection
    };
}
