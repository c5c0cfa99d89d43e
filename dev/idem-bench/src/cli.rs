//! What the binaries' command lines share: where the servers are, the
//! store list, durations, the runtime and the rule for skipped stores.

use std::path::PathBuf;
use std::time::Duration;

use idem_stores::StoreKind;
use idem_testing::Server;

use crate::stores::Places;

/// Where the servers and the SQLite files are.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Servers {
    /// Redis server.
    #[arg(long, env = Server::Redis.env_var(), default_value = Server::Redis.default_url())]
    pub(crate) redis_url: String,

    /// PostgreSQL server.
    #[arg(
        long,
        env = Server::Postgres.env_var(),
        default_value = Server::Postgres.default_url()
    )]
    pub(crate) postgres_url: String,

    /// MariaDB server.
    #[arg(
        long,
        env = Server::MySql.env_var(),
        default_value = Server::MySql.default_url()
    )]
    pub(crate) mysql_url: String,

    /// Folder for the SQLite files (a temporary folder by default).
    #[arg(long)]
    pub(crate) sqlite_dir: Option<PathBuf>,

    /// Open the SQLite stores with memory-mapped I/O of up to this many
    /// bytes (`SqliteStore::with_mmap_size`; off by default, as in the
    /// store).
    #[arg(long, value_name = "BYTES")]
    pub(crate) sqlite_mmap: Option<u64>,
}

impl Servers {
    /// The places the store modules open their stores at.
    pub(crate) fn places(&self) -> Places<'_> {
        Places {
            redis_url: &self.redis_url,
            postgres_url: &self.postgres_url,
            mysql_url: &self.mysql_url,
            sqlite_dir: self.sqlite_dir.as_deref(),
            sqlite_mmap: self.sqlite_mmap,
            postgres_notifications: false,
        }
    }
}

/// The stores named in `names` (`idem-stores` names), in the order given.
pub(crate) fn store_kinds(names: &[String]) -> Result<Vec<StoreKind>, String> {
    names
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<StoreKind>().map_err(|e| e.to_string()))
        .collect()
}

/// Reads `250ms`, `2s`, `1.5s` or `1m`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = text
        .find(|c: char| c.is_ascii_alphabetic())
        .map_or((text, "s"), |at| text.split_at(at));
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 2s or 500ms"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        _ => return Err(format!("unknown unit {unit:?}: use ms, s or m")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

/// A multi-threaded runtime, or the reason there is none.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))
}

/// Whether skipped stores fail the run: they do when the `CI` variable is
/// set, so that CI never passes on a server it could not reach.
pub(crate) fn skips_fail(skipped: &[String]) -> bool {
    let fail = std::env::var_os("CI").is_some() && !skipped.is_empty();
    if fail {
        eprintln!("idem-bench: CI is set, so an unreachable store is a failure");
    }
    fail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_common_units() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("3h").is_err());
    }

    #[test]
    fn store_lists_are_read_by_name_and_unknown_names_refused() {
        let kinds = store_kinds(&["memory".to_owned(), " redis".to_owned()]).unwrap();
        assert_eq!(kinds, vec![StoreKind::Memory, StoreKind::Redis]);
        assert!(store_kinds(&["mongo".to_owned()]).is_err());
    }
}
