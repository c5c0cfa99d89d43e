//! `multipart/form-data` bodies (RFC 7578) in canonical form: the parts by
//! name, each with its disposition, content type and bytes, whatever
//! boundary the client picked this time.
//!
//! # Why not `multer`
//!
//! axum's multipart parser, `multer`, reads the bodies clients write as this
//! parser does; the fuzz target `multipart_body` checks that. On other bodies
//! it decides otherwise, and a stored fingerprint would change with it:
//!
//! - A repeated `Content-Type` or `Content-Disposition`: refused here, the
//!   last one kept by multer (its headers are an `http::HeaderMap`).
//! - A bare LF ends a header line for multer; here it makes the body
//!   malformed, since a handler may read it otherwise.
//! - A header line multer cannot parse (a name with a space, a control
//!   byte, more than 32 lines) refuses the body there; here a header that
//!   does not count is skipped.
//! - multer finds `name=` case-sensitively and reads bare and quoted values
//!   its own way; it keeps no other disposition parameter.
//! - The first `--boundary` opens the body for multer even inside a preamble
//!   line; here it opens the body or follows a line break (RFC 2046).
//!
//! A test in `idem-fuzz` (`multer_reads_these_bodies_apart`) pins a body
//! of each kind. What multer could still do is the framing: some forty
//! lines here.

use std::fmt;

use idem_core::fingerprint::PartsHasher;
use idem_core::Fingerprint;

/// One part of a `multipart/form-data` body, as sent. Parameter values
/// are kept as they appear between their quotes, escapes and all, so that
/// no two different headers read the same.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Part<'a> {
    /// The `name` parameter of its `Content-Disposition`.
    pub name: Vec<u8>,
    /// The other `Content-Disposition` parameters in the order sent, names
    /// in lower case: `filename`, `filename*`, …
    pub params: Vec<(Vec<u8>, Vec<u8>)>,
    /// Its `Content-Type` value, trimmed; `None` when it has none.
    pub content_type: Option<&'a [u8]>,
    /// Its `Content-Transfer-Encoding` value, trimmed, which changes what
    /// its bytes mean; `None` when it has none.
    pub transfer_encoding: Option<&'a [u8]>,
    /// Its bytes.
    pub data: &'a [u8],
}

/// Why a body is not a well-formed `multipart/form-data` body. The
/// fingerprint then falls back to the body's bytes as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MultipartError {
    /// The `Content-Type` has no usable `boundary` parameter (1–70 bytes).
    NoBoundary,
    /// No delimiter line opens the body.
    NoOpeningDelimiter,
    /// A delimiter is followed by something other than a line end.
    BadDelimiterLine,
    /// A part's header section is not `Name: value` lines ended by an
    /// empty line (folded lines included).
    BadHeader,
    /// A part has no `Content-Disposition: form-data` with a `name`, or two
    /// of a header that may appear once.
    BadDisposition,
    /// The body ends before its closing delimiter.
    Unterminated,
}

impl fmt::Display for MultipartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MultipartError::NoBoundary => "the content type has no usable boundary",
            MultipartError::NoOpeningDelimiter => "no delimiter opens the body",
            MultipartError::BadDelimiterLine => "a delimiter line has trailing bytes",
            MultipartError::BadHeader => "a part's header section is malformed",
            MultipartError::BadDisposition => {
                "a part has no form-data disposition with a name, or a repeated header"
            }
            MultipartError::Unterminated => "the body ends before its closing delimiter",
        })
    }
}

impl std::error::Error for MultipartError {}

/// The parts of a `multipart/form-data` body whose `Content-Type` value is
/// `content_type`, in canonical order: sorted by name, the parts of one
/// name in the order they were sent. The boundary, the preamble and the
/// epilogue mean nothing and are left out; so are part headers other than
/// `Content-Disposition`, `Content-Type` and `Content-Transfer-Encoding`,
/// which RFC 7578 says a receiver ignores.
///
/// ```
/// use idem_http::multipart;
///
/// let a = "--AaB03x\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nhi\r\n\
///          --AaB03x\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\n\
///          Content-Type: text/plain\r\n\r\nbytes\r\n--AaB03x--\r\n";
/// let b = a.replace("AaB03x", "7MA4YWxkTrZu0gW");
/// let a = multipart::canonical_parts("multipart/form-data; boundary=AaB03x", a.as_bytes());
/// let b = multipart::canonical_parts("multipart/form-data; boundary=7MA4YWxkTrZu0gW", b.as_bytes());
/// assert_eq!(a, b);
/// assert_eq!(a.unwrap()[0].name, b"file");
/// ```
pub fn canonical_parts<'a>(
    content_type: &str,
    body: &'a [u8],
) -> Result<Vec<Part<'a>>, MultipartError> {
    let boundary = boundary(content_type).ok_or(MultipartError::NoBoundary)?;
    let mut parts = parse(boundary.as_bytes(), body)?;
    parts.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(parts)
}

