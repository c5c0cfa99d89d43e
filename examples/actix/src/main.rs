//! An actix-web payments endpoint made safe to retry with `idem::actix`:
//! the handler runs once per `Idempotency-Key`, and every retry gets the
//! recorded response back with `Idempotent-Replayed: true`. The keys live
//! in a SQLite file, so they outlast a restart.
//!
//! ```text
//! cargo run -p example-actix
//! curl -i localhost:3000/payments -H 'Idempotency-Key: order-7f3a' \
//!     -H 'Content-Type: application/json' -d '{"amount":1250,"currency":"EUR"}'
//! ```
//!
//! Send the `curl` twice: both answers carry the same charge, and the
//! server prints one. `cargo test -p example-actix` does the same.

use std::sync::atomic::{AtomicU64, Ordering};

use actix_web::{web, App, HttpResponse, HttpServer};
use idem::actix::IdempotencyMiddleware;
use idem::sqlite::SqliteStore;
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
#[derive(Default)]
struct Charges(AtomicU64);

async fn create_payment(charges: web::Data<Charges>, payment: web::Json<Payment>) -> HttpResponse {
    let n = charges.0.fetch_add(1, Ordering::SeqCst) + 1;
    println!("charging {} {}", payment.amount, payment.currency);
    HttpResponse::Created().json(Charge {
        id: format!("ch_{n}"),
    })
}

fn routes(config: &mut web::ServiceConfig) {
    config.route("/payments", web::post().to(create_payment));
}

#[actix_web::main]
async fn main() -> std::io::Result<()> {
    let store = SqliteStore::open("payments.db") // created if absent
        .await
        .map_err(std::io::Error::other)?;
    // A POST without a key is 400.
    let idem = IdempotencyMiddleware::new(store).require_key(true);
    let charges = web::Data::new(Charges::default());
    println!("listening on http://127.0.0.1:3000");
    HttpServer::new(move || {
        App::new()
            .wrap(idem.clone())
            .app_data(charges.clone())
            .configure(routes)
    })
    .bind("127.0.0.1:3000")?
    .run()
    .await
}

#[cfg(test)]
mod tests {
    use actix_web::http::StatusCode;
    use actix_web::test::{call_service, init_service, read_body, TestRequest};

    use super::*;

    fn pay(key: &str, body: &'static str) -> TestRequest {
        TestRequest::post()
            .uri("/payments")
            .insert_header(("idempotency-key", key))
            .insert_header(("content-type", "application/json"))
            .set_payload(body)
    }

    #[actix_web::test]
    async fn a_retried_payment_is_charged_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("idem.db")).await.unwrap();
        let charges = web::Data::new(Charges::default());
        let app = init_service(
            App::new()
                .wrap(IdempotencyMiddleware::new(store).require_key(true))
                .app_data(charges.clone())
                .configure(routes),
        )
        .await;
        let order = r#"{"amount":1250,"currency":"EUR"}"#;

        let first = call_service(&app, pay("order-7f3a", order).to_request()).await;
        let retry = call_service(&app, pay("order-7f3a", order).to_request()).await;
        assert_eq!(first.status(), StatusCode::CREATED);
        assert_eq!(retry.status(), StatusCode::CREATED);
        assert_eq!(retry.headers().get("idempotent-replayed").unwrap(), "true");
        assert_eq!(read_body(first).await, read_body(retry).await);
        assert_eq!(charges.0.load(Ordering::SeqCst), 1);

        // The same key for another amount is a client bug: 422, no charge.
        let other = r#"{"amount":9900,"currency":"EUR"}"#;
        let reused = call_service(&app, pay("order-7f3a", other).to_request()).await;
        assert_eq!(reused.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(charges.0.load(Ordering::SeqCst), 1);
    }
}
