//! `RedisStore`: construction, options and its `Store` methods.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;
use redis::{IntoConnectionInfo, Value};

use idem_core::store::{Insert, NewRecord, Record, Reset, State, Store, StoreError, Token};

use crate::connection::{command, Shared};
use crate::error::{failed, unexpected};
use crate::ops::{claim_command, SETTLED_FOUND_PTTL};
use crate::record::{self, Encoded, BACKEND};
use crate::scripts::SCRIPTS;
use crate::wake::Subscriber;

/// The key prefix a store uses unless told otherwise.
pub const DEFAULT_PREFIX: &str = "idem:";

/// An idempotency store on Redis or Redis Cluster.
///
/// * **One key per record.** The key is the store's prefix followed by the
///   encoded idempotency key; the value is one compact binary string
///   (version, state, token, fingerprint, the lease deadline while in
///   flight, the payload). A completed record with a 100-byte outcome takes
///   48 bytes more than the bare outcome would.
/// * **One round trip per operation, touching one key**, which is what
///   makes a Redis Cluster safe: any record may live on any node. The claim
///   (`insert`) is a bare `SET … NX GET PX`; `load` is a `MULTI … EXEC` of
///   `GET` and `PTTL`, sent in one write; `swap`, `take_over` and `remove`
///   are compare-and-sets on the token, and `reset` deletes a settled
///   record and nothing else, one Lua script each, called by
///   SHA-1 (`EVALSHA`). A server that lost its script cache (a restart)
///   gets the script loaded again on first use.
/// * **A claim that finds a record in flight costs a second round trip.**
///   It must tell whether the owner's lease has lapsed (then the key is
///   taken over) and how long it has left (the caller's
///   `InProgress { retry_after }`, an HTTP `Retry-After`), on the server's
///   clock, and `SET … NX GET` returns the value alone. So when the value
///   found is in flight the claim is sent again inside a `MULTI … EXEC`
///   with the key's `PTTL`: atomic, and if the key was freed in between,
///   that second claim inserts. A first execution and a replay cost one
///   round trip for the claim; an in-progress answer costs two, and so
///   does each look of a waiter that polls.
/// * **A replay does not read its record's retention left.** A completed
///   or failed record found by a claim reports the least retention above
///   zero (1 ms), a lower bound, as the store contract allows for settled
///   records found by `insert`: nothing is decided on it, and
///   [`load`](idem_core::store::Store::load) (the `idem` command's `inspect`)
///   reports it exactly. Reading it would cost every replay a transaction
///   or a script, which made replays at 32 callers markedly slower than a
///   bare claim (`dev/idem-bench/notes/2026-12-01-redis-claim.md`).
/// * **The server's clock.** Retention is the key's own expiry, set from a
///   duration with `PX`, so Redis forgets outcomes by itself; the lease
///   deadline is kept as milliseconds before that expiry, so the lease left
///   is the key's `PTTL` minus it, read on the server in the same step that
///   acts on it. No deadline is ever computed on a client. Durations are
///   rounded up to whole milliseconds.
/// * **Safe to resend.** A cluster connection resends a request after a
///   timeout; an `insert`, `swap` or `take_over` whose first attempt was
///   applied recognises its own record (its token is unique) and still
///   reports success.
/// * **One shared connection.** Every call uses the same multiplexed
///   connection; there is no pool to check connections out of.
/// * **Foreign values are refused.** A value under a record's key that is
///   not a record of this layout (another version, truncated, garbage, a
///   hash) is reported as [`StoreErrorKind::Corrupt`](idem_core::store::StoreErrorKind)
///   and left as it is: nothing overwrites or deletes it.
/// * [`purge_expired`](idem_core::store::Store::purge_expired) always returns
///   `Ok(0)`: Redis deletes expired keys itself.
///
/// * **Waking waiters.** The scripts that record an outcome or release a
///   key also `PUBLISH` the key on the store's channel (the prefix followed
///   by `wake-ups`), in the same step. A store made by
///   [`connect`](RedisStore::connect) (or given a client with
///   [`with_wake_client`](RedisStore::with_wake_client)) opens one
///   subscriber connection when its first waiter
///   ([`Idempotent::with_wait`](idem_core::Idempotent::with_wait)) comes,
///   shared by every waiter of the store and its clones, and reconnects it
///   when lost; waiters poll meanwhile. A store on a cluster connection
///   sends no wake-ups (its waiters poll): a plain `PUBLISH` is broadcast
///   to every node of a cluster, and sharded pub/sub would take a
///   subscription per key. [`with_notifications(false)`](RedisStore::with_notifications)
///   turns publishing and subscribing off.
///
/// * **Replicas and failover.** A store made by
///   [`connect_sentinel`](RedisStore::connect_sentinel) follows the master
///   the Sentinels name. Redis replicates asynchronously, so a write the
///   master acknowledged can be lost when a replica is promoted: a lost
///   claim lets a retry run the work a second time under the first owner's
///   live lease, a lost outcome makes a told result run again.
///   [`with_replica_acks`](RedisStore::with_replica_acks) makes every write
///   wait for replicas before it counts (`idem-redis/tests/failover.rs`:
///   0 second runs and 0 lost outcomes with it, both seen without it).
///
/// Needs Redis 7.0 or newer (`SET` with both `NX` and `GET`).
#[derive(Clone)]
pub struct RedisStore {
    pub(crate) connection: Arc<dyn Shared>,
    connection_kind: &'static str,
    pub(crate) prefix: Arc<[u8]>,
    client: Option<redis::Client>,
    notifications: bool,
    /// The channel outcomes are published on, when this store publishes.
    pub(crate) channel: Option<Arc<[u8]>>,
    subscriber: Arc<Subscriber>,
    /// The replicas every write waits for, if any.
    pub(crate) replica_acks: Option<ReplicaAcks>,
}

