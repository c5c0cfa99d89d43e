//! The app behind `idem-actix`: the same handlers for actix-web.

// actix-web handlers run on one worker thread and take its non-`Send` types.
#![allow(clippy::future_not_send)]

use std::net::SocketAddr;
use std::sync::Arc;

use actix_web::http::header;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use idem_actix::IdempotencyMiddleware;
use idem_http::Options;

use crate::{
    binary_body, event_frames, gated_event_frames, payment_body, stream_frames, Handlers, Scope,
    BIG_BODY,
};

type H = web::Data<Handlers>;

async fn payments(h: H, request: HttpRequest, body: String) -> HttpResponse {
    let run = h.run();
    let tenant = request
        .headers()
        .get("x-tenant")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-");
    HttpResponse::Created()
        .append_header((header::SET_COOKIE, format!("session=s{run}; HttpOnly")))
        .append_header(("x-multi", "a"))
        .append_header(("x-multi", "b"))
        .append_header(("x-run", run.to_string()))
        .insert_header((header::CONTENT_TYPE, "application/json"))
        .body(payment_body(run, tenant, body.len()))
}

async fn count(h: H) -> String {
    h.runs().to_string()
}

async fn binary(h: H) -> HttpResponse {
    HttpResponse::Accepted()
        .insert_header((header::CONTENT_TYPE, "application/octet-stream"))
        .body(binary_body(h.run()))
}

async fn gated(h: H) -> HttpResponse {
    let run = h.run();
    // A closed semaphore means the test is over; answering is fine then.
    let _permit = h.gate.acquire().await;
    HttpResponse::Created().body(format!("run {run}"))
}

async fn flaky(h: H) -> HttpResponse {
    match h.run() {
        1 => HttpResponse::ServiceUnavailable().body("try again"),
        run => HttpResponse::Created().body(format!("run {run}")),
    }
}

async fn big(h: H) -> HttpResponse {
    h.run();
    HttpResponse::Ok().body(vec![b'x'; BIG_BODY])
}

async fn stream(h: H) -> HttpResponse {
    h.run();
    HttpResponse::Ok().streaming(stream_frames())
}

async fn events(h: H) -> HttpResponse {
    h.run();
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .streaming(event_frames())
}

async fn gated_events(h: H) -> HttpResponse {
    h.run();
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .streaming(gated_event_frames(h.into_inner()))
}

async fn broken(h: H) -> HttpResponse {
    h.run();
    let chunks: [Result<bytes::Bytes, std::io::Error>; 2] = [
        Ok(bytes::Bytes::from_static(b"half a response")),
        Err(std::io::Error::other("the stream broke")),
    ];
    HttpResponse::Ok().streaming(futures_util::stream::iter(chunks))
}

async fn panics(h: H) -> HttpResponse {
    h.run();
    panic!("the handler panics on purpose");
}

/// Serves the handlers behind the middleware on a free port, on actix's
/// own worker threads.
pub(crate) fn serve(options: Options, scope: Scope, handlers: Arc<Handlers>) -> SocketAddr {
    let mut middleware = IdempotencyMiddleware::from_options(options);
    if scope == Scope::TenantHeader {
        middleware = middleware.with_scope(|request| {
            let tenant = request.headers().get("x-tenant")?;
            tenant.to_str().ok().map(str::to_owned)
        });
    }
    let data = web::Data::from(handlers);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .wrap(middleware.clone())
            .route("/payments", web::post().to(payments))
            .route("/payments", web::patch().to(payments))
            .route("/payments", web::get().to(count))
            .route("/other", web::post().to(payments))
            .route("/binary", web::post().to(binary))
            .route("/gated", web::post().to(gated))
            .route("/flaky", web::post().to(flaky))
            .route("/big", web::post().to(big))
            .route("/broken", web::post().to(broken))
            .route("/stream", web::post().to(stream))
            .route("/events", web::post().to(events))
            .route("/gated-events", web::post().to(gated_events))
            .route("/panic", web::post().to(panics))
    })
    .workers(2)
    .disable_signals()
    .listen(listener)
    .unwrap()
    .run();
    tokio::spawn(server);
    addr
}
