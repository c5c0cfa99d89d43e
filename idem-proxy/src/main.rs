//! The `idem-proxy` command: the reverse proxy, from flags or a file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use idem_proxy::{Config, Proxy, UpstreamUrl};
use idem_stores::StoreUrl;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Puts idempotency keys in front of an HTTP service: each protected
/// request reaches the upstream once per key; retries get its recorded
/// response.
#[derive(Debug, Parser)]
#[command(name = "idem-proxy", version)]
struct Args {
    /// The address clients connect to (default 127.0.0.1:8080).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// The upstream's URL, e.g. http://127.0.0.1:3000.
    #[arg(long)]
    upstream: Option<String>,
    /// A PEM file of CA certificates an https:// upstream is checked
    /// against, instead of Mozilla's roots.
    #[arg(long, value_name = "PATH")]
    upstream_ca: Option<PathBuf>,
    /// Checks no certificate of an https:// upstream (for tests only).
    #[arg(long, conflicts_with = "upstream_ca")]
    upstream_insecure: bool,
    /// The listener's certificate chain (PEM): with --tls-key, clients
    /// connect over TLS. Both files are read again on SIGHUP.
    #[arg(long, value_name = "PATH", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The listener's private key (PEM).
    #[arg(long, value_name = "PATH", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The store's URL (default sqlite://idem-proxy.db); else
    /// `--store-file`, else the environment's `IDEM_STORE`, else the file's
    /// `store`.
    #[arg(long)]
    store: Option<String>,
    /// A file whose first line is the store's URL: a password in it stays
    /// out of the process list.
    #[arg(long, value_name = "PATH", conflicts_with = "store")]
    store_file: Option<PathBuf>,
    /// The routes and defaults (TOML); see the crate docs for its format.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Serves /healthz and /metrics on this address.
    #[arg(long)]
    admin: Option<SocketAddr>,
    /// The lease of routes that set none, e.g. 60s.
    #[arg(long)]
    lease: Option<String>,
    /// Answers replays from a near cache in this process.
    #[arg(long)]
    near_cache: bool,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("idem-proxy: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("idem-proxy: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    config.listen = args.listen.or(config.listen);
    config.upstream = args.upstream.or(config.upstream);
    config.store =
        idem_stores::given_url(args.store.as_deref(), args.store_file.as_deref())?.or(config.store);
    config.admin = args.admin.or(config.admin);
    config.lease = args.lease.or(config.lease);
    if args.near_cache {
        config.near_cache = Some(true);
    }
    config.upstream_ca = args.upstream_ca.or(config.upstream_ca);
    if args.upstream_insecure {
        config.upstream_insecure = Some(true);
    }
    if args.tls_cert.is_some() {
        config.tls_cert = args.tls_cert;
        config.tls_key = args.tls_key;
    }

    let upstream: UpstreamUrl = config
        .upstream
        .as_deref()
        .ok_or("no upstream: pass --upstream http://host:port or set `upstream` in the file")?
        .parse()?;
    let store_url: StoreUrl = config
        .store
        .as_deref()
        .unwrap_or("sqlite://idem-proxy.db")
        .parse()?;
    let store = store_url.open().await?;
    let mut builder = Proxy::builder(upstream);
    for route in config.routes(Arc::clone(&store))? {
        builder = builder.route(route);
    }
    if let Some(timeout) = config.upstream_timeout()? {
        builder = builder.upstream_timeout(timeout);
    }
    if let Some(grace) = config.shutdown_grace()? {
        builder = builder.shutdown_grace(grace);
    }
    let (builder, tls) = tls::configure(builder, &config)?;
    let proxy = builder.build();

    let (stop, stopped) = watch::channel(false);
    let until_stopped = move || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        }
    };
    let admin = match config.admin {
        Some(addr) => {
            let metrics = idem_proxy::install_prometheus().ok();
            let listener = TcpListener::bind(addr).await?;
            println!("idem-proxy admin on {}", listener.local_addr()?);
            Some(tokio::spawn(idem_proxy::serve_admin(
                listener,
                metrics,
                until_stopped(),
            )))
        }
        None => None,
    };
    let listen = config
        .listen
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080)));
    let listener = TcpListener::bind(listen).await?;
    // Before the line below: a SIGHUP sent once it is printed reloads.
    tls::reload_on_hangup(tls.clone())?;
    // Scripts and tests read the address (port 0 picks one) from this line.
    println!("idem-proxy listening on {}", listener.local_addr()?);
    tokio::spawn(async move {
        signal().await;
        tracing::info!("shutting down: finishing the requests in flight");
        let _ = stop.send(true);
    });
    tls::serve(proxy, listener, tls, until_stopped()).await;
    if let Some(admin) = admin {
        let _ = admin.await;
    }
    Ok(())
}

