//! Whose key it is: the scope a request's key is checked in when the
//! application names none, read from the caller's credentials.

use http::header::AUTHORIZATION;
use http::HeaderMap;
use idem_core::fingerprint::{MatchingFingerprints, PartsHasher};
use idem_core::store::State;
use idem_core::Idempotent;

use crate::{Options, Problem};

/// Who sent a request, as far as its headers tell: the `Authorization`
/// header, hashed, or no credentials at all. With no scope set, a key is
/// checked in its caller's scope ([`Caller::scope`]), so two callers never
/// share a record. The credential itself is never kept: only the first 16
/// bytes of a SHA-256 over it.
///
/// ```
/// use idem_http::Caller;
///
/// let mut headers = http::HeaderMap::new();
/// assert_eq!(Caller::of(&headers), Caller::Anonymous);
/// assert_eq!(Caller::Anonymous.scope(), "caller:anonymous");
/// headers.insert("authorization", "Bearer alice".parse().unwrap());
/// let alice = Caller::of(&headers);
/// assert!(alice.scope().starts_with("caller:"));
/// assert!(!alice.scope().contains("alice"));
/// headers.insert("authorization", "Bearer bob".parse().unwrap());
/// assert_ne!(Caller::of(&headers).scope(), alice.scope());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Caller {
    /// No `Authorization` header. Anonymous callers share one scope of
    /// their own, apart from every authenticated caller's.
    Anonymous,
    /// The hash of the `Authorization` header's values, in order.
    Credentials([u8; 16]),
}

impl Caller {
    /// The caller of a request with these headers.
    pub fn of(headers: &HeaderMap) -> Caller {
        let mut values = headers.get_all(AUTHORIZATION).iter().peekable();
        if values.peek().is_none() {
            return Caller::Anonymous;
        }
        // Tagged, so this hash is never equal to a fingerprint of the same
        // bytes; each value is length-prefixed by the hasher.
        let mut hasher = PartsHasher::new();
        hasher.update(b"idem-http caller");
        for value in values {
            hasher.update(value.as_bytes());
        }
        let digest = hasher.finish();
        let mut short = [0; 16];
        short.copy_from_slice(&digest.stored()[..16]);
        Caller::Credentials(short)
    }

    /// The scope of this caller's keys: `caller:anonymous`, or `caller:`
    /// and 32 hex digits. The prefix keeps these apart from a scope of
    /// `""`, the one records made before callers were told apart are in.
    pub fn scope(&self) -> String {
        match self {
            Caller::Anonymous => "caller:anonymous".to_owned(),
            Caller::Credentials(hash) => {
                let mut scope = String::with_capacity(7 + 32);
                scope.push_str("caller:");
                for byte in hash {
                    const HEX: &[u8; 16] = b"0123456789abcdef";
                    scope.push(char::from(HEX[usize::from(byte >> 4)]));
                    scope.push(char::from(HEX[usize::from(byte & 15)]));
                }
                scope
            }
        }
    }
}

/// Who owns a key when the application sets no scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DefaultScope {
    /// The caller's credentials ([`Caller`]).
    Caller,
    /// Nobody: every caller shares the key (the scope `""`).
    Shared,
}

impl Options {
    /// Lets every caller share a key, as the protocol did before callers
    /// were told apart: a request with a key and body another caller used
    /// gets that caller's recorded response. Use it only where all callers
    /// are one party (a service behind a gateway that authenticates for
    /// it). Records made before callers were told apart are in this shared
    /// scope, so they replay under this setting, and only under it.
    pub fn shared_across_callers(mut self) -> Options {
        self.default_scope = DefaultScope::Shared;
        self
    }

    /// Whether keys are shared across callers
    /// ([`shared_across_callers`](Options::shared_across_callers)).
    pub fn is_shared_across_callers(&self) -> bool {
        self.default_scope == DefaultScope::Shared
    }

