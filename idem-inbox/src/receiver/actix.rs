//! The actix-web glue: a resource whose `POST` is [`Receiver::respond`].
//!
//! actix-web keeps its own header and status types (from `http` 0.2);
//! this file only copies them to and from the `http` 1 types the receiver
//! speaks. A header that does not copy (it cannot happen for a header
//! actix parsed) is left out, which at worst fails verification: a 401, not
//! a panic.

use std::sync::Arc;

use actix_web::http::header as actix_header;
use actix_web::web;
use actix_web::{HttpRequest, HttpResponse, Resource};
use bytes::BytesMut;
use futures_util::StreamExt;
use http::{HeaderMap, HeaderName, HeaderValue};

use super::Receiver;

impl Receiver {
    /// An actix-web resource at `path` answering `POST` with this
    /// receiver, as [`router`](Receiver::router) does for axum: 202 with
    /// `{"status":"enqueued"|"duplicate","job":…}`, or a problem.
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # use idem_inbox::{queue::SqliteQueue, verify::GitHub, Receiver};
    /// # async fn serve() -> Result<(), Box<dyn std::error::Error>> {
    /// let queue = Arc::new(SqliteQueue::open("inbox.db").await?);
    /// let receiver = Receiver::new("github", GitHub::new(["It's a Secret to Everybody"])?, queue);
    /// actix_web::HttpServer::new(move || {
    ///     actix_web::App::new().service(receiver.clone().actix_resource("/webhooks/github"))
    /// })
    /// .bind("127.0.0.1:3001")?
    /// .run()
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub fn actix_resource(self, path: &str) -> Resource {
        let receiver = Arc::new(self);
        web::resource(path).route(web::post().to(
            move |request: HttpRequest, payload: web::Payload| {
                let receiver = Arc::clone(&receiver);
                async move {
                    let headers = headers_of(request.headers());
                    let body = match read_up_to(payload, receiver.max_body).await {
                        Ok(body) => body,
                        Err(e) => {
                            return HttpResponse::BadRequest()
                                .content_type("text/plain")
                                .body(format!("the body could not be read: {e}"))
                        }
                    };
                    to_actix(receiver.respond(&headers, &body).await)
                }
            },
        ))
    }
}

/// The body, read up to one byte past `limit`: enough for the receiver to
/// answer its own 413 problem, where actix's payload limit would answer
/// plain text.
// actix-web's payload is not `Send`: its handlers run on the worker thread
// that accepted the connection, so this future never moves between threads.
#[allow(clippy::future_not_send)]
async fn read_up_to(
    mut payload: web::Payload,
    limit: usize,
) -> Result<BytesMut, actix_web::error::PayloadError> {
    let mut body = BytesMut::new();
    while let Some(chunk) = payload.next().await {
        body.extend_from_slice(&chunk?);
        if body.len() > limit {
            break;
        }
    }
    Ok(body)
}

fn headers_of(headers: &actix_header::HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_str().as_bytes()),
            HeaderValue::from_bytes(value.as_bytes()),
        ) {
            out.append(name, value);
        }
    }
    out
}

fn to_actix(response: http::Response<bytes::Bytes>) -> HttpResponse {
    let (parts, body) = response.into_parts();
    let status = actix_web::http::StatusCode::from_u16(parts.status.as_u16())
        .unwrap_or(actix_web::http::StatusCode::INTERNAL_SERVER_ERROR);
    let mut out = HttpResponse::build(status);
    for (name, value) in &parts.headers {
        if let (Ok(name), Ok(value)) = (
            actix_header::HeaderName::from_bytes(name.as_str().as_bytes()),
            actix_header::HeaderValue::from_bytes(value.as_bytes()),
        ) {
            out.append_header((name, value));
        }
    }
    out.body(body)
}
