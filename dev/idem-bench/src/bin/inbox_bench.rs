//! `inbox-bench`: see `idem_bench::cmd::inbox`; `--help` explains the options.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    idem_bench::cmd::inbox::main()
}