/// What [`RedisStore::with_replica_acks`] set.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReplicaAcks {
    pub(crate) replicas: u32,
    pub(crate) timeout_ms: u64,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("connection", &self.connection_kind)
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .field("notifications", &self.channel.is_some())
            .field("replica_acks", &self.replica_acks.map(|acks| acks.replicas))
            .finish()
    }
}

impl RedisStore {
    /// Connects to one Redis server, for example `redis://127.0.0.1:6379`.
    ///
    /// The store keeps one multiplexed connection, with a 1 s timeout to
    /// connect and a 500 ms one for each reply. A call that finds the
    /// connection gone or gets no reply in time fails with a backend
    /// error, and the next call opens a new connection: the store serves
    /// again after the server restarts, the connection drops, or the
    /// connection goes half-open (requests arrive, no reply comes back),
    /// which a connection kept after a timeout would never recover from.
    /// The scripts are loaded up front.
    pub async fn connect(url: impl IntoConnectionInfo) -> Result<RedisStore, StoreError> {
        let client = redis::Client::open(url).map_err(config)?;
        let timeouts = (Duration::from_secs(1), Duration::from_millis(500));
        let server = crate::reconnect::Reconnecting::server(client.clone(), timeouts);
        server
            .connection()
            .await
            .map_err(|e| StoreError::backend(BACKEND, e))?;
        RedisStore::on(Arc::new(server), "server")
            .with_wake_client(client)
            .load_scripts()
            .await
    }

    /// Connects to a Redis Cluster through any of its nodes, for example
    /// `["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"]`.
    ///
    /// The cluster connection follows slot moves and reconnects by itself.
    /// Every script touches one key, so records spread over all nodes. A
    /// prefix with a hash tag (`{idem}:`) would put every record in one
    /// slot, on one node.
    pub async fn connect_cluster<I, T>(urls: I) -> Result<RedisStore, StoreError>
    where
        I: IntoIterator<Item = T>,
        T: IntoConnectionInfo,
    {
        let client = ClusterClient::new(urls).map_err(config)?;
        let connection = client
            .get_async_connection()
            .await
            .map_err(|e| StoreError::backend(BACKEND, e))?;
        RedisStore::from_connection(connection).load_scripts().await
    }

