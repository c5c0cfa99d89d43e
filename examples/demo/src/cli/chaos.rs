//! `serve` over a charge book and `storm --chaos N`: the command-line side
//! of charges kept in the store's database.

use std::process::ExitCode;

use idem_demo::{storm_with_chaos, ChargeBook, StoreKind, StoreSpec, StormConfig};

/// The charge book of `spec` when its charges can live in its database.
pub(crate) async fn open_book(spec: &StoreSpec) -> Result<Option<ChargeBook>, ExitCode> {
    spec.open_book().await.map_err(|e| {
        tracing::error!(store = %spec, error = %e, "cannot open the charge book");
        ExitCode::FAILURE
    })
}

/// Storms a child server killed `kills` times; `spec` defaults to a
/// temporary SQLite file.
pub(crate) async fn storm(spec: Option<StoreSpec>, kills: usize, config: &StormConfig) -> ExitCode {
    let (spec, _dir) = match spec {
        Some(spec)
            if matches!(
                spec.kind(),
                StoreKind::Sqlite | StoreKind::Postgres | StoreKind::MySql
            ) =>
        {
            (spec, None)
        }
        Some(other) => {
            eprintln!("storm: --chaos needs a store that survives a restart (sqlite:, postgres:// or mysql://), not {other}");
            return ExitCode::from(2);
        }
        None => match tempfile::tempdir() {
            Ok(dir) => (StoreSpec::sqlite(dir.path().join("chaos.db")), Some(dir)),
            Err(e) => {
                eprintln!("storm: cannot make a temporary directory: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("storm: cannot find this program to run as the server: {e}");
            return ExitCode::from(2);
        }
    };
    match storm_with_chaos(exe, &spec, kills, config).await {
        Ok(chaos) => {
            println!("{}", chaos.storm);
            println!(
                "server killed with SIGKILL {} times over {spec}; ledger read back from the database",
                chaos.kills
            );
            if chaos.storm.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("storm: {e}");
            ExitCode::from(2)
        }
    }
}
