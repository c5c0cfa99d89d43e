//! `Options`: the settings every adapter offers, with the same names.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method};
use idem_core::store::Store;
use idem_core::Idempotent;

use crate::keysource::KeySource;
use crate::metrics::ResponseKeys;
use crate::policy::{FingerprintPolicy, Route};
use crate::scope::DefaultScope;

/// The default limit on request and recorded response bodies: 1 MiB.
const DEFAULT_MAX_BODY: usize = 1024 * 1024;

/// The default limit on a response recorded in chunks while it streams:
/// 100 MiB.
pub const DEFAULT_MAX_STREAMED_BODY: u64 = 100 * 1024 * 1024;

/// The default bound on one store call.
const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(5);

/// The default cap on a `Prefer: wait=N` wait: 10 s. A waiting request
/// holds its connection open, so the layer, not the client, bounds it.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(10);

/// The settings of the protocol, shared by every adapter: which requests are
/// protected, whose keys they are, the limits, and what a store failure
/// does. An adapter adds only what is framework-typed (the scope
/// extractor) and forwards its `with_*` methods here.
#[derive(Debug, Clone)]
pub struct Options {
    pub(crate) idem: Idempotent,
    pub(crate) header: HeaderName,
    pub(crate) require_key: bool,
    pub(crate) methods: Vec<Method>,
    pub(crate) max_request_body: usize,
    pub(crate) max_response_body: usize,
    pub(crate) max_streamed_body: u64,
    pub(crate) record_server_errors: bool,
    pub(crate) fail_open: bool,
    pub(crate) store_timeout: Duration,
    pub(crate) max_wait: Duration,
    pub(crate) body_key: Option<KeySource>,
    pub(crate) policy: FingerprintPolicy,
    pub(crate) routes: Vec<(Route, FingerprintPolicy)>,
    pub(crate) response_keys: Arc<ResponseKeys>,
    pub(crate) default_scope: DefaultScope,
    pub(crate) check_unscoped: bool,
}

impl Options {
    /// Protects requests with `store`, with a 60 s lease and a 24 h
    /// retention.
    pub fn new<S: Store>(store: S) -> Options {
        Options::from_idempotent(Idempotent::new(store))
    }

    /// Protects requests with an [`Idempotent`] whose lease, retention,
    /// namespace and scope are already set. A handle with a scope keeps
    /// it for every request; one without is scoped by each request's
    /// caller (see [`Caller`](crate::Caller)).
    pub fn from_idempotent(idem: Idempotent) -> Options {
        Options {
            response_keys: ResponseKeys::new(&idem),
            idem,
            header: HeaderName::from_static("idempotency-key"),
            require_key: false,
            methods: vec![Method::POST, Method::PATCH],
            max_request_body: DEFAULT_MAX_BODY,
            max_response_body: DEFAULT_MAX_BODY,
            max_streamed_body: DEFAULT_MAX_STREAMED_BODY,
            record_server_errors: false,
            fail_open: false,
            store_timeout: DEFAULT_STORE_TIMEOUT,
            max_wait: DEFAULT_MAX_WAIT,
            body_key: None,
            policy: FingerprintPolicy::default(),
            routes: Vec::new(),
            default_scope: DefaultScope::Caller,
            check_unscoped: true,
        }
    }

    /// Reads the key from this header instead of `Idempotency-Key`.
    pub fn with_header_name(mut self, name: HeaderName) -> Options {
        self.header = name;
        self.body_key = None;
        self
    }

    /// Whether a protected request without a key is refused with 400
    /// (`true`) or passed through unprotected (`false`, the default).
    pub fn require_key(mut self, required: bool) -> Options {
        self.require_key = required;
        self
    }

    /// The methods to protect, replacing the default `POST` and `PATCH`.
    pub fn with_methods(mut self, methods: impl IntoIterator<Item = Method>) -> Options {
        self.methods = methods.into_iter().collect();
        self
    }

    /// The largest request body a protected request may carry, in bytes;
    /// larger ones get 413. Default 1 MiB.
    pub fn with_max_request_body(mut self, bytes: usize) -> Options {
        self.max_request_body = bytes;
        self
    }

