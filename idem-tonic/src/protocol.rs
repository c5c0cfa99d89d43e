//! The gRPC side of the protocol, without tower: where a call's status is,
//! which statuses are recorded, the answers the layer makes itself, the
//! message framing and the fingerprint.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response};
use idem_core::fingerprint::PartsHasher;
use idem_core::{Error, Fingerprint, KeyError};
use tonic::{Code, Status};

/// The metadata entry that carries the key by default.
pub const KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The metadata entry every replay carries in its headers, `true`.
pub const REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The trailer of gRFC A6 that tells a client when to retry, in
/// milliseconds; a client that retries waits that long instead of its own
/// backoff.
pub const PUSHBACK: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");

/// The statuses that release the key by default rather than being
/// recorded: those that say the call may succeed if tried again.
pub const RELEASED: [Code; 5] = [
    Code::Unavailable,
    Code::ResourceExhausted,
    Code::Internal,
    Code::Unknown,
    Code::DeadlineExceeded,
];

/// The status of an answer: `grpc-status` in its trailers, or in its
/// headers for a trailers-only answer. An answer without one, or with a
/// value that is not a number, is `UNKNOWN`, as gRPC clients read it.
pub fn status_of(headers: &HeaderMap, trailers: Option<&HeaderMap>) -> Code {
    trailers
        .and_then(|trailers| trailers.get(GRPC_STATUS))
        .or_else(|| headers.get(GRPC_STATUS))
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<i32>().ok())
        .map_or(Code::Unknown, Code::from_i32)
}

/// A trailers-only answer with this status and message.
pub(crate) fn answer<B: Default>(code: Code, message: &str) -> Response<B> {
    Status::new(code, message).into_http()
}

/// `ABORTED` with `grpc-retry-pushback-ms` set to the time left on the
/// running call's lease (at least 1 ms): the answer to a call whose key is
/// in flight.
pub(crate) fn in_progress<B: Default>(left: Duration) -> Response<B> {
    let mut response: Response<B> = answer(
        Code::Aborted,
        "a call with this idempotency key is in progress; retry after the pushback",
    );
    let millis = left.as_millis().clamp(1, i32::MAX as u128);
    response
        .headers_mut()
        .insert(PUSHBACK, HeaderValue::from(millis as u64));
    response
}

/// `INVALID_ARGUMENT` for a key that cannot be used, saying why.
pub(crate) fn invalid_key<B: Default>(why: &str) -> Response<B> {
    answer(
        Code::InvalidArgument,
        &format!("invalid idempotency key: {why}"),
    )
}

/// `INVALID_ARGUMENT` for a protected call without a key, naming the
/// metadata entry that carries it.
pub(crate) fn missing_key<B: Default>(entry: &HeaderName) -> Response<B> {
    let message = format!("this method requires an idempotency key ({entry})");
    answer(Code::InvalidArgument, &message)
}

/// The answer to a call the exchange refused, logged under its `key`.
pub(crate) fn refuse<B: Default>(key: &str, error: Error) -> Response<B> {
    match error {
        Error::InvalidKey(KeyError::InvalidScope {
            part: "namespace", ..
        }) => {
            tracing::error!(key, "the idempotency namespace is not usable");
            answer(Code::Internal, "the idempotency layer is misconfigured")
        }
        Error::InvalidKey(error) => invalid_key(&error.to_string()),
        Error::Mismatch => answer(
            Code::FailedPrecondition,
            "this idempotency key was used with another method or request message",
        ),
        Error::InProgress { retry_after } => in_progress(retry_after),
        Error::Store { source, .. } => {
            tracing::error!(key, error = %source,
                "idempotency store failed; answering UNAVAILABLE");
            answer(
                Code::Unavailable,
                "the idempotency store is unavailable; the call did not run",
            )
        }
        error => {
            tracing::error!(key, %error, "idempotency check failed");
            answer(Code::Internal, "the idempotency check failed")
        }
    }
}

/// The pushback of a trailers-only answer: `Some` when it carries a
/// non-negative `grpc-retry-pushback-ms`. gRFC A6 reads a negative or
/// malformed value as "do not retry".
pub fn pushback(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(PUSHBACK)?.to_str().ok()?;
    let millis = value.trim().parse::<i64>().ok()?;
    u64::try_from(millis).ok().map(Duration::from_millis)
}

/// Why a unary request body is not one gRPC message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// Shorter than its length prefix says, or than a prefix.
    Truncated,
    /// More than one message.
    Several,
}

