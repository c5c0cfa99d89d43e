//! One module per binary: its command line and its `main`. The binaries
//! themselves (`src/main.rs`, `src/bin/`) only call these.

pub mod headline;
pub mod inbox;
pub mod replicas;
pub mod scale;
pub mod serve;
pub mod streams;
pub mod wake;
