//! Servers over TLS that a test starts itself, with certificates it makes:
//! a CA, a server certificate for `localhost`, a client certificate, and
//! the bad ones a client must refuse (another CA's, an expired one, one for
//! another host).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rcgen::{
    date_time_ymd, BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

/// The files [`Certs::new`] writes, each a PEM file in its directory.
#[derive(Debug, Clone)]
pub struct Certs {
    dir: PathBuf,
}

/// A certificate a server presents, by what is wrong with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerCert {
    /// For `localhost`, signed by the CA, valid now.
    Good,
    /// For `localhost`, signed by the CA, expired in 2000.
    Expired,
    /// Signed by the CA and valid, for `elsewhere.invalid` only.
    OtherHost,
}

impl ServerCert {
    /// The certificate's and key's file names.
    fn files(self) -> (&'static str, &'static str) {
        match self {
            ServerCert::Good => ("server.pem", "server.key"),
            ServerCert::Expired => ("expired.pem", "expired.key"),
            ServerCert::OtherHost => ("other-host.pem", "other-host.key"),
        }
    }
}

impl Certs {
    /// Makes the certificates in `dir`: `ca.pem` (the CA to trust),
    /// `other-ca.pem` (a CA that signed none of them), the server's (see
    /// [`ServerCert`]) and `client.pem`/`client.key` (common name
    /// `postgres`, the user PostgreSQL maps it to).
    pub fn new(dir: &Path) -> Certs {
        let ca_key = KeyPair::generate().expect("a CA key");
        let ca = ca_params("idem test CA");
        write(
            dir,
            "ca.pem",
            &ca.self_signed(&ca_key).expect("the CA").pem(),
        );
        let issuer = Issuer::new(ca, ca_key);

        let other_key = KeyPair::generate().expect("a key");
        let other = ca_params("another CA");
        write(
            dir,
            "other-ca.pem",
            &other.self_signed(&other_key).expect("a CA").pem(),
        );

        let leaf = |name: &str, hosts: &[&str], usage, expired: bool, files: (&str, &str)| {
            let key = KeyPair::generate().expect("a key");
            let hosts: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
            let mut params = CertificateParams::new(hosts).expect("names");
            params.distinguished_name.push(DnType::CommonName, name);
            params.extended_key_usages = vec![usage];
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            if expired {
                params.not_before = date_time_ymd(1999, 1, 1);
                params.not_after = date_time_ymd(2000, 1, 1);
            }
            let cert = params.signed_by(&key, &issuer).expect("a certificate");
            write(dir, files.0, &cert.pem());
            write(dir, files.1, &key.serialize_pem());
        };
        let server = ExtendedKeyUsagePurpose::ServerAuth;
        for which in [ServerCert::Good, ServerCert::Expired, ServerCert::OtherHost] {
            let hosts: &[&str] = match which {
                ServerCert::OtherHost => &["elsewhere.invalid"],
                _ => &["localhost"],
            };
            leaf(
                "server",
                hosts,
                server.clone(),
                which == ServerCert::Expired,
                which.files(),
            );
        }
        leaf(
            "postgres",
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
            false,
            ("client.pem", "client.key"),
        );
        Certs {
            dir: dir.to_owned(),
        }
    }

    /// The path of one of the files, by name (`ca.pem`, `client.key`, …).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The server certificate's and key's paths.
    pub fn server(&self, which: ServerCert) -> (PathBuf, PathBuf) {
        let (cert, key) = which.files();
        (self.path(cert), self.path(key))
    }

    /// Gives every file to `uid`:`gid`, readable by that user only (as
    /// PostgreSQL wants its key).
    pub fn give_to(&self, uid: u32, gid: u32) {
        use std::os::unix::fs::PermissionsExt;
        for entry in std::fs::read_dir(&self.dir).expect("the certificates") {
            let path = entry.expect("a file").path();
            if path.extension().is_some_and(|e| e == "pem" || e == "key") {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid)).expect("chown");
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                    .expect("chmod");
            }
        }
    }
}

fn ca_params(name: &str) -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

fn write(dir: &Path, name: &str, pem: &str) {
    std::fs::write(dir.join(name), pem).unwrap_or_else(|e| panic!("{name} written: {e}"));
}

/// A process that goes away when this value is dropped *and* when the
/// test process exits in any way, even killed: a `sh` watchdog runs it and
/// kills it when its standard input, held here only, closes. What a test
/// binary shares in a `static` (never dropped) is started this way.
#[derive(Debug)]
pub struct Watched {
    watchdog: std::process::Child,
}

// Runs "$@" in the background, waits for EOF on stdin, then kills it and
// removes $REMOVE (if set).
const WATCHDOG: &str = r#""$@" </dev/null >/dev/null 2>&1 &
pid=$!
cat >/dev/null
kill $pid 2>/dev/null
wait
[ -n "$REMOVE" ] && rm -rf "$REMOVE"
exit 0"#;

