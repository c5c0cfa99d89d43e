//! Fingerprints: SHA-256 of what a request means.

use std::fmt;
use std::io;

use serde::Serialize;
use serde_json::ser::{CharEscape, CompactFormatter, Formatter};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// A SHA-256 digest of a request, stored with its record and checked on
/// every hit: the same key with another fingerprint is a
/// [`Mismatch`](crate::Error::Mismatch).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// Hashes the canonical JSON form of `body`: object keys sorted at every
    /// depth, no whitespace. Field order and map iteration order never change
    /// the result.
    ///
    /// Fails only when `body` cannot be represented as JSON (for example a
    /// map whose keys are not strings or numbers).
    ///
    /// Most bodies are hashed in one pass: `body` is written as compact JSON
    /// while a check follows every object's keys, and when they come out
    /// already sorted (a struct whose fields are declared in name order, a
    /// `BTreeMap`, a `serde_json::Value`) those bytes *are* the canonical
    /// form. Anything else (keys out of order, a key that needs escaping or
    /// is not a string, `f32`, 128-bit integers, raw JSON) goes through
    /// [`serde_json::Value`], which sorts. Both paths give the same bytes for
    /// the same body; only the time differs.
    pub fn of_json<T: Serialize + ?Sized>(body: &T) -> Result<Fingerprint, serde_json::Error> {
        let mut canonical = Vec::with_capacity(256);
        if !write_if_sorted(&mut canonical, body) {
            canonical.clear();
            write_canonical(&mut canonical, &serde_json::to_value(body)?)?;
        }
        Ok(Fingerprint::of_bytes(&canonical))
    }

    /// Hashes raw bytes as they are.
    pub fn of_bytes(bytes: &[u8]) -> Fingerprint {
        Fingerprint(Sha256::digest(bytes).into())
    }

    /// Hashes several parts, each prefixed by its length, so that no two
    /// different part lists share a fingerprint (`["ab", "c"]` differs from
    /// `["a", "bc"]`). The HTTP layer uses method, path and query, content
    /// type and body.
    pub fn of_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> Fingerprint {
        let mut hasher = Sha256::new();
        for part in parts {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        Fingerprint(hasher.finalize().into())
    }

    /// Wraps a digest read back from a store.
    pub const fn from_bytes(bytes: [u8; 32]) -> Fingerprint {
        Fingerprint(bytes)
    }

    /// The 32 digest bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// Writes `body` as compact JSON into `out` and reports whether that is
/// its canonical form; `false` (with `out` holding a partial write) when
/// the sorting path must decide.
fn write_if_sorted<T: Serialize + ?Sized>(out: &mut Vec<u8>, body: &T) -> bool {
    let mut serializer = serde_json::Serializer::with_formatter(out, SortedKeys::default());
    body.serialize(&mut serializer).is_ok()
}

/// A compact JSON formatter that refuses, with an I/O error that stops the
/// write, anything whose bytes the sorting path would write differently:
/// an object key not strictly after the one before it at the same depth
/// (out of order or repeated), a key that needs escaping or is not a plain
/// string, and the values `serde_json::Value` would change (`f32` widens to
/// `f64`, 128-bit integers and raw JSON fragments).
#[derive(Default)]
struct SortedKeys {
    /// One entry per object depth ever reached, reused: whether the open
    /// object at that depth has a key yet, and its last key.
    last: Vec<(bool, Vec<u8>)>,
    /// How many objects are open.
    open: usize,
    /// The key being written, while `in_key`.
    key: Vec<u8>,
    in_key: bool,
}

fn unsorted() -> io::Error {
    io::Error::other("not in canonical order")
}

/// Compact output for a scalar, refused inside a key (the sorting path
/// writes non-string keys its own way).
macro_rules! scalar {
    ($($method:ident($($ty:ty)?)),* $(,)?) => {$(
        fn $method<W: ?Sized + io::Write>(&mut self, writer: &mut W $(, value: $ty)?) -> io::Result<()> {
            if self.in_key {
                return Err(unsorted());
            }
            CompactFormatter.$method(writer $(, value as $ty)?)
        }
    )*};
}

impl Formatter for SortedKeys {
    scalar!(
        write_null(),
        write_bool(bool),
        write_i8(i8),
        write_i16(i16),
        write_i32(i32),
        write_i64(i64),
        write_u8(u8),
        write_u16(u16),
        write_u32(u32),
        write_u64(u64),
        write_f64(f64),
    );

    fn write_f32<W: ?Sized + io::Write>(&mut self, _: &mut W, _: f32) -> io::Result<()> {
        Err(unsorted())
    }

    fn write_i128<W: ?Sized + io::Write>(&mut self, _: &mut W, _: i128) -> io::Result<()> {
        Err(unsorted())
    }

    fn write_u128<W: ?Sized + io::Write>(&mut self, _: &mut W, _: u128) -> io::Result<()> {
        Err(unsorted())
    }

    fn write_number_str<W: ?Sized + io::Write>(&mut self, _: &mut W, _: &str) -> io::Result<()> {
        Err(unsorted())
    }

    fn write_raw_fragment<W: ?Sized + io::Write>(&mut self, _: &mut W, _: &str) -> io::Result<()> {
        Err(unsorted())
    }

    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        if self.in_key {
            self.key.extend_from_slice(fragment.as_bytes());
        }
        writer.write_all(fragment.as_bytes())
    }

    fn write_char_escape<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        escape: CharEscape,
    ) -> io::Result<()> {
        if self.in_key {
            return Err(unsorted());
        }
        CompactFormatter.write_char_escape(writer, escape)
    }

    fn begin_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        match self.last.get_mut(self.open) {
            Some(depth) => depth.0 = false,
            None => self.last.push((false, Vec::new())),
        }
        self.open += 1;
        writer.write_all(b"{")
    }

    fn end_object<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.open -= 1;
        writer.write_all(b"}")
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.in_key = true;
        self.key.clear();
        CompactFormatter.begin_object_key(writer, first)
    }

    fn end_object_key<W: ?Sized + io::Write>(&mut self, _: &mut W) -> io::Result<()> {
        self.in_key = false;
        let Some((has_key, last)) = self.open.checked_sub(1).and_then(|d| self.last.get_mut(d))
        else {
            return Err(unsorted());
        };
        if *has_key && self.key <= *last {
            return Err(unsorted());
        }
        *has_key = true;
        std::mem::swap(last, &mut self.key);
        Ok(())
    }
}

