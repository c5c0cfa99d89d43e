//! Servers the tests start themselves: a free loopback port, and a
//! `redis-server` process that goes away with the value that holds it.

use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A child process, killed and reaped when dropped (also when a test
/// panics and unwinds).
#[derive(Debug)]
pub struct Process(Child);

impl Process {
    /// Kills the process now (SIGKILL) and reaps it.
    pub fn kill(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl From<Child> for Process {
    fn from(child: Child) -> Process {
        Process(child)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A TCP port free on loopback now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free loopback port")
}

/// `redis-server` on `port` of loopback, its files in `dir`, keeping
/// nothing on disk, with `extra` options (`["--replicaof", …]`); its output
/// is discarded.
pub fn redis_server(dir: &Path, port: u16, extra: &[String]) -> std::io::Result<Process> {
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    Ok(Process(child))
}
