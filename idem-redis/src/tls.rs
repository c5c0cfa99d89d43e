//! A Redis URL with its TLS files: the CA to trust and the client
//! certificate, named in the URL's query the way redis-cli names them.

use idem_core::store::StoreError;
use redis::ConnectionInfo;

use crate::record::BACKEND;

/// The query parameters this crate reads off a URL; redis-rs ignores them.
const CA: &str = "cacert";
const CERT: &str = "cert";
const KEY: &str = "key";

/// What to connect to for `url`, with the TLS files its query names.
///
/// Everything redis-rs reads from a URL works: `redis://` (plain) or
/// `rediss://` (TLS), `user:password@` for an ACL user, `/DB`,
/// `?protocol=resp3`, and `#insecure`, which skips certificate checks and
/// is meant for tests only. On top of those, three query parameters name
/// files (PEM), as redis-cli's flags of the same names do:
///
/// * `cacert=FILE`: the certificates to trust instead of Mozilla's roots,
///   for a private CA (ElastiCache and most self-hosted servers);
/// * `cert=FILE` and `key=FILE`: a client certificate and its key, for
///   servers that ask for one (`tls-auth-clients yes`).
///
/// ```no_run
/// # async fn run() -> Result<(), idem_core::store::StoreError> {
/// let url = "rediss://app:secret@cache.internal:6380/0?cacert=/etc/idem/ca.pem";
/// let store = idem_redis::RedisStore::connect(idem_redis::connection_info(url)?).await?;
/// # Ok(()) }
/// ```
///
/// A bad URL, a file that cannot be read and a certificate that does not
/// parse are configuration errors. No error shows the URL's password.
pub fn connection_info(url: &str) -> Result<ConnectionInfo, StoreError> {
    let (url, files) = split_files(url);
    let bad = |error: redis::RedisError| StoreError::config(BACKEND, error);
    if files.is_empty() {
        return redis::IntoConnectionInfo::into_connection_info(url.as_str()).map_err(bad);
    }
    with_files(&url, &files)
}

/// The TLS files the query names, by parameter, and the URL without them.
fn split_files(url: &str) -> (String, Vec<(&'static str, String)>) {
    let (rest, fragment) = match url.split_once('#') {
        Some((rest, fragment)) => (rest, Some(fragment)),
        None => (url, None),
    };
    let Some((base, query)) = rest.split_once('?') else {
        return (url.to_owned(), Vec::new());
    };
    let mut files = Vec::new();
    let mut kept = form_urlencoded::Serializer::new(String::new());
    let mut any_kept = false;
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        match [CA, CERT, KEY].into_iter().find(|known| *known == name) {
            Some(known) => files.push((known, value.into_owned())),
            None => {
                kept.append_pair(&name, &value);
                any_kept = true;
            }
        }
    }
    let mut url = base.to_owned();
    if any_kept {
        url.push('?');
        url.push_str(&kept.finish());
    }
    if let Some(fragment) = fragment {
        url.push('#');
        url.push_str(fragment);
    }
    (url, files)
}

