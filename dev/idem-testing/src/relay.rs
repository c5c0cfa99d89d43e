//! A TCP relay a test holds between a client and its server, to make the
//! network misbehave on cue, in the ways a kernel's `netem` would: added
//! latency and jitter, starved bandwidth, connections reset in the middle
//! of a reply, half-open connections (what the client sends arrives, no
//! answer ever comes back), partitions (nothing passes either way until
//! they heal, then everything held passes), cut connections, and new
//! connections sent to another server.

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};

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
    resets: AtomicUsize,
    shaping: Mutex<Shaping>,
    partitioned: watch::Sender<bool>,
    cut: Notify,
}

#[derive(Debug, Default, Clone, Copy)]
struct Shaping {
    latency: Duration,
    jitter: Duration,
    bytes_per_second: Option<u64>,
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
            resets: AtomicUsize::new(0),
            shaping: Mutex::new(Shaping::default()),
            partitioned: watch::channel(false).0,
            cut: Notify::new(),
        });
        let here = shared.clone();
        tokio::spawn(async move {
            while let Ok((downstream, _)) = listener.accept().await {
                tokio::spawn(open(downstream, here.clone()));
            }
        });
        Relay { port, shared }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Makes connections half-open: what servers send is left unread in
    /// the sockets (a server that waits for an answer waits), and what was
    /// read when the stall began is dropped. What clients send still
    /// passes. A connection that stalled never recovers.
    pub fn stall(&self) {
        self.shared.stalled.store(true, Ordering::SeqCst);
    }

    /// Ends a stall for connections made from now on and for those that
    /// have not yet stalled.
    pub fn unstall(&self) {
        self.shared.stalled.store(false, Ordering::SeqCst);
    }

    /// Closes every connection open now; new ones are relayed as before.
    pub fn cut(&self) {
        self.shared.cut.notify_waiters();
    }

    /// Sends connections made from now on to the server on `upstream`,
    /// and ends any stall.
    pub fn point_to(&self, upstream: u16) {
        self.shared.upstream.store(upstream, Ordering::SeqCst);
        self.unstall();
    }

    /// Delays every chunk either way by `latency` plus up to `jitter`
    /// more, drawn for each chunk (zero and zero: none).
    pub fn delay(&self, latency: Duration, jitter: Duration) {
        let mut shaping = self.shared.shaping.lock().unwrap();
        shaping.latency = latency;
        shaping.jitter = jitter;
    }

    /// Passes at most `bytes_per_second` each way on each connection
    /// (`None`: no limit).
    pub fn starve(&self, bytes_per_second: Option<u64>) {
        self.shared.shaping.lock().unwrap().bytes_per_second = bytes_per_second;
    }

    /// Resets the next `replies` server replies halfway: half the chunk
    /// reaches the client, then both sides get a TCP reset.
    pub fn reset_replies(&self, replies: usize) {
        self.shared.resets.store(replies, Ordering::SeqCst);
    }

    /// Resets still to come of those [`Relay::reset_replies`] asked for.
    pub fn resets_left(&self) -> usize {
        self.shared.resets.load(Ordering::SeqCst)
    }

    /// Partitions client from server: nothing passes either way and new
    /// connections are not made upstream, until [`Relay::heal`]; then
    /// what was held passes, as TCP retransmission would deliver it.
    pub fn partition(&self) {
        self.shared.partitioned.send_replace(true);
    }

    /// Ends a partition.
    pub fn heal(&self) {
        self.shared.partitioned.send_replace(false);
    }
}

impl Shared {
    /// Returns once no partition holds traffic.
    async fn unpartitioned(&self) {
        let mut partitioned = self.partitioned.subscribe();
        let _ = partitioned.wait_for(|held| !held).await;
    }

    fn shaping(&self) -> Shaping {
        *self.shaping.lock().unwrap()
    }
}

async fn open(downstream: TcpStream, shared: Arc<Shared>) {
    // A connection made in a partition waits for it to heal, as a SYN
    // retransmitted would.
    shared.unpartitioned().await;
    let upstream = shared.upstream.load(Ordering::SeqCst);
    let Ok(upstream) = TcpStream::connect(("127.0.0.1", upstream)).await else {
        // Refused upstream: the client sees its connection end.
        return;
    };
    // Registered before the copying starts, so a cut is never missed.
    let cut = shared.cut.notified();
    tokio::pin!(cut);
    cut.as_mut().enable();
    let (down_read, down_write) = downstream.into_split();
    let (up_read, up_write) = upstream.into_split();
    tokio::select! {
        () = pass(down_read, up_write, &shared, false) => {}
        () = pass(up_read, down_write, &shared, true) => {}
        () = cut => {}
    }
}

/// Copies one direction until either side closes; `reply` is the server's
/// direction, the one stalls and resets act on.
async fn pass(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, shared: &Shared, reply: bool) {
    let mut buffer = vec![0; 16 * 1024];
    loop {
        let stalled = || reply && shared.stalled.load(Ordering::SeqCst);
        if stalled() {
            return std::future::pending().await;
        }
        let limit = match shared.shaping().bytes_per_second {
            // A tenth of a second's worth at a time.
            Some(rate) => (rate / 10).clamp(1, buffer.len() as u64) as usize,
            None => buffer.len(),
        };
        let Ok(read @ 1..) = from.read(&mut buffer[..limit]).await else {
            return;
        };
        if stalled() {
            return std::future::pending().await;
        }
        shared.unpartitioned().await;
        let shaping = shared.shaping();
        let jitter = shaping.jitter.as_micros() as u64;
        let delay = shaping.latency
            + Duration::from_micros(if jitter > 0 {
                rand::rng().random_range(0..=jitter)
            } else {
                0
            });
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let reset = reply
            && shared
                .resets
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if reset {
            let _ = to.write_all(&buffer[..read.div_ceil(2)]).await;
            // A zero linger turns the close into a reset.
            let _ = to.as_ref().set_zero_linger();
            let _ = from.as_ref().set_zero_linger();
            return;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
        if let Some(rate) = shaping.bytes_per_second {
            tokio::time::sleep(Duration::from_secs_f64(read as f64 / rate as f64)).await;
        }
    }
}
