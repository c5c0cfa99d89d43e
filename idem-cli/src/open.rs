//! Opening a store from a URL, read-only where the store allows it.

use std::path::Path;
use std::sync::Arc;

use idem_core::inspect::Inspect;

/// A store URL and the options that name where its records live.
#[derive(Debug)]
pub(crate) struct Target<'a> {
    pub(crate) url: &'a str,
    pub(crate) table: Option<&'a str>,
    pub(crate) prefix: Option<&'a str>,
}

/// Opens the store the URL names. Creates nothing: a SQLite file must
/// exist, and a SQL table is not migrated.
pub(crate) async fn open(target: &Target<'_>) -> Result<Arc<dyn Inspect>, String> {
    let url = target.url;
    let scheme = url.split(':').next().unwrap_or("");
    let failed = |e: idem_core::store::StoreError| format!("cannot open {}: {e}", redact(url));
    match scheme {
        "sqlite" => {
            let path = url["sqlite:".len()..].trim_start_matches("//");
            if path.is_empty() || !Path::new(path).is_file() {
                return Err(format!(
                    "no SQLite database at {path:?} (write sqlite:PATH with the file's path)"
                ));
            }
            let store = idem_sqlite::SqliteStore::open(path).await.map_err(failed)?;
            Ok(Arc::new(store))
        }
        "redis" | "rediss" => {
            let info = idem_redis::connection_info(url).map_err(failed)?;
            let store = idem_redis::RedisStore::connect(info)
                .await
                .map_err(failed)?;
            let prefix = target.prefix.unwrap_or(idem_redis::DEFAULT_PREFIX);
            Ok(Arc::new(store.with_prefix(prefix)))
        }
        "postgres" | "postgresql" => {
            let store = idem_postgres::PostgresStore::connect(url)
                .await
                .map_err(failed)?;
            let table = target.table.unwrap_or(idem_postgres::DEFAULT_TABLE);
            Ok(Arc::new(store.with_table(table).map_err(failed)?))
        }
        "mysql" | "mariadb" => {
            let url = format!("mysql:{}", &url[scheme.len() + 1..]);
            let store = idem_mysql::MySqlStore::connect(&url)
                .await
                .map_err(failed)?;
            let table = target.table.unwrap_or(idem_mysql::DEFAULT_TABLE);
            Ok(Arc::new(store.with_table(table).map_err(failed)?))
        }
        _ => Err(format!(
            "unknown store URL {:?}: use sqlite:PATH, redis://HOST, postgres://HOST/DB or mysql://HOST/DB",
            redact(url)
        )),
    }
}

/// The URL without its password, for messages.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    match authority.rsplit_once('@') {
        Some((user, host)) => {
            let user = user.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}/{path}")
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("redis://127.0.0.1/"), "redis://127.0.0.1/");
        assert_eq!(redact("sqlite:a.db"), "sqlite:a.db");
    }
}
