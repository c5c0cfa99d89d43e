//! The one shared connection, and the scripts and transactions sent over
//! it.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::SingleNodeRoutingInfo;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisResult, ServerErrorKind, Value};

pub(crate) type Reply<'a> = Pin<Box<dyn Future<Output = RedisResult<Value>> + Send + 'a>>;

/// A connection that many tasks use at once: a multiplexed connection, a
/// `ConnectionManager` or a cluster connection. Each call works on a cheap
/// clone, as redis-rs intends for these types; no pool, no checkout.
pub(crate) trait Shared: Send + Sync + 'static {
    /// Sends one command and waits for its reply; an error reply is an
    /// `Err`.
    fn query<'a>(&'a self, cmd: &'a Cmd) -> Reply<'a>;

    /// Sends a `MULTI … EXEC` transaction in one write and waits for its
    /// reply: the replies of its commands, in order.
    fn transaction<'a>(&'a self, transaction: &'a Pipeline) -> Reply<'a>;

    /// Makes the connection wait at least `timeout` for a reply, where the
    /// store opened it; a connection the caller gave keeps its own.
    fn reply_timeout_at_least(&self, timeout: Duration);
}

impl<C> Shared for C
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn query<'a>(&'a self, cmd: &'a Cmd) -> Reply<'a> {
        let mut connection = self.clone();
        let cluster = (self as &dyn Any).downcast_ref::<ClusterConnection>();
        Box::pin(async move {
            let reply = connection
                .req_packed_command(cmd)
                .await
                .and_then(Value::extract_error);
            match cluster {
                Some(cluster) => follow_redirects(cluster, reply, cmd, None).await,
                None => reply,
            }
        })
    }

    /// The pipelines the store sends hold one write (a command, or a
    /// transaction on one key) and commands without keys (`WAIT`). A
    /// redirect says the write was refused, so sending it again is safe.
    fn transaction<'a>(&'a self, transaction: &'a Pipeline) -> Reply<'a> {
        let mut connection = self.clone();
        let cluster = (self as &dyn Any).downcast_ref::<ClusterConnection>();
        Box::pin(async move {
            let reply = transaction.query_async(&mut connection).await;
            match cluster {
                Some(cluster) => {
                    follow_redirects(cluster, reply, &Cmd::new(), Some(transaction)).await
                }
                None => reply,
            }
        })
    }

    /// A connection the caller built keeps the timeouts it was built with.
    fn reply_timeout_at_least(&self, _timeout: Duration) {}
}

/// How many redirects a call follows itself before it fails.
const REDIRECTS: usize = 16;

/// Follows the `ASK` and `MOVED` redirects a cluster connection gave up on,
/// sending `cmd` (or `pipeline`, when given) again to the node named.
///
/// redis-rs follows an `ASK` by sending `ASKING` and then the command as
/// two requests on the node's shared connection. Another task's command
/// can come between them and take the `ASKING`: the target then answers
/// `MOVED` back to the source, which answers `ASK` again, until the
/// retries run out. While a slot migrates under many callers, claims,
/// outcomes and reads failed so (`tests/resharding.rs`). Here `ASKING`
/// and the command go in one pipeline, one write that nothing can split.
/// A transaction aborted for a redirect fails as a whole, which redis-rs
/// never retries: it is sent again the same way.
async fn follow_redirects(
    cluster: &ClusterConnection,
    mut reply: RedisResult<Value>,
    cmd: &Cmd,
    pipeline: Option<&Pipeline>,
) -> RedisResult<Value> {
    for _ in 0..REDIRECTS {
        let Some((asking, host, port)) = reply.as_ref().err().and_then(redirect) else {
            break;
        };
        let mut again = Pipeline::new();
        if asking {
            again.cmd("ASKING");
        }
        let atomic = pipeline.is_some_and(Pipeline::is_transaction);
        if atomic {
            again.cmd("MULTI");
        }
        match pipeline {
            Some(pipeline) => pipeline.cmd_iter().for_each(|cmd| {
                again.add_command(cmd.clone());
            }),
            None => {
                again.add_command(cmd.clone());
            }
        }
        if atomic {
            again.cmd("EXEC");
        }
        let count = again.len();
        let route = SingleNodeRoutingInfo::ByAddress { host, port };
        reply = cluster
            .clone()
            .route_pipeline(again, 0, count, route)
            .await
            .and_then(|mut replies| {
                let mut replies = replies.split_off(usize::from(asking).min(replies.len()));
                match (pipeline, atomic) {
                    (None, _) => replies.pop().unwrap_or(Value::Nil).extract_error(),
                    (Some(_), false) => Value::Array(replies).extract_error(),
                    // `MULTI`'s `OK`, a `QUEUED` or a refusal a command,
                    // then what `EXEC` answered.
                    (Some(_), true) => match replies.pop() {
                        Some(Value::ServerError(aborted)) => {
                            match replies.into_iter().find_map(|reply| match reply {
                                Value::ServerError(error) => Some(error),
                                _ => None,
                            }) {
                                Some(refused) => Err(refused.into()),
                                None => Err(aborted.into()),
                            }
                        }
                        Some(exec) => exec.extract_error(),
                        None => Ok(Value::Nil),
                    },
                }
            });
    }
    reply
}

