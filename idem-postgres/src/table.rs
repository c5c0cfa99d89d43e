//! The table name, checked once, and every SQL statement built from it once.
//!
//! The name is the only text ever spliced into SQL, and only after it has
//! passed [`TableName::parse`]: every value a caller supplies at run time
//! (keys, tokens, payloads, durations) travels as a bound parameter.

use idem_core::StoreError;

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

/// A validated, optionally schema-qualified table name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableName {
    schema: Option<String>,
    table: String,
}

impl Default for TableName {
    fn default() -> TableName {
        TableName {
            schema: None,
            table: DEFAULT_TABLE.to_owned(),
        }
    }
}

impl TableName {
    /// Accepts `table` or `schema.table`, each part a plain identifier: an
    /// ASCII letter or `_`, then ASCII letters, digits or `_`. Anything else
    /// (quotes, spaces, semicolons, an empty part, a third part) is a
    /// configuration error, so no input can change the statements' meaning.
    pub(crate) fn parse(name: &str) -> Result<TableName, StoreError> {
        let refuse = |why: &str| {
            StoreError::config(
                BACKEND,
                format!("invalid table name {name:?}: {why}; expected `table` or `schema.table` made of ASCII letters, digits and `_`"),
            )
        };
        let mut parts = name.split('.');
        let (schema, table) = match (parts.next(), parts.next(), parts.next()) {
            (Some(table), None, None) => (None, table),
            (Some(schema), Some(table), None) => (Some(schema), table),
            _ => return Err(refuse("more than one `.`")),
        };
        if let Some(schema) = schema {
            check_identifier(schema, MAX_SCHEMA_LEN).map_err(|why| refuse(&why))?;
        }
        check_identifier(table, MAX_TABLE_LEN).map_err(|why| refuse(&why))?;
        Ok(TableName {
            schema: schema.map(str::to_owned),
            table: table.to_owned(),
        })
    }

    /// The name as the caller wrote it.
    pub(crate) fn display(&self) -> String {
        match &self.schema {
            Some(schema) => format!("{schema}.{}", self.table),
            None => self.table.clone(),
        }
    }

    /// The quoted, qualified name to splice into SQL. Quoting keeps the
    /// name exactly as given (case included) and lets reserved words such as
    /// `order` be table names; validation already ruled out quotes inside.
    fn quoted(&self) -> String {
        match &self.schema {
            Some(schema) => format!("\"{schema}\".\"{}\"", self.table),
            None => format!("\"{}\"", self.table),
        }
    }

    /// The index name, unqualified: PostgreSQL creates an index in its
    /// table's schema.
    fn index(&self) -> String {
        format!("\"{}{INDEX_SUFFIX}\"", self.table)
    }
}

fn check_identifier(part: &str, max: usize) -> Result<(), String> {
    let mut chars = part.chars();
    match chars.next() {
        None => return Err("a part is empty".to_owned()),
        Some(c) if !(c.is_ascii_alphabetic() || c == '_') => {
            return Err(format!("{part:?} must start with an ASCII letter or `_`"))
        }
        Some(_) => {}
    }
    if let Some(c) = chars.find(|c| !(c.is_ascii_alphanumeric() || *c == '_')) {
        return Err(format!("{part:?} contains {c:?}"));
    }
    if part.len() > max {
        return Err(format!("{part:?} is longer than {max} characters"));
    }
    Ok(())
}

// The clock of every statement. `statement_timestamp()` is fixed for the
// whole statement, so a record's liveness test and its new deadlines agree
// with each other (`clock_timestamp()` would move between the columns of one
// row); unlike `now()` it is not frozen at the start of an enclosing
// transaction when the caller's pool runs statements inside one.
const NOW: &str = "statement_timestamp()";

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
    pub(crate) purge: String,
    pub(crate) complete_in: String,
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
            complete_in: crate::tx::fenced_completion(&swap, channel.as_deref()),
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
                name.index()
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
            // SKIP LOCKED lets several purgers (one per app server) share
            // the work without waiting on each other or on a claim that is
            // replacing the same expired row. The batch is a CTE so the
            // delete walks at most `limit` keys instead of joining against
            // every expired row; the re-check of expiry means a live record
            // is never deleted.
            purge: format!(
                "WITH batch AS (\
                 SELECT key FROM {t} WHERE retain_until <= {NOW} \
                 ORDER BY retain_until LIMIT $1 FOR UPDATE SKIP LOCKED) \
                 DELETE FROM {t} AS r USING batch \
                 WHERE r.key = batch.key AND r.retain_until <= {NOW}"
            ),
            name,
        }
    }
}

#[cfg(test)]
mod tests {
    use idem_core::StoreErrorKind;

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

    #[test]
    fn anything_but_plain_identifiers_is_a_config_error() {
        let too_long = "t".repeat(MAX_TABLE_LEN + 1);
        let schema_too_long = format!("{}.t", "s".repeat(MAX_SCHEMA_LEN + 1));
        for name in [
            "",
            ".",
            "a.",
            ".a",
            "a.b.c",
            "x; drop table y",
            "\"quoted\"",
            "it's",
            "1abc",
            "white space",
            "ünicode",
            "dash-ed",
            too_long.as_str(),
            schema_too_long.as_str(),
        ] {
            let error = TableName::parse(name).unwrap_err();
            assert_eq!(error.kind(), StoreErrorKind::Config, "{name:?}");
            assert!(error.to_string().contains("invalid table name"), "{error}");
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
