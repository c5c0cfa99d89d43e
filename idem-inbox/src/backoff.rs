//! How long a failed job waits before its next attempt: the core's
//! full-jitter [`Backoff`], the policy idem-client's retries follow too.
//! Its default waits up to 2, 4, 8, … minutes, capped at six hours.

pub use idem_core::backoff::Backoff;
