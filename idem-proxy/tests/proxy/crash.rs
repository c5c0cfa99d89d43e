//! The proxy binary killed with SIGKILL under load and started again on
//! the same store: no key runs again while its lease is live, and an
//! upstream that records the key makes one effect a key.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::join_all;

use crate::support::{python, until};

/// The lease every route gets: short, so the test waits one out.
const LEASE: Duration = Duration::from_secs(2);

/// A proxy process; dropping it kills it.
struct ProxyProcess {
    child: Child,
    url: String,
}

impl ProxyProcess {
    fn start(upstream: &str, store: &str) -> ProxyProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_idem-proxy"))
            .args(["--listen", "127.0.0.1:0", "--upstream", upstream])
            .args(["--store", store, "--lease", "2s"])
            .env("RUST_LOG", "error")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("idem-proxy listening on ")
            .unwrap_or_else(|| panic!("the proxy printed {line:?}"));
        ProxyProcess {
            url: format!("http://{addr}"),
            child,
        }
    }

    /// SIGKILL: no chance to record or release anything.
    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// One request's key: `/payments` and `/gated` run every time they are
/// forwarded, `/charges` records the key and charges once; a third of each
/// wait at the upstream's gate, so they are in flight when the proxy dies.
#[derive(Clone)]
struct Plan {
    key: String,
    path: &'static str,
    gated: bool,
}

fn plans(count: usize) -> Vec<Plan> {
    (0..count)
        .map(|i| {
            let gated = i % 3 == 0;
            let path = match (i % 2 == 0, gated) {
                (true, true) => "/gated",
                (true, false) => "/payments",
                (false, _) => "/charges",
            };
            Plan {
                key: format!("crash-{i}"),
                path,
                gated,
            }
        })
        .collect()
}

async fn send(client: &reqwest::Client, url: &str, plan: &Plan) -> Option<u16> {
    let answer = client
        .post(format!("{url}{}", plan.path))
        .header("idempotency-key", &plan.key)
        .header("content-type", "application/json")
        .header("x-gate", if plan.gated { "1" } else { "" })
        .body(format!(r#"{{"key":"{}"}}"#, plan.key))
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .ok()?;
    Some(answer.status().as_u16())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_killed_under_load_never_lets_a_key_run_under_a_live_lease() {
    let Some(upstream) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("idem.db").display());
    let first = ProxyProcess::start(&upstream.url(), &store);
    let plans = plans(60);
    let client = reqwest::Client::new();

    // Every key sent once, all at once; `sent` is before the claim.
    let sent = now();
    let load = {
        let (client, url) = (client.clone(), first.url.clone());
        let plans = plans.clone();
        tokio::spawn(
            async move { join_all(plans.iter().map(|plan| send(&client, &url, plan))).await },
        )
    };
    // Killed once every key has reached the upstream, while the gated
    // ones are still inside it.
    until(
        "every key reaches the upstream",
        Duration::from_secs(20),
        || async { upstream.log().len() >= plans.len() },
    )
    .await;
    first.kill();
    let _ = load.await.unwrap();
    let killed = now();
    // One permit for each gated request the dead proxy left inside the
    // upstream, and one for its re-run after the lease.
    let gated = plans.iter().filter(|p| p.gated).count();
    for _ in 0..2 * gated {
        upstream.open_gate();
    }

    // Started again on the same store; every key retried until answered.
    let second = ProxyProcess::start(&upstream.url(), &store);
    let refused_under_lease = AtomicUsize::new(0);
    join_all(plans.iter().map(|plan| {
        let (client, url, refused) = (&client, &second.url, &refused_under_lease);
        async move {
            loop {
                match send(client, url, plan).await {
                    Some(201) => return,
                    Some(409) => {
                        refused.fetch_add(1, Ordering::Relaxed);
                        assert!(
                            now() < killed + LEASE.as_secs_f64() + 10.0,
                            "{} still in progress long after its lease",
                            plan.key
                        );
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    other => panic!("{}: {other:?}", plan.key),
                }
            }
        }
    }))
    .await;

    let log = upstream.log();
    let mut runs: HashMap<&str, Vec<f64>> = HashMap::new();
    for run in &log {
        runs.entry(run.key.as_deref().unwrap())
            .or_default()
            .push(run.at);
    }
    let mut rerun = 0;
    for plan in &plans {
        let times = &runs[plan.key.as_str()];
        // A claim made after `sent` holds its key until `sent + LEASE` at
        // the earliest; a run before then would be a run under a live
        // lease. (5 ms for the store's millisecond clock.)
        for later in &times[1..] {
            assert!(
                *later >= sent + LEASE.as_secs_f64() - 0.005,
                "{} ran again {:.3} s after it was sent, under its {LEASE:?} lease",
                plan.key,
                later - sent
            );
        }
        rerun += times.len() - 1;
        if plan.path == "/charges" {
            assert_eq!(times.len(), 1, "{} charged {} times", plan.key, times.len());
        }
    }
    // The window is real: the gated keys without a recording upstream,
    // in flight when the proxy died, ran a second time after their lease
    // (until then their retries were refused).
    println!(
        "{rerun} keys ran again after their lease; {} retries refused under it",
        refused_under_lease.into_inner()
    );
    assert!(rerun > 0, "no key in flight at the kill ran again");
    drop(second);
}
