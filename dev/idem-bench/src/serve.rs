//! The serve binary: the HTTP mode's apps, left running for an external load
//! generator (`wrk`, see `dev/idem-bench/wrk/`). Four servers on 127.0.0.1:
//! axum behind `IdempotencyLayer`, actix-web behind `IdempotencyMiddleware`,
//! and each framework's control, whose handler makes the one plain store
//! call of the HTTP mode's control (`MemoryStore::load`, or a Redis `GET`).
//! Every handler answers 201 with the HTTP mode's 100-byte JSON body.
//! `redis-near` is `redis` with the layers' store behind a `NearCache`.

use std::net::SocketAddr;
use std::sync::Arc;

use actix_web::{web, App, HttpResponse, HttpServer};
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use http::{header, StatusCode};
use idem_actix::IdempotencyMiddleware;
use idem_core::store::{NearCache, Store};
use idem_core::{Idempotent, MemoryStore};
use idem_redis::RedisStore;
use idem_tower::IdempotencyLayer;
use redis::aio::ConnectionManager;

use crate::fixture::{self, BoxError, RETENTION};

/// The store behind one server.
#[derive(Clone)]
enum Backend {
    Memory(Arc<MemoryStore>),
    /// Redis; `true` puts the layers' store behind a `NearCache`.
    Redis(ConnectionManager, bool),
}

impl Backend {
    /// The control's one store call on `key`; `false` when it failed.
    async fn control(&self, key: &str) -> bool {
        match self {
            Backend::Memory(store) => store.load(key).await.is_ok(),
            Backend::Redis(connection, _) => {
                let got: redis::RedisResult<Option<Vec<u8>>> = redis::cmd("GET")
                    .arg(key)
                    .query_async(&mut connection.clone())
                    .await;
                got.is_ok()
            }
        }
    }

    /// An `Idempotent` over a store of its own (memory) or under its own
    /// prefix (Redis).
    fn idempotent(&self, prefix: &str) -> Idempotent {
        let idem = match self {
            Backend::Memory(_) => Idempotent::new(MemoryStore::new()),
            Backend::Redis(connection, near) => {
                let store =
                    RedisStore::from_connection(connection.clone()).with_prefix(prefix.to_owned());
                if *near {
                    Idempotent::new(NearCache::new(store))
                } else {
                    Idempotent::new(store)
                }
            }
        };
        idem.with_retention(RETENTION)
    }
}

/// Starts the four servers on `port`, `port + 1`, … (free ports for 0),
/// on the runtime, and returns each one's name and address; they serve
/// until the process ends. Redis records expire after an hour.
pub(crate) async fn start(
    backend: &str,
    redis_url: &str,
    port: u16,
    tag: &str,
) -> Result<Vec<(&'static str, SocketAddr)>, BoxError> {
    let backend = match backend {
        "memory" => Backend::Memory(Arc::new(MemoryStore::new())),
        "redis" | "redis-near" => {
            let client = redis::Client::open(redis_url)?;
            Backend::Redis(
                ConnectionManager::new(client).await?,
                backend == "redis-near",
            )
        }
        other => {
            return Err(
                format!("unknown HTTP backend {other:?}: use memory, redis or redis-near").into(),
            )
        }
    };
    let prefix = format!("idem-bench:{tag}:serve:");
    let at = |offset: u16| {
        if port == 0 {
            0
        } else {
            port.saturating_add(offset)
        }
    };
    let control_key = format!("{prefix}control");

    let layer = IdempotencyLayer::from_idempotent(backend.idempotent(&format!("{prefix}axum:")));
    let axum_idem = Router::new().route("/pay", post(pay)).layer(layer);
    let axum_control = Router::new()
        .route("/pay", post(axum_control))
        .with_state((backend.clone(), control_key.clone()));
    let mut lines = vec![
        ("axum-idem", serve_axum(axum_idem, at(0)).await?),
        ("axum-control", serve_axum(axum_control, at(1)).await?),
    ];
    let middleware =
        IdempotencyMiddleware::from_idempotent(backend.idempotent(&format!("{prefix}actix:")));
    let actix_idem = {
        let listener = std::net::TcpListener::bind(("127.0.0.1", at(2)))?;
        let addr = listener.local_addr()?;
        let server = HttpServer::new(move || {
            App::new()
                .wrap(middleware.clone())
                .route("/pay", web::post().to(actix_pay))
        })
        .workers(2)
        .disable_signals()
        .listen(listener)?
        .run();
        tokio::spawn(server);
        addr
    };
    lines.push(("actix-idem", actix_idem));
    let actix_control = {
        let data = web::Data::new((backend.clone(), control_key));
        let listener = std::net::TcpListener::bind(("127.0.0.1", at(3)))?;
        let addr = listener.local_addr()?;
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .route("/pay", web::post().to(actix_control))
        })
        .workers(2)
        .disable_signals()
        .listen(listener)?
        .run();
        tokio::spawn(server);
        addr
    };
    lines.push(("actix-control", actix_control));
    Ok(lines)
}

async fn serve_axum(app: Router, port: u16) -> Result<SocketAddr, BoxError> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            eprintln!("idem-bench: an HTTP server stopped: {error}");
        }
    });
    Ok(addr)
}

fn answer() -> impl IntoResponse {
    (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        fixture::outcome_body(),
    )
}

async fn pay() -> impl IntoResponse {
    answer()
}

async fn axum_control(State((backend, key)): State<(Backend, String)>) -> axum::response::Response {
    if backend.control(&key).await {
        answer().into_response()
    } else {
        StatusCode::SERVICE_UNAVAILABLE.into_response()
    }
}

fn actix_answer() -> HttpResponse {
    HttpResponse::Created()
        .insert_header((actix_web::http::header::CONTENT_TYPE, "application/json"))
        .body(fixture::outcome_body())
}

// Both actix handlers take the body: actix closes a keep-alive connection
// whose request body was left unread, which would charge the control a new
// connection per request.
async fn actix_pay(_body: web::Bytes) -> HttpResponse {
    actix_answer()
}

async fn actix_control(data: web::Data<(Backend, String)>, _body: web::Bytes) -> HttpResponse {
    let (backend, key) = data.get_ref();
    if backend.control(key).await {
        actix_answer()
    } else {
        HttpResponse::ServiceUnavailable().finish()
    }
}
