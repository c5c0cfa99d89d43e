//! The W3C Trace Context `traceparent` header (level 1): which span a
//! request was sent from, kept with its recorded response so a replay can
//! point back to it.

use std::fmt;

use http::header::HeaderName;
use http::HeaderMap;

/// The request header of W3C Trace Context.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// A valid `traceparent` of version `00`: a trace id and a span id, neither
/// all zeros, and the trace flags. Shown as the header's own form,
/// `00-<32 hex>-<16 hex>-<2 hex>`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    flags: u8,
}

impl TraceParent {
    /// A trace parent from its parts; `None` when the trace id or the span
    /// id is all zeros, which W3C Trace Context makes invalid.
    pub fn new(trace_id: [u8; 16], span_id: [u8; 8], flags: u8) -> Option<TraceParent> {
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceParent {
            trace_id,
            span_id,
            flags,
        })
    }

    /// Parses one header value: `00-`, 32 lowercase hex digits of trace id,
    /// `-`, 16 of span id, `-`, 2 of flags, and nothing else (spaces around
    /// it aside). Anything else is `None`: a version other than `00`
    /// (whose fields this crate cannot know), upper case, all-zero ids.
    pub fn parse(value: &[u8]) -> Option<TraceParent> {
        let value = value.trim_ascii();
        let [b'0', b'0', b'-', rest @ ..] = value else {
            return None;
        };
        if rest.len() != 52 || rest[32] != b'-' || rest[49] != b'-' {
            return None;
        }
        let mut trace_id = [0; 16];
        hex(&rest[..32], &mut trace_id)?;
        let mut span_id = [0; 8];
        hex(&rest[33..49], &mut span_id)?;
        let mut flags = [0; 1];
        hex(&rest[50..], &mut flags)?;
        TraceParent::new(trace_id, span_id, flags[0])
    }

    /// The request's trace parent: its one `traceparent` header when that
    /// parses. None, several (which would leave the parent ambiguous) or
    /// one that does not parse is `None`, never an error: a trace context
    /// is a hint, and a request is never refused over it.
    pub fn from_headers(headers: &HeaderMap) -> Option<TraceParent> {
        let mut values = headers.get_all(TRACEPARENT).iter();
        let value = values.next()?;
        if values.next().is_some() {
            return None;
        }
        TraceParent::parse(value.as_bytes())
    }

    /// The trace id, 16 bytes, not all zeros.
    pub fn trace_id(&self) -> [u8; 16] {
        self.trace_id
    }

    /// The id of the span the request was sent from, 8 bytes, not all
    /// zeros.
    pub fn span_id(&self) -> [u8; 8] {
        self.span_id
    }

    /// The trace flags as received; bit 0 is `sampled`.
    pub fn flags(&self) -> u8 {
        self.flags
    }

    /// Whether the `sampled` flag is set.
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

/// Reads lowercase hex digits into `out`, two a byte.
fn hex(digits: &[u8], out: &mut [u8]) -> Option<()> {
    let nibble = |digit: u8| match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    };
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        *byte = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(())
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("00-")?;
        self.trace_id
            .iter()
            .try_for_each(|b| write!(f, "{b:02x}"))?;
        f.write_str("-")?;
        self.span_id.iter().try_for_each(|b| write!(f, "{b:02x}"))?;
        write!(f, "-{:02x}", self.flags)
    }
}

impl fmt::Debug for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceParent({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_round_trips_through_its_parts() {
        let parsed = TraceParent::parse(GOOD.as_bytes()).unwrap();
        assert_eq!(parsed.to_string(), GOOD);
        assert_eq!(parsed.trace_id()[0], 0x4b);
        assert_eq!(parsed.span_id()[7], 0xb7);
        assert!(parsed.sampled());
        assert_eq!(
            TraceParent::parse(b"  00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00 ")
                .map(|p| p.sampled()),
            Some(false)
        );
    }

    #[test]
    fn anything_but_a_valid_version_00_traceparent_is_ignored() {
        let bad = [
            "",
            "00",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bg-01",
            "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ];
        for value in bad {
            assert_eq!(TraceParent::parse(value.as_bytes()), None, "{value:?}");
        }
    }

    #[test]
    fn only_one_traceparent_header_is_read() {
        let mut headers = HeaderMap::new();
        assert_eq!(TraceParent::from_headers(&headers), None);
        headers.append(TRACEPARENT, HeaderValue::from_static(GOOD));
        assert_eq!(
            TraceParent::from_headers(&headers).map(|p| p.to_string()),
            Some(GOOD.to_owned())
        );
        headers.append(TRACEPARENT, HeaderValue::from_static(GOOD));
        assert_eq!(TraceParent::from_headers(&headers), None);
    }
}
