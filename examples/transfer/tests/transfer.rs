//! The example, run as a user runs it, on each of the three SQL stores: a
//! retry moves nothing twice and a rolled-back attempt gives its key back
//! (the program checks both and exits non-zero otherwise).

use std::process::Command;

use idem_testing::Server;

fn transfer(url: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_example-transfer"))
        .arg(url)
        .output()
        .expect("the example runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{url}: {}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    for check in [
        "ok: a retry replays the receipt",
        "ok: a retry moves nothing twice",
        "ok: a rolled-back attempt gives the key back",
    ] {
        assert!(stdout.contains(check), "{url}: no {check:?} in\n{stdout}");
    }
}

#[test]
fn a_transfer_on_sqlite_is_made_once() {
    let dir = tempfile::tempdir().unwrap();
    transfer(&format!("sqlite:{}", dir.path().join("bank.db").display()));
}

#[test]
fn a_transfer_on_postgres_is_made_once() {
    if let Some(url) = Server::Postgres.require() {
        transfer(&url);
    }
}

#[test]
fn a_transfer_on_mariadb_is_made_once() {
    if let Some(url) = Server::MySql.require() {
        transfer(&url);
    }
}
