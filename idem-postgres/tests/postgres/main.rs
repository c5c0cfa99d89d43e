//! PostgreSQL-specific tests of `PostgresStore`, against the real server at
//! `IDEM_POSTGRES_URL`: races the claim statement must survive, round trips
//! counted by the server, names, corrupt rows, pools and lost connections.

#[path = "../support/mod.rs"]
mod support;

mod batch;
mod failover;
mod legacy;
mod names_and_rows;
mod pools_and_faults;
mod purge;
mod races;
mod round_trips;
mod tx;
mod waking;
