//! Recorded calls: the stored format replays are built from.
//!
//! # Stored format (version 1)
//!
//! All integers are big-endian. The payload opens with a version byte (`1`)
//! and a kind byte.
//!
//! * Kind `0`, a call's response: the HTTP status (`u16`); the headers
//!   (the call's initial metadata) as a count (`u16`) and, per entry, its
//!   name length (`u16`), lowercase name, value length (`u32`) and value;
//!   the body length (`u64`) and the body (the framed response message);
//!   then the trailers in the headers' layout (`grpc-status`,
//!   `grpc-message` and the trailing metadata). Nothing may follow.
//! * Kind `1`, ran but not replayable: one reason byte, `1` when the
//!   response was over the limit, `2` when its body failed while read.
//!
//! Entries keep their order, so a replay sends the same bytes. Hop-by-hop
//! headers are never stored (those [`idem_http::stored::is_recorded`]
//! leaves out). Anything that does not parse exactly is a [`DecodeError`],
//! never a panic.
//!
//! The format is gRPC's own rather than `idem-http`'s, whose records hold
//! no trailers; the two never meet, as the gRPC layer keeps its records in
//! a namespace of its own.

use std::fmt;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;

const VERSION: u8 = 1;
const KIND_RESPONSE: u8 = 0;
const KIND_NOT_REPLAYABLE: u8 = 1;

/// Why a call that ran has no response to replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unreplayable {
    /// The response was over the limit.
    TooLarge,
    /// The response body failed while it was read.
    BodyFailed,
}

impl Unreplayable {
    /// Why, in words for the client.
    pub fn reason(self) -> &'static str {
        match self {
            Unreplayable::TooLarge => "the response was too large to store",
            Unreplayable::BodyFailed => "the response failed while it was read",
        }
    }
}

/// A recorded response, whole.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// The HTTP status (200 for every gRPC answer).
    pub status: StatusCode,
    /// The headers: the call's initial metadata, and for a trailers-only
    /// answer its `grpc-status`.
    pub headers: HeaderMap,
    /// The framed response message, empty for a trailers-only answer.
    pub body: Bytes,
    /// The trailers: `grpc-status`, `grpc-message`, trailing metadata.
    pub trailers: HeaderMap,
}

/// A decoded payload.
#[derive(Debug, PartialEq)]
#[non_exhaustive]
pub enum Stored {
    /// A response to replay (boxed: it is most of what a replay holds).
    Call(Box<Call>),
    /// A marker for a call that ran without a replayable response.
    Unreplayable(Unreplayable),
}

/// A payload that is not in the stored format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(&'static str);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stored gRPC response does not decode: {}", self.0)
    }
}

impl std::error::Error for DecodeError {}

/// Encodes a response for the store, leaving out hop-by-hop headers.
pub fn encode(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
    trailers: &HeaderMap,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + body.len());
    out.extend_from_slice(&[VERSION, KIND_RESPONSE]);
    out.extend_from_slice(&status.as_u16().to_be_bytes());
    put_map(&mut out, headers);
    out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    out.extend_from_slice(body);
    put_map(&mut out, trailers);
    out
}

