//! Building blocks for exactly-once *effects*: derived keys for remote
//! idempotent APIs, and the pieces a store needs to record an outcome in the
//! same transaction as the work's own writes.

use std::fmt::Write as _;

use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::store::{NewRecord, State, Token};
use crate::{Begin, Error, Fingerprint, Idempotent, Key, Lease};

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
        debug_assert!(Key::validate_client_key(&key).is_ok());
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
pub enum BeginJson<T> {
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
    pub async fn begin_json<B, T, E>(&self, key: &str, body: &B) -> Result<BeginJson<T>, Error<E>>
    where
        B: Serialize + Sync + ?Sized,
        T: DeserializeOwned,
    {
        let key = self.key(key).map_err(Error::into_work_error)?;
        let fingerprint = Fingerprint::of_json(body).map_err(Error::Encode)?;
        match self.begin_key(key, fingerprint.into()).await {
            Ok(Begin::Run(lease)) => Ok(BeginJson::Run(lease)),
            Ok(Begin::Replay(replay)) if replay.is_failure() => {
                match serde_json::from_slice(replay.payload()) {
                    Ok(value) => Err(Error::Remembered(value)),
                    Err(e) => Err(Error::Decode(e)),
                }
            }
            Ok(Begin::Replay(replay)) => serde_json::from_slice(replay.payload())
                .map(BeginJson::Replayed)
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

/// A claim built ahead of its insert, for a store that inserts the claims
/// of several keys in one statement of its own, or in the caller's
/// transaction — a job queue that claims a batch of jobs and their keys in
/// one commit.
///
/// It holds what [`Idempotent::begin`] would insert: an
/// [`InFlight`](State::InFlight) record with a fresh token, the request's
/// fingerprint, and the lease and retention of the `Idempotent` that
/// prepared it ([`record`](PreparedClaim::record)). The store inserts it
/// exactly as [`Store::insert`](crate::store::Store::insert) would — when the key
/// is absent or its record is past retention, and otherwise not at all —
/// and says which:
///
/// * inserted (and committed): [`inserted`](PreparedClaim::inserted)
///   gives the [`Lease`]; run the work and settle it as after `begin`;
/// * not inserted: a live record holds the key. Drop the prepared claim
///   and call [`begin`](Idempotent::begin) (or `execute`) for the key as
///   usual: what a found record means — a replay, a call in flight, a
///   lapsed lease to take over, a mismatch — is decided there, never by the
///   store or its caller.
///
/// For store and queue implementers; applications call `execute`.
#[derive(Debug)]
pub struct PreparedClaim {
    lease: Lease,
}

impl Idempotent {
    /// Prepares the claim of `key` for `body`, for a store to insert in a
    /// batch (see [`PreparedClaim`]). Nothing is written: an invalid key is
    /// [`Error::InvalidKey`], a body that does not encode
    /// [`Error::Encode`].
    pub fn prepare_claim<B>(&self, key: &str, body: &B) -> Result<PreparedClaim, Error>
    where
        B: Serialize + ?Sized,
    {
        let key = self.key(key)?;
        let fingerprint = Fingerprint::of_json(body).map_err(Error::Encode)?;
        Ok(PreparedClaim {
            lease: self.lease_for(key, Token::random(), fingerprint),
        })
    }
}

impl PreparedClaim {
    /// The key to insert under (namespaced and scoped as the `Idempotent`
    /// that prepared it says).
    pub fn key(&self) -> &Key {
        self.lease.key()
    }

    /// The record to insert: [`InFlight`](State::InFlight), an empty
    /// payload, this claim's token and fingerprint, the lease and the
    /// retention to count from the insert.
    pub fn record(&self) -> NewRecord<'static> {
        self.lease.record(State::InFlight, &[])
    }

    /// The store inserted [`record`](PreparedClaim::record) and the insert
    /// committed: the key is this caller's, under this lease. Only the
    /// store's answer may lead here; a record that was not inserted must go
    /// through [`begin`](Idempotent::begin).
    pub fn inserted(self) -> Lease {
        self.lease.decided_to_run();
        self.lease
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
            assert!(Key::validate_client_key(&key).is_ok());
        }
    }

    #[tokio::test]
    async fn a_prepared_claim_inserted_runs_once_and_one_not_inserted_goes_through_begin() {
        use std::sync::Arc;

        use crate::store::{Insert, Store};
        use crate::MemoryStore;

        let store = Arc::new(MemoryStore::new());
        let idem = Idempotent::new(Arc::clone(&store)).scoped("tenant");
        let claim = idem.prepare_claim("evt-1", "body").unwrap();
        assert_eq!(claim.key(), &idem.key("evt-1").unwrap());
        let record = claim.record();
        assert_eq!((record.state, record.payload), (State::InFlight, &[][..]));
        assert!(record.lease.is_some());
        assert_eq!(
            store.insert(claim.key().as_str(), &record).await.unwrap(),
            Insert::Inserted
        );
        let lease = claim.inserted();
        assert_eq!(lease.token(), record.token);

        // While the lease is held, a second prepared claim is not inserted,
        // and `begin` (which decides what the found record means) says the
        // call is in flight.
        let second = idem.prepare_claim("evt-1", "body").unwrap();
        assert_ne!(second.record().token, record.token);
        assert!(matches!(
            store
                .insert(second.key().as_str(), &second.record())
                .await
                .unwrap(),
            Insert::Found(_)
        ));
        let ran = std::sync::atomic::AtomicUsize::new(0);
        let again = idem
            .execute("evt-1", "body", || async {
                ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok::<_, ()>(2)
            })
            .await;
        assert!(matches!(again, Err(Error::InProgress { .. })), "{again:?}");

        // Settled through the lease, the outcome replays to `execute`
        // without running it; another body is a mismatch.
        lease.complete(b"1").await.unwrap();
        let replayed = idem
            .execute("evt-1", "body", || async {
                ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok::<_, ()>(2)
            })
            .await;
        assert_eq!(replayed.unwrap(), 1);
        assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 0);
        let other = idem
            .execute("evt-1", "other", || async { Ok::<_, ()>(3) })
            .await;
        assert!(matches!(other, Err(Error::Mismatch)), "{other:?}");

        assert!(matches!(
            idem.prepare_claim("bad\nkey", "body"),
            Err(Error::InvalidKey(_))
        ));
    }
}
