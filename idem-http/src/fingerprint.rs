//! The request fingerprint: what a protected request means.

use std::borrow::Cow;

use bytes::Bytes;
use http::header::{GetAll, HeaderMap, HeaderValue, CONTENT_TYPE};
use http::{Method, Uri};
use idem_core::fingerprint::{MatchingFingerprints, PartsHasher};
use idem_core::Fingerprint;

use crate::transcode::JsonText;

mod memo;

/// The fingerprint scheme of [`canonical_fingerprint`]. Scheme 1
/// ([`Fingerprint::FIRST_SCHEME`]) is [`raw_fingerprint`], the form records
/// were written in before JSON bodies were canonicalised.
pub const SCHEME: u8 = 2;

/// The fingerprint of a request as idem-tower wrote it before bodies were
/// canonicalised: [`Fingerprint::of_parts`] over the method, the path and
/// query, the `Content-Type` value (several lines joined with `, `) and the
/// body bytes as they are.
///
/// Records written with it keep replaying: [`fingerprint`] carries this
/// form beside the canonical one. Scheme 1.
pub fn raw_fingerprint(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Fingerprint {
    Parts::new(method, uri, headers).raw(body)
}

/// What the request means, as the exchange checks it: the
/// [`canonical_fingerprint`] (scheme [`SCHEME`]) that new records get,
/// also matching a record written before under the [`raw_fingerprint`]
/// (scheme 1), so that keys recorded by an earlier build keep replaying.
///
/// Both forms are computed at once; [`lazy_fingerprint`] is the same
/// fingerprint with the raw form computed only when a record of scheme 1
/// is found.
pub fn fingerprint(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> MatchingFingerprints {
    let request = Parts::new(method, uri, headers);
    let raw = request.raw(body);
    request
        .canonical(body)
        .unwrap_or(raw)
        .with_scheme(SCHEME)
        .also_matching(raw)
}

/// [`fingerprint`], with the [`raw_fingerprint`] (scheme 1) computed only
/// when the claim finds a record of scheme 1, which only keys recorded by
/// builds before canonical fingerprints hold. A first execution and the
/// replay of a record written by this build hash the request once. The
/// body is kept (a shared [`Bytes`], not a copy) until then.
///
/// A request whose exact bytes (method, path and query, `Content-Type`,
/// body; up to 1 KiB) were fingerprinted lately in this process gets the
/// fingerprint computed then, without transcoding or hashing again: a
/// byte-identical retry, the common case, costs a keyed hash and a
/// comparison of its bytes.
///
/// A body that is not JSON hashes to the same digest in both forms, so it
/// is hashed once either way.
pub fn lazy_fingerprint(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &Bytes,
) -> MatchingFingerprints {
    lazy_fingerprint_of(method, uri, headers.get_all(CONTENT_TYPE), body)
}

/// [`lazy_fingerprint`] with the `Content-Type` lines already found.
pub(crate) fn lazy_fingerprint_of(
    method: &Method,
    uri: &Uri,
    lines: GetAll<'_, HeaderValue>,
    body: &Bytes,
) -> MatchingFingerprints {
    let content_type = content_type_of(&lines);
    let json = is_json_of(&lines);
    let target = path_and_query(uri);
    let request = memo::Request::new(method.as_str(), target, &content_type, json, body);
    let known = memo::recall(&request).unwrap_or_else(|| {
        let parts = Parts::with(method, target, &content_type, json);
        let known = match parts.canonical(body) {
            Some(canonical) => memo::Known {
                canonical: Some(canonical),
                raw: None,
                prefix: parts.prefix,
            },
            None => memo::Known {
                raw: Some(parts.raw(body)),
                canonical: None,
                prefix: parts.prefix,
            },
        };
        memo::remember(&request, known.clone());
        known
    });
    match known {
        memo::Known {
            canonical: Some(canonical),
            prefix,
            ..
        } => {
            let body = body.clone();
            MatchingFingerprints::new(canonical.with_scheme(SCHEME))
                .or_lazily(Fingerprint::FIRST_SCHEME, move || raw_of(prefix, &body))
        }
        memo::Known { raw, prefix, .. } => {
            let raw = raw.unwrap_or_else(|| raw_of(prefix, body));
            raw.with_scheme(SCHEME).also_matching(raw)
        }
    }
}

/// What the request means: [`Fingerprint::of_parts`] over the method, the
/// path and query, the `Content-Type` value (several lines joined with
/// `, `) and the body.
///
/// For a JSON media type (`application/json`, or any `+json` suffix such
/// as `application/merge-patch+json`) the body part is the digest of
/// [`Fingerprint::of_json`]'s canonical form (object keys sorted, no
/// whitespace), so a retry that re-serialises the same document with its
/// fields in another order or with other whitespace is the same request.
/// Numbers compare as JSON values, as they do in `of_json`: `1.0` and `1`
/// differ, integers beyond 64 bits compare as doubles. A body that is not
/// valid JSON, and every other media type, is fingerprinted byte for byte,
/// exactly as [`raw_fingerprint`] does. Scheme [`SCHEME`].
pub fn canonical_fingerprint(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Fingerprint {
    let request = Parts::new(method, uri, headers);
    request
        .canonical(body)
        .unwrap_or_else(|| request.raw(body))
        .with_scheme(SCHEME)
}

/// The parts both forms hash before the body (method, path and query,
/// `Content-Type`), read once and hashed once.
struct Parts {
    prefix: PartsHasher,
    json: bool,
}

impl Parts {
    fn new(method: &Method, uri: &Uri, headers: &HeaderMap) -> Parts {
        Parts::with(
            method,
            path_and_query(uri),
            &content_type(headers),
            is_json(headers),
        )
    }

    fn with(method: &Method, target: &str, content_type: &[u8], json: bool) -> Parts {
        let mut prefix = PartsHasher::new();
        prefix.update(method.as_str().as_bytes());
        prefix.update(target.as_bytes());
        prefix.update(content_type);
        Parts { prefix, json }
    }

    /// Scheme 1: the body as it is.
    fn raw(&self, body: &[u8]) -> Fingerprint {
        raw_of(self.prefix.clone(), body)
    }

    /// A JSON body by its canonical digest, parsed as it is hashed (see
    /// `transcode`); `None` for a body that is not JSON, which the
    /// canonical form hashes as `raw` does.
    fn canonical(&self, body: &[u8]) -> Option<Fingerprint> {
        if !self.json {
            return None;
        }
        let digest = Fingerprint::of_json(&JsonText(body)).ok()?;
        let mut hasher = self.prefix.clone();
        hasher.update(digest.as_bytes());
        Some(hasher.finish())
    }
}

fn raw_of(mut prefix: PartsHasher, body: &[u8]) -> Fingerprint {
    prefix.update(body);
    prefix.finish()
}

pub(crate) fn path_and_query(uri: &Uri) -> &str {
    uri.path_and_query()
        .map_or_else(|| uri.path(), |pq| pq.as_str())
}

/// Every `Content-Type` line counts, joined as HTTP would combine them, so
/// an added second line cannot hide behind the first.
pub(crate) fn content_type(headers: &HeaderMap) -> Cow<'_, [u8]> {
    content_type_of(&headers.get_all(CONTENT_TYPE))
}

fn content_type_of<'a>(lines: &GetAll<'a, HeaderValue>) -> Cow<'a, [u8]> {
    let mut lines = lines.iter();
    let Some(first) = lines.next() else {
        return Cow::Borrowed(&[]);
    };
    let mut joined = Cow::Borrowed(first.as_bytes());
    for value in lines {
        let joined = joined.to_mut();
        joined.extend_from_slice(b", ");
        joined.extend_from_slice(value.as_bytes());
    }
    joined
}

