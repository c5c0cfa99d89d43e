//! An outbound rate limit per destination, for handlers that call
//! rate-limited APIs: idem-http's [`RateLimiter`], the one idem-client
//! paces its hosts with, a token bucket per destination with the pause a
//! 429's `Retry-After` asks for.

pub use idem_http::ratelimit::RateLimiter;
