//! Records as earlier releases wrote them, and the check that they still
//! replay: every store writes the bytes of its own layout, then hands the
//! keys to [`check_replays`].

use idem_core::{Begin, Error, Fingerprint, Idempotent};

/// The body every legacy record was written for.
pub fn body() -> serde_json::Value {
    serde_json::json!({"amount": 1250})
}

/// SHA-256 of `{"amount":1250}`, in hex: the fingerprint (scheme 1) every
/// earlier release wrote for [`body`].
pub const DIGEST_HEX: &str = "9fb40105c56271ac9d6a8da0a6f584dd901d66e4d55081684160a5bc608c7b08";

/// [`DIGEST_HEX`] as the 32 bytes a store keeps.
pub fn digest() -> [u8; 32] {
    let mut digest = [0; 32];
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&DIGEST_HEX[2 * i..2 * i + 2], 16).unwrap_or(0);
    }
    digest
}

/// The payload of the completed legacy record: `"ch_1"` as JSON.
pub const PAYLOAD: &[u8] = b"\"ch_1\"";

/// Checks, through `idem` (no namespace, no scope), that the client key
/// `done` — a completed record holding [`PAYLOAD`] for [`body`], written as
/// an earlier release wrote it — replays without running the work, also
/// for a caller that moved to a newer fingerprint scheme and carries the
/// old fingerprint; and that `crashed` — an in-flight record of the same
/// body whose lease has lapsed — is taken over and completed.
pub async fn check_replays(idem: &Idempotent, done: &str, crashed: &str) {
    let body = body();
    let replayed: Result<String, Error<String>> = idem
        .execute(done, &body, || async { Ok("ran again".to_owned()) })
        .await;
    assert_eq!(replayed.unwrap(), "ch_1", "a legacy record did not replay");

    let old = Fingerprint::of_json(&body).unwrap();
    assert_eq!(old.to_string(), DIGEST_HEX, "the canonical form changed");
    let newer = Fingerprint::of_bytes(b"canonical").with_scheme(2);
    let begun = idem.begin(done, newer.also_matching(old)).await.unwrap();
    assert!(
        matches!(begun, Begin::Replay(_)),
        "a caller carrying the old scheme must replay: {begun:?}"
    );
    assert!(
        matches!(idem.begin(done, newer).await, Err(Error::Mismatch)),
        "a record of a scheme the caller does not carry must not match"
    );

    let recovered: Result<String, Error<String>> = idem
        .execute(crashed, &body, || async { Ok("ch_2".to_owned()) })
        .await;
    assert_eq!(
        recovered.unwrap(),
        "ch_2",
        "a legacy in-flight record was not taken over"
    );
}
