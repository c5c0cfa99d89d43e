//! Webhooks in with `idem::inbox`: each delivery is verified (Standard
//! Webhooks signatures), queued durably in SQLite and answered 202 at once;
//! a worker then handles every event once, however often it is resent.
//!
//! ```text
//! cargo run -p example-webhook-inbox
//! ```
//!
//! It prints a `curl` that delivers a signed event. Run it twice: the second
//! answer says `"duplicate"` and the handler prints once.
//! `cargo test -p example-webhook-inbox` does the same.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use idem::inbox::queue::SqliteQueue;
use idem::inbox::verify::StandardWebhooks;
use idem::inbox::{Event, HandlerError, Receiver, Worker};
use idem::sqlite::SqliteStore;
use idem::Idempotent;

/// The secret the provider signs with (in production: from its dashboard).
const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

/// The ids of the events handled: the side effect a resend must not repeat.
type Handled = Arc<Mutex<Vec<String>>>;

/// The receiver's routes and the worker that handles what they queue, both
/// kept in `dir`.
async fn inbox(
    dir: &Path,
    handled: Handled,
) -> Result<(Router, Worker), Box<dyn std::error::Error>> {
    let queue = Arc::new(SqliteQueue::open(dir.join("inbox.db")).await?);
    let receiver = Receiver::new("acme", StandardWebhooks::new([SECRET])?, queue.clone());
    let idem = Idempotent::new(SqliteStore::open(dir.join("idem.db")).await?);
    let worker = Worker::new(queue, idem, move |event: Event| {
        let handled = Arc::clone(&handled);
        async move {
            // An `Err` here is retried with backoff, then dead-lettered.
            println!(
                "handling {}: {}",
                event.id,
                String::from_utf8_lossy(&event.payload)
            );
            handled.lock().unwrap().push(event.id);
            Ok::<(), HandlerError>(())
        }
    });
    Ok((
        Router::new().nest("/webhooks/acme", receiver.router()),
        worker,
    ))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (app, worker) = inbox(Path::new("."), Handled::default()).await?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() as i64;
    let (id, body) = (format!("evt_{now}"), r#"{"type":"invoice.paid"}"#);
    let signature = StandardWebhooks::new([SECRET])?.sign(&id, now, body.as_bytes());
    println!(
        "curl -i localhost:3001/webhooks/acme -H 'webhook-id: {id}' \
         -H 'webhook-timestamp: {now}' -H 'webhook-signature: {signature}' -d '{body}'"
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3001").await?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    // On Ctrl-C the worker stops claiming and lets running handlers finish.
    worker
        .run(async { tokio::signal::ctrl_c().await.unwrap_or(()) })
        .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use axum::body::{to_bytes, Body};
    use axum::http::{Request, StatusCode};
    use idem::inbox::Outcome;
    use tower::ServiceExt;

    use super::*;

    fn deliver(signature: &str, timestamp: i64) -> Request<Body> {
        Request::post("/webhooks/acme")
            .header("webhook-id", "evt_1")
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(Body::from(r#"{"type":"invoice.paid"}"#))
            .unwrap()
    }

    async fn post(app: &Router, request: Request<Body>) -> (StatusCode, String) {
        let response = app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let body = to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn a_resent_webhook_is_handled_once() {
        let dir = tempfile::tempdir().unwrap();
        let handled = Handled::default();
        let (app, worker) = inbox(dir.path(), handled.clone()).await.unwrap();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let signature = StandardWebhooks::new([SECRET]).unwrap().sign(
            "evt_1",
            now,
            br#"{"type":"invoice.paid"}"#,
        );

        let (status, body) = post(&app, deliver(&signature, now)).await;
        assert_eq!(status, StatusCode::ACCEPTED);
        assert!(body.contains(r#""status":"enqueued""#), "{body}");
        let (status, body) = post(&app, deliver(&signature, now)).await;
        assert_eq!(status, StatusCode::ACCEPTED);
        assert!(body.contains(r#""status":"duplicate""#), "{body}");

        assert_eq!(worker.run_once(10).await.unwrap(), [Outcome::Completed]);
        // A resend after the event was handled queues nothing either.
        let (_, body) = post(&app, deliver(&signature, now)).await;
        assert!(body.contains(r#""status":"duplicate""#), "{body}");
        assert_eq!(worker.run_once(10).await.unwrap(), []);
        assert_eq!(*handled.lock().unwrap(), ["evt_1"]);

        // A forged delivery is refused and queues nothing.
        let (status, _) = post(&app, deliver("v1,Zm9yZ2Vk", now)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }
}