/// The `tls` feature's settings, and errors naming it when it is off.
#[cfg(feature = "tls")]
mod tls {
    use std::future::Future;

    use idem_proxy::{Config, Proxy, ProxyBuilder, ServerTls, UpstreamTls};
    use tokio::net::TcpListener;

    /// The upstream's trust, and the listener's certificate if any.
    pub(crate) fn configure(
        builder: ProxyBuilder,
        config: &Config,
    ) -> Result<(ProxyBuilder, Option<ServerTls>), Box<dyn std::error::Error>> {
        let trust = match (&config.upstream_ca, config.upstream_insecure) {
            (Some(_), Some(true)) => {
                return Err("`upstream_ca` and `upstream_insecure` exclude each other".into())
            }
            (Some(ca), _) => UpstreamTls::with_ca_file(ca)?,
            (None, Some(true)) => {
                tracing::warn!("the upstream's TLS certificate is not checked");
                UpstreamTls::insecure()
            }
            (None, _) => UpstreamTls::mozilla(),
        };
        let tls = match (&config.tls_cert, &config.tls_key) {
            (Some(cert), Some(key)) => Some(ServerTls::from_pem_files(cert, key)?),
            (None, None) => None,
            _ => return Err("`tls_cert` and `tls_key` go together".into()),
        };
        Ok((builder.upstream_tls(trust), tls))
    }

    /// Reads the listener's files again on every SIGHUP.
    pub(crate) fn reload_on_hangup(tls: Option<ServerTls>) -> std::io::Result<()> {
        let Some(tls) = tls else { return Ok(()) };
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let mut hangups = signal(SignalKind::hangup())?;
            tokio::spawn(async move {
                while hangups.recv().await.is_some() {
                    match tls.reload() {
                        Ok(()) => tracing::info!("reloaded the TLS certificate"),
                        Err(error) => {
                            tracing::error!(%error, "kept the TLS certificate: the new one cannot be read")
                        }
                    }
                }
            });
        }
        #[cfg(not(unix))]
        let _ = tls;
        Ok(())
    }

    pub(crate) async fn serve(
        proxy: Proxy,
        listener: TcpListener,
        tls: Option<ServerTls>,
        shutdown: impl Future<Output = ()>,
    ) {
        match tls {
            Some(tls) => proxy.serve_tls(listener, tls, shutdown).await,
            None => proxy.serve(listener, shutdown).await,
        }
    }
}

#[cfg(not(feature = "tls"))]
mod tls {
    use std::future::Future;

    use idem_proxy::{Config, Proxy, ProxyBuilder};
    use tokio::net::TcpListener;

    /// No TLS in this build: any TLS setting is an error.
    #[derive(Clone)]
    pub(crate) enum NoTls {}

    pub(crate) fn configure(
        builder: ProxyBuilder,
        config: &Config,
    ) -> Result<(ProxyBuilder, Option<NoTls>), Box<dyn std::error::Error>> {
        if config.upstream_ca.is_some()
            || config.upstream_insecure.is_some()
            || config.tls_cert.is_some()
            || config.tls_key.is_some()
        {
            return Err("TLS settings need idem-proxy's `tls` feature".into());
        }
        Ok((builder, None))
    }

    pub(crate) fn reload_on_hangup(_: Option<NoTls>) -> std::io::Result<()> {
        Ok(())
    }

    pub(crate) async fn serve(
        proxy: Proxy,
        listener: TcpListener,
        _: Option<NoTls>,
        shutdown: impl Future<Output = ()>,
    ) {
        proxy.serve(listener, shutdown).await;
    }
}

/// SIGTERM or Ctrl-C.
async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
