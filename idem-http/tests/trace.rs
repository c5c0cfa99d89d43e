//! Trace continuity: a replay's `idem.http` span points back to the request
//! whose response it replays, by the field `idem.original_traceparent` and,
//! with the feature `otel` (on in every test build of this crate), by an
//! OpenTelemetry link.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode, Uri};
use idem_core::{Begin, MemoryStore};
use idem_http::stored::{self, Stored};
use idem_http::{
    fingerprint, Collected, Options, Reply, ResponseBody, TraceParent, REPLAYED, TRACEPARENT,
};
use opentelemetry::trace::{SpanContext, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

const FIRST: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const OTHERS: [&str; 2] = [
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "00-11111111111111111111111111111111-2222222222222222-00",
];

/// A body already in memory.
struct Whole(Bytes);

impl ResponseBody for Whole {
    async fn collect(self, limit: usize) -> Collected<Self> {
        if self.0.len() > limit {
            Collected::TooLarge(self)
        } else {
            Collected::Whole(self.0)
        }
    }
}

/// One protected request at a time, counting the handler's runs.
struct Api {
    options: Options,
    runs: AtomicUsize,
}

impl Api {
    fn new() -> Api {
        Api {
            // One scope for all: the records are read and written here
            // through the options' own handle, as an earlier build did.
            options: Options::new(MemoryStore::new()).shared_across_callers(),
            runs: AtomicUsize::new(0),
        }
    }

    fn fingerprint(key: &str) -> idem_core::fingerprint::MatchingFingerprints {
        fingerprint(
            &Method::POST,
            &Uri::from_static("/payments"),
            &HeaderMap::new(),
            key.as_bytes(),
        )
    }

    /// Sends a POST under `key` with `traceparent`; answers whether the
    /// response was a replay.
    async fn send(&self, key: &str, traceparent: Option<&str>) -> bool {
        let mut headers = HeaderMap::new();
        if let Some(value) = traceparent {
            headers.insert(TRACEPARENT, HeaderValue::from_str(value).unwrap());
        }
        let context = self.options.request_context(&headers);
        let reply = self
            .options
            .exchange_with(
                self.options.idempotent(),
                key,
                Api::fingerprint(key),
                context,
                || async {
                    self.runs.fetch_add(1, Ordering::SeqCst);
                    let response = Response::builder().status(StatusCode::CREATED);
                    Ok::<_, std::convert::Infallible>(
                        response.body(Whole(Bytes::from("charged"))).unwrap(),
                    )
                },
            )
            .await
            .unwrap();
        let Reply::Whole(response) = reply else {
            panic!("a small response is answered whole");
        };
        assert_eq!(response.status(), StatusCode::CREATED);
        assert_eq!(response.body(), "charged");
        response.headers().contains_key(REPLAYED)
    }

    /// Records `payload` under `key` as an earlier build would have.
    async fn record(&self, key: &str, payload: &[u8]) {
        let idem = self.options.idempotent();
        let Begin::Run(lease) = idem.begin(key, Api::fingerprint(key)).await.unwrap() else {
            panic!("a fresh key is claimed");
        };
        lease.complete(payload).await.unwrap();
    }

    /// The trace parent the record of `key` keeps.
    async fn stored_traceparent(&self, key: &str) -> Option<TraceParent> {
        let idem = self.options.idempotent();
        let stored_key = idem.key(key).unwrap();
        let record = idem
            .store()
            .load(stored_key.as_str())
            .await
            .unwrap()
            .unwrap();
        match stored::decode(&record.payload).unwrap() {
            Stored::Response { traceparent, .. } => traceparent,
            other => panic!("a response was recorded, not {other:?}"),
        }
    }
}

/// The `idem.original_traceparent` of every `idem.http` span, in the order
/// the spans were opened.
#[derive(Clone, Default)]
struct Originals(Arc<Mutex<Vec<Opened>>>);

/// A span as it was opened, and its original trace parent once recorded.
type Opened = (Id, Option<String>);

struct OriginalVisitor<'a>(&'a mut Option<String>);

