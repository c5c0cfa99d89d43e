//! A retry storm against a server that is killed with SIGKILL at random
//! moments and started again, checked against the ledger it persisted.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::Rng;

use crate::report::Report;
use crate::store::StoreSpec;
use crate::storm::{run_storm, StormConfig, StormError};

/// The lease the chaos server runs with: a killed server's keys come free
/// this long after the kill, well within a storm client's patience.
pub const CHAOS_LEASE: Duration = Duration::from_millis(1500);

/// What a chaos storm did and found.
#[derive(Debug)]
#[non_exhaustive]
pub struct ChaosReport {
    /// The storm's report, checked against the ledger the last server
    /// read from its database.
    pub storm: Report,
    /// How many times the server was killed with SIGKILL.
    pub kills: usize,
}

/// A server child process of `exe serve`.
struct Server {
    exe: PathBuf,
    addr: SocketAddr,
    store: String,
    child: Option<Child>,
}

impl Server {
    fn spawn(&mut self) -> io::Result<()> {
        let child = Command::new(&self.exe)
            .args([
                "serve",
                "--addr",
                &self.addr.to_string(),
                "--store",
                &self.store,
            ])
            .arg("--lease-ms")
            .arg(CHAOS_LEASE.as_millis().to_string())
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()?;
        self.child = Some(child);
        Ok(())
    }

    /// SIGKILL: no shutdown, no flush, requests in flight cut off.
    fn kill(&mut self) -> io::Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    async fn wait_healthy(&self) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if tokio::net::TcpStream::connect(self.addr).await.is_ok() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(io::Error::other(format!(
            "the server at {} did not start within 30 s",
            self.addr
        )))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// Runs `exe serve --store spec` as a child process, fires the storm of
/// `config` at it, and meanwhile kills the server with SIGKILL `kills`
/// times at random moments (the first within 20–150 ms, then every
/// 150–600 ms), starting it again each time
/// on the same port and database. Then the ledger is read from the
/// restarted server's database and checked as after any storm: no payment
/// charged twice, none missing, every 201 a client was told matching its
/// row.
///
/// Only stores that keep their data across a restart make sense: a SQLite
/// file, a PostgreSQL or a MariaDB database.
pub async fn storm_with_chaos(
    exe: PathBuf,
    spec: &StoreSpec,
    kills: usize,
    config: &StormConfig,
) -> Result<ChaosReport, StormError> {
    let addr = TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map_err(StormError::Serve)?;
    let mut server = Server {
        exe,
        addr,
        store: spec.to_arg(),
        child: None,
    };
    server.spawn().map_err(StormError::Serve)?;
    server.wait_healthy().await.map_err(StormError::Serve)?;
    let url = format!("http://{addr}");
    let storm = {
        let (url, config) = (url.clone(), config.clone());
        tokio::spawn(async move { run_storm(&url, &config).await })
    };
    let mut done = 0;
    while done < kills && !storm.is_finished() {
        // The first kill comes early, so that even a storm the machine
        // finishes in well under a second meets at least one.
        let pause = if done == 0 {
            rand::rng().random_range(20..150)
        } else {
            rand::rng().random_range(150..600)
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
        if storm.is_finished() {
            break;
        }
        server.kill().map_err(StormError::Serve)?;
        done += 1;
        server.spawn().map_err(StormError::Serve)?;
        server.wait_healthy().await.map_err(StormError::Serve)?;
    }
    let report = match storm.await {
        Ok(report) => report?,
        Err(join) => return Err(StormError::Serve(io::Error::other(join))),
    };
    Ok(ChaosReport {
        storm: report,
        kills: done,
    })
}
