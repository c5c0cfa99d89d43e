//! A fault-injecting server on a real socket: an idempotent endpoint per
//! fault, which counts every effect by the intent named in the body.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// What the server saw of one key.
#[derive(Debug, Default)]
struct KeyState {
    body: Option<Bytes>,
    /// When the effect ended, if it did; the recorded answer is replayed.
    outcome: Option<(Instant, Bytes)>,
    /// An answer made but not yet recorded.
    pending: Option<Bytes>,
}

#[derive(Debug, Default)]
struct State {
    keys: HashMap<(String, String), KeyState>,
    /// Arrival times by path and key (`""` for requests without one).
    arrivals: HashMap<(String, String), Vec<Instant>>,
    /// Effects by intent: more than one is a duplicated effect.
    effects: HashMap<u64, u32>,
    /// Every key header value received, as sent.
    key_headers: Vec<(String, String)>,
}

/// The server; it stops when dropped.
#[derive(Debug, Clone)]
pub struct FaultServer {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: Arc<tokio::task::AbortHandle>,
}

impl Drop for FaultServer {
    fn drop(&mut self) {
        if Arc::strong_count(&self.task) == 1 {
            self.task.abort();
        }
    }
}

/// The connection is dropped without an answer.
#[derive(Debug)]
struct Hangup;

impl std::fmt::Display for Hangup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("hang up")
    }
}

impl std::error::Error for Hangup {}

type Answer = Result<Response<Full<Bytes>>, Hangup>;