    /// Uses a connection you already have: a
    /// [`MultiplexedConnection`](redis::aio::MultiplexedConnection), a
    /// [`ConnectionManager`](redis::aio::ConnectionManager) or a cluster
    /// [`ClusterConnection`](redis::cluster_async::ClusterConnection). Any
    /// clone-to-share connection works; each call runs on a clone of it.
    ///
    /// Scripts are loaded on first use of each, which costs two extra
    /// round trips once per script.
    pub fn from_connection<C>(connection: C) -> RedisStore
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        RedisStore::on(Arc::new(connection), std::any::type_name::<C>())
    }

    /// A store on `connection`, with the default options.
    fn on(connection: Arc<dyn Shared>, connection_kind: &'static str) -> RedisStore {
        RedisStore {
            connection,
            connection_kind,
            prefix: Arc::from(DEFAULT_PREFIX.as_bytes()),
            client: None,
            notifications: true,
            channel: None,
            subscriber: Arc::default(),
            replica_acks: None,
        }
    }

    /// Connects to the master that the Redis Sentinels at `sentinels` (for
    /// example `["redis://127.0.0.1:26379"]`) name for `master`.
    ///
    /// The store asks the Sentinels for the master's address, checks its
    /// `ROLE`, and keeps one multiplexed connection to it. A call that
    /// finds the connection gone, timed out (5 s) or the server a replica
    /// now (`READONLY`) fails with a backend error, and the next call asks
    /// the Sentinels again, so the store follows a failover by itself.
    /// Waiters poll (the store publishes no wake-ups).
    ///
    /// Replication is asynchronous: a write the master acknowledged can be
    /// lost when a replica is promoted before it arrived, and a lost claim
    /// lets a retry run the work a second time.
    /// [`with_replica_acks`](RedisStore::with_replica_acks) closes that.
    pub async fn connect_sentinel<I, T>(
        sentinels: I,
        master: &str,
    ) -> Result<RedisStore, StoreError>
    where
        I: IntoIterator<Item = T>,
        T: IntoConnectionInfo,
    {
        let sentinels = sentinels
            .into_iter()
            .map(IntoConnectionInfo::into_connection_info)
            .collect::<Result<Vec<_>, _>>()
            .map_err(config)?;
        let client = redis::sentinel::SentinelClient::build(
            sentinels,
            master.to_owned(),
            None,
            redis::sentinel::SentinelServerType::Master,
        )
        .map_err(config)?;
        let master = crate::reconnect::Reconnecting::sentinel(client);
        master
            .connection()
            .await
            .map_err(|e| StoreError::backend(BACKEND, e))?;
        RedisStore::on(Arc::new(master), "sentinel")
            .load_scripts()
            .await
    }

    /// Waits, after every write, until `replicas` replicas have
    /// acknowledged it (`WAIT replicas timeout`, sent in the same write on
    /// the same connection), before the write counts as done: a claim
    /// before the work runs, a renewal, an outcome before the caller is
    /// told. With the Sentinels promoting a replica that acknowledged (they
    /// promote the most up to date), a failover loses no claim and no
    /// outcome a caller was told.
    ///
    /// A write fewer replicas acknowledged within `timeout` fails with a
    /// backend error: a claim gives its key back (best effort) and the work
    /// does not run, an outcome is reported as not recorded. So writes stop
    /// while fewer replicas than `replicas` are connected: keep one more
    /// replica than you wait for. Each write waits for the replicas' round
    /// trip, and `WAIT` holds the connection while it waits, so writes on
    /// one store are serialised behind it (first executions 0.58× at one
    /// caller, 0.14× at 32; replays 0.68–0.97×; `replica-bench`), and
    /// while replicas lag each write waits out its timeout in turn. A replay writes nothing, and
    /// its `WAIT` covers the writes of the store's connection: an outcome
    /// this store wrote is replayed only once the replicas have it, so its
    /// owner's failed wait is never undone by a retry's replay. An outcome
    /// another process wrote is replayed as soon as the master has it; until
    /// that owner's wait returns, a failover can still lose it.
    ///
    /// Keep `timeout` below the connection's response timeout, or a lagging
    /// replica shows as a timed-out call: `connect` uses redis-rs's 500 ms,
    /// `connect_sentinel` 5 s.
    ///
    /// `replicas` 0 turns the waiting off.
    ///
    /// For one server with replicas (under Sentinel, or promoted by hand)
    /// and for a Redis Cluster with replicas: on a cluster connection the
    /// `WAIT` goes in the write's own pipeline, which the connection sends
    /// to the node that owns the key, so it counts that master's replicas
    /// (a cluster promotes a replica that acknowledged only if it is the
    /// one it picks: give each master one replica, or wait for them all).
    pub fn with_replica_acks(mut self, replicas: u32, timeout: std::time::Duration) -> RedisStore {
        self.replica_acks = (replicas > 0).then(|| ReplicaAcks {
            replicas,
            // At least 1 ms: `WAIT … 0` would wait forever.
            timeout_ms: u64::try_from(timeout.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
        });
        self
    }

    /// Sets the prefix put before every key (default
    /// [`DEFAULT_PREFIX`], `"idem:"`), to share a server with other data
    /// or to keep applications apart.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> RedisStore {
        self.prefix = Arc::from(prefix.into().into_bytes());
        self.rewire()
    }

    /// Wakes waiters through `client`: the store's outcomes are published,
    /// and the first waiter opens a subscriber connection with `client`
    /// (to the same server as the store's connection). [`connect`](RedisStore::connect)
    /// does this already; use it with [`from_connection`](RedisStore::from_connection).
    pub fn with_wake_client(mut self, client: redis::Client) -> RedisStore {
        self.client = Some(client);
        self.rewire()
    }

    /// Turns waking waiters by pub/sub on (the default, where the store has
    /// a client) or off: off, nothing is published and no subscriber
    /// connection is made; waiters poll.
    pub fn with_notifications(mut self, on: bool) -> RedisStore {
        self.notifications = on;
        self.rewire()
    }

    /// The channel outcomes are published on, or `None` when this store
    /// sends no wake-ups.
    pub fn notify_channel(&self) -> Option<&[u8]> {
        self.channel.as_deref()
    }

    /// The local address of the wake-up subscriber connection while it is
    /// connected over TCP — its `addr` in `CLIENT LIST`.
    pub fn subscriber_addr(&self) -> Option<std::net::SocketAddr> {
        self.subscriber.addr()
    }

    /// Recomputes the channel after a change of prefix or options; a
    /// subscriber started for the old settings is left to the clones that
    /// share it.
    fn rewire(mut self) -> RedisStore {
        self.channel = (self.notifications && self.client.is_some())
            .then(|| Arc::from(crate::wake::channel(&self.prefix)));
        self.subscriber = Arc::default();
        self
    }

    /// The wake-ups, starting the subscriber on the first call.
    pub(crate) fn wake_ups(&self) -> Option<Arc<idem_core::store::Wakeups>> {
        self.channel.as_ref()?;
        let client = self.client.as_ref()?;
        Some(self.subscriber.wakeups(client, &self.prefix))
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        // Built from a `String`, so always UTF-8.
        std::str::from_utf8(&self.prefix).unwrap_or_default()
    }

    /// The Redis key that holds the record for a store key.
    pub fn redis_key(&self, key: &str) -> Vec<u8> {
        let mut full = Vec::with_capacity(self.prefix.len() + key.len());
        full.extend_from_slice(&self.prefix);
        full.extend_from_slice(key.as_bytes());
        full
    }

    async fn load_scripts(self) -> Result<RedisStore, StoreError> {
        for script in SCRIPTS.all() {
            self.connection
                .query(&script.load())
                .await
                .map_err(|e| StoreError::backend(BACKEND, e))?;
        }
        Ok(self)
    }
    /// `insert`: the claim, and, when the store waits for replicas, their
    /// acknowledgement of a claim that inserted.
    async fn claim(
        &self,
        key: &[u8],
        encoded: &Encoded<'_>,
        token: Token,
    ) -> Result<Insert, StoreError> {
        let (reply, acks) = self
            .write(&claim_command(key, encoded))
            .await
            .map_err(|e| failed(key, e))?;
        let found = match reply {
            Value::Nil => return self.claimed(key, acks, token).await,
            Value::BulkString(value) => record::decode(key, value, SETTLED_FOUND_PTTL)?,
            other => return Err(unexpected(other)),
        };
        let found = if found.state == State::InFlight && found.token != token {
            // Its lease left decides between waiting and taking over: claim
            // again with the key's `PTTL` in one transaction.
            let claimed = self
                .write_with_ttl(key, claim_command(key, encoded), |found| {
                    // Inserted, or settled since: a replay must wait too.
                    found.is_none_or(|found| found.token == token || found.state != State::InFlight)
                })
                .await;
            match claimed {
                Ok(None) => return Ok(Insert::Inserted),
                Ok(Some(found)) => found,
                Err(error) => return Err(self.unclaim(key, token, error).await),
            }
        } else {
            if found.state != State::InFlight && found.token != token {
                // A replay of an outcome this connection wrote and the
                // replicas have not acknowledged would be lost with the
                // master.
                self.replicated(key, acks)?;
            }
            found
        };
        if found.token == token {
            // Only this call holds its new token: finding it means a resent
            // request (a cluster client resends after a timeout) found what
            // its first attempt inserted.
            return self.claimed(key, acks, token).await;
        }
        Ok(Insert::Found(found))
    }

    /// A claim that inserted, once its replicas acknowledged it.
    async fn claimed(
        &self,
        key: &[u8],
        acks: Option<i64>,
        token: Token,
    ) -> Result<Insert, StoreError> {
        match self.replicated(key, acks) {
            Ok(()) => Ok(Insert::Inserted),
            Err(error) => Err(self.unclaim(key, token, error).await),
        }
    }

    /// A claim that may stand on the master although it failed: its key is
    /// given back (best effort) so that a retry need not wait out the lease.
    async fn unclaim(&self, key: &[u8], token: Token, error: StoreError) -> StoreError {
        if self.replica_acks.is_some() {
            let _ = self
                .compare_and_set(&SCRIPTS.remove, key, None, token, None)
                .await;
        }
        error
    }
}

