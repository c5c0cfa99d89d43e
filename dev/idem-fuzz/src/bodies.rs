//! Form and multipart bodies in canonical form, as differential checks
//! against the libraries that read them: `form_urlencoded` (the WHATWG
//! parser servo and `url` use) for forms; `multer` (axum's multipart
//! parser) and a reader written for clarity, not speed, here, for
//! multipart bodies.

use std::borrow::Cow;

use futures_util::FutureExt;
use idem_http::{form, multipart};

/// A form body. Input: the body.
///
/// The library's fields are the fields read without its lossy UTF-8 step
/// ([`form::fields_as_sent`]) wherever that step changes nothing; the
/// canonical fields are those, sorted by name with one name's values in
/// order; and the fields written back in another order of names, escaped
/// anew, read back the same.
pub fn form_body(data: &[u8]) {
    let ours = form::canonical_fields(data);
    let sent = form::fields_as_sent(data);
    let mut sorted = sent.clone();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(ours, sorted, "the canonical fields are the fields sorted");
    let theirs: Vec<(Cow<'_, str>, Cow<'_, str>)> = form_urlencoded::parse(data).collect();
    assert_eq!(theirs.len(), sent.len(), "as many fields as the library");
    let exact = sent
        .iter()
        .all(|(n, v)| std::str::from_utf8(n).is_ok() && std::str::from_utf8(v).is_ok());
    for ((name, value), (n, v)) in sent.iter().zip(&theirs) {
        if exact {
            assert_eq!(
                (&name[..], &value[..]),
                (n.as_bytes(), v.as_bytes()),
                "the library's field"
            );
        } else {
            assert_eq!(
                (
                    String::from_utf8_lossy(name),
                    String::from_utf8_lossy(value)
                ),
                (n.clone(), v.clone()),
                "the library's field, lossily"
            );
        }
    }
    // Written again with the names in reverse order: the same form.
    let mut names: Vec<&Vec<u8>> = ours.iter().map(|(n, _)| n).collect();
    names.dedup();
    let mut written = form_urlencoded::Serializer::new(String::new());
    for name in names.iter().rev() {
        for (_, value) in ours.iter().filter(|(n, _)| n == *name) {
            written.append_pair(
                &String::from_utf8_lossy(name),
                &String::from_utf8_lossy(value),
            );
        }
    }
    if exact {
        assert_eq!(
            form::canonical_fields(written.finish().as_bytes()),
            ours,
            "a form written again reads the same"
        );
    }
}

/// Forms as browsers and HTTP clients write them, and escapes at the edges.
pub(crate) fn form_body_seeds() -> Vec<Vec<u8>> {
    [
        "amount=1250&currency=EUR&description=Coffee+beans",
        "card%5Bnumber%5D=4242&card%5Bexp%5D=12%2F34&metadata[order]=7",
        "tag=a&tag=b&tag=a&x=",
        "a=%zz&b=%4&c=%&d=%%41&e=%c3%a9&f=%C3%A9&g=%ff",
        "&&a&=&==&a=1=2&+=+&%2B=%2b",
        "q=caf%C3%A9+cr%C3%A8me&q=%E2%82%AC",
    ]
    .iter()
    .map(|text| text.as_bytes().to_vec())
    .collect()
}

/// The characters RFC 2046 allows in a boundary, but the space.
const BCHARS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ'()+_,-./:=?";

