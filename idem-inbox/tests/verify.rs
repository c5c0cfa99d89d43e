//! Each verification scheme against its provider's published vectors, and
//! against forged, altered, stale and malformed deliveries.

use std::time::Duration;

use http::{HeaderMap, HeaderValue};
use idem_inbox::verify::{
    Clock, GitHub, SecretError, SecretHeader, StandardWebhooks, Stripe, Verifier, VerifyError,
};

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(*name, HeaderValue::from_str(value).unwrap());
    }
    map
}

// The Standard Webhooks reference libraries' signing vector.
const SW_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const SW_ID: &str = "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk";
const SW_TS: i64 = 1_649_367_553;
const SW_BODY: &[u8] = br#"{"email":"test@example.com","username":"test_user"}"#;
const SW_SIGNATURE: &str = "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=";

fn standard() -> StandardWebhooks {
    StandardWebhooks::new([SW_SECRET])
        .unwrap()
        .with_clock(Clock::fixed(SW_TS))
}

fn sw_headers(id: &str, ts: i64, signature: &str) -> HeaderMap {
    headers(&[
        ("webhook-id", id),
        ("webhook-timestamp", &ts.to_string()),
        ("webhook-signature", signature),
    ])
}

#[test]
fn standard_webhooks_signs_the_reference_vector() {
    assert_eq!(standard().sign(SW_ID, SW_TS, SW_BODY), SW_SIGNATURE);
}

#[test]
fn standard_webhooks_accepts_the_reference_vector_and_names_the_event() {
    let verified = standard()
        .verify(&sw_headers(SW_ID, SW_TS, SW_SIGNATURE), SW_BODY)
        .unwrap();
    assert_eq!(verified.event_id.as_deref(), Some(SW_ID));
    assert_eq!(verified.timestamp, Some(SW_TS));
}

#[test]
fn standard_webhooks_accepts_a_bare_base64_secret() {
    let verifier = StandardWebhooks::new(["C2FVsBQIhrscChlQIMV+b5sSYspob7oD"])
        .unwrap()
        .with_clock(Clock::fixed(SW_TS));
    verifier
        .verify(&sw_headers(SW_ID, SW_TS, SW_SIGNATURE), SW_BODY)
        .unwrap();
}

#[test]
fn standard_webhooks_accepts_one_matching_signature_among_several() {
    // The reference libraries' multi-signature case: the match is third.
    let header = format!(
        "v1,tFtCZ5RDCPxzWQRWXWPgrCgE2frDBe9gjpbWQxnVfsQ= v1,Mm7xgUVICxZfQ3bgf0h0Dof65L/IFx+PnZvnDWPCX6Q= {SW_SIGNATURE} v1,9DfC1c3eeOrXB6w/5dIDydLNQaEyww5KalE5jLBZucE="
    );
    standard()
        .verify(&sw_headers(SW_ID, SW_TS, &header), SW_BODY)
        .unwrap();
    let without = "v1,tFtCZ5RDCPxzWQRWXWPgrCgE2frDBe9gjpbWQxnVfsQ= v1,Mm7xgUVICxZfQ3bgf0h0Dof65L/IFx+PnZvnDWPCX6Q=";
    assert_eq!(
        standard().verify(&sw_headers(SW_ID, SW_TS, without), SW_BODY),
        Err(VerifyError::SignatureMismatch)
    );
}

#[test]
fn standard_webhooks_skips_other_versions_beside_v1() {
    let header = format!("v1a,c29tZXRoaW5nIGVsc2U= {SW_SIGNATURE}");
    standard()
        .verify(&sw_headers(SW_ID, SW_TS, &header), SW_BODY)
        .unwrap();
    assert!(matches!(
        standard().verify(&sw_headers(SW_ID, SW_TS, "v1a,c29tZQ=="), SW_BODY),
        Err(VerifyError::MalformedHeader { .. })
    ));
}

