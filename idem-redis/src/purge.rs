//! `purge_expired`: records carry no Redis expiry, so lapsed ones stay
//! until deleted. A purge walks the store's prefix with `SCAN` (on a
//! cluster, on every master) and runs `lua/purge.lua` on each key found,
//! which deletes it only if its retention deadline has passed on the
//! server's clock, in the same step.

use futures_util::future::join_all;
use idem_core::store::StoreError;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, RedisResult, Value};

use crate::connection::command;
use crate::error::{failed, unexpected};
use crate::inspect::glob_escape;
use crate::record::BACKEND;
use crate::scripts::SCRIPTS;
use crate::RedisStore;

/// Keys a `SCAN` step walks; their scripts go out together, pipelined on
/// the shared connection.
const BATCH: usize = 500;

impl RedisStore {
    pub(crate) async fn purge(&self, limit: usize) -> Result<usize, StoreError> {
        let mut deleted = 0;
        if limit == 0 {
            return Ok(0);
        }
        let nodes = match &self.cluster {
            None => vec![None],
            Some(cluster) => masters(cluster).await?.into_iter().map(Some).collect(),
        };
        let pattern = glob_escape(&self.prefix);
        for mut node in nodes {
            let mut cursor = 0;
            loop {
                let mut scan = command("SCAN", 7, pattern.len() + 40);
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern[..])
                    .arg("COUNT")
                    .arg(BATCH)
                    .arg("TYPE")
                    .arg("string");
                let reply = match (&mut node, &self.cluster) {
                    (Some(master), Some(cluster)) => master.scan(cluster, scan).await,
                    _ => self.connection.query(&scan).await,
                }
                .map_err(|e| StoreError::backend(BACKEND, e))?;
                let (next, keys) = scanned(reply)?;
                // Never more scripts at once than deletions still allowed:
                // each deletes at most one record.
                for chunk in keys.chunks(BATCH) {
                    let mut rest = chunk;
                    while !rest.is_empty() {
                        let take = rest.len().min(limit - deleted);
                        let (now, later) = rest.split_at(take);
                        rest = later;
                        for purged in join_all(now.iter().map(|key| self.purge_one(key))).await {
                            deleted += purged?;
                        }
                        if deleted == limit {
                            return Ok(deleted);
                        }
                    }
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(deleted)
    }

    /// Deletes the record under `key` if it is past its retention: 1 if it
    /// did, else 0.
    async fn purge_one(&self, key: &[u8]) -> Result<usize, StoreError> {
        match self
            .run_script(&SCRIPTS.purge, &SCRIPTS.purge.call(key, 0))
            .await
            .map_err(|e| failed(key, e))?
        {
            Value::Int(1) => Ok(1),
            Value::Int(0) => Ok(0),
            other => Err(unexpected(other)),
        }
    }
}

/// A `SCAN` reply: the next cursor and the keys.
fn scanned(reply: Value) -> Result<(u64, Vec<Vec<u8>>), StoreError> {
    let bad = |reply: &Value| StoreError::backend(BACKEND, format!("SCAN answered {reply:?}"));
    let Value::Array(parts) = &reply else {
        return Err(bad(&reply));
    };
    let [Value::BulkString(next), Value::Array(keys)] = &parts[..] else {
        return Err(bad(&reply));
    };
    let next = std::str::from_utf8(next)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(&reply))?;
    let keys = keys
        .iter()
        .filter_map(|key| match key {
            Value::BulkString(bytes) => Some(bytes.clone()),
            _ => None,
        })
        .collect();
    Ok((next, keys))
}

/// A master of a cluster, by the names `CLUSTER NODES` gives it.
#[derive(Debug, PartialEq, Eq)]
struct Master {
    /// Its IP address, then the host name it announces, if any: the
    /// cluster connection knows it by the one `CLUSTER SLOTS` gives
    /// (`cluster-preferred-endpoint-type`), which is the host name for
    /// nodes whose TLS certificates name no IP address.
    names: Vec<String>,
    port: u16,
}

impl Master {
    /// Runs `scan` on this master, by the first of its names the cluster
    /// connection knows; the others are dropped.
    async fn scan(&mut self, cluster: &ClusterConnection, scan: Cmd) -> RedisResult<Value> {
        loop {
            let at = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                host: self.names[0].clone(),
                port: self.port,
            });
            match cluster.clone().route_command(scan.clone(), at).await {
                Err(error)
                    if error.kind() == redis::ErrorKind::ClusterConnectionNotFound
                        && self.names.len() > 1 =>
                {
                    self.names.remove(0);
                }
                reply => return reply,
            }
        }
    }
}

/// The masters of a cluster, from `CLUSTER NODES`.
async fn masters(cluster: &ClusterConnection) -> Result<Vec<Master>, StoreError> {
    let nodes: Cmd = {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("NODES");
        cmd
    };
    let reply = cluster
        .clone()
        .route_command(
            nodes,
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )
        .await
        .map_err(|e| StoreError::backend(BACKEND, e))?;
    let text = match &reply {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::VerbatimString { text, .. } => text.clone(),
        _ => return Err(unexpected(reply)),
    };
    Ok(parse_masters(&text))
}

/// Each line of `CLUSTER NODES` is `id host:port@bus[,hostname] flags …`;
/// a master that has not failed has `master` and no `fail` among its
/// comma-separated flags.
fn parse_masters(nodes: &str) -> Vec<Master> {
    nodes
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let address = fields.nth(1)?;
            let flags: Vec<&str> = fields.next()?.split(',').collect();
            if !flags.contains(&"master") || flags.iter().any(|f| f.starts_with("fail")) {
                return None;
            }
            let (address, bus) = address.split_once('@')?;
            let (host, port) = address.rsplit_once(':')?;
            let mut names = vec![host.to_owned()];
            names.extend(
                bus.split_once(',')
                    .map(|(_, name)| name.to_owned())
                    .filter(|name| !name.is_empty()),
            );
            Some(Master {
                names,
                port: port.parse().ok()?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masters_are_read_from_cluster_nodes() {
        let nodes = "\
a 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
b 127.0.0.1:7001@17001,host-b master - 0 0 2 connected 5461-10922
c 127.0.0.1:7002@17002 slave a 0 0 1 connected
d 127.0.0.1:7003@17003 master,fail - 0 0 3 connected
";
        assert_eq!(
            parse_masters(nodes),
            [
                Master {
                    names: vec!["127.0.0.1".to_owned()],
                    port: 7000
                },
                Master {
                    names: vec!["127.0.0.1".to_owned(), "host-b".to_owned()],
                    port: 7001
                }
            ]
        );
    }
}
