//! `application/x-www-form-urlencoded` bodies in canonical form: what a
//! form means, whatever order its distinct fields were sent in and however
//! its bytes were escaped.

use idem_core::Fingerprint;

/// The fields of a form body, as the WHATWG URL standard's
/// `application/x-www-form-urlencoded` parser reads them, in canonical
/// order: sorted by name, the values of one name in the order they were
/// sent (`a=1&a=2` is not `a=2&a=1`: a list's order can mean something).
///
/// Every byte string is a form, as it is to the standard's parser: empty
/// sequences between `&` are skipped, a field without `=` has the empty
/// value, `+` is a space, `%XY` is the byte `0xXY`, and a `%` not followed
/// by two hex digits stands for itself. Names and values are compared as
/// decoded bytes, not as text, so two bodies that only a lossy UTF-8
/// decoding would make equal stay apart.
///
/// ```
/// use idem_http::form;
///
/// let a = form::canonical_fields(b"currency=EUR&amount=1250&tag=a&tag=b");
/// let b = form::canonical_fields(b"amount=%31250&tag=a&currency=EUR&tag=b");
/// assert_eq!(a, b);
/// assert_ne!(a, form::canonical_fields(b"amount=1250&currency=EUR&tag=b&tag=a"));
/// ```
pub fn canonical_fields(body: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut fields: Vec<(Vec<u8>, Vec<u8>)> = body
        .split(|&byte| byte == b'&')
        .filter(|sequence| !sequence.is_empty())
        .map(|sequence| {
            let (name, value) = match sequence.iter().position(|&byte| byte == b'=') {
                Some(at) => (&sequence[..at], &sequence[at + 1..]),
                None => (sequence, &[][..]),
            };
            (decode(name), decode(value))
        })
        .collect();
    // A stable sort keeps the order of one name's values.
    fields.sort_by(|a, b| a.0.cmp(&b.0));
    fields
}

/// The digest of a form's [`canonical_fields`]: each name and value,
/// length-prefixed, in canonical order.
pub(crate) fn digest<'a>(fields: impl IntoIterator<Item = &'a (Vec<u8>, Vec<u8>)>) -> Fingerprint {
    Fingerprint::of_parts(
        fields
            .into_iter()
            .flat_map(|(name, value)| [name.as_slice(), value.as_slice()]),
    )
}

/// Percent-decodes one name or value, `+` as a space.
fn decode(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        match text[i] {
            b'+' => out.push(b' '),
            b'%' => match (text.get(i + 1).and_then(hex), text.get(i + 2).and_then(hex)) {
                (Some(high), Some(low)) => {
                    out.push(high << 4 | low);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            byte => out.push(byte),
        }
        i += 1;
    }
    out
}

fn hex(byte: &u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(body: &str) -> Vec<(String, String)> {
        canonical_fields(body.as_bytes())
            .into_iter()
            .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
            .collect()
    }

    #[test]
    fn decodes_as_the_url_standard_does() {
        assert_eq!(
            fields("b=x+y&a=%7e%7E&&c&d=&e=%zz&f=%4"),
            [
                ("a", "~~"),
                ("b", "x y"),
                ("c", ""),
                ("d", ""),
                ("e", "%zz"),
                ("f", "%4")
            ]
            .map(|(n, v)| (n.to_owned(), v.to_owned()))
        );
        assert_eq!(
            fields("=v&a==b"),
            [("", "v"), ("a", "=b")].map(|(n, v)| (n.to_owned(), v.to_owned()))
        );
        assert!(canonical_fields(b"").is_empty());
        assert_eq!(canonical_fields(b"a=%ff"), [(b"a".to_vec(), vec![0xff])]);
    }

    #[test]
    fn order_of_names_is_free_and_order_of_values_is_kept() {
        assert_eq!(fields("a=1&b=2&a=3"), fields("b=2&a=1&a=3"));
        assert_ne!(fields("a=1&b=2&a=3"), fields("a=3&b=2&a=1"));
        assert_eq!(fields("a=%20"), fields("a=+"));
        assert_ne!(fields("a=%2B"), fields("a=+"), "an escaped plus is a plus");
        assert_ne!(
            digest(&canonical_fields(b"ab=c")),
            digest(&canonical_fields(b"a=bc"))
        );
    }
}
