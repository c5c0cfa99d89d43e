//! The axum glue: a router whose `POST /` is [`Receiver::respond`].

use std::sync::Arc;

use axum::body::{Body, Bytes};
use http::HeaderMap;

use super::Receiver;

impl Receiver {
    /// An axum router answering `POST /` with this receiver: 202 with
    /// `{"status":"enqueued"|"duplicate","job":…}`, or a problem. The body
    /// limit is the receiver's own ([`with_max_body`](Receiver::with_max_body)),
    /// so axum's default limit is lifted.
    pub fn router(self) -> axum::Router {
        let receiver = Arc::new(self);
        axum::Router::new()
            .route(
                "/",
                axum::routing::post(move |headers: HeaderMap, body: Bytes| {
                    let receiver = Arc::clone(&receiver);
                    async move { receiver.respond(&headers, &body).await.map(Body::from) }
                }),
            )
            .layer(axum::extract::DefaultBodyLimit::disable())
    }
}
