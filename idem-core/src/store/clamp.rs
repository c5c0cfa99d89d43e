//! The clamps every caller applies to lease and retention durations, kept
//! in one place so the core, the HTTP layers, the stores and the kit agree.

use std::time::Duration;

/// The shortest lease or retention that is used: a zero duration would
/// make a record lapse the moment it is written (and Redis refuses `PX 0`).
pub const SHORTEST: Duration = Duration::from_millis(1);

/// A lease as it is used: zero is raised to [`SHORTEST`].
pub const fn lease(lease: Duration) -> Duration {
    at_least(lease, SHORTEST)
}

/// A retention as it is used with `lease`: never shorter than the lease (a
/// live lease must never be forgotten) nor than [`SHORTEST`].
pub const fn retention(retention: Duration, lease: Duration) -> Duration {
    at_least(at_least(retention, lease), SHORTEST)
}

/// How often a lease of this length is renewed while work runs: a third of
/// it, so two renewals may fail before it lapses; never below
/// [`SHORTEST`].
pub const fn heartbeat(lease: Duration) -> Duration {
    match lease.checked_div(3) {
        Some(third) => at_least(third, SHORTEST),
        None => SHORTEST,
    }
}

const fn at_least(duration: Duration, floor: Duration) -> Duration {
    if duration.as_nanos() < floor.as_nanos() {
        floor
    } else {
        duration
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_is_raised_and_retention_covers_the_lease() {
        assert_eq!(lease(Duration::ZERO), SHORTEST);
        assert_eq!(lease(Duration::from_secs(5)), Duration::from_secs(5));
        assert_eq!(
            retention(Duration::from_secs(1), Duration::from_secs(60)),
            Duration::from_secs(60)
        );
        assert_eq!(retention(Duration::ZERO, Duration::ZERO), SHORTEST);
        assert_eq!(
            retention(Duration::from_secs(90), Duration::from_secs(60)),
            Duration::from_secs(90)
        );
        assert_eq!(heartbeat(Duration::from_secs(3)), Duration::from_secs(1));
        assert_eq!(heartbeat(Duration::from_millis(1)), SHORTEST);
    }
}
