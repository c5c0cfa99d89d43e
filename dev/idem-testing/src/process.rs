//! Servers the tests start themselves: a free loopback port, and a
//! `redis-server` process that goes away with the value that holds it.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::PoisonError;

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

/// A loopback port for a server a test starts, and may kill and start
/// again on the same port; see [`server_ports`].
pub fn free_port() -> u16 {
    server_ports(1, 0)[0]
}

/// How far above its port a Redis Cluster node listens for its bus.
pub const CLUSTER_BUS: u16 = 10000;

/// The lowest port [`server_ports`] hands out.
const LOWEST: u16 = 16000;

/// `count` loopback ports for servers a test starts, each with
/// `port + companion` free too (a Redis Cluster node's bus port,
/// [`CLUSTER_BUS`] above; 0 for none).
///
/// They lie below the kernel's ephemeral range, so no outgoing
/// connection ever takes one as its local port (inside the range one can,
/// once a killed server's own closed connections have lapsed, and its
/// `TIME_WAIT` then keeps the server from binding it again for a
/// minute). Each is reserved with a lock on a file under the temporary
/// directory for as long as this process lives, so tests in other
/// processes never get it either, and none is handed out twice.
///
/// # Panics
/// When no such port is left.
pub fn server_ports(count: usize, companion: u16) -> Vec<u16> {
    static RESERVED: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());
    let ephemeral = ephemeral_low();
    let highest = ephemeral.saturating_sub(companion);
    assert!(
        highest > LOWEST,
        "no ports below the ephemeral range ({ephemeral}) with a companion {companion} above"
    );
    let dir = std::env::temp_dir().join("idem-test-ports");
    std::fs::create_dir_all(&dir).expect("the port reservations' directory");
    let mut reserved = RESERVED.lock().unwrap_or_else(PoisonError::into_inner);
    let free = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
    let mut ports = Vec::with_capacity(count);
    let span = highest - LOWEST;
    let start = rand::random_range(0..span);
    for step in 0..span {
        if ports.len() == count {
            break;
        }
        let port = LOWEST + (start + step) % span;
        let Some(own) = lock(&dir, port) else {
            continue;
        };
        let bus = match companion {
            0 => None,
            companion => match lock(&dir, port + companion) {
                Some(bus) => Some(bus),
                None => continue,
            },
        };
        if free(port) && (companion == 0 || free(port + companion)) {
            reserved.push(own);
            reserved.extend(bus);
            ports.push(port);
        }
    }
    assert_eq!(ports.len(), count, "free loopback ports below {highest}");
    ports
}

/// The lock on `port`'s file in `dir`, unless another process (or this
/// one) holds it.
fn lock(dir: &Path, port: u16) -> Option<std::fs::File> {
    let file = std::fs::File::create(dir.join(port.to_string())).ok()?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).ok()?;
    Some(file)
}

/// The first port of the kernel's ephemeral range (32768 if unknown).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768)
}

/// `redis-server` on `port` of loopback, its files in `dir`, keeping
/// nothing on disk, with `extra` options (`["--replicaof", …]`); its output
/// is discarded.
pub fn redis_server(dir: &Path, port: u16, extra: &[String]) -> std::io::Result<Process> {
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        // A replica's full sync writes its copy to `dir`: a file of each
        // server's own, or a server started again there loads another's.
        .args(["--dbfilename", &format!("dump-{port}.rdb")])
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    Ok(Process(child))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_ports_are_reserved_below_the_ephemeral_range() {
        let ports = server_ports(20, CLUSTER_BUS);
        let mut distinct = ports.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 20, "a port handed out twice: {ports:?}");
        let dir = std::env::temp_dir().join("idem-test-ports");
        for port in ports {
            assert!(port + CLUSTER_BUS < ephemeral_low(), "{port} and its bus");
            assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_ok());
            // Held for this process: nobody else takes it or its bus port.
            assert!(lock(&dir, port).is_none(), "{port} is not reserved");
            assert!(lock(&dir, port + CLUSTER_BUS).is_none());
        }
        assert!(free_port() < ephemeral_low());
    }
}
