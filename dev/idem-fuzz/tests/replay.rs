//! Every target on its seeds, on the saved findings, and on random
//! mutations of the seeds for `IDEM_FUZZ_SECS` seconds per target (1 by
//! default; the coverage-guided runs are `fuzz/run`).

use std::path::Path;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn seconds() -> Duration {
    let secs = std::env::var("IDEM_FUZZ_SECS").map_or(1.0, |s| {
        s.parse().expect("IDEM_FUZZ_SECS is a number of seconds")
    });
    Duration::from_secs_f64(secs)
}

#[test]
fn every_target_holds_on_its_seeds() {
    for target in idem_fuzz::TARGETS {
        let seeds = (target.seeds)();
        assert!(!seeds.is_empty(), "{} has seeds", target.name);
        for seed in &seeds {
            (target.run)(seed);
        }
    }
}

/// Inputs the fuzzers found, kept in `fuzz/regressions/<target>/`.
#[test]
fn every_target_holds_on_its_past_findings() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
    for target in idem_fuzz::TARGETS {
        let Ok(entries) = std::fs::read_dir(root.join(target.name)) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("a readable folder").path();
            let input = std::fs::read(&path).expect("a readable finding");
            eprintln!("{}: {}", target.name, path.display());
            (target.run)(&input);
        }
    }
}

#[test]
fn every_target_holds_on_mutated_seeds() {
    let seed = rand::random();
    eprintln!("mutation seed {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    for target in idem_fuzz::TARGETS {
        let seeds = (target.seeds)();
        let start = Instant::now();
        let mut runs = 0u64;
        while start.elapsed() < seconds() {
            let mut input = seeds[rng.random_range(0..seeds.len())].clone();
            for _ in 0..rng.random_range(1..=4) {
                mutate(&mut rng, &mut input);
            }
            (target.run)(&input);
            runs += 1;
        }
        eprintln!("{}: {runs} inputs", target.name);
    }
}

/// One random change: a byte set, a range cut, bytes inserted, or a
/// boundary value written.
fn mutate(rng: &mut StdRng, input: &mut Vec<u8>) {
    let at = rng.random_range(0..=input.len());
    match rng.random_range(0..5) {
        0 if at < input.len() => input[at] = rng.random(),
        1 if at < input.len() => {
            let end = rng.random_range(at..=input.len());
            input.drain(at..end);
        }
        2 => {
            let len = rng.random_range(1..8);
            let bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            input.splice(at..at, bytes);
        }
        3 if at < input.len() => {
            let value: [u8; 4] = *[[0xff; 4], [0; 4], [0x7f, 0xff, 0xff, 0xff], [0x80, 0, 0, 0]]
                .get(rng.random_range(0..4))
                .expect("four values");
            let end = (at + rng.random_range(1..=4)).min(input.len());
            input[at..end].copy_from_slice(&value[..end - at]);
        }
        _ => input.truncate(at),
    }
}
