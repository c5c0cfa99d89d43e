//! The upstream: one pooled keep-alive client, and the service that
//! forwards a request to it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body::Body;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower_service::Service;

/// The error type bodies are boxed with.
pub(crate) type BoxError = idem_http::BoxError;

type UpstreamBody = UnsyncBoxBody<Bytes, BoxError>;

/// The default bound on the upstream's answer (its status and headers).
pub const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// An upstream URL that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("upstream `{url}`: {reason}")]
pub struct UpstreamUrlError {
    url: String,
    reason: &'static str,
}

/// Where requests go: an `http://host:port` or `https://host:port` URL,
/// optionally with a path prefix that every forwarded path is appended to.
/// `https://` needs the `tls` feature (on by default).
#[derive(Debug, Clone)]
pub struct UpstreamUrl {
    scheme: Scheme,
    authority: Authority,
    prefix: String,
}

impl std::str::FromStr for UpstreamUrl {
    type Err = UpstreamUrlError;

    fn from_str(url: &str) -> Result<UpstreamUrl, UpstreamUrlError> {
        let error = |reason| UpstreamUrlError {
            url: url.to_owned(),
            reason,
        };
        let uri: Uri = url.parse().map_err(|_| error("not a URL"))?;
        let scheme = match uri.scheme() {
            Some(scheme) if *scheme == Scheme::HTTP => Scheme::HTTP,
            Some(scheme) if *scheme == Scheme::HTTPS && cfg!(feature = "tls") => Scheme::HTTPS,
            Some(scheme) if *scheme == Scheme::HTTPS => {
                return Err(error("https:// needs the proxy's `tls` feature"))
            }
            _ => return Err(error("the scheme must be http:// or https://")),
        };
        let authority = uri.authority().cloned().ok_or(error("no host"))?;
        if uri.query().is_some() {
            return Err(error("a query is not allowed"));
        }
        let prefix = uri.path().trim_end_matches('/').to_owned();
        Ok(UpstreamUrl {
            scheme,
            authority,
            prefix,
        })
    }
}

/// Why the upstream gave no answer. A protected request's key is released
/// in each case, so a retry is forwarded again (see the crate docs).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UpstreamError {
    /// No connection could be made: nothing was sent (502).
    #[error("the upstream could not be reached: {0}")]
    Unreachable(#[source] BoxError),
    /// The upstream's TLS certificate was refused, or its handshake
    /// failed: nothing was sent (502). The message names the cause: an
    /// unknown CA, an expired certificate, another host's certificate.
    #[error("the upstream's TLS handshake failed: {0}")]
    Tls(String),
    /// The connection failed after the request was sent, before the
    /// response's head came back (502).
    #[error("the upstream failed before answering: {0}")]
    Failed(#[source] BoxError),
    /// No response head within the time-out (504).
    #[error("the upstream did not answer within {0:?}")]
    TimedOut(Duration),
}

impl UpstreamError {
    /// The problem+json answer sent to the client.
    pub(crate) fn into_response(self) -> Response<Bytes> {
        let (status, name, title) = match &self {
            UpstreamError::Unreachable(_) => (
                StatusCode::BAD_GATEWAY,
                "upstream-unavailable",
                "Upstream unavailable",
            ),
            UpstreamError::Tls(_) => (
                StatusCode::BAD_GATEWAY,
                "upstream-tls",
                "Upstream TLS failed",
            ),
            UpstreamError::Failed(_) => (
                StatusCode::BAD_GATEWAY,
                "upstream-failed",
                "Upstream failed",
            ),
            UpstreamError::TimedOut(_) => (
                StatusCode::GATEWAY_TIMEOUT,
                "upstream-timeout",
                "Upstream timed out",
            ),
        };
        crate::problem(status, name, title, &self.to_string())
    }

    fn kind(&self) -> &'static str {
        match self {
            UpstreamError::Unreachable(_) => "unreachable",
            UpstreamError::Tls(_) => "tls",
            UpstreamError::Failed(_) => "failed",
            UpstreamError::TimedOut(_) => "timeout",
        }
    }
}

/// The service that forwards a request to the upstream: the URI made
/// absolute on the upstream, hop-by-hop headers removed both ways, the
/// answer bounded by the time-out. Clones share one connection pool.
#[derive(Clone, Debug)]
pub(crate) struct Forward {
    client: Client<Connector, UpstreamBody>,
    url: UpstreamUrl,
    timeout: Duration,
}

#[cfg(feature = "tls")]
type Connector = hyper_rustls::HttpsConnector<HttpConnector>;
#[cfg(not(feature = "tls"))]
type Connector = HttpConnector;

/// How an `https://` upstream is checked; nothing without the `tls`
/// feature, where no upstream is `https://`.
#[cfg(feature = "tls")]
pub(crate) type Trust = crate::tls::UpstreamTls;
#[cfg(not(feature = "tls"))]
#[derive(Debug, Clone, Default)]
pub(crate) struct Trust(());

