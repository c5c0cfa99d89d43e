//! The layer hands the request's `traceparent` to the exchange, which keeps
//! it with the recorded response (see idem-http's "Trace continuity").

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use idem_core::{Idempotent, MemoryStore};
use idem_http::stored::{self, Stored};
use idem_tower::{BoxError, IdempotencyLayer, RequestBody};
use tower::{ServiceBuilder, ServiceExt};

const FIRST: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[tokio::test]
async fn the_first_requests_traceparent_is_recorded_and_a_retrys_is_not() {
    let idem = Idempotent::new(MemoryStore::new());
    let service = ServiceBuilder::new()
        .layer(IdempotencyLayer::from_idempotent(idem.clone()))
        .service_fn(|_: Request<RequestBody>| async {
            Ok::<_, BoxError>(
                Response::builder()
                    .status(StatusCode::CREATED)
                    .body(Full::new(Bytes::from_static(b"charged")))
                    .unwrap(),
            )
        });
    let retry = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    for traceparent in [FIRST, retry] {
        let request = Request::post("/charges")
            .header("idempotency-key", "trace-1")
            .header("traceparent", traceparent)
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        let response = service.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
    }
    // Sent without `Authorization`: recorded in the anonymous caller's scope.
    let anonymous = idem.scoped(idem_http::Caller::Anonymous.scope());
    let key = anonymous.key("trace-1").unwrap();
    let record = idem.store().load(key.as_str()).await.unwrap().unwrap();
    let Stored::Response { traceparent, .. } = stored::decode(&record.payload).unwrap() else {
        panic!("a response was recorded");
    };
    assert_eq!(traceparent.map(|p| p.to_string()).as_deref(), Some(FIRST));
}
