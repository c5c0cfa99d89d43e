//! Fault and bad-input tests for idem: worker processes killed mid-work,
//! stores that go away, corrupted records and hostile requests.
//!
//! The library holds what the tests and the `fault-worker` binary share:
//! the side-effect [`ledger`], the [`Backend`] a worker opens, and the
//! [`crash`] supervisor that kills workers and checks what they left.
#![forbid(unsafe_code)]

pub mod backend;
pub mod crash;
pub mod ledger;

pub use backend::{mysql_url, postgres_url, redis_url, unique_name, Backend};