/// The certificates the TLS files of `url`'s query name (`cacert=FILE`,
/// `cert=FILE`, `key=FILE`, as [`connection_info`] reads them), or `None`
/// when it names none.
///
/// A Redis Cluster and the master a Sentinel names are reached at
/// addresses the servers announce, not at the URL's, so their clients
/// take the certificates apart from the URL:
/// [`RedisStore::connect_cluster_with_tls`](crate::RedisStore::connect_cluster_with_tls)
/// and
/// [`RedisStore::connect_sentinel_with_tls`](crate::RedisStore::connect_sentinel_with_tls).
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let urls = [
///     "rediss://cache-1.internal:6380/?cacert=/etc/idem/ca.pem",
///     "rediss://cache-2.internal:6380/?cacert=/etc/idem/ca.pem",
/// ];
/// let certificates = idem_redis::tls_certificates(urls[0])?.ok_or("the URL names no CA")?;
/// let store = idem_redis::RedisStore::connect_cluster_with_tls(urls, certificates).await?;
/// # Ok(()) }
/// ```
///
/// A file that cannot be read, and a `cert` without a `key` or the other
/// way round, are configuration errors. No error shows the URL's password.
#[cfg(feature = "tls")]
pub fn tls_certificates(url: &str) -> Result<Option<redis::TlsCertificates>, StoreError> {
    let (_, files) = split_files(url);
    if files.is_empty() {
        return Ok(None);
    }
    certificates(&files).map(Some)
}

#[cfg(feature = "tls")]
fn certificates(files: &[(&'static str, String)]) -> Result<redis::TlsCertificates, StoreError> {
    let file = |name: &str| files.iter().find(|(n, _)| *n == name).map(|(_, v)| v);
    let read = |name: &'static str| -> Result<Option<Vec<u8>>, StoreError> {
        let Some(path) = file(name) else {
            return Ok(None);
        };
        std::fs::read(std::path::Path::new(path))
            .map(Some)
            .map_err(|error| {
                StoreError::config(
                    BACKEND,
                    TlsFile {
                        name,
                        path: path.clone(),
                        error,
                    },
                )
            })
    };
    let root_cert = read(CA)?;
    let client_tls = match (read(CERT)?, read(KEY)?) {
        (Some(client_cert), Some(client_key)) => Some(redis::ClientTlsConfig {
            client_cert,
            client_key,
        }),
        (None, None) => None,
        _ => {
            return Err(StoreError::config(
                BACKEND,
                "a client certificate needs both `cert=FILE` and `key=FILE` in the URL",
            ))
        }
    };
    Ok(redis::TlsCertificates {
        client_tls,
        root_cert,
    })
}

#[cfg(feature = "tls")]
fn with_files(url: &str, files: &[(&'static str, String)]) -> Result<ConnectionInfo, StoreError> {
    let client = redis::Client::build_with_tls(url, certificates(files)?)
        .map_err(|error| StoreError::config(BACKEND, error))?;
    Ok(client.get_connection_info().clone())
}

#[cfg(not(feature = "tls"))]
fn with_files(_: &str, _: &[(&'static str, String)]) -> Result<ConnectionInfo, StoreError> {
    Err(StoreError::config(
        BACKEND,
        "the URL names TLS files, and idem-redis was built without its `tls` feature",
    ))
}

/// A TLS file the URL names that cannot be read.
#[cfg(feature = "tls")]
#[derive(Debug)]
struct TlsFile {
    name: &'static str,
    path: String,
    error: std::io::Error,
}

#[cfg(feature = "tls")]
impl std::fmt::Display for TlsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cannot read `{}={}`: {}",
            self.name, self.path, self.error
        )
    }
}

#[cfg(feature = "tls")]
impl std::error::Error for TlsFile {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tls_files_come_off_the_query_and_the_rest_stays() {
        let (url, files) = split_files(
            "rediss://u:p@h:1/0?cacert=%2Fa%20b.pem&protocol=resp3&cert=c&key=k#insecure",
        );
        assert_eq!(url, "rediss://u:p@h:1/0?protocol=resp3#insecure");
        assert_eq!(
            files,
            [
                (CA, "/a b.pem".to_owned()),
                (CERT, "c".to_owned()),
                (KEY, "k".to_owned())
            ]
        );
        let (url, files) = split_files("redis://h/0?cacert=x");
        assert_eq!((url.as_str(), files.len()), ("redis://h/0", 1));
        assert_eq!(split_files("redis://h").0, "redis://h");
    }

    #[test]
    fn bad_tls_files_are_configuration_errors_without_the_password() {
        for url in [
            "rediss://u:hunter2@h/0?cacert=/nonexistent/ca.pem",
            "rediss://u:hunter2@h/0?cert=/nonexistent/c.pem",
            "redis://u:hunter2@h/0?cacert=/dev/null",
            "nonsense://u:hunter2@h",
        ] {
            let error = connection_info(url).unwrap_err();
            assert_eq!(
                error.kind(),
                idem_core::store::StoreErrorKind::Config,
                "{url}"
            );
            let text = format!("{error} {error:?}");
            assert!(!text.contains("hunter2"), "{text}");
        }
    }
}
