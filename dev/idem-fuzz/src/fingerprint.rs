//! The fingerprint's canonical form: the one-pass writer against the
//! `serde_json::Value` path, and the canonical form against the value it
//! stands for.

use std::fmt;

use idem_core::Fingerprint;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, SerializeStruct, Serializer};
use serde_json::Value;

use crate::input::Reader;

/// JSON text. Input: a request body; bodies that are not JSON are skipped.
///
/// The body is fingerprinted as parsed into a `Value` and as written in
/// the order it was sent (duplicate keys kept, numbers as parsed): both
/// give the fingerprint of the `Value` path, and the canonical form parses
/// back to the body's value.
pub fn fingerprint_json(data: &[u8]) {
    let value: Value = match serde_json::from_slice(data) {
        Ok(value) => value,
        Err(_) => {
            assert!(serde_json::from_slice::<Written>(data).is_err());
            return;
        }
    };
    let written: Written = serde_json::from_slice(data).expect("parses as a Value");
    check(&value);
    check(&written);
    assert_eq!(
        Fingerprint::of_json(&written).expect("JSON text has a fingerprint"),
        Fingerprint::of_json(&value).expect("JSON text has a fingerprint"),
        "the body as sent and as parsed"
    );
}

/// Bodies JSON text cannot hold, built from the input's bytes: `f32`,
/// 128-bit integers, NaN and infinities, byte strings, integer, boolean and
/// escaped keys, structs whose fields are out of order, keys written
/// twice.
pub fn fingerprint_written(data: &[u8]) {
    let body = generate(&mut Reader(data), 0);
    check(&body);
}

/// JSON texts at the edges: numbers, escapes, unicode, duplicate keys,
/// nesting.
pub(crate) fn fingerprint_json_seeds() -> Vec<Vec<u8>> {
    [
        r#"{"amount":1250,"currency":"EUR","meta":{"y":[1,2],"x":1}}"#,
        r#"{"b":1,"a":2,"a":3}"#,
        r#"[-0,0,-0.0,0.0,1,1.0,1e0,1E+2,1e-7,1e400,-1e400,5e-324,1.7976931348623157e308]"#,
        r#"[18446744073709551615,18446744073709551616,-9223372036854775808,-9223372036854775809,123456789012345678901234567890]"#,
        r#"{"\u00e9":1,"é":2,"e\u0301":3,"\ud83d\ude00":4,"😀":5}"#,
        r#"{"a\"b":1,"a\\b":2,"a\nb":3,"\u0000":4,"\u007f":5,"\/":6}"#,
        r#"{"":{"":{"":[[],{},null,true,false]}}}"#,
        r#"[[[[[[[[[[[[[[[[[[[[{"z":{"y":{"x":"w"}}}]]]]]]]]]]]]]]]]]]]]"#,
        r#""\ud800""#,
        r#"{"k":"v" , "j" : [ 1 , 2 ] }"#,
        r#"0.1"#,
        r#"1.0000000000000002"#,
        r#"2.2250738585072014e-308"#,
    ]
    .iter()
    .map(|text| text.as_bytes().to_vec())
    .collect()
}

/// Byte strings for [`fingerprint_written`].
pub(crate) fn fingerprint_written_seeds() -> Vec<Vec<u8>> {
    (0u8..=40)
        .map(|i| {
            (0..64u8)
                .map(|j| i.wrapping_mul(37).wrapping_add(j.wrapping_mul(11)))
                .collect()
        })
        .collect()
}

/// The properties every body must have.
fn check<T: Serialize + ?Sized>(body: &T) {
    let hash = Fingerprint::of_json(body);
    let (one_pass, sorted) = idem_core::fuzzing::canonical_forms(body);
    let canonical = match (&hash, sorted) {
        (Ok(hash), Ok(canonical)) => {
            assert_eq!(*hash, Fingerprint::of_bytes(&canonical));
            canonical
        }
        (Err(a), Err(b)) => {
            assert_eq!(a.to_string(), b.to_string(), "both refuse the same way");
            assert!(one_pass.is_none(), "one pass wrote a body `Value` refuses");
            return;
        }
        (hash, sorted) => panic!("paths disagree: {hash:?} / {sorted:?}"),
    };
    if let Some(one_pass) = one_pass {
        assert_eq!(
            String::from_utf8_lossy(&one_pass),
            String::from_utf8_lossy(&canonical),
            "one pass and `Value` write the same bytes"
        );
    }
    // Injectivity: the canonical form parses back to the value it was
    // written from, so no two values share one.
    let value = serde_json::to_value(body).expect("the Value path took it");
    let back: Value = serde_json::from_slice(&canonical).expect("canonical JSON parses");
    assert_same(&value, &back);
}