    /// The largest response body that is recorded whole, in one record,
    /// in bytes. A larger one streams to its client and is recorded in
    /// chunks as it goes, up to [`with_max_streamed_body`](Options::with_max_streamed_body).
    /// Default 1 MiB.
    pub fn with_max_response_body(mut self, bytes: usize) -> Options {
        self.max_response_body = bytes;
        self
    }

    /// The largest response body that is recorded in chunks while it
    /// streams, in bytes. A larger one still reaches its client, and the
    /// key is marked as executed without a replayable response (retries
    /// get 409 `not-replayable`). At or below
    /// [`with_max_response_body`](Options::with_max_response_body) no
    /// response is streamed into the store. Default 100 MiB.
    pub fn with_max_streamed_body(mut self, bytes: u64) -> Options {
        self.max_streamed_body = bytes;
        self
    }

    /// Whether 5xx responses are recorded and replayed (`true`) or release
    /// the key so that a retry runs the handler again (`false`, the
    /// default).
    pub fn record_server_errors(mut self, record: bool) -> Options {
        self.record_server_errors = record;
        self
    }

    /// Whether a store failure lets the request through to the handler
    /// without idempotency (`true`) or answers 503 (`false`, the default).
    /// Either way the failure is logged.
    pub fn fail_open(mut self, open: bool) -> Options {
        self.fail_open = open;
        self
    }

    /// The longest one store call may take before it counts as a store
    /// failure, so that a hung backend cannot hang requests. Default 5 s.
    pub fn with_store_timeout(mut self, timeout: Duration) -> Options {
        self.store_timeout = timeout;
        self
    }

    /// The longest a request with `Prefer: wait=N` (RFC 7240) waits for
    /// the outcome of its key when it finds it in progress, instead of
    /// getting 409: `min(N, max)`. Default [`DEFAULT_MAX_WAIT`] (10 s);
    /// zero ignores the preference. A request without the header is
    /// answered as before.
    pub fn with_max_wait(mut self, max: Duration) -> Options {
        self.max_wait = max;
        self
    }

    /// How long a request with these headers may wait for its key:
    /// its `Prefer: wait=N`, capped by [`with_max_wait`](Options::with_max_wait);
    /// `None` without the preference, for `wait=0` or when waiting is off.
    pub fn wait_for(&self, headers: &http::HeaderMap) -> Option<Duration> {
        crate::preferred_wait(headers)
            .map(|wait| wait.min(self.max_wait))
            .filter(|wait| !wait.is_zero())
    }

    /// The [`Idempotent`] requests are checked with, before any scope.
    pub fn idempotent(&self) -> &Idempotent {
        &self.idem
    }

    /// The key header's name.
    pub fn header_name(&self) -> &HeaderName {
        &self.header
    }

    /// The request body limit, in bytes.
    pub fn max_request_body(&self) -> usize {
        self.max_request_body
    }

    /// The recorded response body limit, in bytes.
    pub fn max_response_body(&self) -> usize {
        self.max_response_body
    }

    /// The largest response body recorded in chunks while it streams.
    pub fn max_streamed_body(&self) -> u64 {
        self.max_streamed_body
    }
}

