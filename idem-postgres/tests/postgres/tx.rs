//! Transactional completion: the conformance kit's transaction cases
//! (business rows and the outcome commit together, a stale owner's writes
//! never land, misuse is refused) on a business table of their own.

use idem_postgres::PostgresStore;

use crate::support::Pg;

idem_testing::sql_tx_store! {
    /// A store and a business table of its own, dropped with it.
    struct Charges for Pg;
    async fn charges();
    create = "CREATE TABLE {charges} (key text PRIMARY KEY, amount int8 NOT NULL)";
    insert = "INSERT INTO {charges} (key, amount) VALUES ('{key}', {amount})";
    rows = "SELECT key FROM {charges} ORDER BY key";
    usurp = "UPDATE \"{table}\" SET token = '\\x00000000000000000000000000000000'";
    drop_database = "DROP DATABASE IF EXISTS {database} WITH (FORCE)";
    // A database cannot name another's tables, so the shape is spelled out.
    copy_table = |store: &PostgresStore, _database: &str| {
        format!(
            "CREATE TABLE \"{}\" (key text COLLATE \"C\" PRIMARY KEY, token bytea NOT NULL, \
             fingerprint bytea NOT NULL, state smallint NOT NULL, payload bytea NOT NULL, \
             lease_until timestamptz, retain_until timestamptz NOT NULL)",
            store.table()
        )
    };
}

idem_conformance::tx_tests!(charges);
