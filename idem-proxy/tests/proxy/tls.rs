//! TLS both ways: an `https://` upstream checked against a CA (each bad
//! certificate refused before anything is sent, its cause named, the key
//! released), and the binary's TLS listener reloading its certificate on
//! `SIGHUP`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use idem_core::store::Store;
use idem_core::{Idempotent, MemoryStore};
use idem_http::Options;
use idem_proxy::{Proxy, Route, UpstreamTls};
use idem_testing::tls::{self, Certs, ServerCert};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use tokio::net::TcpListener;

use crate::support::{serve, until};

/// An upstream over TLS presenting one certificate: every request it
/// reads is a run, answered 201 with its number.
struct HttpsUpstream {
    port: u16,
    runs: Arc<AtomicUsize>,
}

impl HttpsUpstream {
    async fn start(certs: &Certs, which: ServerCert) -> HttpsUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&runs);
        let config = tls::rustls_server_config(certs, which);
        tls::serve_tls(listener, config, move |stream| {
            let runs = Arc::clone(&counted);
            let service = service_fn(move |_: Request<Incoming>| {
                let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                let body = Bytes::from(format!(r#"{{"run":{run}}}"#));
                let mut answer = Response::new(Full::new(body));
                *answer.status_mut() = http::StatusCode::CREATED;
                async move { Ok::<_, std::convert::Infallible>(answer) }
            });
            async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            }
        });
        HttpsUpstream { port, runs }
    }

    /// By name, so the certificate's host is checked.
    fn url(&self) -> String {
        format!("https://localhost:{}", self.port)
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

fn route(store: &Arc<dyn Store>) -> Route {
    Route::new(Options::from_idempotent(Idempotent::from_arc(Arc::clone(
        store,
    ))))
}

async fn post(url: &str, key: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{url}/payments"))
        .header("idempotency-key", key)
        .body(r#"{"amount":1250}"#)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn an_https_upstream_is_proxied_and_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::new(dir.path());
    let upstream = HttpsUpstream::start(&certs, ServerCert::Good).await;
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let tls = UpstreamTls::with_ca_file(&certs.path("ca.pem")).unwrap();
    let builder = Proxy::builder(upstream.url().parse().unwrap())
        .upstream_tls(tls)
        .route(route(&store));
    let (url, _stop) = serve(builder).await;

    let first = post(&url, "tls-1").await;
    assert_eq!(first.status(), 201);
    assert_eq!(first.text().await.unwrap(), r#"{"run":1}"#);
    let again = post(&url, "tls-1").await;
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.text().await.unwrap(), r#"{"run":1}"#);
    assert_eq!(upstream.runs(), 1);
}

/// Each bad certificate is refused in the handshake: 502 `upstream-tls`
/// naming the cause, the upstream reads no request, and the key is free
/// for a retry that reaches a good upstream.
#[tokio::test]
async fn bad_upstream_certificates_are_refused_with_their_cause() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::new(dir.path());
    let good = HttpsUpstream::start(&certs, ServerCert::Good).await;
    let ca = || UpstreamTls::with_ca_file(&certs.path("ca.pem")).unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let (good_url, _stop) = serve(
        Proxy::builder(good.url().parse().unwrap())
            .upstream_tls(ca())
            .route(route(&store)),
    )
    .await;
    let cases = [
        (
            ServerCert::Good,
            UpstreamTls::mozilla(),
            "not signed by a trusted CA",
        ),
        (
            ServerCert::Good,
            UpstreamTls::with_ca_file(&certs.path("other-ca.pem")).unwrap(),
            "not signed by a trusted CA",
        ),
        (ServerCert::Expired, ca(), "has expired"),
        (
            ServerCert::OtherHost,
            ca(),
            "not valid for the upstream's host name",
        ),
    ];
    for (i, (which, trust, cause)) in cases.into_iter().enumerate() {
        let bad = HttpsUpstream::start(&certs, which).await;
        let (url, _stop) = serve(
            Proxy::builder(bad.url().parse().unwrap())
                .upstream_tls(trust)
                .route(route(&store)),
        )
        .await;
        let key = format!("bad-{i}");
        let answer = post(&url, &key).await;
        assert_eq!(answer.status(), 502, "{which:?}");
        let doc: serde_json::Value = answer.json().await.unwrap();
        assert!(
            doc["type"].as_str().unwrap().ends_with("/upstream-tls"),
            "{doc}"
        );
        let detail = doc["detail"].as_str().unwrap();
        assert!(detail.contains(cause), "{which:?}: {detail}");
        assert_eq!(bad.runs(), 0, "{which:?}");
        // Released: the same key runs at once through a good upstream.
        let retry = post(&good_url, &key).await;
        assert_eq!(retry.status(), 201, "{which:?}");
        assert_eq!(good.runs(), i + 1);
    }
}

#[tokio::test]
async fn an_insecure_upstream_is_reached_only_when_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::new(dir.path());
    let expired = HttpsUpstream::start(&certs, ServerCert::Expired).await;
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let (url, _stop) = serve(
        Proxy::builder(expired.url().parse().unwrap())
            .upstream_tls(UpstreamTls::insecure())
            .route(route(&store)),
    )
    .await;
    assert_eq!(post(&url, "insecure").await.status(), 201);
    assert_eq!(expired.runs(), 1);
}

/// The `idem-proxy` binary; dropping it kills it.
struct ProxyProcess {
    child: Child,
    port: u16,
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client trusting only the CA of `certs`, on a new connection each
/// time it is made, with the peer's certificate in each response.
fn client_trusting(certs: &Certs) -> reqwest::Client {
    let ca = std::fs::read(certs.path("ca.pem")).unwrap();
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .tls_built_in_root_certs(false)
        .tls_info(true)
        .build()
        .unwrap()
}

fn der(path: &Path) -> Vec<u8> {
    CertificateDer::from_pem_file(path).unwrap().to_vec()
}

/// Replaces `to`'s content at once, as a deployment tool would.
fn install(from: &Path, to: &Path) {
    let part = to.with_extension("part");
    std::fs::copy(from, &part).unwrap();
    std::fs::rename(part, to).unwrap();
}

#[tokio::test]
async fn the_tls_listener_reloads_its_certificate_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let (old_dir, new_dir) = (dir.path().join("old"), dir.path().join("new"));
    std::fs::create_dir_all(&old_dir).unwrap();
    std::fs::create_dir_all(&new_dir).unwrap();
    let (old, new) = (Certs::new(&old_dir), Certs::new(&new_dir));
    let (live_cert, live_key) = (dir.path().join("live.pem"), dir.path().join("live.key"));
    install(&old.server(ServerCert::Good).0, &live_cert);
    install(&old.server(ServerCert::Good).1, &live_key);
    let upstream = HttpsUpstream::start(&old, ServerCert::Good).await;

    let store = format!("sqlite://{}", dir.path().join("idem.db").display());
    let mut child = Command::new(env!("CARGO_BIN_EXE_idem-proxy"))
        .args(["--listen", "127.0.0.1:0", "--store", &store])
        .args(["--upstream", &upstream.url()])
        .arg("--upstream-ca")
        .arg(old.path("ca.pem"))
        .arg("--tls-cert")
        .arg(&live_cert)
        .arg("--tls-key")
        .arg(&live_key)
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr: std::net::SocketAddr = line
        .trim()
        .strip_prefix("idem-proxy listening on ")
        .unwrap_or_else(|| panic!("the proxy printed {line:?}"))
        .parse()
        .unwrap();
    let proxy = ProxyProcess {
        child,
        port: addr.port(),
    };
    let url = format!("https://localhost:{}/payments", proxy.port);
    let send = |client: reqwest::Client, key: &'static str| {
        let url = url.clone();
        async move {
            client
                .post(url)
                .header("idempotency-key", key)
                .body("{}")
                .send()
                .await
        }
    };
    let peer = |answer: &reqwest::Response| {
        answer
            .extensions()
            .get::<reqwest::tls::TlsInfo>()
            .and_then(|info| info.peer_certificate())
            .map(<[u8]>::to_vec)
    };

    let first = send(client_trusting(&old), "reload").await.unwrap();
    assert_eq!(first.status(), 201);
    assert_eq!(peer(&first), Some(der(&live_cert)));
    let replay = send(client_trusting(&old), "reload").await.unwrap();
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert!(send(client_trusting(&new), "reload").await.is_err());

    install(&new.server(ServerCert::Good).0, &live_cert);
    install(&new.server(ServerCert::Good).1, &live_key);
    let hup = Command::new("kill")
        .args(["-HUP", &proxy.child.id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    until(
        "a new connection gets the new certificate",
        Duration::from_secs(10),
        || {
            let send = send(client_trusting(&new), "reload");
            async move { send.await.is_ok() }
        },
    )
    .await;
    let after = send(client_trusting(&new), "reload").await.unwrap();
    assert_eq!(after.headers()["idempotent-replayed"], "true");
    assert_eq!(peer(&after), Some(der(&new.server(ServerCert::Good).0)));
    assert!(send(client_trusting(&old), "reload").await.is_err());
    assert_eq!(upstream.runs(), 1);
}