impl Watched {
    /// Starts `command` (a program and its arguments) under a watchdog
    /// that, when done, also removes `remove` if given.
    pub fn start(
        command: &[std::ffi::OsString],
        remove: Option<&Path>,
    ) -> std::io::Result<Watched> {
        Watched::start_as(command, remove, None)
    }

    /// As [`Watched::start`], the watchdog and the command run as `user`
    /// (uid, gid) if given.
    pub fn start_as(
        command: &[std::ffi::OsString],
        remove: Option<&Path>,
        user: Option<(u32, u32)>,
    ) -> std::io::Result<Watched> {
        let mut sh = Command::new("sh");
        if let Some((uid, gid)) = user {
            use std::os::unix::process::CommandExt;
            sh.uid(uid).gid(gid);
        }
        sh.arg("-c").arg(WATCHDOG).arg("watched").args(command);
        if let Some(remove) = remove {
            sh.env("REMOVE", remove);
        }
        let watchdog = sh
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        Ok(Watched { watchdog })
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        drop(self.watchdog.stdin.take());
        let _ = self.watchdog.wait();
    }
}

/// `redis-server` with TLS only on `port` of loopback (no plain port),
/// presenting `which` certificate and asking clients for one signed by the
/// CA (`tls-auth-clients yes`); its files in `dir`, its output discarded.
/// It goes away with the value returned, or when this process exits.
pub fn redis_tls_server(
    dir: &Path,
    certs: &Certs,
    which: ServerCert,
    port: u16,
) -> std::io::Result<Watched> {
    let (cert, key) = certs.server(which);
    let mut child = Command::new("redis-server");
    child
        .args(["--port", "0", "--tls-port", &port.to_string()])
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .args(["--dbfilename", &format!("dump-{port}.rdb")])
        .arg("--dir")
        .arg(dir)
        .arg("--tls-cert-file")
        .arg(cert)
        .arg("--tls-key-file")
        .arg(key)
        .arg("--tls-ca-cert-file")
        .arg(certs.path("ca.pem"))
        .args(["--tls-auth-clients", "yes"]);
    let command: Vec<std::ffi::OsString> = std::iter::once(child.get_program())
        .chain(child.get_args())
        .map(ToOwned::to_owned)
        .collect();
    Watched::start(&command, None)
}

