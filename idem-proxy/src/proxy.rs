//! `Proxy`: routes a request to its protected route or straight to the
//! upstream, and serves HTTP/1.1 and h2c with a graceful shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tower_service::Service;

use crate::route::{Ready, Route, Scope, SCOPE_HEADER};
use crate::upstream::{BoxError, Forward, Trust, UpstreamUrl, DEFAULT_UPSTREAM_TIMEOUT};

/// The listener's TLS; nothing without the `tls` feature.
#[cfg(feature = "tls")]
use crate::tls::ServerTls;
#[cfg(not(feature = "tls"))]
#[derive(Debug, Clone)]
pub(crate) enum ServerTls {}

/// The body of every response the proxy sends.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// The default bound on a graceful shutdown: requests still running after
/// it are cut.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// A reverse proxy in front of one upstream: requests a [`Route`] covers
/// go through `idem-http`'s exchange, every other request is forwarded
/// untouched. Cheap to clone; clones share the upstream's connection pool.
#[derive(Debug, Clone)]
pub struct Proxy {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    forward: Forward,
    routes: Vec<Ready>,
    grace: Duration,
}

/// Builds a [`Proxy`].
#[derive(Debug, Clone)]
pub struct ProxyBuilder {
    upstream: UpstreamUrl,
    routes: Vec<Route>,
    timeout: Duration,
    grace: Duration,
    trust: Trust,
}

impl Proxy {
    /// A proxy to `upstream` with no protected route yet.
    pub fn builder(upstream: UpstreamUrl) -> ProxyBuilder {
        ProxyBuilder {
            upstream,
            routes: Vec::new(),
            timeout: DEFAULT_UPSTREAM_TIMEOUT,
            grace: DEFAULT_SHUTDOWN_GRACE,
            trust: Trust::default(),
        }
    }

    /// Answers one request: through the first route that covers its method
    /// and path, or forwarded untouched.
    pub async fn handle(&self, mut request: Request<Incoming>) -> Response<ProxyBody> {
        // Only the proxy says what the scope is.
        request.headers_mut().remove(SCOPE_HEADER);
        let route = self
            .inner
            .routes
            .iter()
            .find(|ready| ready.route.covers(request.method(), request.uri().path()));
        let Some(ready) = route else {
            metrics::counter!("idem_proxy_requests_total", "route" => "").increment(1);
            let mut forward = self.inner.forward.clone();
            return match forward.call(request).await {
                Ok(response) => response.map(|body| body.map_err(Into::into).boxed_unsync()),
                Err(error) => full(error.into_response()),
            };
        };
        metrics::counter!("idem_proxy_requests_total", "route" => ready.route.name.clone())
            .increment(1);
        ready.mark_scope(request.headers_mut());
        // A route without a scope checks keys in the caller's scope (the
        // layer reads it from `Authorization`); the upstream is told which.
        if ready.route.scope == Scope::Shared && ready.route.options.idempotent().scope().is_empty()
        {
            if let Some(caller) = ready.route.options.caller(request.headers()) {
                let scope = HeaderValue::from_str(&caller.scope()).expect("ASCII");
                request.headers_mut().insert(SCOPE_HEADER, scope);
            }
        }
        let mut service = ready.service.clone();
        match service.call(request).await {
            Ok(response) => response.map(BodyExt::boxed_unsync),
            Err(error) => full(error.into_response()),
        }
    }

    /// Serves the proxy on `listener` until `shutdown` completes, then
    /// stops accepting, lets the requests in flight finish (for at most
    /// the grace period) and returns. HTTP/1.1 and HTTP/2 over cleartext
    /// (h2c, prior knowledge) are told apart by the connection's preface.
    pub async fn serve(self, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        self.serve_on(listener, None, shutdown).await;
    }

