//! Recorded responses: the stored format replays are built from.
//!
//! # Stored format (versions 1 to 3)
//!
//! All integers are big-endian. The payload opens with a version byte (`1`
//! or `2`) and a kind byte.
//!
//! * Version 1, kind `0`, a response: status (`u16`), header count
//!   (`u16`), then per header its name length (`u16`), lowercase name,
//!   value length (`u32`) and value bytes, then the body length (`u64`) and
//!   the body. Nothing may follow.
//! * Version 1, kind `1`, executed but not replayable: one reason byte, `1`
//!   when the response body was over the limit, `2` when it failed while
//!   being read.
//! * Version 2, kind `0`, a response with the trace parent of the request
//!   that produced it (see [`TraceParent`]): the trace id (16 bytes), the
//!   span id (8 bytes, neither id all zeros) and the trace flags (1 byte),
//!   then the rest exactly as version 1's kind `0`. Version 2 has no other
//!   kind.
//!
//! * Version 3, kind `0`, a response whose body was recorded in chunks
//!   while it streamed: a trace flag byte (`0`, or `1` followed by the 25
//!   trace parent bytes of version 2), the status, header count and
//!   headers as in version 1, then the chunks' 28-byte
//!   [`Manifest`](idem_core::chunks::Manifest). Nothing may follow. Each
//!   chunk holds the body's frames in order, each as its length (`u32`)
//!   and bytes; a frame longer than a chunk is split across chunks.
//! * Version 1, kind `1`, reason `3`: the response streamed to its client
//!   but could not be recorded (the store failed while its chunks were
//!   written).
//!
//! [`encode_traced`] writes version 2 only when there is a trace parent to
//! keep; a response without one, and every marker, is written as version 1,
//! byte for byte what earlier builds wrote. So each value has one
//! encoding, records made before version 2 replay unchanged, and a build
//! that knows only version 1 still replays every record made without a
//! trace parent while a deployment rolls forward.
//!
//! Headers keep their order. `Set-Cookie` and hop-by-hop headers are never
//! stored. Anything that does not parse exactly is a [`DecodeError`], never
//! a panic.

use std::fmt;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, SET_COOKIE};
use http::{Response, StatusCode};

use crate::TraceParent;

const VERSION: u8 = 1;
/// The version of a response kept with its request's trace parent.
const VERSION_TRACED: u8 = 2;
/// The version of a response recorded in chunks.
const VERSION_STREAMED: u8 = 3;
const KIND_RESPONSE: u8 = 0;
const KIND_NOT_REPLAYABLE: u8 = 1;

/// The header every replay carries, with the value `true`.
pub const REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

// RFC 9110 §7.6.1 and the headers proxies treat the same way.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Why a request that ran has no response to replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unreplayable {
    /// The body was over the response limit.
    TooLarge,
    /// The body failed while it was read.
    BodyFailed,
    /// The body streamed to its client, but its chunks could not be
    /// written.
    RecordingFailed,
}

impl Unreplayable {
    /// Why, in words for the client.
    pub fn reason(self) -> &'static str {
        match self {
            Unreplayable::TooLarge => "the response was too large to store",
            Unreplayable::BodyFailed => "the response body failed while it was read",
            Unreplayable::RecordingFailed => "the response could not be recorded",
        }
    }
}

/// A decoded payload.
#[derive(Debug, PartialEq)]
#[non_exhaustive]
pub enum Stored {
    /// A response to replay.
    #[non_exhaustive]
    Response {
        /// The recorded status.
        status: StatusCode,
        /// The recorded headers, in their order.
        headers: HeaderMap,
        /// The recorded body.
        body: Bytes,
        /// The trace parent of the request that produced the response,
        /// when it had one (always `None` in a version 1 payload).
        traceparent: Option<TraceParent>,
    },
    /// A marker for a request that ran without a replayable response.
    Unreplayable(Unreplayable),
    /// A response whose body was recorded in chunks: replay it by reading
    /// the chunks the manifest names.
    #[non_exhaustive]
    Streamed {
        /// The recorded status.
        status: StatusCode,
        /// The recorded headers, in their order.
        headers: HeaderMap,
        /// The trace parent of the request that produced the response.
        traceparent: Option<TraceParent>,
        /// The chunks that hold the body.
        manifest: idem_core::chunks::Manifest,
    },
}