/// One gRPC message: whether it is compressed, and its bytes.
#[derive(Debug, Clone)]
pub(crate) struct Message {
    pub(crate) compressed: bool,
    pub(crate) bytes: Bytes,
}

/// Reads the body of a unary request: one length-prefixed message (a
/// compressed-flag byte, a big-endian `u32` length, the message).
pub(crate) fn single_message(body: &Bytes) -> Result<Message, Framing> {
    if body.len() < 5 {
        return Err(Framing::Truncated);
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    let end = 5usize.checked_add(len).ok_or(Framing::Truncated)?;
    if body.len() < end {
        return Err(Framing::Truncated);
    }
    if body.len() > end {
        return Err(Framing::Several);
    }
    Ok(Message {
        compressed: body[0] != 0,
        bytes: body.slice(5..end),
    })
}

/// The fingerprint of a unary call: its full method path
/// (`/package.Service/Method`), the `grpc-encoding` of a compressed
/// message (empty otherwise), and the message's bytes as the client
/// encoded them.
pub fn fingerprint(
    path: &str,
    headers: &HeaderMap,
    compressed: bool,
    message: &[u8],
) -> Fingerprint {
    let mut parts = PartsHasher::new();
    parts.update(b"grpc");
    parts.update(path.as_bytes());
    let encoding = match compressed {
        true => headers
            .get(GRPC_ENCODING)
            .map_or(&b"identity"[..], HeaderValue::as_bytes),
        false => b"",
    };
    parts.update(encoding);
    parts.update(message);
    parts.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_is_read_from_trailers_then_headers() {
        let mut headers = HeaderMap::new();
        let mut trailers = HeaderMap::new();
        assert_eq!(status_of(&headers, None), Code::Unknown);
        headers.insert(GRPC_STATUS, HeaderValue::from_static("14"));
        assert_eq!(status_of(&headers, None), Code::Unavailable);
        trailers.insert(GRPC_STATUS, HeaderValue::from_static("0"));
        assert_eq!(status_of(&headers, Some(&trailers)), Code::Ok);
        trailers.insert(GRPC_STATUS, HeaderValue::from_static("x"));
        assert_eq!(status_of(&headers, Some(&trailers)), Code::Unknown);
    }

    #[test]
    fn pushback_is_a_non_negative_number_of_milliseconds() {
        let with = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(PUSHBACK, HeaderValue::from_static(value));
            pushback(&headers)
        };
        assert_eq!(with("250"), Some(Duration::from_millis(250)));
        assert_eq!(with("0"), Some(Duration::ZERO));
        assert_eq!(with("-1"), None);
        assert_eq!(with("soon"), None);
        assert_eq!(pushback(&HeaderMap::new()), None);
        let answer: Response<()> = in_progress(Duration::from_micros(10));
        assert_eq!(pushback(answer.headers()), Some(Duration::from_millis(1)));
    }

    #[test]
    fn a_unary_body_is_exactly_one_message() {
        let one = Bytes::from_static(b"\0\0\0\0\x02ab");
        let message = single_message(&one).unwrap();
        assert!(!message.compressed);
        assert_eq!(&message.bytes[..], b"ab");
        let empty = single_message(&Bytes::from_static(b"\x01\0\0\0\0")).unwrap();
        assert!(empty.compressed && empty.bytes.is_empty());
        assert_eq!(
            single_message(&Bytes::from_static(b"\0\0\0\0\x03ab")).unwrap_err(),
            Framing::Truncated
        );
        assert_eq!(
            single_message(&Bytes::from_static(b"\0\0\0")).unwrap_err(),
            Framing::Truncated
        );
        assert_eq!(
            single_message(&Bytes::from_static(b"\0\0\0\0\x01ab")).unwrap_err(),
            Framing::Several
        );
    }

    #[test]
    fn fingerprints_tell_methods_encodings_and_messages_apart() {
        let headers = HeaderMap::new();
        let base = fingerprint("/a.S/M", &headers, false, b"m");
        assert_eq!(base, fingerprint("/a.S/M", &headers, false, b"m"));
        assert_ne!(base, fingerprint("/a.S/N", &headers, false, b"m"));
        assert_ne!(base, fingerprint("/a.S/M", &headers, false, b"n"));
        assert_ne!(base, fingerprint("/a.S/M", &headers, true, b"m"));
    }
}
