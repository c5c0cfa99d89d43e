//! `RedisStore`: construction, options and its `Store` methods.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;
use redis::{IntoConnectionInfo, Value};

use idem_core::store::{Insert, NewRecord, Record, Reset, State, Store, StoreError, Token};

use crate::connection::Shared;
use crate::error::{failed, unexpected};
use crate::eviction::Eviction;
use crate::record::{Encoded, BACKEND};
use crate::scripts::SCRIPTS;
use crate::wake::Subscriber;

/// How long a connection the store opened waits for a reply, unless the
/// store waits for replicas: short, so a half-open connection is found.
const REPLY_TIMEOUT: Duration = Duration::from_millis(500);

/// The key prefix a store uses unless told otherwise.
pub const DEFAULT_PREFIX: &str = "idem:";

/// An idempotency store on Redis or Redis Cluster.
///
/// * **One key per record.** The key is the store's prefix followed by the
///   encoded idempotency key; the value is one compact binary string
///   (version, state, token, fingerprint, the retention deadline, the lease
///   deadline while in flight, the payload). A completed record with a
///   100-byte outcome takes 48 bytes more than the bare outcome would.
/// * **No Redis expiry, so no eviction by `volatile-*` policies.** Redis
///   with `maxmemory` and a `volatile-*` policy evicts only keys that carry
///   an expiry, and a managed Redis is often set up this way beside a
///   cache. So a record keeps its deadlines in its value, not as a TTL.
///   Every script reads a record past its retention as absent, and
///   [`purge_expired`](idem_core::store::Store::purge_expired) deletes it:
///   run a purger ([`spawn_purger`](idem_core::store::spawn_purger), or
///   `idem purge`), or lapsed records stay.
/// * **An `allkeys-*` policy is refused.** It may evict any record, and a
///   retry would then run its work again. The store reads the server's
///   `maxmemory_policy` (`INFO memory`) when it connects and every 30 s on
///   a claim; on `allkeys-*` it refuses new claims with a
///   [`Config`](idem_core::store::StoreErrorKind::Config) error that says
///   what to change. Replays and work already running are still served.
///   [`with_record_eviction_allowed`](RedisStore::with_record_eviction_allowed)
///   accepts the risk. Under `noeviction`, and under `volatile-*` once
///   nothing volatile is left, a full server refuses writes: a claim fails
///   before the work runs, a completion after it (the error's `When`).
/// * **One round trip per operation, touching one key**, which is what
///   makes a Redis Cluster safe: any record may live on any node. Each
///   operation is one Lua script, called by SHA-1 (`EVALSHA`): the claim
///   (`insert`) inserts or returns the record it found; `load` reads;
///   `swap`, `take_over` and `remove` are compare-and-sets on the token;
///   `reset` deletes a settled record and nothing else. A server that lost
///   its script cache (a restart) gets the script loaded again on first
///   use.
/// * **The server's clock.** Each script reads the server's `TIME` with
///   the record. The client sends durations; the script writes deadlines.
///   A claim that finds a record in flight gets its lease left in the same
///   round trip, so an in-progress answer costs one round trip, as a first
///   claim and a replay do. No deadline is ever computed on a client. A
///   script costs the server more than a bare `SET … NX GET`: replays at
///   32 callers run at about 0.6× the raw protocol, against 0.95× with a
///   TTL (`dev/idem-bench/notes/2026-12-05-redis-eviction.md`).
///   Durations are rounded up to whole milliseconds. A script that reads
///   `TIME` and then writes needs Redis 7 (scripts replicated by effects).
/// * **Records of earlier builds.** Layouts 1 and 2 kept the retention as
///   the key's expiry; they are still read (their `PTTL` is their
///   retention) and replay as before, and Redis expires them. A record
///   this build writes over one carries no expiry.
/// * **Safe to resend.** A cluster connection resends a request after a
///   timeout; an `insert`, `swap` or `take_over` whose first attempt was
///   applied recognises its own record (its token is unique) and still
///   reports success.
/// * **One shared connection.** Every call uses the same multiplexed
///   connection; there is no pool to check connections out of.
/// * **Foreign values are refused.** A value under a record's key that is
///   not a record of this layout (another version, truncated, garbage, a
///   hash) is reported as [`StoreErrorKind::Corrupt`](idem_core::store::StoreErrorKind)
///   and left as it is: nothing overwrites or deletes it, the purge
///   included.
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
/// Needs Redis 7.0 or newer.
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
    /// The maxmemory-policy check, shared by the store's clones.
    pub(crate) eviction: Arc<Eviction>,
    /// The cluster connection, when the store is on one: a purge scans
    /// each of its masters.
    pub(crate) cluster: Option<redis::cluster_async::ClusterConnection>,
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
            .field("record_eviction_allowed", &self.eviction.allowed())
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
        let timeouts = (Duration::from_secs(1), REPLY_TIMEOUT);
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
        RedisStore::on_cluster(client).await
    }

    /// Connects to a Redis Cluster over TLS as
    /// [`connect_cluster`](RedisStore::connect_cluster) does, verifying
    /// every node with `certificates`: a private CA (`root_cert`) instead
    /// of Mozilla's roots, and a client certificate (`client_tls`) for
    /// nodes with `tls-auth-clients yes`.
    ///
    /// The URLs only seed the cluster: the client goes on to the addresses
    /// the nodes announce, so the certificates are given once for all of
    /// them. [`tls_certificates`](crate::tls_certificates) reads them from
    /// a URL's `cacert=`, `cert=` and `key=`. The nodes' certificates must
    /// name what the nodes announce: their IP addresses, or the host names
    /// of `cluster-announce-hostname` with `cluster-preferred-endpoint-type
    /// hostname`. A node that fails verification fails the connect.
    #[cfg(feature = "tls")]
    pub async fn connect_cluster_with_tls<I, T>(
        urls: I,
        certificates: redis::TlsCertificates,
    ) -> Result<RedisStore, StoreError>
    where
        I: IntoIterator<Item = T>,
        T: IntoConnectionInfo,
    {
        let client = redis::cluster::ClusterClientBuilder::new(urls)
            .certs(certificates)
            .build()
            .map_err(config)?;
        RedisStore::on_cluster(client).await
    }

    /// A store on the cluster `client` reaches, its scripts loaded.
    async fn on_cluster(client: ClusterClient) -> Result<RedisStore, StoreError> {
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
        let cluster = (&connection as &dyn std::any::Any)
            .downcast_ref::<redis::cluster_async::ClusterConnection>()
            .cloned();
        RedisStore {
            cluster,
            ..RedisStore::on(Arc::new(connection), std::any::type_name::<C>())
        }
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
            eviction: Arc::new(Eviction::new(false, crate::eviction::DEFAULT_INTERVAL)),
            cluster: None,
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
            // A `String` for redis-rs without TLS, any `AsRef<str>` with it.
            String::from(master),
            None,
            redis::sentinel::SentinelServerType::Master,
        )
        .map_err(config)?;
        RedisStore::on_sentinel(client).await
    }

    /// Connects to the master the Sentinels name, as
    /// [`connect_sentinel`](RedisStore::connect_sentinel) does, over TLS
    /// to the master verified with `certificates` (a private CA, a client
    /// certificate; see [`tls_certificates`](crate::tls_certificates)).
    ///
    /// The Sentinels are reached as their URLs say: `rediss://` ones over
    /// TLS with the same certificates. Their user and password log in to
    /// the Sentinels only; the master takes none, as with
    /// `connect_sentinel`. The master's certificate must name the address
    /// the Sentinels give: its IP address, or a host name with
    /// `sentinel resolve-hostnames yes` and `sentinel announce-hostnames
    /// yes`. A failed verification fails the connect, and after a failover
    /// fails each call until a master verifies.
    #[cfg(feature = "tls")]
    pub async fn connect_sentinel_with_tls<I, T>(
        sentinels: I,
        master: &str,
        certificates: redis::TlsCertificates,
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
        let Some(first) = sentinels.first() else {
            return Err(StoreError::config(BACKEND, "no Sentinel URL"));
        };
        let settings = first.redis_settings().clone();
        let all_tls = sentinels
            .iter()
            .all(|s| matches!(s.addr(), redis::ConnectionAddr::TcpTls { .. }));
        let mut builder = redis::sentinel::SentinelClientBuilder::new(
            sentinels.iter().map(|s| s.addr().clone()),
            master,
            redis::sentinel::SentinelServerType::Master,
        )
        .map_err(config)?
        .set_client_to_redis_tls_mode(redis::TlsMode::Secure)
        .set_client_to_redis_certificates(certificates.clone())
        .set_client_to_sentinel_protocol(settings.protocol());
        if all_tls {
            builder = builder.set_client_to_sentinel_certificates(certificates);
        }
        if let Some(username) = settings.username() {
            builder = builder.set_client_to_sentinel_username(username);
        }
        if let Some(password) = settings.password() {
            builder = builder.set_client_to_sentinel_password(password);
        }
        RedisStore::on_sentinel(builder.build().map_err(config)?).await
    }

    /// A store on the master the Sentinels of `client` name, its scripts
    /// loaded.
    async fn on_sentinel(
        client: redis::sentinel::SentinelClient,
    ) -> Result<RedisStore, StoreError> {
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
    /// The reply timeout of a connection the store opened (`connect`,
    /// `connect_sentinel`) grows to `timeout` plus 500 ms, since a write's
    /// reply comes after its `WAIT`. On a connection of your own
    /// (`from_connection`), keep `timeout` below its response timeout, or
    /// a lagging replica shows as a timed-out call.
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
        if replicas > 0 {
            // A write's reply comes after its `WAIT`: a reply timeout
            // shorter than the wait would fail writes the replicas were
            // still acknowledging.
            self.connection
                .reply_timeout_at_least(timeout + REPLY_TIMEOUT);
        }
        self.replica_acks = (replicas > 0).then(|| ReplicaAcks {
            replicas,
            // At least 1 ms: `WAIT … 0` would wait forever.
            timeout_ms: u64::try_from(timeout.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
        });
        self
    }

    /// Accepts a server whose maxmemory-policy may evict records
    /// (`allkeys-lru`, `allkeys-lfu`, `allkeys-random`) when `allowed`.
    ///
    /// An evicted record is forgotten: a retry of its key runs the work a
    /// second time, and nothing reports it. Without this option a store
    /// that finds such a policy refuses to claim, with a
    /// [`Config`](idem_core::store::StoreErrorKind::Config) error that
    /// says what to change; `noeviction` and the `volatile-*` policies
    /// never evict a record, which carries no expiry. Accept it only for
    /// a server whose memory never fills, or for work that may run twice.
    pub fn with_record_eviction_allowed(mut self, allowed: bool) -> RedisStore {
        self.eviction = Arc::new(Eviction::new(allowed, self.eviction.interval()));
        self
    }

    /// How often claims read the server's maxmemory-policy again (default
    /// 30 s): it can change at run time. The claim that finds a reading
    /// due makes it, one more round trip (`INFO memory`); the others go by
    /// the last reading.
    pub fn with_eviction_check_every(mut self, interval: Duration) -> RedisStore {
        self.eviction = Arc::new(Eviction::new(self.eviction.allowed(), interval));
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

    /// Loads the scripts and reads the server's maxmemory-policy: a
    /// store refuses to connect to a server that may evict its records.
    async fn load_scripts(self) -> Result<RedisStore, StoreError> {
        for script in SCRIPTS.all() {
            self.connection
                .query(&script.load())
                .await
                .map_err(|e| StoreError::backend(BACKEND, e))?;
        }
        self.eviction.check(&self).await?;
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
        if let Err(refused) = self.eviction.check(self).await {
            // No new claim on a server that may evict it; a recorded
            // outcome still replays, and a claim in flight still answers.
            return match self.load_key(key).await? {
                Some(found) if found.token != token => Ok(Insert::Found(found)),
                _ => Err(refused),
            };
        }
        let script = &SCRIPTS.claim;
        let mut call = script.call(key, encoded.len() + 8);
        call.arg(encoded);
        let (reply, acks) = self
            .write_script(script, &call)
            .await
            .map_err(|e| failed(key, e))?;
        let Some(found) = RedisStore::found(key, reply)? else {
            return self.claimed(key, acks, token).await;
        };
        if found.token == token {
            // Only this call holds its new token: finding it means a resent
            // request (a cluster client resends after a timeout) found what
            // its first attempt inserted.
            return self.claimed(key, acks, token).await;
        }
        if found.state != State::InFlight {
            // A replay of an outcome this connection wrote and the
            // replicas have not acknowledged would be lost with the
            // master.
            self.replicated(key, acks)?;
        }
        Ok(Insert::Found(found))
    }

    /// `load` of a Redis key.
    async fn load_key(&self, key: &[u8]) -> Result<Option<Record>, StoreError> {
        let script = &SCRIPTS.load;
        let reply = self.run_script(script, &script.call(key, 0)).await;
        RedisStore::found(key, reply.map_err(|e| failed(key, e))?)
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
        // A takeover is a claim: refused where a claim is.
        self.eviction.check(self).await?;
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
        self.load_key(&self.redis_key(key)).await
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

    /// `SCAN`s the store's prefix (every master of a cluster) and deletes
    /// each record past its retention with `lua/purge.lua`, which checks
    /// the deadline on the server's clock in the same step. Records of
    /// layouts 1 and 2 carry a Redis expiry, and Redis deletes them itself.
    async fn purge_expired(&self, limit: usize) -> Result<usize, StoreError> {
        self.purge(limit).await
    }

    fn wakeups(&self) -> Option<std::sync::Arc<idem_core::store::Wakeups>> {
        self.wake_ups()
    }
}
