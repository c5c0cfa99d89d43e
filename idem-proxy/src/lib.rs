//! A reverse proxy that puts the `Idempotency-Key` protocol in front of a service written in any language.
//! Each protected request reaches the upstream once per key.
//! Every retry gets its recorded response back.
//!
//! ```text
//! idem-proxy --listen 127.0.0.1:8080 --upstream http://127.0.0.1:3000 --store redis://127.0.0.1:6379
//! ```
//!
//! With no file, every `POST` and `PATCH` that carries an `Idempotency-Key` is protected, on every path.
//! Every other request is forwarded untouched.
//!
//! The exchange is `idem-http`'s, the one `idem-tower` and `idem-actix` run.
//! So a client gets the same answers from the proxy as from those middlewares, all as `application/problem+json`:
//!
//! * the replay, with `Idempotent-Replayed: true`;
//! * 422 for another request under a key;
//! * 409 with `Retry-After` while the key is in flight, or a wait with `Prefer: wait=N`;
//! * 400 for a bad key, or a missing one where keys are required;
//! * 413 for a body over the limit;
//! * 503 when the store fails.
//!
//! Any store opens by URL (`idem-stores`).
//! The default is a SQLite file, `idem-proxy.db`.
//!
//! As a library (the command is behind the `cli` feature):
//!
//! ```
//! use idem_core::MemoryStore;
//! use idem_http::Options;
//! use idem_proxy::{Proxy, Route};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let proxy = Proxy::builder("http://127.0.0.1:3000".parse()?)
//!     .route(Route::new(Options::new(MemoryStore::new())))
//!     .build();
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! // Serves until the future given as `shutdown` completes.
//! proxy.serve(listener, async {}).await;
//! # Ok(())
//! # }
//! ```
//!
//! # Why a crate of its own
//!
//! The proxy is a server: hyper's server and client, HTTP/2, a Prometheus exporter and a TOML parser.
//! None of that belongs in the libraries an application links.
//! Nor does it belong in the `idem` command (`idem-cli`), an operator's tool for records.
//! So the proxy is its own crate and binary.
//! Its command-line parser is behind the `cli` feature (`cargo install idem-proxy --features cli`).
//!
//! # The configuration file
//!
//! `--config idem-proxy.toml` reads routes and defaults.
//! The command line's `--listen`, `--upstream`, `--store`, `--admin`, `--lease`, `--near-cache`,
//! `--upstream-ca`, `--upstream-insecure`, `--tls-cert` and `--tls-key` override the file.
//! Every setting is optional:
//!
//! ```toml
//! listen = "127.0.0.1:8080"
//! upstream = "http://127.0.0.1:3000"   # http:// or https://, optionally with a path prefix
//! upstream_ca = "/etc/idem/ca.pem"     # an https:// upstream's CA; default Mozilla's roots
//! upstream_insecure = false            # true: no certificate check (tests only)
//! tls_cert = "/etc/idem/proxy.pem"     # with tls_key: clients connect over TLS; reread on SIGHUP
//! tls_key = "/etc/idem/proxy.key"
//! store = "redis://127.0.0.1:6379"     # any idem-stores URL; default sqlite://idem-proxy.db
//! admin = "127.0.0.1:9090"             # /healthz and /metrics; off when unset
//! upstream_timeout = "30s"             # no response head by then: 504, key released
//! shutdown_grace = "30s"               # how long SIGTERM waits for requests in flight
//! lease = "60s"                        # defaults for routes that set none
//! retention = "24h"
//! near_cache = false                   # true: replays answered from this process (see below)
//!
//! [[route]]                            # the first route covering a request takes it
//! name = "payments"                    # in logs and metrics
//! methods = ["POST"]                   # default ["POST", "PATCH"]
//! paths = ["/payments", "/accounts/*/charges", "/refunds/**"]   # default ["/**"]
//! key = "required"                     # 400 without a key; default "optional"
//! header = "Idempotency-Key"
//! lease = "30s"
//! retention = "3d"
//! scope = { header = "x-tenant", hash = false }   # or { name = "shop-1" }; default: the caller (below)
//! max_request_body = 1048576           # bytes; larger is 413
//! max_response_body = 1048576          # bytes; larger is sent once, then 409 not-replayable
//! record_server_errors = false         # 2xx–4xx recorded; 5xx release the key
//! fail_open = false                    # a store failure is 503 (true: forward unprotected)
//! max_wait = "10s"                     # the cap on Prefer: wait=N; "0s" turns waiting off
//! store_timeout = "5s"
//! ```
//!
//! A path pattern matches whole segments:
//!
//! * `*` is one segment;
//! * a final `**` is any rest, none included;
//! * the query never counts.
//!
//! Requests no route covers are forwarded untouched and never reach the store.
//!
//! # Whose key it is
//!
//! Two callers never share a record by default, with or without a file.
//!
//! * A route without `scope` checks a key in its caller's scope: the `Authorization` header, hashed (`caller:<32 hex>`).
//! * Requests without `Authorization` share one scope of their own, apart from every authenticated caller.
//! * `scope = { header = … }` or `{ name = … }` names the tenant instead; a request without that header falls back to its caller.
//! * `scope = { shared_across_callers = true }` lets every caller share keys, as earlier versions did.
//!
//! Records made by an earlier version are in no scope, and their caller is unknown.
//! A request that may retry one gets 409 `not-replayable`: never another caller's response, never a second run.
//! That check costs one store read per first execution.
//! `scope = { check_unscoped_records = false }` turns it off once the retention has passed.
//!
//! # What the upstream sees
//!
//! A protected request is forwarded with its key header as the client sent it.
//!
//! * An `Idempotency-Scope` header carries the scope the key was checked in.
//!   It is absent when keys are shared, or when a route's scope header is missing.
//!   A client's own header of that name is always removed.
//! * Hop-by-hop headers are removed both ways; `Host` is kept.
//!
//! An upstream that records the key can refuse a repeat itself.
//! That closes the one window the proxy cannot close (below).
//!
//! Connections and bodies:
//!
//! * The upstream is reached over HTTP/1.1, with pooled keep-alive connections, over TLS for `https://`.
//! * Clients may speak HTTP/1.1, or HTTP/2 over cleartext (h2c with prior knowledge).
//! * Bodies that need no record are streamed both ways.
//! * A protected request's body is read, up to `max_request_body`, to fingerprint it.
//! * A protected response's body is read, up to `max_response_body`, to record it.
//!
//! # When the upstream fails
//!
//! | upstream | client gets | the key |
//! |---|---|---|
//! | refuses the connection | **502** `upstream-unavailable` | released: nothing was sent |
//! | presents a certificate that fails the check | **502** `upstream-tls`, naming the cause | released: nothing was sent |
//! | breaks the connection before answering | **502** `upstream-failed` | released |
//! | no response head within `upstream_timeout` | **504** `upstream-timeout` | released |
//! | answers 5xx | that answer | released (recorded with `record_server_errors`) |
//! | answers 2xx–4xx | that answer | recorded |
//! | breaks the connection in the middle of a recorded body | **500** `internal` | recorded as not replayable |
//!
//! The four failures release the key, so a retry is forwarded at once rather than refused for a whole lease.
//! In the last two rows the upstream may have acted.
//! That is why it gets the key: an upstream that records it makes the retry a no-op.
//!
//! # TLS
//!
//! The `tls` feature (on by default) brings rustls on the ring provider, the workspace's one TLS stack.
//! Ring needs only a C compiler; aws-lc-rs would need cmake too.
//!
//! * An `https://` upstream is checked against Mozilla's roots (webpki-roots), as a browser would.
//! * [`UpstreamTls::with_ca_file`] (`upstream_ca`) trusts a private CA instead of them.
//! * [`UpstreamTls::insecure`] (`upstream_insecure`) checks nothing. It is never a default, and is for tests.
//! * A refused certificate is **502** `upstream-tls`: the detail says an unknown CA, an expired
//!   certificate or another host's name. The handshake comes before the request, so the upstream saw nothing.
//!
//! A deployment without a terminating load balancer lets the proxy serve TLS itself.
//! [`ServerTls`] holds the certificate and key PEM files (`tls_cert`, `tls_key`).
//! [`Proxy::serve_tls`] offers HTTP/2 and HTTP/1.1 over it by ALPN.
//! [`ServerTls::reload`] reads the files again; the command calls it on `SIGHUP`.
//! The listener stays open: new connections get the new certificate, open ones keep theirs.
//! A file that cannot be read keeps the old certificate in use, so a half-renewed pair never stops the proxy.
//!
//! # A crash of the proxy
//!
//! A proxy may be killed between forwarding a request and recording its answer.
//! It cannot know whether the upstream ran the request.
//!
//! * Its claim stays in the store until the lease lapses.
//! * Until then, every retry under the key gets 409 (or waits) and is not forwarded, whichever proxy process it reaches.
//! * After the lease, one retry takes the key over and is forwarded again.
//!   The upstream may then run the request a second time, unless it records the key it is sent.
//!
//! So killed proxies never cause a run while a lease is live.
//! With the key passed upstream, an upstream that dedupes by it makes one effect.
//! Both are tested by killing the proxy with `SIGKILL` under load.
//!
//! # A near cache
//!
//! `--near-cache` (or `near_cache = true`) puts idem-core's `NearCache` in front of the store.
//! A key this process has seen settled is replayed from memory, with no store round trip.
//! Each proxy process has its own cache.
//!
//! Correctness does not depend on it:
//!
//! * nothing in flight is kept;
//! * an entry lives no longer than the record's retention, nor than 60 s.
//!
//! Turn it on where retries come back to the same proxy.
//! A record deleted by hand in the store may still replay from a proxy's cache for up to 60 s.
//!
//! # Metrics and health
//!
//! `--admin ADDR` serves `GET /healthz` and `GET /metrics` (the Prometheus text format) on a port of its own.
//! Besides idem-core's and idem-http's metrics, the proxy has its own:
//!
//! * `idem_proxy_requests_total`, by `route` (`""` for requests no route covers);
//! * `idem_proxy_upstream_errors_total`, by `kind` (`unreachable`, `tls`, `failed`, `timeout`);
//! * `idem_proxy_upstream_seconds`, the time of the upstream's answers.
#![forbid(unsafe_code)]

mod admin;
mod config;
mod proxy;
mod route;
#[cfg(feature = "tls")]
mod tls;
mod upstream;

pub use admin::{install_prometheus, serve_admin};
pub use config::{Config, ConfigError, RouteConfig, ScopeConfig};
pub use idem_http::Options;
pub use proxy::{Proxy, ProxyBody, ProxyBuilder, DEFAULT_SHUTDOWN_GRACE};
pub use route::{PathPattern, PatternError, Route, Scope, SCOPE_HEADER};
#[cfg(feature = "tls")]
pub use tls::{ServerTls, TlsError, UpstreamTls};
pub use upstream::{UpstreamError, UpstreamUrl, UpstreamUrlError, DEFAULT_UPSTREAM_TIMEOUT};

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};

/// A problem+json answer of the proxy's own, in idem-http's `type` scheme.
fn problem(status: StatusCode, name: &str, title: &str, detail: &str) -> Response<Bytes> {
    let document = serde_json::json!({
        "type": format!("tag:idem-rs.github.io,2025:problem/{name}"),
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut response = Response::new(Bytes::from(document.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}
