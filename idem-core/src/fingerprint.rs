//! Fingerprints: SHA-256 of what a request means.

use std::cell::RefCell;
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
    /// Most bodies are written in their canonical form in one pass: compact
    /// JSON, with each object whose keys come out of order (a struct's
    /// fields, a `HashMap`) rewritten in key order as it closes. A body
    /// with a key that needs escaping or is not a string, a key written
    /// twice, an `f32`, a 128-bit integer or raw JSON goes through
    /// [`serde_json::Value`] instead. Both paths give the same bytes for the
    /// same body; only the time differs.
    pub fn of_json<T: Serialize + ?Sized>(body: &T) -> Result<Fingerprint, serde_json::Error> {
        BUFFERS.with(|buffers| match buffers.try_borrow_mut() {
            Ok(mut buffers) => buffers.fingerprint(body),
            // A body whose `Serialize` fingerprints another body.
            Err(_) => Buffers::default().fingerprint(body),
        })
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

thread_local! {
    /// Each thread's buffers for [`Fingerprint::of_json`], kept between
    /// calls so that hashing a body allocates nothing once they have grown.
    static BUFFERS: RefCell<Buffers> = RefCell::new(Buffers::default());
}

/// Buffers larger than this are let go after the call that grew them.
const KEPT_BYTES: usize = 64 * 1024;

#[derive(Default)]
struct Buffers {
    /// The canonical form.
    out: Vec<u8>,
    /// The open objects, outermost first.
    objects: Vec<Object>,
    /// The entries of the open objects, each object's after its parent's.
    entries: Vec<Entry>,
    /// An object's entries in key order, each with where it ends.
    order: Vec<(Entry, usize)>,
    /// Room to rewrite an object in order.
    scratch: Vec<u8>,
}

impl Buffers {
    fn fingerprint<T: Serialize + ?Sized>(
        &mut self,
        body: &T,
    ) -> Result<Fingerprint, serde_json::Error> {
        if !self.write_in_one_pass(body) {
            self.out.clear();
            write_canonical(&mut self.out, &serde_json::to_value(body)?)?;
        }
        let fingerprint = Fingerprint::of_bytes(&self.out);
        if self.out.capacity() > KEPT_BYTES || self.scratch.capacity() > KEPT_BYTES {
            *self = Buffers::default();
        }
        Ok(fingerprint)
    }

    /// Writes the canonical form of `body` into `out` in one pass and
    /// reports whether it could; `false` (with `out` holding a partial
    /// write) when the `serde_json::Value` path must decide.
    fn write_in_one_pass<T: Serialize + ?Sized>(&mut self, body: &T) -> bool {
        self.out.clear();
        self.objects.clear();
        self.entries.clear();
        let mut canonical = Canonical {
            buffers: self,
            in_key: false,
        };
        // Every byte goes to `out` through the formatter; the serializer's
        // own writer is never written to.
        let mut serializer = serde_json::Serializer::with_formatter(io::sink(), &mut canonical);
        body.serialize(&mut serializer).is_ok()
    }
}

/// A compact JSON formatter that writes the canonical form itself: each
/// object's entries are noted as they are written, and an object whose
/// keys came out of order is rewritten in order once it closes (its nested
/// objects already canonical). It refuses, with an I/O error that stops
/// the write, whatever the `Value` path would write differently or reject:
/// a key written twice in one object, a key that needs escaping or is not
/// a plain string, and the values `Value` changes (`f32` widens to `f64`,
/// 128-bit integers, raw JSON fragments).
struct Canonical<'a> {
    buffers: &'a mut Buffers,
    in_key: bool,
}

struct Object {
    /// Its first entry in `entries`.
    first: usize,
    /// Whether its keys came in strictly increasing order so far.
    sorted: bool,
}

/// `"key":value` in `out`: from its opening quote; its key's bytes are
/// `start + 1 .. key_end`.
#[derive(Clone, Copy)]
struct Entry {
    start: usize,
    key_end: usize,
}

fn refused() -> io::Error {
    io::Error::other("not written in one pass")
}

impl Buffers {
    fn key(&self, entry: Entry) -> &[u8] {
        key(&self.out, entry)
    }

