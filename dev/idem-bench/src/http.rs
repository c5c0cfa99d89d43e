//! HTTP mode: an axum app with a fixed handler behind `IdempotencyLayer`,
//! against an axum control whose handler makes one plain store round trip,
//! both on 127.0.0.1 and loaded by the same client from 32 keep-alive
//! connections.

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use http::{header, StatusCode};
use idem_core::store::{NearCache, Store};
use idem_core::{Idempotent, MemoryStore};
use idem_redis::RedisStore;
use idem_tower::IdempotencyLayer;
use redis::aio::{ConnectionManager, MultiplexedConnection};
use tokio::task::JoinHandle;

use crate::bench::{self, Bench, Contestant, Counters, Kind, Plan};
use crate::fixture::{self, BoxError, RETENTION};
use crate::load::{self, HttpRow};
use crate::report::Report;
use crate::runner::{Protocol, Workload};
use crate::stats;
use crate::stores::redis as redis_rows;

/// Keep-alive connections, and so concurrent requests, per row.
const CONNECTIONS: usize = 32;

/// Measures replays (and first executions, if asked) over HTTP with the
/// memory store and, when its server answers, Redis.
pub(crate) async fn measure(
    backends: &[&str],
    redis_url: &str,
    plan: &Plan,
    report: &mut Report,
) -> Result<(), BoxError> {
    let plan = Plan {
        workloads: plan
            .workloads
            .iter()
            .copied()
            .filter(|w| matches!(w, Workload::First | Workload::Replay))
            .collect(),
        concurrency: vec![CONNECTIONS],
        ..plan.clone()
    };
    fingerprint_cost(report);
    if backends.contains(&"memory") {
        let memory = HttpBench::memory(&plan.tag).await?;
        eprintln!("idem-bench: measuring http-memory");
        let measured = bench::measure(&memory, &plan, report).await;
        memory.finish(report).await?;
        measured?;
    }
    if !backends.contains(&"redis") {
        return Ok(());
    }
    match HttpBench::redis(redis_url, &plan.tag).await {
        Ok(redis) => {
            eprintln!("idem-bench: measuring http-redis");
            let measured = bench::measure(&redis, &plan, report).await;
            redis.finish(report).await?;
            measured?;
        }
        Err(reason) => {
            let line =
                format!("http-redis: redis at {redis_url} is unreachable ({reason}); skipped");
            eprintln!("idem-bench: {line}");
            report.skipped.push(line);
        }
    }
    Ok(())
}

/// What the layer's request fingerprint costs on the body the HTTP rows
/// send: the raw-bytes form (scheme 1) alone, against the canonical JSON
/// form with the raw one beside it for older records (what the layer
/// computes), in alternating batches of one run, medians per call.
fn fingerprint_cost(report: &mut Report) {
    const BATCHES: usize = 21;
    const CALLS: u32 = 2000;
    let (parts, ()) = http::Request::post("/pay")
        .header(header::CONTENT_TYPE, "application/json")
        .body(())
        .unwrap_or_default()
        .into_parts();
    let body = serde_json::to_vec(&fixture::Order::sample()).unwrap_or_default();
    let batch = |f: &dyn Fn() -> bool| {
        let started = std::time::Instant::now();
        for _ in 0..CALLS {
            std::hint::black_box(f());
        }
        started.elapsed().as_nanos() as f64 / f64::from(CALLS)
    };
    let raw = || {
        let f = idem_http::raw_fingerprint(&parts.method, &parts.uri, &parts.headers, &body);
        std::hint::black_box(f).scheme() == 1
    };
    let layer = || {
        let f = idem_http::fingerprint(&parts.method, &parts.uri, &parts.headers, &body);
        std::hint::black_box(f).current().scheme() == 2
    };
    let (mut raw_ns, mut layer_ns) = (Vec::new(), Vec::new());
    for _ in 0..BATCHES {
        raw_ns.push(batch(&raw));
        layer_ns.push(batch(&layer));
    }
    let (Some(raw), Some(layer)) = (stats::median(&raw_ns), stats::median(&layer_ns)) else {
        return;
    };
    let ratio = stats::ratio(layer, raw).unwrap_or(f64::NAN);
    report.sections.push(format!(
        "HTTP request fingerprint, {}-byte JSON body, median of {BATCHES} batches:\n  \
         raw bytes {raw:.0} ns, canonical JSON + raw (as the layer runs) {layer:.0} ns, \
         ratio {ratio:.2}",
        body.len()
    ));
    report.lines.push(format!(
        "http-fingerprint raw {raw:.0} canonical {layer:.0} ratio {ratio:.3}"
    ));
}

/// The two apps of one backend and what the rows need to reach them.
struct HttpBench {
    name: &'static str,
    idem_url: http::Uri,
    control_url: http::Uri,
    /// The layer over the same store behind a near cache (Redis only).
    near_url: Option<http::Uri>,
    servers: Vec<JoinHandle<()>>,
    /// For Redis: a connection for counters and cleanup, and the prefix.
    redis: Option<(MultiplexedConnection, String)>,
}

