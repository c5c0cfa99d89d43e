//! Redis servers the tests start themselves from the `redis-server` binary:
//! on free loopback ports, in their own temporary directory, without
//! persistence.
//!
//! A watchdog shell owns the servers. It waits for its standard input to
//! close, then kills them and removes the directory. The test process holds
//! the only write end of that pipe, so the servers go away when a
//! [`Servers`] is dropped *and* when the test binary exits in any way —
//! which is what lets a `static` cluster shared by a whole test binary be
//! torn down, even after a failure or a kill.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idem_testing::process::{server_ports, CLUSTER_BUS};

// Starts one redis-server per port (extra server options in $EXTRA), then
// blocks on stdin; EOF means the test process is done with them.
const WATCHDOG: &str = r#"
dir=$1; shift
pids=
for port in "$@"; do
  redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --save '' \
    --appendonly no --daemonize no --logfile "$dir/$port.log" --dbfilename "dump-$port.rdb" \
    --cluster-config-file "nodes-$port.conf" $EXTRA </dev/null >/dev/null 2>&1 &
  pids="$pids $!"
done
cat >/dev/null
kill $pids 2>/dev/null
wait
rm -rf "$dir"
"#;

/// Servers started by this test process, stopped when dropped.
#[derive(Debug)]
pub(crate) struct Servers {
    ports: Vec<u16>,
    dir: std::path::PathBuf,
    watchdog: Child,
}

/// Why servers cannot be started here: the binaries are missing.
pub(crate) fn binaries_missing() -> Option<String> {
    for binary in ["redis-server", "redis-cli"] {
        let found = Command::new(binary)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if !found {
            return Some(format!("`{binary}` is not on PATH"));
        }
    }
    None
}

impl Servers {
    /// One standalone server on a free port.
    pub(crate) fn standalone() -> Result<Servers, String> {
        Servers::start(&server_ports(1, 0), "")
    }

    /// One standalone server on a free port, with `extra` server options
    /// (`--maxmemory 8mb --maxmemory-policy volatile-lru`).
    pub(crate) fn standalone_with(extra: &str) -> Result<Servers, String> {
        Servers::start(&server_ports(1, 0), extra)
    }

    /// One standalone server on `port`, e.g. to restart one that was stopped.
    pub(crate) fn standalone_on(port: u16) -> Result<Servers, String> {
        Servers::start(&[port], "")
    }

    /// A master and one replica of it, synced: `(master, replica)`.
    pub(crate) fn replicated() -> Result<(Servers, Servers), String> {
        let master = Servers::standalone()?;
        let replica = Servers::start(
            &server_ports(1, 0),
            &format!("--replicaof 127.0.0.1 {}", master.ports[0]),
        )?;
        let url = &replica.urls()[0];
        poll(Duration::from_secs(20), || {
            let info = query::<String>(url, redis::cmd("INFO").arg("replication"))?;
            Ok(info.contains("master_link_status:up"))
        })
        .map_err(|e| format!("{url} never synced with its master: {e}"))?;
        Ok((master, replica))
    }

    /// A Redis Cluster of `masters` masters and no replicas, every slot
    /// assigned and `cluster_state:ok` on every node.
    pub(crate) fn cluster(masters: usize) -> Result<Servers, String> {
        Servers::cluster_of(masters, 0, "")
    }

    /// A Redis Cluster of `masters` masters with one replica each, every
    /// slot assigned, `cluster_state:ok` on every node and every master's
    /// replica streaming; `extra` server options (a node timeout).
    pub(crate) fn cluster_with_replicas(masters: usize, extra: &str) -> Result<Servers, String> {
        let servers = Servers::cluster_of(masters, 1, extra)?;
        for url in servers.urls() {
            poll(Duration::from_secs(20), || {
                let info = query::<String>(&url, redis::cmd("INFO").arg("replication"))?;
                Ok(
                    info.contains("role:slave") && info.contains("master_link_status:up")
                        || info.contains("role:master") && info.contains("connected_slaves:1"),
                )
            })
            .map_err(|e| format!("{url} never had its replica or master: {e}"))?;
        }
        Ok(servers)
    }

