//! `idem console` run as a process and driven over HTTP on a socket,
//! against SQLite and PostgreSQL holding records the library wrote: what
//! it lists, what its mends change (counted in executions), what it hides,
//! and what it refuses; an inbox's dead letters requeued through it and
//! handled once; an application's rates scraped and counted; and the same
//! in headless Chromium, which also takes the screenshots of the guide.

#[path = "console/webdriver.rs"]
mod webdriver;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use idem_core::store::Store;
use idem_core::{Begin, Fingerprint, Idempotent};
use idem_inbox::queue::{NewJob, PostgresQueue, Queue, SqliteQueue};
use idem_inbox::{Event, HandlerError, Outcome, Worker, WorkerConfig};
use idem_testing::{unique_name, Cleanup, Server, StoreKind};
use serde_json::json;

const NAMESPACE: &str = "console";
const TOKEN: &str = "a-console-token-for-tests";

/// A store the library writes and the console reads by URL.
struct Opened {
    store: Arc<dyn Store>,
    args: Vec<String>,
    _guard: Cleanup,
}

async fn opened(kind: StoreKind) -> Option<Opened> {
    let name = unique_name("idem_console");
    let (url, option, guard) = match kind {
        StoreKind::Sqlite => {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let path = dir.path().join("idem.db").display().to_string();
            (path, vec![], Cleanup::holding(dir))
        }
        StoreKind::Postgres => {
            let url = Server::Postgres.require()?;
            let guard = Cleanup::postgres(&url, format!("DROP TABLE IF EXISTS {name}"));
            (url, vec!["--table".into(), name.clone()], guard)
        }
        other => panic!("not tested here: {other:?}"),
    };
    let store = kind
        .open(&url, Some(&name))
        .await
        .unwrap_or_else(|e| panic!("{kind:?} at {url}: {e}"));
    let url = match kind {
        StoreKind::Sqlite => format!("sqlite:{url}"),
        _ => url,
    };
    let mut args = vec!["--store".to_owned(), url];
    args.extend(option);
    Some(Opened {
        store,
        args,
        _guard: guard,
    })
}

/// A running console, stopped when dropped.
struct Console {
    child: Child,
    base: String,
}

impl Opened {
    fn idem(&self) -> Idempotent {
        Idempotent::from_arc(Arc::clone(&self.store)).with_namespace(NAMESPACE)
    }

    /// Starts `idem console` on a free loopback port with `extra` options.
    fn console(&self, extra: &[&str]) -> Console {
        let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(&self.args)
            .args(["console", "--listen", "127.0.0.1:0"])
            .args(extra)
            .env_remove("IDEM_STORE")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the idem binary runs");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let Some(base) = line
            .split("listening on ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
        else {
            let mut err = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut err);
            panic!("the console did not start: {line}{err}");
        };
        Console {
            base: base.trim_end_matches('/').to_owned(),
            child,
        }
    }
}

impl Console {
    /// Stops the console and returns what it wrote to standard error.
    fn stop(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut err = String::new();
        let _ = self.child.stderr.take().unwrap().read_to_string(&mut err);
        err
    }

    async fn get(&self, path: &str) -> (u16, String) {
        let response = reqwest::Client::new()
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }

