//! Redis-specific tests of `RedisStore`: records written by earlier
//! releases, the record as Redis holds it on the shared server at
//! `IDEM_REDIS_URL`, and servers of their own (started from the
//! `redis-server` binary) whose counters prove the round trips.

#[allow(dead_code)]
#[path = "../support/mod.rs"]
mod support;

mod expiry;
mod legacy;
mod records;
mod server;
