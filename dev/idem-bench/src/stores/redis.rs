//! Redis: `RedisStore` against the raw protocol and the blog recipe, all on
//! one shared connection, with round trips from `INFO commandstats` and
//! memory per record from `MEMORY USAGE`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::store::{NearCache, Record, Store};
use idem_core::Idempotent;
use idem_redis::raw::{RawClaim, RawProtocol};
use idem_redis::RedisStore;
use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::AsyncCommands;

use crate::bench::{Bench, Contestant, Counters, Kind};
use crate::fixture::{self, BoxError, LEASE, RETENTION};
use crate::protocols::{IdemRow, StepsRow};
use crate::report::Report;
use crate::runner::{Outcome, Protocol};
use crate::stores::target::{self, Footprint, Target};

/// How long to wait for a server before calling it unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The Redis rows and the connections they share.
pub(crate) struct RedisBench {
    /// The one connection every row sends its commands on.
    shared: ConnectionManager,
    /// A separate connection for counters, memory figures and cleanup.
    admin: MultiplexedConnection,
    store: RedisStore,
    prefix: String,
    tag: String,
}

impl std::fmt::Debug for RedisBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBench")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisBench {
    /// Connects twice to `url`; fails when the server cannot be reached.
    pub(crate) async fn connect(url: &str, tag: &str) -> Result<RedisBench, BoxError> {
        let admin = admin_connection(url).await?;
        let client = redis::Client::open(url)?;
        let shared = tokio::time::timeout(CONNECT_TIMEOUT, ConnectionManager::new(client))
            .await
            .map_err(|_| "no answer within 3 s")??;
        let prefix = format!("idem-bench:{tag}:");
        let store = RedisStore::from_connection(shared.clone()).with_prefix(prefix.clone());
        Ok(RedisBench {
            shared,
            admin,
            store,
            prefix,
            tag: tag.to_owned(),
        })
    }

    /// Bytes a completed idem record takes, against a bare string holding
    /// the same outcome under the same key.
    async fn memory_per_record(&self, report: &mut Report) -> Result<(), BoxError> {
        let mut admin = self.admin.clone();
        let client_key = format!("{}.idem.r0", self.tag);
        let idem = Idempotent::new(self.store.clone());
        let key = self.store.redis_key(idem.key(&client_key)?.as_str());
        let record: Option<u64> = memory_usage(&mut admin, &key).await?;
        let Some(record) = record else {
            return Ok(());
        };
        let value: Vec<u8> = admin.get(&key).await?;
        let payload = fixture::outcome_payload();
        admin
            .pset_ex::<_, _, ()>(&key, &payload, fixture::millis(RETENTION) as u64)
            .await?;
        let bare = memory_usage(&mut admin, &key).await?.unwrap_or(0);
        admin.del::<_, ()>(&key).await?;
        let extra = record as i64 - bare as i64;
        report.sections.push(format!(
            "redis: memory per completed record (MEMORY USAGE, same key, 100-byte outcome)\n  \
             idem record {record} B (value {} B)  bare string {bare} B  idem costs {extra:+} B",
            value.len()
        ));
        report.lines.push(format!(
            "bytes redis record {record} bare {bare} extra {extra}"
        ));
        Ok(())
    }

    async fn cleanup(&self) -> Result<(), BoxError> {
        unlink_prefix(&mut self.admin.clone(), &self.prefix).await
    }
}

/// Deletes every key under `prefix`.
pub(crate) async fn unlink_prefix(
    admin: &mut MultiplexedConnection,
    prefix: &str,
) -> Result<(), BoxError> {
    unlink_matching(admin, &format!("{prefix}*")).await
}