/// A multipart body. Input: a byte `n`, `n % 70 + 1` bytes that make the
/// boundary (mapped onto its alphabet), the body.
///
/// The canonical parts are the reference reader's (both read the body, or
/// both refuse it); and the parts written again under another boundary,
/// with the names in another order, read back the same.
pub fn multipart_body(data: &[u8]) {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let len = usize::from(n % 70) + 1;
    if rest.len() < len {
        return;
    }
    let (boundary, body) = rest.split_at(len);
    let boundary: String = boundary
        .iter()
        .map(|&b| BCHARS[usize::from(b) % BCHARS.len()] as char)
        .collect();
    let content_type = format!("multipart/form-data; boundary=\"{boundary}\"");
    let ours = multipart::canonical_parts(&content_type, body);
    let theirs = reference::parts(boundary.as_bytes(), body);
    match (&ours, &theirs) {
        (Ok(ours), Some(theirs)) => {
            let ours: Vec<reference::Part> = ours.iter().map(reference::Part::from).collect();
            assert_eq!(&ours, theirs, "the canonical parts are the reference's");
        }
        (Err(_), None) => return,
        (ours, theirs) => panic!("the readers disagree: {ours:?} / {theirs:?}"),
    }
    let Ok(parts) = ours else { return };
    if let Some(fields) = multer_fields(&boundary, body) {
        agrees_with_multer(&boundary, body, &parts, &fields);
    }
    if let Some(again) = reference::write_reordered(&parts) {
        let (boundary, body) = again;
        let content_type = format!("multipart/form-data; boundary={boundary}");
        assert_eq!(
            multipart::canonical_parts(&content_type, &body).as_ref(),
            Ok(&parts),
            "the parts written again under {boundary} read the same"
        );
    }
}

/// A part as multer reads it: its name, its header lines, its bytes.
type MulterField = (Option<String>, http::HeaderMap, bytes::Bytes);

/// The fields multer reads from a body held whole in memory, in the order
/// sent; `None` when it refuses the body. The stream is ready, so no
/// future waits: one poll each.
fn multer_fields(boundary: &str, body: &[u8]) -> Option<Vec<MulterField>> {
    let chunk = bytes::Bytes::copy_from_slice(body);
    let stream =
        futures_util::stream::once(async move { Ok::<_, std::convert::Infallible>(chunk) });
    let mut reader = multer::Multipart::new(stream, boundary);
    let mut fields = Vec::new();
    loop {
        let polled = reader.next_field().now_or_never();
        let field = polled.expect("a body in memory never waits").ok()?;
        let Some(field) = field else {
            return Some(fields);
        };
        let (name, headers) = (field.name().map(str::to_owned), field.headers().clone());
        let data = field.bytes().now_or_never().expect("never waits").ok()?;
        fields.push((name, headers, data));
    }
}

/// Where both read a body, multer and the canonical parts agree on every
/// part's bytes, name and content type, but where they are known to read
/// a body apart (the module docs of `idem_http::multipart` say why).
fn agrees_with_multer(
    boundary: &str,
    body: &[u8],
    parts: &[multipart::Part<'_>],
    fields: &[MulterField],
) {
    // multer takes the first `--boundary` anywhere, even inside a preamble
    // line; the first delimiter opens the body or follows a line break.
    let opening = format!("--{boundary}");
    let first = body
        .windows(opening.len())
        .position(|w| w == opening.as_bytes())
        .unwrap_or(0);
    if first > 0 && &body[first - 2.min(first)..first] != b"\r\n" {
        return;
    }
    assert_eq!(parts.len(), fields.len(), "as many parts as multer reads");
    // The same parts: bytes and content type, in any order (the canonical
    // parts are sorted by name, multer's are as sent).
    let mut ours: Vec<(&[u8], Option<&[u8]>)> =
        parts.iter().map(|p| (p.data, p.content_type)).collect();
    let mut theirs: Vec<(&[u8], Option<&[u8]>)> = fields
        .iter()
        .map(|(_, headers, data)| {
            let content_type = headers.get(http::header::CONTENT_TYPE);
            (&data[..], content_type.map(|v| v.as_bytes()))
        })
        .collect();
    ours.sort();
    theirs.sort();
    assert_eq!(ours, theirs, "the parts' bytes and content types");
    // Names: multer finds `name=` case-sensitively and reads quoted and
    // bare values its own way, so only a disposition as clients write it
    // is compared: `form-data; name="token"`, a file name after it.
    let mut ours: Vec<&[u8]> = parts.iter().map(|p| &p.name[..]).collect();
    let mut theirs = Vec::new();
    for (name, headers, _) in fields {
        let disposition = headers
            .get(http::header::CONTENT_DISPOSITION)
            .map_or(&b""[..], |v| v.as_bytes());
        if !written_as_clients_do(disposition) {
            return;
        }
        theirs.push(name.as_deref().unwrap_or_default().as_bytes());
    }
    ours.sort();
    theirs.sort();
    assert_eq!(
        ours,
        theirs,
        "the parts' names in {:?}",
        String::from_utf8_lossy(body)
    );
}

/// `form-data; name="token"`, perhaps `; filename="…"` after it, with no
/// quote, backslash or `;` inside the quotes.
fn written_as_clients_do(disposition: &[u8]) -> bool {
    let Some(rest) = disposition.strip_prefix(b"form-data; name=\"") else {
        return false;
    };
    let Some(end) = rest.iter().position(|&b| b == b'"') else {
        return false;
    };
    let token = |text: &[u8]| {
        text.iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"-_.[]".contains(&b))
    };
    let after = &rest[end + 1..];
    let file = after
        .strip_prefix(b"; filename=\"")
        .and_then(|f| f.strip_suffix(b"\""))
        .is_some_and(|f| !f.iter().any(|b| b"\"\\;".contains(b)));
    token(&rest[..end]) && (after.is_empty() || file)
}