impl Forward {
    pub(crate) fn new(url: UpstreamUrl, timeout: Duration, trust: &Trust) -> Forward {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_keepalive(Some(Duration::from_secs(60)));
        #[cfg(feature = "tls")]
        let connector = {
            // `https://` URIs need the connector to leave them alone.
            connector.enforce_http(false);
            hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(trust.client_config())
                .https_or_http()
                .enable_http1()
                .wrap_connector(connector)
        };
        #[cfg(not(feature = "tls"))]
        let () = {
            let _ = trust;
        };
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(1024)
            .build(connector);
        Forward {
            client,
            url,
            timeout,
        }
    }

    fn target(&self, uri: &Uri) -> Result<Uri, http::Error> {
        let path = uri.path_and_query().map_or("/", PathAndQuery::as_str);
        let path_and_query = if self.url.prefix.is_empty() {
            PathAndQuery::try_from(path)?
        } else {
            PathAndQuery::try_from(format!("{}{path}", self.url.prefix))?
        };
        Uri::builder()
            .scheme(self.url.scheme.clone())
            .authority(self.url.authority.clone())
            .path_and_query(path_and_query)
            .build()
    }
}

impl<B> Service<Request<B>> for Forward
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<Incoming>;
    type Error = UpstreamError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Incoming>, UpstreamError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), UpstreamError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (mut parts, body) = request.into_parts();
        let target = self.target(&parts.uri);
        let client = self.client.clone();
        let timeout = self.timeout;
        Box::pin(async move {
            let target = target.map_err(|error| UpstreamError::Unreachable(error.into()))?;
            // An HTTP/2 request names its host in the URI alone.
            if !parts.headers.contains_key(header::HOST) {
                if let Some(host) = parts.uri.authority() {
                    if let Ok(value) = HeaderValue::from_str(host.as_str()) {
                        parts.headers.insert(header::HOST, value);
                    }
                }
            }
            strip_hop_by_hop(&mut parts.headers);
            parts.uri = target;
            parts.version = Version::HTTP_11;
            let request = Request::from_parts(parts, body.map_err(Into::into).boxed_unsync());
            let started = Instant::now();
            let answered = tokio::time::timeout(timeout, client.request(request)).await;
            metrics::histogram!("idem_proxy_upstream_seconds")
                .record(started.elapsed().as_secs_f64());
            let result = match answered {
                Err(_) => Err(UpstreamError::TimedOut(timeout)),
                Ok(Err(error)) if error.is_connect() => Err(connect_error(error)),
                Ok(Err(error)) => Err(UpstreamError::Failed(error.into())),
                Ok(Ok(mut response)) => {
                    strip_hop_by_hop(response.headers_mut());
                    Ok(response)
                }
            };
            if let Err(error) = &result {
                tracing::warn!(%error, "upstream request failed");
                metrics::counter!("idem_proxy_upstream_errors_total", "kind" => error.kind())
                    .increment(1);
            }
            result
        })
    }
}

/// A connection that was never made: a TLS failure named as such, every
/// other as unreachable.
fn connect_error(error: hyper_util::client::legacy::Error) -> UpstreamError {
    #[cfg(feature = "tls")]
    if let Some(cause) = crate::tls::tls_cause(&error) {
        return UpstreamError::Tls(cause);
    }
    UpstreamError::Unreachable(error.into())
}

/// Removes the headers that belong to one connection (RFC 9110 §7.6.1):
/// `Connection` and those it names, and the fixed list.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::try_from(name.trim()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        HeaderName::from_static("proxy-connection"),
    ] {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_urls_are_http_or_https_with_an_optional_prefix() {
        let url: UpstreamUrl = "http://127.0.0.1:3000/api/".parse().unwrap();
        assert_eq!(url.prefix, "/api");
        let forward = Forward::new(url, DEFAULT_UPSTREAM_TIMEOUT, &Trust::default());
        let target = forward.target(&"/payments?x=1".parse().unwrap()).unwrap();
        assert_eq!(target, "http://127.0.0.1:3000/api/payments?x=1");
        assert_eq!(
            "https://example.com".parse::<UpstreamUrl>().is_ok(),
            cfg!(feature = "tls")
        );
        assert!("ftp://example.com".parse::<UpstreamUrl>().is_err());
        assert!("127.0.0.1:3000".parse::<UpstreamUrl>().is_err());
        assert!("http://h/?q=1".parse::<UpstreamUrl>().is_err());
    }

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_removed() {
        let mut headers = HeaderMap::new();
        headers.insert("connection", HeaderValue::from_static("close, x-private"));
        headers.insert("x-private", HeaderValue::from_static("1"));
        headers.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        headers.insert("idempotency-key", HeaderValue::from_static("k"));
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 1);
        assert!(headers.contains_key("idempotency-key"));
    }
}