    async fn post(&self, path: &str, form: &[(&str, &str)]) -> (u16, String) {
        let response = reqwest::Client::new()
            .post(format!("{}{path}", self.base))
            .form(form)
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of the hidden input `name` on a confirmation page.
fn hidden(page: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let start = page
        .find(&marker)
        .unwrap_or_else(|| panic!("no {name} in {page}"))
        + marker.len();
    page[start..].split('"').next().unwrap().to_owned()
}

/// The link starting with `prefix` on a page, unescaped.
fn link(page: &str, prefix: &str) -> String {
    let marker = format!("href=\"{prefix}");
    let start = page
        .find(&marker)
        .unwrap_or_else(|| panic!("no link {prefix} in {page}"))
        + "href=\"".len();
    page[start..]
        .split('"')
        .next()
        .unwrap()
        .replace("&amp;", "&")
}

fn record_path(key: &str) -> String {
    format!("/key?namespace={NAMESPACE}&scope=&key={key}")
}

/// Runs `key`'s work through the library, counting executions in `runs`.
async fn execute(idem: &Idempotent, key: &str, runs: &AtomicU32) -> String {
    idem.execute(key, &json!({"amount": 1250}), || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, ()>("card-4242-charged".to_owned())
    })
    .await
    .unwrap_or_else(|e| panic!("{key}: {e:?}"))
}

/// An in-flight key is listed with its lease, a release without the CSRF
/// token or a reason changes nothing, and a release through the page lets
/// the next call run at once.
async fn lists_and_releases_a_stuck_lease(kind: StoreKind) {
    let Some(opened) = opened(kind).await else {
        return;
    };
    let idem = opened.idem();
    let fingerprint = Fingerprint::of_json(&json!({"amount": 1250})).unwrap();
    assert!(matches!(
        idem.begin("stuck-1", fingerprint).await.unwrap(),
        Begin::Run(_)
    ));
    let console = opened.console(&[]);
    let (status, keys) = console
        .get(&format!("/keys?state=in-flight&namespace={NAMESPACE}"))
        .await;
    assert_eq!(status, 200, "{keys}");
    assert!(keys.contains("stuck-1"), "{keys}");
    assert!(keys.contains("in flight, lease "), "{keys}");
    let (_, record) = console.get(&record_path("stuck-1")).await;
    assert!(record.contains("in flight, lease "), "{record}");
    let (status, confirm) = console.get(&link(&record, "/confirm/release?")).await;
    assert_eq!(status, 200, "{confirm}");
    let token = hidden(&confirm, "token");
    let csrf = hidden(&confirm, "csrf");
    let wrong = "0".repeat(64);
    let release = |csrf_field: &'static str, csrf: String, reason: &'static str| {
        let token = token.clone();
        let console = &console;
        async move {
            let form = [
                ("namespace", NAMESPACE),
                ("scope", ""),
                ("key", "stuck-1"),
                ("token", token.as_str()),
                (csrf_field, csrf.as_str()),
                ("reason", reason),
            ];
            console.post("/release", &form).await
        }
    };
    let key = idem.key("stuck-1").unwrap();
    let (status, page) = release("nocsrf", csrf.clone(), "worker died").await;
    assert_eq!(status, 403, "without the CSRF token: {page}");
    let (status, page) = release("csrf", wrong, "worker died").await;
    assert_eq!(status, 403, "with a wrong CSRF token: {page}");
    let (status, page) = release("csrf", csrf.clone(), "  ").await;
    assert_eq!(status, 400, "without a reason: {page}");
    assert!(opened.store.load(key.as_str()).await.unwrap().is_some());
    let (status, page) = release("csrf", csrf.clone(), "worker died").await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Released"), "{page}");
    // The next call runs at once, exactly once.
    let runs = AtomicU32::new(0);
    for _ in 0..2 {
        execute(&idem, "stuck-1", &runs).await;
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let audit = console.stop();
    assert!(
        audit.contains("idem::audit")
            && audit.contains("released")
            && audit.contains("worker died"),
        "{audit}"
    );
}

/// A reset through the page makes the next call run; a key in flight is
/// refused and kept.
async fn resets_a_completed_key(kind: StoreKind) {
    let Some(opened) = opened(kind).await else {
        return;
    };
    let idem = opened.idem();
    let runs = AtomicU32::new(0);
    execute(&idem, "done-1", &runs).await;
    execute(&idem, "done-1", &runs).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the second call replays");
    let fingerprint = Fingerprint::of_json(&json!({"amount": 1250})).unwrap();
    assert!(matches!(
        idem.begin("held-1", fingerprint).await.unwrap(),
        Begin::Run(_)
    ));
    let console = opened.console(&[]);
    let (_, record) = console.get(&record_path("done-1")).await;
    assert!(record.contains("completed"), "{record}");
    let (status, confirm) = console.get(&link(&record, "/confirm/reset?")).await;
    assert_eq!(status, 200, "{confirm}");
    let csrf = hidden(&confirm, "csrf");
    let form = |key: &'static str| {
        [
            ("namespace", NAMESPACE),
            ("scope", ""),
            ("key", key),
            ("reason", "refund reissued"),
            ("by", "ops"),
        ]
    };
    let (status, page) = console.post("/reset", &form("done-1")).await;
    assert_eq!(status, 403, "without the CSRF token: {page}");
    execute(&idem, "done-1", &runs).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "a refused reset changes nothing"
    );
    let mut with_csrf = form("done-1").to_vec();
    with_csrf.push(("csrf", &csrf));
    let (status, page) = console.post("/reset", &with_csrf).await;
    assert_eq!(status, 200, "{page}");
    execute(&idem, "done-1", &runs).await;
    execute(&idem, "done-1", &runs).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the reset key ran once more"
    );
    let mut held = form("held-1").to_vec();
    held.push(("csrf", &csrf));
    let (status, page) = console.post("/reset", &held).await;
    assert_eq!(status, 409, "a key in flight is not reset: {page}");
    let key = idem.key("held-1").unwrap();
    assert!(opened.store.load(key.as_str()).await.unwrap().is_some());
    let audit = console.stop();
    assert!(
        audit.contains("refund reissued") && audit.contains("ops"),
        "{audit}"
    );
}