/// Whether the one `Content-Type` line names a JSON media type.
pub(crate) fn is_json(headers: &HeaderMap) -> bool {
    is_json_of(&headers.get_all(CONTENT_TYPE))
}

/// [`is_json`] over the `Content-Type` lines already found. It reads the
/// bytes as `HeaderValue::to_str` and `str::trim` would (a value with a
/// byte outside visible ASCII and tab is not JSON), without a copy: which
/// bodies are JSON decides every record's fingerprint, so it must not move.
fn is_json_of(lines: &GetAll<'_, HeaderValue>) -> bool {
    let mut lines = lines.iter();
    let (Some(value), None) = (lines.next(), lines.next()) else {
        return false;
    };
    let bytes = value.as_bytes();
    if !bytes.iter().all(|&b| b == b'\t' || (32..127).contains(&b)) {
        return false;
    }
    let essence = bytes
        .split(|&b| b == b';')
        .next()
        .unwrap_or(&[])
        .trim_ascii();
    let Some(slash) = essence.iter().position(|&b| b == b'/') else {
        return false;
    };
    let (kind, subtype) = (&essence[..slash], &essence[slash + 1..]);
    let suffix = subtype.len().checked_sub(5).map(|at| &subtype[at..]);
    !kind.is_empty()
        && (subtype.eq_ignore_ascii_case(b"json")
            || suffix.is_some_and(|suffix| suffix.eq_ignore_ascii_case(b"+json")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(method: &str, uri: &str, ct: &str) -> http::request::Parts {
        let mut builder = http::Request::builder().method(method).uri(uri);
        if !ct.is_empty() {
            builder = builder.header(CONTENT_TYPE, ct);
        }
        builder.body(()).unwrap().into_parts().0
    }

    fn of(method: &str, uri: &str, ct: &str, body: &[u8]) -> Fingerprint {
        let p = parts(method, uri, ct);
        canonical_fingerprint(&p.method, &p.uri, &p.headers, body)
    }

    fn raw(method: &str, uri: &str, ct: &str, body: &[u8]) -> Fingerprint {
        let p = parts(method, uri, ct);
        raw_fingerprint(&p.method, &p.uri, &p.headers, body)
    }

    #[test]
    fn fingerprint_tells_method_path_type_and_body_apart() {
        for f in [of, raw] {
            let base = f("POST", "/a?x=1", "application/json", b"{}");
            for other in [
                f("PATCH", "/a?x=1", "application/json", b"{}"),
                f("POST", "/a?x=2", "application/json", b"{}"),
                f("POST", "/a?x=1", "text/plain", b"{}"),
                f("POST", "/a?x=1", "", b"{}"),
                f("POST", "/a?x=1", "application/json", b"[]"),
            ] {
                assert_ne!(base, other);
            }
            assert_eq!(base, f("POST", "/a?x=1", "application/json", b"{}"));
        }
    }

    #[test]
    fn the_raw_form_is_the_one_records_were_written_with() {
        // Regression: records written before bodies were canonicalised were
        // fingerprinted with exactly these parts; changing them turns every
        // stored key into a 422.
        let expected = Fingerprint::of_parts([
            &b"POST"[..],
            b"/payments",
            b"application/json",
            br#"{"amount":1250,"currency":"EUR"}"#,
        ]);
        let body = br#"{"amount":1250,"currency":"EUR"}"#;
        assert_eq!(raw("POST", "/payments", "application/json", body), expected);
        assert_eq!(expected.scheme(), Fingerprint::FIRST_SCHEME);
    }

    #[test]
    fn json_bodies_match_in_any_field_order_and_whitespace() {
        let a = br#"{"amount":1250,"currency":"EUR","meta":{"x":1,"y":[1,2]}}"#;
        let b =
            b"{ \"meta\": {\"y\": [1, 2], \"x\": 1},\n  \"currency\": \"EUR\", \"amount\": 1250 }";
        for ct in [
            "application/json",
            "application/json; charset=utf-8",
            "application/merge-patch+json",
            "Application/JSON",
        ] {
            assert_eq!(of("POST", "/p", ct, a), of("POST", "/p", ct, b), "{ct}");
            assert_ne!(raw("POST", "/p", ct, a), raw("POST", "/p", ct, b));
        }
        assert_ne!(
            of("POST", "/p", "application/json", a),
            of(
                "POST",
                "/p",
                "application/json",
                br#"{"amount":1251,"currency":"EUR"}"#
            )
        );
        assert_ne!(
            of("POST", "/p", "application/json", b"[1,2]"),
            of("POST", "/p", "application/json", b"[2,1]")
        );
    }

    #[test]
    fn json_media_types_are_told_by_subtype_in_any_case() {
        let json = |ct: &str| is_json(&parts("POST", "/p", ct).headers);
        for ct in [
            "application/json",
            "APPLICATION/JSON; charset=utf-8",
            "application/problem+JSON",
            "text/json",
            "application/+json",
        ] {
            assert!(json(ct), "{ct}");
        }
        for ct in [
            "",
            "json",
            "/json",
            "application/jsonx",
            "application/json-seq",
            "application/x+jsonp",
            "application/xjson",
            "application/é+jso",
            "text/plain",
        ] {
            assert!(!json(ct), "{ct}");
        }
    }

    /// The reading records were fingerprinted with: the value as a string,
    /// its essence trimmed, the subtype lowercased.
    fn was_json(value: &HeaderValue) -> bool {
        let Ok(value) = value.to_str() else {
            return false;
        };
        let essence = value.split(';').next().unwrap_or("").trim();
        let Some((kind, subtype)) = essence.split_once('/') else {
            return false;
        };
        let subtype = subtype.to_ascii_lowercase();
        !kind.is_empty() && (subtype == "json" || subtype.ends_with("+json"))
    }

    #[test]
    fn json_is_told_as_records_were_fingerprinted() {
        let pieces: [&[u8]; 14] = [
            b"application",
            b"/",
            b"json",
            b"JSON",
            b"+json",
            b"+",
            b";",
            b" ",
            b"\t",
            b"charset=utf-8",
            b"x",
            b"\xc3\xa9",
            b"\x7f",
            b"",
        ];
        let mut checked = 0;
        for a in pieces {
            for b in pieces {
                for c in pieces {
                    let bytes = [a, b, c].concat();
                    let Ok(value) = HeaderValue::from_bytes(&bytes) else {
                        continue;
                    };
                    let mut headers = HeaderMap::new();
                    headers.insert(CONTENT_TYPE, value.clone());
                    assert_eq!(is_json(&headers), was_json(&value), "{bytes:?}");
                    checked += 1;
                }
            }
        }
        assert!(checked > 2000, "{checked}");
    }

    /// A request fingerprinted again with the same bytes comes from the
    /// table of recent requests: it must be exactly what computing it
    /// afresh gives, and a request that differs in any part, or only in
    /// how its `Content-Type` lines are split, must not be taken for it.
    #[test]
    fn a_remembered_fingerprint_is_the_one_computed_afresh() {
        let body = br#"{"amount":1250,"currency":"EUR"}"#;
        let variants: Vec<(&str, &str, Vec<&str>, &[u8])> = vec![
            ("POST", "/payments", vec!["application/json"], body),
            ("PATCH", "/payments", vec!["application/json"], body),
            ("POST", "/payments?x=1", vec!["application/json"], body),
            (
                "POST",
                "/payments",
                vec!["application/json; charset=utf-8"],
                body,
            ),
            ("POST", "/payments", vec!["text/plain"], body),
            ("POST", "/payments", vec![], body),
            // Joined, these two lines read as the one after them: only the
            // number of lines tells that the body is not read as JSON.
            (
                "POST",
                "/payments",
                vec!["application/json; v=1", "x"],
                body,
            ),
            ("POST", "/payments", vec!["application/json; v=1, x"], body),
            (
                "POST",
                "/payments",
                vec!["application/json"],
                br#"{"currency":"EUR","amount":1250}"#,
            ),
            (
                "POST",
                "/payments",
                vec!["application/json"],
                br#"{"amount":1251,"currency":"EUR"}"#,
            ),
            ("POST", "/payments", vec!["application/json"], b"{not json"),
            ("POST", "/payments", vec!["application/json"], &[b'x'; 2000]),
        ];
        for round in 0..3 {
            for (method, uri, types, body) in &variants {
                let mut builder = http::Request::builder().method(*method).uri(*uri);
                for ct in types {
                    builder = builder.header(CONTENT_TYPE, *ct);
                }
                let p = builder.body(()).unwrap().into_parts().0;
                let body = Bytes::copy_from_slice(body);
                let lazy = lazy_fingerprint(&p.method, &p.uri, &p.headers, &body);
                let afresh = fingerprint(&p.method, &p.uri, &p.headers, &body);
                assert_eq!(lazy, afresh, "round {round}: {method} {uri} {types:?}");
            }
        }
    }

    #[test]
    fn the_lazy_fingerprint_is_the_fingerprint() {
        for (ct, body) in [
            ("application/json", &br#"{"b":[1,2.5,"x"],"a":null}"#[..]),
            ("application/json", b"{not json"),
            ("application/merge-patch+json", b" [ ] "),
            ("text/plain", b"hello"),
            ("", b""),
        ] {
            let p = parts("POST", "/p?q=1", ct);
            let body = Bytes::copy_from_slice(body);
            let lazy = lazy_fingerprint(&p.method, &p.uri, &p.headers, &body);
            let raw = raw_fingerprint(&p.method, &p.uri, &p.headers, &body);
            assert!(lazy.matches(&canonical_fingerprint(&p.method, &p.uri, &p.headers, &body)));
            assert!(
                lazy.matches(&raw),
                "{ct}: a record of scheme 1 still matches"
            );
            assert_eq!(
                lazy,
                fingerprint(&p.method, &p.uri, &p.headers, &body),
                "{ct}"
            );
        }
    }

    #[test]
    fn other_types_and_malformed_json_stay_byte_exact() {
        for (ct, body) in [
            ("text/plain", &br#"{"a":1}"#[..]),
            ("application/octet-stream", br#"{"a":1}"#),
            ("", br#"{"a":1}"#),
            ("application/json", b"{not json"),
            ("application/json", b"\xff\xfe"),
            ("application/jsonx", br#"{"a":1}"#),
        ] {
            let (of, raw) = (of("POST", "/p", ct, body), raw("POST", "/p", ct, body));
            assert_eq!(
                (of.as_bytes(), of.scheme()),
                (raw.as_bytes(), SCHEME),
                "{ct}"
            );
        }
        assert_ne!(
            of("POST", "/p", "text/plain", br#"{"a":1}"#),
            of("POST", "/p", "text/plain", br#"{ "a":1}"#)
        );
    }
}