fn answer(status: StatusCode, headers: &[(&str, String)], body: Bytes) -> Answer {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    for (name, value) in headers {
        response.headers_mut().insert(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    Ok(response)
}

fn problem(status: StatusCode, kind: &str) -> Bytes {
    Bytes::from(
        serde_json::json!({ "type": format!("tag:idem-rs.github.io,2025:problem/{kind}"), "status": status.as_u16() })
            .to_string(),
    )
}

impl FaultServer {
    pub async fn start() -> FaultServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let shared = Arc::clone(&state);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = Arc::clone(&shared);
                tokio::spawn(async move {
                    let service = service_fn(move |request| handle(Arc::clone(&state), request));
                    // A hang-up ends the connection with an error; that is the point.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        FaultServer {
            addr,
            state,
            task: Arc::new(task.abort_handle()),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Effects made for `intent`.
    pub fn effects(&self, intent: u64) -> u32 {
        self.lock().effects.get(&intent).copied().unwrap_or(0)
    }

    /// Requests that reached `path`, with any key.
    pub fn requests(&self, path: &str) -> usize {
        self.lock()
            .arrivals
            .iter()
            .filter(|((p, _), _)| p == path)
            .map(|(_, times)| times.len())
            .sum()
    }

    /// Arrival times at `path` under each key.
    pub fn arrivals(&self, path: &str) -> Vec<Vec<Instant>> {
        self.lock()
            .arrivals
            .iter()
            .filter(|((p, _), _)| p == path)
            .map(|(_, times)| times.clone())
            .collect()
    }

    /// Every key header value received, with its path.
    pub fn key_headers(&self) -> Vec<(String, String)> {
        self.lock().key_headers.clone()
    }
}

/// The key as the server reads it: the draft's quoted string or bare.
fn key_of(request: &Request<Incoming>) -> Option<(String, String)> {
    for name in ["idempotency-key", "x-request-key"] {
        if let Some(value) = request.headers().get(name) {
            let raw = value.to_str().ok()?.to_owned();
            let key = raw.trim_matches('"').to_owned();
            return Some((raw, key));
        }
    }
    None
}

async fn handle(state: Arc<Mutex<State>>, request: Request<Incoming>) -> Answer {
    let path = request.uri().path().to_owned();
    let header = key_of(&request);
    let body = request
        .into_body()
        .collect()
        .await
        .map_err(|_| Hangup)?
        .to_bytes();
    let key = header
        .as_ref()
        .map(|(_, key)| key.clone())
        .unwrap_or_default();
    let lock = || state.lock().unwrap_or_else(PoisonError::into_inner);
    let arrival = {
        let mut state = lock();
        if let Some((raw, _)) = &header {
            state.key_headers.push((path.clone(), raw.clone()));
        }
        let times = state
            .arrivals
            .entry((path.clone(), key.clone()))
            .or_default();
        times.push(Instant::now());
        times.len()
    };

    // Paths that need no key.
    match path.as_str() {
        "/reject" => {
            return answer(
                StatusCode::BAD_REQUEST,
                &[],
                problem(StatusCode::BAD_REQUEST, "bad"),
            )
        }
        "/always-503" => return answer(StatusCode::SERVICE_UNAVAILABLE, &[], Bytes::new()),
        "/always-429" => {
            return answer(
                StatusCode::TOO_MANY_REQUESTS,
                &[("retry-after", "3600".into())],
                Bytes::new(),
            )
        }
        "/forever" => {
            return answer(
                StatusCode::SERVICE_UNAVAILABLE,
                &[("retry-after", u64::MAX.to_string())],
                Bytes::new(),
            )
        }
        "/read" if arrival == 1 => {
            return answer(StatusCode::SERVICE_UNAVAILABLE, &[], Bytes::new())
        }
        "/read" => return answer(StatusCode::OK, &[], Bytes::from_static(b"{}")),
        "/flaky" if header.is_none() && arrival == 1 => {
            return answer(StatusCode::SERVICE_UNAVAILABLE, &[], Bytes::new())
        }
        _ => {}
    }

    // The idempotent endpoints: a key is required, its body must not change,
    // and a completed key replays its answer.
    if header.is_none() {
        return answer(
            StatusCode::BAD_REQUEST,
            &[],
            problem(StatusCode::BAD_REQUEST, "missing-key"),
        );
    }
    {
        let mut state = lock();
        let seen = state.keys.entry((path.clone(), key.clone())).or_default();
        match &seen.body {
            Some(first) if *first != body => {
                return answer(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    &[("content-type", "application/problem+json".into())],
                    problem(StatusCode::UNPROCESSABLE_ENTITY, "mismatch"),
                )
            }
            Some(_) => {}
            None => seen.body = Some(body.clone()),
        }
        if let Some((_, outcome)) = &seen.outcome {
            return answer(
                StatusCode::CREATED,
                &[("idempotent-replayed", "true".into())],
                outcome.clone(),
            );
        }
    }
    let in_progress = || {
        answer(
            StatusCode::CONFLICT,
            &[("retry-after", "1".into())],
            problem(StatusCode::CONFLICT, "in-progress"),
        )
    };
    match (path.as_str(), arrival) {
        ("/flaky", 1) => answer(StatusCode::SERVICE_UNAVAILABLE, &[], Bytes::new()),
        ("/busy", 1) => answer(
            StatusCode::TOO_MANY_REQUESTS,
            &[("retry-after", "1".into())],
            Bytes::new(),
        ),
        ("/busy-date", 1) => {
            let at = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(3));
            answer(
                StatusCode::TOO_MANY_REQUESTS,
                &[("retry-after", at)],
                Bytes::new(),
            )
        }
        ("/drop", 1) => {
            // The handler runs, then the client never hears of it.
            effect(&state, &path, &key, &body);
            Err(Hangup)
        }
        ("/in-progress", 1) => {
            // The effect is made, but its answer is still being written.
            let outcome = count_effect(&state, &body);
            lock().keys.entry((path, key)).or_default().pending = Some(outcome);
            in_progress()
        }
        ("/in-progress", 2) => in_progress(),
        ("/in-progress", _) => {
            let mut state = lock();
            let seen = state.keys.entry((path, key)).or_default();
            let outcome = seen.pending.take().unwrap_or_default();
            seen.outcome = Some((Instant::now(), outcome.clone()));
            answer(StatusCode::CREATED, &[], outcome)
        }
        ("/slow", 1) => {
            // The first attempt outlives the client's timeout; retries meet
            // the key in progress until it completes.
            // Like a real server, the work goes on when the client hangs up.
            let work = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                effect(&state, &path, &key, &body)
            });
            answer(StatusCode::CREATED, &[], work.await.map_err(|_| Hangup)?)
        }
        ("/slow", _) => in_progress(),
        ("/echo-key", _) => answer(StatusCode::OK, &[], Bytes::new()),
        _ => {
            let outcome = effect(&state, &path, &key, &body);
            answer(StatusCode::CREATED, &[], outcome)
        }
    }
}

/// Makes the effect for the intent the body names, counting it.
fn count_effect(state: &Mutex<State>, body: &[u8]) -> Bytes {
    let intent = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["intent"].as_u64())
        .unwrap_or(u64::MAX);
    let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
    let count = state.effects.entry(intent).or_default();
    *count += 1;
    Bytes::from(
        serde_json::json!({ "intent": intent, "charge": format!("ch_{intent}_{count}") })
            .to_string(),
    )
}

/// Makes the effect and records its answer under the key.
fn effect(state: &Mutex<State>, path: &str, key: &str, body: &[u8]) -> Bytes {
    let outcome = count_effect(state, body);
    let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
    let seen = state
        .keys
        .entry((path.to_owned(), key.to_owned()))
        .or_default();
    seen.outcome = Some((Instant::now(), outcome.clone()));
    outcome
}
