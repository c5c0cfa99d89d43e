//! Every metric and span idem-core emits, observed with a recording
//! recorder and a recording subscriber on real stores.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use idem_core::inspect::Inspect;
use idem_core::observe::{key_hash, KeyInTraces};
use idem_core::store::{spawn_purger, Store};
use idem_core::{Begin, Error, Fingerprint, Idempotent};
use idem_testing::{unique_name, StoreKind, TestStore};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use serde_json::json;
use tracing::span;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// One recorded value: name, labels, counter total or histogram samples.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: HashMap<String, String>,
    value: Value,
}

/// A recorded value: a counter's increments or a histogram's sample count.
#[derive(Debug, Clone, Copy)]
enum Value {
    Counter(u64),
    Histogram(usize),
    Gauge,
}

/// The process-wide recorder. A snapshot drains it, so every snapshot is
/// kept here and tests filter by their own namespace.
fn recorded() -> Vec<Sample> {
    static RECORDER: OnceLock<(Snapshotter, Mutex<Vec<Sample>>)> = OnceLock::new();
    let (snapshotter, kept) = RECORDER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("no other recorder in this test binary");
        (snapshotter, Mutex::new(Vec::new()))
    });
    let mut kept = kept.lock().unwrap();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        kept.push(Sample {
            name: key.name().to_owned(),
            labels: key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect(),
            value: match value {
                DebugValue::Counter(n) => Value::Counter(n),
                DebugValue::Histogram(values) => Value::Histogram(values.len()),
                DebugValue::Gauge(_) => Value::Gauge,
            },
        });
    }
    kept.clone()
}

/// The sum of counter `name` over samples whose labels include `with`.
fn counter(samples: &[Sample], name: &str, with: &[(&str, &str)]) -> u64 {
    matching(samples, name, with)
        .map(|s| match &s.value {
            Value::Counter(n) => *n,
            other => panic!("{name} is not a counter: {other:?}"),
        })
        .sum()
}

/// How many values histogram `name` recorded over matching samples.
fn observations(samples: &[Sample], name: &str, with: &[(&str, &str)]) -> usize {
    matching(samples, name, with)
        .map(|s| match &s.value {
            Value::Histogram(n) => *n,
            other => panic!("{name} is not a histogram: {other:?}"),
        })
        .sum()
}

fn matching<'a>(
    samples: &'a [Sample],
    name: &'a str,
    with: &'a [(&str, &str)],
) -> impl Iterator<Item = &'a Sample> {
    samples.iter().filter(move |s| {
        s.name == name
            && with
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
    })
}