#[test]
fn standard_webhooks_accepts_every_secret_during_rotation() {
    let new_secret = "whsec_bmV3IHNlY3JldCBmb3Igcm90YXRpb24=";
    let old_only = StandardWebhooks::new([SW_SECRET]).unwrap();
    let new_only = StandardWebhooks::new([new_secret]).unwrap();
    let both = StandardWebhooks::new([new_secret, SW_SECRET])
        .unwrap()
        .with_clock(Clock::fixed(SW_TS));
    for signer in [&old_only, &new_only] {
        let sig = signer.sign(SW_ID, SW_TS, SW_BODY);
        both.verify(&sw_headers(SW_ID, SW_TS, &sig), SW_BODY)
            .unwrap();
    }
    let new_sig = new_only.sign(SW_ID, SW_TS, SW_BODY);
    assert_eq!(
        standard().verify(&sw_headers(SW_ID, SW_TS, &new_sig), SW_BODY),
        Err(VerifyError::SignatureMismatch)
    );
}

#[test]
fn standard_webhooks_rejects_a_tampered_body_id_or_timestamp() {
    let v = standard();
    let tampered = br#"{"email":"test@example.com","username":"test_usex"}"#;
    assert_eq!(
        v.verify(&sw_headers(SW_ID, SW_TS, SW_SIGNATURE), tampered),
        Err(VerifyError::SignatureMismatch)
    );
    assert_eq!(
        v.verify(&sw_headers("msg_other", SW_TS, SW_SIGNATURE), SW_BODY),
        Err(VerifyError::SignatureMismatch)
    );
    assert_eq!(
        v.verify(&sw_headers(SW_ID, SW_TS + 1, SW_SIGNATURE), SW_BODY),
        Err(VerifyError::SignatureMismatch)
    );
}

#[test]
fn standard_webhooks_rejects_re_serialised_json() {
    // The same JSON value, pretty-printed: not the bytes that were signed.
    let value: serde_json::Value = serde_json::from_slice(SW_BODY).unwrap();
    let pretty = serde_json::to_vec_pretty(&value).unwrap();
    assert_eq!(
        standard().verify(&sw_headers(SW_ID, SW_TS, SW_SIGNATURE), &pretty),
        Err(VerifyError::SignatureMismatch)
    );
}

#[test]
fn standard_webhooks_rejects_a_wrong_secret() {
    let wrong = StandardWebhooks::new(["whsec_d3Jvbmcgc2VjcmV0"])
        .unwrap()
        .with_clock(Clock::fixed(SW_TS));
    assert_eq!(
        wrong.verify(&sw_headers(SW_ID, SW_TS, SW_SIGNATURE), SW_BODY),
        Err(VerifyError::SignatureMismatch)
    );
}

#[test]
fn standard_webhooks_enforces_the_tolerance_both_ways() {
    let at = |now: i64| {
        StandardWebhooks::new([SW_SECRET])
            .unwrap()
            .with_clock(Clock::fixed(now))
            .verify(&sw_headers(SW_ID, SW_TS, SW_SIGNATURE), SW_BODY)
    };
    assert!(at(SW_TS + 300).is_ok());
    assert!(at(SW_TS - 300).is_ok());
    assert_eq!(
        at(SW_TS + 301),
        Err(VerifyError::TimestampTooOld { age_secs: 301 })
    );
    assert_eq!(
        at(SW_TS - 301),
        Err(VerifyError::TimestampInFuture { ahead_secs: 301 })
    );
    let narrow = StandardWebhooks::new([SW_SECRET])
        .unwrap()
        .with_tolerance(Duration::from_secs(10))
        .with_clock(Clock::fixed(SW_TS + 11));
    assert_eq!(
        narrow.verify(&sw_headers(SW_ID, SW_TS, SW_SIGNATURE), SW_BODY),
        Err(VerifyError::TimestampTooOld { age_secs: 11 })
    );
}