fn config(error: redis::RedisError) -> StoreError {
    StoreError::config(BACKEND, error)
}

#[async_trait]
impl Store for RedisStore {
    async fn insert(&self, key: &str, record: &NewRecord<'_>) -> Result<Insert, StoreError> {
        let key = self.redis_key(key);
        self.claim(&key, &Encoded::new(record), record.token).await
    }

    async fn swap(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        let key = self.redis_key(key);
        // Renewals publish nothing: only an outcome wakes waiters.
        let publish = self
            .channel
            .as_deref()
            .filter(|_| record.state != State::InFlight);
        self.compare_and_set(&SCRIPTS.swap, &key, Some(record), expected, publish)
            .await
    }

    async fn take_over(
        &self,
        key: &str,
        expected: Token,
        record: &NewRecord<'_>,
    ) -> Result<bool, StoreError> {
        let key = self.redis_key(key);
        self.compare_and_set(&SCRIPTS.take_over, &key, Some(record), expected, None)
            .await
    }

    async fn remove(&self, key: &str, expected: Token) -> Result<bool, StoreError> {
        let key = self.redis_key(key);
        let publish = self.channel.as_deref();
        self.compare_and_set(&SCRIPTS.remove, &key, None, expected, publish)
            .await
    }

    async fn load(&self, key: &str) -> Result<Option<Record>, StoreError> {
        let key = self.redis_key(key);
        let mut get = command("GET", 1, key.len());
        get.arg(&key);
        self.read_with_ttl(&key, get).await
    }

