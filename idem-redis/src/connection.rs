//! The one shared connection, and the scripts and transactions sent over
//! it.

use std::future::Future;
use std::pin::Pin;

use redis::aio::ConnectionLike;
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
}

impl<C> Shared for C
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn query<'a>(&'a self, cmd: &'a Cmd) -> Reply<'a> {
        let mut connection = self.clone();
        Box::pin(async move {
            connection
                .req_packed_command(cmd)
                .await
                .and_then(Value::extract_error)
        })
    }

    fn transaction<'a>(&'a self, transaction: &'a Pipeline) -> Reply<'a> {
        let mut connection = self.clone();
        Box::pin(async move { transaction.query_async(&mut connection).await })
    }
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