    /// Whether a request checked in its caller's scope is refused when
    /// the same key and request have a live record in no scope: one made
    /// before callers were told apart, or by an instance that shares keys
    /// across callers. Such a record's caller is unknown, so it is neither
    /// replayed (it may be another caller's) nor run again (it may be this
    /// caller's): the request gets 409 `not-replayable`, or 409
    /// `in-progress` while it runs. A record of another request (another
    /// fingerprint) is no retry and is ignored. Default `true`. The check
    /// costs one store read on each first execution; turn it off once no
    /// such record can be live (the retention, 24 h by default, after
    /// every instance scopes by caller).
    pub fn check_unscoped_records(mut self, check: bool) -> Options {
        self.check_unscoped = check;
        self
    }

    /// The caller whose scope a request with these headers is checked in
    /// when the application names none; `None` when keys are shared.
    pub fn caller(&self, headers: &HeaderMap) -> Option<Caller> {
        match self.default_scope {
            DefaultScope::Caller => Some(Caller::of(headers)),
            DefaultScope::Shared => None,
        }
    }

    /// For a request about to run in its caller's scope: the problem to
    /// answer when [`unscoped_record`] finds a record this request may be
    /// a retry of, or `None` to run it.
    pub(crate) async fn unscoped_problem(
        &self,
        unscoped: &Idempotent,
        key: &str,
        fingerprints: &MatchingFingerprints,
    ) -> Result<Option<Problem>, idem_core::Error> {
        let found = async {
            unscoped_record(unscoped, key, fingerprints)
                .await
                .map_err(|source| idem_core::Error::Store {
                    source,
                    when: idem_core::When::BeforeWork,
                })
        };
        Ok(
            match self.timed(found, idem_core::When::BeforeWork).await? {
                None => None,
                Some(UnscopedRecord::InFlight(left)) => Some(Problem::InProgress(left)),
                Some(UnscopedRecord::Settled) => Some(Problem::NotReplayable(UNSCOPED)),
            },
        )
    }
}

/// Why a request that may retry a record in no scope is not answered
/// with it.
pub(crate) const UNSCOPED: &str =
    "it was recorded before keys were scoped by caller, so its caller is unknown";

/// A live record in no scope that a request checked in its caller's scope
/// may be a retry of (see [`unscoped_record`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnscopedRecord {
    /// Its request is running, for this much longer at most.
    InFlight(std::time::Duration),
    /// Its request ran.
    Settled,
}

