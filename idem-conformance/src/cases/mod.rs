//! The cases, grouped by concern. Each is a plain `async fn` taking the
//! [`Factory`](crate::Factory) and panicking with a sentence when its rule
//! is broken; [`cases`](crate::cases()) lists them all.
//!
//! Cases run in parallel, each on its own fixture, on real time: leases of
//! 50 ms to 600 ms, bounded polling, never a long sleep.

pub mod chunks;
pub mod claim;
pub mod concurrency;
pub mod execute;
pub mod expiry;
pub mod fencing;
pub mod fidelity;
pub mod interleaving;
pub mod recovery;
pub mod reset;
pub mod steps;
pub mod swap;