/// Deletes every key matching the glob `pattern`.
async fn unlink_matching(admin: &mut MultiplexedConnection, pattern: &str) -> Result<(), BoxError> {
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(5000)
            .query_async(admin)
            .await?;
        if !keys.is_empty() {
            redis::cmd("UNLINK")
                .arg(keys)
                .query_async::<()>(admin)
                .await?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// The server's command counters now.
pub(crate) async fn commandstats(admin: &mut MultiplexedConnection) -> Result<Counters, BoxError> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .arg("cpu")
        .query_async(admin)
        .await?;
    Ok(parse_commandstats(&info))
}

/// Connects a plain multiplexed connection, or says why not.
pub(crate) async fn admin_connection(url: &str) -> Result<MultiplexedConnection, BoxError> {
    let client = redis::Client::open(url)?;
    // The client's default answer deadline is half a second; a loaded
    // server expiring and unlinking a run's worth of keys can take longer
    // to answer a SCAN or an UNLINK than that, and the run would end with
    // "timed out" while cleaning up.
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(ADMIN_TIMEOUT));
    Ok(tokio::time::timeout(
        CONNECT_TIMEOUT,
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
    .map_err(|_| "no answer within 3 s")??)
}

/// How long an administrative command may take to answer.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(60);

async fn memory_usage(
    admin: &mut MultiplexedConnection,
    key: &[u8],
) -> Result<Option<u64>, BoxError> {
    Ok(redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query_async(admin)
        .await?)
}

#[async_trait]
impl Bench for RedisBench {
    fn store(&self) -> &'static str {
        "redis"
    }

    fn contestants(&self) -> Vec<Contestant> {
        let raw: Arc<dyn Protocol> = Arc::new(Raw::new(&self.store, false));
        let timed: Arc<dyn Protocol> = Arc::new(Raw::new(&self.store, true));
        let blog: Arc<dyn Protocol> = Arc::new(Blog {
            connection: self.shared.clone(),
            prefix: self.prefix.clone(),
            payload: fixture::outcome_payload(),
        });
        let store: Arc<dyn Store> = Arc::new(self.store.clone());
        let steps: Arc<dyn Protocol> =
            Arc::new(StepsRow::new(Idempotent::from_arc(Arc::clone(&store))));
        let near: Arc<dyn Protocol> = Arc::new(IdemRow::new(Idempotent::new(NearCache::new(
            Arc::clone(&store),
        ))));
        let idem: Arc<dyn Protocol> = Arc::new(IdemRow::new(Idempotent::from_arc(store)));
        vec![
            Contestant {
                kind: Kind::Raw,
                make: Box::new(move || raw.clone()),
                fresh: false,
                // The claim is a top-level SET; the completion is one EVALSHA
                // whose script makes one inner SET when it succeeds (every
                // time, or the row reports errors), so top-level commands
                // are SETs less inner SETs plus EVALSHAs: the SETs.
                round_trips: |d| count(d, &["set"]),
            },
            Contestant {
                kind: Kind::Timed,
                make: Box::new(move || timed.clone()),
                fresh: false,
                // One EXEC per claim, one EVALSHA per completion.
                round_trips: |d| count(d, &["exec", "evalsha"]),
            },
            Contestant {
                kind: Kind::Blog,
                make: Box::new(move || blog.clone()),
                fresh: false,
                round_trips: |d| count(d, &["set", "get", "psetex"]),
            },
            Contestant {
                kind: Kind::Idem,
                make: Box::new(move || idem.clone()),
                fresh: false,
                round_trips: store_requests,
            },
            Contestant {
                kind: Kind::IdemSteps,
                make: Box::new(move || steps.clone()),
                fresh: false,
                round_trips: store_requests,
            },
            Contestant {
                kind: Kind::IdemNear,
                make: Box::new(move || near.clone()),
                fresh: false,
                round_trips: store_requests,
            },
        ]
    }

    async fn tidy(&self) -> Result<(), BoxError> {
        let mut admin = self.admin.clone();
        for pattern in ["*.f[0-9]*", "*.c[0-9]*"] {
            unlink_matching(&mut admin, &format!("{}{pattern}", self.prefix)).await?;
        }
        Ok(())
    }

    async fn counters(&self) -> Result<Option<Counters>, BoxError> {
        Ok(Some(commandstats(&mut self.admin.clone()).await?))
    }

    async fn finish(&self, report: &mut Report) -> Result<(), BoxError> {
        let measured = self.memory_per_record(report).await;
        let cleaned = self.cleanup().await;
        measured.and(cleaned)
    }
}

/// Requests of idem-redis: a bare `SET` (the claim), a script call or a
/// `MULTI … EXEC` sent in one write. What runs inside a script or a
/// transaction is not a round trip, and `MULTI` travels with its `EXEC`.
///
/// The server counts the commands run inside scripts and transactions
/// with the top-level ones, so the bare `SET`s are what is left of the
/// `SET`s once those are taken out: each transaction holds one `PTTL` and
/// one `SET` or `GET`; each script one `GET`, then one `SET` (a swap or take
/// over) or `DEL` (a release) when it succeeds. A compare-and-set that
/// fails, which these workloads make only when a race is lost, writes
/// nothing and is counted one request short.
pub(crate) fn store_requests(delta: &Counters) -> u64 {
    let scripts = count(delta, &["evalsha", "eval"]);
    let sets_and_gets =
        count(delta, &["set", "get", "del"]) + count(delta, &["script|load", "exec"]);
    sets_and_gets.saturating_sub(count(delta, &["pttl"]) + scripts)
}

