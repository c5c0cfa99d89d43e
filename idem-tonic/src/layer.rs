//! `IdempotencyLayer`: the settings, and the tower `Layer` that applies them.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::HeaderName;
use idem_core::store::Store;
use idem_core::Idempotent;
use tonic::Code;
use tower_layer::Layer;

use crate::protocol::{KEY, RELEASED};
use crate::IdempotencyService;

/// The namespace [`IdempotencyLayer::new`] keeps its records in, apart
/// from the HTTP layers' (which use none), so that one store serves both.
pub const NAMESPACE: &str = "grpc";

type ScopeFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;
type KeyFn = dyn Fn(&[u8]) -> Result<Option<String>, prost::DecodeError> + Send + Sync;

/// Where a protected method's key comes from.
#[derive(Clone)]
pub(crate) enum KeySource {
    /// The key metadata entry.
    Metadata,
    /// A field of the request message, read by decoding it.
    Message(Arc<KeyFn>),
}

/// Makes unary gRPC calls safe to retry: each named method runs at most
/// once per idempotency key, and every retry gets its recorded answer back
/// (message, status and trailers, byte for byte, marked with
/// `idempotent-replayed: true` in the headers).
///
/// ```text
///  call to a named unary method, key valid
///     └──▶ begin(key, fingerprint) ──▶ Run:    the handler runs once; its answer is
///                │                             recorded (OK, non-retryable errors)
///                │                             or the key released (retryable errors)
///                ├──▶ Replay: the recorded answer, `idempotent-replayed: true`
///                └──▶ a status of the layer's own (table below)
/// ```
///
/// # Which calls
///
/// A unary call and a streaming one look alike on the wire (a `POST` with
/// length-prefixed messages), so the layer protects only the methods it is
/// given, by full path (`/package.Service/Method`), each of which must be
/// unary: [`unary`](Self::unary) takes the key from metadata,
/// [`unary_keyed_by`](Self::unary_keyed_by) from the request message.
/// Every other call, streaming ones included, passes through untouched and
/// the store is not touched.
///
/// # What each call gets
///
/// | call | answer |
/// |---|---|
/// | method not named | passed through |
/// | no key | passed through, or `INVALID_ARGUMENT` with [`require_key`](Self::require_key) |
/// | key empty, over 255 characters, not visible ASCII; message that does not decode | `INVALID_ARGUMENT` |
/// | request message over [`with_max_request_message`](Self::with_max_request_message) | `RESOURCE_EXHAUSTED` |
/// | key in use by a running call | `ABORTED` with `grpc-retry-pushback-ms` = the time left on its lease; or, with `prefer: wait=N` metadata, the answer once it is recorded (waiting at most [`with_max_wait`](Self::with_max_wait)) |
/// | key used with another method or message | `FAILED_PRECONDITION` |
/// | key whose answer is recorded | that answer, byte for byte, with `idempotent-replayed: true` |
/// | key whose call ran but whose answer could not be kept | `ALREADY_EXISTS`: it will not run again |
/// | store failure or timeout before the handler ran | `UNAVAILABLE` (nothing ran; safe to retry), or the handler runs unprotected with [`fail_open`](Self::fail_open) |
/// | handler panicked | `INTERNAL`; the key stays claimed until its lease lapses |
/// | recorded answer that does not decode | `INTERNAL` |
///
/// AIP-155 (`request_id`) and AEP-155 (`idempotency_key`) ask a server to
/// answer a duplicate with the earlier response, or with an error where
/// that is not possible, and name no status for a key reused with another
/// request; the layer answers `FAILED_PRECONDITION`, which AIP-194 lists
/// among the codes a client must not retry until the system's state
/// changes: the record under the key, not the request, is what refuses it.
/// `ABORTED` with a pushback is gRFC A6's way to say "retry after this
/// long", which the [`RetryLayer`](crate::RetryLayer) honours.
///
/// # What is recorded
///
/// The handler's answer is read whole: headers, the response message and
/// the trailers (`grpc-status`, `grpc-message`, trailing metadata). `OK`
/// and the errors a retry would get again (`INVALID_ARGUMENT`,
/// `NOT_FOUND`, `FAILED_PRECONDITION`, …) are recorded; `UNAVAILABLE`,
/// `RESOURCE_EXHAUSTED`, `INTERNAL`, `UNKNOWN` and `DEADLINE_EXCEEDED`
/// release the key so that a retry runs the handler again
/// ([`release_codes`](Self::release_codes) changes the list). An answer
/// over [`with_max_response`](Self::with_max_response) reaches its client
/// but only a marker is kept, so a retry gets `ALREADY_EXISTS` rather than
/// a second run. The stored form is described in [`crate::stored`].
///
/// # The fingerprint
///
/// The full method path and the request message's bytes as the client
/// encoded them ([`crate::fingerprint`]). Protobuf encoders in use write
/// fields in field-number order and the same value the same way, so a
/// retry of the same request is the same bytes; but the encoding is not
/// canonical (map entries may come in any order, unknown fields are kept,
/// another encoder may order fields otherwise), and a retry that
/// re-encodes the message with such a difference is answered
/// `FAILED_PRECONDITION`. Keep the encoded request for retries (the
/// [`RetryLayer`](crate::RetryLayer) resends the same bytes), or read the
/// key from the message ([`unary_keyed_by`](Self::unary_keyed_by)) and
/// make the key itself name the request.
///
/// # Records apart from HTTP's
///
/// [`new`](Self::new) keeps its records under the namespace
/// [`NAMESPACE`] (`grpc`), so the HTTP layers and this one can share a
/// store and a key without meeting. [`from_idempotent`](Self::from_idempotent)
/// keeps the namespace it is given.
///
/// # Never twice, never stuck
///
/// From the claim on, the exchange cannot be cancelled: a client that
/// hangs up (or a connection cut) leaves the handler and its recording
/// running in a task of their own, so the retry gets the replay. The
/// handler runs under a lease renewed every third of its length. A store
/// call slower than [`with_store_timeout`](Self::with_store_timeout)
/// counts as a store failure. The layer needs a tokio runtime.
#[derive(Clone)]
pub struct IdempotencyLayer {
    config: Arc<Config>,
}

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) idem: Idempotent,
    pub(crate) methods: HashMap<String, KeySource>,
    pub(crate) key: HeaderName,
    pub(crate) require_key: bool,
    pub(crate) released: Vec<Code>,
    pub(crate) max_request: usize,
    pub(crate) max_response: usize,
    pub(crate) store_timeout: Duration,
    pub(crate) fail_open: bool,
    pub(crate) max_wait: Duration,
    pub(crate) scope: Option<Arc<ScopeFn>>,
    pub(crate) shared: bool,
    pub(crate) check_unscoped: bool,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut methods: Vec<&str> = self.methods.keys().map(String::as_str).collect();
        methods.sort_unstable();
        f.debug_struct("Config")
            .field("namespace", &self.idem.namespace())
            .field("methods", &methods)
            .field("key", &self.key)
            .field("require_key", &self.require_key)
            .field("released", &self.released)
            .field("max_request", &self.max_request)
            .field("max_response", &self.max_response)
            .field("store_timeout", &self.store_timeout)
            .field("fail_open", &self.fail_open)
            .field("max_wait", &self.max_wait)
            .field("shared", &self.shared)
            .field("check_unscoped", &self.check_unscoped)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("IdempotencyLayer")
            .field(&self.config)
            .finish()
    }
}