#[test]
fn standard_webhooks_names_missing_duplicated_and_malformed_headers() {
    let v = standard();
    let full = sw_headers(SW_ID, SW_TS, SW_SIGNATURE);
    for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
        let mut missing = full.clone();
        missing.remove(name);
        assert_eq!(
            v.verify(&missing, SW_BODY),
            Err(VerifyError::MissingHeader(name))
        );
        let mut doubled = full.clone();
        doubled.append(name, full.get(name).unwrap().clone());
        assert_eq!(
            v.verify(&doubled, SW_BODY),
            Err(VerifyError::DuplicateHeader(name))
        );
    }
    for (name, value) in [
        ("webhook-timestamp", "soon"),
        ("webhook-timestamp", "-5"),
        ("webhook-timestamp", "99999999999999999999999"),
        (
            "webhook-signature",
            "tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=",
        ),
        ("webhook-signature", ""),
        ("webhook-id", ""),
    ] {
        let mut bad = full.clone();
        bad.insert(name, HeaderValue::from_str(value).unwrap());
        assert!(
            matches!(v.verify(&bad, SW_BODY), Err(VerifyError::MalformedHeader { header, .. }) if header == name),
            "{name}: {value}"
        );
    }
    // A v1 entry that is not base64 matches nothing, and says so.
    assert_eq!(
        v.verify(&sw_headers(SW_ID, SW_TS, "v1,%%%"), SW_BODY),
        Err(VerifyError::SignatureMismatch)
    );
    let mut opaque = full.clone();
    opaque.insert("webhook-id", HeaderValue::from_bytes(b"\xff\xfe").unwrap());
    assert!(matches!(
        v.verify(&opaque, SW_BODY),
        Err(VerifyError::MalformedHeader {
            header: "webhook-id",
            ..
        })
    ));
}

#[test]
fn bad_secrets_are_typed_errors() {
    assert_eq!(
        StandardWebhooks::new(["whsec_not base64!"]).unwrap_err(),
        SecretError::NotBase64
    );
    assert_eq!(
        StandardWebhooks::new(Vec::<String>::new()).unwrap_err(),
        SecretError::None
    );
    assert_eq!(Stripe::new([""]).unwrap_err(), SecretError::Empty);
    assert!(GitHub::new(["whsec_"]).is_ok());
    assert_eq!(
        StandardWebhooks::new(["whsec_"]).unwrap_err(),
        SecretError::Empty
    );
}

#[test]
fn secrets_stay_out_of_debug_output() {
    let text = format!("{:?}", StandardWebhooks::new([SW_SECRET]).unwrap());
    assert!(!text.contains("C2FVsBQ"), "{text}");
    let text = format!("{:?}", GitHub::new(["It's a Secret to Everybody"]).unwrap());
    assert!(!text.contains("Secret to"), "{text}");
}

// GitHub's documented example: secret, payload and expected signature.
const GH_SECRET: &str = "It's a Secret to Everybody";
const GH_BODY: &[u8] = b"Hello, World!";
const GH_SIGNATURE: &str =
    "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

#[test]
fn github_signs_and_accepts_its_documented_example() {
    let v = GitHub::new([GH_SECRET]).unwrap();
    assert_eq!(v.sign(GH_BODY), GH_SIGNATURE);
    let verified = v
        .verify(
            &headers(&[
                ("x-hub-signature-256", GH_SIGNATURE),
                ("x-github-delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
            ]),
            GH_BODY,
        )
        .unwrap();
    assert_eq!(
        verified.event_id.as_deref(),
        Some("72d3162e-cc78-11e3-81ab-4c9367dc0958")
    );
    let no_delivery = v
        .verify(&headers(&[("x-hub-signature-256", GH_SIGNATURE)]), GH_BODY)
        .unwrap();
    assert_eq!(no_delivery.event_id, None);
}

#[test]
fn github_rejects_forgeries_and_malformed_headers() {
    let v = GitHub::new([GH_SECRET]).unwrap();
    let sig = headers(&[("x-hub-signature-256", GH_SIGNATURE)]);
    assert_eq!(
        v.verify(&sig, b"Hello, World?"),
        Err(VerifyError::SignatureMismatch)
    );
    assert_eq!(
        GitHub::new(["another secret"])
            .unwrap()
            .verify(&sig, GH_BODY),
        Err(VerifyError::SignatureMismatch)
    );
    assert_eq!(
        v.verify(&HeaderMap::new(), GH_BODY),
        Err(VerifyError::MissingHeader("x-hub-signature-256"))
    );
    let mut doubled = sig.clone();
    doubled.append(
        "x-hub-signature-256",
        HeaderValue::from_static(GH_SIGNATURE),
    );
    assert_eq!(
        v.verify(&doubled, GH_BODY),
        Err(VerifyError::DuplicateHeader("x-hub-signature-256"))
    );
    for bad in [
        "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
        "sha1=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
        "sha256=not-hex",
    ] {
        assert!(matches!(
            v.verify(&headers(&[("x-hub-signature-256", bad)]), GH_BODY),
            Err(VerifyError::MalformedHeader { .. })
        ));
    }
    // A truncated signature is a mismatch, not a prefix match.
    assert_eq!(
        v.verify(
            &headers(&[("x-hub-signature-256", &GH_SIGNATURE[..39])]),
            GH_BODY
        ),
        Err(VerifyError::SignatureMismatch)
    );
}

// A Stripe delivery built from its documented algorithm:
// hex(HMAC-SHA256(secret, "{t}.{body}")), header `t=…,v1=…`.
const STRIPE_SECRET: &str = "whsec_test_secret";
const STRIPE_T: i64 = 1_700_000_000;
const STRIPE_BODY: &[u8] = br#"{"id":"evt_1","object":"event","type":"charge.succeeded"}"#;

fn stripe() -> Stripe {
    Stripe::new([STRIPE_SECRET])
        .unwrap()
        .with_clock(Clock::fixed(STRIPE_T + 10))
}

fn stripe_v1(secret: &str) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{STRIPE_T}.").as_bytes());
    mac.update(STRIPE_BODY);
    hex::encode(mac.finalize().into_bytes())
}

