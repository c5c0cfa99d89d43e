//! The table name, checked once, and every SQL statement built from it once.
//!
//! The name is the only text ever spliced into SQL, and only after it has
//! passed `TableName::parse` (`idem-sql`'s rules): every value a caller supplies at run time
//! (keys, tokens, payloads, durations) travels as a bound parameter.

use crate::BACKEND;

/// The table a store uses when none is named.
pub const DEFAULT_TABLE: &str = "idem_records";

/// The longest table part accepted: PostgreSQL keeps 63 bytes of an
/// identifier, and the index name adds [`INDEX_SUFFIX`] to it. A longer name
/// would be silently truncated, and two tables could then share an index
/// name.
pub(crate) const MAX_TABLE_LEN: usize = 63 - INDEX_SUFFIX.len();

/// The longest schema part accepted: PostgreSQL's identifier limit.
pub(crate) const MAX_SCHEMA_LEN: usize = 63;

const INDEX_SUFFIX: &str = "_retain_idx";

/// How PostgreSQL names are checked and quoted: `"schema"."table"`.
#[derive(Debug)]
pub(crate) struct Names;

impl idem_sql::Dialect for Names {
    const BACKEND: &'static str = BACKEND;
    const QUOTE: char = '"';
    const QUALIFIER: &'static str = "schema";
    const MAX_QUALIFIER: usize = MAX_SCHEMA_LEN;
    const MAX_TABLE: usize = MAX_TABLE_LEN;
    const DEFAULT_TABLE: &'static str = DEFAULT_TABLE;
}

/// A validated, optionally schema-qualified table name.
pub(crate) type TableName = idem_sql::TableName<Names>;

/// The index name, unqualified: PostgreSQL creates an index in its table's
/// schema.
fn index(name: &TableName) -> String {
    format!("\"{}{INDEX_SUFFIX}\"", name.table())
}

// The clock of every statement. `statement_timestamp()` is fixed for the
// whole statement, so a record's liveness test and its new deadlines agree
// with each other (`clock_timestamp()` would move between the columns of one
// row); unlike `now()` it is not frozen at the start of an enclosing
// transaction when the caller's pool runs statements inside one.
pub(crate) const NOW: &str = "statement_timestamp()";

/// The fenced completion, built from the store's swap statement: the same
/// update, answered with the count of rows it changed and the database it
/// ran in, so that a lost lease can be told from a transaction on another
/// database.
fn fenced_completion(swap: &str, channel: Option<&str>) -> String {
    // The notification is queued in the caller's transaction and sent at
    // its commit, never for a rollback.
    let changed = match channel {
        Some(channel) => format!("SELECT pg_notify('{channel}', key) FROM done"),
        None => "SELECT FROM done".to_owned(),
    };
    format!(
        "WITH done AS ({swap} RETURNING key) \
         SELECT (SELECT count(*) FROM ({changed}) AS n) AS changed, \
         current_database()::text AS database"
    )
}

/// Every statement a store runs, built once from its table name.
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    pub(crate) name: TableName,
    pub(crate) migrate: String,
    pub(crate) insert: String,
    pub(crate) swap: String,
    pub(crate) take_over: String,
    pub(crate) remove: String,
    /// The swap that records an outcome (`Completed`, `Failed`): `swap`,
    /// plus a notification of the key on the table's channel when
    /// notifications are on. Returns the number of rows changed.
    pub(crate) settle: String,
    /// The notification channel, when notifications are on.
    pub(crate) channel: Option<String>,
    pub(crate) load: String,
    /// Deletes the key's row if it is live and settled; returns `state`
    /// and `deleted`, or no row when the key has no live record.
    pub(crate) reset: String,
    pub(crate) purge: String,
    pub(crate) complete_in: String,
    /// Inserts a batch of prepared claims: see `batch.rs`.
    pub(crate) claim_many: String,
}

