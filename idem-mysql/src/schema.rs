//! The table name, checked once, and every SQL statement built from it once.
//!
//! The name is the only text ever spliced into SQL, and only after it has
//! passed `TableName::parse` (`idem-sql`'s rules): every value a caller supplies at run time
//! (keys, tokens, payloads, durations) travels as a bound parameter.

use crate::BACKEND;

/// The table a store uses when none is named.
pub const DEFAULT_TABLE: &str = "idem_records";

/// The longest part accepted: MySQL and MariaDB refuse database and table
/// names longer than 64 characters.
pub(crate) const MAX_PART_LEN: usize = 64;

/// How MariaDB names are checked and quoted: `` `database`.`table` ``.
#[derive(Debug)]
pub(crate) struct Names;

impl idem_sql::Dialect for Names {
    const BACKEND: &'static str = BACKEND;
    const QUOTE: char = '`';
    const QUALIFIER: &'static str = "database";
    const MAX_QUALIFIER: usize = MAX_PART_LEN;
    const MAX_TABLE: usize = MAX_PART_LEN;
    const DEFAULT_TABLE: &'static str = DEFAULT_TABLE;
}

/// A validated, optionally database-qualified table name.
pub(crate) type TableName = idem_sql::TableName<Names>;

// The clock of every statement. `UTC_TIMESTAMP(6)`, like `NOW(6)`, is fixed
// at the start of the statement, so a record's liveness test and its new
// deadlines agree with each other (`SYSDATE(6)` would move between the
// columns of one row). UTC rather than `NOW(6)` because `DATETIME` columns
// hold no time zone: under a session zone with daylight saving, `NOW(6)`
// steps back an hour once a year and deadlines would move with it.
// `DATETIME(6)` rather than `TIMESTAMP(6)` because the latter ends in 2038.
const NOW: &str = "UTC_TIMESTAMP(6)";

/// The fenced completion, built from the store's swap statement: the same
/// update, matching only inside a transaction the server has open.
///
/// sqlx counts the transactions it began, but InnoDB ends a transaction on
/// its own when it picks it as a deadlock victim, and a `COMMIT` sent as
/// raw SQL ends it behind sqlx's back; the update would then run in
/// autocommit and record the outcome apart from the business writes, which
/// are gone or already committed. `@@in_transaction` (MariaDB) is the
/// server's own answer, read by the statement itself, so no extra round
/// trip is spent on the check.
fn fenced_completion(swap: &str) -> String {
    format!("{swap} AND @@in_transaction = 1")
}

/// Every statement a store runs, built once from its table name.
///
/// Parameters are positional (`?`), so each statement's doc says the order
/// in which they are bound.
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    pub(crate) name: TableName,
    pub(crate) migrate: String,
    /// key, token, fingerprint, state, payload, lease µs, retention µs.
    pub(crate) insert: String,
    /// token, fingerprint, state, payload, lease µs, retention µs, key,
    /// expected token.
    pub(crate) swap: String,
    /// As `swap`.
    pub(crate) take_over: String,
    /// As `swap`; the fenced write inside the caller's transaction.
    pub(crate) complete_in: String,
    /// key, expected token.
    pub(crate) remove: String,
    /// key.
    pub(crate) load: String,
    /// key. Deletes the key's row if it is live and settled, returning its
    /// state.
    pub(crate) reset: String,
    /// key. The state of the key's live row, for a reset that deleted
    /// nothing.
    pub(crate) live_state: String,
    /// limit.
    pub(crate) expired: String,
}