fn stripe_headers(value: &str) -> HeaderMap {
    headers(&[("stripe-signature", value)])
}

#[test]
fn stripe_accepts_a_signature_built_from_its_documented_algorithm() {
    let header = format!("t={STRIPE_T},v1={}", stripe_v1(STRIPE_SECRET));
    assert_eq!(stripe().sign(STRIPE_T, STRIPE_BODY), header);
    let verified = stripe()
        .verify(&stripe_headers(&header), STRIPE_BODY)
        .unwrap();
    assert_eq!(verified.timestamp, Some(STRIPE_T));
    assert_eq!(verified.event_id, None);
}

#[test]
fn stripe_accepts_any_of_several_v1_signatures_and_ignores_v0() {
    let good = stripe_v1(STRIPE_SECRET);
    let other = stripe_v1("whsec_rolled");
    let header = format!("t={STRIPE_T},v1={other},v1={good},v0=deadbeef");
    stripe()
        .verify(&stripe_headers(&header), STRIPE_BODY)
        .unwrap();
    let rolled = Stripe::new(["whsec_rolled", STRIPE_SECRET])
        .unwrap()
        .with_clock(Clock::fixed(STRIPE_T));
    rolled
        .verify(
            &stripe_headers(&format!("t={STRIPE_T},v1={other}")),
            STRIPE_BODY,
        )
        .unwrap();
    assert_eq!(
        stripe().verify(
            &stripe_headers(&format!("t={STRIPE_T},v1={other}")),
            STRIPE_BODY
        ),
        Err(VerifyError::SignatureMismatch)
    );
}

#[test]
fn stripe_rejects_tampering_stale_and_future_timestamps() {
    let header = format!("t={STRIPE_T},v1={}", stripe_v1(STRIPE_SECRET));
    assert_eq!(
        stripe().verify(
            &stripe_headers(&header),
            br#"{"id":"evt_2","object":"event","type":"charge.succeeded"}"#
        ),
        Err(VerifyError::SignatureMismatch)
    );
    let shifted = format!("t={},v1={}", STRIPE_T + 1, stripe_v1(STRIPE_SECRET));
    assert_eq!(
        stripe().verify(&stripe_headers(&shifted), STRIPE_BODY),
        Err(VerifyError::SignatureMismatch)
    );
    let at = |now| {
        Stripe::new([STRIPE_SECRET])
            .unwrap()
            .with_clock(Clock::fixed(now))
            .verify(&stripe_headers(&header), STRIPE_BODY)
    };
    assert_eq!(
        at(STRIPE_T + 3600),
        Err(VerifyError::TimestampTooOld { age_secs: 3600 })
    );
    assert_eq!(
        at(STRIPE_T - 600),
        Err(VerifyError::TimestampInFuture { ahead_secs: 600 })
    );
}