/// Looks for the record of `key` in no scope (`unscoped`'s namespace,
/// scope `""`) that a request with these fingerprints may be a retry of:
/// one made before callers were told apart, or by an instance whose keys
/// are shared across callers. Its caller is unknown, so an adapter
/// neither replays it (it may be another caller's) nor runs the request
/// again (it may be this caller's): it refuses. A record of another
/// request (another fingerprint), or one whose owner's lease lapsed, is
/// no such record: `None`.
pub async fn unscoped_record(
    unscoped: &Idempotent,
    key: &str,
    fingerprints: &MatchingFingerprints,
) -> Result<Option<UnscopedRecord>, idem_core::store::StoreError> {
    let Ok(stored) = idem_core::Key::new(unscoped.namespace(), "", key) else {
        return Ok(None);
    };
    let Some(record) = unscoped.store().load(stored.as_str()).await? else {
        return Ok(None);
    };
    if !fingerprints.matches(&record.fingerprint) {
        return Ok(None);
    }
    Ok(match record.state {
        State::InFlight if record.lease_lapsed() => None,
        State::InFlight => Some(UnscopedRecord::InFlight(
            record.lease_remaining.unwrap_or_default(),
        )),
        _ => Some(UnscopedRecord::Settled),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(AUTHORIZATION, value.parse().unwrap());
        }
        headers
    }

    #[test]
    fn callers_are_told_apart_by_their_credentials_alone() {
        let alice = Caller::of(&headers(&["Bearer alice"]));
        assert_eq!(alice, Caller::of(&headers(&["Bearer alice"])));
        assert_ne!(alice, Caller::of(&headers(&["Bearer bob"])));
        assert_ne!(alice, Caller::Anonymous);
        assert_eq!(Caller::of(&headers(&[])), Caller::Anonymous);
        // An empty header is a credential, not its absence.
        assert_ne!(Caller::of(&headers(&[""])), Caller::Anonymous);
        // Two values are not one value holding both.
        assert_ne!(
            Caller::of(&headers(&["a", "b"])),
            Caller::of(&headers(&["ab"]))
        );
        let scope = alice.scope();
        assert_eq!(scope.len(), 7 + 32);
        assert!(scope.starts_with("caller:"));
        assert!(scope[7..].bytes().all(|b| b.is_ascii_hexdigit()));
    }

    /// A body of bytes in memory.
    struct Whole(bytes::Bytes);

    impl crate::ResponseBody for Whole {
        async fn collect(self, _limit: usize) -> crate::Collected<Self> {
            crate::Collected::Whole(self.0)
        }
    }

    /// Sends a POST with `key`, `body` and `authorization` (if any) through
    /// the exchange; counts the handler's runs in `runs`. Answers the
    /// status and whether it was a replay.
    async fn send(
        options: &Options,
        authorization: Option<&str>,
        key: &str,
        body: &str,
        runs: &std::sync::atomic::AtomicUsize,
    ) -> (u16, bool) {
        let mut request = http::Request::post("/payments")
            .header("idempotency-key", key)
            .header("content-type", "application/json");
        if let Some(value) = authorization {
            request = request.header(AUTHORIZATION, value);
        }
        let request = request.body(bytes::Bytes::from(body.to_owned())).unwrap();
        let crate::Admission::Protect(key) = options.admit(request.method(), request.headers())
        else {
            panic!("a POST with a key is protected");
        };
        let (parts, body) = request.into_parts();
        let fp = options.fingerprint(&parts.method, &parts.uri, &parts.headers, &body);
        let context = options.request_context(&parts.headers);
        let reply = options
            .exchange_with(options.idempotent(), &key, fp, context, || async {
                runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let response = http::Response::builder().status(201);
                Ok::<_, std::convert::Infallible>(
                    response.body(Whole(bytes::Bytes::from("charged"))).unwrap(),
                )
            })
            .await
            .unwrap();
        let crate::Reply::Whole(response) = reply else {
            panic!("a small answer is whole");
        };
        (
            response.status().as_u16(),
            response.headers().contains_key(crate::REPLAYED),
        )
    }

    fn runs() -> std::sync::atomic::AtomicUsize {
        std::sync::atomic::AtomicUsize::new(0)
    }

    fn ran(runs: &std::sync::atomic::AtomicUsize) -> usize {
        runs.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[tokio::test]
    async fn another_caller_with_the_same_key_and_body_runs_anew() {
        let options = Options::new(idem_core::MemoryStore::new());
        let n = runs();
        let body = r#"{"amount":1250}"#;
        let alice = Some("Bearer alice");
        assert_eq!(
            send(&options, alice, "order-1", body, &n).await,
            (201, false)
        );
        assert_eq!(
            send(&options, alice, "order-1", body, &n).await,
            (201, true)
        );
        assert_eq!(ran(&n), 1, "the same caller's retry replays");
        let bob = Some("Bearer bob");
        assert_eq!(send(&options, bob, "order-1", body, &n).await, (201, false));
        assert_eq!(ran(&n), 2, "another caller runs as a new request");
        assert_eq!(
            send(&options, None, "order-1", body, &n).await,
            (201, false)
        );
        assert_eq!(
            ran(&n),
            3,
            "an anonymous request never replays a caller's record"
        );
        assert_eq!(send(&options, None, "order-1", body, &n).await, (201, true));
        assert_eq!(
            ran(&n),
            3,
            "an anonymous retry replays the anonymous record"
        );

        // And the other way round: an anonymous record first.
        assert_eq!(
            send(&options, None, "order-2", body, &n).await,
            (201, false)
        );
        assert_eq!(
            send(&options, alice, "order-2", body, &n).await,
            (201, false)
        );
        assert_eq!(ran(&n), 5, "a caller never replays an anonymous record");
    }

    #[tokio::test]
    async fn shared_across_callers_shares_keys() {
        let options = Options::new(idem_core::MemoryStore::new()).shared_across_callers();
        let n = runs();
        let body = r#"{"amount":1250}"#;
        assert_eq!(
            send(&options, Some("Bearer alice"), "k", body, &n).await,
            (201, false)
        );
        assert_eq!(
            send(&options, Some("Bearer bob"), "k", body, &n).await,
            (201, true)
        );
        assert_eq!(send(&options, None, "k", body, &n).await, (201, true));
        assert_eq!(ran(&n), 1);
    }

    #[tokio::test]
    async fn an_application_scope_is_kept() {
        // A handle scoped by the application is never rescoped by caller.
        let idem = idem_core::Idempotent::new(idem_core::MemoryStore::new()).scoped("shop-1");
        let options = Options::from_idempotent(idem);
        let n = runs();
        let body = "{}";
        assert_eq!(
            send(&options, Some("Bearer a"), "k", body, &n).await,
            (201, false)
        );
        assert_eq!(
            send(&options, Some("Bearer b"), "k", body, &n).await,
            (201, true)
        );
        assert_eq!(ran(&n), 1);
    }

    #[tokio::test]
    async fn records_made_before_callers_were_told_apart_neither_replay_nor_run_again() {
        // Pins the upgrade: a record in no scope (what an earlier build
        // wrote, byte for byte) must not be replayed to whoever sends its
        // key, nor run a second time for its own caller.
        let store: std::sync::Arc<dyn idem_core::store::Store> =
            std::sync::Arc::new(idem_core::MemoryStore::new());
        let earlier = Options::new(store.clone()).shared_across_callers();
        let now = Options::new(store.clone());
        let n = runs();
        let body = r#"{"amount":1250}"#;
        assert_eq!(
            send(&earlier, Some("Bearer alice"), "old", body, &n).await,
            (201, false)
        );
        for caller in [Some("Bearer alice"), Some("Bearer bob"), None] {
            assert_eq!(send(&now, caller, "old", body, &n).await, (409, false));
        }
        assert_eq!(
            ran(&n),
            1,
            "a possible retry of an unscoped record never runs"
        );
        // Another request under the same key is no retry of it.
        assert_eq!(
            send(&now, Some("Bearer bob"), "old", "{}", &n).await,
            (201, false)
        );
        assert_eq!(ran(&n), 2);
        // The refusal left no claim behind: switched off, the check lets
        // the request run in its caller's scope.
        let unchecked = Options::new(store.clone()).check_unscoped_records(false);
        assert_eq!(
            send(&unchecked, Some("Bearer alice"), "old", body, &n).await,
            (201, false)
        );
        assert_eq!(ran(&n), 3);
        // Under the opt-out the old record replays, as it always did.
        assert_eq!(
            send(&earlier, Some("Bearer carol"), "old", body, &n).await,
            (201, true)
        );
        assert_eq!(ran(&n), 3);
    }

    #[tokio::test]
    async fn an_unscoped_request_in_flight_is_answered_in_progress() {
        let store: std::sync::Arc<dyn idem_core::store::Store> =
            std::sync::Arc::new(idem_core::MemoryStore::new());
        let unscoped = idem_core::Idempotent::new(store.clone());
        let options = Options::new(store.clone());
        let request = http::Request::post("/payments")
            .header("content-type", "application/json")
            .body(bytes::Bytes::from_static(b"{}"))
            .unwrap();
        let fp = options.fingerprint(
            request.method(),
            request.uri(),
            request.headers(),
            request.body(),
        );
        // An earlier build's request, running.
        let idem_core::Begin::Run(_lease) = unscoped.begin("k", fp.current()).await.unwrap() else {
            panic!("the key is new");
        };
        let n = runs();
        assert_eq!(
            send(&options, Some("Bearer a"), "k", "{}", &n).await,
            (409, false)
        );
        assert_eq!(ran(&n), 0);
    }

    #[test]
    fn shared_across_callers_reads_no_caller() {
        let options = Options::new(idem_core::MemoryStore::new());
        let with = headers(&["Bearer alice"]);
        assert_eq!(options.caller(&with), Some(Caller::of(&with)));
        assert!(!options.is_shared_across_callers());
        let shared = options.shared_across_callers();
        assert_eq!(shared.caller(&with), None);
        assert!(shared.is_shared_across_callers());
    }
}
