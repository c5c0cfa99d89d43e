//! The `Idempotency-Key` HTTP protocol without a web framework.
//!
//! It holds:
//!
//! * the key header;
//! * the request fingerprint;
//! * the stored-response format;
//! * the problem+json catalogue;
//! * the exchange: claim a key, run the handler once, record or replay its response.
//!
//! A framework adapter (`idem-tower`, `idem-actix`) only moves requests and bytes between its framework and these functions.
//!
//! ```
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use idem_core::MemoryStore;
//! use idem_http::{fingerprint, Admission, Collected, Options, Reply, ResponseBody};
//!
//! /// The body type of this "framework": bytes already in memory.
//! struct Whole(Bytes);
//!
//! impl ResponseBody for Whole {
//!     async fn collect(self, limit: usize) -> Collected<Self> {
//!         if self.0.len() > limit {
//!             Collected::TooLarge(self)
//!         } else {
//!             Collected::Whole(self.0)
//!         }
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let options = Options::new(MemoryStore::new());
//! let request = Request::post("/payments")
//!     .header("idempotency-key", "order-7f3a")
//!     .header("content-type", "application/json")
//!     .body(Bytes::from_static(br#"{"amount":1250}"#))
//!     .unwrap();
//! let mut statuses = Vec::new();
//! for _ in 0..2 {
//!     let Admission::Protect(key) = options.admit(request.method(), request.headers()) else {
//!         panic!("a POST with a key is protected");
//!     };
//!     let fp = fingerprint(request.method(), request.uri(), request.headers(), request.body());
//!     let reply = options
//!         .exchange(options.idempotent(), &key, fp, || async {
//!             let response = Response::builder().status(StatusCode::CREATED);
//!             Ok::<_, std::convert::Infallible>(response.body(Whole(Bytes::from("charged"))).unwrap())
//!         })
//!         .await
//!         .unwrap();
//!     match reply {
//!         Reply::Whole(response) => statuses.push((
//!             response.status(),
//!             response.headers().contains_key(idem_http::REPLAYED),
//!         )),
//!         _ => unreachable!("a small body is recorded whole"),
//!     }
//! }
//! // The handler ran once; the retry got its recorded response back.
//! assert_eq!(statuses, [(StatusCode::CREATED, false), (StatusCode::CREATED, true)]);
//! # }
//! ```
//!
//! # What the fingerprint covers
//!
//! [`Options::fingerprint`] is what the adapters check.
//! It covers:
//!
//! * the method;
//! * the path and query;
//! * the content type;
//! * the body: JSON in canonical form (keys sorted, no whitespace), forms and multipart bodies by field (next section).
//!
//! A [`FingerprintPolicy`] leaves out what does not change a request's meaning.
//! It applies to every request or per route, and can:
//!
//! * exclude some JSON Pointers, or include only some;
//! * ignore the query, or some of its parameters;
//! * call a function of your own.
//!
//! Each policy is a fingerprint scheme of its own, so a record made under one is never judged by another.
//! A request under a policy also matches records made before it.
//! Those are records with no policy, or under the policy it [`replaces`](FingerprintPolicy::replacing).
//! Their fingerprint is computed only when such a record turns up.
//! So setting or changing a policy never turns an honest retry of an earlier request into a 422.
//!
//! ```
//! use idem_core::MemoryStore;
//! use idem_http::{FingerprintPolicy, Options};
//!
//! let options = Options::new(MemoryStore::new())
//!     // A client timestamp and a retry counter do not make a new order.
//!     .with_route_fingerprint_policy(
//!         "/orders",
//!         FingerprintPolicy::new().exclude(["/client_ts"]).ignore_query_params(["attempt"]),
//!     )
//!     // Only the amount and the currency make a capture.
//!     .with_route_fingerprint_policy(
//!         "/payments/{id}/capture",
//!         FingerprintPolicy::new().include(["/amount", "/currency"]),
//!     );
//! let request = http::Request::post("/orders?attempt=2")
//!     .header("content-type", "application/json")
//!     .body(bytes::Bytes::from_static(br#"{"sku":"a-1","client_ts":1764633600}"#))
//!     .unwrap();
//! let retry = http::Request::post("/orders?attempt=3")
//!     .header("content-type", "application/json")
//!     .body(bytes::Bytes::from_static(br#"{"client_ts":1764633601,"sku":"a-1"}"#))
//!     .unwrap();
//! let fp = |r: &http::Request<bytes::Bytes>| {
//!     options.fingerprint(r.method(), r.uri(), r.headers(), r.body()).current()
//! };
//! assert_eq!(fp(&request), fp(&retry));
//! ```
//!
//! # Form and multipart bodies
//!
//! `application/x-www-form-urlencoded` bodies count by field ([`form`]):
//!
//! * escapes and `+` are decoded;
//! * distinct names may come in any order;
//! * one name's values stay in the order sent.
//!
//! `multipart/form-data` bodies count by part ([`multipart`]):
//!
//! * the boundary is left out, since clients draw it at random for every encoding;
//! * the preamble and epilogue are left out;
//! * each part counts by name, with its disposition parameters (the file name), content type and bytes.
//!
//! Both are scheme [`BODY_SCHEME`].
//! Records of such bodies made by earlier builds (bytes as they were) keep matching.
//!
//! A multipart body that does not parse is a typed [`multipart::MultipartError`].
//! It is fingerprinted as its bytes rather than refused.
//! The handler, not the layer, decides what a malformed body gets.
//! Comparing bytes can never replay a different request.
//!
//! # Where the key comes from
//!
//! By default the key is the `Idempotency-Key` header.
//! [`client_key`] lists the forms it accepts.
//! They include the quoted decimal keys Firefox adds to POSTs on its own.
//!
//! [`Options::with_key_source`] reads the key elsewhere ([`KeySource`]):
//!
//! * from a JSON Pointer into the body (Google's AIP-155 `request_id`);
//! * from a function over the whole request.
//!
//! Such a key is known only once the body is read.
//! [`Options::admit`] answers [`Admission::KeyInBody`], and the adapter asks [`Options::admit_body`].
//!
//! ```
//! use idem_core::MemoryStore;
//! use idem_http::{Admission, KeySource, Options};
//!
//! let options = Options::new(MemoryStore::new())
//!     .with_key_source(KeySource::json_pointer("/request_id"));
//! let request = http::Request::post("/payments")
//!     .header("content-type", "application/json")
//!     .body(br#"{"request_id":"7f3a","amount":1250}"#.to_vec())
//!     .unwrap();
//! assert_eq!(options.admit(request.method(), request.headers()), Admission::KeyInBody);
//! let admitted = options.admit_body(request.method(), request.uri(), request.headers(), request.body());
//! assert_eq!(admitted, Admission::Protect("7f3a".into()));
//! ```
//!
//! # Whose key it is
//!
//! Two callers never share a record by default. A key is checked in its
//! caller's scope: the `Authorization` header's values, hashed
//! ([`Caller`]; the credential itself is never stored). Keys are chosen by
//! clients and often guessable (`order-1`), so a shared key would hand one
//! caller another's response. The rules:
//!
//! * Requests without `Authorization` share one anonymous scope, apart
//!   from every authenticated caller: neither replays the other's record.
//! * An application that knows its principal names the scope: an
//!   [`Idempotent`](idem_core::Idempotent) with a scope, or an adapter's
//!   scope extractor. Do so when callers authenticate by cookie, or when a
//!   client's token may change between its retries (a new token is a new
//!   caller).
//! * [`Options::shared_across_callers`] is the opt-out: one scope for all.
//! * Records made before callers were told apart are in no scope. Their
//!   caller is unknown, so a request that may retry one (same key and
//!   fingerprint) gets 409 `not-replayable`, or `in-progress` while it
//!   runs: never another caller's response, never a second run. This
//!   costs one store read per first execution, until
//!   [`Options::check_unscoped_records`] turns it off. Under the opt-out
//!   those records replay as before.
//!
//! The caller is read by [`Options::request_context`] and applied by
//! [`Options::exchange_with`], so every adapter gets the same scopes.
//!
//! # Trace continuity
//!
//! A replay is the second half of a story whose first half is in another trace.
//!
//! * The exchange runs in a span `idem.http`.
//!   It is the parent of the core's `idem.begin` and of the handler's spans.
//! * The request's W3C `traceparent` ([`TraceParent`], version `00`) is kept with the recorded response.
//!   A header that does not parse, or more than one, is ignored, never refused.
//! * On a replay of that response, the `idem.http` span gets the field `idem.original_traceparent`.
//!   Its value is the first request's header.
//!
//! The link goes on `idem.http`, not on `idem.begin`, for two reasons:
//!
//! * the decision to replay is known only once the claim's span has closed;
//! * this crate can only reach spans it opens itself.
//!
//! With the feature `otel`, the same span also gets an OpenTelemetry *link* to the original span context.
//! It goes through `tracing-opentelemetry`, one link per replay, marked remote.
//! A trace viewer then jumps from any replay to the request that ran the handler.
//!
//! Sometimes the first request has no `traceparent`.
//! A public API whose clients send no trace context is where retries are most common.
//! With `otel` on, the record then keeps the context of that request's own `idem.http` span.
//! That needs an OpenTelemetry layer to have given the span one.
//!
//! * A header, when present, always wins.
//!   So a record keeps the same thing with the feature on or off.
//! * Without the feature and without a header, nothing is stored.
//! * Only the `traceparent` is kept, never `tracestate`.
//!   `tracestate` is vendor data that may be large and is not needed to name a span.
//! * A replay's own `traceparent` changes nothing that was recorded.
//!
//! Adapters read the context with [`Options::request_context`] and pass it to [`Options::exchange_with`].
//!
//! # Large and streamed responses
//!
//! A response body up to [`Options::with_max_response_body`] (1 MiB) is read whole.
//! It is recorded in one record.
//!
//! A larger one streams to its client at once; a model's token stream or a file export are examples.
//! It is recorded as it goes, in chunks of up to 64 KiB ([`idem_core::chunks`]).
//! The limit is [`Options::with_max_streamed_body`] (100 MiB).
//! A replay reads the chunks back one at a time and sends their frames as they come.
//! So memory stays bounded whatever the body's size.
//! Chunks are records of their own, so every store keeps them, a user's own included.
//!
//! Choices:
//!
//! * A chunk is written when it is full, or when the handler's body has no frame ready.
//!   So an event stream's events keep their boundaries, in the record and on replay.
//!   Only a frame longer than a chunk is split.
//!   A fast body is written 64 KiB at a time.
//! * The record names its chunks only once the last one is written.
//!   An owner that dies mid-stream leaves its key in flight.
//!   The lease lapses, a retry runs the handler again, and the half-written chunks are never read.
//! * A replay whose chunks are gone (lapsed, evicted) never ends cleanly without all of its bytes.
//!   Before its first byte it is refused with 500; after it, it is cut short with an error.
//! * A client that hangs up mid-stream stops nothing.
//!   The body is read and recorded to its end, as a handler's outcome is recorded for a client that left.
//!   The adapter drives the [`Recording`] in a task of its own.
//! * A body that fails mid-stream, or goes past the streamed limit, still reaches its client as far as it went.
//!   The key is marked executed without a replayable response (409 `not-replayable`).
//!   A body over the limit always was.
//! * A body whose `Content-Length` is over the streamed limit is not recorded at all, so nothing follows it.
//! * A retry with `Prefer: wait` may arrive while the original is still streaming.
//!   It follows the original: first the status and headers the owner wrote (a head beside the chunks).
//!   Then it gets each chunk as it is written, looking for the next every 5 to 50 ms.
//!   So its first bytes come before the original ends.
//! * That retry ends with an error if the owner's lease lapses or the response is not recorded.
//!   An unsized body past the streamed limit, or a body or store that fails, are such cases.
//!   It is the same cut a client gets from a body that fails, never a clean end without all the bytes.
//! * Without `Prefer: wait`, the retry gets 409, as any request that finds its key in progress.
//!
//! An adapter opts in by reading its body frame by frame ([`ResponseBody::STREAMS`]).
//! `idem-tower` (and so `idem-proxy`) and `idem-actix` do.
//!
//! # Stored format
//!
//! [`stored`] describes the payload of a record.
//!
//! * Version 1 is the format `idem-tower` has always written.
//! * Version 2 adds the trace parent, and is written only when there is one.
//! * Version 3 is a response recorded in chunks.
//!
//! So records replay through any adapter, and old records replay unchanged.
//! A record without a trace parent is still readable by a build that knows only version 1.
#![forbid(unsafe_code)]