#[test]
fn stripe_names_malformed_and_duplicated_headers() {
    let v1 = stripe_v1(STRIPE_SECRET);
    for bad in [
        format!("v1={v1}"),
        format!("t={STRIPE_T}"),
        format!("t={STRIPE_T},t={STRIPE_T},v1={v1}"),
        format!("t=yesterday,v1={v1}"),
        format!("t={STRIPE_T};v1={v1}"),
        String::new(),
    ] {
        assert!(
            matches!(
                stripe().verify(&stripe_headers(&bad), STRIPE_BODY),
                Err(VerifyError::MalformedHeader {
                    header: "stripe-signature",
                    ..
                })
            ),
            "{bad}"
        );
    }
    let mut doubled = stripe_headers(&format!("t={STRIPE_T},v1={v1}"));
    doubled.append("stripe-signature", HeaderValue::from_static("t=1,v1=00"));
    assert_eq!(
        stripe().verify(&doubled, STRIPE_BODY),
        Err(VerifyError::DuplicateHeader("stripe-signature"))
    );
    assert_eq!(
        stripe().verify(&HeaderMap::new(), STRIPE_BODY),
        Err(VerifyError::MissingHeader("stripe-signature"))
    );
}

#[test]
fn telegram_secret_token_is_compared_exactly() {
    let v = SecretHeader::telegram(["s3cret-token", "next-token"]).unwrap();
    let with = |value: &str| headers(&[("x-telegram-bot-api-secret-token", value)]);
    v.verify(&with("s3cret-token"), b"{}").unwrap();
    v.verify(&with("next-token"), b"{}").unwrap();
    for wrong in ["s3cret-toke", "s3cret-token2", "S3CRET-TOKEN", ""] {
        assert_eq!(
            v.verify(&with(wrong), b"{}"),
            Err(VerifyError::SignatureMismatch),
            "{wrong}"
        );
    }
    assert_eq!(
        v.verify(&HeaderMap::new(), b"{}"),
        Err(VerifyError::MissingHeader(
            "x-telegram-bot-api-secret-token"
        ))
    );
    let mut doubled = with("s3cret-token");
    doubled.append(
        "x-telegram-bot-api-secret-token",
        HeaderValue::from_static("s3cret-token"),
    );
    assert_eq!(
        v.verify(&doubled, b"{}"),
        Err(VerifyError::DuplicateHeader(
            "x-telegram-bot-api-secret-token"
        ))
    );
}

#[test]
fn verifiers_work_behind_one_trait_object() {
    let verifiers: Vec<Box<dyn Verifier>> = vec![
        Box::new(standard()),
        Box::new(stripe()),
        Box::new(GitHub::new([GH_SECRET]).unwrap()),
        Box::new(SecretHeader::telegram(["t"]).unwrap()),
    ];
    // An empty request fails every scheme with a missing header, never a panic.
    for v in &verifiers {
        assert!(matches!(
            v.verify(&HeaderMap::new(), b""),
            Err(VerifyError::MissingHeader(_))
        ));
    }
}

// Standard Webhooks `v1a` (Ed25519). The key pairs are RFC 8032's test
// vectors 1 and 2 (their public keys are the RFC's), and the signatures of
// the reference message above were made by another implementation
// (OpenSSL, through Python's `cryptography`), so these tests check the
// encoding of keys, signed content and signatures, not only a round trip.
const V1A_SECRET_1: &str = "whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A=";
const V1A_PUBLIC_1: &str = "whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=";
const V1A_SIGNATURE_1: &str =
    "v1a,jfp5j4J3Buv9EPOcc9Bqo8rJqAO1H6lrRl0WZQdzVZI6IttNPT8HSLyPvUvY54dJJt2BQGA01di1ePvigCwlCw==";
