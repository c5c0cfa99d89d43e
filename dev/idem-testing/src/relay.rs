//! A TCP relay a test holds between a client and its server, to make the
//! network misbehave on cue: stop passing what the server sends, cut every
//! connection, or send new connections to another server.

use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// A relay on a loopback port of its own, passing each connection to the
/// server it points to at the time the connection is made. It runs on the
/// tokio runtime it was started on, until that runtime ends.
#[derive(Debug)]
pub struct Relay {
    port: u16,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    upstream: AtomicU16,
    stalled: AtomicBool,
    cut: Notify,
}

impl Relay {
    /// A relay to the server on loopback port `upstream`.
    pub async fn start(upstream: u16) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port for the relay");
        let port = listener.local_addr().expect("the relay's address").port();
        let shared = Arc::new(Shared {
            upstream: AtomicU16::new(upstream),
            stalled: AtomicBool::new(false),
            cut: Notify::new(),
        });
        let here = shared.clone();
        tokio::spawn(async move {
            while let Ok((downstream, _)) = listener.accept().await {
                let upstream = here.upstream.load(Ordering::SeqCst);
                let Ok(upstream) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                    // Refused upstream: the client sees its connection end.
                    continue;
                };
                tokio::spawn(pass(downstream, upstream, here.clone()));
            }
        });
        Relay { port, shared }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops passing what servers send: it is left unread in the sockets
    /// (a server that waits for an answer waits), and what was read when
    /// the stall began is dropped. What clients send still passes.
    pub fn stall(&self) {
        self.shared.stalled.store(true, Ordering::SeqCst);
    }

    /// Closes every connection open now; new ones are relayed as before.
    pub fn cut(&self) {
        self.shared.cut.notify_waiters();
    }

    /// Sends connections made from now on to the server on `upstream`,
    /// and ends any stall.
    pub fn point_to(&self, upstream: u16) {
        self.shared.upstream.store(upstream, Ordering::SeqCst);
        self.shared.stalled.store(false, Ordering::SeqCst);
    }
}

async fn pass(downstream: TcpStream, upstream: TcpStream, shared: Arc<Shared>) {
    // Registered before the copying starts, so a cut is never missed.
    let cut = shared.cut.notified();
    tokio::pin!(cut);
    cut.as_mut().enable();
    let (mut down_read, mut down_write) = downstream.into_split();
    let (mut up_read, mut up_write) = upstream.into_split();
    let to_server = tokio::io::copy(&mut down_read, &mut up_write);
    let to_client = async {
        let mut buffer = vec![0; 64 * 1024];
        loop {
            if shared.stalled.load(Ordering::SeqCst) {
                return std::future::pending::<()>().await;
            }
            let Ok(read @ 1..) = up_read.read(&mut buffer).await else {
                return;
            };
            if shared.stalled.load(Ordering::SeqCst) {
                return std::future::pending::<()>().await;
            }
            if down_write.write_all(&buffer[..read]).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        _ = to_server => {}
        () = to_client => {}
        () = cut => {}
    }
}
