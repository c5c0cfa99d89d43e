//! Responses too large for one record: streamed to the client while their
//! frames are recorded in chunks ([`Recording`]), and replayed from the
//! chunks as a stream ([`Frames`]).
//!
//! A frame is kept as it came (its length, then its bytes), several to a
//! chunk of up to [`CHUNK_BYTES`](idem_core::chunks::CHUNK_BYTES); a chunk
//! is written when it is full or when the handler's body has nothing ready,
//! so an event stream's events reach the store, and its replays, with their
//! boundaries, while a fast body is written 64 KiB at a time. Only a frame
//! longer than a chunk is split.

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::{FutureExt, Stream};
use http::{HeaderMap, StatusCode};
use idem_core::chunks::{
    read_chunk, read_retried, ChunkError, ChunkWriter, Chunks, Manifest, CHUNK_BYTES, HEAD,
};
use idem_core::store::{State, Store, Token};
use idem_core::{Lease, When};
use tokio::sync::mpsc;

use crate::exchange::{BoxError, ResponseBody};
use crate::stored::{self, Stored, Unreplayable};
use crate::{Options, TraceParent};

/// A body sent frame by frame: a response being recorded as it streams, or
/// the replay of one. An adapter turns it into its framework's body type;
/// an error ends the body early, so the client sees it cut short (a
/// response never ends cleanly without all of its bytes).
pub struct Frames(Pin<Box<dyn Stream<Item = Result<Bytes, BoxError>> + Send>>);

impl fmt::Debug for Frames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Frames").finish_non_exhaustive()
    }
}

impl Stream for Frames {
    type Item = Result<Bytes, BoxError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.as_mut().poll_next(cx)
    }
}

impl Frames {
    fn channel(receiver: mpsc::Receiver<Result<Bytes, BoxError>>) -> Frames {
        Frames(Box::pin(futures_util::stream::unfold(
            receiver,
            |mut receiver| async move { receiver.recv().await.map(|frame| (frame, receiver)) },
        )))
    }

    /// The replay of a chunked body: `first`, chunk 0's frames, already
    /// read, then the rest read one chunk at a time.
    fn replay(first: VecDeque<Bytes>, chunks: Chunks) -> Frames {
        let state = (first, Some(chunks));
        Frames(Box::pin(futures_util::stream::unfold(
            state,
            |(mut ready, mut chunks)| async move {
                loop {
                    if let Some(frame) = ready.pop_front() {
                        return Some((Ok(frame), (ready, chunks)));
                    }
                    let reading = chunks.as_mut()?;
                    match reading.next().await {
                        None => return None,
                        Some(Ok(chunk)) => match frames(chunk) {
                            Ok(frames) => ready = frames,
                            Err(error) => return Some((Err(error), (ready, None))),
                        },
                        Some(Err(error)) => {
                            tracing::error!(%error, "a recorded response could not be read whole; its replay is cut short");
                            return Some((Err(error.into()), (ready, None)));
                        }
                    }
                }
            },
        )))
    }
}

/// How often a follower looks for the next chunk at first, and at most.
const FOLLOW_FIRST: std::time::Duration = std::time::Duration::from_millis(5);
const FOLLOW_LONGEST: std::time::Duration = std::time::Duration::from_millis(50);

/// A follower's place in a response still being recorded.
struct Following {
    store: Arc<dyn Store>,
    key: String,
    token: Token,
    next: u32,
    ready: VecDeque<Bytes>,
    pause: std::time::Duration,
    done: bool,
}

impl Following {
    /// The next frame, reading chunks as the owner writes them.
    async fn next(&mut self) -> Option<Result<Bytes, BoxError>> {
        loop {
            if let Some(frame) = self.ready.pop_front() {
                return Some(Ok(frame));
            }
            if self.done {
                return None;
            }
            match self.read(self.next).await {
                Ok(Some(frames)) => {
                    self.ready = frames;
                    self.next += 1;
                    self.pause = FOLLOW_FIRST;
                    continue;
                }
                Ok(None) => {}
                Err(error) => return self.fail(error),
            }
            // Not written yet: is the owner still at it?
            match self.load().await {
                Ok(Some(record))
                    if record.state == State::InFlight
                        && record.token == self.token
                        && !record.lease_lapsed() =>
                {
                    tokio::time::sleep(self.pause).await;
                    self.pause = (self.pause * 2).min(FOLLOW_LONGEST);
                }
                Ok(Some(record)) if record.state == State::Completed => {
                    match stored::decode(&record.payload) {
                        Ok(Stored::Streamed { manifest, .. }) if manifest.token() == self.token => {
                            if self.next >= manifest.count() {
                                self.done = true;
                                continue;
                            }
                            // Written before the record named it.
                            match self.read(self.next).await {
                                Ok(Some(frames)) => {
                                    self.ready = frames;
                                    self.next += 1;
                                }
                                Ok(None) => {
                                    return self
                                        .fail("a chunk of the followed response is missing".into())
                                }
                                Err(error) => return self.fail(error),
                            }
                        }
                        _ => return self.fail("the followed response was not recorded".into()),
                    }
                }
                Ok(_) => return self.fail("the followed response was not recorded".into()),
                Err(error) => return self.fail(error.into()),
            }
        }
    }