const V1A_SECRET_2: &str = "whsk_TM0Imyj/ltqdtsNG7BFOD1uKMZ81q6Yk2oz27U+4pvs=";
const V1A_PUBLIC_2: &str = "whpk_PUAXw+hDiVqStwqnTRt+vJyYLM8uxJaMwM1V8Sr0Zgw=";
const V1A_SIGNATURE_2: &str =
    "v1a,WHjsBnxYGAzT4ouNcEHVkIFB4V5sqMvGNEfbIzAeidMH5kRnfaveEv167/OQ9xXNboC36vYKangXhyprOiJMAg==";

fn asymmetric(keys: &[&str]) -> StandardWebhooks {
    StandardWebhooks::from_public_keys(keys)
        .unwrap()
        .with_clock(Clock::fixed(SW_TS))
}

#[test]
fn standard_webhooks_v1a_accepts_another_implementations_signature() {
    let verified = asymmetric(&[V1A_PUBLIC_1])
        .verify(&sw_headers(SW_ID, SW_TS, V1A_SIGNATURE_1), SW_BODY)
        .unwrap();
    assert_eq!(verified.event_id.as_deref(), Some(SW_ID));
    assert_eq!(verified.timestamp, Some(SW_TS));
    // The bare base64 of the key is the same key.
    asymmetric(&[V1A_PUBLIC_1.trim_start_matches("whpk_")])
        .verify(&sw_headers(SW_ID, SW_TS, V1A_SIGNATURE_1), SW_BODY)
        .unwrap();
}

#[test]
fn standard_webhooks_v1a_signs_as_another_implementation_does() {
    for (secret, public, signature) in [
        (V1A_SECRET_1, V1A_PUBLIC_1, V1A_SIGNATURE_1),
        (V1A_SECRET_2, V1A_PUBLIC_2, V1A_SIGNATURE_2),
    ] {
        assert_eq!(
            StandardWebhooks::sign_v1a(secret, SW_ID, SW_TS, SW_BODY).unwrap(),
            signature
        );
        assert_eq!(StandardWebhooks::public_key_of(secret).unwrap(), public);
    }
    // libsodium's 64-byte form: the seed, then its public key.
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut pair = b64.decode(&V1A_SECRET_1[5..]).unwrap();
    pair.extend(b64.decode(&V1A_PUBLIC_1[5..]).unwrap());
    let pair = format!("whsk_{}", b64.encode(&pair));
    assert_eq!(
        StandardWebhooks::sign_v1a(&pair, SW_ID, SW_TS, SW_BODY).unwrap(),
        V1A_SIGNATURE_1
    );
}

#[test]
fn standard_webhooks_v1a_accepts_every_key_during_rotation() {
    let both = asymmetric(&[V1A_PUBLIC_2, V1A_PUBLIC_1]);
    for signature in [V1A_SIGNATURE_1, V1A_SIGNATURE_2] {
        both.verify(&sw_headers(SW_ID, SW_TS, signature), SW_BODY)
            .unwrap();
    }
    // A provider signing with the old and the new key: the receiver that
    // trusts only the new one still passes it.
    let header = format!("{V1A_SIGNATURE_1} {V1A_SIGNATURE_2}");
    asymmetric(&[V1A_PUBLIC_2])
        .verify(&sw_headers(SW_ID, SW_TS, &header), SW_BODY)
        .unwrap();
    assert_eq!(
        asymmetric(&[V1A_PUBLIC_2]).verify(&sw_headers(SW_ID, SW_TS, V1A_SIGNATURE_1), SW_BODY),
        Err(VerifyError::SignatureMismatch)
    );
}

#[test]
fn standard_webhooks_v1a_rejects_a_tampered_body_id_or_timestamp() {
    let v = asymmetric(&[V1A_PUBLIC_1]);
    let tampered = br#"{"email":"test@example.com","username":"test_usex"}"#;
    for (id, ts, body) in [
        (SW_ID, SW_TS, &tampered[..]),
        ("msg_other", SW_TS, SW_BODY),
        (SW_ID, SW_TS + 1, SW_BODY),
    ] {
        assert_eq!(
            v.verify(&sw_headers(id, ts, V1A_SIGNATURE_1), body),
            Err(VerifyError::SignatureMismatch),
            "{id} {ts}"
        );
    }
    // Signed, but long ago.
    let late = StandardWebhooks::from_public_keys([V1A_PUBLIC_1])
        .unwrap()
        .with_clock(Clock::fixed(SW_TS + 3600));
    assert!(matches!(
        late.verify(&sw_headers(SW_ID, SW_TS, V1A_SIGNATURE_1), SW_BODY),
        Err(VerifyError::TimestampTooOld { .. })
    ));
}

