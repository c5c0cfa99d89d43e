//! Running the payments API on a socket, in this process.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use idem_core::store::Store;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::app;
use crate::ledger::{Gateway, Ledger};
use crate::payments::ChargeBook;

/// The simulated gateway's default latency: a few milliseconds, like a
/// payment provider in the same region.
pub const DEFAULT_GATEWAY_LATENCY: Duration = Duration::from_millis(5);

/// A payments API serving on a socket from a task of this process.
///
/// Stop it with [`stop`](RunningServer::stop), which lets requests in
/// flight finish; dropping it stops it too, without waiting.
#[derive(Debug)]
pub struct RunningServer {
    addr: SocketAddr,
    gateway: Arc<Gateway>,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<io::Result<()>>,
}

impl RunningServer {
    /// Binds `addr` (port 0 picks a free port) and serves the payments API
    /// over `store`, with a gateway of `gateway_latency`.
    pub async fn start(
        addr: SocketAddr,
        store: Arc<dyn Store>,
        gateway_latency: Duration,
    ) -> io::Result<RunningServer> {
        let gateway = Arc::new(Gateway::new(gateway_latency));
        let router = app::router(store, Arc::clone(&gateway));
        RunningServer::serve(addr, router, gateway).await
    }

    /// Binds `addr` and serves the payments API with its charges in `book`,
    /// the store's own database, each written in the same transaction as
    /// its idempotency record; the gateway's latency is spent in each
    /// charge, and `lease` is how long a killed server's keys stay blocked.
    /// [`ledger`](RunningServer::ledger) stays empty: the charges are in the
    /// book.
    pub async fn start_in_db(
        addr: SocketAddr,
        book: ChargeBook,
        lease: Duration,
        gateway_latency: Duration,
    ) -> io::Result<RunningServer> {
        let router = crate::payments::router_in_db(book, lease, gateway_latency);
        RunningServer::serve(addr, router, Arc::new(Gateway::new(gateway_latency))).await
    }

    async fn serve(
        addr: SocketAddr,
        router: axum::Router,
        gateway: Arc<Gateway>,
    ) -> io::Result<RunningServer> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        // Small responses go out at once rather than waiting on Nagle's
        // algorithm, which would add tens of milliseconds to each one.
        let listener = listener.tap_io(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "could not set TCP_NODELAY");
            }
        });
        let (shutdown, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async {
                    // A dropped sender stops the server as well.
                    let _ = stopped.await;
                })
                .await
        });
        Ok(RunningServer {
            addr,
            gateway,
            shutdown: Some(shutdown),
            task,
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its base URL, such as `http://127.0.0.1:3000`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The ledger of every charge this server made.
    pub fn ledger(&self) -> &Ledger {
        self.gateway.ledger()
    }

    /// Stops accepting connections, waits for requests in flight to finish
    /// and returns the server's own error, if it had one.
    pub async fn stop(mut self) -> io::Result<()> {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        match (&mut self.task).await {
            Ok(result) => result,
            Err(join) => Err(io::Error::other(join)),
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        // `stop` has taken the sender; a server dropped without it must not
        // outlive its owner.
        if self.shutdown.is_some() {
            self.task.abort();
        }
    }
}