impl Statements {
    /// The statements for table `name`; with `notify`, the ones that
    /// record an outcome or release a key also `NOTIFY` the key on the
    /// table's [channel](crate::notify::channel), in the same statement,
    /// so the notification is sent exactly when the change commits.
    pub(crate) fn new(name: TableName, notify: bool) -> Statements {
        let t = name.quoted();
        let channel = notify.then(|| crate::notify::channel(&name));
        // `pg_notify` in the select list of a subquery runs once per
        // changed row (a volatile function is never optimized away); the
        // outer count says how many rows changed.
        let notifying = |change: &str| match &channel {
            Some(channel) => format!(
                "WITH done AS ({change} RETURNING key) \
                 SELECT count(*) FROM (SELECT pg_notify('{channel}', key) FROM done) AS n"
            ),
            None => format!("WITH done AS ({change} RETURNING key) SELECT count(*) FROM done"),
        };
        // Remaining times leave the database as whole microseconds, so the
        // client never compares clocks.
        let left = |column: &str| {
            format!("(extract(epoch FROM {column} - {NOW}) * 1000000)::int8 AS {column}_left")
        };
        let (lease_left, retain_left) = (left("lease_until"), left("retain_until"));
        let replace_if_expired = |column: &str| {
            format!(
                "{column} = CASE WHEN r.retain_until <= {NOW} \
                 THEN excluded.{column} ELSE r.{column} END"
            )
        };
        let set_on_conflict = [
            "token",
            "fingerprint",
            "state",
            "payload",
            "lease_until",
            "retain_until",
        ]
        .map(replace_if_expired)
        .join(", ");
        let set_new = format!(
            "token = $3, fingerprint = $4, state = $5, payload = $6, \
             lease_until = {NOW} + $7::interval, retain_until = {NOW} + $8::interval"
        );
        let owned_live_in_flight =
            format!("key = $1 AND token = $2 AND state = 0 AND retain_until > {NOW}");
        let swap = format!("UPDATE {t} SET {set_new} WHERE {owned_live_in_flight}");
        let remove = format!("DELETE FROM {t} WHERE {owned_live_in_flight}");
        Statements {
            claim_many: crate::batch::claim_statement(&t),
            complete_in: fenced_completion(&swap, channel.as_deref()),
            settle: notifying(&swap),
            remove: notifying(&remove),
            channel,
            // The name inside the lock's literal passed validation, so it
            // holds no quote.
            migrate: format!(
                "SELECT pg_advisory_xact_lock(hashtextextended('idem-postgres migrate {}', 0)); \
                 CREATE TABLE IF NOT EXISTS {t} (\
                 key text COLLATE \"C\" PRIMARY KEY, \
                 token bytea NOT NULL, \
                 fingerprint bytea NOT NULL, \
                 state smallint NOT NULL, \
                 payload bytea NOT NULL, \
                 lease_until timestamptz, \
                 retain_until timestamptz NOT NULL); \
                 CREATE INDEX IF NOT EXISTS {} ON {t} (retain_until)",
                name.display(),
                index(&name)
            ),
            // One statement for the three outcomes of a claim. `seen` reads
            // a live record in the statement's snapshot without writing, so
            // a replay costs no WAL. Otherwise the insert runs; if it meets
            // a conflicting row (an expired one, or one that a concurrent
            // transaction committed after the snapshot and so `seen` could
            // not see), ON CONFLICT locks the row's latest version and the
            // CASEs replace it only if that version is expired, else write
            // it back unchanged so that RETURNING hands it over. Either way
            // exactly one row comes back, and `inserted` says which.
            insert: format!(
                "WITH seen AS (\
                 SELECT token, fingerprint, state, payload, lease_until, retain_until \
                 FROM {t} WHERE key = $1 AND retain_until > {NOW}), \
                 claimed AS (\
                 INSERT INTO {t} AS r \
                 (key, token, fingerprint, state, payload, lease_until, retain_until) \
                 SELECT $1::text, $2::bytea, $3::bytea, $4::int2, $5::bytea, \
                 {NOW} + $6::interval, {NOW} + $7::interval \
                 WHERE NOT EXISTS (SELECT FROM seen) \
                 ON CONFLICT (key) DO UPDATE SET {set_on_conflict} \
                 RETURNING r.token, r.fingerprint, r.state, r.payload, \
                 r.lease_until, r.retain_until) \
                 SELECT token = $2 AS inserted, token, fingerprint, state, payload, \
                 {lease_left}, {retain_left} \
                 FROM (SELECT * FROM seen UNION ALL SELECT * FROM claimed) AS found"
            ),
            swap,
            take_over: format!(
                "UPDATE {t} SET {set_new} WHERE {owned_live_in_flight} \
                 AND (lease_until IS NULL OR lease_until <= {NOW})"
            ),
            load: format!(
                "SELECT token, fingerprint, state, payload, {lease_left}, {retain_left} \
                 FROM {t} WHERE key = $1 AND retain_until > {NOW}"
            ),
            // The delete re-checks the row's newest version (a completion
            // committed meanwhile is deleted, a row another reset deleted
            // is not); the read beside it sees the statement's snapshot and
            // only speaks when nothing was deleted. A settled row it sees
            // but the delete did not take was deleted by a concurrent
            // reset: the caller reads that as absent.
            reset: format!(
                "WITH deleted AS (\
                 DELETE FROM {t} WHERE key = $1 AND state <> 0 AND retain_until > {NOW} \
                 RETURNING state) \
                 SELECT state, true AS deleted FROM deleted \
                 UNION ALL \
                 SELECT state, false FROM {t} WHERE key = $1 AND retain_until > {NOW} \
                 AND NOT EXISTS (SELECT FROM deleted)"
            ),
            // SKIP LOCKED lets several purgers (one per app server) share
            // the work without waiting on each other or on a claim that is
            // replacing the same expired row. The batch locks each row it
            // picks, after checking expiry again on the row's newest
            // version (a claim that replaced it first makes it live and
            // drops it from the batch); locked, the row cannot change
            // before the delete, so a live record is never deleted.
            //
            // The delete finds its rows by key only. With a second
            // `retain_until <= now` on the deleted table, the planner,
            // whose statistics usually say no row has expired (ANALYZE
            // last saw the table between purges), scanned every expired
            // row for each key of the batch: at ten million records a
            // batch of 1,000 took 4–7 s, 273 records/s against 1,000/s of
            // ingest. By key it takes a few milliseconds at any size.
            purge: format!(
                "WITH batch AS (\
                 SELECT key FROM {t} WHERE retain_until <= {NOW} \
                 ORDER BY retain_until LIMIT $1 FOR UPDATE SKIP LOCKED) \
                 DELETE FROM {t} AS r USING batch WHERE r.key = batch.key"
            ),
            name,
        }
    }
}

