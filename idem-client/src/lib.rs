//! The sending side of idempotency: a [reqwest] client that gives each
//! logical request one `Idempotency-Key`, sends the same key and the same
//! body bytes on every retry, and retries only what is safe to retry.
//!
//! ```no_run
//! use std::time::Duration;
//! use idem_client::{Error, IdemClient, RateLimit, RetryPolicy};
//! use serde_json::json;
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Error> {
//!     let client = IdemClient::new()
//!         .with_retry(RetryPolicy::default().with_max_attempts(6).with_max_elapsed(Duration::from_secs(20)))
//!         .with_rate_limit(RateLimit::per_second(50.0).with_burst(10));
//!     // One intent, one key (a random UUID v4 unless you pass `.key(..)`),
//!     // the same key and body bytes on every retry.
//!     let payment = client
//!         .post("http://127.0.0.1:3000/payments")
//!         .json(&json!({ "amount": 1250, "currency": "EUR" }))
//!         .send()
//!         .await?; // 5xx, 409, 429, timeouts and dropped connections were retried
//!     println!("{} after {} attempt(s)", payment.status(), payment.attempts());
//!     Ok(())
//! }
//! ```
//!
//! # What is retried
//!
//! | attempt got | with a key (or [`retry_safe`](RequestBuilder::retry_safe)) | without |
//! |---|---|---|
//! | connection refused, broken mid-request or mid-body, timeout | retried | [`Error::Transport`] / [`Error::GaveUp`], sent once |
//! | 5xx (but 501), 408, 429, 409 "in progress" | retried, honouring `Retry-After` | returned as the response |
//! | 422 saying the key was reused with another request | [`Error::KeyReused`] | returned |
//! | 409 `not-replayable` (it ran; its answer is lost), other 4xx, 2xx, 3xx | returned: final | returned |
//!
//! A retry waits a full-jitter exponential backoff, or the server's
//! `Retry-After` (seconds or an HTTP date) up to a cap, whichever is longer;
//! the [`RetryPolicy`] budget bounds both attempts and total time, and a
//! wait that would overrun it is not started. When the budget runs out the
//! request ends in [`Error::GaveUp`] with the last failure; with a key it ran
//! at most once, and sending it again later under the same key is still
//! safe.
//!
//! A 422 is read as key reuse when its problem body says so (idem's
//! `mismatch` type, or a type or title naming idempotency, as in the IETF
//! draft); any other 422 is the API refusing the request itself and is
//! returned like any 4xx.
//!
//! # Keys
//!
//! `POST` and `PATCH` get a fresh [`IdempotencyKey::random`] per
//! [`send`](RequestBuilder::send) — one logical request, however many
//! attempts. A caller that must survive its own restarts keeps the key with
//! the intent and passes it with [`key`](RequestBuilder::key) (an order id,
//! or a key derived from a job and its step). Keys are validated before
//! anything is sent: 1–255 visible ASCII characters. They go in
//! `Idempotency-Key` as the draft's structured-field string (`"…"`); another
//! header or the bare form is one [`with_key_header`](IdemClient::with_key_header)
//! away. Other methods carry no key and are sent once, unless given a key or
//! marked [`retry_safe`](RequestBuilder::retry_safe).
//!
//! # Rate limits
//!
//! [`with_rate_limit`](IdemClient::with_rate_limit) puts a token bucket per
//! host in front of every attempt, shared by the client's clones; a 429's
//! `Retry-After` then holds that host for every clone, not only the request
//! that got it.
//!
//! # Why a wrapper and not a `reqwest-middleware` middleware
//!
//! The key belongs to the logical request, so it must be chosen before the
//! first attempt and outside any retry loop; a middleware sees attempts, and
//! the existing retry middlewares would retry POSTs with no key or retry
//! around ours. Classifying a 409 or a 422 and retrying a body cut off
//! mid-way both need the whole response body inside the loop, which a
//! middleware must hand back as a streaming `reqwest::Response`. So this
//! crate wraps a plain `reqwest::Client` (bring your own with
//! [`IdemClient::from_reqwest`] for TLS, proxies and pools) and returns a
//! [`Response`] read in full. It adds no dependency on `reqwest-middleware`
//! for users who do not otherwise need it.
//!
//! # TLS
//!
//! `https://` works by default: the `tls` feature turns on reqwest's
//! `rustls-tls` (rustls on ring, Mozilla's roots), the one TLS stack of the
//! workspace. Without default features only plain `http://` works; enable
//! `native-tls` for the system's OpenSSL, or pass a reqwest client built
//! with TLS (a private CA, client certificates) to
//! [`IdemClient::from_reqwest`]. An API behind a private CA:
//!
//! ```no_run
//! use idem_client::{reqwest, IdemClient};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ca = reqwest::Certificate::from_pem(&std::fs::read("/etc/idem/ca.pem")?)?;
//! let http = reqwest::Client::builder()
//!     .add_root_certificate(ca)
//!     .tls_built_in_root_certs(false) // that CA only, not Mozilla's roots
//!     .build()?;
//! let client = IdemClient::from_reqwest(http);
//! # drop(client);
//! # Ok(())
//! # }
//! ```
//!
//! A certificate the client refuses fails the handshake, so nothing is
//! sent. It counts as a connection that could not be made: it is retried
//! within the [`RetryPolicy`], and the last failure's source names the
//! cause (`UnknownIssuer`, an expired certificate, another host's name).
#![forbid(unsafe_code)]

mod client;
mod error;
mod key;
mod limit;
mod request;
mod response;
mod retry;

pub use client::{IdemClient, IDEMPOTENCY_KEY};
pub use error::{Error, Failure};
pub use key::{IdempotencyKey, KeyFormat};
pub use limit::RateLimit;
pub use request::{Attempt, AttemptOutcome, RequestBuilder};
pub use reqwest;
pub use response::{Response, IDEMPOTENT_REPLAYED};
pub use retry::RetryPolicy;

#[cfg(test)]
mod readme {
    /// The README's example is this crate's first doc example under the
    /// `idem::client` path, so the compiled one and the one people copy
    /// cannot drift apart.
    #[test]
    fn the_readme_example_is_the_compiled_one() {
        let fence = |text: &str, open: &str| -> String {
            let start = text.find(open).expect("the example is there") + open.len();
            let end = start + text[start..].find("```").expect("the example ends");
            text[start..end].trim().to_owned()
        };
        let readme = fence(include_str!("../README.md"), "```rust,no_run\n")
            .replace("idem::client::", "idem_client::");
        let docs: String = include_str!("lib.rs")
            .lines()
            .filter_map(|line| line.strip_prefix("//!"))
            .map(|line| line.strip_prefix(' ').unwrap_or(line))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(readme, fence(&docs, "```no_run\n"));
    }
}
