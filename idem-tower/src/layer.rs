//! `IdempotencyLayer`: the settings, and the tower `Layer` that applies them.

use std::fmt;
use std::sync::Arc;

use http::request::Parts;
use idem_core::store::Store;
use idem_core::Idempotent;
use idem_http::Options;
use tower_layer::Layer;

use crate::IdempotencyService;

type ScopeFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// Makes `POST` and `PATCH` handlers safe to retry with an
/// `Idempotency-Key` header: the handler runs at most once per key and
/// every retry gets its recorded response back.
///
/// ```text
///                  key valid, body within limit
///  request ──▶ begin(key, fingerprint) ──▶ Run:    handler runs once, its response is
///                 │                                recorded (2xx–4xx), then returned
///                 ├──▶ Replay: the recorded response, `Idempotent-Replayed: true`
///                 └──▶ a problem response (table below)
/// ```
///
/// # What each request gets
///
/// | request | answer |
/// |---|---|
/// | method not protected (default: anything but `POST`, `PATCH`) | passed through; the store is not touched |
/// | no key header | passed through, or **400** with [`require_key`](Self::require_key) |
/// | two key headers, a list, parameters (`"k";p=1`), bad quoting, empty, over 255 characters, not visible ASCII | **400** |
/// | body over [`with_max_request_body`](Self::with_max_request_body) | **413** |
/// | key in use by a running request | **409** with `Retry-After` (seconds, rounded up, at least 1) |
/// | key used with another method, path and query, content type or body | **422** |
/// | key whose response is recorded | that response, byte for byte, with `Idempotent-Replayed: true` |
/// | key whose request ran but whose response could not be kept | **409**, problem type `not-replayable`, no `Retry-After`: it will not run again |
/// | store failure or timeout before the handler ran | **503**, or the handler runs unprotected with [`fail_open`](Self::fail_open) |
/// | request body that fails while read | **400** |
/// | handler panicked | **500**; the key stays claimed until its lease lapses |
/// | handler's response body failed while read | **500**; retries get the `not-replayable` 409 |
/// | recorded response that does not decode | **500** |
///
/// Every answer the middleware makes itself is `application/problem+json`
/// (RFC 9457) with `type`, `title`, `status` and `detail`; `type` is
/// `tag:idem-rs.github.io,2025:problem/<name>` with names `invalid-key`,
/// `missing-key`, `unreadable-body`, `body-too-large`, `in-progress`,
/// `mismatch`, `not-replayable`, `store-unavailable` and `internal`.
///
/// # The key
///
/// The header value is either the draft's structured-field string
/// (`"order-7f3a"`, with `\"` and `\\` escapes) or a bare value
/// (`order-7f3a`); both name the same key. A bare value may not hold `"`,
/// `,` or `;`. The key is 1–255 visible ASCII characters
/// ([`idem_core::Key::validate_client_key`]).
///
/// # Whose key it is
///
/// Two callers never share a record by default: a key is checked in its
/// caller's scope, read from the `Authorization` header and hashed
/// ([`idem_http::Caller`]). Requests without the header share one
/// anonymous scope, apart from every authenticated caller. The scope
/// extractor ([`with_scope`](Self::with_scope)) names the tenant or
/// principal instead; set it when callers authenticate by cookie, or when
/// a client's token changes between its retries.
/// [`shared_across_callers`](Self::shared_across_callers) lets every
/// caller share keys. Records made before callers were told apart are in
/// no scope: a request that may retry one is refused with 409
/// `not-replayable`, never run again nor answered with another caller's
/// response ([`check_unscoped_records`](Self::check_unscoped_records)).
///
/// # What is recorded
///
/// The fingerprint is [`idem_http::Options::fingerprint`]: the method, the
/// path and query, the `Content-Type` value and the body; a JSON body
/// (`application/json` or `+json`) counts in its canonical form, so a retry
/// that re-serialises it with another field order or whitespace is the same
/// request, and so do form and `multipart/form-data` bodies (fields in any
/// order, a new multipart boundary). Records written before those changes
/// (raw body bytes) keep replaying. Apply the layer to the outermost
/// router: a nested router sees a shortened path.
///
/// What the fingerprint covers can be narrowed for every request
/// ([`with_fingerprint_policy`](Self::with_fingerprint_policy)) or per path
/// ([`with_route_fingerprint_policy`](Self::with_route_fingerprint_policy)):
/// JSON Pointers left out or picked, the query or some of its parameters
/// ignored, a function of your own ([`idem_http::FingerprintPolicy`]).
///
/// ```
/// use idem_core::MemoryStore;
/// use idem_http::{FingerprintPolicy, KeySource};
/// use idem_tower::IdempotencyLayer;
///
/// let layer = IdempotencyLayer::new(MemoryStore::new())
///     .with_route_fingerprint_policy("/orders", FingerprintPolicy::new().exclude(["/client_ts"]))
///     // AIP-155: the key is the body's `request_id`.
///     .with_key_source(KeySource::json_pointer("/request_id"));
/// # let _ = layer;
/// ```
///
/// The key can come from the body or from a function over the request
/// instead of the header ([`with_key_source`](Self::with_key_source),
/// [`idem_http::KeySource`]); the body is then read (within the request
/// limit) before the key is known, and a request without one is passed
/// through or refused as for a missing header.
///
/// Responses with status 200–499 are recorded before they are sent; 5xx
/// responses, handler errors and 1xx responses release the key so a retry
/// runs the handler again ([`record_server_errors`](Self::record_server_errors)
/// records 5xx too). The record keeps the status, the headers except
/// `Set-Cookie` and hop-by-hop ones (`Connection` and those it names,
/// `Keep-Alive`, `Proxy-*`, `TE`, `Trailer`, `Transfer-Encoding`,
/// `Upgrade`), and the body; trailers are dropped. A body over
/// [`with_max_response_body`](Self::with_max_response_body) is streamed to
/// its client in full but only a marker is recorded, so retries get the
/// `not-replayable` 409 instead of a second run. The stored form is a small
/// versioned binary format (version byte, status, length-prefixed headers,
/// body); a record that does not decode is answered with a 500 problem.
///
/// # Types
///
/// The layer wraps any `Service<Request<`[`RequestBody`](crate::RequestBody)`>>`
/// that answers `Response<B>` with `B: Body<Data = Bytes> + Send + 'static`,
/// and the wrapped service takes any `Request<B>` with such a body. It
/// answers `Response<`[`ResponseBody`](crate::ResponseBody)`>` with the
/// inner service's error type, through a `Send` future. In axum it is a
/// plain `Router::layer`; with hyper, wrap the layered service in
/// `hyper_util::service::TowerToHyperService`.
///
/// # Never twice, never stuck
///
/// The handler, its heartbeat (which renews the lease every third of its
/// length) and the recording survive the request, so a client that
/// disconnects does not cancel them: its retry gets the replay. (They run
/// in the request's own future while its client is there, and are handed
/// to a task of their own the moment that future is dropped, so a request
/// whose client stays costs no task.) A store
/// failure, or a store call slower than
/// [`with_store_timeout`](Self::with_store_timeout), is logged with
/// `tracing` and answered at once; the middleware never waits for a key.
/// It needs a tokio runtime.
#[derive(Clone)]
pub struct IdempotencyLayer {
    config: Arc<Config>,
}

