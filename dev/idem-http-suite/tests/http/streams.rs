//! Responses over the whole-record limit: streamed to the client while
//! they are recorded in chunks, and replayed from the chunks.

use std::time::Duration;

use idem_http_suite::{
    event, eventually, on_every_adapter_and_backend, post, problem, stream_body, Adapter, Backend,
    BIG_BODY, BODY, EVENTS, GATED_EVENTS,
};

/// A retry that waits for the recording to finish (the first response's
/// last bytes reach its client just before its record is written).
async fn retry(client: &reqwest::Client, url: &str, key: &str) -> reqwest::Response {
    post(client, url, Some(key), BODY)
        .header("prefer", "wait=10")
        .send()
        .await
        .unwrap()
}

fn replayed(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

/// Whether the adapter serves `/stream` and `/events` (the proxies'
/// upstreams answer `/big` only; `a_body_over_the_limit_replays_on_every_adapter`
/// streams theirs).
fn streams_routes(adapter: Adapter) -> bool {
    adapter.language().is_none()
}

#[tokio::test]
async fn a_large_body_streams_once_and_replays_byte_for_byte() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        if !streams_routes(adapter) {
            return;
        }
        let (url, handlers) = adapter.start(backend.options()).await;
        let url = format!("{url}/stream");
        let client = reqwest::Client::new();
        let want = stream_body();
        let first = post(&client, &url, Some("stream"), BODY)
            .send()
            .await
            .unwrap();
        assert_eq!(first.status(), 200);
        assert!(!replayed(&first));
        assert!(
            first.bytes().await.unwrap() == want,
            "the first response's body"
        );
        let again = retry(&client, &url, "stream").await;
        assert_eq!(again.status(), 200);
        assert!(
            replayed(&again),
            "the retry is a replay: {:?}",
            again.headers()
        );
        let body = again.bytes().await.unwrap();
        assert_eq!(body.len(), want.len(), "the replay's length");
        assert!(
            body == want,
            "the replay is byte for byte the first response"
        );
        assert_eq!(handlers.runs(), 1, "the handler ran once");
    })
    .await;
}

#[tokio::test]
async fn server_sent_events_replay_event_for_event() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        if !streams_routes(adapter) {
            return;
        }
        // Whole-record limit below the stream, so it is recorded in chunks.
        let options = backend.options().with_max_response_body(4096);
        let (url, handlers) = adapter.start(options).await;
        let url = format!("{url}/events");
        let client = reqwest::Client::new();
        let want: String = (0..EVENTS).map(event).collect();
        let first = post(&client, &url, Some("events"), BODY)
            .send()
            .await
            .unwrap();
        assert_eq!(first.headers()["content-type"], "text/event-stream");
        assert_eq!(first.text().await.unwrap(), want);
        let again = retry(&client, &url, "events").await;
        assert!(replayed(&again));
        assert_eq!(again.headers()["content-type"], "text/event-stream");
        assert_eq!(again.text().await.unwrap(), want, "the replayed events");
        assert_eq!(handlers.runs(), 1);
    })
    .await;
}

#[tokio::test]
async fn a_client_that_hangs_up_mid_stream_leaves_a_whole_record() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        if !streams_routes(adapter) {
            return;
        }
        let (url, handlers) = adapter.start(backend.options()).await;
        let url = format!("{url}/stream");
        let client = reqwest::Client::new();
        let mut first = post(&client, &url, Some("hang-up"), BODY)
            .send()
            .await
            .unwrap();
        let some = first.chunk().await.unwrap().expect("the first bytes");
        assert!(!some.is_empty());
        // The connection closes with the response unread.
        drop(first);
        drop(client);
        let client = reqwest::Client::new();
        let again = retry(&client, &url, "hang-up").await;
        assert!(
            replayed(&again),
            "the retry is a replay: {:?}",
            again.headers()
        );
        assert!(
            again.bytes().await.unwrap() == stream_body(),
            "the recording went on to the end without its client"
        );
        assert_eq!(handlers.runs(), 1);
    })
    .await;
}

