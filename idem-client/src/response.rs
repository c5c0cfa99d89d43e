//! A final response, read in full.

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use serde::de::DeserializeOwned;

use crate::IdempotencyKey;

/// The header an idem server sets on a replayed response.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// A response whose body has been read in full.
///
/// The body is read inside the retry loop: a connection that breaks
/// mid-body is retried like one that broke before the status line (the key
/// makes that safe), so an `Ok` always holds the whole answer.
#[derive(Debug, Clone)]
pub struct Response {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    pub(crate) url: reqwest::Url,
    pub(crate) key: Option<IdempotencyKey>,
    pub(crate) attempts: u32,
}

impl Response {
    /// The status code.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    /// The body's bytes.
    pub fn bytes(&self) -> &Bytes {
        &self.body
    }

    /// The body as text; invalid UTF-8 is replaced.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body decoded from JSON.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }

    /// The URL of the request (after redirects).
    pub fn url(&self) -> &reqwest::Url {
        &self.url
    }

    /// The idempotency key the request carried, if any.
    pub fn key(&self) -> Option<&IdempotencyKey> {
        self.key.as_ref()
    }

    /// How many attempts it took (1 when the first one answered).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Whether the server says this is a replay of an earlier answer
    /// (`Idempotent-Replayed: true`), not a fresh execution.
    pub fn replayed(&self) -> bool {
        self.headers
            .get(IDEMPOTENT_REPLAYED)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"))
    }

    /// The response as an `http` one.
    pub fn into_http(self) -> http::Response<Bytes> {
        let mut response = http::Response::new(self.body);
        *response.status_mut() = self.status;
        *response.headers_mut() = self.headers;
        response
    }
}
