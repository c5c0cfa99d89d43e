//! The `Idempotency-Key` HTTP protocol without a web framework: the key
//! header, the request fingerprint, the stored-response format, the
//! problem+json catalogue, and the exchange that claims a key, runs the
//! handler once and records or replays its response. A framework adapter
//! (`idem-tower`, `idem-actix`) only moves requests and bytes between its
//! framework and these functions.
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
//! [`Options::fingerprint`] is what the adapters check: the method, the
//! path and query, the content type and the body, JSON in canonical form
//! (keys sorted, no whitespace), forms and multipart bodies by field (next
//! section). A [`FingerprintPolicy`], for every request or per route, leaves
//! out what does not change a request's meaning: JSON Pointers excluded or
//! only some included, the query or some of its parameters ignored, or a
//! function of your own. Each policy is a fingerprint scheme of its own, so
//! a record made under one is never judged by another; a request under a
//! policy also matches records made before it (with no policy, or under
//! the policy it [`replaces`](FingerprintPolicy::replacing)), computed only
//! when such a record turns up. Setting or changing a policy therefore never
//! turns an honest retry of an earlier request into a 422.
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
//! escapes and `+` decoded, distinct names in any order, one name's values
//! in the order sent. `multipart/form-data` bodies count by part
//! ([`multipart`]): the boundary (which clients draw at random for every
//! encoding), preamble and epilogue left out, each part by name with its
//! disposition parameters (the file name), content type and bytes. Both are
//! scheme [`BODY_SCHEME`]; records of such bodies made by earlier builds
//! (bytes as they were) keep matching. A multipart body that does not parse
//! is a typed [`multipart::MultipartError`] and is fingerprinted as its
//! bytes rather than refused: the handler, not the layer, decides what a
//! malformed body gets, and comparing bytes can never replay a different
//! request.
//!
//! # Where the key comes from
//!
//! The `Idempotency-Key` header by default (see [`client_key`] for the
//! forms it accepts, including the quoted decimal keys Firefox adds to
//! POSTs on its own). [`Options::with_key_source`] reads it instead from a
//! JSON Pointer into the body (Google's AIP-155 `request_id`) or from a
//! function over the whole request ([`KeySource`]). Such a key is known only
//! once the body is read: [`Options::admit`] answers
//! [`Admission::KeyInBody`], and the adapter asks [`Options::admit_body`].
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
//! # Trace continuity
//!
//! A replay is the second half of a story whose first half is in another
//! trace. The exchange runs in a span `idem.http` (the parent of the core's
//! `idem.begin` and of the handler's spans), and the request's W3C
//! `traceparent` ([`TraceParent`], version `00`; a header that does not
//! parse, or more than one, is ignored, never refused) is kept with the
//! recorded response. On a replay of that response, the `idem.http` span
//! gets the field `idem.original_traceparent`, the first request's header.
//! The link goes on `idem.http` rather than on `idem.begin` because the
//! decision to replay is known only once the claim's span has closed, and
//! because this crate can only reach spans it opens itself.
//!
//! With the feature `otel`, the same span also gets an OpenTelemetry
//! *link* to the original span context (through `tracing-opentelemetry`;
//! one link per replay, marked remote), so a trace viewer jumps from any
//! replay to the request that ran the handler. With `otel` on and no
//! `traceparent` on the first request, the record keeps the context of
//! that request's own `idem.http` span instead, when an OpenTelemetry layer
//! gave it one: a public API whose clients send no trace context is where
//! retries are most common. A header, when present, always wins, so a
//! record keeps the same thing with the feature on or off. Without the
//! feature and without a header, nothing is stored.
//!
//! Only the `traceparent` is kept, never `tracestate` (vendor data that
//! may be large and is not needed to name a span), and a replay's own
//! `traceparent` changes nothing that was recorded. Adapters read it with
//! [`Options::request_context`] and pass it to
//! [`Options::exchange_with`].
//!
//! # Large and streamed responses
//!
//! A response body up to [`Options::with_max_response_body`] (1 MiB) is
//! read whole and recorded in one record. A larger one, a model's token
//! stream or a file export, streams to its client at once and is recorded
//! as it goes, in chunks of up to 64 KiB ([`idem_core::chunks`]), up to
//! [`Options::with_max_streamed_body`] (100 MiB); a replay reads the chunks
//! back one at a time and sends their frames as they come, so memory stays
//! bounded whatever the body's size. Chunks are records of their own, so
//! every store keeps them, a user's own included. Choices:
//!
//! * A chunk is written when it is full or when the handler's body has no
//!   frame ready, so an event stream's events keep their boundaries in the
//!   record and on replay (only a frame longer than a chunk is split),
//!   while a fast body is written 64 KiB at a time.
//! * The record names its chunks only once the last one is written. An
//!   owner that dies mid-stream leaves its key in flight: the lease lapses,
//!   a retry runs the handler again, and the half-written chunks are never
//!   read. A replay whose chunks are gone (lapsed, evicted) is refused with
//!   500 before its first byte, or cut short with an error after it, never
//!   ended cleanly without all of its bytes.
//! * A client that hangs up mid-stream stops nothing: the body is read and
//!   recorded to its end (the adapter drives the [`Recording`] in a task of
//!   its own), as a handler's outcome is recorded for a client that left.
//! * A body that fails mid-stream, or goes past the streamed limit, still
//!   reaches its client as far as it went; the key is marked executed
//!   without a replayable response (409 `not-replayable`), as a body over
//!   the limit always was. A body whose `Content-Length` is over the
//!   streamed limit is not recorded at all, so nothing follows it.
//! * A retry with `Prefer: wait` that arrives while the original is still
//!   streaming follows it: it gets the status and headers the owner wrote
//!   first (a head beside the chunks) and then each chunk as it is written,
//!   looking for the next every 5 to 50 ms, so its first bytes come before
//!   the original ends. It ends with an error if the owner's lease lapses
//!   or the response is not recorded (an unsized body that goes past the
//!   streamed limit, a body or store that fails): the same cut a client
//!   gets from a body that fails, never a clean end without all the bytes. Without `Prefer: wait` it gets 409,
//!   as any request that finds its key in progress.
//!
//! An adapter opts in by reading its body frame by frame
//! ([`ResponseBody::STREAMS`]); `idem-tower` (and so `idem-proxy`) and
//! `idem-actix` do.
//!
//! # Stored format
//!
//! The payload of a record is described in [`stored`]. Version 1 is the
//! format `idem-tower` has always written; version 2 adds the trace parent
//! and is written only when there is one, so records replay through any
//! adapter, old records replay unchanged, and a record without a trace
//! parent is still readable by a build that knows only version 1. Version
//! 3 is a response recorded in chunks.
#![forbid(unsafe_code)]

mod exchange;
mod fingerprint;
pub mod form;
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
pub use header::{client_key, KeyHeaderError};
pub use keysource::KeySource;
pub use options::{Options, DEFAULT_MAX_STREAMED_BODY, DEFAULT_MAX_WAIT};
pub use pattern::{PathPattern, PatternError};
pub use policy::{FingerprintPolicy, BODY_SCHEME};
pub use prefer::{preferred_wait, PREFER, PREFERENCE_APPLIED};
pub use problem::Problem;
pub use read::{read_body, ReadBodyError};
pub use stored::REPLAYED;
pub use stream::{Frames, Recording};
pub use traceparent::{TraceParent, TRACEPARENT};
pub use uncancelled::{Panicked, Uncancelled};
