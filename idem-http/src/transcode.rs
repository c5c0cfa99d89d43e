//! A JSON body serialized straight from its bytes, for the canonical
//! fingerprint.
//!
//! [`Fingerprint::of_json`](idem_core::Fingerprint::of_json) writes any
//! `Serialize` value in canonical form. Parsing the body into a
//! `serde_json::Value` first, as the layer once did, allocates every string
//! and every object's map on each request, only to be walked once and
//! dropped: most of the fingerprint's cost. [`JsonText`] hands the parser's
//! events to the serializer as they come instead, so the only buffers are
//! the ones `of_json` keeps between calls. The serializer sees exactly the
//! calls it would see for the `Value` (the same number calls for the same
//! text, the same strings, the same nesting limit), so the digest is the
//! same, and text that is not JSON fails just as it did.

use std::cell::Cell;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{self, Serialize, SerializeMap, SerializeSeq, Serializer};

/// JSON text that serializes as the value it holds, parsed while it is
/// written. Serializing fails when the text is not one JSON value.
pub(crate) struct JsonText<'a>(pub(crate) &'a [u8]);

impl Serialize for JsonText<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut parser = serde_json::Deserializer::from_slice(self.0);
        let written = Pending::new(&mut parser).serialize(serializer)?;
        // Only whitespace may follow the value, as `from_slice` requires.
        parser.end().map_err(ser::Error::custom)?;
        Ok(written)
    }
}

/// One value still to be read from `D`, serialized as it is read. It can
/// be serialized once.
struct Pending<D>(Cell<Option<D>>);

impl<D> Pending<D> {
    fn new(parser: D) -> Pending<D> {
        Pending(Cell::new(Some(parser)))
    }
}

impl<'de, D: Deserializer<'de>> Serialize for Pending<D> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let parser = self
            .0
            .take()
            .ok_or_else(|| ser::Error::custom("a JSON value serialized twice"))?;
        match parser.deserialize_any(Forward(serializer)) {
            Ok(written) => written,
            Err(error) => Err(ser::Error::custom(error)),
        }
    }
}

/// Forwards each value the parser meets to the serializer. Its result is
/// the serializer's: the parser's own errors come out of `deserialize_any`.
struct Forward<S>(S);

impl<'de, S: Serializer> Visitor<'de> for Forward<S> {
    type Value = Result<S::Ok, S::Error>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(self.0.serialize_bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(self.0.serialize_i64(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(self.0.serialize_u64(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(self.0.serialize_f64(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.0.serialize_str(v))
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(self.0.serialize_unit())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = match self.0.serialize_seq(seq.size_hint()) {
            Ok(out) => out,
            Err(error) => return Ok(Err(error)),
        };
        while let Some(element) = seq.next_element_seed(Element(&mut out))? {
            if let Err(error) = element {
                return Ok(Err(error));
            }
        }
        Ok(out.end())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = match self.0.serialize_map(map.size_hint()) {
            Ok(out) => out,
            Err(error) => return Ok(Err(error)),
        };
        while let Some(key) = map.next_key_seed(Key(&mut out))? {
            if let Err(error) = key.and(map.next_value_seed(EntryValue(&mut out))?) {
                return Ok(Err(error));
            }
        }
        Ok(out.end())
    }
}

/// An array element, read and written.
struct Element<'a, T>(&'a mut T);

impl<'de, T: SerializeSeq> DeserializeSeed<'de> for Element<'_, T> {
    type Value = Result<(), T::Error>;

    fn deserialize<D: Deserializer<'de>>(self, parser: D) -> Result<Self::Value, D::Error> {
        Ok(self.0.serialize_element(&Pending::new(parser)))
    }
}

/// An object's key, read and written.
struct Key<'a, T>(&'a mut T);

impl<'de, T: SerializeMap> DeserializeSeed<'de> for Key<'_, T> {
    type Value = Result<(), T::Error>;

    fn deserialize<D: Deserializer<'de>>(self, parser: D) -> Result<Self::Value, D::Error> {
        Ok(self.0.serialize_key(&Pending::new(parser)))
    }
}

/// An object's value, read and written.
struct EntryValue<'a, T>(&'a mut T);

impl<'de, T: SerializeMap> DeserializeSeed<'de> for EntryValue<'_, T> {
    type Value = Result<(), T::Error>;

    fn deserialize<D: Deserializer<'de>>(self, parser: D) -> Result<Self::Value, D::Error> {
        Ok(self.0.serialize_value(&Pending::new(parser)))
    }
}

#[cfg(test)]
mod tests {
    use idem_core::Fingerprint;

    use super::JsonText;

    /// What the layer computed before: the body parsed into a `Value`.
    fn through_value(body: &[u8]) -> Option<Fingerprint> {
        let value = serde_json::from_slice::<serde_json::Value>(body).ok()?;
        Fingerprint::of_json(&value).ok()
    }

    fn direct(body: &[u8]) -> Option<Fingerprint> {
        Fingerprint::of_json(&JsonText(body)).ok()
    }

    #[test]
    fn gives_the_digest_of_the_parsed_value_for_every_kind_of_text() {
        let deep_ok = format!("{}{}", "[".repeat(127), "]".repeat(127));
        let too_deep = format!("{}{}", "[".repeat(129), "]".repeat(129));
        let bodies: Vec<&[u8]> = vec![
            br#"{"amount":1250,"currency":"EUR"}"#,
            br#"{ "currency" : "EUR", "amount": 1250 }"#,
            br#"{"b":{"d":[3,{"z":1,"a":2}],"c":null},"a":[true,false]}"#,
            br#"{"a":1,"a":2}"#,
            br#"{"b":1,"a":{"x":1,"x":[2]},"a":3}"#,
            br#"{"k\u0041":"v\n\u00e9","kA":1}"#,
            b"{\"\\\"\":1,\"\\\\\":2,\"\xc3\xa9\":3,\"e\":4}",
            br#"[1.0,1,-0,-0.0,1e3,1E-3,18446744073709551615,18446744073709551616,-9223372036854775808,-9223372036854775809,0.1,123456789.123456789]"#,
            br#""just a string""#,
            b"42",
            b"null",
            b"true",
            b"[]",
            b"{}",
            b"  {\"a\" :\t[ ] }\n",
            br#"{"a":[{},[],{"b":{}}]}"#,
            deep_ok.as_bytes(),
            too_deep.as_bytes(),
            b"",
            b"{",
            b"{\"a\":1}x",
            b"{\"a\":1} {}",
            b"[1,]",
            b"{\"a\":01}",
            b"\xff\xfe",
            b"\"\xc3\x28\"",
            b"1e400",
            b"[NaN]",
        ];
        for body in bodies {
            assert_eq!(
                direct(body),
                through_value(body),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn tells_different_documents_apart() {
        assert_ne!(direct(b"[1,2]"), direct(b"[2,1]"));
        assert_ne!(direct(br#"{"a":1}"#), direct(br#"{"a":"1"}"#));
        assert_eq!(direct(br#"{"a":1,"b":2}"#), direct(br#"{"b":2,"a":1}"#));
        assert!(direct(b"{not json").is_none());
    }
}