impl Visit for OriginalVisitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "idem.original_traceparent" {
            *self.0 = Some(format!("{value:?}"));
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for Originals {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        if attrs.metadata().name() == "idem.http" {
            let mut original = None;
            attrs.record(&mut OriginalVisitor(&mut original));
            self.0.lock().unwrap().push((id.clone(), original));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut spans = self.0.lock().unwrap();
        if let Some((_, original)) = spans.iter_mut().find(|(span, _)| span == id) {
            values.record(&mut OriginalVisitor(original));
        }
    }
}

impl Originals {
    fn seen(&self) -> Vec<Option<String>> {
        let spans = self.0.lock().unwrap();
        spans.iter().map(|(_, original)| original.clone()).collect()
    }
}

#[tokio::test]
async fn the_first_traceparent_is_stored_and_shown_on_every_replay_span() {
    let originals = Originals::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(originals.clone()));
    let api = Api::new();
    assert!(!api.send("pay-1", Some(FIRST)).await);
    assert!(api.send("pay-1", Some(OTHERS[0])).await);
    assert!(api.send("pay-1", None).await);
    assert_eq!(api.runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        api.stored_traceparent("pay-1").await.map(|p| p.to_string()),
        Some(FIRST.to_owned())
    );
    let first = Some(FIRST.to_owned());
    assert_eq!(originals.seen(), [None, first.clone(), first]);
}

#[tokio::test]
async fn a_malformed_traceparent_is_ignored_and_nothing_is_stored() {
    let originals = Originals::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(originals.clone()));
    let api = Api::new();
    let upper = "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01";
    assert!(!api.send("pay-1", Some(upper)).await);
    assert!(api.send("pay-1", Some(FIRST)).await);
    assert_eq!(api.stored_traceparent("pay-1").await, None);
    assert_eq!(originals.seen(), [None, None]);
}

/// A subscriber whose `tracing` spans become OpenTelemetry spans, kept in
/// memory.
fn otel() -> (
    tracing::subscriber::DefaultGuard,
    SdkTracerProvider,
    InMemorySpanExporter,
) {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("idem-http-test"));
    let guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
    (guard, provider, exporter)
}

/// The `idem.http` spans, in the order they ended.
fn exchanges(provider: &SdkTracerProvider, exporter: &InMemorySpanExporter) -> Vec<SpanData> {
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    spans
        .into_iter()
        .filter(|span| span.name == "idem.http")
        .collect()
}

/// The (trace id, span id) of every link of `span`.
fn links(span: &SpanData) -> Vec<(String, String)> {
    span.links
        .iter()
        .map(|link| ids(&link.span_context))
        .collect()
}

fn ids(context: &SpanContext) -> (String, String) {
    (
        context.trace_id().to_string(),
        context.span_id().to_string(),
    )
}

#[tokio::test]
async fn every_replay_span_links_to_the_original_request() {
    let (_guard, provider, exporter) = otel();
    let api = Api::new();
    assert!(!api.send("pay-1", Some(FIRST)).await);
    let replays = [Some(OTHERS[0]), Some(OTHERS[1]), None, Some(FIRST)];
    for traceparent in replays {
        assert!(api.send("pay-1", traceparent).await);
    }
    assert_eq!(api.runs.load(Ordering::SeqCst), 1);
    let spans = exchanges(&provider, &exporter);
    assert_eq!(spans.len(), 1 + replays.len());
    assert_eq!(links(&spans[0]), [], "a first execution links to nothing");
    let original = (
        "4bf92f3577b34da6a3ce929d0e0e4736".to_owned(),
        "00f067aa0ba902b7".to_owned(),
    );
    for replay in &spans[1..] {
        assert_eq!(links(replay), std::slice::from_ref(&original));
        let link = &replay.links.links[0].span_context;
        assert!(link.is_remote() && link.is_sampled());
    }
}

#[tokio::test]
async fn without_a_traceparent_replays_link_to_the_first_executions_own_span() {
    let (_guard, provider, exporter) = otel();
    let api = Api::new();
    assert!(!api.send("pay-2", None).await);
    assert!(api.send("pay-2", Some(OTHERS[0])).await);
    assert!(api.send("pay-2", None).await);
    let spans = exchanges(&provider, &exporter);
    assert_eq!(spans.len(), 3);
    assert_eq!(links(&spans[0]), []);
    let first = ids(&spans[0].span_context);
    assert_eq!(
        api.stored_traceparent("pay-2")
            .await
            .map(|p| (hex(&p.trace_id()), hex(&p.span_id()))),
        Some(first.clone())
    );
    for replay in &spans[1..] {
        assert_eq!(links(replay), std::slice::from_ref(&first));
    }
}

#[tokio::test]
async fn a_version_1_record_replays_with_no_link() {
    let (_guard, provider, exporter) = otel();
    let api = Api::new();
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("text/plain"));
    let v1 = stored::encode(StatusCode::CREATED, &headers, b"charged");
    assert_eq!(v1[0], 1, "an earlier build's payload");
    api.record("pay-3", &v1).await;
    assert!(api.send("pay-3", Some(FIRST)).await);
    assert_eq!(api.runs.load(Ordering::SeqCst), 0);
    let spans = exchanges(&provider, &exporter);
    assert_eq!(spans.len(), 1);
    assert_eq!(links(&spans[0]), []);
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
