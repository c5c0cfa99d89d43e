//! Bad data and fidelity: payloads, tokens, fingerprints and keys come back
//! exactly as written, at their extremes.

use std::sync::Arc;

use idem_core::store::{Insert, NewRecord, State, Token};
use idem_core::{Fingerprint, Key};
use tokio::task::JoinSet;

use crate::support::{
    claim, fp, in_flight, join_all, key, live, noise, ok, same_bytes, scoped_key, settled, LONG,
    NAMESPACE, RETENTION,
};
use crate::Factory;

/// Four MiB: "several MiB" in the contract, and above the 1 MiB default
/// limits several backends ship with.
const LARGE: usize = 4 * 1024 * 1024;

/// Writes `payload` as the outcome under `key` and checks that `load` and
/// a later `insert` both return it exactly.
async fn round_trip(store: &dyn idem_core::store::Store, key: &str, state: State, payload: &[u8]) {
    let token = Token::random();
    claim(store, key, &in_flight(token, fp(1), LONG)).await;
    let done = settled(token, fp(1), state, payload, RETENTION);
    assert!(
        ok(store.swap(key, token, &done).await, "swap"),
        "the owner's swap was refused"
    );
    let record = live(store, key).await;
    assert_eq!(record.state, state);
    same_bytes(&record.payload, payload, "the payload read by load");
    match ok(
        store
            .insert(key, &in_flight(Token::random(), fp(1), LONG))
            .await,
        "insert",
    ) {
        Insert::Found(found) => {
            same_bytes(&found.payload, payload, "the payload returned by insert")
        }
        other => panic!("insert over a completed record must return Found, got {other:?}"),
    }
}

/// An empty payload round-trips as empty, in every state.
pub async fn empty_payload_round_trips(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    round_trip(&*store, &key("empty-completed"), State::Completed, b"").await;
    round_trip(&*store, &key("empty-failed"), State::Failed, b"").await;
}

/// A 4 MiB payload round-trips byte for byte.
pub async fn large_payload_round_trips(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    round_trip(&*store, &key("large"), State::Completed, &noise(LARGE, 7)).await;
}

/// Every byte value, NUL and invalid UTF-8 included, round-trips in an
/// InFlight and a final payload.
pub async fn every_byte_value_round_trips(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let mut bytes: Vec<u8> = (0..=255).collect();
    bytes.extend((0..=255u8).rev());
    bytes.extend_from_slice(&[0xc3, 0x28, 0xf0, 0x9f, 0x92, 0x00, 0xff, 0xfe]);

    let key = key("every-byte");
    let token = Token::random();
    let progress = NewRecord {
        payload: &bytes,
        ..in_flight(token, fp(1), LONG)
    };
    claim(&*store, &key, &progress).await;
    same_bytes(
        &live(&*store, &key).await.payload,
        &bytes,
        "an InFlight payload",
    );
    let reversed: Vec<u8> = bytes.iter().rev().copied().collect();
    let done = settled(token, fp(1), State::Completed, &reversed, RETENTION);
    assert!(ok(store.swap(&key, token, &done).await, "swap"));
    same_bytes(
        &live(&*store, &key).await.payload,
        &reversed,
        "a Completed payload",
    );
}

/// Tokens and fingerprints round-trip exactly, all-zero and all-ones too.
pub async fn tokens_and_fingerprints_round_trip(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let cases = [
        (Token::from_bytes([0; 16]), Fingerprint::from_bytes([0; 32])),
        (
            Token::from_bytes([0xff; 16]),
            Fingerprint::from_bytes([0xff; 32]),
        ),
        (Token::random(), Fingerprint::of_bytes(b"body")),
    ];
    for (n, (token, fingerprint)) in cases.into_iter().enumerate() {
        let key = key(&format!("exact-{n}"));
        claim(&*store, &key, &in_flight(token, fingerprint, LONG)).await;
        let record = live(&*store, &key).await;
        assert_eq!(
            record.token, token,
            "the token changed on its way through the store"
        );
        assert_eq!(
            record.fingerprint, fingerprint,
            "the fingerprint changed on its way through the store"
        );
        match ok(
            store
                .insert(&key, &in_flight(Token::random(), fp(9), LONG))
                .await,
            "insert",
        ) {
            Insert::Found(found) => {
                assert_eq!(found.token, token, "insert's Found carries another token");
                assert_eq!(
                    found.fingerprint, fingerprint,
                    "insert's Found carries another fingerprint"
                );
            }
            other => panic!("insert over a live record must return Found, got {other:?}"),
        }
        assert!(
            ok(
                store
                    .swap(
                        &key,
                        token,
                        &settled(token, fingerprint, State::Completed, b"", RETENTION)
                    )
                    .await,
                "swap"
            ),
            "swap with token {token} was refused: the stored token no longer matches"
        );
    }
}