    /// The record being followed, read again after a store error as a
    /// chunk is.
    async fn load(&self) -> Result<Option<idem_core::store::Record>, idem_core::store::StoreError> {
        let mut attempt = 1;
        loop {
            match self.store.load(&self.key).await {
                Err(error) if attempt < 3 => {
                    tracing::warn!(%error, "reading a followed record failed; trying again");
                    tokio::time::sleep(std::time::Duration::from_millis(20 * attempt)).await;
                    attempt += 1;
                }
                read => return read,
            }
        }
    }

    async fn read(&self, index: u32) -> Result<Option<VecDeque<Bytes>>, BoxError> {
        match read_retried(&*self.store, &self.key, self.token, index).await? {
            Some(chunk) => frames(chunk).map(Some),
            None => Ok(None),
        }
    }

    fn fail(&mut self, error: BoxError) -> Option<Result<Bytes, BoxError>> {
        tracing::warn!(%error, "a followed response ends short");
        self.done = true;
        self.ready.clear();
        Some(Err(error))
    }
}

/// The response being recorded under `key` (its storage form), for a
/// request that waits and found the key in flight: its status and headers
/// from the owner's head, and a body that follows the chunks as they are
/// written. `None` when the owner is not streaming one (the request waits
/// for the outcome instead).
pub(crate) async fn follow(
    store: Arc<dyn Store>,
    key: &str,
) -> Result<Option<(StatusCode, HeaderMap, Frames)>, BoxError> {
    let Some(record) = store.load(key).await? else {
        return Ok(None);
    };
    if record.state != State::InFlight {
        return Ok(None);
    }
    let Some(head) = read_chunk(&*store, key, record.token, HEAD).await? else {
        return Ok(None);
    };
    let Ok(Stored::Response {
        status, headers, ..
    }) = stored::decode(&head)
    else {
        return Err("the head of a response being recorded does not decode".into());
    };
    let following = Following {
        store,
        key: key.to_owned(),
        token: record.token,
        next: 0,
        ready: VecDeque::new(),
        pause: FOLLOW_FIRST,
        done: false,
    };
    let frames = Frames(Box::pin(futures_util::stream::unfold(
        following,
        |mut following| async move { following.next().await.map(|frame| (frame, following)) },
    )));
    Ok(Some((status, headers, frames)))
}

/// The frames a chunk holds.
fn frames(chunk: Vec<u8>) -> Result<VecDeque<Bytes>, BoxError> {
    let chunk = Bytes::from(chunk);
    let mut frames = VecDeque::new();
    let mut at = 0;
    while at < chunk.len() {
        let Some(len) = chunk.get(at..at + 4) else {
            return Err("a recorded chunk is damaged: a frame length is cut short".into());
        };
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let start = at + 4;
        let Some(end) = start.checked_add(len).filter(|end| *end <= chunk.len()) else {
            return Err("a recorded chunk is damaged: a frame runs past its end".into());
        };
        frames.push_back(chunk.slice(start..end));
        at = end;
    }
    Ok(frames)
}

/// Reads the first chunk of a recorded body, so that a replay whose chunks
/// are gone is refused before it starts; then the body to send.
pub(crate) async fn replay(
    store: Arc<dyn Store>,
    key: &str,
    manifest: Manifest,
) -> Result<Frames, ChunkError> {
    let mut chunks = Chunks::new(store, key, manifest);
    let first = match chunks.next().await {
        None => VecDeque::new(),
        Some(chunk) => frames(chunk?).map_err(|_| ChunkError::Damaged {
            index: 0,
            reason: "a frame does not parse",
        })?,
    };
    Ok(Frames::replay(first, chunks))
}