impl Statements {
    pub(crate) fn new(name: TableName) -> Statements {
        let t = name.quoted();
        // Remaining times leave the database as whole microseconds, so the
        // client never compares clocks.
        let left = |column: &str| format!("TIMESTAMPDIFF(MICROSECOND, {NOW}, {column})");
        let columns = format!(
            "token, fingerprint, state, payload, {}, {}",
            left("lease_until"),
            left("retain_until")
        );
        // In `ON DUPLICATE KEY UPDATE`, MySQL and MariaDB assign left to
        // right and a later expression sees the columns already assigned.
        // Every condition reads only `retain_until`, which is assigned
        // last, so each one tests the row as it was found.
        let replace_if_expired = |column: &str| {
            format!("{column} = IF(retain_until <= {NOW}, VALUES({column}), {column})")
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
            "token = ?, fingerprint = ?, state = ?, payload = ?, \
             lease_until = {NOW} + INTERVAL ? MICROSECOND, \
             retain_until = {NOW} + INTERVAL ? MICROSECOND"
        );
        let owned_live_in_flight =
            format!("`key` = ? AND token = ? AND state = 0 AND retain_until > {NOW}");
        let swap = format!("UPDATE {t} SET {set_new} WHERE {owned_live_in_flight}");
        Statements {
            // One statement, so one atomic step for the data dictionary:
            // concurrent runs of it from many processes serialize on the
            // table's metadata lock, and all but the first find the table
            // and do nothing. The index is part of the table's definition,
            // so no second statement can collide.
            migrate: format!(
                "CREATE TABLE IF NOT EXISTS {t} (\
                 `key` VARBINARY(1024) NOT NULL PRIMARY KEY, \
                 token VARBINARY(16) NOT NULL, \
                 fingerprint VARBINARY(64) NOT NULL, \
                 state TINYINT NOT NULL, \
                 payload LONGBLOB NOT NULL, \
                 lease_until DATETIME(6) NULL, \
                 retain_until DATETIME(6) NOT NULL, \
                 KEY retain_until_idx (retain_until)\
                 ) ENGINE = InnoDB"
            ),
            // One statement for the three outcomes of a claim. The insert
            // either adds the row or meets the existing one; on a duplicate
            // InnoDB locks that row's latest committed version (never a
            // snapshot, whatever the isolation level) and the IFs replace it
            // only if it is expired, else leave it unchanged, which writes
            // nothing. RETURNING (MariaDB 10.5+) hands back the row as it
            // stands after the statement: the caller's own token means it
            // was inserted, any other token is the live record found.
            insert: format!(
                "INSERT INTO {t} \
                 (`key`, token, fingerprint, state, payload, lease_until, retain_until) \
                 VALUES (?, ?, ?, ?, ?, {NOW} + INTERVAL ? MICROSECOND, \
                 {NOW} + INTERVAL ? MICROSECOND) \
                 ON DUPLICATE KEY UPDATE {set_on_conflict} \
                 RETURNING {columns}"
            ),
            complete_in: fenced_completion(&swap),
            swap,
            take_over: format!(
                "UPDATE {t} SET {set_new} WHERE {owned_live_in_flight} \
                 AND (lease_until IS NULL OR lease_until <= {NOW})"
            ),
            remove: format!("DELETE FROM {t} WHERE {owned_live_in_flight}"),
            load: format!("SELECT {columns} FROM {t} WHERE `key` = ? AND retain_until > {NOW}"),
            reset: format!(
                "DELETE FROM {t} WHERE `key` = ? AND state <> 0 AND retain_until > {NOW} \
                 RETURNING state"
            ),
            // A locking read sees the latest committed row, whatever the
            // isolation level.
            live_state: format!(
                "SELECT state FROM {t} WHERE `key` = ? AND retain_until > {NOW} FOR UPDATE"
            ),
            // A plain consistent read: it takes no lock, so picking a batch
            // never blocks a claim. The delete that follows goes by primary
            // key (see `delete_expired`).
            expired: format!(
                "SELECT `key` FROM {t} WHERE retain_until <= {NOW} \
                 ORDER BY retain_until LIMIT ?"
            ),
            name,
        }
    }

    /// Deletes the rows of `count` listed keys that are still expired: a
    /// key another purger deleted, or a claim renewed, since the batch was
    /// read is left alone. Point lookups on the primary key lock only the
    /// rows they delete, never a range of the retention index that claims
    /// would insert into.
    pub(crate) fn delete_expired(&self, count: usize) -> String {
        let marks = vec!["?"; count].join(", ");
        format!(
            "DELETE FROM {} WHERE `key` IN ({marks}) AND retain_until <= {NOW}",
            self.name.quoted()
        )
    }
}

#[cfg(test)]
mod tests {
    use idem_core::store::StoreErrorKind;

    use super::*;

    #[test]
    fn plain_and_database_qualified_names_are_accepted() {
        for name in ["idem_records", "_t1", "App.Idem", "d.t", "order"] {
            let parsed = TableName::parse(name).unwrap();
            assert_eq!(parsed.display(), name);
        }
        assert_eq!(
            TableName::parse(DEFAULT_TABLE).unwrap(),
            TableName::default()
        );
        let longest = "t".repeat(MAX_PART_LEN);
        assert!(TableName::parse(&longest).is_ok());
    }

    // The rules themselves are idem-sql's, tested there; these pin this
    // database's limits, quote and wording.
    #[test]
    fn names_past_the_limits_or_with_quotes_are_config_errors() {
        let too_long = "t".repeat(MAX_PART_LEN + 1);
        let qualifier_too_long = format!("{}.t", "q".repeat(MAX_PART_LEN + 1));
        for name in [
            too_long.as_str(),
            qualifier_too_long.as_str(),
            "`quoted`",
            "x; drop table y",
        ] {
            let error = TableName::parse(name).unwrap_err();
            assert_eq!(error.kind(), StoreErrorKind::Config, "{name:?}");
            assert_eq!(error.backend_name(), BACKEND);
            assert!(error.to_string().contains("`database.table`"), "{error}");
        }
    }

    #[test]
    fn statements_splice_only_the_quoted_name() {
        let statements = Statements::new(TableName::parse("app.idem").unwrap());
        assert!(statements.insert.starts_with("INSERT INTO `app`.`idem` "));
        assert!(statements
            .migrate
            .starts_with("CREATE TABLE IF NOT EXISTS `app`.`idem` ("));
        assert_eq!(
            statements.delete_expired(2),
            "DELETE FROM `app`.`idem` WHERE `key` IN (?, ?) AND retain_until <= UTC_TIMESTAMP(6)"
        );
    }

    #[test]
    fn retention_is_assigned_last_on_conflict() {
        // Every condition reads `retain_until`; assigned earlier, it would
        // make the later conditions test the new deadline.
        let statements = Statements::new(TableName::default());
        let update = statements
            .insert
            .split("ON DUPLICATE KEY UPDATE")
            .nth(1)
            .unwrap();
        let assignments = update.matches(" = IF(").count();
        let last = update.rfind(" = IF(").unwrap();
        assert_eq!(assignments, 6);
        assert!(update[..last].ends_with(", retain_until"), "{update}");
    }
}