/// The response every handler gives: 201 with a 100-byte JSON body.
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

impl HttpBench {
    async fn memory(tag: &str) -> Result<HttpBench, BoxError> {
        let store = Arc::new(MemoryStore::new());
        let idem_store: Arc<dyn Store> = store.clone();
        let control = Router::new()
            .route("/pay", post(memory_control))
            .with_state((store, format!("{tag}.control")));
        HttpBench::start(
            "http-memory",
            Idempotent::from_arc(idem_store),
            control,
            None,
        )
        .await
    }

    async fn redis(url: &str, tag: &str) -> Result<HttpBench, BoxError> {
        let admin = redis_rows::admin_connection(url).await?;
        let shared = ConnectionManager::new(redis::Client::open(url)?).await?;
        let prefix = format!("idem-bench:{tag}:http:");
        let store = RedisStore::from_connection(shared.clone()).with_prefix(prefix.clone());
        let control = Router::new()
            .route("/pay", post(redis_control))
            .with_state((shared, format!("{prefix}control")));
        let near = Idempotent::new(NearCache::new(store.clone()));
        let mut bench = HttpBench::start(
            "http-redis",
            Idempotent::new(store),
            control,
            Some((admin, prefix)),
        )
        .await?;
        let layer = IdempotencyLayer::from_idempotent(near.with_retention(RETENTION));
        let (near_addr, near_server) =
            serve(Router::new().route("/pay", post(pay)).layer(layer)).await?;
        bench.near_url = Some(format!("http://{near_addr}/pay").parse()?);
        bench.servers.push(near_server);
        Ok(bench)
    }

    async fn start(
        name: &'static str,
        idem: Idempotent,
        control: Router,
        redis: Option<(MultiplexedConnection, String)>,
    ) -> Result<HttpBench, BoxError> {
        let layer = IdempotencyLayer::from_idempotent(idem.with_retention(RETENTION));
        let app = Router::new().route("/pay", post(pay)).layer(layer);
        let (idem_addr, idem_server) = serve(app).await?;
        let (control_addr, control_server) = serve(control).await?;
        Ok(HttpBench {
            name,
            idem_url: format!("http://{idem_addr}/pay").parse()?,
            control_url: format!("http://{control_addr}/pay").parse()?,
            near_url: None,
            servers: vec![idem_server, control_server],
            redis,
        })
    }
}

async fn serve(app: Router) -> Result<(SocketAddr, JoinHandle<()>), BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            eprintln!("idem-bench: an HTTP server stopped: {error}");
        }
    });
    Ok((addr, server))
}

/// The control over memory: one store read per request.
async fn memory_control(
    State((store, key)): State<(Arc<MemoryStore>, String)>,
) -> axum::response::Response {
    match store.load(&key).await {
        Ok(_) => answer().into_response(),
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

/// The control over Redis: one `GET` per request, on the same kind of
/// shared connection the store uses.
async fn redis_control(
    State((mut connection, key)): State<(ConnectionManager, String)>,
) -> axum::response::Response {
    let got: redis::RedisResult<Option<Vec<u8>>> = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut connection)
        .await;
    match got {
        Ok(_) => answer().into_response(),
        Err(_) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

#[async_trait]
impl Bench for HttpBench {
    fn store(&self) -> &'static str {
        self.name
    }

    fn contestants(&self) -> Vec<Contestant> {
        let control: Arc<dyn Protocol> = Arc::new(HttpRow::new(
            load::client(CONNECTIONS),
            self.control_url.clone(),
        ));
        let idem: Arc<dyn Protocol> = Arc::new(HttpRow::new(
            load::client(CONNECTIONS),
            self.idem_url.clone(),
        ));
        let near = self.near_url.as_ref().map(|url| -> Arc<dyn Protocol> {
            Arc::new(HttpRow::new(load::client(CONNECTIONS), url.clone()))
        });
        let mut rows = vec![
            Contestant {
                kind: Kind::Control,
                make: Box::new(move || control.clone()),
                fresh: false,
                round_trips: |d| redis_rows::count(d, &["get"]),
            },
            Contestant {
                kind: Kind::Idem,
                make: Box::new(move || idem.clone()),
                fresh: false,
                round_trips: redis_rows::store_requests,
            },
        ];
        if let Some(near) = near {
            rows.push(Contestant {
                kind: Kind::IdemNear,
                make: Box::new(move || near.clone()),
                fresh: false,
                round_trips: redis_rows::store_requests,
            });
        }
        rows
    }

    async fn tidy(&self) -> Result<(), BoxError> {
        Ok(())
    }

    async fn counters(&self) -> Result<Option<Counters>, BoxError> {
        match &self.redis {
            Some((admin, _)) => Ok(Some(redis_rows::commandstats(&mut admin.clone()).await?)),
            None => Ok(None),
        }
    }

    async fn finish(&self, _report: &mut Report) -> Result<(), BoxError> {
        for server in &self.servers {
            server.abort();
        }
        match &self.redis {
            Some((admin, prefix)) => redis_rows::unlink_prefix(&mut admin.clone(), prefix).await,
            None => Ok(()),
        }
    }
}
