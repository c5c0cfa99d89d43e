//! PostgreSQL over TLS, as managed services serve it: servers this binary
//! starts from `initdb` with `ssl = on` and only `hostssl` lines that
//! require a client certificate (`clientcert=verify-full`), certificates
//! it makes, and `sslmode=verify-full` from the URL. The whole conformance
//! kit runs over it; a wrong CA, an expired certificate and a wrong host
//! name each fail at connect, naming the cause.

use std::convert::Infallible;
use std::sync::OnceLock;

use idem_conformance::Fixture;
use idem_core::store::{StoreError, StoreErrorKind};
use idem_core::Idempotent;
use idem_postgres::PostgresStore;
use idem_testing::postgres::PgCluster;
use idem_testing::process::server_ports;
use idem_testing::tls::{pg_tls_server, Certs, ServerCert, Watched};

/// Two servers: one presenting a good certificate, one an expired one.
struct Servers {
    certs: Certs,
    good: u16,
    expired: u16,
    _cluster: PgCluster,
    _watched: Vec<Watched>,
}

/// Torn down by the watchdogs when this process exits.
static SERVERS: OnceLock<Result<Servers, String>> = OnceLock::new();

fn servers() -> &'static Servers {
    let servers = SERVERS.get_or_init(|| {
        let cluster = PgCluster::new()?;
        let dir = cluster.path("certs");
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let certs = Certs::new(&dir);
        let ports = server_ports(2, 0);
        let expired = pg_tls_server(
            &cluster,
            &certs,
            ServerCert::Expired,
            "expired",
            ports[1],
            false,
        )?;
        let good = pg_tls_server(&cluster, &certs, ServerCert::Good, "good", ports[0], true)?;
        Ok(Servers {
            certs,
            good: ports[0],
            expired: ports[1],
            _cluster: cluster,
            _watched: vec![expired, good],
        })
    });
    match servers {
        Ok(servers) => servers,
        Err(reason) => idem_testing::skip_binary(reason),
    }
}

impl Servers {
    /// A URL to `host:port` with `sslmode` `mode`, trusting `ca`, with the
    /// client certificate.
    fn url(&self, userinfo: &str, host: &str, port: u16, mode: &str, ca: &str) -> String {
        let file = |name: &str| self.certs.path(name).display().to_string();
        format!(
            "postgres://{userinfo}{host}:{port}/postgres?sslmode={mode}&sslrootcert={}&sslcert={}&sslkey={}",
            file(ca),
            file("client.pem"),
            file("client.key")
        )
    }

    fn good_url(&self) -> String {
        self.url("postgres@", "localhost", self.good, "verify-full", "ca.pem")
    }
}

/// A store on a pool whose connections are all opened (TLS handshakes
/// done) before the case starts: the kit's lease cases time renewals to
/// a few hundred milliseconds, and a handshake in a debug build on a
/// loaded machine can take that long.
async fn factory() -> Fixture {
    let servers = servers();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(POOL)
        .connect(&servers.good_url())
        .await
        .unwrap_or_else(|e| panic!("connect over TLS: {e}"));
    let mut held = Vec::new();
    for _ in 0..POOL {
        held.push(pool.acquire().await.expect("a connection over TLS"));
    }
    drop(held);
    let store = PostgresStore::from_pool(pool)
        .with_table(&idem_testing::unique_name("idem_tls"))
        .unwrap();
    store.migrate().await.expect("the table");
    let (pool, table) = (store.pool().clone(), store.table());
    // Straight from the table: through the store an expired row looks
    // absent whether a purge deleted it or not.
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
    let error = PostgresStore::connect(url)
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

#[tokio::test]
async fn a_record_is_made_and_replayed_over_verified_tls() {
    let servers = servers();
    let store = PostgresStore::connect(&servers.good_url())
        .await
        .unwrap()
        .with_table(&idem_testing::unique_name("idem_tls"))
        .unwrap();
    store.migrate().await.unwrap();
    let idem = Idempotent::new(store);
    let runs = std::sync::atomic::AtomicU32::new(0);
    for _ in 0..3 {
        let n: u32 = idem
            .execute("order-1", &serde_json::json!({ "amount": 5 }), || async {
                Ok::<_, Infallible>(runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1)
            })
            .await
            .unwrap();
        assert_eq!(n, 1);
    }
    assert_eq!(runs.into_inner(), 1);
}

#[tokio::test]
async fn a_server_signed_by_another_ca_is_refused() {
    let servers = servers();
    let url = servers.url(
        "postgres@",
        "localhost",
        servers.good,
        "verify-full",
        "other-ca.pem",
    );
    refused(&url, &["unknownissuer", "unknown issuer"]).await;
}

#[tokio::test]
async fn an_expired_server_certificate_is_refused() {
    let servers = servers();
    let url = servers.url(
        "postgres@",
        "localhost",
        servers.expired,
        "verify-full",
        "ca.pem",
    );
    refused(&url, &["expired"]).await;
}

#[tokio::test]
async fn a_certificate_for_another_host_is_refused() {
    let servers = servers();
    let url = servers.url(
        "postgres@",
        "127.0.0.1",
        servers.good,
        "verify-full",
        "ca.pem",
    );
    refused(&url, &["not valid for name", "notvalidforname"]).await;
}

/// `verify-ca` checks the chain. It should skip the name, but sqlx 0.8.6
/// matches rustls's old name error only, so with rustls 0.23.46 it checks
/// the name too: the docs say to use `verify-full` with the right name.
#[tokio::test]
async fn verify_ca_checks_the_ca() {
    let servers = servers();
    let url = servers.url(
        "postgres@",
        "localhost",
        servers.good,
        "verify-ca",
        "ca.pem",
    );
    PostgresStore::connect(&url)
        .await
        .expect("verify-ca connects");
    let url = servers.url(
        "postgres@",
        "localhost",
        servers.good,
        "verify-ca",
        "other-ca.pem",
    );
    refused(&url, &["unknownissuer", "unknown issuer"]).await;
}

#[tokio::test]
async fn require_encrypts_without_checking_and_disable_is_turned_away() {
    let servers = servers();
    let url = servers.url(
        "postgres@",
        "127.0.0.1",
        servers.good,
        "require",
        "other-ca.pem",
    );
    PostgresStore::connect(&url)
        .await
        .expect("require connects");
    let url = servers.url("postgres@", "localhost", servers.good, "disable", "ca.pem");
    let error = refused(&url, &["no encryption", "pg_hba.conf", "ssl"]).await;
    assert_eq!(error.kind(), StoreErrorKind::Backend);
}

#[tokio::test]
async fn a_client_certificate_for_another_user_is_refused_without_the_password() {
    let servers = servers();
    let url = servers.url(
        "someone:hunter2@",
        "localhost",
        servers.good,
        "verify-full",
        "ca.pem",
    );
    let error = PostgresStore::connect(&url)
        .await
        .expect_err("the certificate names the user postgres");
    let text = format!("{error} {error:?}");
    assert!(!text.contains("hunter2"), "{text}");
}