#[cfg(test)]
mod tests {
    use idem_core::store::StoreErrorKind;

    use super::*;

    #[test]
    fn plain_and_schema_qualified_names_are_accepted() {
        for name in ["idem_records", "_t1", "App.Idem", "s.t", "order"] {
            let parsed = TableName::parse(name).unwrap();
            assert_eq!(parsed.display(), name);
        }
        assert_eq!(
            TableName::parse(DEFAULT_TABLE).unwrap(),
            TableName::default()
        );
        let longest = "t".repeat(MAX_TABLE_LEN);
        assert!(TableName::parse(&longest).is_ok());
    }

    // The rules themselves are idem-sql's, tested there; these pin this
    // database's limits, quote and wording.
    #[test]
    fn names_past_the_limits_or_with_quotes_are_config_errors() {
        let too_long = "t".repeat(MAX_TABLE_LEN + 1);
        let qualifier_too_long = format!("{}.t", "q".repeat(MAX_SCHEMA_LEN + 1));
        for name in [
            too_long.as_str(),
            qualifier_too_long.as_str(),
            "\"quoted\"",
            "x; drop table y",
        ] {
            let error = TableName::parse(name).unwrap_err();
            assert_eq!(error.kind(), StoreErrorKind::Config, "{name:?}");
            assert_eq!(error.backend_name(), BACKEND);
            assert!(error.to_string().contains("`schema.table`"), "{error}");
        }
    }

    #[test]
    fn statements_splice_only_the_quoted_name() {
        let statements = Statements::new(TableName::parse("app.idem").unwrap(), true);
        assert!(statements
            .insert
            .contains("INSERT INTO \"app\".\"idem\" AS r"));
        assert!(statements
            .migrate
            .contains("CREATE INDEX IF NOT EXISTS \"idem_retain_idx\" ON \"app\".\"idem\""));
    }
}
