//! A tonic server behind a layer on a loopback port, and raw calls that
//! keep every byte of an answer.

#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request};
use http_body_util::{BodyExt, Full};
use idem_tonic::IdempotencyLayer;
use idem_tonic_testing::{incoming, listener, ChargeRequest, Payments, PaymentsServer};
use prost::Message;
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Server};
use tower::ServiceExt;

/// A server running the counting payments service behind `layer`.
pub struct Running {
    pub address: SocketAddr,
    pub payments: Payments,
    task: JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Running {
    /// A channel to the server, connected on first use.
    pub fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.address))
            .expect("a valid URI")
            .connect_lazy()
    }
}

/// Serves a fresh payments service behind `layer` on a free port.
pub async fn serve(layer: IdempotencyLayer) -> Running {
    let payments = Payments::new();
    let (listener, address) = listener().await;
    let service = PaymentsServer::new(payments.clone());
    let task = tokio::spawn(async move {
        Server::builder()
            .layer(layer)
            .add_service(service)
            .serve_with_incoming(incoming(listener))
            .await
            .expect("the server runs");
    });
    Running {
        address,
        payments,
        task,
    }
}

/// An answer as it came off the wire.
#[derive(Debug, Clone, PartialEq)]
pub struct Raw {
    pub headers: HeaderMap,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
}

impl Raw {
    /// The `grpc-status`, from the trailers or a trailers-only answer.
    pub fn code(&self) -> tonic::Code {
        idem_tonic::status_of(&self.headers, self.trailers.as_ref())
    }

    /// The headers without what a server adds to each answer afresh
    /// (`date`) and without the replay marker.
    pub fn recorded_headers(&self) -> HeaderMap {
        let mut headers = self.headers.clone();
        headers.remove("date");
        headers.remove(idem_tonic::REPLAYED);
        headers
    }

    pub fn replayed(&self) -> bool {
        self.headers.get(idem_tonic::REPLAYED) == Some(&HeaderValue::from_static("true"))
    }
}

/// Frames `message` as the one message of a unary call.
pub fn framed(message: &ChargeRequest) -> Bytes {
    let encoded = message.encode_to_vec();
    let mut body = Vec::with_capacity(5 + encoded.len());
    body.push(0);
    body.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
    body.extend_from_slice(&encoded);
    Bytes::from(body)
}

/// Calls `path` with `message` and the metadata given, and keeps the
/// answer's every byte.
pub async fn raw(
    channel: &Channel,
    path: &str,
    metadata: &[(&str, &str)],
    message: &ChargeRequest,
) -> Raw {
    let mut request = Request::post(path)
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (name, value) in metadata {
        request = request.header(*name, *value);
    }
    let request = request
        .body(tonic::body::Body::new(Full::new(framed(message))))
        .expect("a valid request");
    let response = channel
        .clone()
        .oneshot(request)
        .await
        .expect("the server answers");
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.expect("the answer arrives whole");
    let trailers = collected.trailers().cloned();
    Raw {
        headers: parts.headers,
        body: collected.to_bytes(),
        trailers,
    }
}

/// A charge request.
pub fn charge(amount: i64, outcome: &str) -> ChargeRequest {
    ChargeRequest {
        request_id: String::new(),
        amount,
        currency: "EUR".into(),
        outcome: outcome.into(),
    }
}
