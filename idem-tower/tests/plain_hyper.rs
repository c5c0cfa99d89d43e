//! The layer in front of a plain tower service served by hyper, with a hyper
//! client: no axum anywhere. The HTTP behaviour suite (`idem-http-suite`)
//! drives the layer under axum on every store.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use idem_core::MemoryStore;
use idem_tower::{BoxError, IdempotencyLayer, RequestBody};
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceBuilder;

#[tokio::test]
async fn the_layer_serves_plain_hyper() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    let service = ServiceBuilder::new()
        .layer(IdempotencyLayer::new(MemoryStore::new()))
        .service_fn(move |request: Request<RequestBody>| {
            let runs = Arc::clone(&counted);
            async move {
                let body = request.into_body().collect().await?.to_bytes();
                let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                let answer = format!("run {run}: {} bytes", body.len());
                Ok::<_, BoxError>(
                    Response::builder()
                        .status(StatusCode::CREATED)
                        .body(Full::new(Bytes::from(answer)))
                        .unwrap(),
                )
            }
        });

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), service));
        }
    });

    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut answers = Vec::new();
    for _ in 0..2 {
        let request = Request::post(format!("http://{addr}/charges"))
            .header("host", addr.to_string())
            .header("idempotency-key", "\"hyper-1\"")
            .body(Full::new(Bytes::from_static(b"{\"amount\":5}")))
            .unwrap();
        sender.ready().await.unwrap();
        let response = sender.send_request(request).await.unwrap();
        let replayed = response.headers().get("idempotent-replayed").cloned();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        answers.push((status, replayed, body));
    }
    assert_eq!(answers[0].0, StatusCode::CREATED);
    assert_eq!(answers[0].1, None);
    assert_eq!(answers[1].0, StatusCode::CREATED);
    assert_eq!(
        answers[1].1.as_ref().map(|v| v.as_bytes()),
        Some(&b"true"[..])
    );
    assert_eq!(answers[0].2, answers[1].2);
    assert_eq!(&answers[0].2[..], b"run 1: 12 bytes");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
