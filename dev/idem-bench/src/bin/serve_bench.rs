//! `serve-bench`: see `idem_bench::cmd::serve`; `--help` explains the options.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    idem_bench::cmd::serve::main()
}
