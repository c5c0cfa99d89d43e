//! Writes every target's seeds into `DIR/<target>/seed-N`, the corpus
//! folders `fuzz/run` hands to libFuzzer.

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: idem-fuzz-seeds DIR");
        std::process::exit(2);
    };
    for target in idem_fuzz::TARGETS {
        let folder = dir.join(target.name);
        std::fs::create_dir_all(&folder)?;
        for (i, seed) in (target.seeds)().iter().enumerate() {
            std::fs::write(folder.join(format!("seed-{i}")), seed)?;
        }
    }
    Ok(())
}