/// Where a refused command goes: `ASK` (then `true`) or `MOVED`, to a
/// host and port.
fn redirect(error: &RedisError) -> Option<(bool, String, u16)> {
    error
        .clone()
        .into_server_errors()?
        .iter()
        .find_map(|(_, error)| {
            let asking = match error.kind()? {
                ServerErrorKind::Ask => true,
                ServerErrorKind::Moved => false,
                _ => return None,
            };
            // "3999 127.0.0.1:6381": the slot, then the node.
            let node = error.details()?.split_ascii_whitespace().nth(1)?;
            let (host, port) = node.rsplit_once(':')?;
            Some((asking, host.to_owned(), port.parse().ok()?))
        })
}

/// A command `name` with room for `args` more arguments of `bytes` in all,
/// built without growing its buffers: on the replay path every allocation
/// shows.
pub(crate) fn command(name: &str, args: usize, bytes: usize) -> Cmd {
    let mut cmd = Cmd::with_capacity(args + 1, name.len() + bytes);
    cmd.arg(name);
    cmd
}

/// Whether the server does not know the script a call names (it lost its
/// cache, as after a restart, or never had it, as a promoted replica).
pub(crate) fn is_no_script(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// Whether the server refused a command (alone or in a transaction)
/// because the key holds another type than a string.
pub(crate) fn is_wrong_type(error: &redis::RedisError) -> bool {
    error
        .clone()
        .into_server_errors()
        .is_some_and(|errors| errors.iter().any(|(_, e)| e.code() == "WRONGTYPE"))
}

/// A Lua script, called by its SHA-1 (`EVALSHA`) so that only its
/// arguments cross the wire.
#[derive(Debug)]
pub(crate) struct Script {
    code: &'static str,
    sha: String,
}

impl Script {
    /// The script `code`.
    pub(crate) fn new(code: &'static str) -> Script {
        let sha = redis::Script::new(code).get_hash().to_owned();
        Script { code, sha }
    }

    /// An `EVALSHA` of this script on one key; the caller adds `ARGV`, up
    /// to `argv_bytes` long.
    pub(crate) fn call(&self, key: &[u8], argv_bytes: usize) -> Cmd {
        let mut cmd = command("EVALSHA", 6, self.sha.len() + key.len() + argv_bytes + 8);
        cmd.arg(&self.sha).arg(1).arg(key);
        cmd
    }

    /// Loads the script into the server's cache (every node of a cluster).
    pub(crate) fn load(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(self.code);
        cmd
    }

    /// Runs `call` (from [`Script::call`]). A server that does not know the
    /// script yet, as after a restart, gets it loaded and the call sent
    /// again: that costs two more round trips, once per script and server.
    #[cfg(feature = "raw-protocol")]
    pub(crate) async fn run(&self, connection: &dyn Shared, call: &Cmd) -> RedisResult<Value> {
        match connection.query(call).await {
            Err(error) if is_no_script(&error) => {
                connection.query(&self.load()).await?;
                connection.query(call).await
            }
            reply => reply,
        }
    }
}
