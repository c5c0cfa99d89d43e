//! Redis Cluster and Sentinel over TLS, as managed services serve them:
//! servers this binary starts with TLS only (no plain port, the cluster
//! bus and the Sentinel's links over TLS too), certificates it makes (a
//! CA, a server certificate for `localhost`, a client certificate) and
//! client certificates required. The nodes and the Sentinel announce
//! `localhost`, the name their certificate carries. The whole conformance
//! kit runs over the TLS cluster; another CA is refused at connect.

#[allow(dead_code)]
mod support;

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use idem_conformance::Fixture;
use idem_core::store::{StoreError, StoreErrorKind};
use idem_core::Idempotent;
use idem_redis::{redis, RedisStore};
use idem_testing::process::{server_ports, CLUSTER_BUS};
use idem_testing::tls::{redis_tls_server, wait_for_port, Certs, ServerCert, Watched};

/// The TLS cluster: its nodes' ports and the certificates.
struct Cluster {
    certs: Certs,
    ports: Vec<u16>,
    _watched: Vec<Watched>,
}

/// Torn down by the watchdogs when this process exits.
static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();

fn cluster() -> &'static Cluster {
    let cluster = CLUSTER.get_or_init(|| {
        if let Some(reason) = support::servers::binaries_missing() {
            return Err(reason);
        }
        Ok(start_cluster(3).unwrap_or_else(|e| panic!("a TLS cluster starts: {e}")))
    });
    match cluster {
        Ok(cluster) => cluster,
        Err(reason) => support::skip_binary(reason),
    }
}

/// redis-cli's TLS flags: trust the CA, present the client certificate.
fn cli_tls(certs: &Certs) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = vec!["--tls".into()];
    for (flag, file) in [
        ("--cacert", "ca.pem"),
        ("--cert", "client.pem"),
        ("--key", "client.key"),
    ] {
        args.push(flag.into());
        args.push(certs.path(file).into_os_string());
    }
    args
}

/// The server options every TLS node and Sentinel here shares: TLS only,
/// client certificates required, and the client certificate to present
/// to its peers (the server certificate is for servers only).
fn tls_options(certs: &Certs, port: u16) -> Vec<std::ffi::OsString> {
    let (cert, key) = certs.server(ServerCert::Good);
    let mut args: Vec<std::ffi::OsString> = Vec::new();
    let mut pair = |name: &str, value: std::ffi::OsString| {
        args.push(format!("--{name}").into());
        args.push(value);
    };
    pair("port", "0".into());
    pair("tls-port", port.to_string().into());
    pair("bind", "127.0.0.1".into());
    pair("tls-cert-file", cert.into_os_string());
    pair("tls-key-file", key.into_os_string());
    pair("tls-client-cert-file", certs.path("client.pem").into());
    pair("tls-client-key-file", certs.path("client.key").into());
    pair("tls-ca-cert-file", certs.path("ca.pem").into());
    pair("tls-auth-clients", "yes".into());
    pair("tls-replication", "yes".into());
    args
}

