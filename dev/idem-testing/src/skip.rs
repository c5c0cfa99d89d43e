//! Skip with a printed reason, or fail under CI.

use std::io::Write;

/// The environment variable that turns every skip into a failure.
pub const CI: &str = "CI";

/// Whether `CI` is set: a missing server is then a failure, not a skip.
pub fn in_ci() -> bool {
    std::env::var_os(CI).is_some()
}

/// Skips the calling test with `reason` printed (returns `None`), or
/// panics with it when [`CI`] is set.
pub fn skip<T>(reason: &str) -> Option<T> {
    if in_ci() {
        panic!("{reason} (CI is set, so this fails instead of skipping)");
    }
    eprintln!("skipping: {reason}");
    None
}

/// Skips every test of this binary (the process exits with success), or
/// panics when [`CI`] is set. For binaries whose tests all need the same
/// server and come from a macro that cannot skip one by one.
pub fn skip_binary(reason: &str) -> ! {
    if in_ci() {
        panic!("{reason} (CI is set, so this fails instead of skipping)");
    }
    // Straight to stderr: the harness would swallow a captured `eprintln!`
    // when the process exits here.
    let _ = writeln!(
        std::io::stderr(),
        "skipping every test of this binary: {reason}"
    );
    std::process::exit(0)
}