/// The outcome is hidden unless the console was started with
/// `--show-payloads`.
async fn hides_payloads_unless_asked(kind: StoreKind) {
    let Some(opened) = opened(kind).await else {
        return;
    };
    let idem = opened.idem();
    execute(&idem, "paid-1", &AtomicU32::new(0)).await;
    let console = opened.console(&[]);
    let (status, page) = console.get(&record_path("paid-1")).await;
    assert_eq!(status, 200, "{page}");
    assert!(!page.contains("card-4242"), "{page}");
    assert!(page.contains("hidden"), "{page}");
    drop(console);
    let console = opened.console(&["--show-payloads"]);
    let (_, page) = console.get(&record_path("paid-1")).await;
    assert!(page.contains("card-4242-charged"), "{page}");
}

/// With a token, a request without it (or with another) is refused.
async fn refuses_requests_without_the_token(kind: StoreKind) {
    let Some(opened) = opened(kind).await else {
        return;
    };
    let console = opened.console(&["--token", TOKEN]);
    let (status, _) = console.get("/keys").await;
    assert_eq!(status, 401);
    let client = reqwest::Client::new();
    for (given, expected) in [(TOKEN, 200), ("a-console-token-for-test", 401)] {
        let response = client
            .get(format!("{}/keys", console.base))
            .bearer_auth(given)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), expected, "token {given}");
    }
    let (status, _) = console.get("/login").await;
    assert_eq!(status, 200, "the login page is open");
}

/// The keys page filters by scope as well as by namespace.
async fn filters_keys_by_scope(kind: StoreKind) {
    let Some(opened) = opened(kind).await else {
        return;
    };
    let fingerprint = Fingerprint::of_json(&json!({"amount": 1250})).unwrap();
    for (scope, key) in [("tenant-a", "held-a"), ("tenant-b", "held-b")] {
        let idem = opened.idem().scoped(scope);
        assert!(matches!(
            idem.begin(key, fingerprint).await.unwrap(),
            Begin::Run(_)
        ));
    }
    let console = opened.console(&[]);
    let (status, all) = console
        .get(&format!("/keys?state=in-flight&namespace={NAMESPACE}"))
        .await;
    assert_eq!(status, 200, "{all}");
    assert!(all.contains("held-a") && all.contains("held-b"), "{all}");
    let (_, only_a) = console
        .get(&format!(
            "/keys?state=in-flight&namespace={NAMESPACE}&scope=tenant-a"
        ))
        .await;
    assert!(only_a.contains("held-a"), "{only_a}");
    assert!(!only_a.contains("held-b"), "{only_a}");
}