/// `a` and `b` are the same JSON value, floats to the bit. serde_json's
/// parser may miss a float's last bits (exact parsing is its
/// `float_roundtrip` feature), so a float's text is checked to stand for
/// it exactly with the standard parser, and `b`'s to be within rounding.
fn assert_same(a: &Value, b: &Value) {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), x.is_f64(), y.is_f64()) {
            (Some(float), true, true) => {
                let text = serde_json::to_string(&float).expect("a finite float");
                let exact: f64 = text.parse().expect("a float's text");
                assert_eq!(float.to_bits(), exact.to_bits(), "{text}");
                let parsed = y.as_f64().expect("a float");
                assert!(
                    within_rounding(float, parsed),
                    "{float} read back as {parsed}"
                );
            }
            _ => assert_eq!(x, y),
        },
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len());
            x.iter().zip(y).for_each(|(x, y)| assert_same(x, y));
        }
        (Value::Object(x), Value::Object(y)) => {
            assert_eq!(x.len(), y.len());
            for (key, x) in x {
                assert_same(x, y.get(key).expect("every key read back"));
            }
        }
        _ => assert_eq!(a, b),
    }
}

/// Whether `parsed` is `float` up to the parser's rounding: within a
/// relative 1e-14, or a few units in the last place — the same thing for
/// normal floats, but a subnormal float's last place is worth more than
/// 1e-14 of it (one unit at 4.6e-310 is 1.1e-14 of the value).
fn within_rounding(float: f64, parsed: f64) -> bool {
    let same_sign = float.is_sign_negative() == parsed.is_sign_negative();
    float == parsed
        || ((float - parsed) / float).abs() < 1e-14
        || (same_sign && float.to_bits().abs_diff(parsed.to_bits()) <= 2)
}

/// A body written in the order it was built, duplicate keys and all.
#[derive(Debug)]
enum Written {
    Null,
    Bool(bool),
    U64(u64),
    I64(i64),
    F64(f64),
    F32(f32),
    I128(i128),
    U128(u128),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<Written>),
    Map(Vec<(Key, Written)>),
    /// A struct with fields from [`FIELDS`], in the order given.
    Struct(Vec<(&'static str, Written)>),
}

#[derive(Debug)]
enum Key {
    Str(String),
    I64(i64),
    U64(u64),
    Bool(bool),
    Char(char),
}

const FIELDS: [&str; 8] = ["a", "b", "zeta", "alpha", "", "é", "a\"b", "a\u{1}"];

impl Serialize for Key {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Key::Str(key) => s.serialize_str(key),
            Key::I64(key) => s.serialize_i64(*key),
            Key::U64(key) => s.serialize_u64(*key),
            Key::Bool(key) => s.serialize_bool(*key),
            Key::Char(key) => s.serialize_char(*key),
        }
    }
}