    /// Rewrites the entries of the object that just closed in key order,
    /// or refuses a key written twice.
    fn sort_entries(&mut self, first: usize) -> io::Result<()> {
        let Buffers {
            out,
            entries,
            order,
            scratch,
            ..
        } = self;
        let entries = &entries[first..];
        let Some(content) = entries.first().map(|entry| entry.start) else {
            return Ok(());
        };
        order.clear();
        order.extend(entries.iter().enumerate().map(|(i, &entry)| {
            // Each entry ends at the comma before the next, or at the end
            // of the object's content.
            let end = entries.get(i + 1).map_or(out.len(), |next| next.start - 1);
            (entry, end)
        }));
        order.sort_unstable_by(|a, b| key(out, a.0).cmp(key(out, b.0)));
        if order
            .windows(2)
            .any(|w| key(out, w[0].0) == key(out, w[1].0))
        {
            return Err(refused());
        }
        scratch.clear();
        for (i, &(entry, end)) in order.iter().enumerate() {
            if i > 0 {
                scratch.push(b',');
            }
            scratch.extend_from_slice(&out[entry.start..end]);
        }
        out.truncate(content);
        out.extend_from_slice(scratch);
        Ok(())
    }
}

fn key(out: &[u8], entry: Entry) -> &[u8] {
    &out[entry.start + 1..entry.key_end]
}

/// Compact output for a scalar, refused inside a key (the `Value` path
/// writes non-string keys its own way).
macro_rules! scalar {
    ($($method:ident($($ty:ty)?)),* $(,)?) => {$(
        fn $method<W: ?Sized + io::Write>(&mut self, _: &mut W $(, value: $ty)?) -> io::Result<()> {
            if self.in_key {
                return Err(refused());
            }
            CompactFormatter.$method(&mut self.buffers.out $(, value as $ty)?)
        }
    )*};
}

/// Refused wherever it comes.
macro_rules! refuse {
    ($($method:ident($ty:ty)),* $(,)?) => {$(
        fn $method<W: ?Sized + io::Write>(&mut self, _: &mut W, _: $ty) -> io::Result<()> {
            Err(refused())
        }
    )*};
}

/// Written as they are.
macro_rules! punctuation {
    ($($method:ident($($first:ident)?) => $bytes:expr),* $(,)?) => {$(
        fn $method<W: ?Sized + io::Write>(&mut self, _: &mut W $(, $first: bool)?) -> io::Result<()> {
            self.buffers.out.extend_from_slice($bytes);
            Ok(())
        }
    )*};
}

impl Formatter for &mut Canonical<'_> {
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

    refuse!(
        write_f32(f32),
        write_i128(i128),
        write_u128(u128),
        write_number_str(&str),
        write_raw_fragment(&str),
    );

    punctuation!(
        begin_string() => b"\"",
        end_string() => b"\"",
        begin_array() => b"[",
        end_array() => b"]",
        begin_array_value(first) => if first { b"" } else { b"," },
        end_array_value() => b"",
        begin_object_value() => b":",
        end_object_value() => b"",
    );

    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        _: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        self.buffers.out.extend_from_slice(fragment.as_bytes());
        Ok(())
    }

    fn write_char_escape<W: ?Sized + io::Write>(
        &mut self,
        _: &mut W,
        escape: CharEscape,
    ) -> io::Result<()> {
        if self.in_key {
            // Escaped bytes sort differently from the characters they stand
            // for.
            return Err(refused());
        }
        CompactFormatter.write_char_escape(&mut self.buffers.out, escape)
    }

    fn begin_object<W: ?Sized + io::Write>(&mut self, _: &mut W) -> io::Result<()> {
        self.buffers.objects.push(Object {
            first: self.buffers.entries.len(),
            sorted: true,
        });
        self.buffers.out.push(b'{');
        Ok(())
    }

    fn end_object<W: ?Sized + io::Write>(&mut self, _: &mut W) -> io::Result<()> {
        let object = self.buffers.objects.pop().ok_or_else(refused)?;
        if !object.sorted {
            self.buffers.sort_entries(object.first)?;
        }
        self.buffers.entries.truncate(object.first);
        self.buffers.out.push(b'}');
        Ok(())
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        _: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if !first {
            self.buffers.out.push(b',');
        }
        self.in_key = true;
        self.buffers.entries.push(Entry {
            start: self.buffers.out.len(),
            key_end: 0,
        });
        Ok(())
    }

    fn end_object_key<W: ?Sized + io::Write>(&mut self, _: &mut W) -> io::Result<()> {
        self.in_key = false;
        let object = self.buffers.objects.last().ok_or_else(refused)?;
        let index = self.buffers.entries.len() - 1;
        // The key's bytes end before its closing quote.
        self.buffers.entries[index].key_end = self.buffers.out.len() - 1;
        if object.sorted && index > object.first {
            let (last, this) = (self.buffers.entries[index - 1], self.buffers.entries[index]);
            match self.buffers.key(this).cmp(self.buffers.key(last)) {
                std::cmp::Ordering::Greater => {}
                std::cmp::Ordering::Equal => return Err(refused()),
                std::cmp::Ordering::Less => {
                    if let Some(object) = self.buffers.objects.last_mut() {
                        object.sorted = false;
                    }
                }
            }
        }
        Ok(())
    }
}

