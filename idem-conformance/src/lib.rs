//! The conformance kit that proves an idem [`Store`](idem_core::store::Store)
//! correct, with generated concurrent interleavings.
//!
#![doc = include_str!("../GUIDE.md")]
#![forbid(unsafe_code)]

pub mod cases;
#[doc = include_str!("../CONTRACT.md")]
pub mod contract {}
mod fixture;
mod list;
mod runner;
mod settings;
mod support;
pub mod tx;

pub use cases::interleaving::{soak, Soak, SoakFailure};
pub use fixture::{Factory, Fixture};
pub use runner::{
    cases, run_all, run_all_with, run_each, run_each_with, Case, CaseFailure, Report,
};
pub use settings::{Interleavings, DEFAULT_AT_ONCE, DEFAULT_SCHEDULES};

/// What [`store_tests!`] needs in the calling crate. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::runner::run_case;
    pub use tokio;
}