/// Bodies as browsers and clients write them, and edges of the format.
pub(crate) fn multipart_body_seeds() -> Vec<Vec<u8>> {
    let boundary = "----WebKitFormBoundary7MA4YWxkTrZu0gW";
    let bodies: Vec<String> = vec![
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nhello\r\n\
             --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.png\"\r\n\
             Content-Type: image/png\r\n\r\n\u{89}PNG\r\n\x1a\n\r\n--{boundary}--\r\n"
        ),
        format!(
            "preamble\r\n--{boundary} \t\r\ncontent-disposition: form-data; name=tag\r\n\r\na\r\n\
             --{boundary}\r\nCONTENT-DISPOSITION: form-data; name=\"tag\"\r\nX-Other: 1\r\n\r\nb\r\n\
             --{boundary}--epilogue"
        ),
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"a;b\"; filename=\"x\\\"y\"\r\n\
             Content-Transfer-Encoding: base64\r\n\r\naGk=\r\n--{boundary}--"
        ),
        format!("--{boundary}--"),
        format!("--{boundary}\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n--{boundary}x\r\n--{boundary}--"),
    ];
    bodies
        .into_iter()
        .map(|body| {
            // The boundary's bytes map back onto themselves.
            let mut seed = vec![(boundary.len() - 1) as u8];
            seed.extend(
                boundary
                    .bytes()
                    .map(|c| BCHARS.iter().position(|&b| b == c).unwrap_or(0) as u8),
            );
            seed.extend_from_slice(body.as_bytes());
            seed
        })
        .collect()
}

/// A multipart reader that splits the body at every delimiter first, then
/// reads each piece, with a state machine for the header parameters: slow
/// and plain, so that it can be trusted where the fast one is clever.
mod reference {
    use idem_http::multipart;

    /// Disposition parameters but the name.
    type Params = Vec<(Vec<u8>, Vec<u8>)>;