mod exchange;
mod fingerprint;
pub mod form;
pub mod handoff;
mod header;
mod keysource;
mod metrics;
pub mod multipart;
mod options;
mod otel;
mod pattern;
mod policy;
mod prefer;
mod problem;
pub mod ratelimit;
mod read;
mod scope;
pub mod stored;
mod stream;
mod traceparent;
mod transcode;
mod uncancelled;

pub use http;

pub use exchange::{Admission, BoxError, Collected, Reply, RequestContext, ResponseBody};
pub use fingerprint::{
    canonical_fingerprint, fingerprint, lazy_fingerprint, raw_fingerprint, SCHEME,
};
pub use handoff::{Answer, AnswerBody, HandoffError, Run, Start};
pub use header::{client_key, KeyHeaderError};
pub use keysource::KeySource;
pub use options::{Options, DEFAULT_MAX_STREAMED_BODY, DEFAULT_MAX_WAIT};
pub use pattern::{PathPattern, PatternError};
pub use policy::{FingerprintPolicy, BODY_SCHEME};
pub use prefer::{preferred_wait, PREFER, PREFERENCE_APPLIED};
pub use problem::Problem;
pub use read::{read_body, ReadBodyError};
pub use scope::{unscoped_record, Caller, UnscopedRecord};
pub use stored::REPLAYED;
pub use stream::{Frames, Recording};
pub use traceparent::{TraceParent, TRACEPARENT};
pub use uncancelled::{Panicked, Uncancelled};
