//! The fuzz targets of idem, as plain functions: every parser of bytes idem
//! did not write itself, and the fingerprint's canonical form.
//!
//! Each target takes any bytes and panics only on a finding: a parser that
//! panics, a value that decodes but does not re-encode to the bytes it was
//! read from, a refusal that is not the parser's typed error, or two
//! fingerprint paths that disagree. The cargo-fuzz targets in `fuzz/` call
//! these functions; so does this crate's `cargo test`, which replays the
//! seeds (each target's [`Target::seeds`], made by the real encoders) and
//! mutations of them for a bounded time, so that the targets build and hold
//! without a fuzzer.
//!
//! `fuzz/run SECONDS` runs every target under libFuzzer; `idem-fuzz-seeds
//! DIR` writes the seeds as corpus files. The stores' decoders are reached
//! through their hidden `fuzzing` modules (cargo feature `fuzzing`); the
//! HTTP formats and the key header through `idem-http`'s public API.
#![forbid(unsafe_code)]

mod bodies;
mod fingerprint;
mod http;
mod input;
mod stores;

pub use bodies::{form_body, multipart_body};
pub use fingerprint::{fingerprint_json, fingerprint_written};
pub use http::{idempotency_key, stored_response};
pub use stores::{mysql_row, postgres_row, redis_record, sqlite_row};

/// A fuzz target: its name (the cargo-fuzz target's), its body and its
/// seeds.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// The name of the target and of its corpus folder.
    pub name: &'static str,
    /// Runs one input; panics on a finding.
    pub run: fn(&[u8]),
    /// The seed corpus, from the real encoders.
    pub seeds: fn() -> Vec<Vec<u8>>,
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target {
        name: "redis_record",
        run: redis_record,
        seeds: stores::redis_seeds,
    },
    Target {
        name: "postgres_row",
        run: postgres_row,
        seeds: stores::postgres_seeds,
    },
    Target {
        name: "mysql_row",
        run: mysql_row,
        seeds: stores::mysql_seeds,
    },
    Target {
        name: "sqlite_row",
        run: sqlite_row,
        seeds: stores::sqlite_seeds,
    },
    Target {
        name: "stored_response",
        run: stored_response,
        seeds: http::stored_response_seeds,
    },
    Target {
        name: "idempotency_key",
        run: idempotency_key,
        seeds: http::idempotency_key_seeds,
    },
    Target {
        name: "fingerprint_json",
        run: fingerprint_json,
        seeds: fingerprint::fingerprint_json_seeds,
    },
    Target {
        name: "fingerprint_written",
        run: fingerprint_written,
        seeds: fingerprint::fingerprint_written_seeds,
    },
    Target {
        name: "form_body",
        run: form_body,
        seeds: bodies::form_body_seeds,
    },
    Target {
        name: "multipart_body",
        run: multipart_body,
        seeds: bodies::multipart_body_seeds,
    },
];