    /// As [`serve`](Self::serve), over TLS with `tls`'s certificate: each
    /// connection's handshake takes the certificate loaded at that moment,
    /// so [`ServerTls::reload`] changes it without closing the listener.
    /// HTTP/2 and HTTP/1.1 are offered by ALPN.
    #[cfg(feature = "tls")]
    pub async fn serve_tls(
        self,
        listener: TcpListener,
        tls: ServerTls,
        shutdown: impl Future<Output = ()>,
    ) {
        self.serve_on(listener, Some(tls), shutdown).await;
    }

    async fn serve_on(
        self,
        listener: TcpListener,
        tls: Option<ServerTls>,
        shutdown: impl Future<Output = ()>,
    ) {
        let grace = self.inner.grace;
        serve_connections(listener, tls, shutdown, grace, move |request| {
            let proxy = self.clone();
            async move { proxy.handle(request).await }
        })
        .await;
    }
}

impl ProxyBuilder {
    /// Adds a protected route; the first route that covers a request
    /// takes it.
    pub fn route(mut self, route: Route) -> ProxyBuilder {
        self.routes.push(route);
        self
    }

    /// How long the upstream may take to answer (its status and headers)
    /// before the client gets 504 and a protected key is released.
    /// Default 30 s.
    pub fn upstream_timeout(mut self, timeout: Duration) -> ProxyBuilder {
        self.timeout = timeout;
        self
    }

    /// How long a graceful shutdown waits for requests in flight.
    /// Default 30 s.
    pub fn shutdown_grace(mut self, grace: Duration) -> ProxyBuilder {
        self.grace = grace;
        self
    }

    /// How an `https://` upstream's certificate is checked. Default:
    /// against Mozilla's roots.
    #[cfg(feature = "tls")]
    pub fn upstream_tls(mut self, tls: crate::tls::UpstreamTls) -> ProxyBuilder {
        self.trust = tls;
        self
    }

    /// The proxy. Its connection pool starts empty.
    pub fn build(self) -> Proxy {
        let forward = Forward::new(self.upstream, self.timeout, &self.trust);
        let routes = self
            .routes
            .into_iter()
            .map(|route| Ready::new(route, forward.clone()))
            .collect();
        Proxy {
            inner: Arc::new(Inner {
                forward,
                routes,
                grace: self.grace,
            }),
        }
    }
}

fn full(response: Response<Bytes>) -> Response<ProxyBody> {
    response.map(|body| {
        http_body_util::Full::new(body)
            .map_err(|never| match never {})
            .boxed_unsync()
    })
}

/// Serves `handle` on `listener`, HTTP/1.1 and h2c, until `shutdown`,
/// then drains connections for at most `grace`.
pub(crate) async fn serve_with<H, Fut>(
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
    handle: H,
) where
    H: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    serve_connections(listener, None, shutdown, grace, handle).await;
}

/// As [`serve_with`], over `tls` when given.
async fn serve_connections<H, Fut>(
    listener: TcpListener,
    tls: Option<ServerTls>,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
    handle: H,
) where
    H: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<ProxyBody>> + Send + 'static,
{
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: wait a moment
                    // rather than spin.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let handle = handle.clone();
        let service = service_fn(move |request| {
            let answer = handle(request);
            async move { Ok::<_, Infallible>(answer.await) }
        });
        let builder = builder.clone();
        // Made here, so a shutdown waits for handshakes under way too.
        let watcher = graceful.watcher();
        let tls = tls.clone();
        tokio::spawn(async move {
            let served = match tls {
                None => {
                    let connection = builder.serve_connection(TokioIo::new(stream), service);
                    watcher.watch(connection.into_owned()).await
                }
                #[cfg(feature = "tls")]
                Some(tls) => match tls.accept(stream).await {
                    Ok(stream) => {
                        let connection = builder.serve_connection(TokioIo::new(stream), service);
                        watcher.watch(connection.into_owned()).await
                    }
                    Err(error) => {
                        tracing::debug!(%peer, %error, "TLS handshake failed");
                        return;
                    }
                },
                #[cfg(not(feature = "tls"))]
                Some(never) => match never {},
            };
            if let Err(error) = served {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            ?grace,
            "requests still in flight at the end of the grace period"
        );
    }
}
