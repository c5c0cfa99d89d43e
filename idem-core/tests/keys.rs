//! Key rules and scopes: refused keys touch nothing, scopes never mix.

mod common;

use std::sync::Arc;

use common::Runs;
use idem_core::{Error, Idempotent, KeyError, MemoryStore};
use proptest::prelude::*;

type Res<T> = Result<T, Error<String>>;

async fn run(idem: &Idempotent, key: &str, runs: &Runs) -> Res<u32> {
    let runs = runs.clone();
    idem.execute(key, "body", || async move {
        runs.hit();
        Ok(1)
    })
    .await
}

#[tokio::test]
async fn keys_outside_the_bounds_are_refused_before_the_store_is_touched() {
    let store = Arc::new(MemoryStore::new());
    let idem = Idempotent::new(store.clone());
    let runs = Runs::default();
    let long = "k".repeat(256);
    for bad in [
        "",
        long.as_str(),
        "café",
        "tab\there",
        "new\nline",
        "sp ace",
        "\u{7f}",
    ] {
        let out = run(&idem, bad, &runs).await;
        assert!(matches!(out, Err(Error::InvalidKey(_))), "{bad:?}: {out:?}");
    }
    assert_eq!(runs.count(), 0);
    assert!(store.is_empty());
    assert_eq!(run(&idem, &"k".repeat(255), &runs).await.unwrap(), 1);
    assert_eq!(runs.count(), 1);
}

#[tokio::test]
async fn every_visible_ascii_character_is_a_valid_key_character() {
    let idem = Idempotent::new(MemoryStore::new());
    let every: String = (0x21u8..=0x7e).map(char::from).collect();
    let runs = Runs::default();
    assert_eq!(run(&idem, &every, &runs).await.unwrap(), 1);
    assert_eq!(run(&idem, &every, &runs).await.unwrap(), 1);
    assert_eq!(runs.count(), 1);
}

#[tokio::test]
async fn a_colon_in_scope_or_key_cannot_join_two_records() {
    let idem = Idempotent::new(MemoryStore::new());
    let runs = Runs::default();
    run(&idem.scoped("a:b"), "c", &runs).await.unwrap();
    run(&idem.scoped("a"), "b:c", &runs).await.unwrap();
    assert_eq!(runs.count(), 2);
}

#[tokio::test]
async fn two_scopes_never_see_each_others_outcomes() {
    let idem = Idempotent::new(MemoryStore::new());
    let alice: Res<String> = idem
        .scoped("tenant-alice")
        .execute("k", "body", || async { Ok("alice's receipt".into()) })
        .await;
    let bob: Res<String> = idem
        .scoped("tenant-bob")
        .execute("k", "body", || async { Ok("bob's receipt".into()) })
        .await;
    assert_eq!(alice.unwrap(), "alice's receipt");
    assert_eq!(bob.unwrap(), "bob's receipt");
    let namespaced: Res<String> = idem
        .with_namespace("other-app")
        .scoped("tenant-alice")
        .execute("k", "body", || async { Ok("other app".into()) })
        .await;
    assert_eq!(namespaced.unwrap(), "other app");
}

#[tokio::test]
async fn a_scope_with_a_control_character_is_refused() {
    let idem = Idempotent::new(MemoryStore::new());
    let out = run(&idem.scoped("tenant\0"), "k", &Runs::default()).await;
    assert!(matches!(
        out,
        Err(Error::InvalidKey(KeyError::InvalidScope {
            part: "scope",
            ..
        }))
    ));
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

proptest! {
    /// Generated keys: a key outside the rules never reaches the store, and
    /// one inside them always round-trips.
    #[test]
    fn generated_keys_are_refused_or_round_trip(key in "\\PC{0,300}|[!-~]{1,255}") {
        let valid = !key.is_empty()
            && key.len() <= 255
            && key.bytes().all(|b| (0x21..=0x7e).contains(&b));
        let store = Arc::new(MemoryStore::new());
        let idem = Idempotent::new(store.clone());
        let runs = Runs::default();
        let (first, second) = rt().block_on(async {
            (run(&idem, &key, &runs).await, run(&idem, &key, &runs).await)
        });
        if valid {
            prop_assert_eq!(first.unwrap(), 1);
            prop_assert_eq!(second.unwrap(), 1);
            prop_assert_eq!(runs.count(), 1);
        } else {
            prop_assert!(matches!(first, Err(Error::InvalidKey(_))));
            prop_assert!(matches!(second, Err(Error::InvalidKey(_))));
            prop_assert_eq!(runs.count(), 0);
            prop_assert!(store.is_empty());
        }
    }
}
