//! The answers the middleware gives in place of the handler's, as RFC 9457
//! `application/problem+json`.

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};

/// Every answer the middleware gives in place of the handler's.
///
/// The `type` of each is a `tag:` URI (RFC 4151): a stable name for clients
/// to match on, not a page to fetch: `tag:idem-rs.github.io,2025:problem/<name>`
/// with the names `invalid-key`, `missing-key`, `unreadable-body`,
/// `body-too-large`, `in-progress`, `mismatch`, `not-replayable`,
/// `store-unavailable` and `internal`; and for the webhook inbox
/// (`idem-inbox`), `webhook-unverified`, `webhook-too-large`,
/// `webhook-no-event-id` and `inbox-unavailable`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// 400: the `Idempotency-Key` header is not one usable key.
    InvalidKey(String),
    /// 400: the key header is missing and the layer requires one.
    MissingKey(String),
    /// 400: the key the layer requires is not where it looks for it (in
    /// words: "at `/request_id` in its JSON body"); the same `missing-key`
    /// problem as [`MissingKey`](Problem::MissingKey).
    MissingKeyIn(String),
    /// 400: the request body could not be read.
    UnreadableBody,
    /// 409: another request with this key is running.
    InProgress(Duration),
    /// 409: the request ran, but its response could not be kept to replay.
    NotReplayable(&'static str),
    /// 413: the request body is over the limit.
    BodyTooLarge(usize),
    /// 422: the key was used with a different request.
    Mismatch,
    /// 500: the handler panicked, or the response could not be produced.
    Internal(&'static str),
    /// 503: the idempotency store failed before the handler ran.
    StoreUnavailable,
    /// 401: a webhook delivery failed verification. The document says only
    /// that it failed, never why, so a forger learns nothing.
    WebhookUnverified,
    /// 413: a webhook body is over the receiver's limit (in bytes).
    WebhookTooLarge(usize),
    /// 400: a verified webhook carries no event id where one was expected.
    WebhookNoEventId(&'static str),
    /// 503: a verified webhook could not be stored durably; the provider
    /// may resend it.
    InboxUnavailable,
}

impl Problem {
    fn parts(&self) -> (StatusCode, &'static str, &'static str, String) {
        match self {
            Problem::InvalidKey(detail) => (
                StatusCode::BAD_REQUEST,
                "invalid-key",
                "Invalid idempotency key",
                detail.clone(),
            ),
            Problem::MissingKey(header) => (
                StatusCode::BAD_REQUEST,
                "missing-key",
                "Idempotency key required",
                format!("this request needs an `{header}` header holding a unique key"),
            ),
            Problem::MissingKeyIn(place) => (
                StatusCode::BAD_REQUEST,
                "missing-key",
                "Idempotency key required",
                format!("this request needs a unique idempotency key {place}"),
            ),
            Problem::UnreadableBody => (
                StatusCode::BAD_REQUEST,
                "unreadable-body",
                "Request body could not be read",
                "the request body ended early or could not be read".to_owned(),
            ),
            Problem::InProgress(left) => (
                StatusCode::CONFLICT,
                "in-progress",
                "Request in progress",
                format!(
                    "a request with this idempotency key is still being processed; retry after {} s",
                    retry_after_secs(*left)
                ),
            ),
            Problem::NotReplayable(why) => (
                StatusCode::CONFLICT,
                "not-replayable",
                "Request already processed",
                format!(
                    "a request with this idempotency key was processed, but its response cannot \
                     be replayed ({why}); it will not run again, use a new key for a new request"
                ),
            ),
            Problem::BodyTooLarge(limit) => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "Request body too large",
                format!("requests with an idempotency key may carry at most {limit} body bytes"),
            ),
            Problem::Mismatch => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "mismatch",
                "Idempotency key reused",
                "this idempotency key was used for a different request (method, path, content \
                 type or body); use a new key for a new request"
                    .to_owned(),
            ),
            Problem::Internal(why) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal error",
                (*why).to_owned(),
            ),
            Problem::StoreUnavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "Idempotency store unavailable",
                "the request was not processed because its idempotency key could not be \
                 checked; it is safe to retry"
                    .to_owned(),
            ),
            Problem::WebhookUnverified => (
                StatusCode::UNAUTHORIZED,
                "webhook-unverified",
                "Webhook signature invalid",
                "the delivery could not be verified and was not accepted".to_owned(),
            ),
            Problem::WebhookTooLarge(limit) => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "webhook-too-large",
                "Webhook body too large",
                format!("the body is larger than {limit} bytes"),
            ),
            Problem::WebhookNoEventId(why) => (
                StatusCode::BAD_REQUEST,
                "webhook-no-event-id",
                "Webhook event id missing",
                (*why).to_owned(),
            ),
            Problem::InboxUnavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "inbox-unavailable",
                "Inbox unavailable",
                "the event could not be stored; it is safe to resend".to_owned(),
            ),
        }
    }

    /// The status this problem is answered with.
    pub fn status(&self) -> StatusCode {
        self.parts().0
    }

    /// The problem's name, the last segment of its `type`.
    pub fn name(&self) -> &'static str {
        self.parts().1
    }

    /// The RFC 9457 document: `type`, `title`, `status` and `detail`.
    pub fn document(&self) -> serde_json::Value {
        let (status, slug, title, detail) = self.parts();
        serde_json::json!({
            "type": format!("tag:idem-rs.github.io,2025:problem/{slug}"),
            "title": title,
            "status": status.as_u16(),
            "detail": detail,
        })
    }

    /// The response: the problem document, `Content-Type:
    /// application/problem+json`, and `Retry-After` for a request in
    /// progress.
    pub fn into_response(self) -> Response<Bytes> {
        let status = self.status();
        let body = self.document();
        let mut response = Response::new(Bytes::from(body.to_string()));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Problem::InProgress(left) = self {
            headers.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(left)));
        }
        response
    }
}

/// Whole seconds, rounded up and at least one: a client told "0" would
/// retry at once into the same conflict.
fn retry_after_secs(left: Duration) -> u64 {
    let secs = left.as_secs() + u64::from(left.subsec_nanos() > 0);
    secs.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_at_least_one_second() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(2)), 2);
        assert_eq!(retry_after_secs(Duration::from_millis(2001)), 3);
    }

    #[test]
    fn in_progress_carries_retry_after_and_problem_json() {
        let response = Problem::InProgress(Duration::from_millis(1500)).into_response();
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(response.headers()[RETRY_AFTER], "2");
        assert_eq!(response.headers()[CONTENT_TYPE], "application/problem+json");
    }
}