impl Serialize for Written {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Written::Null => s.serialize_unit(),
            Written::Bool(v) => s.serialize_bool(*v),
            Written::U64(v) => s.serialize_u64(*v),
            Written::I64(v) => s.serialize_i64(*v),
            Written::F64(v) => s.serialize_f64(*v),
            Written::F32(v) => s.serialize_f32(*v),
            Written::I128(v) => s.serialize_i128(*v),
            Written::U128(v) => s.serialize_u128(*v),
            Written::Str(v) => s.serialize_str(v),
            Written::Bytes(v) => s.serialize_bytes(v),
            Written::List(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                items
                    .iter()
                    .try_for_each(|item| seq.serialize_element(item))?;
                seq.end()
            }
            Written::Map(entries) => {
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (key, value) in entries {
                    map.serialize_entry(key, value)?;
                }
                map.end()
            }
            Written::Struct(fields) => {
                let mut fields_out = s.serialize_struct("Written", fields.len())?;
                for (name, value) in fields {
                    fields_out.serialize_field(name, value)?;
                }
                fields_out.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Written {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Written, D::Error> {
        d.deserialize_any(WrittenVisitor)
    }
}

struct WrittenVisitor;

impl<'de> Visitor<'de> for WrittenVisitor {
    type Value = Written;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JSON")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Written, E> {
        Ok(Written::Null)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Written, E> {
        Ok(Written::Bool(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Written, E> {
        Ok(Written::U64(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Written, E> {
        Ok(Written::I64(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Written, E> {
        Ok(Written::F64(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Written, E> {
        Ok(Written::Str(v.to_owned()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Written, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Written::List(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Written, A::Error> {
        let mut entries = Vec::new();
        while let Some((key, value)) = map.next_entry::<String, Written>()? {
            entries.push((Key::Str(key), value));
        }
        Ok(Written::Map(entries))
    }
}

/// Deep enough for every path; shallow enough for any thread's stack.
const MAX_DEPTH: usize = 24;

fn generate(input: &mut Reader<'_>, depth: usize) -> Written {
    let Some(kind) = input.u8() else {
        return Written::Null;
    };
    let leaf = depth >= MAX_DEPTH;
    match kind % 16 {
        0 => Written::Null,
        1 => Written::Bool(kind & 0x10 != 0),
        2 => Written::U64(input.u64().unwrap_or(u64::MAX)),
        3 => Written::I64(input.i64().unwrap_or(i64::MIN)),
        4 => Written::F64(f64::from_bits(input.u64().unwrap_or(0x8000_0000_0000_0000))),
        5 => Written::F32(f32::from_bits(
            input
                .take(4)
                .map_or(0, |b| u32::from_be_bytes(b.try_into().expect("4"))),
        )),
        6 => Written::I128(i128::from(input.i64().unwrap_or(0)) << (kind >> 4)),
        7 => Written::U128(u128::from(input.u64().unwrap_or(0)) << (kind >> 3)),
        8 => Written::Str(string(input)),
        9 => Written::Bytes(input.short().unwrap_or_default().to_vec()),
        10 | 11 if !leaf => {
            let len = input.u8().unwrap_or(0) % 8;
            Written::List((0..len).map(|_| generate(input, depth + 1)).collect())
        }
        12 | 13 if !leaf => {
            let len = input.u8().unwrap_or(0) % 8;
            let entries = (0..len)
                .map(|_| {
                    let key = match input.u8().unwrap_or(0) % 8 {
                        0 => Key::I64(input.i64().unwrap_or(-1)),
                        1 => Key::U64(input.u64().unwrap_or(u64::MAX)),
                        2 => Key::Bool(input.u8().unwrap_or(0) % 2 == 1),
                        3 => Key::Char(
                            char::from_u32(input.u16().unwrap_or(0).into()).unwrap_or('\u{fffd}'),
                        ),
                        _ => Key::Str(string(input)),
                    };
                    (key, generate(input, depth + 1))
                })
                .collect();
            Written::Map(entries)
        }
        14 | 15 if !leaf => {
            let len = input.u8().unwrap_or(0) % 6;
            let fields = (0..len)
                .map(|_| {
                    let name = FIELDS[usize::from(input.u8().unwrap_or(0)) % FIELDS.len()];
                    (name, generate(input, depth + 1))
                })
                .collect();
            Written::Struct(fields)
        }
        _ => Written::Str(String::new()),
    }
}

/// A short string: mostly a few letters, so that keys collide and sort,
/// sometimes any bytes read as UTF-8.
fn string(input: &mut Reader<'_>) -> String {
    let Some(bytes) = input.short() else {
        return String::new();
    };
    match bytes.first() {
        Some(&first) if first % 4 != 0 => bytes[1..]
            .iter()
            .map(|b| char::from(b'a' + b % 4))
            .collect(),
        _ => String::from_utf8_lossy(bytes).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_judged_in_units_of_the_last_place_for_subnormals() {
        // A subnormal one unit apart: more than 1e-14 relative, still rounding.
        let float = 4.637_922_693_526_5e-310_f64;
        let next = f64::from_bits(float.to_bits() + 1);
        assert!(((float - next) / float).abs() > 1e-14);
        assert!(within_rounding(float, next));
        assert!(within_rounding(1.0, 1.0 + f64::EPSILON));
        assert!(!within_rounding(float, f64::from_bits(float.to_bits() + 3)));
        assert!(!within_rounding(1.0, 1.0001));
        assert!(!within_rounding(5e-324, -5e-324));
    }
}