fn put_map(out: &mut Vec<u8>, map: &HeaderMap) {
    let kept: Vec<(&HeaderName, &HeaderValue)> = map
        .iter()
        .filter(|(name, _)| idem_http::stored::is_recorded(name, map))
        .collect();
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

/// Encodes the marker for a call that ran without a replayable response.
pub fn encode_unreplayable(why: Unreplayable) -> Vec<u8> {
    let reason = match why {
        Unreplayable::TooLarge => 1,
        Unreplayable::BodyFailed => 2,
    };
    vec![VERSION, KIND_NOT_REPLAYABLE, reason]
}

/// Decodes a payload written by [`encode`] or [`encode_unreplayable`]
/// without copying: the body and the values are slices of `payload`.
pub fn decode(payload: impl Into<Bytes>) -> Result<Stored, DecodeError> {
    let payload = payload.into();
    let share = |part: &[u8]| payload.slice_ref(part);
    let mut reader = Reader(&payload);
    if reader.take(1)? != [VERSION] {
        return Err(DecodeError("unknown format version"));
    }
    let stored = match reader.take(1)?[0] {
        KIND_RESPONSE => {
            let status = StatusCode::from_u16(reader.u16()?)
                .map_err(|_| DecodeError("status out of range"))?;
            let headers = reader.map(&share)?;
            let len = usize::try_from(reader.u64()?)
                .map_err(|_| DecodeError("body length out of range"))?;
            let body = share(reader.take(len)?);
            let trailers = reader.map(&share)?;
            Stored::Call(Box::new(Call {
                status,
                headers,
                body,
                trailers,
            }))
        }
        KIND_NOT_REPLAYABLE => match reader.take(1)?[0] {
            1 => Stored::Unreplayable(Unreplayable::TooLarge),
            2 => Stored::Unreplayable(Unreplayable::BodyFailed),
            _ => return Err(DecodeError("unknown marker reason")),
        },
        _ => return Err(DecodeError("unknown payload kind")),
    };
    if !reader.0.is_empty() {
        return Err(DecodeError("trailing bytes"));
    }
    Ok(stored)
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

    fn map(&mut self, share: &impl Fn(&[u8]) -> Bytes) -> Result<HeaderMap, DecodeError> {
        let count = self.u16()?;
        // Each entry takes at least six bytes, so a damaged count cannot
        // make this allocate more than the payload justifies.
        let mut map = HeaderMap::new();
        map.try_reserve(usize::from(count).min(self.0.len() / 6))
            .map_err(|_| DecodeError("too many entries"))?;
        let mut last: Option<HeaderName> = None;
        for _ in 0..count {
            let len = usize::from(self.u16()?);
            let raw = self.take(len)?;
            let name = HeaderName::from_bytes(raw).map_err(|_| DecodeError("invalid name"))?;
            // Only what `encode` writes: lowercase names, entries it keeps,
            // each name's values together.
            if name.as_str().as_bytes() != raw {
                return Err(DecodeError("name not in lowercase"));
            }
            if !idem_http::stored::is_recorded(&name, &map) {
                return Err(DecodeError("an entry that is never stored"));
            }
            if last.as_ref() != Some(&name) && map.contains_key(&name) {
                return Err(DecodeError("a name's values apart"));
            }
            last = Some(name.clone());
            let len = self.u32()? as usize;
            let value = HeaderValue::from_maybe_shared(share(self.take(len)?))
                .map_err(|_| DecodeError("invalid value"))?;
            map.try_append(name, value)
                .map_err(|_| DecodeError("too many entries"))?;
        }
        Ok(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Call {
        let mut headers = HeaderMap::new();
        headers.append("content-type", HeaderValue::from_static("application/grpc"));
        headers.append("x-a", HeaderValue::from_static("1"));
        headers.append("x-a", HeaderValue::from_static("2"));
        headers.append("x-bin-bin", HeaderValue::from_static("AAE"));
        let mut trailers = HeaderMap::new();
        trailers.append("grpc-status", HeaderValue::from_static("0"));
        trailers.append("grpc-message", HeaderValue::from_static("ok%20then"));
        trailers.append("x-t", HeaderValue::from_static("t"));
        Call {
            status: StatusCode::OK,
            headers,
            body: Bytes::from_static(b"\0\0\0\0\x03\x0a\x01a"),
            trailers,
        }
    }

    fn encoded(call: &Call) -> Vec<u8> {
        encode(call.status, &call.headers, &call.body, &call.trailers)
    }

    #[test]
    fn calls_and_markers_round_trip() {
        let call = sample();
        assert_eq!(
            decode(encoded(&call)).unwrap(),
            Stored::Call(Box::new(call))
        );
        let empty = Call {
            status: StatusCode::OK,
            headers: HeaderMap::new(),
            body: Bytes::new(),
            trailers: HeaderMap::new(),
        };
        assert_eq!(
            decode(encoded(&empty)).unwrap(),
            Stored::Call(Box::new(empty))
        );
        for why in [Unreplayable::TooLarge, Unreplayable::BodyFailed] {
            assert_eq!(
                decode(encode_unreplayable(why)).unwrap(),
                Stored::Unreplayable(why)
            );
        }
    }

    #[test]
    fn hop_by_hop_headers_are_not_stored() {
        let mut call = sample();
        call.headers
            .append("connection", HeaderValue::from_static("keep-alive"));
        call.headers
            .append("te", HeaderValue::from_static("trailers"));
        let Stored::Call(decoded) = decode(encoded(&call)).unwrap() else {
            panic!("a call");
        };
        assert_eq!(*decoded, sample());
    }

    #[test]
    fn every_truncation_and_corruption_is_an_error_not_a_panic() {
        let good = encoded(&sample());
        for len in 0..good.len() {
            assert!(
                decode(good[..len].to_vec()).is_err(),
                "prefix of {len} bytes"
            );
        }
        let mut longer = good.clone();
        longer.push(0);
        assert_eq!(decode(longer), Err(DecodeError("trailing bytes")));
        for at in 0..good.len() {
            for bit in 0..8 {
                let mut bad = good.clone();
                bad[at] ^= 1 << bit;
                let _ = decode(bad);
            }
        }
        assert!(decode(vec![2, 0]).is_err());
        assert!(decode(vec![1, 7]).is_err());
        assert!(decode(vec![1, 1, 9]).is_err());
    }
}
