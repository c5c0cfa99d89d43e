//! `application/x-www-form-urlencoded` bodies in canonical form: what a
//! form means, whatever order its distinct fields were sent in and however
//! its bytes were escaped.
//!
//! The fields are read by `form_urlencoded`, the WHATWG parser servo and
//! `url` use. Its last step decodes each name and value as UTF-8, lossily:
//! `%FF` and `%FE` both become U+FFFD. Fingerprints have always told such
//! bytes apart, so a body where that step changes something is read by
//! [`fields_as_sent`] instead: the same steps but that one, the escapes
//! decoded by servo's `percent-encoding`. The fuzz target `form_body`
//! checks that the two agree wherever the library's reading is exact.

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
    let mut fields: Vec<(Vec<u8>, Vec<u8>)> = form_urlencoded::parse(body)
        .map(|(name, value)| {
            (
                name.into_owned().into_bytes(),
                value.into_owned().into_bytes(),
            )
        })
        .collect();
    // U+FFFD where the body had other bytes: read it again, exactly.
    if fields.iter().any(|(n, v)| replaced(n) || replaced(v)) {
        fields = fields_as_sent(body);
    }
    // A stable sort keeps the order of one name's values.
    fields.sort_by(|a, b| a.0.cmp(&b.0));
    fields
}

/// The fields of a form body in the order sent, each name and value
/// decoded to bytes as [`canonical_fields`] describes, never lossily.
///
/// ```
/// use idem_http::form;
///
/// let fields = form::fields_as_sent(b"b=%ff&a=x+y");
/// assert_eq!(fields, [(b"b".to_vec(), vec![0xff]), (b"a".to_vec(), b"x y".to_vec())]);
/// ```
pub fn fields_as_sent(body: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    body.split(|&byte| byte == b'&')
        .filter(|sequence| !sequence.is_empty())
        .map(|sequence| {
            let (name, value) = match sequence.iter().position(|&byte| byte == b'=') {
                Some(at) => (&sequence[..at], &sequence[at + 1..]),
                None => (sequence, &[][..]),
            };
            (decode(name), decode(value))
        })
        .collect()
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

/// Percent-decodes one name or value, `+` as a space first (so `%2B` is
/// a plus), as the standard's parser does.
fn decode(text: &[u8]) -> Vec<u8> {
    let spaced: Vec<u8> = text
        .iter()
        .map(|&byte| if byte == b'+' { b' ' } else { byte })
        .collect();
    percent_encoding::percent_decode(&spaced).collect()
}

/// Whether a decoded name or value holds U+FFFD, which the library's
/// lossy step may have put there.
fn replaced(text: &[u8]) -> bool {
    text.windows(3)
        .any(|window| window == "\u{FFFD}".as_bytes())
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
        assert_ne!(canonical_fields(b"a=%ff"), canonical_fields(b"a=%fe"));
        assert_eq!(
            canonical_fields(b"b=%ef%bf%bd&a=%ff"),
            [
                (b"a".to_vec(), vec![0xff]),
                (b"b".to_vec(), "\u{FFFD}".into())
            ]
        );
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