/// The digest of parts in canonical order.
pub(crate) fn digest<'a, 'b: 'a>(parts: impl IntoIterator<Item = &'a Part<'b>>) -> Fingerprint {
    let mut all = PartsHasher::new();
    for part in parts {
        let mut one = PartsHasher::new();
        one.update(&part.name);
        let mut params = PartsHasher::new();
        for (name, value) in &part.params {
            params.update(name);
            params.update(value);
        }
        one.update(params.finish().as_bytes());
        for header in [part.content_type, part.transfer_encoding] {
            match header {
                Some(value) => {
                    one.update(b"1");
                    one.update(value);
                }
                None => one.update(b"0"),
            }
        }
        one.update(part.data);
        all.update(one.finish().as_bytes());
    }
    all.finish()
}

/// The media type with its `boundary` parameter left out, so that a new
/// boundary does not change the request's content type part.
pub(crate) fn without_boundary(content_type: &str) -> String {
    let mut out = String::with_capacity(content_type.len());
    for (i, piece) in split_params(content_type).into_iter().enumerate() {
        let is_boundary = i > 0
            && piece
                .split_once('=')
                .is_some_and(|(name, _)| name.trim_ascii().eq_ignore_ascii_case("boundary"));
        if !is_boundary {
            if i > 0 {
                out.push(';');
            }
            out.push_str(piece.trim_ascii());
        }
    }
    out
}

/// The `boundary` parameter of a `Content-Type` value, unquoted.
fn boundary(content_type: &str) -> Option<String> {
    let value = split_params(content_type)
        .into_iter()
        .skip(1)
        .find_map(|piece| {
            let (name, value) = piece.split_once('=')?;
            name.trim_ascii()
                .eq_ignore_ascii_case("boundary")
                .then(|| value.trim_ascii())
        })?;
    let value = match value.strip_prefix('"') {
        Some(quoted) => quoted
            .strip_suffix('"')?
            .replace("\\\"", "\"")
            .replace("\\\\", "\\"),
        None => value.to_owned(),
    };
    (1..=70).contains(&value.len()).then_some(value)
}

