//! Redis over TLS, as managed services serve it: `rediss://` to servers
//! this binary starts with TLS only (no plain port), certificates it makes
//! (a CA, a server certificate for `localhost`, a client certificate), and
//! client certificates required (mutual TLS). The whole conformance kit
//! runs over it; a wrong CA, an expired certificate and a wrong host name
//! each fail at connect, naming the cause.

#[allow(dead_code)]
mod support;

use std::convert::Infallible;
use std::sync::OnceLock;
use std::time::Duration;

use idem_conformance::Fixture;
use idem_core::store::StoreErrorKind;
use idem_core::Idempotent;
use idem_redis::{redis, RedisStore};
use idem_testing::process::server_ports;
use idem_testing::tls::{redis_tls_server, wait_for_port, Certs, ServerCert, Watched};

/// The servers: one per [`ServerCert`], and the certificates.
struct Servers {
    certs: Certs,
    good: u16,
    expired: u16,
    other_host: u16,
    _watched: Vec<Watched>,
}

/// Torn down by the watchdogs when this process exits.
static SERVERS: OnceLock<Result<Servers, String>> = OnceLock::new();

fn servers() -> &'static Servers {
    let servers = SERVERS.get_or_init(|| {
        if let Some(reason) = support::servers::binaries_missing() {
            return Err(reason);
        }
        let dir = tempfile::tempdir().expect("a directory").keep();
        // The directory goes with the first server's watchdog.
        let certs = Certs::new(&dir);
        let ports = server_ports(3, 0);
        let kinds = [ServerCert::Good, ServerCert::Expired, ServerCert::OtherHost];
        let mut watched = Vec::new();
        for (which, port) in kinds.into_iter().zip(&ports) {
            let server = redis_tls_server(&dir, &certs, which, *port)
                .unwrap_or_else(|e| panic!("redis-server starts: {e}"));
            watched.push(server);
            assert!(
                wait_for_port(*port, Duration::from_secs(10)),
                "redis-server with TLS on {port} never listened"
            );
        }
        watched.push(Watched::start(&["true".into()], Some(&dir)).expect("sh"));
        Ok(Servers {
            certs,
            good: ports[0],
            expired: ports[1],
            other_host: ports[2],
            _watched: watched,
        })
    });
    match servers {
        Ok(servers) => servers,
        Err(reason) => support::skip_binary(reason),
    }
}

impl Servers {
    /// A `rediss://` URL to `localhost:port` trusting `ca` and presenting
    /// the client certificate, with `userinfo` (`user:password@`) and a
    /// fragment (`#insecure`).
    fn url(&self, userinfo: &str, port: u16, ca: &str, fragment: &str) -> String {
        let file = |name: &str| self.certs.path(name).display().to_string();
        format!(
            "rediss://{userinfo}localhost:{port}/?cacert={}&cert={}&key={}{fragment}",
            file(ca),
            file("client.pem"),
            file("client.key")
        )
    }
}

async fn connect(url: &str) -> Result<RedisStore, idem_core::store::StoreError> {
    RedisStore::connect(idem_redis::connection_info(url)?).await
}

async fn factory() -> Fixture {
    let servers = servers();
    let url = servers.url("", servers.good, "ca.pem", "");
    let prefix = support::unique_prefix();
    let store = connect(&url)
        .await
        .unwrap_or_else(|e| panic!("connect over TLS: {e}"))
        .with_prefix(&prefix);
    // The keys under the prefix, over TLS too; `KEYS` skips a key Redis
    // has expired by itself, so such a record counts as gone.
    let client = redis::Client::open(idem_redis::connection_info(&url).unwrap()).unwrap();
    let pattern = format!("{prefix}*");
    Fixture::new(store, ()).with_stored_count(move || {
        let (client, pattern) = (client.clone(), pattern.clone());
        async move {
            let mut connection = client.get_multiplexed_async_connection().await.unwrap();
            let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
                .arg(&pattern)
                .query_async(&mut connection)
                .await
                .unwrap();
            keys.len()
        }
    })
}

idem_conformance::store_tests!(factory);

/// Connecting fails, as a backend error whose text names `cause`.
async fn refused(url: &str, cause: &[&str]) {
    let error = connect(url)
        .await
        .expect_err("the connection must be refused");
    let text = format!("{error}").to_lowercase();
    eprintln!("refused as expected: {error}");
    assert_eq!(error.kind(), StoreErrorKind::Backend, "{text}");
    assert!(
        cause.iter().any(|c| text.contains(c)),
        "the error does not name the cause ({cause:?}): {text}"
    );
}

#[tokio::test]
async fn a_record_is_made_and_replayed_over_mutual_tls() {
    let servers = servers();
    let url = servers.url("", servers.good, "ca.pem", "");
    let idem = Idempotent::new(
        connect(&url)
            .await
            .unwrap()
            .with_prefix(support::unique_prefix()),
    );
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
    refused(
        &servers.url("", servers.good, "other-ca.pem", ""),
        &["unknownissuer", "unknown issuer"],
    )
    .await;
}

#[tokio::test]
async fn an_expired_server_certificate_is_refused() {
    let servers = servers();
    refused(
        &servers.url("", servers.expired, "ca.pem", ""),
        &["expired"],
    )
    .await;
}

#[tokio::test]
async fn a_certificate_for_another_host_is_refused() {
    let servers = servers();
    refused(
        &servers.url("", servers.other_host, "ca.pem", ""),
        &["not valid for name", "notvalidforname"],
    )
    .await;
}

#[tokio::test]
async fn insecure_skips_the_checks_only_when_the_url_says_so() {
    let servers = servers();
    let url = servers.url("", servers.other_host, "other-ca.pem", "#insecure");
    let store = connect(&url).await.expect("#insecure connects");
    let idem = Idempotent::new(store.with_prefix(support::unique_prefix()));
    let n: u32 = idem
        .execute("k", &(), || async { Ok::<_, Infallible>(7) })
        .await
        .unwrap();
    assert_eq!(n, 7);
}

#[tokio::test]
async fn a_client_without_a_certificate_is_turned_away() {
    let servers = servers();
    let url = format!(
        "rediss://localhost:{}/?cacert={}",
        servers.good,
        servers.certs.path("ca.pem").display()
    );
    assert!(
        connect(&url).await.is_err(),
        "the server asks for a client certificate"
    );
}

#[tokio::test]
async fn an_acl_user_connects_and_a_wrong_password_never_shows() {
    let servers = servers();
    let client = redis::Client::open(
        idem_redis::connection_info(&servers.url("", servers.good, "ca.pem", "")).unwrap(),
    )
    .unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let user = support::unique_prefix().replace(':', "");
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&user)
        .arg("on")
        .arg(">s3cret-pw")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .query_async::<()>(&mut connection)
        .await
        .unwrap();
    let good = servers.url(&format!("{user}:s3cret-pw@"), servers.good, "ca.pem", "");
    let store = connect(&good).await.expect("the ACL user connects");
    let idem = Idempotent::new(store.with_prefix(support::unique_prefix()));
    let n: u32 = idem
        .execute("k", &(), || async { Ok::<_, Infallible>(3) })
        .await
        .unwrap();
    assert_eq!(n, 3);

    let bad = servers.url(&format!("{user}:wr0ng-pw@"), servers.good, "ca.pem", "");
    let error = connect(&bad)
        .await
        .expect_err("a wrong password is refused");
    let text = format!("{error} {error:?}");
    assert!(!text.contains("wr0ng-pw"), "{text}");
    assert!(
        text.to_lowercase().contains("auth") || text.contains("WRONGPASS"),
        "{text}"
    );
}