/// Writes the `with_*` setters of [`Options`] on an adapter's builder, so
/// that every adapter offers the same options under the same names with
/// the same docs. The type must have a method
/// `fn map_options(self, change: impl FnOnce(Options) -> Options) -> Self`.
///
/// ```
/// use idem_http::Options;
///
/// /// An adapter's builder.
/// pub struct Middleware {
///     options: Options,
/// }
///
/// impl Middleware {
///     fn map_options(mut self, change: impl FnOnce(Options) -> Options) -> Self {
///         self.options = change(self.options);
///         self
///     }
///
///     idem_http::option_setters!();
/// }
///
/// let m = Middleware { options: Options::new(idem_core::MemoryStore::new()) }.require_key(true);
/// # let _ = m;
/// ```
#[macro_export]
macro_rules! option_setters {
    () => {
        /// Reads the key from this header instead of `Idempotency-Key`.
        pub fn with_header_name(self, name: $crate::http::HeaderName) -> Self {
            self.map_options(|o| o.with_header_name(name))
        }

        /// Whether a protected request without a key is refused with 400
        /// (`true`) or passed through unprotected (`false`, the default).
        pub fn require_key(self, required: bool) -> Self {
            self.map_options(|o| o.require_key(required))
        }

        /// The methods to protect, replacing the default `POST` and `PATCH`.
        pub fn with_methods(
            self,
            methods: impl ::std::iter::IntoIterator<Item = $crate::http::Method>,
        ) -> Self {
            self.map_options(|o| o.with_methods(methods))
        }

        /// The largest request body a protected request may carry, in bytes;
        /// larger ones get 413. Default 1 MiB.
        pub fn with_max_request_body(self, bytes: usize) -> Self {
            self.map_options(|o| o.with_max_request_body(bytes))
        }

        /// The largest response body that is recorded whole, in one
        /// record, in bytes. A larger one streams to its client and is
        /// recorded in chunks as it goes, up to `with_max_streamed_body`.
        /// Default 1 MiB.
        pub fn with_max_response_body(self, bytes: usize) -> Self {
            self.map_options(|o| o.with_max_response_body(bytes))
        }

        /// The largest response body that is recorded in chunks while it
        /// streams, in bytes. A larger one still reaches its client, and
        /// the key is marked as executed without a replayable response.
        /// Default 100 MiB.
        pub fn with_max_streamed_body(self, bytes: u64) -> Self {
            self.map_options(|o| o.with_max_streamed_body(bytes))
        }

        /// Whether 5xx responses are recorded and replayed (`true`) or release
        /// the key so that a retry runs the handler again (`false`, the
        /// default).
        pub fn record_server_errors(self, record: bool) -> Self {
            self.map_options(|o| o.record_server_errors(record))
        }

        /// Whether a store failure lets the request through to the handler
        /// without idempotency (`true`) or answers 503 (`false`, the default).
        /// Either way the failure is logged.
        pub fn fail_open(self, open: bool) -> Self {
            self.map_options(|o| o.fail_open(open))
        }

        /// Lets every caller share a key: a request with a key and body
        /// another caller used gets that caller's recorded response. By
        /// default a key is scoped by its caller's `Authorization` header,
        /// hashed, unless a scope is set; see `idem_http::Caller`.
        pub fn shared_across_callers(self) -> Self {
            self.map_options(|o| o.shared_across_callers())
        }

        /// Whether a request scoped by its caller is refused (409) when the
        /// same key and request have a live record in no scope, made
        /// before callers were told apart (`true`, the default). It costs
        /// one store read on each first execution.
        pub fn check_unscoped_records(self, check: bool) -> Self {
            self.map_options(|o| o.check_unscoped_records(check))
        }

        /// The longest one store call may take before it counts as a store
        /// failure, so that a hung backend cannot hang requests. Default 5 s.
        pub fn with_store_timeout(self, timeout: ::std::time::Duration) -> Self {
            self.map_options(|o| o.with_store_timeout(timeout))
        }

        /// The longest a request with `Prefer: wait=N` (RFC 7240) waits for
        /// the outcome of its key when it finds it in progress, instead of
        /// getting 409: `min(N, max)`, answered with `Preference-Applied:
        /// wait`. Default 10 s; zero ignores the preference.
        pub fn with_max_wait(self, max: ::std::time::Duration) -> Self {
            self.map_options(|o| o.with_max_wait(max))
        }

        /// Reads the key from `source` (a JSON Pointer into the body, a
        /// function over the request) instead of the `Idempotency-Key`
        /// header; see `idem_http::KeySource`.
        pub fn with_key_source(self, source: $crate::KeySource) -> Self {
            self.map_options(|o| o.with_key_source(source))
        }

        /// What the fingerprint of every request covers, unless a route
        /// policy names its path; see `idem_http::FingerprintPolicy`.
        pub fn with_fingerprint_policy(self, policy: $crate::FingerprintPolicy) -> Self {
            self.map_options(|o| o.with_fingerprint_policy(policy))
        }

        /// What the fingerprint of requests whose path matches `pattern`
        /// covers: `{id}` matches any one segment, a last `**` any rest;
        /// the first pattern set that matches decides. See
        /// `idem_http::PathPattern`; panics on a pattern that is not one.
        pub fn with_route_fingerprint_policy(
            self,
            pattern: &str,
            policy: $crate::FingerprintPolicy,
        ) -> Self {
            self.map_options(|o| o.with_route_fingerprint_policy(pattern, policy))
        }
    };
}