/// Splits a header value at the `;`s outside quoted strings.
fn split_params(value: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, byte) in value.bytes().enumerate() {
        match byte {
            _ if escaped => escaped = false,
            b'\\' if quoted => escaped = true,
            b'"' => quoted = !quoted,
            b';' if !quoted => {
                pieces.push(&value[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    pieces.push(&value[start..]);
    pieces
}

/// The lines of a header section, split at each CRLF.
fn split_lines(mut headers: &[u8]) -> Vec<&[u8]> {
    let mut lines = Vec::new();
    while let Some(end) = find(headers, b"\r\n") {
        lines.push(&headers[..end]);
        headers = &headers[end + 2..];
    }
    lines.push(headers);
    lines
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// Reads the parts between the delimiters of `boundary`.
fn parse<'a>(boundary: &[u8], body: &'a [u8]) -> Result<Vec<Part<'a>>, MultipartError> {
    let mut delimiter = Vec::with_capacity(boundary.len() + 4);
    delimiter.extend_from_slice(b"\r\n--");
    delimiter.extend_from_slice(boundary);
    // The first delimiter may open the body; otherwise a preamble ends in
    // the line break that is part of the delimiter.
    let mut at = if body.starts_with(&delimiter[2..]) {
        delimiter.len() - 2
    } else {
        find(body, &delimiter).ok_or(MultipartError::NoOpeningDelimiter)? + delimiter.len()
    };
    let mut parts = Vec::new();
    loop {
        let rest = &body[at..];
        if rest.starts_with(b"--") {
            // The close delimiter: the epilogue means nothing.
            return Ok(parts);
        }
        let padding = rest
            .iter()
            .take_while(|&&byte| byte == b' ' || byte == b'\t')
            .count();
        let rest = &rest[padding..];
        if rest.is_empty() {
            return Err(MultipartError::Unterminated);
        }
        if !rest.starts_with(b"\r\n") {
            return Err(MultipartError::BadDelimiterLine);
        }
        at += padding + 2;
        let end = find(&body[at..], &delimiter).ok_or(MultipartError::Unterminated)?;
        parts.push(part(&body[at..at + end])?);
        at += end + delimiter.len();
    }
}

/// One part: its header section, an empty line, its bytes.
fn part(bytes: &[u8]) -> Result<Part<'_>, MultipartError> {
    let (headers, data) = if let Some(data) = bytes.strip_prefix(b"\r\n") {
        (&[][..], data)
    } else {
        let end = find(bytes, b"\r\n\r\n").ok_or(MultipartError::BadHeader)?;
        (&bytes[..end], &bytes[end + 4..])
    };
    let (mut disposition, mut content_type, mut transfer_encoding) = (None, None, None);
    if !headers.is_empty() {
        for line in split_lines(headers) {
            // Lines end in CRLF only: a bare CR or LF, or a folded line,
            // would be read one way here and another by some handler.
            if line.contains(&b'\r')
                || line.contains(&b'\n')
                || line.first().is_none_or(|b| *b == b' ' || *b == b'\t')
            {
                return Err(MultipartError::BadHeader);
            }
            let colon = line
                .iter()
                .position(|&byte| byte == b':')
                .ok_or(MultipartError::BadHeader)?;
            let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
            let slot = if name.eq_ignore_ascii_case(b"content-disposition") {
                &mut disposition
            } else if name.eq_ignore_ascii_case(b"content-type") {
                &mut content_type
            } else if name.eq_ignore_ascii_case(b"content-transfer-encoding") {
                &mut transfer_encoding
            } else {
                continue;
            };
            if slot.replace(value).is_some() {
                return Err(MultipartError::BadDisposition);
            }
        }
    }
    let (name, params) = disposition
        .and_then(form_data)
        .ok_or(MultipartError::BadDisposition)?;
    Ok(Part {
        name,
        params,
        content_type,
        transfer_encoding,
        data,
    })
}

type Params = Vec<(Vec<u8>, Vec<u8>)>;

/// `form-data; name="x"; filename="y"`: the name and the other parameters.
/// A disposition that is not UTF-8 is refused: its name could not be read
/// as the handler reads it.
fn form_data(value: &[u8]) -> Option<(Vec<u8>, Params)> {
    let text = std::str::from_utf8(value).ok()?;
    let mut pieces = split_params(text).into_iter();
    if !pieces
        .next()?
        .trim_ascii()
        .eq_ignore_ascii_case("form-data")
    {
        return None;
    }
    let (mut name, mut params) = (None, Vec::new());
    for piece in pieces {
        let (key, raw) = piece.split_once('=')?;
        let key = key.trim_ascii().to_ascii_lowercase();
        let raw = raw.trim_ascii();
        let value = match raw.strip_prefix('"') {
            Some(quoted) => quoted.strip_suffix('"')?,
            None => raw,
        };
        if key == "name" {
            if name.replace(value.as_bytes().to_vec()).is_some() {
                return None;
            }
        } else {
            params.push((key.into_bytes(), value.as_bytes().to_vec()));
        }
    }
    Some((name?, params))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CT: &str = "multipart/form-data; boundary=XyZ";

    fn body(parts: &[(&str, &str)], boundary: &str) -> Vec<u8> {
        let mut out = Vec::new();
        for (headers, data) in parts {
            out.extend_from_slice(
                format!("--{boundary}\r\n{headers}\r\n\r\n{data}\r\n").as_bytes(),
            );
        }
        out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
        out
    }

    #[test]
    fn reads_parts_by_name_whatever_the_boundary() {
        let parts = [
            ("Content-Disposition: form-data; name=\"b\"", "two"),
            (
                "content-disposition: form-data; name=\"a\"; filename=\"x.png\"\r\nContent-Type: image/png",
                "\r\n--Xy\r\n",
            ),
            ("Content-Disposition: form-data; name=\"b\"", ""),
        ];
        let one = body(&parts, "XyZ");
        let two = body(&parts, "other-boundary");
        let read = canonical_parts(CT, &one).unwrap();
        assert_eq!(
            read,
            canonical_parts("multipart/form-data; boundary=\"other-boundary\"", &two).unwrap()
        );
        assert_eq!(read.len(), 3);
        assert_eq!(read[0].name, b"a");
        assert_eq!(read[0].params, [(b"filename".to_vec(), b"x.png".to_vec())]);
        assert_eq!(read[0].content_type, Some(&b"image/png"[..]));
        assert_eq!(read[0].data, b"\r\n--Xy\r\n");
        assert_eq!((read[1].data, read[2].data), (&b"two"[..], &b""[..]));
        let swapped = body(&[parts[1], parts[0], parts[2]], "XyZ");
        assert_eq!(canonical_parts(CT, &swapped).unwrap(), read);
        let reordered = body(&[parts[2], parts[1], parts[0]], "XyZ");
        assert_ne!(
            canonical_parts(CT, &reordered).unwrap(),
            read,
            "one name's order is kept"
        );
    }

    #[test]
    fn preamble_epilogue_and_padding_mean_nothing() {
        let plain = body(
            &[("Content-Disposition: form-data; name=\"a\"", "1")],
            "XyZ",
        );
        let mut dressed = b"preamble\r\n".to_vec();
        dressed.extend_from_slice(&plain);
        dressed.extend_from_slice(b"epilogue");
        let padded =
            String::from_utf8(plain.clone())
                .unwrap()
                .replacen("--XyZ\r\n", "--XyZ \t\r\n", 1);
        let a = canonical_parts(CT, &plain).unwrap();
        assert_eq!(a, canonical_parts(CT, &dressed).unwrap());
        assert_eq!(a, canonical_parts(CT, padded.as_bytes()).unwrap());
        assert_eq!(canonical_parts(CT, b"--XyZ--"), Ok(vec![]));
    }

    #[test]
    fn malformed_bodies_are_typed_errors() {
        let ok = body(
            &[("Content-Disposition: form-data; name=\"a\"", "1")],
            "XyZ",
        );
        let text = String::from_utf8(ok.clone()).unwrap();
        for (ct, body, error) in [
            (
                "multipart/form-data",
                ok.clone(),
                MultipartError::NoBoundary,
            ),
            (
                "multipart/form-data; boundary=",
                ok.clone(),
                MultipartError::NoBoundary,
            ),
            (CT, b"nothing".to_vec(), MultipartError::NoOpeningDelimiter),
            (
                CT,
                ok[..ok.len() - 4].to_vec(),
                MultipartError::Unterminated,
            ),
            (
                CT,
                text.replace("--XyZ\r\n", "--XyZx\r\n").into_bytes(),
                MultipartError::BadDelimiterLine,
            ),
            (
                CT,
                text.replace("name=\"a\"", "filename=\"a\"").into_bytes(),
                MultipartError::BadDisposition,
            ),
            (
                CT,
                text.replace("form-data;", "attachment;").into_bytes(),
                MultipartError::BadDisposition,
            ),
            (
                CT,
                text.replace("\r\n\r\n", "\r\n").into_bytes(),
                MultipartError::BadHeader,
            ),
            (
                CT,
                text.replace("\"a\"\r\n", "\"a\"\r\n folded\r\n")
                    .into_bytes(),
                MultipartError::BadHeader,
            ),
        ] {
            assert_eq!(
                canonical_parts(ct, &body),
                Err(error),
                "{}",
                String::from_utf8_lossy(&body)
            );
        }
    }

    #[test]
    fn the_content_type_loses_only_its_boundary() {
        assert_eq!(
            without_boundary("multipart/form-data; boundary=\"a;b\"; charset=utf-8"),
            "multipart/form-data;charset=utf-8"
        );
        assert_eq!(
            without_boundary("multipart/form-data;BOUNDARY=x"),
            "multipart/form-data"
        );
    }

    #[test]
    fn the_digest_tells_parts_apart() {
        let a = body(
            &[("Content-Disposition: form-data; name=\"a\"", "1")],
            "XyZ",
        );
        let b = body(
            &[(
                "Content-Disposition: form-data; name=\"a\"; filename=\"f\"",
                "1",
            )],
            "XyZ",
        );
        let c = body(
            &[(
                "Content-Disposition: form-data; name=\"a\"\r\nContent-Type: text/plain",
                "1",
            )],
            "XyZ",
        );
        let digests: Vec<_> = [a, b, c]
            .iter()
            .map(|body| digest(&canonical_parts(CT, body).unwrap()))
            .collect();
        assert_ne!(digests[0], digests[1]);
        assert_ne!(digests[0], digests[2]);
        assert_ne!(digests[1], digests[2]);
    }
}
