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
        let inner =
            Fingerprint::of_json(&json!({"b": 1, "a": [2]})).map_err(serde::ser::Error::custom)?;
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
