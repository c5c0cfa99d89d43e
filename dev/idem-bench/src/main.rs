//! `idem-bench`: every store against the raw minimal protocol on the same
//! server; the project's headline figures. `--help` explains the options.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    idem_bench::cmd::headline::main()
}