/// A fingerprint's scheme round-trips with its digest through every
/// transition, so a record made under an older scheme is still told apart.
pub async fn fingerprint_schemes_round_trip(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    for (n, scheme) in [1u8, 2, 255].into_iter().enumerate() {
        let key = key(&format!("scheme-{n}"));
        let first = fp(9).with_scheme(scheme);
        let owner = Token::random();
        claim(
            &*store,
            &key,
            &in_flight(owner, first, std::time::Duration::ZERO),
        )
        .await;
        let record = live(&*store, &key).await;
        assert_eq!(
            (record.fingerprint, record.fingerprint.scheme()),
            (first, scheme),
            "a scheme-{scheme} fingerprint changed on its way through the store"
        );
        // A takeover and a completion write another scheme's fingerprint.
        let next = fp(10).with_scheme(scheme.wrapping_add(1).max(1));
        let taker = Token::random();
        assert!(
            ok(
                store
                    .take_over(&key, owner, &in_flight(taker, next, LONG))
                    .await,
                "take_over"
            ),
            "the takeover of a lapsed scheme-{scheme} record was refused"
        );
        let done = settled(taker, next, State::Completed, b"out", RETENTION);
        assert!(ok(store.swap(&key, taker, &done).await, "swap"));
        let record = live(&*store, &key).await;
        assert_eq!(
            (record.fingerprint, record.fingerprint.scheme()),
            (next, next.scheme()),
            "the fingerprint written by a takeover and a completion changed"
        );
        same_bytes(&record.payload, b"out", "the payload after a schemed write");
    }
}

/// Client keys with every visible ASCII character are stored and kept
/// apart.
pub async fn keys_with_every_visible_ascii_character_are_kept_apart(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let every: String = (0x21u8..=0x7e).map(char::from).collect();
    let mut keys = vec![key(&every)];
    // One key per character, so a store that drops, escapes or folds any
    // one of them lands two keys on one record.
    keys.extend((0x21u8..=0x7e).map(|c| key(&format!("ascii-{}", char::from(c)))));
    keys.push(key("ascii-"));
    let mut tokens = Vec::new();
    for key in &keys {
        let token = Token::random();
        claim(&*store, key, &in_flight(token, fp(1), LONG)).await;
        tokens.push(token);
    }
    for (key, token) in keys.iter().zip(&tokens) {
        assert_eq!(
            live(&*store, key).await.token,
            *token,
            "key {key:?} returned another key's record"
        );
    }
}

/// The longest keys (255-byte namespace and scope, 255-character client
/// key, multi-byte UTF-8) are stored and kept apart.
pub async fn longest_keys_are_kept_apart(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    let namespace = format!(
        "{NAMESPACE}{}",
        "n".repeat(Key::MAX_SCOPE_LEN - NAMESPACE.len())
    );
    // 85 three-byte characters: exactly 255 bytes.
    let scope = "日".repeat(Key::MAX_SCOPE_LEN / 3);
    let other_scope = format!("本{}", "日".repeat(Key::MAX_SCOPE_LEN / 3 - 1));
    let client = "k".repeat(Key::MAX_CLIENT_KEY_LEN);
    let other_client = format!("{}j", "k".repeat(Key::MAX_CLIENT_KEY_LEN - 1));
    let build = |scope: &str, client: &str| match Key::new(&namespace, scope, client) {
        Ok(key) => key.as_str().to_owned(),
        Err(e) => panic!("the kit built an invalid key: {e}"),
    };
    let keys = [
        build(&scope, &client),
        build(&scope, &other_client),
        build(&other_scope, &client),
        scoped_key("tenant with spaces", &client),
    ];
    let mut tokens = Vec::new();
    for key in &keys {
        let token = Token::random();
        claim(&*store, key, &in_flight(token, fp(1), LONG)).await;
        tokens.push(token);
    }
    for (key, token) in keys.iter().zip(&tokens) {
        assert_eq!(
            live(&*store, key).await.token,
            *token,
            "a {}-byte key returned another key's record",
            key.len()
        );
    }
}

/// Hundreds of keys written at once each keep their own record.
pub async fn many_keys_are_held_at_once(factory: &dyn Factory) {
    let fixture = factory.fixture().await;
    let store = fixture.store();
    const KEYS: usize = 500;
    let tokens: Arc<Vec<Token>> = Arc::new((0..KEYS).map(|_| Token::random()).collect());
    let mut tasks = JoinSet::new();
    for n in 0..KEYS {
        let (store, tokens) = (Arc::clone(&store), Arc::clone(&tokens));
        tasks.spawn(async move {
            claim(
                &*store,
                &key(&format!("many-{n}")),
                &in_flight(tokens[n], fp(1), LONG),
            )
            .await;
        });
    }
    join_all(tasks).await;
    for (n, token) in tokens.iter().enumerate() {
        let key = key(&format!("many-{n}"));
        assert_eq!(
            live(&*store, &key).await.token,
            *token,
            "key {key:?} returned another key's record"
        );
    }
}
