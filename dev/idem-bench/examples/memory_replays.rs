//! A memory-store replay loop to profile under Valgrind, where instruction
//! and cache-miss counts do not move with machine noise: fills a
//! `MemoryStore` with RECORDS completed records through `execute`, then
//! replays the first REPLAYS of them (cycling) on one thread. Run it at two
//! replay counts and take the difference, so the fill cancels out:
//!
//! ```sh
//! cargo build --release -p idem-bench --example memory_replays
//! valgrind --tool=cachegrind --cache-sim=yes \
//!     target/release/examples/memory_replays RECORDS REPLAYS
//! ```
//!
//! The replayed records are scattered over the whole store in a fixed
//! pseudo-random order, as a large store's replays are (the scale mode
//! picks them at random).

use std::convert::Infallible;

use idem_core::{Idempotent, MemoryStore};

fn main() {
    let counts: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("usage: memory_replays RECORDS REPLAYS"))
        .collect();
    let [records, replays] = counts[..] else {
        panic!("usage: memory_replays RECORDS REPLAYS");
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let idem = Idempotent::new(MemoryStore::new());
        let key = |n: u64| format!("replay:{n:010}");
        for n in 0..records {
            let stored: Result<u64, _> = idem
                .execute(&key(n), &n, || async move { Ok::<_, Infallible>(n) })
                .await;
            assert_eq!(stored.ok(), Some(n));
        }
        for i in 0..replays {
            // Scattered over the store in a fixed order, as a large store's
            // replays are: random keys, the same in every run.
            let n = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % records.max(1);
            let replayed: Result<u64, _> = idem
                .execute(&key(n), &n, || async move { Ok::<_, Infallible>(u64::MAX) })
                .await;
            assert_eq!(replayed.ok(), Some(n), "record {n} did not replay");
        }
    });
}
