//! The HTTP layer's parsers: the stored-response format and the
//! `Idempotency-Key` header.

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;
use idem_core::Key;
use idem_http::stored::{self, Stored, Unreplayable};

/// Decodes a stored response as a replay does, and encodes what it decoded
/// again.
fn reencode(payload: &[u8]) -> Result<Vec<u8>, stored::DecodeError> {
    Ok(match stored::decode(payload)? {
        Stored::Response {
            status,
            headers,
            body,
            traceparent,
            ..
        } => stored::encode_traced(status, &headers, &body, traceparent),
        Stored::Streamed {
            status,
            headers,
            traceparent,
            manifest,
            ..
        } => stored::encode_streamed(status, &headers, traceparent, manifest),
        Stored::Unreplayable(why) => stored::encode_unreplayable(why),
        other => panic!("a stored kind this target does not know: {other:?}"),
    })
}

/// Encodes a response as the layer stores it; `None` when `http` refuses
/// the status or a header.
fn encode(status: u16, headers: &[(&str, &[u8])], body: &[u8]) -> Option<Vec<u8>> {
    let status = StatusCode::from_u16(status).ok()?;
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        map.append(
            HeaderName::from_bytes(name.as_bytes()).ok()?,
            HeaderValue::from_bytes(value).ok()?,
        );
    }
    Some(stored::encode(status, &map, body))
}

/// Reads the key from one `Idempotency-Key` header line holding `value`:
/// `None` when `http` refuses the value as a header value.
fn read_key(value: &[u8]) -> Option<Result<Option<String>, String>> {
    let name = HeaderName::from_static("idempotency-key");
    let mut headers = HeaderMap::new();
    headers.insert(name.clone(), HeaderValue::from_bytes(value).ok()?);
    Some(idem_http::client_key(&headers, &name).map_err(|error| error.detail(&name)))
}

/// The stored-response format. Input: the payload as a store returns it.
pub fn stored_response(data: &[u8]) {
    if let Ok(encoded) = reencode(data) {
        assert_eq!(encoded, data, "a payload that decodes re-encodes as it was");
    }
}

/// Payloads from the layer's encoder: responses with and without headers
/// and body, repeated headers, one with a trace parent, responses
/// recorded in chunks, and every marker.
pub(crate) fn stored_response_seeds() -> Vec<Vec<u8>> {
    let json: &[(&str, &[u8])] = &[
        ("content-type", b"application/json"),
        ("x-request-id", b"r-1"),
        ("vary", b"accept"),
        ("vary", b"origin"),
        ("set-cookie", b"session=1"),
        ("connection", b"close"),
    ];
    let responses = [
        (201, json, &b"{\"id\":\"ch_1\"}"[..]),
        (200, &[][..], &b""[..]),
        (204, &[("etag", &b"\"x\""[..])][..], &b""[..]),
        (999, &[("x-bin", &b"\x80\xff\t"[..])][..], &[0u8; 40][..]),
    ];
    let mut seeds: Vec<Vec<u8>> = responses
        .iter()
        .filter_map(|(status, headers, body)| encode(*status, headers, body))
        .collect();
    // Version 2: the same response with the trace parent of its request.
    let parent =
        idem_http::TraceParent::parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    seeds.push(stored::encode_traced(
        StatusCode::CREATED,
        &HeaderMap::new(),
        b"{}",
        parent,
    ));
    // Version 3: responses recorded in chunks, with and without a trace
    // parent.
    let manifest = idem_core::chunks::Manifest::decode(&[9u8; 28]).expect("28 bytes");
    let mut streamed = HeaderMap::new();
    streamed.append(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    for parent in [None, parent] {
        seeds.push(stored::encode_streamed(
            StatusCode::OK,
            &streamed,
            parent,
            manifest,
        ));
    }
    seeds.extend(
        [
            Unreplayable::TooLarge,
            Unreplayable::BodyFailed,
            Unreplayable::RecordingFailed,
        ]
        .map(stored::encode_unreplayable),
    );
    seeds
}

/// The `Idempotency-Key` header parser. Input: one header line's value.
pub fn idempotency_key(data: &[u8]) {
    let Some(parsed) = read_key(data) else {
        return;
    };
    let key = match parsed {
        Ok(Some(key)) => key,
        Ok(None) => panic!("a header that is present reads as absent"),
        Err(detail) => return assert!(!detail.is_empty()),
    };
    assert_eq!(Key::validate_client_key(&key), Ok(()));
    // The key written back as an sf-string, or bare when the input was, is
    // the value it was read from, less the spaces around it.
    let raw = data.trim_ascii();
    let encoded = if raw.first() == Some(&b'"') {
        let mut quoted = vec![b'"'];
        for &byte in key.as_bytes() {
            if matches!(byte, b'"' | b'\\') {
                quoted.push(b'\\');
            }
            quoted.push(byte);
        }
        quoted.push(b'"');
        quoted
    } else {
        key.clone().into_bytes()
    };
    assert_eq!(encoded, raw, "{key:?}");
    let reread = read_key(&encoded);
    assert_eq!(reread, Some(Ok(Some(key))));
}

/// Header values clients send: bare and quoted keys, escapes, lists,
/// parameters, and the characters the key rule refuses.
pub(crate) fn idempotency_key_seeds() -> Vec<Vec<u8>> {
    [
        &b"8e03978e-40d5-43e8-bc93-6894a57f9324"[..],
        b"\"8e03978e-40d5-43e8-bc93-6894a57f9324\"",
        b"  order-7f3a  ",
        b"\"a\\\"b\\\\c\"",
        b"\"a\", \"b\"",
        b"\"a\";p=1",
        b"a,b",
        b"a;p",
        b"\"unterminated",
        b"\"\"",
        b"key with spaces",
        b"\"\x80\xff\"",
        b"\"tab\tinside\"",
    ]
    .iter()
    .map(|seed| seed.to_vec())
    .chain([vec![b'k'; 300]])
    .collect()
}