    /// One script (`lua/reset.lua`) on the record's one key, so it is one
    /// round trip and safe on a Cluster.
    async fn reset(&self, key: &str) -> Result<Reset, StoreError> {
        let key = self.redis_key(key);
        let script = &SCRIPTS.reset;
        let (reply, acks) = self
            .write_script(script, &script.call(&key, 0))
            .await
            .map_err(|e| failed(&key, e))?;
        match reply {
            Value::Int(0) => Ok(Reset::Absent),
            Value::Int(-1) => Ok(Reset::InFlight),
            Value::Int(code @ (1 | 2)) => match u8::try_from(code).ok().and_then(State::from_u8) {
                Some(state) => {
                    self.replicated(&key, acks)?;
                    Ok(Reset::Deleted(state))
                }
                None => Err(unexpected(Value::Int(code))),
            },
            Value::BulkString(value) => Err(crate::error::refused(&key, value)),
            other => Err(unexpected(other)),
        }
    }

    /// Always `Ok(0)`: every record's key carries its retention as a Redis
    /// expiry, so Redis deletes expired records itself and a scan would
    /// find nothing to do.
    async fn purge_expired(&self, _limit: usize) -> Result<usize, StoreError> {
        Ok(0)
    }

    fn wakeups(&self) -> Option<std::sync::Arc<idem_core::store::Wakeups>> {
        self.wake_ups()
    }
}