/// A payload that is not in the stored format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(&'static str);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stored response does not decode: {}", self.0)
    }
}

impl std::error::Error for DecodeError {}

/// Whether a response header is kept for replays: not `Set-Cookie`, not a
/// hop-by-hop header, not one that `Connection` names.
pub fn is_recorded(name: &HeaderName, headers: &HeaderMap) -> bool {
    if !is_recorded_name(name) {
        return false;
    }
    // Headers that `Connection` names are hop-by-hop for this message too.
    !headers.get_all(CONNECTION).iter().any(|value| {
        value.to_str().is_ok_and(|list| {
            list.split(',')
                .any(|token| token.trim().eq_ignore_ascii_case(name.as_str()))
        })
    })
}

/// Whether a header of this name may be recorded, whatever else the
/// response holds.
fn is_recorded_name(name: &HeaderName) -> bool {
    *name != SET_COOKIE && !HOP_BY_HOP.contains(&name.as_str())
}

/// Encodes a response for the store, leaving out the headers that are
/// never replayed: [`encode_traced`] without a trace parent.
pub fn encode(status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Vec<u8> {
    encode_traced(status, headers, body, None)
}

/// Encodes a response for the store with the trace parent of the request
/// that produced it: version 2 with one, version 1 without.
pub fn encode_traced(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
    traceparent: Option<TraceParent>,
) -> Vec<u8> {
    let kept = kept(headers);
    let mut out = Vec::with_capacity(14 + 25 + head_len(&kept) + body.len());
    match traceparent {
        Some(parent) => {
            out.extend_from_slice(&[VERSION_TRACED, KIND_RESPONSE]);
            push_traceparent(&mut out, parent);
        }
        None => out.extend_from_slice(&[VERSION, KIND_RESPONSE]),
    }
    push_head(&mut out, status, &kept);
    out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// Encodes a response whose body was recorded in the chunks `manifest`
/// names (version 3).
pub fn encode_streamed(
    status: StatusCode,
    headers: &HeaderMap,
    traceparent: Option<TraceParent>,
    manifest: idem_core::chunks::Manifest,
) -> Vec<u8> {
    let kept = kept(headers);
    let mut out = Vec::with_capacity(7 + 25 + head_len(&kept) + 28);
    out.extend_from_slice(&[VERSION_STREAMED, KIND_RESPONSE]);
    match traceparent {
        Some(parent) => {
            out.push(1);
            push_traceparent(&mut out, parent);
        }
        None => out.push(0),
    }
    push_head(&mut out, status, &kept);
    out.extend_from_slice(&manifest.encode());
    out
}

/// The headers a record keeps, in their order.
fn kept(headers: &HeaderMap) -> Vec<(&HeaderName, &HeaderValue)> {
    headers
        .iter()
        .filter(|(name, _)| is_recorded(name, headers))
        .collect()
}

fn head_len(kept: &[(&HeaderName, &HeaderValue)]) -> usize {
    kept.iter()
        .map(|(name, value)| 6 + name.as_str().len() + value.len())
        .sum()
}

fn push_traceparent(out: &mut Vec<u8>, parent: TraceParent) {
    out.extend_from_slice(&parent.trace_id());
    out.extend_from_slice(&parent.span_id());
    out.push(parent.flags());
}

/// The status, the header count and the headers.
fn push_head(out: &mut Vec<u8>, status: StatusCode, kept: &[(&HeaderName, &HeaderValue)]) {
    out.extend_from_slice(&status.as_u16().to_be_bytes());
    // `http` refuses maps this large long before these casts could wrap:
    // at most 32 768 entries, names under 64 KiB.
    out.extend_from_slice(&(kept.len() as u16).to_be_bytes());
    for (name, value) in kept {
        out.extend_from_slice(&(name.as_str().len() as u16).to_be_bytes());
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(&(value.len() as u32).to_be_bytes());
        out.extend_from_slice(value.as_bytes());
    }
}

/// Encodes the marker for a request that ran without a replayable response.
pub fn encode_unreplayable(why: Unreplayable) -> Vec<u8> {
    let reason = match why {
        Unreplayable::TooLarge => 1,
        Unreplayable::BodyFailed => 2,
        Unreplayable::RecordingFailed => 3,
    };
    vec![VERSION, KIND_NOT_REPLAYABLE, reason]
}

/// Decodes a payload written by [`encode`], [`encode_traced`] or
/// [`encode_unreplayable`], of either version.
pub fn decode(payload: &[u8]) -> Result<Stored, DecodeError> {
    decode_with(payload, Bytes::copy_from_slice)
}

/// Decodes a payload as [`decode`] does, without copying: the body and the
/// header values are slices of `payload`.
pub fn decode_shared(payload: impl Into<Bytes>) -> Result<Stored, DecodeError> {
    let payload = payload.into();
    decode_with(&payload, |part| payload.slice_ref(part))
}

/// Decodes `payload`, taking each value and the body with `share`.
fn decode_with(payload: &[u8], share: impl Fn(&[u8]) -> Bytes) -> Result<Stored, DecodeError> {
    let mut reader = Reader(payload);
    let version = reader.take(1)?[0];
    if ![VERSION, VERSION_TRACED, VERSION_STREAMED].contains(&version) {
        return Err(DecodeError("unknown format version"));
    }
    let stored = match reader.take(1)?[0] {
        KIND_RESPONSE if version == VERSION_STREAMED => {
            let traceparent = match reader.take(1)?[0] {
                0 => None,
                1 => Some(read_traceparent(&mut reader)?),
                _ => return Err(DecodeError("unknown trace flag")),
            };
            let (status, headers) = read_head(&mut reader, &share)?;
            let manifest = idem_core::chunks::Manifest::decode(
                reader.take(idem_core::chunks::Manifest::ENCODED_LEN)?,
            )
            .ok_or(DecodeError("a damaged manifest"))?;
            Stored::Streamed {
                status,
                headers,
                traceparent,
                manifest,
            }
        }
        KIND_RESPONSE => {
            let traceparent = match version {
                VERSION_TRACED => Some(read_traceparent(&mut reader)?),
                _ => None,
            };
            let (status, headers) = read_head(&mut reader, &share)?;
            let len = usize::try_from(reader.u64()?)
                .map_err(|_| DecodeError("body length out of range"))?;
            let body = share(reader.take(len)?);
            Stored::Response {
                status,
                headers,
                body,
                traceparent,
            }
        }
        KIND_NOT_REPLAYABLE if version == VERSION => match reader.take(1)?[0] {
            1 => Stored::Unreplayable(Unreplayable::TooLarge),
            2 => Stored::Unreplayable(Unreplayable::BodyFailed),
            3 => Stored::Unreplayable(Unreplayable::RecordingFailed),
            _ => return Err(DecodeError("unknown marker reason")),
        },
        _ => return Err(DecodeError("unknown payload kind")),
    };
    if !reader.0.is_empty() {
        return Err(DecodeError("trailing bytes"));
    }
    Ok(stored)
}

fn read_traceparent(reader: &mut Reader<'_>) -> Result<TraceParent, DecodeError> {
    TraceParent::new(reader.array()?, reader.array()?, reader.take(1)?[0])
        .ok_or(DecodeError("an all-zero trace or span id"))
}

/// Reads what [`push_head`] wrote.
fn read_head(
    reader: &mut Reader<'_>,
    share: &impl Fn(&[u8]) -> Bytes,
) -> Result<(StatusCode, HeaderMap), DecodeError> {
    let status =
        StatusCode::from_u16(reader.u16()?).map_err(|_| DecodeError("status out of range"))?;
    let count = reader.u16()?;
    // Each header takes at least six bytes, so a damaged count cannot make
    // this allocate more than the payload justifies; two more for the
    // replay's own marker and the `Content-Length` a server adds to a
    // response without one, so that neither grows the map (which moved
    // every entry once a replay).
    let mut headers = HeaderMap::new();
    headers
        .try_reserve(usize::from(count).min(reader.0.len() / 6) + 2)
        .map_err(|_| DecodeError("too many headers"))?;
    let mut last: Option<HeaderName> = None;
    for _ in 0..count {
        let len = usize::from(reader.u16()?);
        let raw = reader.take(len)?;
        let name = HeaderName::from_bytes(raw).map_err(|_| DecodeError("invalid header name"))?;
        // Only what `encode` writes: lowercase names, headers it keeps,
        // each name's values together.
        if name.as_str().as_bytes() != raw {
            return Err(DecodeError("header name not in lowercase"));
        }
        // A stored map never holds `Connection` (hop-by-hop, so never
        // recorded), so no header in it is named there: the name's own rule
        // is the whole test.
        if !is_recorded_name(&name) {
            return Err(DecodeError("a header that is never stored"));
        }
        if last.as_ref().is_some_and(|last| *last != name) && headers.contains_key(&name) {
            return Err(DecodeError("a header name's values apart"));
        }
        last = Some(name.clone());
        let len = reader.u32()? as usize;
        let value = HeaderValue::from_maybe_shared(share(reader.take(len)?))
            .map_err(|_| DecodeError("invalid header value"))?;
        headers
            .try_append(name, value)
            .map_err(|_| DecodeError("too many headers"))?;
    }
    Ok((status, headers))
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < len {
            return Err(DecodeError("truncated"));
        }
        let (head, rest) = self.0.split_at(len);
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        self.array().map(u16::from_be_bytes)
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        self.array().map(u32::from_be_bytes)
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        self.array().map(u64::from_be_bytes)
    }
}

/// The response a replay sends: the recorded status, headers and body, and
/// `Idempotent-Replayed: true`.
pub fn replay<B>(status: StatusCode, headers: HeaderMap, body: B) -> Response<B> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
        .headers_mut()
        .insert(REPLAYED, HeaderValue::from_static("true"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (StatusCode, HeaderMap, Bytes) {
        let mut headers = HeaderMap::new();
        headers.append("content-type", HeaderValue::from_static("application/json"));
        headers.append("x-a", HeaderValue::from_static("1"));
        headers.append("x-a", HeaderValue::from_static("2"));
        headers.append("set-cookie", HeaderValue::from_static("s=1"));
        headers.append("connection", HeaderValue::from_static("x-private"));
        headers.append("x-private", HeaderValue::from_static("p"));
        headers.append("transfer-encoding", HeaderValue::from_static("chunked"));
        headers.append("x-bin", HeaderValue::from_bytes(b"\xff\x80").unwrap());
        (
            StatusCode::CREATED,
            headers,
            Bytes::from_static(b"\0{\"id\":1}\xff"),
        )
    }

    #[test]
    fn responses_round_trip_without_unrecorded_headers() {
        let (status, headers, body) = sample();
        let encoded = encode(status, &headers, &body);
        let decoded = decode(&encoded).unwrap();
        assert_eq!(decode_shared(Bytes::from(encoded)).unwrap(), decoded);
        let mut expected = HeaderMap::new();
        expected.append("content-type", HeaderValue::from_static("application/json"));
        expected.append("x-a", HeaderValue::from_static("1"));
        expected.append("x-a", HeaderValue::from_static("2"));
        expected.append("x-bin", HeaderValue::from_bytes(b"\xff\x80").unwrap());
        assert_eq!(
            decoded,
            Stored::Response {
                status,
                headers: expected,
                body,
                traceparent: None,
            }
        );
    }

    #[test]
    fn empty_responses_and_markers_round_trip() {
        let empty = encode(StatusCode::NO_CONTENT, &HeaderMap::new(), b"");
        assert_eq!(
            decode(&empty).unwrap(),
            Stored::Response {
                status: StatusCode::NO_CONTENT,
                headers: HeaderMap::new(),
                body: Bytes::new(),
                traceparent: None,
            }
        );
        for why in [Unreplayable::TooLarge, Unreplayable::BodyFailed] {
            assert_eq!(
                decode(&encode_unreplayable(why)).unwrap(),
                Stored::Unreplayable(why)
            );
        }
    }

    fn parent() -> TraceParent {
        TraceParent::parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap()
    }

    // Pins the version 1 format: these bytes are what the encoder wrote
    // before version 2 existed, and records holding them must replay.
    const V1_RESPONSE: &[u8] = b"\x01\x00\x00\xc9\x00\x02\
        \x00\x0ccontent-type\x00\x00\x00\x10application/json\
        \x00\x03x-a\x00\x00\x00\x011\
        \x00\x00\x00\x00\x00\x00\x00\x08{\"id\":1}";

    #[test]
    fn version_1_payloads_decode_and_are_still_written_without_a_trace_parent() {
        let decoded = decode(V1_RESPONSE).unwrap();
        let mut headers = HeaderMap::new();
        headers.append("content-type", HeaderValue::from_static("application/json"));
        headers.append("x-a", HeaderValue::from_static("1"));
        assert_eq!(
            decoded,
            Stored::Response {
                status: StatusCode::CREATED,
                headers: headers.clone(),
                body: Bytes::from_static(b"{\"id\":1}"),
                traceparent: None,
            }
        );
        assert_eq!(decode_shared(Bytes::from_static(V1_RESPONSE)), Ok(decoded));
        let body = b"{\"id\":1}";
        assert_eq!(encode(StatusCode::CREATED, &headers, body), V1_RESPONSE);
        assert_eq!(
            encode_traced(StatusCode::CREATED, &headers, body, None),
            V1_RESPONSE
        );
        assert_eq!(encode_unreplayable(Unreplayable::TooLarge), [1, 1, 1]);
    }

    #[test]
    fn a_trace_parent_is_kept_in_version_2() {
        let (status, headers, body) = sample();
        let encoded = encode_traced(status, &headers, &body, Some(parent()));
        assert_eq!(encoded[..2], [2, 0]);
        assert_eq!(encoded[2..18], parent().trace_id());
        assert_eq!(encoded[18..26], parent().span_id());
        assert_eq!(encoded[26], 1);
        // After the trace parent, version 1's layout.
        assert_eq!(encoded[27..], encode(status, &headers, &body)[2..]);
        let Stored::Response { traceparent, .. } = decode_shared(Bytes::from(encoded)).unwrap()
        else {
            panic!("a response decodes as a response");
        };
        assert_eq!(traceparent, Some(parent()));
    }

    #[test]
    fn version_2_refuses_markers_and_all_zero_ids() {
        assert_eq!(decode(&[2, 1, 1]), Err(DecodeError("unknown payload kind")));
        let good = encode_traced(StatusCode::OK, &HeaderMap::new(), b"", Some(parent()));
        let mut zero_trace = good.clone();
        zero_trace[2..18].fill(0);
        assert!(decode(&zero_trace).is_err());
        let mut zero_span = good.clone();
        zero_span[18..26].fill(0);
        assert!(decode(&zero_span).is_err());
        assert!(decode(&[3, 0]).is_err());
    }

    #[test]
    fn every_truncation_and_corruption_is_an_error_not_a_panic() {
        let (status, headers, body) = sample();
        for good in [
            encode(status, &headers, &body),
            encode_traced(status, &headers, &body, Some(parent())),
        ] {
            damaged_payloads_never_panic(&good);
        }
        assert!(decode(&[2, 0]).is_err());
        assert!(decode(&[1, 7]).is_err());
        assert!(decode(&[1, 1, 9]).is_err());
        assert!(decode(&[1, 0, 0, 99, 0, 0]).is_err());
        let huge_body = [
            1, 0, 0, 200, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        ];
        assert!(decode(&huge_body).is_err());
    }

    fn damaged_payloads_never_panic(good: &[u8]) {
        let good = good.to_vec();
        for len in 0..good.len() {
            assert!(decode(&good[..len]).is_err(), "prefix of {len} bytes");
            let shared = Bytes::copy_from_slice(&good[..len]);
            assert!(decode_shared(shared).is_err(), "prefix of {len} bytes");
        }
        let mut longer = good.clone();
        longer.push(0);
        assert_eq!(decode(&longer), Err(DecodeError("trailing bytes")));
        // Flipping any byte must never panic, whatever it decodes to.
        for at in 0..good.len() {
            for bit in 0..8 {
                let mut bad = good.clone();
                bad[at] ^= 1 << bit;
                assert_eq!(decode_shared(Bytes::from(bad.clone())), decode(&bad));
            }
        }
    }
}
