//! Where a request's idempotency key comes from: the header, a JSON
//! Pointer into the body, or a function over the whole request.

use std::fmt;
use std::sync::Arc;

use http::header::CONTENT_LENGTH;
use http::{HeaderMap, HeaderName, Method, Uri};
use idem_core::Key;
use serde_json::Value;

use crate::{Admission, Options, Problem};

type KeyFn = dyn Fn(&Method, &Uri, &HeaderMap, &[u8]) -> Option<String> + Send + Sync;

/// Where the idempotency key of a request is read. The header is the
/// default; a key in the body (Google's AIP-155 `request_id`, APIs that
/// put the key in the payload) or found by a function is read once the
/// body is, so [`Options::admit`] answers [`Admission::KeyInBody`] and the
/// adapter calls [`Options::admit_body`] with the body it read.
///
/// ```
/// use idem_http::{KeySource, Options};
///
/// let by_pointer = Options::new(idem_core::MemoryStore::new())
///     .with_key_source(KeySource::json_pointer("/request_id"));
/// let by_function = Options::new(idem_core::MemoryStore::new())
///     .with_key_source(KeySource::function(|_method, uri, _headers, _body| {
///         // `/orders/{id}/capture`: the order id is the key.
///         uri.path().strip_prefix("/orders/")?.split('/').next().map(str::to_owned)
///     }));
/// # let _ = (by_pointer, by_function);
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub enum KeySource {
    /// One header's value, as [`client_key`](crate::client_key) reads it.
    Header(HeaderName),
    /// The string at this JSON Pointer (RFC 6901) of a JSON body. A body
    /// that is not JSON, or holds nothing there, has no key; a value that
    /// is not a string is an invalid key.
    JsonPointer(String),
    /// What the function returns for the method, URI, headers and body;
    /// `None` when the request has no key.
    Function(Arc<KeyFn>),
}

impl KeySource {
    /// [`KeySource::JsonPointer`].
    ///
    /// # Panics
    ///
    /// If `pointer` is neither empty nor starts with `/`: it would find
    /// nothing, silently.
    pub fn json_pointer(pointer: impl Into<String>) -> KeySource {
        let pointer = pointer.into();
        assert!(
            pointer.is_empty() || pointer.starts_with('/'),
            "a JSON Pointer is empty or starts with `/`: {pointer:?}"
        );
        KeySource::JsonPointer(pointer)
    }

    /// [`KeySource::Function`].
    pub fn function<F>(f: F) -> KeySource
    where
        F: Fn(&Method, &Uri, &HeaderMap, &[u8]) -> Option<String> + Send + Sync + 'static,
    {
        KeySource::Function(Arc::new(f))
    }

    /// Where the key was looked for, for a client told it is missing.
    fn place(&self) -> String {
        match self {
            KeySource::Header(name) => format!("in an `{name}` header"),
            KeySource::JsonPointer(pointer) => format!("at `{pointer}` in its JSON body"),
            KeySource::Function(_) => "where this endpoint documents it".to_owned(),
        }
    }
}

impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySource::Header(name) => f.debug_tuple("Header").field(name).finish(),
            KeySource::JsonPointer(pointer) => f.debug_tuple("JsonPointer").field(pointer).finish(),
            KeySource::Function(_) => f.write_str("Function(..)"),
        }
    }
}

impl Options {
    /// Reads the key from `source` instead of the `Idempotency-Key`
    /// header. A [`KeySource::Header`] is [`with_header_name`](Self::with_header_name).
    pub fn with_key_source(mut self, source: KeySource) -> Options {
        match source {
            KeySource::Header(name) => {
                self.header = name;
                self.body_key = None;
            }
            other => self.body_key = Some(other),
        }
        self
    }

    /// Where keys are read.
    pub fn key_source(&self) -> KeySource {
        self.body_key
            .clone()
            .unwrap_or_else(|| KeySource::Header(self.header.clone()))
    }

    /// The answer of [`admit`](Self::admit) for a protected method when the
    /// key is not in a header: the body is needed first, unless its declared
    /// length is over the limit.
    pub(crate) fn admit_before_body(&self, headers: &HeaderMap) -> Admission {
        let declared = headers
            .get(CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<u64>().ok());
        if declared.is_some_and(|len| len > self.max_request_body as u64) {
            return Admission::Refuse(Problem::BodyTooLarge(self.max_request_body));
        }
        Admission::KeyInBody
    }

