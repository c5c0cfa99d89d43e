//! The HTTP behaviour suite every idem adapter passes: the same apps behind
//! `idem-tower` (axum) and `idem-actix` (actix-web), `idem-proxy` in
//! front of the same routes written in Python (`http.server`) and Node.js
//! (`node:http`), and the same routes in FastAPI behind the `idempotence`
//! package's ASGI middleware and in Express behind the `idempotence` npm
//! package's middleware, served on 127.0.0.1, driven by a real client, on
//! every store.
//!
//! A case takes an [`Adapter`] and a [`Backend`]; [`on_every_adapter_and_backend`]
//! runs it on each pair. A new adapter is one more [`Adapter`] variant and
//! one more app module with the same routes.
#![forbid(unsafe_code)]

mod actix_app;
mod axum_app;
mod backend;
mod child_app;
mod client;
mod express_app;
mod fastapi_app;
mod proxy_app;

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use idem_http::Options;
use idem_testing::upstream::{Language, Upstream};
use tokio::sync::Semaphore;

pub use backend::{backends, Backend};
pub use client::{eventually, post, problem, raw, replayable, BODY};

/// One framework adapter under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adapter {
    /// `idem_tower::IdempotencyLayer` in front of an axum router.
    Tower,
    /// `idem_actix::IdempotencyMiddleware` in front of an actix-web app.
    Actix,
    /// `idem_proxy::Proxy` in front of `examples/proxy-python/upstream.py`.
    ProxyPython,
    /// `idem_proxy::Proxy` in front of `examples/proxy-node/upstream.js`.
    ProxyNode,
    /// `idem_proxy::Proxy` in front of the Python upstream over
    /// `https://`, checked against a test CA. [`on_every_adapter_and_backend`]
    /// runs it on the memory store only: TLS changes the transport, not the
    /// store.
    ProxyTls,
    /// `idempotence.IdempotencyMiddleware` (idem-python) in front of a
    /// FastAPI app (`src/fastapi_app.py`) served by uvicorn in a child
    /// process, which opens the backend's store by URL. It runs when
    /// `IDEM_HTTP_SUITE_PYTHON` names an interpreter with the package,
    /// FastAPI and uvicorn (idem-python/ci.sh runs the suite so), and not
    /// on memory, whose records live in one process.
    FastApi,
    /// `idempotency` (idem-node's Express middleware) in front of an
    /// Express app (`src/express_app.js`) served by node in a child
    /// process, which opens the backend's store by URL. It runs when
    /// `IDEM_HTTP_SUITE_NODE` names node (idem-node/ci.sh runs the suite
    /// so), and not on memory.
    Express,
}

/// Every adapter, in the order cases run them.
pub const ADAPTERS: [Adapter; 7] = [
    Adapter::Tower,
    Adapter::Actix,
    Adapter::ProxyPython,
    Adapter::ProxyNode,
    Adapter::ProxyTls,
    Adapter::FastApi,
    Adapter::Express,
];

/// The adapters that can run here: a proxy's upstream needs its
/// interpreter, and one that is missing is skipped with a printed reason
/// (or fails the case when `CI` is set). `Adapter::FastApi` runs when
/// `IDEM_HTTP_SUITE_PYTHON` is set, and `IDEM_HTTP_SUITE_ADAPTERS=fastapi`
/// runs it alone (idem-python/ci.sh does, once the package is built);
/// `Adapter::Express` when `IDEM_HTTP_SUITE_NODE` is set, alone with
/// `IDEM_HTTP_SUITE_ADAPTERS=express` (a comma-separated list of names).
pub fn adapters() -> Vec<Adapter> {
    let only = std::env::var("IDEM_HTTP_SUITE_ADAPTERS").ok();
    ADAPTERS
        .into_iter()
        .filter(|adapter| {
            let name = format!("{adapter:?}").to_lowercase();
            only.as_deref()
                .is_none_or(|names| names.split(',').any(|n| n == name))
        })
        .filter(|adapter| match adapter {
            Adapter::FastApi => fastapi_app::python().is_some(),
            Adapter::Express => express_app::node().is_some(),
            _ => adapter.language().is_none_or(Language::available),
        })
        .collect()
}

/// The adapters that take any `Store` value: all but `Adapter::FastApi`
/// and `Adapter::Express`, whose apps open their stores by URL in another
/// process, so a store made in a case (one that fails, hangs or counts)
/// cannot reach them.
pub fn adapters_over_any_store() -> Vec<Adapter> {
    adapters()
        .into_iter()
        .filter(|adapter| !adapter.opens_its_store_by_url())
        .collect()
}

