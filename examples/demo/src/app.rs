//! The payments API: routes, input checks and problem responses.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idem_core::store::Store;
use idem_core::Idempotent;
use serde::Deserialize;
use serde_json::json;

use crate::ledger::{Charge, Gateway};

/// The header that carries the idempotency key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The header the idempotency layer sets on a replayed response.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

// Records are namespaced so that the demo can share a Redis or PostgreSQL
// server with other applications without its keys meeting theirs.
pub(crate) const NAMESPACE: &str = "idem-demo";

#[derive(Debug, Clone)]
struct AppState {
    gateway: Arc<Gateway>,
}

/// The payments API over `store`, charging through `gateway`:
/// `POST /payments` (idempotent, an `Idempotency-Key` is required),
/// `GET /payments` and `GET /healthz`.
///
/// Malformed JSON is a 400 and a well-formed payment with a bad amount or
/// currency a 422, both `application/problem+json`. Like every 2xx–4xx
/// answer, a refusal is recorded under its key: a corrected payment needs
/// a new key, and a retry of the bad one gets the same refusal.
pub fn router(store: Arc<dyn Store>, gateway: Arc<Gateway>) -> Router {
    let idem = Idempotent::from_arc(Arc::clone(&store)).with_namespace(NAMESPACE);
    let idempotency = idem_tower::IdempotencyLayer::from_idempotent(idem).require_key(true);
    Router::new()
        // The layer guards the whole route; it lets `GET` through untouched.
        .route(
            "/payments",
            post(create_payment).get(list_payments).layer(idempotency),
        )
        .with_state(AppState { gateway })
        .merge(health_router(store))
        .layer(middleware::from_fn(log_request))
}

/// `GET /healthz` over `store`.
pub(crate) fn health_router(store: Arc<dyn Store>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .with_state(store)
}

/// What a client asks to be charged.
#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PaymentRequest {
    pub(crate) amount: i64,
    pub(crate) currency: String,
}

async fn create_payment(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (key, payment) = match parse_payment(&headers, &body) {
        Ok(parsed) => parsed,
        Err(refusal) => return *refusal,
    };
    // A handler re-run after a crash (the key taken over once its lease
    // lapsed) sends the gateway the same derived key, and the gateway
    // charges it once: the key `lease.derive_key("gateway")` would give.
    let derived = match idem_core::Key::new(NAMESPACE, "", &key) {
        Ok(full) => idem_core::Key::derive(&[full.as_str(), "gateway"]),
        Err(e) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "invalid-idempotency-key",
                "Invalid idempotency key",
                &e.to_string(),
            )
        }
    };
    let charge = state
        .gateway
        .charge_once(&derived, &key, payment.amount, &payment.currency)
        .await;
    tracing::info!(id = %charge.id, key = %key, amount = charge.amount,
        currency = %charge.currency, "charged");
    (StatusCode::CREATED, Json(charge)).into_response()
}

/// Reads a payment request: its content type, its key (the layer has
/// already rejected a missing or malformed one where it runs; this is the
/// handler's own guard) and its body, each refused with its problem.
pub(crate) fn parse_payment(
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(String, PaymentRequest), Box<Response>> {
    if let Some(content_type) = headers.get(header::CONTENT_TYPE) {
        let is_json = content_type
            .to_str()
            .map(|v| v.split(';').next().unwrap_or("").trim())
            .is_ok_and(|v| v.eq_ignore_ascii_case("application/json"));
        if !is_json {
            return Err(Box::new(problem(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "Unsupported media type",
                "send the payment as application/json",
            )));
        }
    }
    let Some(key) = client_key(headers) else {
        return Err(Box::new(problem(
            StatusCode::BAD_REQUEST,
            "missing-idempotency-key",
            "Missing idempotency key",
            "send an Idempotency-Key header with every payment",
        )));
    };
    let payment: PaymentRequest = serde_json::from_slice(body).map_err(|e| {
        Box::new(problem(
            StatusCode::BAD_REQUEST,
            "malformed-payment",
            "Malformed payment",
            &format!("expected {{\"amount\": <integer>, \"currency\": \"EUR\"}}: {e}"),
        ))
    })?;
    if let Err(detail) = validate(&payment) {
        return Err(Box::new(problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-payment",
            "Invalid payment",
            detail,
        )));
    }
    Ok((key, payment))
}

