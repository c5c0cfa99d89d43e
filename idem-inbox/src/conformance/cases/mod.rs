//! The cases, grouped by concern. Each is a plain `async fn` over a
//! [`QueueFactory`](super::QueueFactory) that panics when the rule it names
//! is broken.

pub mod claim;
pub mod dead;
pub mod enqueue;
pub mod interleaving;
pub mod lease;
pub mod settle;
