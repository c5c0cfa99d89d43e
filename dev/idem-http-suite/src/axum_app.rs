//! The app behind `idem-tower`: axum handlers.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{AppendHeaders, IntoResponse};
use axum::routing;
use axum::Router;
use idem_http::Options;
use idem_tower::IdempotencyLayer;
use tokio::net::TcpListener;

use crate::{
    binary_body, event_frames, gated_event_frames, payment_body, stream_frames, Handlers, Scope,
    BIG_BODY,
};

async fn payments(
    State(h): State<Arc<Handlers>>,
    headers: HeaderMap,
    body: String,
) -> impl IntoResponse {
    let run = h.run();
    let tenant = headers
        .get("x-tenant")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    let mut response = AppendHeaders([
        (header::SET_COOKIE, format!("session=s{run}; HttpOnly")),
        (header::HeaderName::from_static("x-multi"), "a".to_owned()),
        (header::HeaderName::from_static("x-multi"), "b".to_owned()),
        (header::HeaderName::from_static("x-run"), run.to_string()),
    ])
    .into_response();
    *response.status_mut() = StatusCode::CREATED;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    *response.body_mut() = payment_body(run, &tenant, body.len()).into();
    response
}

async fn count(State(h): State<Arc<Handlers>>) -> String {
    h.runs().to_string()
}

async fn binary(State(h): State<Arc<Handlers>>) -> impl IntoResponse {
    let body = binary_body(h.run());
    (
        StatusCode::ACCEPTED,
        [(header::CONTENT_TYPE, "application/octet-stream")],
        body,
    )
}

async fn gated(State(h): State<Arc<Handlers>>) -> impl IntoResponse {
    let run = h.run();
    // A closed semaphore means the test is over; answering is fine then.
    let _permit = h.gate.acquire().await;
    (StatusCode::CREATED, format!("run {run}"))
}

async fn flaky(State(h): State<Arc<Handlers>>) -> impl IntoResponse {
    match h.run() {
        1 => (StatusCode::SERVICE_UNAVAILABLE, "try again".to_owned()),
        run => (StatusCode::CREATED, format!("run {run}")),
    }
}

async fn big(State(h): State<Arc<Handlers>>) -> impl IntoResponse {
    h.run();
    vec![b'x'; BIG_BODY]
}

async fn stream(State(h): State<Arc<Handlers>>) -> axum::body::Body {
    h.run();
    axum::body::Body::from_stream(stream_frames())
}

async fn events(State(h): State<Arc<Handlers>>) -> impl IntoResponse {
    h.run();
    (
        [(header::CONTENT_TYPE, "text/event-stream")],
        axum::body::Body::from_stream(event_frames()),
    )
}

async fn gated_events(State(h): State<Arc<Handlers>>) -> impl IntoResponse {
    h.run();
    (
        [(header::CONTENT_TYPE, "text/event-stream")],
        axum::body::Body::from_stream(gated_event_frames(h)),
    )
}

async fn broken(State(h): State<Arc<Handlers>>) -> axum::body::Body {
    h.run();
    let chunks: [Result<&'static str, std::io::Error>; 2] = [
        Ok("half a response"),
        Err(std::io::Error::other("the stream broke")),
    ];
    axum::body::Body::from_stream(futures_util::stream::iter(chunks))
}

async fn panics(State(h): State<Arc<Handlers>>) -> &'static str {
    h.run();
    panic!("the handler panics on purpose");
}

/// Serves the handlers behind the layer on a free port.
pub(crate) async fn serve(options: Options, scope: Scope, handlers: Arc<Handlers>) -> SocketAddr {
    let mut layer = IdempotencyLayer::from_options(options);
    if scope == Scope::TenantHeader {
        layer = layer.with_scope(|parts| {
            let tenant = parts.headers.get("x-tenant")?;
            tenant.to_str().ok().map(str::to_owned)
        });
    }
    let router = Router::new()
        .route(
            "/payments",
            routing::post(payments).patch(payments).get(count),
        )
        .route("/other", routing::post(payments))
        .route("/binary", routing::post(binary))
        .route("/gated", routing::post(gated))
        .route("/flaky", routing::post(flaky))
        .route("/big", routing::post(big))
        .route("/broken", routing::post(broken))
        .route("/stream", routing::post(stream))
        .route("/events", routing::post(events))
        .route("/gated-events", routing::post(gated_events))
        .route("/panic", routing::post(panics))
        .with_state(handlers)
        .layer(layer);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr
}