/// The sorting path: `value` written compactly with every object's keys in
/// order.
fn write_canonical(out: &mut Vec<u8>, value: &Value) -> Result<(), serde_json::Error> {
    match value {
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(out, item)?;
            }
            out.push(b']');
        }
        Value::Object(map) => {
            // Sorted here rather than trusting the map type: serde_json's
            // `preserve_order` feature, enabled by any crate in a build,
            // would otherwise make the hash depend on insertion order.
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (name, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, name)?;
                out.push(b':');
                write_canonical(out, item)?;
            }
            out.push(b'}');
        }
        scalar => serde_json::to_writer(&mut *out, scalar)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn field_order_does_not_matter() {
        let a = json!({"amount": 1250, "currency": "EUR", "meta": {"x": 1, "y": [1, 2]}});
        let b: Value =
            serde_json::from_str(r#"{"meta":{"y":[1,2],"x":1},"currency":"EUR","amount":1250}"#)
                .unwrap();
        assert_eq!(
            Fingerprint::of_json(&a).unwrap(),
            Fingerprint::of_json(&b).unwrap()
        );
    }

    /// The canonical bytes are part of every stored record: a build that
    /// hashed them differently would turn every retry into a mismatch.
    #[test]
    fn the_canonical_form_is_fixed() {
        let body = json!({"meta": {"y": [1, 2], "x": 1}, "currency": "EUR", "amount": 1250});
        assert_eq!(
            Fingerprint::of_json(&body).unwrap().to_string(),
            // SHA-256 of {"amount":1250,"currency":"EUR","meta":{"x":1,"y":[1,2]}}
            "05d3297c747ab691339afab303027ab7445e4e87584b8fde9dec75778ac6179c"
        );
    }

    #[test]
    fn different_values_differ() {
        let a = Fingerprint::of_json(&json!({"amount": 1250})).unwrap();
        let b = Fingerprint::of_json(&json!({"amount": 1251})).unwrap();
        let c = Fingerprint::of_json(&json!({"amount": "1250"})).unwrap();
        assert_ne!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn parts_are_length_prefixed() {
        let a = Fingerprint::of_parts([&b"ab"[..], b"c"]);
        let b = Fingerprint::of_parts([&b"a"[..], b"bc"]);
        assert_ne!(a, b);
    }

    /// The sorting path alone: what every body's fingerprint must equal.
    fn sorted(body: &(impl Serialize + ?Sized)) -> Result<Fingerprint, serde_json::Error> {
        let mut canonical = Vec::new();
        write_canonical(&mut canonical, &serde_json::to_value(body)?)?;
        Ok(Fingerprint::of_bytes(&canonical))
    }

    fn one_pass(body: &(impl Serialize + ?Sized)) -> bool {
        write_if_sorted(&mut Vec::new(), body)
    }

    fn same_as_sorted(body: &(impl Serialize + ?Sized)) {
        match (Fingerprint::of_json(body), sorted(body)) {
            (Ok(a), Ok(b)) => assert_eq!(a, b),
            (Err(_), Err(_)) => {}
            (a, b) => panic!("paths disagree: {a:?} / {b:?}"),
        }
    }

    #[derive(Serialize)]
    struct InNameOrder {
        amount: u64,
        currency: &'static str,
        nested: Nested,
    }

    #[derive(Serialize)]
    struct Nested {
        x: f64,
        y: Vec<i64>,
    }

    #[derive(Serialize)]
    struct OutOfOrder {
        zeta: u8,
        alpha: Option<bool>,
        mid: (),
    }

    #[derive(Serialize)]
    enum Kind {
        Unit,
        Newtype(i32),
        Tuple(i32, String),
        Struct { b: u8, a: u8 },
    }

    /// A map that writes the same key twice: `Value` keeps the last.
    struct Repeated;

    impl Serialize for Repeated {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap;
            let mut map = s.serialize_map(Some(2))?;
            map.serialize_entry("a", &1)?;
            map.serialize_entry("a", &2)?;
            map.end()
        }
    }

    struct Bytes(&'static [u8]);

    impl Serialize for Bytes {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(self.0)
        }
    }

    #[test]
    fn sorted_bodies_take_one_pass_and_others_do_not() {
        let sorted_struct = InNameOrder {
            amount: 1250,
            currency: "EUR",
            nested: Nested {
                x: 0.5,
                y: vec![1, -2],
            },
        };
        assert!(one_pass(&sorted_struct));
        assert!(one_pass(
            &json!({"b": {"d": 1, "c": [{"z": 1, "a": 2}]}, "a": null})
        ));
        assert!(one_pass(&std::collections::BTreeMap::from([
            ("a", 1),
            ("b", 2)
        ])));
        assert!(!one_pass(&OutOfOrder {
            zeta: 1,
            alpha: None,
            mid: ()
        }));
        assert!(!one_pass(&json!({"a\"b": 1})), "an escaped key");
        assert!(
            !one_pass(&std::collections::BTreeMap::from([(1, 1)])),
            "an integer key"
        );
        assert!(!one_pass(&1.5f32));
        assert!(!one_pass(&Repeated));
    }

    #[test]
    fn both_paths_give_the_same_fingerprint() {
        same_as_sorted(&InNameOrder {
            amount: u64::MAX,
            currency: "€ \"quoted\" \n",
            nested: Nested {
                x: f64::NAN,
                y: vec![i64::MIN],
            },
        });
        same_as_sorted(&OutOfOrder {
            zeta: 1,
            alpha: Some(false),
            mid: (),
        });
        for kind in [
            Kind::Unit,
            Kind::Newtype(-1),
            Kind::Tuple(2, "t".into()),
            Kind::Struct { b: 1, a: 2 },
        ] {
            same_as_sorted(&kind);
        }
        same_as_sorted(&0.1f32);
        same_as_sorted(&[1.0f32, f32::INFINITY]);
        same_as_sorted(&1i128);
        same_as_sorted(&i128::MAX);
        same_as_sorted(&u128::MAX);
        same_as_sorted(&Repeated);
        same_as_sorted(&Bytes(b"\x00\xff"));
        same_as_sorted(&std::collections::BTreeMap::from([(2, "b"), (10, "a")]));
        same_as_sorted(&std::collections::BTreeMap::from([('b', 1), ('a', 2)]));
        same_as_sorted(&std::collections::BTreeMap::from([(true, 1)]));
        same_as_sorted(&std::collections::BTreeMap::from([("b\u{1}", 1), ("b", 2)]));
        same_as_sorted(&json!({"": {}, "a": [], "é": "", "\u{7f}": [{}]}));
    }

    fn any_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let key = prop_oneof!["[a-e]{0,3}", any::<String>(), Just("\"\\\n".to_owned())];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            any::<String>().prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::vec((key.clone(), inner), 0..6)
                    .prop_map(|entries| Value::Object(entries.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #[test]
        fn generated_values_hash_the_same_on_both_paths(value in any_json()) {
            proptest::prop_assert_eq!(Fingerprint::of_json(&value)?, sorted(&value)?);
        }

        #[test]
        fn generated_maps_hash_the_same_in_any_order(
            entries in proptest::collection::vec((any_key(), proptest::prelude::any::<i32>()), 0..12),
        ) {
            let hashed: std::collections::HashMap<_, _> = entries.iter().cloned().collect();
            let ordered: std::collections::BTreeMap<_, _> = entries.into_iter().collect();
            let expected = sorted(&ordered)?;
            proptest::prop_assert_eq!(Fingerprint::of_json(&hashed)?, expected);
            proptest::prop_assert_eq!(Fingerprint::of_json(&ordered)?, expected);
        }
    }

    fn any_key() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof!["[a-z]{0,4}", any::<String>()]
    }

    #[test]
    fn unrepresentable_body_is_an_error() {
        let mut map = std::collections::HashMap::new();
        map.insert((1, 2), 3);
        assert!(Fingerprint::of_json(&map).is_err());
    }
}