fn start_cluster(masters: usize) -> Result<Cluster, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?.keep();
    let certs = Certs::new(&dir);
    let ports = server_ports(masters, CLUSTER_BUS);
    let mut watched = Vec::new();
    for port in &ports {
        let mut command: Vec<std::ffi::OsString> = vec!["redis-server".into()];
        command.extend(tls_options(&certs, *port));
        for arg in [
            "--cluster-enabled yes",
            "--tls-cluster yes",
            "--cluster-announce-hostname localhost",
            "--cluster-preferred-endpoint-type hostname",
            "--save ''",
            "--appendonly no",
        ] {
            let (name, value) = arg.split_once(' ').unwrap();
            command.push(name.into());
            command.push(value.trim_matches('\'').into());
        }
        command.extend([
            "--dir".into(),
            dir.clone().into_os_string(),
            "--cluster-config-file".into(),
            format!("nodes-{port}.conf").into(),
            "--dbfilename".into(),
            format!("dump-{port}.rdb").into(),
        ]);
        watched.push(Watched::start(&command, None).map_err(|e| e.to_string())?);
        if !wait_for_port(*port, Duration::from_secs(10)) {
            return Err(format!("a TLS cluster node never listened on {port}"));
        }
    }
    // The directory goes with the last watchdog.
    watched.push(Watched::start(&["true".into()], Some(&dir)).map_err(|e| e.to_string())?);
    let create = Command::new("redis-cli")
        .args(cli_tls(&certs))
        .args(["--cluster", "create"])
        .args(ports.iter().map(|port| format!("127.0.0.1:{port}")))
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("redis-cli --cluster create: {e}"))?;
    if !create.status.success() {
        return Err(format!(
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&create.stdout)
        ));
    }
    let cluster = Cluster {
        certs,
        ports,
        _watched: watched,
    };
    for url in cluster.urls("ca.pem") {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let info = query::<String>(&url, redis::cmd("CLUSTER").arg("INFO"));
            if info
                .as_deref()
                .is_ok_and(|i| i.contains("cluster_state:ok"))
            {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("never cluster_state:ok: {info:?}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(cluster)
}

impl Cluster {
    /// Each node's `rediss://` URL at `localhost`, trusting `ca` and
    /// presenting the client certificate.
    fn urls(&self, ca: &str) -> Vec<String> {
        self.ports
            .iter()
            .map(|port| tls_url(&self.certs, *port, ca))
            .collect()
    }
}

fn tls_url(certs: &Certs, port: u16, ca: &str) -> String {
    let file = |name: &str| certs.path(name).display().to_string();
    format!(
        "rediss://localhost:{port}/?cacert={}&cert={}&key={}",
        file(ca),
        file("client.pem"),
        file("client.key")
    )
}

/// Runs one command on a fresh TLS connection to `url`.
fn query<T: redis::FromRedisValue>(url: &str, cmd: &mut redis::Cmd) -> Result<T, String> {
    let info = idem_redis::connection_info(url).map_err(|e| e.to_string())?;
    let client = redis::Client::open(info).map_err(|e| e.to_string())?;
    let mut connection = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .map_err(|e| e.to_string())?;
    cmd.query(&mut connection).map_err(|e| e.to_string())
}

async fn connect_cluster(ca: &str) -> Result<RedisStore, StoreError> {
    let urls = cluster().urls(ca);
    let certificates = idem_redis::tls_certificates(&urls[0])?.expect("the URL names files");
    RedisStore::connect_cluster_with_tls(urls, certificates).await
}

async fn factory() -> Fixture {
    let prefix = support::unique_prefix();
    let store = connect_cluster("ca.pem")
        .await
        .unwrap_or_else(|e| panic!("connect to the TLS cluster: {e}"))
        .with_prefix(&prefix);
    // The keys under the prefix on every master, over TLS too; `KEYS`
    // skips a key Redis has expired by itself, so such a record counts
    // as gone.
    let urls = cluster().urls("ca.pem");
    let pattern = format!("{prefix}*");
    Fixture::new(store, ()).with_stored_count(move || {
        let (urls, pattern) = (urls.clone(), pattern.clone());
        async move {
            tokio::task::spawn_blocking(move || {
                urls.iter()
                    .map(|url| {
                        query::<Vec<Vec<u8>>>(url, redis::cmd("KEYS").arg(&pattern))
                            .unwrap_or_else(|e| panic!("KEYS at {url}: {e}"))
                            .len()
                    })
                    .sum()
            })
            .await
            .expect("the count ran")
        }
    })
}

idem_conformance::store_tests!(factory);

#[tokio::test]
async fn records_spread_over_every_tls_master_and_replay() {
    let prefix = support::unique_prefix();
    let idem = Idempotent::new(
        connect_cluster("ca.pem")
            .await
            .unwrap()
            .with_prefix(&prefix),
    );
    let runs = AtomicU32::new(0);
    for n in 0..30u32 {
        for _ in 0..2 {
            let got: u32 = idem
                .execute(&format!("order-{n}"), &n, || async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Infallible>(n)
                })
                .await
                .unwrap();
            assert_eq!(got, n);
        }
    }
    assert_eq!(runs.into_inner(), 30, "each key ran once");
    for url in cluster().urls("ca.pem") {
        let keys: Vec<Vec<u8>> = query(&url, redis::cmd("KEYS").arg(format!("{prefix}*"))).unwrap();
        assert!(!keys.is_empty(), "no record landed on {url}");
    }
}

#[tokio::test]
async fn a_cluster_signed_by_another_ca_is_refused() {
    cluster();
    let error = connect_cluster("other-ca.pem")
        .await
        .expect_err("another CA is refused");
    let text = format!("{error}").to_lowercase();
    eprintln!("refused as expected: {error}");
    assert_eq!(error.kind(), StoreErrorKind::Backend, "{text}");
    assert!(
        text.contains("unknownissuer") || text.contains("unknown issuer"),
        "the error does not name the cause: {text}"
    );
}

/// One TLS master and one Sentinel over TLS monitoring it by the name
/// `localhost`, in `dir`; `(sentinel's port, servers)`.
fn sentinel_over_tls(dir: &Path, certs: &Certs) -> (u16, Vec<Watched>) {
    let ports = server_ports(2, 0);
    let (master, sentinel) = (ports[0], ports[1]);
    let master_server = redis_tls_server(dir, certs, ServerCert::Good, master)
        .unwrap_or_else(|e| panic!("redis-server starts: {e}"));
    assert!(wait_for_port(master, Duration::from_secs(10)));
    let mut config = String::new();
    let options = tls_options(certs, sentinel);
    for pair in options.chunks(2) {
        let name = pair[0].to_string_lossy();
        config.push_str(&format!(
            "{} {}\n",
            name.trim_start_matches("--"),
            pair[1].to_string_lossy()
        ));
    }
    config.push_str(&format!(
        "sentinel resolve-hostnames yes\nsentinel announce-hostnames yes\n\
         sentinel monitor m localhost {master} 1\n"
    ));
    let file: PathBuf = dir.join(format!("sentinel-{sentinel}.conf"));
    std::fs::write(&file, config).unwrap();
    let sentinel_server = Watched::start(
        &[
            "redis-server".into(),
            file.into_os_string(),
            "--sentinel".into(),
        ],
        None,
    )
    .unwrap();
    assert!(
        wait_for_port(sentinel, Duration::from_secs(10)),
        "the Sentinel never listened on {sentinel}"
    );
    (sentinel, vec![master_server, sentinel_server])
}

#[tokio::test]
async fn the_master_a_tls_sentinel_names_is_reached_over_mutual_tls() {
    if let Some(reason) = support::servers::binaries_missing() {
        support::skip::<()>(&reason);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let certs = Certs::new(dir.path());
    let (sentinel, _servers) = sentinel_over_tls(dir.path(), &certs);

    let url = tls_url(&certs, sentinel, "ca.pem");
    let certificates = idem_redis::tls_certificates(&url).unwrap().unwrap();
    let store = RedisStore::connect_sentinel_with_tls([url.as_str()], "m", certificates)
        .await
        .unwrap_or_else(|e| panic!("the store finds the master over TLS: {e}"));
    let idem = Idempotent::new(store.with_prefix(support::unique_prefix()));
    let runs = AtomicU32::new(0);
    for _ in 0..3 {
        let n: u32 = idem
            .execute("order-1", &1, || async {
                Ok::<_, Infallible>(runs.fetch_add(1, Ordering::SeqCst) + 1)
            })
            .await
            .unwrap();
        assert_eq!(n, 1);
    }
    assert_eq!(runs.into_inner(), 1);

    let other = tls_url(&certs, sentinel, "other-ca.pem");
    let certificates = idem_redis::tls_certificates(&other).unwrap().unwrap();
    let error = RedisStore::connect_sentinel_with_tls([other.as_str()], "m", certificates)
        .await
        .expect_err("another CA is refused");
    eprintln!("refused as expected: {error}");
    assert_ne!(error.kind(), StoreErrorKind::Config, "{error}");
}
