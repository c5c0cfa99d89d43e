//! The clock timestamp tolerance is measured against.

use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Where a verifier reads the time: the system clock, or, in tests, a clock
/// the test sets.
#[derive(Clone)]
pub struct Clock(Arc<dyn Fn() -> i64 + Send + Sync>);

impl Clock {
    /// The system clock.
    pub fn system() -> Clock {
        Clock(Arc::new(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        }))
    }

    /// A clock that always reads `unix_secs`.
    pub fn fixed(unix_secs: i64) -> Clock {
        Clock(Arc::new(move || unix_secs))
    }

    /// A clock that reads whatever `now` returns, in seconds since the Unix
    /// epoch.
    pub fn from_fn(now: impl Fn() -> i64 + Send + Sync + 'static) -> Clock {
        Clock(Arc::new(now))
    }

    /// Now, in seconds since the Unix epoch.
    pub fn now_unix(&self) -> i64 {
        (self.0)()
    }
}

impl Default for Clock {
    fn default() -> Clock {
        Clock::system()
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Clock({})", self.now_unix())
    }
}
