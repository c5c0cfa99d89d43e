//! Responses over the whole-record limit, through the exchange itself: the
//! client gets the handler's frames as they come, the replay sends the
//! same frames from the chunks, and a record whose chunks are gone is
//! refused, never replayed short.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, Method, Response, StatusCode, Uri};
use idem_core::chunks::chunk_key;
use idem_core::store::Store;
use idem_core::MemoryStore;
use idem_http::stored::{self, Stored};
use idem_http::{fingerprint, BoxError, Collected, Frames, Options, Reply, ResponseBody, REPLAYED};

/// A body of frames, read frame by frame.
#[derive(Debug)]
struct Framed(VecDeque<Bytes>);

impl ResponseBody for Framed {
    const STREAMS: bool = true;

    async fn frame(&mut self) -> Option<Result<Bytes, BoxError>> {
        self.0.pop_front().map(Ok)
    }

    async fn collect(mut self, limit: usize) -> Collected<Self> {
        let total: usize = self.0.iter().map(Bytes::len).sum();
        if total > limit {
            return Collected::TooLarge(self);
        }
        let mut whole = Vec::new();
        while let Some(frame) = self.0.pop_front() {
            whole.extend_from_slice(&frame);
        }
        Collected::Whole(whole.into())
    }
}

/// Frames of every size: event-sized ones, one longer than a chunk, an
/// empty one.
fn frames() -> Vec<Bytes> {
    let mut frames: Vec<Bytes> = (0..300)
        .map(|i| Bytes::from(format!("data: event {i}\n\n")))
        .collect();
    frames.insert(150, Bytes::from(vec![7u8; 150_000]));
    frames.insert(10, Bytes::new());
    frames
}

struct Api {
    options: Options,
    store: Arc<MemoryStore>,
    runs: AtomicUsize,
}

impl Api {
    fn new() -> Api {
        let store = Arc::new(MemoryStore::new());
        let idem = idem_core::Idempotent::from_arc(store.clone());
        Api {
            options: Options::from_idempotent(idem).with_max_response_body(1024),
            store,
            runs: AtomicUsize::new(0),
        }
    }

    /// Sends a POST under `key`, waiting for an outcome in progress;
    /// returns the response and whether it is being recorded.
    async fn send(&self, key: &str) -> (Response<Frames>, bool) {
        let fingerprint = fingerprint(
            &Method::POST,
            &Uri::from_static("/"),
            &HeaderMap::new(),
            b"",
        );
        let reply = self
            .options
            .exchange_waiting(
                self.options.idempotent(),
                key,
                fingerprint,
                Some(std::time::Duration::from_secs(10)),
                || async {
                    self.runs.fetch_add(1, Ordering::SeqCst);
                    let body = Framed(frames().into());
                    Ok::<_, std::convert::Infallible>(
                        Response::builder()
                            .status(StatusCode::OK)
                            .header("content-type", "text/event-stream")
                            .body(body)
                            .unwrap(),
                    )
                },
            )
            .await
            .unwrap();
        match reply {
            Reply::Streamed(response, Some(recording)) => {
                tokio::spawn(recording.run());
                (response, true)
            }
            Reply::Streamed(response, None) => (response, false),
            other => panic!("a body over the limit streams, got {other:?}"),
        }
    }
}

async fn read(response: Response<Frames>) -> Vec<Bytes> {
    let mut body = response.into_body();
    let mut read = Vec::new();
    while let Some(frame) = body.next().await {
        read.push(frame.expect("a frame"));
    }
    read
}

/// What a replay should send: the frames, the empty one left out and the
/// long one in chunk-sized pieces.
fn replayed_frames() -> Vec<Bytes> {
    let mut frames = frames();
    frames.retain(|frame| !frame.is_empty());
    frames
}

#[tokio::test]
async fn the_first_response_and_its_replay_send_the_same_frames() {
    let api = Api::new();
    let (first, recording) = api.send("k").await;
    assert!(recording, "the first response is recorded as it streams");
    assert_eq!(first.headers()["content-type"], "text/event-stream");
    let sent = read(first).await;
    assert_eq!(
        sent,
        frames(),
        "the client gets the handler's frames as they were"
    );

    let (again, recording) = api.send("k").await;
    assert!(!recording, "a retry replays");
    assert_eq!(again.headers()[REPLAYED], "true");
    assert_eq!(again.headers()["content-type"], "text/event-stream");
    let replayed = read(again).await;
    assert_eq!(api.runs.load(Ordering::SeqCst), 1);
    let want = replayed_frames();
    let whole = |frames: &[Bytes]| frames.concat();
    assert_eq!(whole(&replayed), whole(&want), "the same bytes");
    // Event-sized frames keep their boundaries; the long one comes in
    // pieces of at most a chunk.
    let events: Vec<&Bytes> = replayed.iter().filter(|f| f.len() < 1000).collect();
    let sent_events: Vec<&Bytes> = want.iter().filter(|f| f.len() < 1000).collect();
    assert_eq!(
        events, sent_events,
        "every event is its own frame on replay"
    );
    assert!(replayed
        .iter()
        .all(|f| f.len() <= idem_core::chunks::CHUNK_BYTES));
}

