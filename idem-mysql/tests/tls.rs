//! MariaDB over TLS, as managed services serve it: a server this binary
//! starts from `mariadb-install-db` with `require_secure_transport`,
//! certificates it makes, and `ssl-mode=VERIFY_IDENTITY` from the URL. The
//! whole conformance kit runs over it; a wrong CA and a wrong host name
//! each fail at connect, naming the cause, and a user created `REQUIRE
//! X509` gets in only with its client certificate.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use idem_conformance::Fixture;
use idem_core::store::{StoreError, StoreErrorKind};
use idem_core::Idempotent;
use idem_mysql::{sqlx, MySqlStore};
use idem_testing::process::server_ports;
use idem_testing::tls::{mariadb_tls_server, Certs, ServerCert, Watched};

/// One server, presenting the good certificate, and the certificates.
struct Servers {
    certs: Certs,
    port: u16,
    _watched: Watched,
}

/// Torn down by the watchdog when this process exits.
static SERVERS: OnceLock<Result<Servers, String>> = OnceLock::new();

fn servers() -> &'static Servers {
    let servers = SERVERS.get_or_init(|| {
        // The directory goes with the server's watchdog.
        let dir = std::env::temp_dir().join(idem_testing::unique_name("idem-mariadb-tls"));
        let certs_dir = dir.join("certs");
        std::fs::create_dir_all(&certs_dir).map_err(|e| format!("{}: {e}", certs_dir.display()))?;
        let certs = Certs::new(&certs_dir);
        let port = server_ports(1, 0)[0];
        let watched = mariadb_tls_server(&dir, &certs, ServerCert::Good, port)?;
        Ok(Servers {
            certs,
            port,
            _watched: watched,
        })
    });
    match servers {
        Ok(servers) => servers,
        Err(reason) => idem_testing::skip_binary(reason),
    }
}

impl Servers {
    /// A URL to `host` as `userinfo` with `ssl-mode` `mode`, trusting `ca`,
    /// and `client` (`&ssl-cert=…&ssl-key=…`) if asked.
    fn url(&self, userinfo: &str, host: &str, mode: &str, ca: &str, client: bool) -> String {
        let file = |name: &str| self.certs.path(name).display().to_string();
        let mut url = format!(
            "mysql://{userinfo}{host}:{}/test?ssl-mode={mode}&ssl-ca={}",
            self.port,
            file(ca)
        );
        if client {
            url.push_str(&format!(
                "&ssl-cert={}&ssl-key={}",
                file("client.pem"),
                file("client.key")
            ));
        }
        url
    }

    fn good_url(&self) -> String {
        self.url("root@", "localhost", "VERIFY_IDENTITY", "ca.pem", false)
    }
}

/// A store on a pool whose connections are all opened (TLS handshakes
/// done) before the case starts: the kit's lease cases time renewals to a
/// few hundred milliseconds, and a handshake in a debug build on a loaded
/// machine can take that long.
async fn factory() -> Fixture {
    let servers = servers();
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(POOL)
        .connect(&servers.good_url())
        .await
        .unwrap_or_else(|e| panic!("connect over TLS: {e}"));
    let mut held = Vec::new();
    for _ in 0..POOL {
        held.push(pool.acquire().await.expect("a connection over TLS"));
    }
    drop(held);
    let store = MySqlStore::from_pool(pool)
        .with_table(&idem_testing::unique_name("idem_tls"))
        .unwrap();
    store.migrate().await.expect("the table");
    let (pool, table) = (store.pool().clone(), store.table());
    // Straight from the table: through the store an expired row looks
    // absent whether a purge deleted it or not. The server and its tables
    // go when this binary exits.
    Fixture::new(store, ()).with_stored_count(move || {
        let (pool, table) = (pool.clone(), table.clone());
        async move {
            let sql = format!("SELECT COUNT(*) FROM {table}");
            let rows: i64 = sqlx::query_scalar(&sql)
                .fetch_one(&pool)
                .await
                .unwrap_or_else(|e| panic!("cannot count the rows of {table}: {e}"));
            usize::try_from(rows).expect("a row count is never negative")
        }
    })
}

/// The connections each case's pool opens up front.
const POOL: u32 = 4;

idem_conformance::store_tests!(factory);

/// Connecting fails with an error whose text names `cause`.
async fn refused(url: &str, cause: &[&str]) -> StoreError {
    let error = MySqlStore::connect(url)
        .await
        .expect_err("the connection must be refused");
    eprintln!("refused as expected: {error}");
    let text = format!("{error}").to_lowercase();
    assert!(
        cause.iter().any(|c| text.contains(c)),
        "the error does not name the cause ({cause:?}): {text}"
    );
    error
}

/// Three calls on one key through `store`: the work runs once.
async fn made_and_replayed(store: MySqlStore) {
    let store = store
        .with_table(&idem_testing::unique_name("idem_tls"))
        .unwrap();
    store.migrate().await.unwrap();
    let idem = Idempotent::new(store);
    let runs = AtomicU32::new(0);
    for _ in 0..3 {
        let n: u32 = idem
            .execute("order-1", &serde_json::json!({ "amount": 5 }), || async {
                Ok::<_, Infallible>(runs.fetch_add(1, Ordering::SeqCst) + 1)
            })
            .await
            .unwrap();
        assert_eq!(n, 1);
    }
    assert_eq!(runs.into_inner(), 1);
}

#[tokio::test]
async fn a_record_is_made_and_replayed_over_verified_tls() {
    let store = MySqlStore::connect(&servers().good_url()).await.unwrap();
    made_and_replayed(store).await;
}

#[tokio::test]
async fn a_server_signed_by_another_ca_is_refused() {
    let servers = servers();
    let url = servers.url(
        "root@",
        "localhost",
        "VERIFY_IDENTITY",
        "other-ca.pem",
        false,
    );
    let error = refused(&url, &["unknownissuer", "unknown issuer"]).await;
    assert_eq!(error.kind(), StoreErrorKind::Backend);
}

#[tokio::test]
async fn a_certificate_for_another_host_is_refused() {
    let servers = servers();
    let url = servers.url("root@", "127.0.0.1", "VERIFY_IDENTITY", "ca.pem", false);
    refused(&url, &["not valid for name", "notvalidforname"]).await;
}

#[tokio::test]
async fn required_encrypts_without_checking_and_disabled_is_turned_away() {
    let servers = servers();
    let url = servers.url("root@", "127.0.0.1", "REQUIRED", "other-ca.pem", false);
    MySqlStore::connect(&url)
        .await
        .expect("REQUIRED connects without checking the certificate");
    let url = servers.url("root@", "localhost", "DISABLED", "ca.pem", false);
    refused(&url, &["insecure transport", "access denied"]).await;
}

#[tokio::test]
async fn a_user_created_require_x509_needs_its_client_certificate() {
    let servers = servers();
    let url = servers.url("x509@", "localhost", "VERIFY_IDENTITY", "ca.pem", true);
    made_and_replayed(MySqlStore::connect(&url).await.unwrap()).await;
    let url = servers.url(
        "x509:hunter2@",
        "localhost",
        "VERIFY_IDENTITY",
        "ca.pem",
        false,
    );
    let error = refused(&url, &["access denied"]).await;
    let text = format!("{error} {error:?}");
    assert!(!text.contains("hunter2"), "{text}");
}
