//! One module per store: its rows, its server's counters, its cleanup.

pub(crate) mod memory;
pub(crate) mod mysql;
pub(crate) mod postgres;
pub(crate) mod redis;
pub(crate) mod sqlite;