#[test]
fn standard_webhooks_v1a_refuses_what_can_match_nothing() {
    let v = asymmetric(&[V1A_PUBLIC_1]);
    // Not base64, too short, and a valid v1 that this verifier does not
    // trust.
    for header in ["v1a,!!!", "v1a,c29tZQ==", SW_SIGNATURE] {
        let result = v.verify(&sw_headers(SW_ID, SW_TS, header), SW_BODY);
        assert!(
            matches!(
                result,
                Err(VerifyError::SignatureMismatch | VerifyError::MalformedHeader { .. })
            ),
            "{header}: {result:?}"
        );
    }
    assert!(matches!(
        v.verify(&sw_headers(SW_ID, SW_TS, SW_SIGNATURE), SW_BODY),
        Err(VerifyError::MalformedHeader {
            reason: "no v1a signature",
            ..
        })
    ));
    // A header stuffed with signatures is refused before any is checked.
    let stuffed = [V1A_SIGNATURE_2; idem_inbox::verify::MAX_V1A_SIGNATURES + 1].join(" ");
    assert!(matches!(
        v.verify(&sw_headers(SW_ID, SW_TS, &stuffed), SW_BODY),
        Err(VerifyError::MalformedHeader { .. })
    ));
}

#[test]
fn standard_webhooks_accepts_v1_or_v1a_when_it_trusts_both() {
    let both = standard().with_public_keys([V1A_PUBLIC_1]).unwrap();
    let wrong_v1 = "v1,tFtCZ5RDCPxzWQRWXWPgrCgE2frDBe9gjpbWQxnVfsQ=";
    for header in [
        SW_SIGNATURE.to_owned(),
        V1A_SIGNATURE_1.to_owned(),
        format!("{wrong_v1} {V1A_SIGNATURE_1}"),
        format!("{V1A_SIGNATURE_2} {SW_SIGNATURE}"),
    ] {
        both.verify(&sw_headers(SW_ID, SW_TS, &header), SW_BODY)
            .unwrap_or_else(|e| panic!("{header}: {e}"));
    }
    assert_eq!(
        both.verify(
            &sw_headers(SW_ID, SW_TS, &format!("{wrong_v1} {V1A_SIGNATURE_2}")),
            SW_BODY
        ),
        Err(VerifyError::SignatureMismatch)
    );
}

#[test]
fn standard_webhooks_v1a_keys_that_are_not_keys_are_typed_errors() {
    let cases: [(&[&str], SecretError); 4] = [
        (&[], SecretError::None),
        (&["whpk_not base64!"], SecretError::NotBase64),
        (&["whpk_c2hvcnQ="], SecretError::NotAPublicKey),
        (&[V1A_PUBLIC_1, "whpk_c2hvcnQ="], SecretError::NotAPublicKey),
    ];
    for (keys, error) in cases {
        assert_eq!(
            StandardWebhooks::from_public_keys(keys).unwrap_err(),
            error,
            "{keys:?}"
        );
    }
    assert_eq!(
        StandardWebhooks::sign_v1a("whsk_c2hvcnQ=", SW_ID, SW_TS, SW_BODY).unwrap_err(),
        SecretError::NotASecretKey
    );
    // A 64-byte secret whose public half is another key's.
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut pair = b64.decode(&V1A_SECRET_1[5..]).unwrap();
    pair.extend(b64.decode(&V1A_PUBLIC_2[5..]).unwrap());
    assert_eq!(
        StandardWebhooks::public_key_of(&format!("whsk_{}", b64.encode(&pair))).unwrap_err(),
        SecretError::NotASecretKey
    );
    // A public-key verifier holds no secret to sign v1 with.
    assert_eq!(asymmetric(&[V1A_PUBLIC_1]).sign(SW_ID, SW_TS, SW_BODY), "");
}