    fn cluster_of(masters: usize, replicas: usize, extra: &str) -> Result<Servers, String> {
        let servers = Servers::start(
            &server_ports(masters * (1 + replicas), CLUSTER_BUS),
            &format!("--cluster-enabled yes {extra}"),
        )?;
        let nodes: Vec<String> = servers
            .ports
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect();
        let create = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("redis-cli --cluster create: {e}"))?;
        if !create.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&create.stdout)
            ));
        }
        for url in servers.urls() {
            poll(Duration::from_secs(20), || {
                let info = query::<String>(&url, redis::cmd("CLUSTER").arg("INFO"))?;
                Ok(info.contains("cluster_state:ok"))
            })
            .map_err(|e| format!("{url} never reached cluster_state:ok: {e}"))?;
        }
        Ok(servers)
    }

    fn start(ports: &[u16], extra: &str) -> Result<Servers, String> {
        let dir = tempfile::Builder::new()
            .prefix("idem-redis-test-")
            .tempdir()
            .map_err(|e| format!("temporary directory: {e}"))?
            // The watchdog removes it, also when this process cannot.
            .keep();
        let watchdog = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("watchdog")
            .arg(&dir)
            .args(ports.iter().map(u16::to_string))
            .env("EXTRA", extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("sh: {e}"))?;
        let servers = Servers {
            ports: ports.to_vec(),
            dir: dir.clone(),
            watchdog,
        };
        for url in servers.urls() {
            poll(Duration::from_secs(10), || {
                Ok(query::<String>(&url, &mut redis::cmd("PING")).is_ok())
            })
            .map_err(|e| format!("{url} never answered PING: {e}"))?;
        }
        Ok(servers)
    }

    /// A cluster node on `port` started again after it was killed, with
    /// its cluster configuration file and `extra` options; it goes away
    /// with the value returned.
    pub(crate) fn restart_cluster_node(
        &self,
        port: u16,
        extra: &[&str],
    ) -> Result<idem_testing::process::Process, String> {
        let mut args: Vec<String> = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            &format!("nodes-{port}.conf"),
            "--logfile",
            &format!("{port}-again.log"),
        ]
        .map(str::to_owned)
        .to_vec();
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        let node = idem_testing::process::redis_server(&self.dir, port, &args)
            .map_err(|e| format!("redis-server on {port}: {e}"))?;
        // A node that could not start says why in its log, not here.
        let url = format!("redis://127.0.0.1:{port}");
        poll(Duration::from_secs(20), || super::ping(&url).map(|()| true)).map_err(|e| {
            let log = self.log_again(port);
            format!("the node on {port} did not start again ({e}); its log:\n{log}")
        })?;
        Ok(node)
    }

    /// The log of the node [`restart_cluster_node`](Servers::restart_cluster_node)
    /// started on `port`.
    pub(crate) fn log_again(&self, port: u16) -> String {
        std::fs::read_to_string(self.dir.join(format!("{port}-again.log"))).unwrap_or_default()
    }

    pub(crate) fn ports(&self) -> &[u16] {
        &self.ports
    }

    pub(crate) fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|port| format!("redis://127.0.0.1:{port}"))
            .collect()
    }

    /// Stops the first server at once, dropping its data and scripts.
    pub(crate) fn shut_down_first(&self) {
        let url = &self.urls()[0];
        // The server closes the connection instead of answering.
        let _ = query::<()>(url, redis::cmd("SHUTDOWN").arg("NOSAVE"));
        poll(Duration::from_secs(10), || Ok(super::ping(url).is_err()))
            .unwrap_or_else(|e| panic!("{url} kept running after SHUTDOWN: {e}"));
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        // Closing stdin is the watchdog's signal; waiting for it means the
        // servers are gone and the directory removed when this returns.
        drop(self.watchdog.stdin.take());
        let _ = self.watchdog.wait();
    }
}

/// Runs one command on a fresh connection to `url`.
pub(crate) fn query<T: redis::FromRedisValue>(
    url: &str,
    cmd: &mut redis::Cmd,
) -> redis::RedisResult<T> {
    let client = redis::Client::open(url)?;
    let mut connection = client.get_connection_with_timeout(Duration::from_secs(2))?;
    cmd.query(&mut connection)
}

/// Polls `ready` every 20 ms until it says yes or `limit` passes.
fn poll(
    limit: Duration,
    mut ready: impl FnMut() -> redis::RedisResult<bool>,
) -> Result<(), String> {
    let until = Instant::now() + limit;
    let mut last = String::from("not ready");
    while Instant::now() < until {
        match ready() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(last)
}
