// Shared helpers for idem-core's integration tests.
#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Counts how many times work ran.
#[derive(Debug, Clone, Default)]
pub struct Runs(Arc<AtomicUsize>);

impl Runs {
    pub fn hit(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }

    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}