pub(crate) fn validate(payment: &PaymentRequest) -> Result<(), &'static str> {
    if payment.amount <= 0 {
        return Err("amount must be a positive integer in the currency's minor unit");
    }
    let currency = payment.currency.as_bytes();
    if currency.len() != 3 || !currency.iter().all(u8::is_ascii_uppercase) {
        return Err("currency must be three uppercase letters, such as EUR");
    }
    Ok(())
}

/// The client key as the idempotency layer reads it: a bare token, or the
/// IETF draft's quoted string, unquoted.
pub(crate) fn client_key(headers: &HeaderMap) -> Option<String> {
    let raw = headers.get(IDEMPOTENCY_KEY)?.to_str().ok()?.trim();
    let Some(quoted) = raw
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
    else {
        return Some(raw.to_owned()).filter(|key| !key.is_empty());
    };
    let mut key = String::with_capacity(quoted.len());
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        key.push(if c == '\\' { chars.next()? } else { c });
    }
    Some(key).filter(|key| !key.is_empty())
}

#[derive(Debug, serde::Serialize)]
struct ChargeList {
    charges: Vec<Charge>,
}

async fn list_payments(State(state): State<AppState>) -> Json<ChargeList> {
    Json(ChargeList {
        charges: state.gateway.ledger().charges(),
    })
}

async fn healthz(State(store): State<Arc<dyn Store>>) -> Response {
    // A read of a key nobody writes: proves the store answers without
    // changing anything in it.
    match store.load("idem-demo/healthz").await {
        Ok(_) => Json(json!({ "status": "ok" })).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "health check: the store failed");
            problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "Store unavailable",
                &e.to_string(),
            )
        }
    }
}

/// An RFC 9457 problem response.
pub(crate) fn problem(status: StatusCode, kind: &str, title: &str, detail: &str) -> Response {
    let body = json!({
        "type": format!("tag:idem-rs.github.io,2025:demo/{kind}"),
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    (
        status,
        [(header::CONTENT_TYPE, "application/problem+json")],
        body.to_string(),
    )
        .into_response()
}

async fn log_request(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    let replayed = response.headers().contains_key(IDEMPOTENT_REPLAYED);
    tracing::info!(%method, %path, status = response.status().as_u16(), replayed,
        micros = started.elapsed().as_micros() as u64, "request");
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(key: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(IDEMPOTENCY_KEY, key.parse().unwrap());
        headers
    }

    #[test]
    fn client_keys_are_read_bare_or_quoted() {
        assert_eq!(client_key(&headers("abc-1")).as_deref(), Some("abc-1"));
        assert_eq!(client_key(&headers("\"abc-1\"")).as_deref(), Some("abc-1"));
        assert_eq!(
            client_key(&headers(r#""a\"b\\c""#)).as_deref(),
            Some(r#"a"b\c"#)
        );
        assert_eq!(client_key(&headers("\"\"")), None);
        assert_eq!(client_key(&HeaderMap::new()), None);
    }

    #[test]
    fn payments_need_a_positive_amount_and_a_currency_code() {
        let payment = |amount, currency: &str| PaymentRequest {
            amount,
            currency: currency.to_owned(),
        };
        assert!(validate(&payment(1250, "EUR")).is_ok());
        assert!(validate(&payment(0, "EUR")).is_err());
        assert!(validate(&payment(-5, "EUR")).is_err());
        assert!(validate(&payment(5, "eur")).is_err());
        assert!(validate(&payment(5, "EURO")).is_err());
        assert!(validate(&payment(5, "ÉUR")).is_err());
    }
}