#[tokio::test]
async fn a_body_over_the_limit_replays_on_every_adapter() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        let options = backend.options().with_max_response_body(1024);
        let (url, handlers) = adapter.start(options).await;
        let url = format!("{url}/big");
        let client = reqwest::Client::new();
        let first = post(&client, &url, Some("big"), BODY).send().await.unwrap();
        assert_eq!(first.status(), 200);
        assert_eq!(first.bytes().await.unwrap().len(), BIG_BODY);
        let again = retry(&client, &url, "big").await;
        assert!(
            replayed(&again),
            "the retry is a replay: {:?}",
            again.headers()
        );
        let body = again.bytes().await.unwrap();
        assert_eq!(body.len(), BIG_BODY);
        assert!(body.iter().all(|b| *b == b'x'));
        assert_eq!(handlers.runs(), 1);
    })
    .await;
}

#[tokio::test]
async fn a_stream_over_the_streamed_limit_is_sent_once_and_never_run_again() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        if !streams_routes(adapter) {
            return;
        }
        let options = backend
            .options()
            .with_max_response_body(4096)
            .with_max_streamed_body(1024 * 1024);
        let (url, handlers) = adapter.start(options).await;
        let url = format!("{url}/stream");
        let client = reqwest::Client::new();
        let first = post(&client, &url, Some("too-long"), BODY)
            .send()
            .await
            .unwrap();
        assert!(
            first.bytes().await.unwrap() == stream_body(),
            "the client still gets it all"
        );
        // Without a wait: a follower of a stream that goes past the limit
        // is cut short, and the marker is written after the last byte.
        eventually("the key is marked not replayable", || async {
            let again = post(&client, &url, Some("too-long"), BODY)
                .send()
                .await
                .unwrap();
            match problem(again, 409).await.as_str() {
                "in-progress" => false,
                name => {
                    assert_eq!(name, "not-replayable");
                    true
                }
            }
        })
        .await;
        assert_eq!(handlers.runs(), 1);
    })
    .await;
}

/// Reads `response` until its text holds `events` whole events, within
/// ten seconds.
async fn read_events(response: &mut reqwest::Response, text: &mut String, events: usize) {
    let want: String = (0..events).map(event).collect();
    while text.len() < want.len() {
        let chunk = tokio::time::timeout(Duration::from_secs(10), response.chunk())
            .await
            .expect("the events come within 10 s")
            .unwrap()
            .expect("the stream goes on");
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert_eq!(*text, want);
}

#[tokio::test]
async fn a_retry_that_waits_follows_the_stream_while_it_is_recorded() {
    on_every_adapter_and_backend(|adapter: Adapter, backend: Backend| async move {
        if !streams_routes(adapter) {
            return;
        }
        let options = backend.options().with_max_response_body(64);
        let (url, handlers) = adapter.start(options).await;
        let url = format!("{url}/gated-events");
        let client = reqwest::Client::new();
        let mut first = post(&client, &url, Some("followed"), BODY)
            .send()
            .await
            .unwrap();
        let mut first_text = String::new();
        read_events(&mut first, &mut first_text, GATED_EVENTS).await;
        // The handler waits at its gate; a retry follows what is recorded
        // so far instead of waiting for the end.
        let mut follower = retry(&client, &url, "followed").await;
        assert!(
            replayed(&follower),
            "a follower is a replay: {:?}",
            follower.headers()
        );
        assert_eq!(follower.headers()["preference-applied"], "wait");
        assert_eq!(follower.headers()["content-type"], "text/event-stream");
        let mut followed = String::new();
        read_events(&mut follower, &mut followed, GATED_EVENTS).await;
        assert_eq!(handlers.runs(), 1, "the follower ran nothing");
        handlers.open_gate();
        read_events(&mut first, &mut first_text, 2 * GATED_EVENTS).await;
        read_events(&mut follower, &mut followed, 2 * GATED_EVENTS).await;
        assert!(
            first.chunk().await.unwrap().is_none(),
            "the first stream ends"
        );
        assert!(
            follower.chunk().await.unwrap().is_none(),
            "the followed stream ends"
        );
        let again = retry(&client, &url, "followed").await;
        assert_eq!(again.text().await.unwrap(), followed, "a later replay");
        assert_eq!(handlers.runs(), 1);
    })
    .await;
}