pub(crate) fn count(delta: &Counters, names: &[&str]) -> u64 {
    names.iter().filter_map(|n| delta.get(*n)).sum()
}

/// `cmdstat_set:calls=13,usec=...` lines into `set -> 13`, and the
/// server process's CPU time (`used_cpu_user` + `used_cpu_sys`) into
/// [`SERVER_CPU`], in microseconds.
fn parse_commandstats(info: &str) -> Counters {
    let mut counters: Counters = info
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|f| f.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        // The harness's own reads of these counters are not the rows' work.
        .filter(|(name, _)| name != "info")
        .collect();
    let cpu: f64 = info
        .lines()
        .filter_map(|line| {
            let value = line
                .strip_prefix("used_cpu_user:")
                .or_else(|| line.strip_prefix("used_cpu_sys:"))?;
            value.trim().parse::<f64>().ok()
        })
        .sum();
    if cpu > 0.0 {
        counters.insert(SERVER_CPU.to_owned(), (cpu * 1e6) as u64);
    }
    counters
}

/// The counter that holds the server's CPU time, in microseconds: per
/// operation, what each row costs the server.
pub(crate) const SERVER_CPU: &str = "server-cpu-µs";

/// The raw protocol: `SET NX GET` to claim, a compare-and-set script to
/// complete (the helper idem-redis keeps for this comparison); `timed`,
/// the claim also reads `PTTL` in the same transaction.
struct Raw {
    protocol: RawProtocol,
    timed: bool,
    fingerprint: idem_core::Fingerprint,
    payload: Vec<u8>,
}

impl Raw {
    fn new(store: &RedisStore, timed: bool) -> Raw {
        Raw {
            protocol: RawProtocol::new(store),
            timed,
            fingerprint: fixture::fingerprint(),
            payload: fixture::outcome_payload(),
        }
    }
}

#[async_trait]
impl Protocol for Raw {
    async fn op(&self, key: &str) -> Result<Outcome, BoxError> {
        let claim = if self.timed {
            let (claim, _ttl) = self
                .protocol
                .claim_with_ttl(key, &self.fingerprint, LEASE)
                .await?;
            claim
        } else {
            self.protocol.claim(key, &self.fingerprint, LEASE).await?
        };
        match claim {
            RawClaim::Claimed(token) => {
                let done = self
                    .protocol
                    .complete(key, token, &self.fingerprint, &self.payload, RETENTION)
                    .await?;
                if done {
                    Ok(Outcome::Ran)
                } else {
                    Err("raw completion lost its claim".into())
                }
            }
            RawClaim::InProgress => Ok(Outcome::InProgress),
            RawClaim::Replay(_) => Ok(Outcome::Replayed),
            RawClaim::Mismatch => Err("raw claim found another request's record".into()),
        }
    }
}

/// The recipe most blog posts give: `SET key pending NX PX lease`; on a
/// duplicate, `GET key`; after the work, a plain `SET key outcome`. No
/// token, so a stale owner overwrites a newer one; no fingerprint.
struct Blog {
    connection: ConnectionManager,
    prefix: String,
    payload: Vec<u8>,
}

const PENDING: &[u8] = b"pending";

#[async_trait]
impl Protocol for Blog {
    async fn op(&self, key: &str) -> Result<Outcome, BoxError> {
        let key = format!("{}blog:{key}", self.prefix);
        let mut c = self.connection.clone();
        let claimed: bool = redis::cmd("SET")
            .arg(&key)
            .arg(PENDING)
            .arg("NX")
            .arg("PX")
            .arg(fixture::millis(LEASE))
            .query_async::<Option<String>>(&mut c)
            .await?
            .is_some();
        if claimed {
            c.pset_ex::<_, _, ()>(&key, &self.payload[..], fixture::millis(RETENTION) as u64)
                .await?;
            return Ok(Outcome::Ran);
        }
        let found: Option<Vec<u8>> = c.get(&key).await?;
        Ok(match found {
            Some(value) if value != PENDING => Outcome::Replayed,
            // Gone between the two commands (expired): a blog recipe calls
            // that in progress too.
            _ => Outcome::InProgress,
        })
    }
}