    /// Reads the key of a request [`admit`](Self::admit) answered with
    /// [`Admission::KeyInBody`], now that its body is read: protected
    /// under the key found, passed through without one (or refused with
    /// 400 when keys are required), or refused when the key found breaks
    /// the key rules.
    pub fn admit_body(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Admission {
        let source = self.key_source();
        let found = match &source {
            KeySource::Header(name) => match crate::client_key(headers, name) {
                Ok(key) => Ok(key),
                Err(error) => Err(error.detail(name)),
            },
            KeySource::JsonPointer(pointer) => from_pointer(body, pointer),
            KeySource::Function(f) => Ok(f(method, uri, headers, body)),
        };
        match found {
            Ok(Some(key)) => match Key::validate_client_key(&key) {
                Ok(()) => Admission::Protect(key),
                Err(error) => Admission::Refuse(Problem::InvalidKey(error.to_string())),
            },
            Ok(None) if self.require_key => {
                Admission::Refuse(Problem::MissingKeyIn(source.place()))
            }
            Ok(None) => Admission::Pass,
            Err(detail) => Admission::Refuse(Problem::InvalidKey(detail)),
        }
    }
}

/// The string at `pointer` of a JSON body.
fn from_pointer(body: &[u8], pointer: &str) -> Result<Option<String>, String> {
    let Ok(document) = serde_json::from_slice::<Value>(body) else {
        return Ok(None);
    };
    match document.pointer(pointer) {
        None => Ok(None),
        Some(Value::String(key)) => Ok(Some(key.clone())),
        Some(_) => Err(format!(
            "the idempotency key at `{pointer}` in the body must be a string"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::MemoryStore;

    fn admit(options: &Options, uri: &str, body: &str) -> Admission {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            "application/json".parse().unwrap(),
        );
        assert_eq!(options.admit(&Method::POST, &headers), Admission::KeyInBody);
        options.admit_body(
            &Method::POST,
            &uri.parse().unwrap(),
            &headers,
            body.as_bytes(),
        )
    }

    #[test]
    fn a_json_pointer_reads_the_key_from_the_body() {
        let options = Options::new(MemoryStore::new())
            .with_key_source(KeySource::json_pointer("/request_id"));
        assert_eq!(
            admit(&options, "/p", r#"{"request_id":"r-1","amount":5}"#),
            Admission::Protect("r-1".into())
        );
        assert_eq!(admit(&options, "/p", r#"{"amount":5}"#), Admission::Pass);
        assert_eq!(admit(&options, "/p", "not json"), Admission::Pass);
        assert!(matches!(
            admit(&options, "/p", r#"{"request_id":7}"#),
            Admission::Refuse(Problem::InvalidKey(_))
        ));
        assert!(matches!(
            admit(&options, "/p", r#"{"request_id":"a b"}"#),
            Admission::Refuse(Problem::InvalidKey(_))
        ));
        let required = options.require_key(true);
        let Admission::Refuse(problem) = admit(&required, "/p", "{}") else {
            panic!("a required key that is missing is refused");
        };
        assert_eq!(problem.name(), "missing-key");
        assert!(problem.document()["detail"]
            .as_str()
            .unwrap()
            .contains("/request_id"));
    }

    #[test]
    fn a_function_reads_the_key_from_the_request() {
        let options = Options::new(MemoryStore::new()).with_key_source(KeySource::function(
            |_, uri, _, _| uri.path().strip_prefix("/orders/").map(str::to_owned),
        ));
        assert_eq!(
            admit(&options, "/orders/o-7", ""),
            Admission::Protect("o-7".into())
        );
        assert_eq!(admit(&options, "/other", ""), Admission::Pass);
        assert_eq!(
            options.admit(&Method::GET, &HeaderMap::new()),
            Admission::Pass
        );
        let back = options.with_key_source(KeySource::Header(HeaderName::from_static("x-key")));
        assert!(matches!(back.key_source(), KeySource::Header(name) if name == "x-key"));
    }

    #[test]
    fn a_body_key_still_refuses_a_declared_body_over_the_limit() {
        let options = Options::new(MemoryStore::new())
            .with_key_source(KeySource::json_pointer("/request_id"))
            .with_max_request_body(4);
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_LENGTH, "5".parse().unwrap());
        assert_eq!(
            options.admit(&Method::POST, &headers),
            Admission::Refuse(Problem::BodyTooLarge(4))
        );
    }
}
