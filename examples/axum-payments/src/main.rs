//! An axum payments endpoint made safe to retry with `idem::tower`: the
//! handler runs once per `Idempotency-Key`, and every retry gets the
//! recorded response back with `Idempotent-Replayed: true`. The keys live
//! in a SQLite file, so they outlast a restart.
//!
//! ```text
//! cargo run -p example-axum-payments
//! curl -i localhost:3000/payments -H 'Idempotency-Key: order-7f3a' \
//!     -H 'Content-Type: application/json' -d '{"amount":1250,"currency":"EUR"}'
//! ```
//!
//! Send the `curl` twice: both answers carry the same charge, and the
//! server prints one. `cargo test -p example-axum-payments` does the same.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use idem::sqlite::SqliteStore;
use idem::tower::IdempotencyLayer;
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct Payment {
    amount: u64,
    currency: String,
}

#[derive(Serialize)]
struct Charge {
    id: String,
}

/// How many charges were made: the side effect a retry must not repeat.
#[derive(Clone, Default)]
struct Charges(Arc<AtomicU64>);

async fn create_payment(
    State(charges): State<Charges>,
    Json(payment): Json<Payment>,
) -> (StatusCode, Json<Charge>) {
    let n = charges.0.fetch_add(1, Ordering::SeqCst) + 1;
    println!("charging {} {}", payment.amount, payment.currency);
    (
        StatusCode::CREATED,
        Json(Charge {
            id: format!("ch_{n}"),
        }),
    )
}

fn app(store: SqliteStore, charges: Charges) -> Router {
    Router::new()
        .route("/payments", post(create_payment))
        .with_state(charges)
        // Outermost, so it sees the full path; a POST without a key is 400.
        .layer(IdempotencyLayer::new(store).require_key(true))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = SqliteStore::open("payments.db").await?; // created if absent
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app(store, Charges::default())).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use axum::body::{to_bytes, Body};
    use axum::http::{Request, Response};
    use tower::ServiceExt;

    use super::*;

    fn pay(key: &str, body: &'static str) -> Request<Body> {
        Request::post("/payments")
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap()
    }

    async fn text(response: Response<Body>) -> String {
        let bytes = to_bytes(response.into_body(), usize::MAX).await.unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn a_retried_payment_is_charged_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("idem.db")).await.unwrap();
        let charges = Charges::default();
        let app = app(store, charges.clone());
        let order = r#"{"amount":1250,"currency":"EUR"}"#;

        let first = app.clone().oneshot(pay("order-7f3a", order)).await.unwrap();
        let retry = app.clone().oneshot(pay("order-7f3a", order)).await.unwrap();
        assert_eq!(first.status(), StatusCode::CREATED);
        assert_eq!(retry.status(), StatusCode::CREATED);
        assert_eq!(retry.headers()["idempotent-replayed"], "true");
        assert_eq!(text(first).await, text(retry).await);
        assert_eq!(charges.0.load(Ordering::SeqCst), 1);

        // The same key for another amount is a client bug: 422, no charge.
        let other = r#"{"amount":9900,"currency":"EUR"}"#;
        let reused = app.oneshot(pay("order-7f3a", other)).await.unwrap();
        assert_eq!(reused.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(charges.0.load(Ordering::SeqCst), 1);
    }
}