impl IdempotencyLayer {
    /// Protects the methods named next with `store`, with a 60 s lease, a
    /// 24 h retention and the namespace [`NAMESPACE`]. Accepts an
    /// `Arc<dyn Store>` as well as a store by value.
    pub fn new<S: Store>(store: S) -> Self {
        IdempotencyLayer::from_idempotent(Idempotent::new(store).with_namespace(NAMESPACE))
    }

    /// Protects the methods named next with an [`Idempotent`] whose lease,
    /// retention and namespace are already set.
    pub fn from_idempotent(idem: Idempotent) -> Self {
        IdempotencyLayer {
            config: Arc::new(Config {
                idem,
                methods: HashMap::new(),
                key: KEY,
                require_key: false,
                released: RELEASED.to_vec(),
                max_request: 1024 * 1024,
                max_response: 1024 * 1024,
                store_timeout: Duration::from_secs(5),
                fail_open: false,
                max_wait: idem_http::DEFAULT_MAX_WAIT,
                scope: None,
                shared: false,
                check_unscoped: true,
            }),
        }
    }

    fn map(mut self, change: impl FnOnce(&mut Config)) -> Self {
        change(Arc::make_mut(&mut self.config));
        self
    }

    /// Protects the unary method at `path` (`/package.Service/Method`),
    /// its key read from the key metadata entry.
    pub fn unary(self, path: impl Into<String>) -> Self {
        self.map(|config| {
            config.methods.insert(path.into(), KeySource::Metadata);
        })
    }