    /// A part, owned.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub(super) struct Part {
        name: Vec<u8>,
        params: Params,
        content_type: Option<Vec<u8>>,
        transfer_encoding: Option<Vec<u8>>,
        data: Vec<u8>,
    }

    impl From<&multipart::Part<'_>> for Part {
        fn from(part: &multipart::Part<'_>) -> Part {
            Part {
                name: part.name.clone(),
                params: part.params.clone(),
                content_type: part.content_type.map(<[u8]>::to_vec),
                transfer_encoding: part.transfer_encoding.map(<[u8]>::to_vec),
                data: part.data.to_vec(),
            }
        }
    }

    /// Splits `body` at each occurrence of `needle`, left to right.
    fn split<'a>(body: &'a [u8], needle: &[u8]) -> Vec<&'a [u8]> {
        let mut pieces = Vec::new();
        let (mut start, mut i) = (0, 0);
        while i + needle.len() <= body.len() {
            if &body[i..i + needle.len()] == needle {
                pieces.push(&body[start..i]);
                i += needle.len();
                start = i;
            } else {
                i += 1;
            }
        }
        pieces.push(&body[start..]);
        pieces
    }

    pub(super) fn parts(boundary: &[u8], body: &[u8]) -> Option<Vec<Part>> {
        let mut delimiter = b"\r\n--".to_vec();
        delimiter.extend_from_slice(boundary);
        // A body that opens with the delimiter has no preamble.
        let mut framed = b"\r\n".to_vec();
        let body = if body.starts_with(&delimiter[2..]) {
            framed.extend_from_slice(body);
            &framed[..]
        } else {
            body
        };
        let pieces = split(body, &delimiter);
        let mut parts = Vec::new();
        // pieces[0] is the preamble; each later one follows a delimiter.
        for (i, piece) in pieces.iter().enumerate().skip(1) {
            if piece.starts_with(b"--") {
                parts.sort_by(|a: &Part, b: &Part| a.name.cmp(&b.name));
                return Some(parts);
            }
            let start = piece.iter().position(|&b| b != b' ' && b != b'\t')?;
            let content = piece[start..].strip_prefix(b"\r\n")?;
            // A part must be followed by another delimiter.
            if i + 1 == pieces.len() {
                return None;
            }
            parts.push(part(content)?);
        }
        None
    }

    fn part(content: &[u8]) -> Option<Part> {
        let (head, data) = match content.strip_prefix(b"\r\n") {
            Some(data) => (None, data),
            None => {
                let at = (0..content.len()).find(|&i| content[i..].starts_with(b"\r\n\r\n"))?;
                (Some(&content[..at]), &content[at + 4..])
            }
        };
        let mut seen: [Option<Vec<u8>>; 3] = [None, None, None];
        for line in head.map(|h| split(h, b"\r\n")).unwrap_or_default() {
            if line.is_empty()
                || line[0] == b' '
                || line[0] == b'\t'
                || line.iter().any(|&b| b == b'\r' || b == b'\n')
            {
                return None;
            }
            let colon = line.iter().position(|&b| b == b':')?;
            let name = line[..colon].to_ascii_lowercase();
            let slot = match &name[..] {
                b"content-disposition" => 0,
                b"content-type" => 1,
                b"content-transfer-encoding" => 2,
                _ => continue,
            };
            if seen[slot].is_some() {
                return None;
            }
            seen[slot] = Some(line[colon + 1..].trim_ascii().to_vec());
        }
        let [disposition, content_type, transfer_encoding] = seen;
        let (name, params) = disposition_params(&disposition?)?;
        Some(Part {
            name,
            params,
            content_type,
            transfer_encoding,
            data: data.to_vec(),
        })
    }

    /// `form-data; k=v; k="v"`, read one character at a time.
    fn disposition_params(value: &[u8]) -> Option<(Vec<u8>, Params)> {
        std::str::from_utf8(value).ok()?;
        // Pieces between the `;`s outside quotes.
        let mut pieces: Vec<Vec<u8>> = vec![Vec::new()];
        let (mut quoted, mut escaped) = (false, false);
        for &c in value {
            let last = pieces.last_mut()?;
            if escaped {
                escaped = false;
                last.push(c);
            } else if quoted && c == b'\\' {
                escaped = true;
                last.push(c);
            } else if c == b'"' {
                quoted = !quoted;
                last.push(c);
            } else if c == b';' && !quoted {
                pieces.push(Vec::new());
            } else {
                last.push(c);
            }
        }
        if !pieces[0].trim_ascii().eq_ignore_ascii_case(b"form-data") {
            return None;
        }
        let (mut name, mut params) = (None, Vec::new());
        for piece in &pieces[1..] {
            let eq = piece.iter().position(|&b| b == b'=')?;
            let key = piece[..eq].trim_ascii().to_ascii_lowercase();
            let raw = piece[eq + 1..].trim_ascii();
            let value = if raw.first() == Some(&b'"') {
                if raw.len() < 2 || raw.last() != Some(&b'"') {
                    return None;
                }
                &raw[1..raw.len() - 1]
            } else {
                raw
            };
            if key == b"name" {
                if name.is_some() {
                    return None;
                }
                name = Some(value.to_vec());
            } else {
                params.push((key, value.to_vec()));
            }
        }
        Some((name?, params))
    }

    /// The parts written again in another order of names, under a boundary
    /// found in none of them; `None` when a name or parameter holds a byte
    /// that quoting would change.
    pub(super) fn write_reordered(parts: &[multipart::Part<'_>]) -> Option<(String, Vec<u8>)> {
        let plain = |text: &[u8]| !text.iter().any(|b| b"\"\\;\r\n".contains(b));
        let ok = parts
            .iter()
            .all(|part| plain(&part.name) && part.params.iter().all(|(k, v)| plain(k) && plain(v)));
        if !ok {
            return None;
        }
        let mut n = 0u32;
        let boundary = loop {
            let candidate = format!("=_again_{n}");
            let mut delimiter = b"--".to_vec();
            delimiter.extend_from_slice(candidate.as_bytes());
            let clash = parts.iter().any(|part| {
                part.data
                    .windows(delimiter.len())
                    .any(|w| w == &delimiter[..])
            });
            if !clash {
                break candidate;
            }
            n += 1;
        };
        let mut names: Vec<&Vec<u8>> = parts.iter().map(|part| &part.name).collect();
        names.dedup();
        let mut body = Vec::new();
        for name in names.iter().rev() {
            for part in parts.iter().filter(|part| &part.name == *name) {
                body.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
                body.extend_from_slice(b"Content-Disposition: form-data; name=\"");
                body.extend_from_slice(&part.name);
                body.push(b'"');
                for (key, value) in &part.params {
                    body.extend_from_slice(b"; ");
                    body.extend_from_slice(key);
                    body.extend_from_slice(b"=\"");
                    body.extend_from_slice(value);
                    body.push(b'"');
                }
                body.extend_from_slice(b"\r\n");
                for (header, value) in [
                    ("Content-Type", part.content_type),
                    ("Content-Transfer-Encoding", part.transfer_encoding),
                ] {
                    if let Some(value) = value {
                        body.extend_from_slice(format!("{header}: ").as_bytes());
                        body.extend_from_slice(value);
                        body.extend_from_slice(b"\r\n");
                    }
                }
                body.extend_from_slice(b"\r\n");
                body.extend_from_slice(part.data);
                body.extend_from_slice(b"\r\n");
            }
        }
        body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
        Some((boundary, body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CT: &str = "multipart/form-data; boundary=XyZ";

    fn body(headers: &str) -> Vec<u8> {
        format!("--XyZ\r\n{headers}\r\n\r\n1\r\n--XyZ--\r\n").into_bytes()
    }

    /// Pins why multer does not read the fingerprinted parts: each body
    /// below is read by one parser and refused, or read otherwise, by the
    /// other, and a stored fingerprint would change with it.
    #[test]
    fn multer_reads_these_bodies_apart() {
        let cd = "Content-Disposition: form-data; name=\"a\"";
        // A repeated header: refused here, the last one kept by multer.
        let twice = body(&format!("{cd}\r\nContent-Type: a\r\nContent-Type: b"));
        assert!(multipart::canonical_parts(CT, &twice).is_err());
        let read = multer_fields("XyZ", &twice).unwrap();
        assert_eq!(read[0].1.get("content-type").unwrap(), "b");
        // A bare LF ends a header line for multer, never here.
        let lf = body(&format!("{cd}\nContent-Type: a"));
        assert!(multipart::canonical_parts(CT, &lf).is_err());
        assert!(multer_fields("XyZ", &lf).is_some());
        // A header this crate ignores, but multer cannot read.
        let odd = body(&format!("{cd}\r\nBad Name: 1"));
        assert!(multipart::canonical_parts(CT, &odd).is_ok());
        assert!(multer_fields("XyZ", &odd).is_none());
        // `NAME=` is the name here; multer looks for `name=` alone.
        let upper = body("Content-Disposition: form-data; NAME=\"a\"");
        assert_eq!(
            multipart::canonical_parts(CT, &upper).unwrap()[0].name,
            b"a"
        );
        assert_eq!(multer_fields("XyZ", &upper).unwrap()[0].0, None);
        // A delimiter inside a preamble line opens the body for multer.
        let mut preamble = b"x--XyZ\r\n".to_vec();
        preamble.extend_from_slice(&body(cd));
        assert_eq!(multipart::canonical_parts(CT, &preamble).unwrap().len(), 1);
        assert_ne!(multer_fields("XyZ", &preamble).map(|f| f.len()), Some(1));
    }
}