/// How the scope of a request is found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// No scope set: the options' own, which by default is each
    /// request's caller (its `Authorization` header, hashed).
    Shared,
    /// The `x-tenant` header names the scope.
    TenantHeader,
}

impl Adapter {
    /// The language of the upstream behind a proxy.
    pub fn language(self) -> Option<Language> {
        match self {
            Adapter::Tower | Adapter::Actix | Adapter::FastApi | Adapter::Express => None,
            Adapter::ProxyPython | Adapter::ProxyTls => Some(Language::Python),
            Adapter::ProxyNode => Some(Language::Node),
        }
    }

    /// Whether the app runs in a process of its own that opens the
    /// backend's store by URL (so not memory, and only the options
    /// `fastapi_app::middleware_options` reads cross to it).
    pub fn opens_its_store_by_url(self) -> bool {
        matches!(self, Adapter::FastApi | Adapter::Express)
    }

    /// Serves the app behind this adapter with `options` on a free port of
    /// 127.0.0.1 until the process ends: its base URL and its handlers.
    pub async fn start(self, options: Options) -> (String, Arc<Handlers>) {
        self.start_scoped(options, Scope::Shared).await
    }

    /// As [`start`](Self::start), with the scope taken as `scope` says.
    pub async fn start_scoped(self, options: Options, scope: Scope) -> (String, Arc<Handlers>) {
        let (addr, handlers) = match self.language() {
            None if self.opens_its_store_by_url() => {
                let app = Arc::new(match self {
                    Adapter::FastApi => fastapi_app::start(&options, scope),
                    _ => express_app::start(&options, scope),
                });
                let addr = app.addr().to_owned();
                // As a proxy's task: a case that drops its handlers still
                // talks to the app, until the case's runtime ends.
                let held = Arc::clone(&app);
                tokio::spawn(async move {
                    std::future::pending::<()>().await;
                    drop(held);
                });
                let handlers = Handlers {
                    app: Some(app),
                    ..Handlers::default()
                };
                (addr, Arc::new(handlers))
            }
            None => {
                let handlers = Arc::new(Handlers::default());
                let addr = match self {
                    Adapter::Actix => actix_app::serve(options, scope, Arc::clone(&handlers)),
                    _ => axum_app::serve(options, scope, Arc::clone(&handlers)).await,
                };
                let addr = addr.to_string();
                (addr, handlers)
            }
            Some(language) => {
                // The proxy's task holds the process too: a case that drops
                // its handlers still talks to the upstream through it.
                let upstream = Arc::new(Upstream::start(language));
                let upstream_of = Arc::clone(&upstream);
                let addr = match self {
                    Adapter::ProxyTls => {
                        proxy_app::serve_over_tls(options, scope, upstream_of).await
                    }
                    _ => proxy_app::serve(options, scope, upstream_of).await,
                };
                let addr = addr.to_string();
                let handlers = Handlers {
                    upstream: Some(upstream),
                    ..Handlers::default()
                };
                (addr, Arc::new(handlers))
            }
        };
        (format!("http://{addr}"), handlers)
    }
}

/// Runs `case` once for every adapter on every backend, naming both in the
/// output.
pub async fn on_every_adapter_and_backend<F, Fut>(case: F)
where
    F: Fn(Adapter, Backend) -> Fut,
    Fut: Future<Output = ()>,
{
    for adapter in adapters() {
        let backends = match adapter {
            Adapter::ProxyTls => backend::memory_backend().await,
            _ => backends().await,
        };
        for backend in backends {
            if adapter.opens_its_store_by_url() && backend.name == "memory" {
                // Its records live in the suite's process, out of the app's reach.
                continue;
            }
            println!("adapter: {adapter:?}, backend: {}", backend.name);
            case(adapter, backend).await;
        }
    }
}

/// The handlers behind the middleware, counting their runs: in this
/// process, in the upstream process behind a proxy, or in the process of
/// the FastAPI or Express app.
#[derive(Debug)]
pub struct Handlers {
    runs: AtomicUsize,
    /// `/gated` waits here for a permit.
    gate: Semaphore,
    upstream: Option<Arc<Upstream>>,
    app: Option<Arc<child_app::ChildApp>>,
}

impl Default for Handlers {
    fn default() -> Self {
        Handlers {
            runs: AtomicUsize::new(0),
            gate: Semaphore::new(0),
            upstream: None,
            app: None,
        }
    }
}