/// The recording of a response that streams to its client: returned by the
/// exchange in [`Reply::Streamed`](crate::Reply::Streamed), to be driven
/// to its end by [`run`](Recording::run) in a task of its own. It reads the
/// handler's body, hands each frame to the client's [`Frames`], and writes
/// the frames to the store in chunks; at the end it records the response,
/// or marks the key executed without a replayable response when the body
/// failed, went past [`Options::with_max_streamed_body`] or could not be
/// written. A client that hangs up does not stop it: the body is read and
/// recorded to its end. Dropped before its end, it leaves the key claimed
/// until the lease lapses; a retry then runs the handler again, and the
/// chunks written so far are never read.
pub struct Recording<B>(Box<Parts<B>>);

/// What a [`Recording`] holds, boxed so that a [`Reply`](crate::Reply)
/// stays small.
struct Parts<B> {
    options: Options,
    lease: Lease,
    status: StatusCode,
    headers: HeaderMap,
    traceparent: Option<TraceParent>,
    body: B,
    client: mpsc::Sender<Result<Bytes, BoxError>>,
}

impl<B> fmt::Debug for Recording<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recording")
            .field("key", self.0.lease.key())
            .finish_non_exhaustive()
    }
}

/// How many frames wait for a slow client before the handler's body is
/// read further.
const CLIENT_FRAMES: usize = 16;

/// What reading the body to its end came to.
enum Ended {
    Whole(ChunkWriter),
    TooLarge,
    BodyFailed,
    StoreFailed,
}

impl<B: ResponseBody> Recording<B> {
    /// Starts recording `body`; the client reads the returned frames.
    pub(crate) fn start(
        options: &Options,
        lease: &Lease,
        status: StatusCode,
        headers: HeaderMap,
        traceparent: Option<TraceParent>,
        body: B,
    ) -> (Frames, Recording<B>) {
        let (client, receiver) = mpsc::channel(CLIENT_FRAMES);
        let recording = Recording(Box::new(Parts {
            options: options.clone(),
            lease: lease.clone(),
            status,
            headers,
            traceparent,
            body,
            client,
        }));
        (Frames::channel(receiver), recording)
    }

    /// Reads the body to its end, sending and recording it, then records
    /// the response (see [`Recording`]).
    pub async fn run(self) {
        let Parts {
            options,
            lease,
            status,
            headers,
            traceparent,
            mut body,
            client,
        } = *self.0;
        let head = stored::encode(status, &headers, &[]);
        let ran = lease
            .run(stream_through(&options, &lease, &head, &mut body, client))
            .await;
        if ran.lease_lost {
            tracing::warn!(key = %lease.key(), "lease lost while the response streamed; it is not recorded");
            return;
        }
        match ran.output {
            Ended::Whole(writer) => {
                let payload =
                    stored::encode_streamed(status, &headers, traceparent, writer.manifest());
                options
                    .record_with(&lease, || lease.complete_chunked(&writer, &payload))
                    .await;
            }
            Ended::TooLarge => {
                tracing::warn!(key = %lease.key(), limit = options.max_streamed_body,
                    "streamed response too large to record; retries will get a not-replayable 409");
                let marker = stored::encode_unreplayable(Unreplayable::TooLarge);
                options.record(&lease, &marker).await;
            }
            Ended::BodyFailed => {
                tracing::error!(key = %lease.key(),
                    "response body failed while it streamed; marking the key as executed");
                let marker = stored::encode_unreplayable(Unreplayable::BodyFailed);
                options.record(&lease, &marker).await;
            }
            Ended::StoreFailed => {
                let marker = stored::encode_unreplayable(Unreplayable::RecordingFailed);
                options.record(&lease, &marker).await;
            }
        }
    }
}

/// The chunk being filled, and the writer it goes to while the response
/// is still being recorded.
struct Recorder {
    writer: Option<ChunkWriter>,
    buffer: Vec<u8>,
    store_failed: bool,
}

