//! `stream-bench`: see `idem_bench::cmd::streams`; `--help` explains the options.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    idem_bench::cmd::streams::main()
}
