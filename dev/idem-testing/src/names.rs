//! Names no other test, fixture or process uses.

use std::sync::atomic::{AtomicU64, Ordering};

/// `prefix` followed by this process's id, a counter and random bits:
/// unique across tests, fixtures and concurrent test processes. Only ASCII
/// letters, digits and `_`, so it is a valid SQL identifier (given a
/// `prefix` that is one) and a plain Redis key prefix.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}_{:x}_{}_{:08x}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        rand::random::<u32>()
    )
}
