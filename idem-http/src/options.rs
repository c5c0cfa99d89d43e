//! `Options`: the settings every adapter offers, with the same names.

use std::time::Duration;

use http::{HeaderName, Method};
use idem_core::{Idempotent, Store};

/// The default limit on request and recorded response bodies: 1 MiB.
const DEFAULT_MAX_BODY: usize = 1024 * 1024;

/// The default bound on one store call.
const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(5);

/// The settings of the protocol, shared by every adapter: which requests are
/// protected, the limits, and what a store failure does. An adapter adds
/// only what is framework-typed (the scope extractor) and forwards its
/// `with_*` methods here.
#[derive(Debug, Clone)]
pub struct Options {
    pub(crate) idem: Idempotent,
    pub(crate) header: HeaderName,
    pub(crate) require_key: bool,
    pub(crate) methods: Vec<Method>,
    pub(crate) max_request_body: usize,
    pub(crate) max_response_body: usize,
    pub(crate) record_server_errors: bool,
    pub(crate) fail_open: bool,
    pub(crate) store_timeout: Duration,
}

impl Options {
    /// Protects requests with `store`, with a 60 s lease and a 24 h
    /// retention.
    pub fn new<S: Store>(store: S) -> Options {
        Options::from_idempotent(Idempotent::new(store))
    }

    /// Protects requests with an [`Idempotent`] whose lease, retention,
    /// namespace and scope are already set.
    pub fn from_idempotent(idem: Idempotent) -> Options {
        Options {
            idem,
            header: HeaderName::from_static("idempotency-key"),
            require_key: false,
            methods: vec![Method::POST, Method::PATCH],
            max_request_body: DEFAULT_MAX_BODY,
            max_response_body: DEFAULT_MAX_BODY,
            record_server_errors: false,
            fail_open: false,
            store_timeout: DEFAULT_STORE_TIMEOUT,
        }
    }

    /// Reads the key from this header instead of `Idempotency-Key`.
    pub fn with_header_name(mut self, name: HeaderName) -> Options {
        self.header = name;
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

    /// The largest response body that is recorded for replay, in bytes.
    /// A larger one still reaches its client, and the key is marked as
    /// executed without a replayable response. Default 1 MiB.
    pub fn with_max_response_body(mut self, bytes: usize) -> Options {
        self.max_response_body = bytes;
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
}