#[tokio::test]
async fn a_record_whose_chunks_are_gone_is_refused_not_replayed_short() {
    let api = Api::new();
    let (first, _) = api.send("gone").await;
    read(first).await;
    // The retry waits for the record, then the chunk is deleted under it.
    let (again, _) = api.send("gone").await;
    read(again).await;
    let key = api.options.idempotent().key("gone").unwrap();
    let record = api.store.load(key.as_str()).await.unwrap().unwrap();
    let Ok(Stored::Streamed { manifest, .. }) = stored::decode(&record.payload) else {
        panic!("the record names its chunks");
    };
    assert!(manifest.count() > 1);
    // The last chunk gone: the replay starts, then ends with an error.
    let last = chunk_key(key.as_str(), manifest.token(), manifest.count() - 1);
    let _ = api.store.reset(&last).await.unwrap();
    let (cut, _) = api.send("gone").await;
    let mut body = cut.into_body();
    let mut bytes = 0;
    let mut failed = false;
    while let Some(frame) = body.next().await {
        match frame {
            Ok(frame) => bytes += frame.len(),
            Err(_) => failed = true,
        }
    }
    assert!(
        failed,
        "a replay missing a chunk ends in an error, not a clean end"
    );
    assert!((bytes as u64) < manifest.len());
    // The first chunk gone: the replay is refused before it starts.
    let first = chunk_key(key.as_str(), manifest.token(), 0);
    let _ = api.store.reset(&first).await.unwrap();
    let fingerprint = fingerprint(
        &Method::POST,
        &Uri::from_static("/"),
        &HeaderMap::new(),
        b"",
    );
    let reply = api
        .options
        .exchange(api.options.idempotent(), "gone", fingerprint, || async {
            Ok::<_, std::convert::Infallible>(Response::new(Framed(VecDeque::new())))
        })
        .await
        .unwrap();
    let Reply::Whole(problem) = reply else {
        panic!("a record without its first chunk is refused");
    };
    assert_eq!(problem.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(api.runs.load(Ordering::SeqCst), 1, "and never run again");
}

/// A body that sends `before` frames, then waits at a gate for the rest.
#[derive(Debug)]
struct Gated {
    frames: VecDeque<Bytes>,
    before: usize,
    sent: usize,
    gate: Arc<tokio::sync::Semaphore>,
}

impl ResponseBody for Gated {
    const STREAMS: bool = true;

    async fn frame(&mut self) -> Option<Result<Bytes, BoxError>> {
        if self.sent == self.before {
            // Dropped while it waits, it takes no permit.
            self.gate
                .acquire()
                .await
                .expect("the gate stays open")
                .forget();
        }
        self.sent += 1;
        self.frames.pop_front().map(Ok)
    }

    async fn collect(self, _limit: usize) -> Collected<Self> {
        Collected::TooLarge(self)
    }
}

#[tokio::test]
async fn a_retry_that_waits_follows_the_stream_as_it_is_recorded() {
    let store = Arc::new(MemoryStore::new());
    let options = Options::from_idempotent(idem_core::Idempotent::from_arc(store));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let runs = Arc::new(AtomicUsize::new(0));
    let all = frames();
    let send = || {
        let (options, gate, runs, all) = (options.clone(), gate.clone(), runs.clone(), all.clone());
        async move {
            let fingerprint = fingerprint(
                &Method::POST,
                &Uri::from_static("/"),
                &HeaderMap::new(),
                b"",
            );
            let wait = Some(std::time::Duration::from_secs(10));
            let handler = || async {
                runs.fetch_add(1, Ordering::SeqCst);
                let body = Gated {
                    frames: all.into(),
                    before: 20,
                    sent: 0,
                    gate,
                };
                Ok::<_, std::convert::Infallible>(Response::new(body))
            };
            let reply = options
                .exchange_waiting(options.idempotent(), "followed", fingerprint, wait, handler)
                .await
                .unwrap();
            match reply {
                Reply::Streamed(response, recording) => {
                    if let Some(recording) = recording {
                        tokio::spawn(recording.run());
                    }
                    response
                }
                other => panic!("a stream streams, got {other:?}"),
            }
        }
    };
    let mut first = send().await.into_body();
    let mut read_first = Vec::new();
    for _ in 0..20 {
        read_first.push(first.next().await.unwrap().unwrap());
    }
    assert_eq!(
        read_first,
        all[..20],
        "the first client reads up to the gate"
    );
    // The handler waits at its gate: a retry now follows what is recorded.
    let follower = send().await;
    assert_eq!(follower.headers()[REPLAYED], "true");
    assert_eq!(follower.headers()["preference-applied"], "wait");
    let mut follower = follower.into_body();
    let mut followed = Vec::new();
    let bound = std::time::Duration::from_secs(10);
    // The empty frame (index 10) is not recorded.
    while followed.len() < 19 {
        let frame = tokio::time::timeout(bound, follower.next())
            .await
            .expect("a follower gets the frames recorded before the gate opens")
            .unwrap()
            .unwrap();
        followed.push(frame);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the follower ran nothing");
    gate.add_permits(1);
    while let Some(frame) = first.next().await {
        read_first.push(frame.unwrap());
    }
    while let Some(frame) = follower.next().await {
        followed.push(frame.unwrap());
    }
    assert_eq!(read_first, all);
    assert_eq!(
        followed.concat(),
        all.concat(),
        "the follower read the whole stream"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