impl Handlers {
    /// How many times a handler has run (for an upstream, one blocking
    /// call to its `GET /effects`).
    pub fn runs(&self) -> usize {
        match (&self.upstream, &self.app) {
            (Some(upstream), _) => upstream.runs(),
            (_, Some(app)) => app.runs(),
            _ => self.runs.load(Ordering::SeqCst),
        }
    }

    /// Lets one request waiting at `/gated` through.
    pub fn open_gate(&self) {
        match (&self.upstream, &self.app) {
            (Some(upstream), _) => upstream.open_gate(),
            (_, Some(app)) => app.open_gate(),
            _ => self.gate.add_permits(1),
        }
    }

    fn run(&self) -> usize {
        self.runs.fetch_add(1, Ordering::SeqCst) + 1
    }
}

/// The size `/big` answers with.
pub const BIG_BODY: usize = 4096;

/// `/stream` answers with this many bytes ([`stream_body`]), in frames of
/// [`STREAM_FRAME`] bytes, pausing every 16 frames.
pub const STREAM_BODY: usize = 3 * 1024 * 1024 + 17;

/// The frame size of `/stream`: not a divisor of the chunk size, so frames
/// straddle chunks.
pub const STREAM_FRAME: usize = 10_007;

/// How many events `/events` sends ([`event`]), each its own frame, pausing
/// every 100.
pub const EVENTS: usize = 2_000;

/// The body `/stream` sends: every byte value, in a cycle no chunk length
/// divides.
pub fn stream_body() -> Vec<u8> {
    (0..STREAM_BODY)
        .map(|i| (i % 251) as u8 ^ (i / 251) as u8)
        .collect()
}

/// Server-Sent Event `i` of `/events`.
pub fn event(i: usize) -> String {
    format!("id: {i}\nevent: token\ndata: {{\"n\":{i},\"text\":\"word {i}\"}}\n\n")
}

/// The frames of `/stream`, pausing as a generator would.
fn stream_frames() -> impl futures_util::Stream<Item = Result<bytes::Bytes, std::io::Error>> {
    let body = bytes::Bytes::from(stream_body());
    let frames: Vec<bytes::Bytes> = (0..body.len())
        .step_by(STREAM_FRAME)
        .map(|at| body.slice(at..(at + STREAM_FRAME).min(body.len())))
        .collect();
    paced(frames, 16)
}

/// The events of `/events`, one frame each.
fn event_frames() -> impl futures_util::Stream<Item = Result<bytes::Bytes, std::io::Error>> {
    paced(
        (0..EVENTS).map(|i| bytes::Bytes::from(event(i))).collect(),
        100,
    )
}

/// How many events `/gated-events` sends before it waits at the gate; as
/// many follow.
pub const GATED_EVENTS: usize = 10;

/// The events of `/gated-events`: [`GATED_EVENTS`], then a wait for a
/// permit of `gate`, then as many again.
fn gated_event_frames(
    handlers: Arc<Handlers>,
) -> impl futures_util::Stream<Item = Result<bytes::Bytes, std::io::Error>> {
    futures_util::stream::unfold((handlers, 0), |(handlers, sent)| async move {
        if sent == 2 * GATED_EVENTS {
            return None;
        }
        if sent == GATED_EVENTS {
            // A closed semaphore means the test is over; going on is fine.
            let _ = handlers.gate.acquire().await.map(|permit| permit.forget());
        }
        let frame = bytes::Bytes::from(event(sent));
        Some((Ok(frame), (handlers, sent + 1)))
    })
}

/// `frames` as a stream that sleeps a millisecond every `every` frames.
fn paced(
    frames: Vec<bytes::Bytes>,
    every: usize,
) -> impl futures_util::Stream<Item = Result<bytes::Bytes, std::io::Error>> {
    futures_util::stream::unfold(
        (frames.into_iter(), 0),
        move |(mut frames, sent)| async move {
            if sent > 0 && sent % every == 0 {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            let frame = frames.next()?;
            Some((Ok(frame), (frames, sent + 1)))
        },
    )
}

/// What `/payments` answers: the run number, the tenant and the body length.
fn payment_body(run: usize, tenant: &str, body_len: usize) -> String {
    format!(r#"{{"run":{run},"tenant":"{tenant}","echo":{body_len}}}"#)
}

/// What `/binary` answers: every byte value, then the run number.
fn binary_body(run: usize) -> Vec<u8> {
    let mut body: Vec<u8> = (0..=255).collect();
    body.push(run as u8);
    body
}