/// Counts every decision and transition, and the store calls' latency,
/// on one store: each metric moves by exactly what happened.
async fn metrics_count_what_happened(kind: StoreKind) {
    // The recorder must be in place before the first metric.
    instrumented();
    let Some(fresh) = kind.fresh().await else {
        return;
    };
    let namespace = unique_name("metrics");
    let ns = [("namespace", namespace.as_str()), ("store", kind.name())];
    let idem = Idempotent::from_arc(Arc::clone(&fresh.store)).with_namespace(&*namespace);
    let body = json!({"n": 1});
    let mut runs = 0;

    // executed, completed, replayed, mismatch.
    for _ in 0..3 {
        let _: u8 = idem
            .execute("a", &body, || {
                runs += 1;
                async { Ok::<_, ()>(1) }
            })
            .await
            .unwrap();
    }
    let other: Result<u8, Error<()>> = idem
        .execute("a", &json!({"n": 2}), || async { Ok(2) })
        .await;
    assert!(matches!(other, Err(Error::Mismatch)));
    // in progress.
    let fingerprint = Fingerprint::of_json(&body).unwrap();
    let Begin::Run(_held) = idem.begin("b", fingerprint).await.unwrap() else {
        panic!("b is new");
    };
    assert!(matches!(
        idem.begin("b", fingerprint).await,
        Err(Error::InProgress { .. })
    ));
    // released, then a remembered failure and its replay.
    let released: Result<u8, Error<String>> = idem
        .execute("c", &body, || async { Err("retry me".to_owned()) })
        .await;
    assert!(matches!(released, Err(Error::Work(_))));
    for _ in 0..2 {
        let failed: Result<u8, Error<String>> = idem
            .execute_remembering("d", &body, |_| true, || async { Err("no".to_owned()) })
            .await;
        assert!(matches!(failed, Err(Error::Work(_))));
    }
    // taken over, and the stale owner's lease lost.
    let short = idem.clone().with_lease(Duration::from_millis(100));
    let Begin::Run(stale) = short.begin("e", fingerprint).await.unwrap() else {
        panic!("e is new");
    };
    let start = Instant::now();
    loop {
        let record = fresh
            .store
            .load(stale.key().as_str())
            .await
            .unwrap()
            .unwrap();
        if record.lease_lapsed() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "lease never lapsed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _: u8 = idem
        .execute("e", &body, || {
            runs += 1;
            async { Ok::<_, ()>(5) }
        })
        .await
        .unwrap();
    assert!(matches!(stale.complete(b"6").await, Err(Error::LeaseLost)));
    assert_eq!(runs, 2);

    let samples = recorded();
    let count = |name| counter(&samples, name, &ns);
    // a, b, c, d (once), e (claimed, then taken over).
    assert_eq!(count("idem_executed_total"), 6);
    assert_eq!(count("idem_completed_total"), 2, "a and e");
    assert_eq!(count("idem_replayed_total"), 3, "a twice, d once");
    assert_eq!(count("idem_mismatch_total"), 1);
    assert_eq!(count("idem_in_progress_total"), 1);
    assert_eq!(count("idem_released_total"), 1);
    assert_eq!(count("idem_failures_remembered_total"), 1);
    assert_eq!(count("idem_taken_over_total"), 1);
    assert_eq!(count("idem_lease_lost_total"), 1);
    assert_eq!(count("idem_store_errors_total"), 0);
    // One work duration per run: a, c, d, e.
    assert_eq!(observations(&samples, "idem_work_seconds", &ns), 4);
    let inserts = [ns[0], ns[1], ("op", "insert")];
    // a ×3, a mismatch, b ×2, c, d ×2, e claim, e found lapsed.
    assert_eq!(
        observations(&samples, "idem_store_call_seconds", &inserts),
        11
    );
    let completes = [ns[0], ns[1], ("op", "complete")];
    assert_eq!(
        observations(&samples, "idem_store_call_seconds", &completes),
        3
    );
    // Never a label that could carry a key.
    for sample in samples
        .iter()
        .filter(|s| s.labels.get("namespace") == Some(&namespace))
    {
        for label in sample.labels.keys() {
            assert!(
                ["store", "namespace", "op", "kind", "work"].contains(&label.as_str()),
                "{} has label {label}",
                sample.name
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_metrics_count_what_happened() {
    metrics_count_what_happened(StoreKind::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_metrics_count_what_happened() {
    metrics_count_what_happened(StoreKind::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_metrics_count_what_happened() {
    metrics_count_what_happened(StoreKind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_metrics_count_what_happened() {
    metrics_count_what_happened(StoreKind::MySql).await;
}

/// A store failure is counted by kind and by whether the work had run:
/// a claim on a table that does not exist fails before the work; a
/// completion after the table was dropped fails after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_errors_are_counted_by_kind_and_whether_the_work_ran() {
    let Some(url) = idem_testing::Server::Postgres.require() else {
        return;
    };
    instrumented();
    let table = unique_name("idem_errors");
    let _guard = idem_testing::Cleanup::postgres(&url, format!("DROP TABLE IF EXISTS {table}"));
    let store = idem_postgres::PostgresStore::connect(&url)
        .await
        .unwrap()
        .with_table(&table)
        .unwrap();
    let namespace = unique_name("errors");
    let idem = Idempotent::new(store.clone()).with_namespace(&*namespace);
    let body = json!({});

    let before: Result<u8, Error<()>> = idem.execute("k", &body, || async { Ok(1) }).await;
    let Err(Error::Store { source, .. }) = &before else {
        panic!("no table, no claim: {before:?}");
    };
    let before_kind = format!("{:?}", source.kind()).to_lowercase();
    assert!(!before.unwrap_err().work_ran());

    store.migrate().await.unwrap();
    let Begin::Run(lease) = idem
        .begin("k", Fingerprint::of_json(&body).unwrap())
        .await
        .unwrap()
    else {
        panic!("k is new");
    };
    sqlx_drop(&url, &table).await;
    let after = lease.complete(b"1").await;
    let Err(Error::Store { source, .. }) = &after else {
        panic!("the table is gone: {after:?}");
    };
    let after_kind = format!("{:?}", source.kind()).to_lowercase();

    let samples = recorded();
    let ns = ("namespace", namespace.as_str());
    let errors = |op, kind: &str, work| {
        counter(
            &samples,
            "idem_store_errors_total",
            &[
                ns,
                ("store", "postgres"),
                ("op", op),
                ("kind", kind),
                ("work", work),
            ],
        )
    };
    assert_eq!(errors("insert", &before_kind, "before"), 1);
    assert_eq!(errors("complete", &after_kind, "after"), 1);
    assert_eq!(counter(&samples, "idem_store_errors_total", &[ns]), 2);
}

async fn sqlx_drop(url: &str, table: &str) {
    use idem_postgres::sqlx::{self, Connection};
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(&mut conn)
        .await
        .unwrap();
}

/// A span as the recording subscriber saw it: name and fields.
type Spans = Arc<Mutex<Vec<(String, HashMap<String, String>)>>>;

/// The subscriber of this whole test binary, installed before any test
/// emits: it records the spans of a thread that asked for them.
///
/// A thread-local default subscriber (`set_default`) is not enough here: a
/// callsite first reached by a test on another thread while that default is
/// being registered can cache "never interested" for good, and its spans are
/// then lost to every subscriber. One global subscriber, in place before any
/// callsite is reached, leaves no such window.
struct Recording;

thread_local! {
    /// Where spans opened on this thread go, if anywhere.
    static SINK: std::cell::RefCell<Option<Spans>> = const { std::cell::RefCell::new(None) };
}

/// Installs the binary's subscriber and recorder; every test calls it first.
fn instrumented() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let subscriber = tracing_subscriber::registry()
            .with(Recording)
            .with(tracing_subscriber::filter::LevelFilter::DEBUG);
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other subscriber in this test binary");
    });
    recorded();
}

/// Records the spans this thread opens until the guard drops.
fn record_spans_here() -> (Spans, impl Drop) {
    struct Stop;
    impl Drop for Stop {
        fn drop(&mut self) {
            SINK.with(|sink| sink.borrow_mut().take());
        }
    }
    let spans: Spans = Arc::default();
    SINK.with(|sink| *sink.borrow_mut() = Some(Arc::clone(&spans)));
    (spans, Stop)
}

struct Fields<'a>(&'a mut HashMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

/// Which recording, and which entry of it, a span is.
struct Index(Spans, usize);

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recording {
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        let Some(sink) = SINK.with(|sink| sink.borrow().clone()) else {
            return;
        };
        let mut fields = HashMap::new();
        attrs.record(&mut Fields(&mut fields));
        let i = {
            let mut spans = sink.lock().unwrap();
            spans.push((attrs.metadata().name().to_owned(), fields));
            spans.len() - 1
        };
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Index(sink, i));
        }
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let extensions = span.extensions();
        let Some(Index(sink, i)) = extensions.get::<Index>() else {
            return;
        };
        values.record(&mut Fields(&mut sink.lock().unwrap()[*i].1));
    }
}

/// One span per `execute` with its decision, one per store call with its
/// outcome; the key only as its hash, or as the client key when asked.
async fn spans_carry_decisions_and_hide_keys(kind: StoreKind) {
    instrumented();
    let Some(fresh) = kind.fresh().await else {
        return;
    };
    let (spans, _recording) = record_spans_here();

    let idem = Idempotent::from_arc(Arc::clone(&fresh.store)).with_namespace("spans");
    let body = json!({"secret": "tenant-data"});
    for _ in 0..2 {
        let _: u8 = idem
            .scoped("acme-corp")
            .execute("order-42", &body, || async { Ok::<_, ()>(1) })
            .await
            .unwrap();
    }
    let clear = idem.clone().with_key_in_traces(KeyInTraces::ClientKey);
    let _: u8 = clear
        .execute("order-43", &body, || async { Ok::<_, ()>(1) })
        .await
        .unwrap();

    let spans = spans.lock().unwrap().clone();
    let hash = key_hash(idem.scoped("acme-corp").key("order-42").unwrap().as_str());
    let executes: Vec<_> = spans.iter().filter(|(n, _)| n == "idem.execute").collect();
    assert_eq!(executes.len(), 3, "{spans:?}");
    let decisions: Vec<_> = executes
        .iter()
        .map(|(_, f)| (f["key"].as_str(), f["decision"].as_str()))
        .collect();
    assert_eq!(
        decisions,
        [
            (hash.as_str(), "executed"),
            (hash.as_str(), "replayed"),
            ("order-43", "executed")
        ]
    );
    let stores: Vec<_> = spans
        .iter()
        .filter(|(n, _)| n == "idem.store")
        .map(|(_, f)| (f["op"].as_str(), f.get("outcome").map(String::as_str)))
        .collect();
    assert_eq!(
        stores,
        [
            ("insert", Some("inserted")),
            ("complete", Some("swapped")),
            ("insert", Some("found")),
            ("insert", Some("inserted")),
            ("complete", Some("swapped")),
        ]
    );
    assert!(spans
        .iter()
        .all(|(_, f)| f.get("store").is_none_or(|s| s == kind.name())));
    // Nothing recorded carries the hashed key, its scope or the body.
    let everything = format!("{spans:?}");
    for secret in ["order-42", "acme-corp", "tenant-data"] {
        assert!(
            !everything.contains(secret),
            "{secret} leaked: {everything}"
        );
    }
}

#[tokio::test]
async fn sqlite_spans_carry_decisions_and_hide_keys() {
    spans_carry_decisions_and_hide_keys(StoreKind::Sqlite).await;
}

#[tokio::test]
async fn redis_spans_carry_decisions_and_hide_keys() {
    spans_carry_decisions_and_hide_keys(StoreKind::Redis).await;
}

#[tokio::test]
async fn postgres_spans_carry_decisions_and_hide_keys() {
    spans_carry_decisions_and_hide_keys(StoreKind::Postgres).await;
}

#[tokio::test]
async fn mysql_spans_carry_decisions_and_hide_keys() {
    spans_carry_decisions_and_hide_keys(StoreKind::MySql).await;
}

/// The purger deletes expired records, counts them, and leaves live ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_purger_deletes_only_expired_records() {
    instrumented();
    let dir = tempfile::tempdir().unwrap();
    let sqlite = idem_sqlite::SqliteStore::open(dir.path().join("idem.db"))
        .await
        .unwrap();
    let store: Arc<dyn Store> = Arc::new(sqlite.clone());
    let idem = Idempotent::from_arc(Arc::clone(&store));
    let brief = idem
        .clone()
        .with_lease(Duration::from_millis(100))
        .with_retention(Duration::from_millis(100));
    for key in ["x", "y", "z"] {
        let _: u8 = brief
            .execute(key, "b", || async { Ok::<_, ()>(1) })
            .await
            .unwrap();
    }
    let _: u8 = idem
        .execute("kept", "b", || async { Ok::<_, ()>(2) })
        .await
        .unwrap();
    let purged = || counter(&recorded(), "idem_purged_total", &[("store", "sqlite")]);
    let before = purged();

    let purger = spawn_purger(Arc::clone(&store), Duration::from_millis(30));
    let start = Instant::now();
    while purged() - before < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "purged {} of 3",
            purged() - before
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    purger.abort();
    assert_eq!(purged() - before, 3, "only the expired records");
    let stats = sqlite.stats().await.unwrap();
    assert_eq!((stats.completed, stats.expired), (1, 0), "{stats:?}");
    let kept = idem.key("kept").unwrap();
    assert!(store.load(kept.as_str()).await.unwrap().is_some());
}

/// The HTTP exchange counts its responses by status class and replay.
async fn http_responses_are_counted_by_class(kind: StoreKind) {
    use bytes::Bytes;
    use http::{Response, StatusCode};
    use idem_http::{Collected, Options, ResponseBody};

    struct Whole(Bytes);
    impl ResponseBody for Whole {
        async fn collect(self, _limit: usize) -> Collected<Self> {
            Collected::Whole(self.0)
        }
    }

    instrumented();
    let Some(fresh) = kind.fresh().await else {
        return;
    };
    let namespace = unique_name("http");
    let options = Options::from_idempotent(
        Idempotent::from_arc(Arc::clone(&fresh.store)).with_namespace(&*namespace),
    );
    let answer = |status: StatusCode| {
        move || async move {
            Ok::<_, std::convert::Infallible>(
                Response::builder()
                    .status(status)
                    .body(Whole(Bytes::from_static(b"{}")))
                    .unwrap(),
            )
        }
    };
    let fp = |body: &str| Fingerprint::of_bytes(body.as_bytes());
    let idem = options.idempotent();
    // 201 and its replay, a 422 mismatch, a released 500, a recorded 404.
    for _ in 0..2 {
        options
            .exchange(idem, "pay-1", fp("a"), answer(StatusCode::CREATED))
            .await
            .unwrap();
    }
    options
        .exchange(idem, "pay-1", fp("b"), answer(StatusCode::CREATED))
        .await
        .unwrap();
    options
        .exchange(idem, "pay-2", fp("a"), answer(StatusCode::BAD_GATEWAY))
        .await
        .unwrap();
    options
        .exchange(idem, "pay-3", fp("a"), answer(StatusCode::NOT_FOUND))
        .await
        .unwrap();

    let samples = recorded();
    let responses = |class, replayed| {
        counter(
            &samples,
            "idem_http_responses_total",
            &[
                ("namespace", namespace.as_str()),
                ("store", kind.name()),
                ("class", class),
                ("replayed", replayed),
            ],
        )
    };
    assert_eq!(responses("2xx", "false"), 1);
    assert_eq!(responses("2xx", "true"), 1);
    assert_eq!(responses("4xx", "false"), 2, "the 422 and the 404");
    assert_eq!(responses("5xx", "false"), 1);
    assert_eq!(responses("3xx", "false"), 0);
    assert_eq!(
        counter(
            &samples,
            "idem_released_total",
            &[("namespace", namespace.as_str())]
        ),
        1,
        "the 500 released its key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_http_responses_are_counted_by_class() {
    http_responses_are_counted_by_class(StoreKind::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_http_responses_are_counted_by_class() {
    http_responses_are_counted_by_class(StoreKind::Postgres).await;
}