/// Redis under its own key prefix, weighed by `used_memory` growth.
pub(crate) struct RedisTarget {
    store: Arc<RedisStore>,
    admin: MultiplexedConnection,
    prefix: String,
    used_at_open: u64,
}

impl RedisTarget {
    pub(crate) async fn connect(url: &str, tag: &str) -> Result<RedisTarget, BoxError> {
        let mut admin = admin_connection(url).await?;
        let store = tokio::time::timeout(target::CONNECT_TIMEOUT, RedisStore::connect(url))
            .await
            .map_err(|_| "no answer within 5 s")??;
        let prefix = format!("idem-bench:{tag}:");
        let used_at_open = used_memory(&mut admin).await?;
        Ok(RedisTarget {
            store: Arc::new(store.with_prefix(prefix.clone())),
            admin,
            prefix,
            used_at_open,
        })
    }
}

/// `used_memory` from `INFO memory`.
async fn used_memory(admin: &mut MultiplexedConnection) -> Result<u64, BoxError> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(admin).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "INFO memory has no used_memory".into())
}

#[async_trait]
impl Target for RedisTarget {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    async fn fill(
        &self,
        prefix: &str,
        _template: &str,
        record: &Record,
        from: u64,
        to: u64,
    ) -> Result<(), BoxError> {
        // Sixteen callers keep the pipeline short enough that no reply
        // waits past the store's response timeout on a loaded machine
        // (64 did, at 10M records).
        target::fill_through_store(self.store.clone(), 16, prefix, record, from, to).await
    }

    async fn footprint(&self) -> Result<Footprint, BoxError> {
        let used = used_memory(&mut self.admin.clone()).await?;
        Ok(Footprint {
            bytes: used.saturating_sub(self.used_at_open),
            how: "used_memory growth since the run began (a shared server: \
                  other clients' keys count too)"
                .to_owned(),
        })
    }

    async fn rows(&self) -> Result<Option<u64>, BoxError> {
        // Counting one prefix among a shared server's keys means a full SCAN.
        Ok(None)
    }

    async fn after_churn(&self) -> Result<Vec<String>, BoxError> {
        let mut admin = self.admin.clone();
        let used = used_memory(&mut admin).await?;
        Ok(vec![format!(
            "used_memory {used} B ({} B above the run's start); expired keys are \
             removed by the server itself",
            used.saturating_sub(self.used_at_open)
        )])
    }

    async fn remove_all(&self) -> Result<(), BoxError> {
        unlink_prefix(&mut self.admin.clone(), &self.prefix).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_by_command_without_the_harness_reads_and_with_server_cpu() {
        let info = "# Commandstats\r\ncmdstat_set:calls=13,usec=116,usec_per_call=8.92,rejected_calls=0,failed_calls=0\r\n\
                    cmdstat_script|load:calls=2,usec=1\r\ncmdstat_info:calls=4,usec=131\r\n\
                    # CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.250000\r\nused_cpu_sys_children:9.0\r\n";
        let c = parse_commandstats(info);
        assert_eq!(c.get(SERVER_CPU), Some(&3_750_000));
        assert_eq!(c.get("set"), Some(&13));
        assert_eq!(c.get("script|load"), Some(&2));
        assert_eq!(c.get("info"), None);
    }

    /// What the server counts for each of idem's calls, and the requests
    /// it was sent in.
    #[test]
    fn store_requests_count_what_was_sent_not_what_ran_inside() {
        let counted = |pairs: &[(&str, u64)]| {
            let delta: Counters = pairs.iter().map(|&(n, c)| (n.to_owned(), c)).collect();
            store_requests(&delta)
        };
        let replay = [("set", 1)];
        let in_progress = [("set", 2), ("multi", 1), ("pttl", 1), ("exec", 1)];
        let first = [("set", 2), ("evalsha", 1), ("get", 1), ("publish", 1)];
        let released = [("set", 1), ("evalsha", 1), ("get", 1), ("del", 1)];
        let load = [("multi", 1), ("get", 1), ("pttl", 1), ("exec", 1)];
        assert_eq!(counted(&replay), 1);
        assert_eq!(counted(&in_progress), 2);
        assert_eq!(counted(&first), 2);
        assert_eq!(counted(&released), 2);
        assert_eq!(counted(&load), 1);
        let mut all = Counters::new();
        for (name, calls) in [&replay[..], &in_progress, &first, &released, &load].concat() {
            *all.entry(name.to_owned()).or_insert(0) += calls;
        }
        assert_eq!(store_requests(&all), 8);
    }
}
