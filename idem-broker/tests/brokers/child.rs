//! Consumers killed with SIGKILL in the middle of their handlers: each is
//! a child process (this test binary, re-run on one ignored test), killed
//! soon after it starts handling; the messages, each published twice, must
//! all end with exactly one effect and nothing left on the broker.
//!
//! `IDEM_BROKER_KILLS` (default 5) and `IDEM_BROKER_MESSAGES` (default 40)
//! scale it: `IDEM_BROKER_KILLS=100 IDEM_BROKER_MESSAGES=500` is the long
//! run.

use std::time::{Duration, Instant};

use idem_broker::{redis, Consumer, ConsumerConfig, Handler, HandlerError, Message};
use rand::Rng;

use crate::kinds;
use crate::support::{Fixture, Kind};

const CHILD_ENV: &str = "IDEM_BROKER_CHILD";
const CONCURRENCY: usize = 4;
const LEASE: Duration = Duration::from_secs(1);

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn config() -> ConsumerConfig {
    ConsumerConfig::default()
        .with_concurrency(CONCURRENCY)
        .with_poll(Duration::from_millis(100))
        // Redeliveries that meet a live lease count as deliveries: kills
        // make many, and none of them is a poison message.
        .with_max_deliveries(1000)
        .with_backoff(idem_core::backoff::Backoff::new(
            Duration::from_millis(20),
            Duration::from_millis(200),
        ))
}

/// The handler both the children and the final drain run: counts the call,
/// works 5–40 ms (where the kills land), then charges through an API that
/// dedupes on the message key (idem's derived-key rule for effects in a
/// remote API) and counts each distinct charge.
fn charging_handler(fixture: &Fixture) -> impl Handler + Clone {
    let connection = fixture.redis.clone();
    let name = fixture.name.clone();
    move |message: Message| {
        let (mut connection, name) = (connection.clone(), name.clone());
        async move {
            let fail = HandlerError::retryable;
            redis::cmd("INCR")
                .arg(format!("{name}:calls"))
                .query_async::<i64>(&mut connection)
                .await
                .map_err(fail)?;
            let work = rand::rng().random_range(5..=40);
            tokio::time::sleep(Duration::from_millis(work)).await;
            redis::cmd("HSETNX")
                .arg(format!("{name}:effects"))
                .arg(&message.key)
                .arg(1)
                .query_async::<i64>(&mut connection)
                .await
                .map_err(fail)?;
            Ok(())
        }
    }
}

async fn calls(fixture: &Fixture) -> u64 {
    redis::cmd("GET")
        .arg(format!("{}:calls", fixture.name))
        .query_async::<Option<u64>>(&mut fixture.redis.clone())
        .await
        .unwrap()
        .unwrap_or(0)
}

/// The child: consumes until killed (or for two minutes at most).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by consumers_killed_mid_handler_lose_nothing, in a child process"]
async fn child_consumer() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        eprintln!("{CHILD_ENV} is unset: this test only runs as a child of the kill test");
        return;
    };
    let mut parts = spec.split(' ');
    let kind = Kind::parse(parts.next().unwrap());
    let name = parts.next().unwrap().to_owned();
    let fixture = Fixture::attach(kind, &name, LEASE, false).await.unwrap();
    let consumer = Consumer::new(fixture.idem(LEASE).await).with_config(config());
    let source = fixture.source(&idem_testing::unique_name("child")).await;
    consumer
        .run(
            source,
            charging_handler(&fixture),
            tokio::time::sleep(Duration::from_secs(120)),
        )
        .await
        .unwrap();
}

async fn consumers_killed_mid_handler(kind: Kind) {
    let Some(fixture) = Fixture::new(kind, LEASE).await else {
        return;
    };
    let messages = env_number("IDEM_BROKER_MESSAGES", 40);
    let kills = env_number("IDEM_BROKER_KILLS", 5);
    for round in 0..2 {
        for n in 0..messages {
            fixture
                .publish(&format!("pay-{n}"), b"{\"amount\":5}")
                .await;
        }
        if round == 0 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let exe = std::env::current_exe().unwrap();
    let mut mid_handler = 0;
    for _ in 0..kills {
        let before = calls(&fixture).await;
        let mut child = tokio::process::Command::new(&exe)
            .args([
                "--exact",
                "child::child_consumer",
                "--ignored",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, format!("{} {}", kind.name(), fixture.name))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        // Kill it soon after it starts a handler: mid-handler, most times.
        // A Kafka child first waits for the group to drop the member killed
        // before it (its session timeout, 6 s) and give it the partitions.
        let start = if kind.name() == "kafka" { 20 } else { 3 };
        let deadline = Instant::now() + Duration::from_secs(start);
        while calls(&fixture).await == before && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if calls(&fixture).await > before {
            mid_handler += 1;
            let wait = rand::rng().random_range(0..=15);
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
        child.kill().await.unwrap(); // SIGKILL
    }
    let consumer = Consumer::new(fixture.idem(LEASE).await).with_config(config());
    let limit = Duration::from_secs(60 + kills);
    let expected = usize::try_from(messages).unwrap();
    fixture
        .drain(&consumer, charging_handler(&fixture), limit, |e| {
            e.len() == expected
        })
        .await;
    let effects = fixture.effects().await;
    let calls = calls(&fixture).await;
    eprintln!(
        "{kind:?}: {messages} messages published twice, {kills} kills ({mid_handler} after a handler started), {calls} handler calls"
    );
    assert_eq!(effects.len(), expected, "{kind:?}: lost messages");
    assert!((0..messages).all(|n| effects.contains_key(&format!("pay-{n}"))));
    assert!(fixture.dead_letters().await.is_empty(), "{kind:?}");
    assert_eq!(fixture.unsettled().await, 0, "{kind:?}");
    // Every extra call is a handler a kill interrupted (at most CONCURRENCY
    // per kill); the duplicate publishes and the redeliveries of recorded
    // messages ran nothing. Without idem the calls would be 2 x messages.
    let bound = messages + CONCURRENCY as u64 * kills;
    assert!(
        calls <= bound,
        "{kind:?}: {calls} handler calls, more than {messages} + {CONCURRENCY} per kill"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_killed_mid_handler_lose_nothing_and_run_nothing_twice_on_every_broker() {
    for kind in kinds() {
        consumers_killed_mid_handler(kind).await;
    }
}