/// Whether a TCP server listens on `port` of loopback yet; polls every
/// 20 ms for up to `within`.
pub fn wait_for_port(port: u16, within: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    loop {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The `pg_hba.conf` of a server that takes TLS connections only, each
/// with a client certificate signed by its CA whose common name is the
/// user (`clientcert=verify-full`); the socket in its directory trusts.
pub const PG_HBA_TLS_ONLY: &str = "local all all trust\n\
    hostnossl all all 0.0.0.0/0 reject\n\
    hostssl all all 127.0.0.1/32 trust clientcert=verify-full\n";

/// The `postgresql.conf` lines that turn TLS on with `certs`, presenting
/// `which` certificate.
pub fn pg_ssl_settings(certs: &Certs, which: ServerCert) -> String {
    let (cert, key) = certs.server(which);
    format!(
        "ssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\nssl_ca_file = '{}'\n",
        cert.display(),
        key.display(),
        certs.path("ca.pem").display()
    )
}

/// A PostgreSQL with TLS only: a data directory `data` in `cluster`
/// ([`PG_HBA_TLS_ONLY`], presenting `which` certificate of `certs`, which
/// this gives to the server's user), on `port` of loopback. It goes away
/// with the value returned or when this process exits, and takes the
/// cluster's directory with it when `remove` is set.
pub fn pg_tls_server(
    cluster: &crate::postgres::PgCluster,
    certs: &Certs,
    which: ServerCert,
    data: &str,
    port: u16,
    remove: bool,
) -> Result<Watched, String> {
    let user = crate::postgres::server_user();
    if let Some((uid, gid)) = user {
        certs.give_to(uid, gid);
    }
    cluster.init_primary(data, &pg_ssl_settings(certs, which));
    std::fs::write(cluster.path(data).join("pg_hba.conf"), PG_HBA_TLS_ONLY)
        .map_err(|e| format!("pg_hba.conf: {e}"))?;
    let bin = crate::postgres::bin_dir()?;
    let command = [
        bin.join("postgres").into_os_string(),
        "-D".into(),
        cluster.path(data).into_os_string(),
        "-c".into(),
        format!("port={port}").into(),
    ];
    let root = cluster.path("");
    let remove = remove.then_some(root.as_path());
    let server = Watched::start_as(&command, remove, user).map_err(|e| format!("postgres: {e}"))?;
    if !wait_for_port(port, std::time::Duration::from_secs(30)) {
        return Err(format!(
            "postgres never listened on {port}: {}",
            cluster.log(data)
        ));
    }
    Ok(server)
}

/// What a TLS MariaDB runs as it starts: the database `test`, and the user
/// `x509`, who has no password and must present a client certificate
/// signed by the CA (`REQUIRE X509`).
const MARIADB_INIT: &str = "CREATE DATABASE IF NOT EXISTS test;\n\
    CREATE USER IF NOT EXISTS 'x509'@'127.0.0.1' REQUIRE X509;\n\
    GRANT ALL ON test.* TO 'x509'@'127.0.0.1';\n";

/// A MariaDB with TLS only (`require_secure_transport`), presenting `which`
/// certificate of `certs` and trusting their CA for client certificates,
/// on `port` of loopback: a data directory made by `mariadb-install-db` in
/// `dir` (root without a password, the database `test`, the user `x509`
/// of `MARIADB_INIT`). Run as the `mysql` user when the caller is root,
/// which is given `dir` and the certificates. It goes away with the value
/// returned or when this process exits, and takes `dir` with it.
pub fn mariadb_tls_server(
    dir: &Path,
    certs: &Certs,
    which: ServerCert,
    port: u16,
) -> Result<Watched, String> {
    let server = ["/usr/sbin/mariadbd", "/usr/sbin/mysqld"]
        .into_iter()
        .map(PathBuf::from)
        .find(|path| path.exists())
        .ok_or("no mariadbd in /usr/sbin")?;
    let user = crate::postgres::user_if_root("mysql");
    if let Some((uid, gid)) = user {
        certs.give_to(uid, gid);
        for path in [dir, &certs.dir] {
            std::os::unix::fs::chown(path, Some(uid), Some(gid))
                .map_err(|e| format!("chown {}: {e}", path.display()))?;
        }
    }
    let data = dir.join("data");
    // Small logs and no syncs: a test's server holds little and loses
    // nothing it needs when killed.
    let small = [
        "--innodb-log-file-size=4M",
        "--innodb-buffer-pool-size=16M",
        "--innodb-flush-method=nosync",
    ];
    let output = Command::new("mariadb-install-db")
        .arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .args(user.map(|_| "--user=mysql"))
        .arg("--auth-root-authentication-method=normal")
        .args(["--skip-test-db", "--skip-name-resolve"])
        .args(small)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("mariadb-install-db: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "mariadb-install-db: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let init = dir.join("init.sql");
    std::fs::write(&init, MARIADB_INIT).map_err(|e| format!("init.sql: {e}"))?;
    let (cert, key) = certs.server(which);
    let arg = |name: &str, path: &Path| format!("--{name}={}", path.display()).into();
    let mut command: Vec<std::ffi::OsString> = vec![
        server.into_os_string(),
        "--no-defaults".into(),
        arg("datadir", &data),
        arg("socket", &dir.join("mysqld.sock")),
        arg("pid-file", &dir.join("mysqld.pid")),
        arg("log-error", &dir.join("error.log")),
        arg("init-file", &init),
        format!("--port={port}").into(),
        "--bind-address=127.0.0.1".into(),
        "--skip-name-resolve".into(),
        "--skip-log-bin".into(),
        arg("ssl-cert", &cert),
        arg("ssl-key", &key),
        arg("ssl-ca", &certs.path("ca.pem")),
        "--require-secure-transport=ON".into(),
    ];
    command.extend(small.into_iter().map(Into::into));
    command.extend(user.map(|_| "--user=mysql".into()));
    let watched = Watched::start(&command, Some(dir)).map_err(|e| format!("mariadbd: {e}"))?;
    if !wait_for_port(port, std::time::Duration::from_secs(30)) {
        let log = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
        return Err(format!("mariadbd never listened on {port}: {log}"));
    }
    Ok(watched)
}

/// `nats-server` with JetStream (its store in `dir`) and TLS only on
/// `port` of loopback, presenting `which` certificate of `certs` and
/// asking clients for one signed by their CA (`verify: true`). It goes
/// away with the value returned, or when this process exits.
pub fn nats_tls_server(
    dir: &Path,
    certs: &Certs,
    which: ServerCert,
    port: u16,
) -> Result<Watched, String> {
    let (cert, key) = certs.server(which);
    let config = dir.join(format!("nats-{port}.conf"));
    let text = format!(
        "listen: \"127.0.0.1:{port}\"\n\
         jetstream {{ store_dir: {:?} }}\n\
         tls {{\n  cert_file: {:?}\n  key_file: {:?}\n  ca_file: {:?}\n  verify: true\n  timeout: 2\n}}\n",
        dir.join(format!("jetstream-{port}")),
        cert,
        key,
        certs.path("ca.pem"),
    );
    std::fs::write(&config, text).map_err(|e| format!("{}: {e}", config.display()))?;
    let command = ["nats-server".into(), "-c".into(), config.into_os_string()];
    let watched = Watched::start(&command, None).map_err(|e| format!("nats-server: {e}"))?;
    if !wait_for_port(port, std::time::Duration::from_secs(10)) {
        return Err(format!("nats-server never listened on {port}"));
    }
    Ok(watched)
}

/// A RabbitMQ node of its own (named `idem-tls-PORT@localhost`, its
/// database, logs and Erlang cookie in `dir`) with one listener, TLS on
/// `port` of loopback, presenting `which` certificate of `certs` and
/// requiring a client certificate signed by their CA
/// (`fail_if_no_peer_cert`); `guest`/`guest` may log in from anywhere.
/// `dist_port` is its Erlang distribution port. It goes away with the
/// value returned, or when this process exits, and takes `dir` with it.
pub fn rabbitmq_tls_server(
    dir: &Path,
    certs: &Certs,
    which: ServerCert,
    port: u16,
    dist_port: u16,
) -> Result<Watched, String> {
    let server = Path::new("/usr/lib/rabbitmq/bin/rabbitmq-server");
    if !server.exists() {
        return Err(format!("no {}", server.display()));
    }
    let (cert, key) = certs.server(which);
    let config = dir.join("rabbitmq");
    let text = format!(
        "listeners.tcp = none\n\
         listeners.ssl.default = 127.0.0.1:{port}\n\
         ssl_options.cacertfile = {}\n\
         ssl_options.certfile = {}\n\
         ssl_options.keyfile = {}\n\
         ssl_options.verify = verify_peer\n\
         ssl_options.fail_if_no_peer_cert = true\n\
         loopback_users = none\n",
        certs.path("ca.pem").display(),
        cert.display(),
        key.display(),
    );
    let file = config.with_extension("conf");
    std::fs::write(&file, text).map_err(|e| format!("{}: {e}", file.display()))?;
    let var = |name: &str, value: &Path| format!("{name}={}", value.display()).into();
    let command: Vec<std::ffi::OsString> = vec![
        "env".into(),
        var("HOME", dir),
        format!("RABBITMQ_NODENAME=idem-tls-{port}@localhost").into(),
        format!("RABBITMQ_NODE_PORT={port}").into(),
        format!("RABBITMQ_DIST_PORT={dist_port}").into(),
        var("RABBITMQ_CONFIG_FILE", &config),
        var("RABBITMQ_MNESIA_BASE", &dir.join("mnesia")),
        var("RABBITMQ_LOG_BASE", &dir.join("log")),
        var("RABBITMQ_ENABLED_PLUGINS_FILE", &dir.join("plugins")),
        var("RABBITMQ_PID_FILE", &dir.join("rabbitmq.pid")),
        server.into(),
    ];
    let watched = Watched::start(&command, Some(dir)).map_err(|e| format!("rabbitmq: {e}"))?;
    // 4 s on an idle machine; more than 30 s seen with both cores busy.
    if !wait_for_port(port, std::time::Duration::from_secs(90)) {
        let log = std::fs::read_dir(dir.join("log"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| std::fs::read_to_string(entry.path()).ok())
            .collect::<String>();
        return Err(format!("rabbitmq never listened on {port}: {log}"));
    }
    Ok(watched)
}

/// A rustls server configuration (ring, the safe protocol versions)
/// presenting `which` certificate of `certs`, asking no client certificate.
pub fn rustls_server_config(
    certs: &Certs,
    which: ServerCert,
) -> std::sync::Arc<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let (cert, key) = certs.server(which);
    let chain = CertificateDer::pem_file_iter(cert)
        .expect("the server certificate")
        .collect::<Result<Vec<_>, _>>()
        .expect("the server certificate");
    let key = PrivateKeyDer::from_pem_file(key).expect("the server key");
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("the protocol versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("the certificate and its key");
    std::sync::Arc::new(config)
}

/// Accepts TLS with `config` on `listener` in a task of its own and hands
/// each connection, in a task of its own too, to `handle`. A handshake that
/// fails (a client refusing the certificate) ends that connection only.
pub fn serve_tls<F, Fut>(
    listener: tokio::net::TcpListener,
    config: std::sync::Arc<rustls::ServerConfig>,
    handle: F,
) where
    F: Fn(tokio_rustls::server::TlsStream<tokio::net::TcpStream>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let handle = std::sync::Arc::new(handle);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (acceptor, handle) = (acceptor.clone(), std::sync::Arc::clone(&handle));
            tokio::spawn(async move {
                if let Ok(stream) = acceptor.accept(stream).await {
                    handle(stream).await;
                }
            });
        }
    });
}
