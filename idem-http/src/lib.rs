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
//! # Stored format
//!
//! The payload of a record is described in [`stored`]; it is the format
//! `idem-tower` has always written, so records replay through any adapter.
#![forbid(unsafe_code)]

mod exchange;
mod fingerprint;
pub mod form;
mod header;
mod keysource;
mod metrics;
pub mod multipart;
mod options;
mod policy;
mod prefer;
mod problem;
pub mod ratelimit;
pub mod stored;
mod transcode;
mod uncancelled;

pub use http;

pub use exchange::{Admission, BoxError, Collected, Reply, ResponseBody};
pub use fingerprint::{
    canonical_fingerprint, fingerprint, lazy_fingerprint, raw_fingerprint, SCHEME,
};
pub use header::{client_key, KeyHeaderError};
pub use keysource::KeySource;
pub use options::{Options, DEFAULT_MAX_WAIT};
pub use policy::{FingerprintPolicy, BODY_SCHEME};
pub use prefer::{preferred_wait, PREFER, PREFERENCE_APPLIED};
pub use problem::Problem;
pub use stored::REPLAYED;
pub use uncancelled::{Panicked, Uncancelled};
