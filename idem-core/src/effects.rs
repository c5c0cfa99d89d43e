//! Building blocks for exactly-once *effects*: derived keys for remote
//! idempotent APIs, and the pieces a store needs to record an outcome in the
//! same transaction as the work's own writes.

use std::fmt::Write as _;

use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::{
    validate_client_key, Begin, Error, Fingerprint, Idempotent, Key, Lease, NewRecord, State,
};

// Names the scheme inside the hash, so a future scheme yields other keys
// instead of colliding with these.
const DERIVE_DOMAIN: &[u8] = b"idem.derive.v1";

impl Key {
    /// A key derived from `parts`, for an effect in a remote idempotent API
    /// (a payment gateway, an email API) or for a tool call an orchestrator
    /// makes on an agent's behalf (`["report-118", "2026-11-30"]` rather
    /// than a key the model invents).
    ///
    /// The same parts give the same key in any process, on any machine and
    /// in every later version of this crate; the key is a valid client key
    /// and `Idempotency-Key`: `idem-` and 64 lowercase hex digits of a
    /// SHA-256, 69 visible ASCII characters. Each part is length-prefixed
    /// before hashing, so `["a:b", "c"]` and `["a", "b:c"]` never meet.
    /// [`Lease::derive_key`] derives from a lease's key and a step name.
    ///
    /// These vectors are part of the contract:
    ///
    /// ```
    /// use idem_core::Key;
    ///
    /// assert_eq!(
    ///     Key::derive(&["gateway"]),
    ///     "idem-ad7ec9078a6e7dea879e2fd411d245b75342c7af99b43e2f31e70d1881048382"
    /// );
    /// assert_eq!(
    ///     Key::derive(&["report-118", "2026-11-30"]),
    ///     "idem-1d15493bcdc9ea660fc05f16235ba628c9bd9699a337d56b1d7cf7863297d50f"
    /// );
    /// assert_eq!(
    ///     Key::derive(&[]),
    ///     "idem-a1b50f7f02b899b37b620652e83e951f009d5c60175b75f7d5fbe03c6837779f"
    /// );
    /// // What `lease.derive_key("gateway")` gives for client key
    /// // "order-7f3a" with no namespace and no scope, and in namespace
    /// // "app", scope "tenant":
    /// let plain = Key::new("", "", "order-7f3a").unwrap();
    /// assert_eq!(
    ///     Key::derive(&[plain.as_str(), "gateway"]),
    ///     "idem-7a4b2d076d2b62339ea0fd4ef5ff6b2e92ed19003f431a4f15adff7c4ade297c"
    /// );
    /// let scoped = Key::new("app", "tenant", "order-7f3a").unwrap();
    /// assert_eq!(
    ///     Key::derive(&[scoped.as_str(), "gateway"]),
    ///     "idem-519a65b927e8c443e2de406a1f8465b2b30d7063b49786281ac8324b06701fae"
    /// );
    /// ```
    pub fn derive(parts: &[&str]) -> String {
        let mut hash = Sha256::new();
        hash.update(DERIVE_DOMAIN);
        for part in parts {
            hash.update((part.len() as u64).to_be_bytes());
            hash.update(part.as_bytes());
        }
        let mut key = String::with_capacity(69);
        key.push_str("idem-");
        for byte in hash.finalize() {
            // Writing to a String cannot fail.
            let _ = write!(key, "{byte:02x}");
        }
        debug_assert!(validate_client_key(&key).is_ok());
        key
    }
}

impl Lease {
    /// The key to send a remote idempotent API for the effect named `step`
    /// (say `"gateway"`): derived from this lease's namespace, scope and
    /// client key and `step`, so every retry and every owner that takes the
    /// key over sends the same one, and the remote API runs the effect once.
    /// Different steps of one key get different keys.
    pub fn derive_key(&self, step: &str) -> String {
        Key::derive(&[self.key().as_str(), step])
    }
}

/// What [`Idempotent::begin_json`] found: the two answers a claim can have
/// once errors are taken out, so matching on it needs no catch-all.
#[derive(Debug)]
pub enum Started<T> {
    /// The key is this caller's: run the work under the lease.
    Run(Lease),
    /// The outcome was recorded before; here it is, decoded.
    Replayed(T),
}

impl Idempotent {
    /// The first half of [`execute`](Idempotent::execute), for a store that
    /// runs the work itself (transactional completion): checks the key,
    /// fingerprints `body` as JSON and claims the key, or decodes the
    /// recorded outcome. A remembered failure is [`Error::Remembered`], as
    /// `execute` gives it.
    pub async fn begin_json<B, T, E>(&self, key: &str, body: &B) -> Result<Started<T>, Error<E>>
    where
        B: Serialize + Sync + ?Sized,
        T: DeserializeOwned,
    {
        let key = self.key(key).map_err(Error::into_work_error)?;
        let fingerprint = Fingerprint::of_json(body).map_err(Error::Encode)?;
        match self.begin_key(key, fingerprint.into()).await {
            Ok(Begin::Run(lease)) => Ok(Started::Run(lease)),
            Ok(Begin::Replay(replay)) if replay.is_failure() => {
                match serde_json::from_slice(replay.payload()) {
                    Ok(value) => Err(Error::Remembered(value)),
                    Err(e) => Err(Error::Decode(e)),
                }
            }
            Ok(Begin::Replay(replay)) => serde_json::from_slice(replay.payload())
                .map(Started::Replayed)
                .map_err(Error::Decode),
            Err(error) => Err(error.into_work_error()),
        }
    }
}

impl Lease {
    /// The record a settling write of this lease stores: `state`
    /// ([`Completed`](State::Completed) or [`Failed`](State::Failed), or
    /// [`InFlight`](State::InFlight) for a renewal) with `payload`, this
    /// owner's token and fingerprint, and the lease's retention. A store
    /// that completes inside the caller's transaction writes exactly this,
    /// fenced by [`Lease::token`].
    pub fn record<'a>(&self, state: State, payload: &'a [u8]) -> NewRecord<'a> {
        NewRecord {
            token: self.token(),
            fingerprint: self.fingerprint(),
            state,
            payload,
            lease: (state == State::InFlight).then_some(self.lease_length()),
            retention: self.retention(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_keys_are_valid_and_keep_parts_apart() {
        let a = Key::derive(&["a:b", "c"]);
        let b = Key::derive(&["a", "b:c"]);
        assert_ne!(a, b);
        assert_ne!(Key::derive(&["ab"]), Key::derive(&["a", "b"]));
        assert_ne!(Key::derive(&[""]), Key::derive(&[]));
        for key in [a, b, Key::derive(&[])] {
            assert_eq!(key.len(), 69);
            assert!(validate_client_key(&key).is_ok());
        }
    }
}