/// An inbox queue of `kind` beside the store, and what removes it.
async fn inbox_queue(kind: StoreKind) -> (Arc<dyn Queue>, Vec<String>, Cleanup) {
    match kind {
        StoreKind::Sqlite => {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("inbox.db");
            let queue = SqliteQueue::open(&path).await.unwrap();
            let args = vec!["--inbox".to_owned(), format!("sqlite:{}", path.display())];
            (Arc::new(queue), args, Cleanup::holding(dir))
        }
        StoreKind::Postgres => {
            let url = Server::Postgres.url();
            let table = unique_name("console_inbox");
            let guard =
                Cleanup::postgres(&url, format!("DROP TABLE IF EXISTS {table}, {table}_keys"));
            let queue = PostgresQueue::connect(&url)
                .await
                .unwrap()
                .with_table(&table)
                .unwrap();
            queue.migrate().await.unwrap();
            let args = vec!["--inbox".to_owned(), url, "--inbox-table".to_owned(), table];
            (Arc::new(queue), args, guard)
        }
        other => panic!("not tested here: {other:?}"),
    }
}

/// Dead letters are listed with their source, attempts and last error; a
/// requeue without the CSRF token or a reason changes nothing; one requeued
/// through the page, and all of a source, are each handled once.
async fn requeues_dead_letters(kind: StoreKind) {
    let Some(opened) = opened(kind).await else {
        return;
    };
    let (queue, inbox_args, _inbox_guard) = inbox_queue(kind).await;
    for (source, event) in [
        ("stripe", "evt_1"),
        ("stripe", "evt_2"),
        ("github", "gh_1"),
        ("github", "gh_2"),
    ] {
        let payload = format!("{{\"id\":\"{event}\",\"card\":\"4242\"}}");
        queue
            .enqueue(NewJob::new(source, event, payload.into_bytes()))
            .await
            .unwrap();
    }
    let broken = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let runs = Arc::new(AtomicU32::new(0));
    let worker = {
        let (broken, runs) = (Arc::clone(&broken), Arc::clone(&runs));
        Worker::new(
            Arc::clone(&queue),
            Idempotent::from_arc(Arc::clone(&opened.store)).with_namespace("inbox"),
            move |event: Event| {
                let (broken, runs) = (Arc::clone(&broken), Arc::clone(&runs));
                async move {
                    if broken.load(Ordering::SeqCst) {
                        return Err(HandlerError::permanent(format!(
                            "ledger refused {}: account frozen",
                            event.id
                        )));
                    }
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            },
        )
        .with_config(WorkerConfig::default().with_concurrency(4))
    };
    let outcomes = worker.run_once(10).await.unwrap();
    assert_eq!(outcomes, [Outcome::DeadLettered; 4]);
    let mut extra = inbox_args.iter().map(String::as_str).collect::<Vec<_>>();
    extra.push("--show-payloads");
    let console = opened.console(&extra);
    let (status, inbox) = console.get("/inbox").await;
    assert_eq!(status, 200, "{inbox}");
    assert!(inbox.contains("dead letters <strong>4</strong>"), "{inbox}");
    assert!(
        inbox.contains("ledger refused evt_1: account frozen") && inbox.contains("github"),
        "{inbox}"
    );
    let (_, stripe) = console.get("/inbox?source=stripe").await;
    assert!(!stripe.contains("gh_1"), "filtered by source: {stripe}");
    let (_, job) = console.get(&link(&stripe, "/inbox/job?id=")).await;
    assert!(job.contains("4242"), "shown with --show-payloads: {job}");
    let (status, confirm) = console.get(&link(&stripe, "/inbox/confirm?id=")).await;
    assert_eq!(status, 200, "{confirm}");
    let id = hidden(&confirm, "id");
    let csrf = hidden(&confirm, "csrf");
    let one = |csrf: &str, reason: &str| {
        vec![
            ("id".to_owned(), id.clone()),
            ("source".to_owned(), String::new()),
            ("csrf".to_owned(), csrf.to_owned()),
            ("reason".to_owned(), reason.to_owned()),
        ]
    };
    let post = |form: Vec<(String, String)>| {
        let console = &console;
        async move {
            let form: Vec<(&str, &str)> =
                form.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            console.post("/inbox/requeue", &form).await
        }
    };
    let (status, page) = post(one(&"0".repeat(64), "ledger unfrozen")).await;
    assert_eq!(status, 403, "a wrong CSRF token: {page}");
    let (status, page) = post(one(&csrf, " ")).await;
    assert_eq!(status, 400, "no reason: {page}");
    assert_eq!(queue.dead_letters(10).await.unwrap().len(), 4);
    let (status, page) = post(one(&csrf, "ledger unfrozen")).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Requeued <strong>1</strong>"), "{page}");
    let (status, page) = post(one(&csrf, "ledger unfrozen")).await;
    assert_eq!(status, 409, "requeued already: {page}");
    let (_, github) = console.get("/inbox?source=github").await;
    let (status, confirm) = console.get(&link(&github, "/inbox/confirm?source=")).await;
    assert_eq!(status, 200, "{confirm}");
    let form = [
        ("id", String::new()),
        ("source", hidden(&confirm, "source")),
        ("csrf", hidden(&confirm, "csrf")),
        ("reason", "webhook secret rotated".to_owned()),
        ("by", "ops".to_owned()),
    ];
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (status, page) = console.post("/inbox/requeue", &form).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Requeued <strong>2</strong>"), "{page}");
    // The three requeued events run once each; the fourth stays dead.
    broken.store(false, Ordering::SeqCst);
    let outcomes = worker.run_once(10).await.unwrap();
    assert_eq!(outcomes, [Outcome::Completed; 3]);
    assert!(worker.run_once(10).await.unwrap().is_empty());
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    let dead = queue.dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].source, "stripe");
    let audit = console.stop();
    assert_eq!(
        audit.matches("idem-inbox requeue: requeued").count(),
        3,
        "{audit}"
    );
    assert!(audit.contains("webhook secret rotated"), "{audit}");
}

