//! Where the crate reads the time: webhook verifiers measure a timestamp's
//! tolerance against it, and the SQLite queue keeps its leases on it.

use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// The system clock, or, in tests, a clock the test sets. It reads
/// milliseconds since the Unix epoch; verifiers use whole seconds of it.
#[derive(Clone)]
pub struct Clock(Arc<dyn Fn() -> i64 + Send + Sync>);

impl Clock {
    /// The system clock.
    pub fn system() -> Clock {
        Clock(Arc::new(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        }))
    }

    /// A clock that always reads `unix_secs`.
    pub fn fixed(unix_secs: i64) -> Clock {
        Clock::from_millis_fn(move || unix_secs.saturating_mul(1000))
    }

    /// A clock that reads whatever `now` returns, in seconds since the Unix
    /// epoch.
    pub fn from_fn(now: impl Fn() -> i64 + Send + Sync + 'static) -> Clock {
        Clock::from_millis_fn(move || now().saturating_mul(1000))
    }

    /// A clock that reads whatever `now` returns, in milliseconds since the
    /// Unix epoch.
    pub fn from_millis_fn(now: impl Fn() -> i64 + Send + Sync + 'static) -> Clock {
        Clock(Arc::new(now))
    }

    /// Now, in whole seconds since the Unix epoch.
    pub fn now_unix(&self) -> i64 {
        self.now_millis().div_euclid(1000)
    }

    /// Now, in milliseconds since the Unix epoch.
    pub fn now_millis(&self) -> i64 {
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
        write!(f, "Clock({} ms)", self.now_millis())
    }
}