/// The canonical bytes of `body` on each path: the one pass's when it
/// takes `body`, and the `Value` path's. For the fuzz targets.
#[cfg(feature = "fuzzing")]
pub fn canonical_forms<T: Serialize + ?Sized>(
    body: &T,
) -> (Option<Vec<u8>>, Result<Vec<u8>, serde_json::Error>) {
    let mut buffers = Buffers::default();
    let one_pass = buffers.write_in_one_pass(body).then_some(buffers.out);
    let mut sorted = Vec::new();
    let sorted = serde_json::to_value(body)
        .and_then(|value| write_canonical(&mut sorted, &value))
        .map(|()| sorted);
    (one_pass, sorted)
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
        Buffers::default().write_in_one_pass(body)
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

    /// A body whose serialization fingerprints another body, on the same
    /// thread, while the outer call holds that thread's buffers.
    struct Reentrant;

    impl Serialize for Reentrant {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let inner = Fingerprint::of_json(&json!({"b": 1, "a": [2]}))
                .map_err(serde::ser::Error::custom)?;
            s.collect_str(&inner)
        }
    }

    impl Serialize for Bytes {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(self.0)
        }
    }

    #[test]
    fn plain_bodies_take_one_pass_and_others_do_not() {
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
        assert!(one_pass(&OutOfOrder {
            zeta: 1,
            alpha: None,
            mid: ()
        }));
        assert!(one_pass(&std::collections::HashMap::from([
            ("b", json!({"y": 1, "x": [{"q": 1, "p": 2}]})),
            ("a", json!(null)),
            ("c", json!([])),
        ])));
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
        same_as_sorted(&vec![Reentrant, Reentrant]);
        // Larger than the buffers a thread keeps, then small again.
        same_as_sorted(&json!({"z": "x".repeat(KEPT_BYTES * 2), "a": 1}));
        same_as_sorted(&OutOfOrder {
            zeta: 2,
            alpha: None,
            mid: (),
        });
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
        fn objects_written_in_any_order_hash_the_same_on_both_paths(body in any_written()) {
            match (Fingerprint::of_json(&body), sorted(&body)) {
                (Ok(a), Ok(b)) => proptest::prop_assert_eq!(a, b),
                (Err(_), Err(_)) => {}
                (a, b) => proptest::prop_assert!(false, "paths disagree: {:?} / {:?}", a, b),
            }
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

    /// An object written in the order it was built, at every depth.
    #[derive(Debug, Clone)]
    enum Written {
        Leaf(Value),
        List(Vec<Written>),
        Object(Vec<(String, Written)>),
    }

    impl Serialize for Written {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::{SerializeMap, SerializeSeq};
            match self {
                Written::Leaf(value) => value.serialize(s),
                Written::List(items) => {
                    let mut seq = s.serialize_seq(Some(items.len()))?;
                    items
                        .iter()
                        .try_for_each(|item| seq.serialize_element(item))?;
                    seq.end()
                }
                Written::Object(entries) => {
                    let mut map = s.serialize_map(Some(entries.len()))?;
                    for (key, value) in entries {
                        map.serialize_entry(key, value)?;
                    }
                    map.end()
                }
            }
        }
    }

    fn any_written() -> impl proptest::strategy::Strategy<Value = Written> {
        use proptest::prelude::*;
        let key = prop_oneof![6 => "[a-d]{0,2}", 1 => any::<String>()];
        any_json()
            .prop_map(Written::Leaf)
            .prop_recursive(4, 48, 6, move |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..5).prop_map(Written::List),
                    proptest::collection::vec((key.clone(), inner), 0..7).prop_map(Written::Object),
                ]
            })
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
