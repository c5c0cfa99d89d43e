//! A store as a user names it: `sqlite:PATH`, `redis://…`, ….

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use idem_core::store::{Store, StoreError};

use crate::{Isolation, StoreKind, UnknownStore};

/// A store and where it is: a server's URL, a file's path, or nothing for
/// memory. Parsed from a URL whose scheme names the store.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreUrl {
    kind: StoreKind,
    location: String,
}

impl StoreUrl {
    /// A store at `location`: a server's URL, a file's path for SQLite,
    /// anything for memory.
    pub fn new(kind: StoreKind, location: impl Into<String>) -> StoreUrl {
        StoreUrl {
            kind,
            location: location.into(),
        }
    }

    /// Which store.
    pub fn kind(&self) -> StoreKind {
        self.kind
    }

    /// Where: the server's URL (with its password), the file's path, or
    /// empty for memory.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// The file's path, for a store kept in a file.
    pub fn path(&self) -> Option<&Path> {
        (self.kind.isolation() == Isolation::File).then(|| Path::new(&self.location))
    }

    /// Opens the store with its default prefix or table, connecting to its
    /// server and creating its file or table where needed.
    pub async fn open(&self) -> Result<Arc<dyn Store>, StoreError> {
        self.kind.open(&self.location, None).await
    }

    /// Opens the store isolated by `name` (a key prefix or a table; see
    /// [`StoreKind::open`]).
    pub async fn open_named(&self, name: &str) -> Result<Arc<dyn Store>, StoreError> {
        self.kind.open(&self.location, Some(name)).await
    }
}

impl FromStr for StoreUrl {
    type Err = UnknownStore;

    /// `memory`, `sqlite:PATH` (or `sqlite://PATH`), or a server URL whose
    /// scheme names a store.
    fn from_str(url: &str) -> Result<StoreUrl, UnknownStore> {
        let unknown = || UnknownStore(url.to_owned());
        let kind = StoreKind::of_url(url).ok_or_else(unknown)?;
        let location = match kind.isolation() {
            Isolation::Process => {
                if url.contains(':') && url.trim_end_matches(':') != kind.schemes()[0] {
                    return Err(unknown());
                }
                String::new()
            }
            Isolation::File => {
                let (_, path) = url.split_once(':').ok_or_else(unknown)?;
                // `sqlite://PATH` is the URL form of the same thing.
                let path = path.strip_prefix("//").unwrap_or(path);
                if path.is_empty() {
                    return Err(unknown());
                }
                path.to_owned()
            }
            Isolation::KeyPrefix | Isolation::Table => {
                if !url.contains("://") {
                    return Err(unknown());
                }
                url.to_owned()
            }
        };
        Ok(StoreUrl { kind, location })
    }
}

impl fmt::Display for StoreUrl {
    /// Shows the store without any password in its URL, so it can be
    /// logged.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind.isolation() {
            Isolation::Process => f.write_str(self.kind.schemes()[0]),
            Isolation::File => write!(f, "{}:{}", self.kind.schemes()[0], self.location),
            Isolation::KeyPrefix | Isolation::Table => f.write_str(&redact(&self.location)),
        }
    }
}

impl fmt::Debug for StoreUrl {
    /// As [`Display`](fmt::Display): no password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreUrl({self})")
    }
}

/// `scheme://user:secret@host` → `scheme://user:***@host`.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    match rest[..at].split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***{}", &rest[at..]),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> StoreUrl {
        url.parse().unwrap()
    }

    #[test]
    fn urls_parse_by_scheme() {
        assert_eq!(parse("memory").kind(), StoreKind::Memory);
        assert_eq!(parse("memory:").kind(), StoreKind::Memory);
        assert_eq!(parse("sqlite:a.db").path(), Some(Path::new("a.db")));
        assert_eq!(
            parse("sqlite:///tmp/a.db").path(),
            Some(Path::new("/tmp/a.db"))
        );
        assert_eq!(parse("redis://h:6379").location(), "redis://h:6379");
        assert_eq!(parse("postgresql://h/db").kind(), StoreKind::Postgres);
        assert_eq!(parse("mariadb://h/db").kind(), StoreKind::MySql);
        assert_eq!(parse("redis://h").path(), None);
        #[cfg(feature = "dynamodb")]
        assert_eq!(
            parse("dynamodb://idem?region=eu-west-1").kind(),
            StoreKind::DynamoDb
        );
        for bad in [
            "mongodb://h/db",
            "sqlite:",
            "sqlite",
            "memory:x",
            "redis:h",
            "",
        ] {
            assert!(bad.parse::<StoreUrl>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn passwords_never_show_in_a_displayed_store() {
        assert_eq!(
            parse("postgres://root:hunter2@db:5432/test").to_string(),
            "postgres://root:***@db:5432/test"
        );
        assert_eq!(
            parse("redis://:hunter2@cache/0").to_string(),
            "redis://:***@cache/0"
        );
        assert_eq!(
            format!("{:?}", parse("redis://u:pw@cache/0")),
            "StoreUrl(redis://u:***@cache/0)"
        );
        assert_eq!(parse("redis://cache/0").to_string(), "redis://cache/0");
        assert_eq!(parse("sqlite://a.db").to_string(), "sqlite:a.db");
        assert_eq!(parse("memory").to_string(), "memory");
    }

    #[test]
    fn a_url_survives_display_and_parse() {
        for url in [
            "memory",
            "sqlite:/tmp/x.db",
            "redis://h:1/0",
            "mysql://u@h/db",
        ] {
            assert_eq!(parse(url).to_string(), url);
            assert_eq!(parse(&parse(url).to_string()), parse(url));
        }
    }
}
