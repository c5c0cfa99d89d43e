//! The admin port: `/healthz` and `/metrics`, apart from the traffic.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use tokio::net::TcpListener;

use crate::proxy::{serve_with, ProxyBody};

/// Installs the Prometheus recorder as the process's `metrics` recorder
/// and returns the handle that renders it. Call it once, before serving;
/// the metrics of idem-core, idem-http and the proxy are then collected.
pub fn install_prometheus(
) -> Result<PrometheusHandle, metrics::SetRecorderError<PrometheusRecorder>> {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)?;
    // Histograms are kept in buckets that need draining now and then.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// Serves the admin endpoints on `listener` until `shutdown`:
/// `GET /healthz` answers `200 ok` while the process serves, `GET
/// /metrics` the Prometheus text format from `metrics` (none without a
/// handle), anything else 404. They are on a port of their own so that
/// the upstream's own paths are never shadowed and the metrics are not
/// exposed to the proxy's clients.
pub async fn serve_admin(
    listener: TcpListener,
    metrics: Option<PrometheusHandle>,
    shutdown: impl Future<Output = ()>,
) {
    serve_with(listener, shutdown, Duration::from_secs(1), move |request| {
        let metrics = metrics.clone();
        async move {
            let (status, kind, body) = match (request.method(), request.uri().path()) {
                (&Method::GET, "/healthz") => (StatusCode::OK, "text/plain", "ok\n".to_owned()),
                (&Method::GET, "/metrics") => (
                    StatusCode::OK,
                    "text/plain; version=0.0.4",
                    metrics.map(|m| m.render()).unwrap_or_default(),
                ),
                _ => (
                    StatusCode::NOT_FOUND,
                    "text/plain",
                    "not found\n".to_owned(),
                ),
            };
            let body: ProxyBody = Full::new(Bytes::from(body))
                .map_err(|never| match never {})
                .boxed_unsync();
            let mut response = Response::new(body);
            *response.status_mut() = status;
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(kind));
            response
        }
    })
    .await;
}
