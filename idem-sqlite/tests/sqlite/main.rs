//! SqliteStore against real files: its contract, the files it refuses, busy
//! and killed processes, and group commit under concurrency.

mod aborted;
mod batching;
mod contract;
mod crash;
mod disk_full;
mod files;
mod legacy;
mod locking;
mod support;
mod tx;
mod tx_kit;
mod waking;