/// Serves `handle`'s Prometheus text on a loopback port, as an
/// application's `/metrics` does; returns its URL.
async fn serve_metrics(handle: metrics_exporter_prometheus::PrometheusHandle) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut request = Vec::new();
            let mut buffer = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buffer).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buffer[..n]),
                }
            }
            let body = handle.render();
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(body.as_bytes()).await;
        }
    });
    format!("http://{address}/metrics")
}

/// Where the screenshots go: `IDEM_CONSOLE_SCREENSHOTS`, else under the
/// target directory.
fn screenshot_dir() -> std::path::PathBuf {
    std::env::var_os("IDEM_CONSOLE_SCREENSHOTS").map_or_else(
        || std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots"),
        std::path::PathBuf::from,
    )
}

/// Reloads `path` in the browser until `cell` reads `expected`, for at
/// most 20 s: a scrape comes every second.
async fn wait_for_cell(
    browser: &webdriver::Browser,
    base: &str,
    path: &str,
    cell: &str,
    expected: &str,
) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        browser.open(&format!("{base}{path}")).await;
        let now = browser.find(cell).await.text().await;
        if now == expected {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{cell} reads {now}, not {expected}: {}",
            browser.text().await
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// The console in headless Chromium, as an operator uses it: refused
/// without its token, logged in by the form; the keys page lists a key in
/// flight with its lease; a payload stays hidden; a reset through the page
/// makes the next call run; a dead letter requeued through the page is
/// handled once; the rates page counts the application's replays and
/// 422s. The SQLite run writes the guide's screenshots.
// The metrics recorder is this thread's, on a one-thread runtime: the
// future never moves to another thread.
#[allow(clippy::future_not_send)]
async fn in_a_browser(kind: StoreKind) {
    let Some(opened) = opened(kind).await else {
        return;
    };
    let Some(browser) = webdriver::Browser::start().await else {
        return;
    };
    // The application's metrics: this thread's recorder, served over HTTP.
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let _local = metrics::set_default_local_recorder(&recorder);
    let metrics_url = serve_metrics(recorder.handle()).await;
    let (queue, inbox_args, _inbox_guard) = inbox_queue(kind).await;
    let mut extra = vec![
        "--token",
        TOKEN,
        "--metrics",
        metrics_url.as_str(),
        "--scrape-every",
        "1",
    ];
    extra.extend(inbox_args.iter().map(String::as_str));
    let console = opened.console(&extra);
    let base = console.base.clone();
    let shots = (kind == StoreKind::Sqlite).then(screenshot_dir);

    browser.open(&format!("{base}/keys")).await;
    assert!(
        browser.text().await.contains("Token required"),
        "{}",
        browser.text().await
    );
    browser.open(&format!("{base}/login")).await;
    browser
        .find("input[name=token]")
        .await
        .type_text(TOKEN)
        .await;
    browser.find("button").await.click().await;
    assert!(
        browser.title().await.starts_with("Keys in flight"),
        "{}",
        browser.text().await
    );
    // The first scrape, before the application does anything.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        browser.open(&format!("{base}/rates")).await;
        if browser.find("#samples").await.text().await != "0" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no scrape");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }

    let idem = opened.idem();
    let fingerprint = Fingerprint::of_json(&json!({"amount": 1250})).unwrap();
    assert!(matches!(
        idem.begin("stuck-1", fingerprint).await.unwrap(),
        Begin::Run(_)
    ));
    let runs = AtomicU32::new(0);
    execute(&idem, "paid-1", &runs).await;
    execute(&idem, "paid-1", &runs).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let mismatch = idem
        .execute("paid-1", &json!({"amount": 99}), || async {
            Ok::<_, ()>(())
        })
        .await;
    assert!(
        mismatch.is_err(),
        "another body under the same key is refused"
    );
    queue
        .enqueue(NewJob::new(
            "stripe",
            "evt_1",
            b"{\"card\":\"4242\"}".to_vec(),
        ))
        .await
        .unwrap();
    let broken = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let handled = Arc::new(AtomicU32::new(0));
    let worker = {
        let (broken, handled) = (Arc::clone(&broken), Arc::clone(&handled));
        Worker::new(
            Arc::clone(&queue),
            Idempotent::from_arc(Arc::clone(&opened.store)).with_namespace("inbox"),
            move |event: Event| {
                let (broken, handled) = (Arc::clone(&broken), Arc::clone(&handled));
                async move {
                    if broken.load(Ordering::SeqCst) {
                        return Err(HandlerError::permanent(format!(
                            "ledger refused {}: account frozen",
                            event.id
                        )));
                    }
                    handled.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            },
        )
    };
    assert_eq!(worker.run_once(10).await.unwrap(), [Outcome::DeadLettered]);

    browser
        .open(&format!(
            "{base}/keys?state=in-flight&namespace={NAMESPACE}"
        ))
        .await;
    let keys = browser.text().await;
    assert!(
        keys.contains("stuck-1") && keys.contains("in flight, lease "),
        "{keys}"
    );
    if let Some(dir) = &shots {
        browser.screenshot(&dir.join("keys.png")).await;
    }
    browser
        .open(&format!("{base}{}", record_path("paid-1")))
        .await;
    let record = browser.text().await;
    assert!(
        record.contains("hidden") && !record.contains("card-4242"),
        "{record}"
    );
    if let Some(dir) = &shots {
        browser.screenshot(&dir.join("record.png")).await;
    }
    browser.link("Reset this key").await.click().await;
    browser
        .find("input[name=reason]")
        .await
        .type_text("refund reissued")
        .await;
    browser.find("button").await.click().await;
    assert_eq!(
        browser.title().await,
        "Reset · idem console",
        "{}",
        browser.text().await
    );
    execute(&idem, "paid-1", &runs).await;
    execute(&idem, "paid-1", &runs).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the reset key ran once more"
    );

    browser.open(&format!("{base}/inbox")).await;
    let inbox = browser.text().await;
    assert!(
        inbox.contains("ledger refused evt_1: account frozen"),
        "{inbox}"
    );
    if let Some(dir) = &shots {
        browser.screenshot(&dir.join("inbox.png")).await;
    }
    browser.link("Requeue…").await.click().await;
    browser
        .find("input[name=reason]")
        .await
        .type_text("ledger unfrozen")
        .await;
    browser.find("button").await.click().await;
    assert!(
        browser.text().await.contains("Requeued 1 dead letter"),
        "{}",
        browser.text().await
    );
    broken.store(false, Ordering::SeqCst);
    assert_eq!(worker.run_once(10).await.unwrap(), [Outcome::Completed]);
    assert!(worker.run_once(10).await.unwrap().is_empty());
    assert_eq!(handled.load(Ordering::SeqCst), 1, "handled once");

    // Five first executions (stuck-1, paid-1 twice around its reset, the
    // event's failed and its requeued run), two replays, one 422.
    for (counter, expected) in [
        ("idem_executed_total", "5"),
        ("idem_replayed_total", "2"),
        ("idem_mismatch_total", "1"),
        ("idem_in_progress_total", "0"),
    ] {
        let cell = format!("td[data-series={counter}]");
        wait_for_cell(&browser, &base, "/rates", &cell, expected).await;
    }
    // The charts draw their bars, not only the numbers beside them.
    let bar = browser.find("svg rect").await;
    assert!(bar.height().await > 0.0, "the rates chart draws its bars");
    if let Some(dir) = &shots {
        browser.screenshot(&dir.join("rates.png")).await;
    }
    drop(browser);
    let audit = console.stop();
    assert!(
        audit.contains("refund reissued") && audit.contains("ledger unfrozen"),
        "{audit}"
    );
}

macro_rules! on {
    ($store:ident, $kind:expr) => {
        mod $store {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn lists_and_releases_a_stuck_lease() {
                super::lists_and_releases_a_stuck_lease($kind).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn resets_a_completed_key() {
                super::resets_a_completed_key($kind).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn hides_payloads_unless_asked() {
                super::hides_payloads_unless_asked($kind).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn filters_keys_by_scope() {
                super::filters_keys_by_scope($kind).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn requeues_dead_letters() {
                super::requeues_dead_letters($kind).await;
            }

            // One thread: the application's metrics recorder is the
            // thread's own, so that tests in parallel do not share it.
            #[tokio::test(flavor = "current_thread")]
            async fn in_a_browser() {
                super::in_a_browser($kind).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn refuses_requests_without_the_token() {
                super::refuses_requests_without_the_token($kind).await;
            }
        }
    };
}

on!(sqlite, StoreKind::Sqlite);
on!(postgres, StoreKind::Postgres);

/// A console that would listen beyond loopback without a token does not
/// start.
#[tokio::test]
async fn refuses_to_listen_beyond_loopback_without_a_token() {
    let opened = opened(StoreKind::Sqlite).await.unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(&opened.args)
        .args(["console", "--listen", "0.0.0.0:0"])
        .env_remove("IDEM_STORE")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{err}");
    assert!(err.contains("without a token"), "{err}");
}
