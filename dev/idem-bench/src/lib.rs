//! idem's benchmark harness: the code its binaries share.
//!
//! One binary per question, each with `--help` and a `--quick` mode:
//!
//! - `idem-bench`: every store against the raw minimal protocol on the
//!   same server, through the same client, in one run (and the HTTP layer
//!   against a plain handler with `--http`);
//! - `scale-bench`: claim and replay latency, bytes per record and purging
//!   as a store fills to millions of records;
//! - `inbox-bench`: the webhook inbox's acknowledgement latency and its
//!   worker against a raw claim loop;
//! - `wake-bench`: how soon a waiter returns after the owner completes;
//! - `broker-bench`: the idempotent consumer against a raw consumer of the
//!   same broker;
//! - `serve-bench`: the HTTP apps served for an external load generator.
//!
//! Every binary opens its stores through one module per store (`src/stores/`)
//! and keeps its command line in [`cmd`].
//! `--markdown FILE` rewrites the binary's tables in `BENCHMARKS.md`
//! between their markers ([`markdown`]). The method is in this crate's
//! README; dated notes of each investigation are in `notes/`.
#![forbid(unsafe_code)]

pub mod cmd;
pub mod markdown;

mod bench;
mod chart;
mod cli;
mod fixture;
mod http;
mod inbox;
mod inbox_jobs;
mod load;
mod protocols;
mod report;
mod runner;
mod scale;
mod serve;
mod stats;
mod stores;
mod wake;
