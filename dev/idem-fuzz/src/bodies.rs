//! Form and multipart bodies in canonical form, against slow references:
//! the `form_urlencoded` crate (the WHATWG parser servo and `url` use) for
//! forms, and a multipart reader written for clarity, not speed, here.

use std::borrow::Cow;

use idem_http::{form, multipart};

/// A form body. Input: the body.
///
/// The canonical fields are the reference parser's, sorted by name with
/// one name's values in order (compared as text, which the reference
/// decodes lossily); and the fields written back in another order of
/// names, escaped anew, read back the same.
pub fn form_body(data: &[u8]) {
    let ours = form::canonical_fields(data);
    let mut theirs: Vec<(Cow<'_, str>, Cow<'_, str>)> = form_urlencoded::parse(data).collect();
    let exact = ours
        .iter()
        .all(|(n, v)| std::str::from_utf8(n).is_ok() && std::str::from_utf8(v).is_ok());
    let lossy: Vec<(String, String)> = ours
        .iter()
        .map(|(n, v)| {
            (
                String::from_utf8_lossy(n).into_owned(),
                String::from_utf8_lossy(v).into_owned(),
            )
        })
        .collect();
    if exact {
        // UTF-8 text sorts as its bytes do.
        theirs.sort_by(|a, b| a.0.cmp(&b.0));
        let theirs: Vec<(String, String)> = theirs
            .into_iter()
            .map(|(n, v)| (n.into_owned(), v.into_owned()))
            .collect();
        assert_eq!(lossy, theirs, "the canonical fields are the reference's");
    } else {
        // Bytes a lossy decoding merges may sort apart: the same fields.
        let mut ours = lossy;
        let mut theirs: Vec<(String, String)> = theirs
            .into_iter()
            .map(|(n, v)| (n.into_owned(), v.into_owned()))
            .collect();
        ours.sort();
        theirs.sort();
        assert_eq!(ours, theirs, "the same fields as the reference");
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