    /// Protects the unary method at `path`, its key read from the request
    /// message `M` by `key` (say, AIP-155's `request_id`; `None` or an
    /// empty string is a call without a key). The layer decodes the
    /// message once for this, from the bytes it reads for the fingerprint;
    /// the handler's own decoding is tonic's. A compressed message cannot
    /// be read this way and is refused with `INVALID_ARGUMENT`.
    pub fn unary_keyed_by<M, F>(self, path: impl Into<String>, key: F) -> Self
    where
        M: prost::Message + Default,
        F: Fn(&M) -> Option<String> + Send + Sync + 'static,
    {
        let read = move |bytes: &[u8]| M::decode(bytes).map(|message| key(&message));
        self.map(|config| {
            config
                .methods
                .insert(path.into(), KeySource::Message(Arc::new(read)));
        })
    }

    /// Reads the key from this metadata entry instead of `idempotency-key`.
    pub fn with_metadata_key(self, name: HeaderName) -> Self {
        self.map(|config| config.key = name)
    }

    /// Whether a call to a protected method without a key is refused with
    /// `INVALID_ARGUMENT` (`true`) or passed through unprotected (`false`,
    /// the default).
    pub fn require_key(self, required: bool) -> Self {
        self.map(|config| config.require_key = required)
    }

    /// The statuses that release the key instead of being recorded,
    /// replacing the default [`RELEASED`](crate::RELEASED). `OK` is always
    /// recorded.
    pub fn release_codes(self, codes: impl IntoIterator<Item = Code>) -> Self {
        self.map(|config| config.released = codes.into_iter().collect())
    }

    /// The largest request message a protected call may carry, in bytes
    /// (framing included); a larger one gets `RESOURCE_EXHAUSTED`.
    /// Default 1 MiB.
    pub fn with_max_request_message(self, bytes: usize) -> Self {
        self.map(|config| config.max_request = bytes)
    }

    /// The largest response message that is recorded for replay, in
    /// bytes. A larger one still reaches its client, and the key is marked
    /// as run without a replayable answer. Default 1 MiB.
    pub fn with_max_response(self, bytes: usize) -> Self {
        self.map(|config| config.max_response = bytes)
    }

    /// The longest one store call may take before it counts as a store
    /// failure. Default 5 s.
    pub fn with_store_timeout(self, timeout: Duration) -> Self {
        self.map(|config| config.store_timeout = timeout)
    }

    /// Whether a store failure lets the call through to the handler without
    /// idempotency (`true`) or answers `UNAVAILABLE` (`false`, the
    /// default). Either way the failure is logged.
    pub fn fail_open(self, open: bool) -> Self {
        self.map(|config| config.fail_open = open)
    }

    /// The longest a call with `prefer: wait=N` metadata (seconds, as in
    /// RFC 7240) waits for the answer of its key when it finds it in
    /// flight, instead of getting `ABORTED`: `min(N, max)`. Default 10 s;
    /// zero ignores the preference.
    pub fn with_max_wait(self, max: Duration) -> Self {
        self.map(|config| config.max_wait = max)
    }

    /// Gives each tenant or principal its own keys: `f` reads the scope from
    /// the request (say, an authenticated user id an outer layer placed in
    /// the extensions). `None` or `""` leaves the call to the default: its
    /// caller's `authorization` metadata, hashed ([`idem_http::Caller`]),
    /// or one scope for all with
    /// [`shared_across_callers`](Self::shared_across_callers).
    pub fn with_scope<F>(self, f: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.map(|config| config.scope = Some(Arc::new(f)))
    }

    /// Lets every caller share a key: a call with a key and message
    /// another caller used gets that caller's recorded answer. By default
    /// a key is scoped by its caller's `authorization` metadata, hashed,
    /// unless a scope is set. Records made before callers were told apart
    /// replay under this setting, and only under it.
    pub fn shared_across_callers(self) -> Self {
        self.map(|config| config.shared = true)
    }

    /// Whether a call scoped by its caller is refused when the same key and
    /// message have a live record in no scope, made before callers were
    /// told apart: `ALREADY_EXISTS` once it ran, `ABORTED` while it runs
    /// (`true`, the default). Its caller is unknown, so it is neither
    /// replayed nor run again. It costs one store read on each first
    /// execution; turn it off once no such record can be live.
    pub fn check_unscoped_records(self, check: bool) -> Self {
        self.map(|config| config.check_unscoped = check)
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService::new(inner, Arc::clone(&self.config))
    }
}