/// The protocol's options and the tower-typed scope extractor.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) options: Options,
    pub(crate) scope: Option<Arc<ScopeFn>>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("options", &self.options)
            .field("scope", &self.scope.as_ref().map(|_| "Fn(&Parts)"))
            .finish()
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
    /// Protects handlers with `store`, with a 60 s lease and a 24 h
    /// retention. Accepts an `Arc<dyn Store>` as well as a store by value.
    pub fn new<S: Store>(store: S) -> Self {
        IdempotencyLayer::from_idempotent(Idempotent::new(store))
    }

    /// Protects handlers with an [`Idempotent`] whose lease, retention and
    /// namespace are already set. Its scope is kept unless
    /// [`with_scope`](Self::with_scope) is set.
    pub fn from_idempotent(idem: Idempotent) -> Self {
        IdempotencyLayer::from_options(Options::from_idempotent(idem))
    }

    /// Protects handlers with the protocol's [`Options`], as another
    /// adapter would be set up.
    pub fn from_options(options: Options) -> Self {
        IdempotencyLayer {
            config: Arc::new(Config {
                options,
                scope: None,
            }),
        }
    }

    fn map_options(mut self, change: impl FnOnce(Options) -> Options) -> Self {
        let config = Arc::make_mut(&mut self.config);
        config.options = change(config.options.clone());
        self
    }

    idem_http::option_setters!();

    /// Gives each tenant or principal its own keys: `f` reads the scope from
    /// the request (say, an authenticated user id placed in the extensions
    /// by an outer layer). `None` or `""` leaves the request to the
    /// default: its caller's `Authorization` header, hashed
    /// ([`idem_http::Caller`]), or one scope for all with
    /// [`shared_across_callers`](Self::shared_across_callers). A scope over
    /// 255 bytes or with a control character is refused with 400.
    pub fn with_scope<F>(mut self, f: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        Arc::make_mut(&mut self.config).scope = Some(Arc::new(f));
        self
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService::new(inner, Arc::clone(&self.config))
    }
}