impl Recorder {
    /// Adds `frame` to the chunks, splitting it where it does not fit.
    async fn push(&mut self, options: &Options, mut frame: &[u8]) {
        while !frame.is_empty() && self.writer.is_some() {
            let room = CHUNK_BYTES.saturating_sub(self.buffer.len() + 4);
            if room == 0 {
                self.flush(options).await;
                continue;
            }
            let (piece, rest) = frame.split_at(room.min(frame.len()));
            self.buffer
                .extend_from_slice(&(piece.len() as u32).to_be_bytes());
            self.buffer.extend_from_slice(piece);
            frame = rest;
        }
        if self.buffer.len() + 4 >= CHUNK_BYTES {
            self.flush(options).await;
        }
    }

    /// Writes the head; a store error that persists stops the recording.
    async fn head(&mut self, options: &Options, head: &[u8]) {
        if let Some(mut writer) = self.writer.take() {
            if attempt(options, &mut writer, Write::Head(head)).await {
                self.writer = Some(writer);
            } else {
                self.store_failed = true;
            }
        }
    }

    /// Writes the chunk being filled; a store error that persists stops
    /// the recording.
    async fn flush(&mut self, options: &Options) {
        let buffer = std::mem::take(&mut self.buffer);
        let Some(mut writer) = self.writer.take() else {
            return;
        };
        if buffer.is_empty() || attempt(options, &mut writer, Write::Chunk(&buffer)).await {
            self.writer = Some(writer);
            self.buffer = buffer;
            self.buffer.clear();
        } else {
            self.store_failed = true;
        }
    }
}

/// What [`attempt`] writes.
#[derive(Clone, Copy)]
enum Write<'a> {
    Head(&'a [u8]),
    Chunk(&'a [u8]),
}

/// Makes one store write, tried again after an error while the lease
/// holds (a write that failed may have landed, and is then found and
/// accepted); whether it was made.
async fn attempt(options: &Options, writer: &mut ChunkWriter, write: Write<'_>) -> bool {
    for attempt in 1..=crate::exchange::RECORD_ATTEMPTS {
        let written = match write {
            Write::Head(head) => {
                options
                    .timed(writer.write_head(head), When::AfterWork)
                    .await
            }
            Write::Chunk(chunk) => options.timed(writer.write(chunk), When::AfterWork).await,
        };
        match written {
            Ok(()) => return true,
            Err(error) if attempt < crate::exchange::RECORD_ATTEMPTS => {
                tracing::warn!(attempt, %error, "writing a chunk of the response failed; trying again");
                tokio::time::sleep(std::time::Duration::from_millis(20 * u64::from(attempt))).await;
            }
            Err(error) => {
                tracing::error!(%error, "a chunk of the response could not be written; the response is not recorded");
            }
        }
    }
    false
}

/// Reads `body` to its end, handing each frame to the client and to the
/// chunks.
async fn stream_through<B: ResponseBody>(
    options: &Options,
    lease: &Lease,
    head: &[u8],
    body: &mut B,
    client: mpsc::Sender<Result<Bytes, BoxError>>,
) -> Ended {
    let mut client = Some(client);
    let mut recorder = Recorder {
        writer: Some(lease.chunk_writer()),
        buffer: Vec::with_capacity(CHUNK_BYTES),
        store_failed: false,
    };
    // The status and headers first, for requests that follow the stream
    // while it is recorded.
    recorder.head(options, head).await;
    let mut total: u64 = 0;
    let mut too_large = false;
    loop {
        // A body with nothing ready is a pause in the stream: write what
        // is buffered, so that followers and replays see it.
        let frame = match body.frame().now_or_never() {
            Some(frame) => frame,
            None => {
                recorder.flush(options).await;
                body.frame().await
            }
        };
        let data = match frame {
            None => break,
            Some(Ok(data)) => data,
            Some(Err(error)) => {
                if let Some(client) = client.take() {
                    let _ = client.send(Err(error)).await;
                }
                return Ended::BodyFailed;
            }
        };
        total = total.saturating_add(data.len() as u64);
        if let Some(sender) = &client {
            if sender.send(Ok(data.clone())).await.is_err() {
                // The client hung up; the body is still read and recorded.
                client = None;
            }
        }
        if total > options.max_streamed_body && !too_large {
            too_large = true;
            recorder.writer = None;
            recorder.buffer.clear();
        }
        recorder.push(options, &data).await;
    }
    recorder.flush(options).await;
    match recorder {
        _ if too_large => Ended::TooLarge,
        Recorder {
            store_failed: true, ..
        } => Ended::StoreFailed,
        Recorder {
            writer: Some(writer),
            ..
        } => Ended::Whole(writer),
        Recorder { writer: None, .. } => Ended::StoreFailed,
    }
}
