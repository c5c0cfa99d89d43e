//! The servers tests run against: their URLs, defaults and reachability.

use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::skip::{skip, skip_binary};

/// A server some store needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Server {
    /// Redis, for `idem-redis`.
    Redis,
    /// PostgreSQL, for `idem-postgres`.
    Postgres,
    /// MySQL 8 or MariaDB, for a MySQL store.
    MySql,
    /// NATS with JetStream, for `idem-broker`.
    Nats,
    /// RabbitMQ (AMQP 0-9-1), for `idem-broker`.
    Amqp,
    /// A Kafka-protocol broker (Tansu in CI), for `idem-broker`.
    Kafka,
}

impl Server {
    /// Every server, in a fixed order.
    pub const ALL: [Server; 6] = [
        Server::Redis,
        Server::Postgres,
        Server::MySql,
        Server::Nats,
        Server::Amqp,
        Server::Kafka,
    ];

    /// Its name in messages.
    pub const fn name(self) -> &'static str {
        match self {
            Server::Redis => "Redis",
            Server::Postgres => "PostgreSQL",
            Server::MySql => "MySQL",
            Server::Nats => "NATS",
            Server::Amqp => "RabbitMQ",
            Server::Kafka => "Kafka",
        }
    }

    /// The environment variable that gives its URL.
    pub const fn env_var(self) -> &'static str {
        match self {
            Server::Redis => "IDEM_REDIS_URL",
            Server::Postgres => "IDEM_POSTGRES_URL",
            Server::MySql => "IDEM_MYSQL_URL",
            Server::Nats => "IDEM_NATS_URL",
            Server::Amqp => "IDEM_AMQP_URL",
            Server::Kafka => "IDEM_KAFKA_URL",
        }
    }

    /// The URL used when [`env_var`](Server::env_var) is unset: the local
    /// server as CI and the development machines run it.
    pub const fn default_url(self) -> &'static str {
        match self {
            Server::Redis => "redis://127.0.0.1:6379",
            Server::Postgres => "postgres://root@127.0.0.1:5432/test",
            Server::MySql => "mysql://root@127.0.0.1:3306/test",
            Server::Nats => "nats://127.0.0.1:4222",
            Server::Amqp => "amqp://guest:guest@127.0.0.1:5672/%2f",
            // Kafka clients take `host:port` lists, not URLs.
            Server::Kafka => "127.0.0.1:9092",
        }
    }

    /// The port the server listens on by default.
    pub const fn default_port(self) -> u16 {
        match self {
            Server::Redis => 6379,
            Server::Postgres => 5432,
            Server::MySql => 3306,
            Server::Nats => 4222,
            Server::Amqp => 5672,
            Server::Kafka => 9092,
        }
    }

    /// Its URL: [`env_var`](Server::env_var), read at run time, else
    /// [`default_url`](Server::default_url).
    pub fn url(self) -> String {
        std::env::var(self.env_var()).unwrap_or_else(|_| self.default_url().to_owned())
    }

    /// The URL if something listens at its host and port (a TCP connect
    /// within two seconds), else why not.
    pub fn reachable(self) -> Result<String, String> {
        self.reachable_at(self.url())
    }

    /// [`reachable`](Server::reachable) for a given URL.
    fn reachable_at(self, url: String) -> Result<String, String> {
        let address = host_port(&url, self.default_port());
        let connected = address
            .to_socket_addrs()
            .map_err(|e| e.to_string())
            .and_then(|mut addrs| {
                addrs
                    .next()
                    .ok_or_else(|| "no address".to_owned())
                    .and_then(|addr| {
                        TcpStream::connect_timeout(&addr, Duration::from_secs(2))
                            .map_err(|e| e.to_string())
                    })
            });
        match connected {
            Ok(_) => Ok(url),
            Err(error) => Err(format!(
                "no {} at {address} ({error}); set {}",
                self.name(),
                self.env_var()
            )),
        }
    }

    /// The URL for a test that needs this server, or `None` after printing
    /// why the test is skipped; panics instead when `CI` is set.
    pub fn require(self) -> Option<String> {
        self.reachable().map_or_else(|why| skip(&why), Some)
    }

    /// The URL for a test binary whose every test needs this server;
    /// without one, every test of the binary is skipped (or, under `CI`,
    /// the test fails). Checked once per binary.
    pub fn require_for_binary(self) -> String {
        use std::sync::OnceLock;
        static CHECKED: [OnceLock<Result<String, String>>; Server::ALL.len()] =
            [const { OnceLock::new() }; Server::ALL.len()];
        let index = Server::ALL.iter().position(|s| *s == self).unwrap_or(0);
        match CHECKED[index].get_or_init(|| self.reachable()) {
            Ok(url) => url.clone(),
            Err(why) => skip_binary(why),
        }
    }
}

/// `host:port` from a URL's authority, with the default port when none is
/// given.
fn host_port(url: &str, default_port: u16) -> String {
    let authority = url.split("://").nth(1).unwrap_or(url);
    let host_port = authority
        .split(['/', '?'])
        .next()
        .unwrap_or("")
        .rsplit('@')
        .next()
        .unwrap_or("");
    let has_port = host_port
        .rsplit_once(':')
        .is_some_and(|(_, port)| port.parse::<u16>().is_ok());
    if has_port {
        host_port.to_owned()
    } else {
        format!("{host_port}:{default_port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_port_come_from_the_authority() {
        assert_eq!(
            host_port("postgres://root:pw@db:5433/test", 5432),
            "db:5433"
        );
        assert_eq!(host_port("redis://cache/0", 6379), "cache:6379");
        assert_eq!(
            host_port("mysql://root@127.0.0.1:3306/test", 1),
            "127.0.0.1:3306"
        );
        assert_eq!(host_port("redis://127.0.0.1", 6379), "127.0.0.1:6379");
        assert_eq!(host_port(Server::Amqp.default_url(), 1), "127.0.0.1:5672");
        assert_eq!(host_port(Server::Nats.default_url(), 1), "127.0.0.1:4222");
    }

    #[test]
    fn a_closed_port_is_unreachable_with_a_reason() {
        // Nothing listens on port 1 of the loopback interface. The URL is
        // passed in, not set in the environment: other tests of this
        // binary read that variable at the same time.
        let why = Server::MySql
            .reachable_at("mysql://root@127.0.0.1:1/test".to_owned())
            .unwrap_err();
        assert!(why.contains("IDEM_MYSQL_URL"), "{why}");
        assert!(why.contains("127.0.0.1:1"), "{why}");
    }
}
